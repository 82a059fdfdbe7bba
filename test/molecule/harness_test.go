package molecule_test

// The harness: molecule's test sequence for a scenario in molecule's layout
// (test/molecule/<role>/molecule/<scenario>/{molecule.yml,prepare.yml,
// converge.yml,side_effect.yml,verify.yml}), run with ansible-playbook
// against an nspawn test host. Molecule itself is not installable here; the
// files are the ones molecule runs (driver default/delegated, managed:
// false, verifier ansible), and the steps are molecule's, its default
// sequence when molecule.yml names none: dependency, cleanup, destroy,
// syntax, create, prepare, converge, idempotence (a second converge; any
// changed task fails, by name), side_effect (here: a reboot of the host
// through hostenv, when the scenario has a side_effect.yml), verify,
// cleanup, destroy. test/molecule/README.md lists the differences.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"gopkg.in/yaml.v3"
)

// playbookTimeout bounds one ansible-playbook run (CI machines are loaded).
const playbookTimeout = 10 * time.Minute

// scenario is one molecule scenario as the harness needs it.
type scenario struct {
	role, name string
	dir        string // the scenario directory
	projectDir string // MOLECULE_PROJECT_DIRECTORY: test/molecule/<role>
	sequence   []string
	env        map[string]string // provisioner.env, expanded
	inventory  string            // provisioner.inventory.links.hosts, absolute
}

// moleculeFile is the part of molecule.yml the harness reads.
type moleculeFile struct {
	Driver struct {
		Name    string `yaml:"name"`
		Options struct {
			Managed *bool `yaml:"managed"`
		} `yaml:"options"`
	} `yaml:"driver"`
	Platforms []struct {
		Name string `yaml:"name"`
	} `yaml:"platforms"`
	Provisioner struct {
		Name      string            `yaml:"name"`
		Env       map[string]string `yaml:"env"`
		Inventory struct {
			Links     map[string]string `yaml:"links"`
			Hosts     any               `yaml:"hosts"`
			HostVars  any               `yaml:"host_vars"`
			GroupVars any               `yaml:"group_vars"`
		} `yaml:"inventory"`
	} `yaml:"provisioner"`
	Verifier struct {
		Name string `yaml:"name"`
	} `yaml:"verifier"`
	Scenario struct {
		TestSequence []string `yaml:"test_sequence"`
	} `yaml:"scenario"`
	Dependency struct {
		Enabled *bool `yaml:"enabled"`
	} `yaml:"dependency"`
}

// moleculeDefaultSequence is molecule's `test` sequence (scenario.test_sequence's default).
var moleculeDefaultSequence = []string{"dependency", "cleanup", "destroy", "syntax", "create", "prepare", "converge", "idempotence", "side_effect", "verify", "cleanup", "destroy"}

// steps the harness runs; molecule's others (dependency, create, destroy,
// lint) have nothing to do for a delegated, unmanaged platform without
// requirements (dependency is refused when enabled, below). check is
// molecule's dry run (converge with --check --diff); the harness also
// requires it to change nothing: after converge the role must be
// check-mode safe, as kpssh's drift check runs it (docs/profiles.md).
var knownSteps = map[string]bool{"syntax": true, "prepare": true, "converge": true, "idempotence": true, "check": true, "side_effect": true, "verify": true, "cleanup": true}

var noopSteps = map[string]bool{"dependency": true, "create": true, "destroy": true, "lint": true}

// loadScenario reads <dir>/molecule.yml; dir is .../<role>/molecule/<name>.
func loadScenario(dir string) (*scenario, error) {
	raw, err := os.ReadFile(filepath.Join(dir, "molecule.yml"))
	if err != nil {
		return nil, err
	}
	var mf moleculeFile
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	if err := dec.Decode(&mf); err != nil {
		return nil, fmt.Errorf("%s/molecule.yml: %w", dir, err)
	}
	if mf.Driver.Name != "default" && mf.Driver.Name != "delegated" {
		return nil, fmt.Errorf("%s/molecule.yml: driver %q: the harness runs delegated scenarios (driver default or delegated)", dir, mf.Driver.Name)
	}
	if mf.Driver.Options.Managed == nil || *mf.Driver.Options.Managed {
		return nil, fmt.Errorf("%s/molecule.yml: driver.options.managed must be false (the hosts exist; nothing creates them)", dir)
	}
	if len(mf.Platforms) != 1 {
		return nil, fmt.Errorf("%s/molecule.yml: want exactly one platform, got %d", dir, len(mf.Platforms))
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	sc := &scenario{
		name: filepath.Base(abs), dir: abs,
		projectDir: filepath.Dir(filepath.Dir(abs)),
		env:        map[string]string{},
	}
	sc.role = filepath.Base(sc.projectDir)
	sc.sequence = mf.Scenario.TestSequence
	if len(sc.sequence) == 0 {
		sc.sequence = moleculeDefaultSequence
	}
	if mf.Verifier.Name != "" && mf.Verifier.Name != "ansible" {
		return nil, fmt.Errorf("%s/molecule.yml: verifier %q: the harness runs verify.yml (verifier: ansible)", dir, mf.Verifier.Name)
	}
	if mf.Provisioner.Name != "" && mf.Provisioner.Name != "ansible" {
		return nil, fmt.Errorf("%s/molecule.yml: provisioner %q: want ansible", dir, mf.Provisioner.Name)
	}
	if mf.Provisioner.Inventory.Hosts != nil || mf.Provisioner.Inventory.HostVars != nil || mf.Provisioner.Inventory.GroupVars != nil {
		return nil, fmt.Errorf("%s/molecule.yml: provisioner.inventory hosts/host_vars/group_vars: the harness reads an inventory file (provisioner.inventory.links.hosts) only", dir)
	}
	if mf.Dependency.Enabled == nil || *mf.Dependency.Enabled {
		return nil, fmt.Errorf("%s/molecule.yml: dependency.enabled must be false (the harness installs no requirements; molecule would run ansible-galaxy)", dir)
	}
	for _, s := range sc.sequence {
		if !knownSteps[s] && !noopSteps[s] {
			return nil, fmt.Errorf("%s/molecule.yml: unknown step %q in scenario.test_sequence", dir, s)
		}
	}
	expand := func(v string) string {
		return os.Expand(v, func(k string) string {
			switch k {
			case "MOLECULE_PROJECT_DIRECTORY":
				return sc.projectDir
			case "MOLECULE_SCENARIO_DIRECTORY":
				return sc.dir
			case "MOLECULE_SCENARIO_NAME":
				return sc.name
			}
			return os.Getenv(k)
		})
	}
	for k, v := range mf.Provisioner.Env {
		sc.env[k] = expand(v)
	}
	inv := mf.Provisioner.Inventory.Links["hosts"]
	if inv == "" {
		return nil, fmt.Errorf("%s/molecule.yml: provisioner.inventory.links.hosts is required (the inventory naming the host)", dir)
	}
	if !filepath.IsAbs(inv) {
		inv = filepath.Join(sc.dir, inv)
	}
	if _, err := os.Stat(inv); err != nil {
		return nil, fmt.Errorf("%s/molecule.yml: inventory: %w", dir, err)
	}
	sc.inventory = inv
	return sc, nil
}

// target is the host a scenario runs against.
type target struct {
	address    string
	port       int
	user       string
	key        string // private key file
	knownHosts string // known_hosts file pinning the host key
	reboot     func() // the side_effect step
}

// errSkipped: the step has no playbook in the scenario.
var errSkipped = errors.New("skipped: no playbook")

// stepResult is one step of a scenario run.
type stepResult struct {
	step     string
	skipped  bool // no playbook for it (molecule: "Skipping, … not configured")
	err      error
	duration time.Duration
}

// runner runs ansible-playbook for scenarios in its own config dir.
type runner struct {
	dir string // private: ansible.cfg, HOME, control sockets
}

func newRunner(dir string) (*runner, error) {
	cfg := fmt.Sprintf(`[defaults]
host_key_checking = True
nocolor = True
retry_files_enabled = False
interpreter_python = /usr/bin/python3
stdout_callback = default
gathering = explicit
forks = 1
deprecation_warnings = False
local_tmp = %[1]s/tmp
[ssh_connection]
pipelining = True
control_path_dir = %[1]s/cp
ssh_args = -o ControlMaster=auto -o ControlPersist=60s
`, dir)
	if err := os.MkdirAll(filepath.Join(dir, "cp"), 0o700); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "ansible.cfg"), []byte(cfg), 0o600); err != nil {
		return nil, err
	}
	return &runner{dir: dir}, nil
}

// close stops the ssh ControlPersist masters the runs left (they detach
// from ansible-playbook's process group and would linger for a minute).
func (r *runner) close() {
	socks, _ := filepath.Glob(filepath.Join(r.dir, "cp", "*"))
	for _, s := range socks {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		c := exec.CommandContext(ctx, "ssh", "-F", "/dev/null", "-o", "ControlPath="+s, "-O", "exit", "kpssh-molecule")
		c.WaitDelay = 5 * time.Second
		_ = c.Run()
		cancel()
	}
}

// playbook runs one playbook of sc against tg and returns its output.
func (r *runner) playbook(ctx context.Context, sc *scenario, tg target, playbook string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, playbookTimeout)
	defer cancel()
	argv := append([]string{"-i", sc.inventory}, args...)
	for i, a := range argv {
		if strings.HasSuffix(a, ".yml") && !filepath.IsAbs(a) {
			argv[i] = filepath.Join(sc.dir, a)
		}
	}
	argv = append(argv, filepath.Join(sc.dir, playbook))
	c := exec.CommandContext(ctx, "ansible-playbook", argv...)
	c.Dir = sc.dir
	env := []string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + r.dir, "LANG=C.UTF-8",
		"ANSIBLE_CONFIG=" + filepath.Join(r.dir, "ansible.cfg"), "ANSIBLE_FORCE_COLOR=0",
		"KPSSH_MOLECULE_HOST=" + tg.address, "KPSSH_MOLECULE_PORT=" + strconv.Itoa(tg.port),
		"KPSSH_MOLECULE_USER=" + tg.user, "KPSSH_MOLECULE_KEY=" + tg.key,
		"KPSSH_MOLECULE_KNOWN_HOSTS=" + tg.knownHosts,
		"MOLECULE_PROJECT_DIRECTORY=" + sc.projectDir, "MOLECULE_SCENARIO_DIRECTORY=" + sc.dir,
		"MOLECULE_SCENARIO_NAME=" + sc.name,
	}
	// Profiling on request: ANSIBLE_CALLBACKS_ENABLED=junit JUNIT_OUTPUT_DIR=… (per-task times).
	for _, k := range []string{"ANSIBLE_CALLBACKS_ENABLED", "JUNIT_OUTPUT_DIR", "JUNIT_TASK_CLASS"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	for k, v := range sc.env {
		env = append(env, k+"="+v)
	}
	c.Env = env
	var out bytes.Buffer
	c.Stdout, c.Stderr = &out, &out
	asGroup(c)
	err := c.Run()
	if ctx.Err() != nil {
		return out.String(), fmt.Errorf("%s timed out after %v", playbook, playbookTimeout)
	}
	if d := os.Getenv("KPSSH_MOLECULE_LOGDIR"); d != "" {
		// Every run's output, for reading when a step fails or is slow.
		name := fmt.Sprintf("%s-%s-%s-%d.log", sc.role, sc.name, strings.TrimSuffix(playbook, ".yml"), time.Now().UnixNano())
		_ = os.WriteFile(filepath.Join(d, name), out.Bytes(), 0o600)
	}
	if s := leakedSecret(out.String()); s != "" {
		return "", fmt.Errorf("%s printed a secret (%s): a task that sees it lacks no_log", playbook, s)
	}
	return out.String(), err
}

// testSecrets are the secret values of test/molecule/shared/kpssh-context.yml
// (the bootstrap token's secret half, the activation values): no playbook
// output may contain them.
var testSecrets = map[string]string{
	"0123456789abcdef":                     "the bootstrap token's secret",
	"a1b2c3d4-5e6f-4a7b-8c9d-0123456789ab": "the activation id",
	"kpsshActivation+Code/0123456789XYZ=":  "the activation code",
}

func leakedSecret(out string) string {
	for v, what := range testSecrets {
		if strings.Contains(out, v) {
			return what
		}
	}
	return ""
}

// run runs sc's sequence against tg; it stops at the first failed step.
func (r *runner) run(ctx context.Context, sc *scenario, tg target) []stepResult {
	var res []stepResult
	for _, step := range sc.sequence {
		if noopSteps[step] {
			continue
		}
		start := time.Now()
		err := r.step(ctx, sc, tg, step)
		if errors.Is(err, errSkipped) {
			res = append(res, stepResult{step: step, skipped: true})
			continue
		}
		res = append(res, stepResult{step: step, err: err, duration: time.Since(start)})
		if err != nil {
			break
		}
	}
	return res
}

func (r *runner) step(ctx context.Context, sc *scenario, tg target, step string) error {
	switch step {
	case "syntax":
		// One ansible-playbook run checks every playbook of the scenario.
		var books []string
		for _, p := range []string{"prepare.yml", "converge.yml", "side_effect.yml", "verify.yml", "cleanup.yml"} {
			if _, err := os.Stat(filepath.Join(sc.dir, p)); err == nil {
				books = append(books, p)
			} else if p == "converge.yml" {
				return fmt.Errorf("syntax: no converge.yml")
			}
		}
		last := len(books) - 1
		args := append([]string{"--syntax-check"}, books[:last]...)
		if out, err := r.playbook(ctx, sc, tg, books[last], args...); err != nil {
			return fmt.Errorf("syntax-check of %s failed: %v\n%s", strings.Join(books, ", "), err, tail(out, 40))
		}
		return nil
	case "prepare", "verify", "cleanup":
		p := step + ".yml"
		if _, err := os.Stat(filepath.Join(sc.dir, p)); err != nil {
			return errSkipped // molecule skips a missing prepare/verify/cleanup playbook too
		}
		out, err := r.playbook(ctx, sc, tg, p)
		return playbookErr(step, out, err)
	case "converge":
		out, err := r.playbook(ctx, sc, tg, "converge.yml")
		if err == nil && !strings.Contains(out, "\nTASK [") {
			// e.g. an import_role of a role ansible found without its
			// task files: nothing ran, so nothing was tested
			return fmt.Errorf("converge ran no task on the host (is the role where the scenario's ANSIBLE_ROLES_PATH says, and readable?)")
		}
		return playbookErr(step, out, err)
	case "idempotence":
		out, err := r.playbook(ctx, sc, tg, "converge.yml")
		if err := playbookErr("idempotence (second converge)", out, err); err != nil {
			return err
		}
		if changed, n := changedTasks(out); n > 0 {
			return fmt.Errorf("idempotence: the second converge changed %d task(s): %s", n, strings.Join(changed, "; "))
		}
		return nil
	case "check":
		out, err := r.playbook(ctx, sc, tg, "converge.yml", "--check", "--diff")
		if err := playbookErr("check (converge --check --diff)", out, err); err != nil {
			return err
		}
		if changed, n := changedTasks(out); n > 0 {
			return fmt.Errorf("check: converge in check mode would change %d task(s) on a converged host (false drift): %s\n%s", n, strings.Join(changed, "; "), tail(out, 60))
		}
		return nil
	case "side_effect":
		// molecule skips the step without a side_effect playbook.
		if _, err := os.Stat(filepath.Join(sc.dir, "side_effect.yml")); err != nil {
			return errSkipped
		}
		if tg.reboot == nil {
			return fmt.Errorf("side_effect: no reboot for this host")
		}
		tg.reboot()
		return nil
	}
	return fmt.Errorf("unknown step %q", step)
}

// playbookErr turns a failed run into an error naming the failed task and
// its message.
func playbookErr(step, out string, err error) error {
	if err == nil {
		return nil
	}
	if f := failedTasks(out); len(f) > 0 {
		return fmt.Errorf("%s failed: %s", step, strings.Join(f, "; "))
	}
	return fmt.Errorf("%s failed: %v\n%s", step, err, tail(out, 40))
}

var (
	taskLineRE   = regexp.MustCompile(`^(?:TASK|RUNNING HANDLER) \[(.*)\] \**$`)
	changedRE    = regexp.MustCompile(`^changed: \[[^\]]+\]( => \(item=(.*)\))?`)
	failedLineRE = regexp.MustCompile(`^(?:fatal|failed): \[[^\]]+\](?: \(item=(.*?)\))?: (?:FAILED! |UNREACHABLE! )?=> (\{.*\})\s*$|^(?:fatal|failed): \[[^\]]+\](?: \(item=(.*?)\))? => (\{.*\})\s*$`)
	recapRE      = regexp.MustCompile(`\bchanged=(\d+)\b`)
)

// changedTasks lists the tasks the default callback reported as changed
// ("TASK [role : name]" followed by "changed: [host]"), and how many
// changed results the play recap counted.
func changedTasks(out string) ([]string, int) {
	var names []string
	seen := map[string]bool{}
	task := "?"
	for _, l := range strings.Split(out, "\n") {
		if m := taskLineRE.FindStringSubmatch(l); m != nil {
			task = m[1]
			continue
		}
		if m := changedRE.FindStringSubmatch(l); m != nil {
			n := task
			if m[2] != "" {
				n += " (item=" + m[2] + ")"
			}
			if !seen[n] {
				seen[n] = true
				names = append(names, n)
			}
		}
	}
	recap := 0
	for _, m := range recapRE.FindAllStringSubmatch(out, -1) {
		n, _ := strconv.Atoi(m[1])
		recap += n
	}
	if recap > 0 && len(names) == 0 {
		names = []string{"(the recap counts changes the output does not name)"}
	}
	if len(names) > recap {
		recap = len(names)
	}
	return names, recap
}

// failedTasks names each failed task with its message ("task: msg").
func failedTasks(out string) []string {
	var res []string
	task := "?"
	for _, l := range strings.Split(out, "\n") {
		if m := taskLineRE.FindStringSubmatch(l); m != nil {
			task = m[1]
			continue
		}
		m := failedLineRE.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		item, body := m[1], m[2]
		if body == "" {
			item, body = m[3], m[4]
		}
		var r map[string]any
		msg := body
		if json.Unmarshal([]byte(body), &r) == nil {
			msg = resultMessage(r)
		}
		n := "task " + strconv.Quote(task)
		if item != "" {
			n += " (item=" + item + ")"
		}
		res = append(res, n+": "+msg)
	}
	return res
}

func resultMessage(r map[string]any) string {
	var parts []string
	for _, k := range []string{"msg", "stderr", "module_stderr"} {
		if s, ok := r[k].(string); ok && strings.TrimSpace(s) != "" {
			parts = append(parts, strings.TrimSpace(s))
		}
	}
	if rc, ok := r["rc"].(float64); ok && rc != 0 {
		parts = append(parts, fmt.Sprintf("rc %d", int(rc)))
	}
	if len(parts) == 0 {
		b, _ := json.Marshal(r)
		return string(b)
	}
	return strings.Join(parts, " | ")
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// findScenarios lists the scenario directories under root
// (<root>/<role>/molecule/<scenario>/molecule.yml), default first per role.
func findScenarios(root string) ([]string, error) {
	m, err := filepath.Glob(filepath.Join(root, "*", "molecule", "*", "molecule.yml"))
	if err != nil {
		return nil, err
	}
	var dirs []string
	for _, f := range m {
		dirs = append(dirs, filepath.Dir(f))
	}
	sort.Slice(dirs, func(i, j int) bool {
		ri, rj := filepath.Dir(filepath.Dir(dirs[i])), filepath.Dir(filepath.Dir(dirs[j]))
		if ri != rj {
			return ri < rj
		}
		di, dj := filepath.Base(dirs[i]) == "default", filepath.Base(dirs[j]) == "default"
		if di != dj {
			return di
		}
		return dirs[i] < dirs[j]
	})
	return dirs, nil
}

// asGroup makes c and its children (ssh, workers) one process group, killed
// as a whole when c's context ends, and bounds the wait for its output.
func asGroup(c *exec.Cmd) {
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	c.Cancel = func() error { return syscall.Kill(-c.Process.Pid, syscall.SIGKILL) }
	c.WaitDelay = 10 * time.Second
}
