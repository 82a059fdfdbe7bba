package engine

import (
	"bytes"
	"encoding/pem"
	"errors"
	"fmt"
	"math"
	"net"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/dklesev/kpssh/internal/sshx"
)

// DefaultPythonInterpreter is the host's Python for modules (role and task
// profiles only; scripts need no Python on the host).
const DefaultPythonInterpreter = "/usr/bin/python3"

// remoteKillAfter is the grace the host-side `timeout` gives the script
// between SIGTERM and SIGKILL.
const remoteKillAfter = 5

// hostPhaseLock is the host-side lock every script phase holds while it runs
// (on /run: gone with a reboot, as the scripts it guards are).
const hostPhaseLock = "/run/kpssh-phase.lock"

var (
	addressRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9.:%_-]{0,252})$`)
	userRE    = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_.-]{0,31}$`)
	pathRE    = regexp.MustCompile(`^/[A-Za-z0-9_./+@=,-]*$`)
)

// kind is the source kind of a request.
type kind int

const (
	kindScript kind = iota
	kindTasks
	kindRole
	kindVerified // a signed script through the host's shim
)

func sourceKind(s Source) kind {
	switch {
	case s.Verified != nil:
		return kindVerified
	case strings.TrimSpace(s.Script) != "":
		return kindScript
	case strings.TrimSpace(s.Tasks) != "":
		return kindTasks
	}
	return kindRole
}

// renderConfig is what rendering needs besides the request.
type renderConfig struct {
	dir             string   // the run directory (absolute)
	collectionsPath string   // holds ansible_collections/dklesev/kpssh
	rolesPath       []string // roles_path entries
	extraColls      []string // operator collections, after collectionsPath
	python          string
	connectTimeout  time.Duration
	timeout         time.Duration // the phase timeout (host-side bound for scripts)
	remoteTimeout   bool
	// tag names the run on the host: the script's bash gets it as $1, so an
	// interrupted run can find and stop its script there.
	tag string
	// legacyConfig and separateConnect (benchmarks) render what the engine
	// rendered before its per-phase overhead was cut: the old ansible.cfg,
	// and the connect check of script profiles as a task of its own.
	legacyConfig, separateConnect bool
	// mitogen: the mitogen strategy plugins' directory ("" = off); see
	// Options.MitogenStrategyPath.
	mitogen string
	// noTaskCheck (tests) skips CheckInlineTasks: the sandbox alone.
	noTaskCheck bool
	// policyChecked: the params were checked against a verified manifest's
	// param policy before their secrets were masked (kpssh render).
	policyChecked bool
}

// bundle is every file of a run, rendered.
type bundle struct {
	kind      kind
	files     []bundleFile // written in order
	hasVars   bool
	playbook  string
	scriptLen int
}

type bundleFile struct {
	name string
	data []byte
}

func (b *bundle) add(name string, data []byte) {
	b.files = append(b.files, bundleFile{name, data})
}

func (b *bundle) file(name string) []byte {
	for _, f := range b.files {
		if f.name == name {
			return f.data
		}
	}
	return nil
}

// checkConnection validates the connection before anything is written.
func checkConnection(c Connection) (keyPEM []byte, knownHosts []byte, err error) {
	if !addressRE.MatchString(c.Address) {
		return nil, nil, fmt.Errorf("host address %q is not an IP address or DNS name", c.Address)
	}
	if c.Port < 0 || c.Port > 65535 {
		return nil, nil, fmt.Errorf("port %d out of range", c.Port)
	}
	if c.User != "" && !userRE.MatchString(c.User) {
		return nil, nil, fmt.Errorf("user %q is not a valid login name", c.User)
	}
	if strings.TrimSpace(c.HostKey) == "" {
		return nil, nil, errors.New("no pinned host key: the engine never trusts on first use (see FetchHostKey)")
	}
	pub, _, _, rest, perr := ssh.ParseAuthorizedKey([]byte(c.HostKey))
	if perr != nil || len(bytes.TrimSpace(rest)) != 0 {
		return nil, nil, errors.New("pinned host key is not a single public-key line (\"ssh-ed25519 AAAA…\")")
	}
	if len(c.PrivateKey) == 0 {
		return nil, nil, errors.New("no SSH private key")
	}
	raw, kerr := ssh.ParseRawPrivateKey(c.PrivateKey)
	if kerr != nil {
		var pp *ssh.PassphraseMissingError
		if errors.As(kerr, &pp) {
			return nil, nil, errors.New("ssh private key is passphrase-protected; kpssh needs an unencrypted key")
		}
		return nil, nil, errors.New("ssh private key cannot be parsed (want a PEM or OpenSSH private key)")
	}
	// Re-encode in the OpenSSH format: whatever the Secret held (PKCS#1,
	// PKCS#8, SEC1, OpenSSH, missing final newline), ssh(1) reads this.
	blk, merr := ssh.MarshalPrivateKey(raw, "")
	if merr != nil {
		return nil, nil, errors.New("ssh private key type is not supported")
	}
	keyPEM = pem.EncodeToMemory(blk)

	port := c.Port
	if port == 0 {
		port = 22
	}
	line := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(pub)))
	var kh strings.Builder
	// The entry ssh looks up: "addr" on port 22, "[addr]:port" otherwise;
	// both are written (the file holds only the pinned key either way).
	host := c.Address
	fmt.Fprintf(&kh, "%s %s\n", host, line)
	fmt.Fprintf(&kh, "[%s]:%d %s\n", host, port, line)
	return keyPEM, []byte(kh.String()), nil
}

func connUser(c Connection) string {
	if c.User == "" {
		return "root"
	}
	return c.User
}

func connPort(c Connection) int32 {
	if c.Port == 0 {
		return 22
	}
	return c.Port
}

// build validates a request and renders every file of its run into a
// bundle, for the run directory rc.dir. It never touches the filesystem.
func build(req Request, rc renderConfig) (*bundle, error) {
	if !req.Phase.Valid() {
		return nil, fmt.Errorf("unknown phase %q (want %s)", req.Phase, PhaseNames())
	}
	if err := checkModeAllowed(req); err != nil {
		return nil, err
	}
	if err := validate(req.Phase, req.Source, !rc.noTaskCheck); err != nil {
		return nil, err
	}
	keyPEM, known, err := checkConnection(req.Conn)
	if err != nil {
		return nil, err
	}
	ctx := phaseContext(req.Phase, req.Context)
	if req.Check && req.Phase == PhaseJoin {
		ctx.BootstrapToken = CheckModeToken
	}
	if err := checkContext(ctx); err != nil {
		return nil, err
	}
	for _, p := range append(append([]string{rc.dir, rc.collectionsPath, rc.python}, rc.rolesPath...), rc.extraColls...) {
		if p != "" && !pathRE.MatchString(p) {
			return nil, fmt.Errorf("path %q holds characters the engine does not put into ansible.cfg", p)
		}
	}
	b := &bundle{kind: sourceKind(req.Source)}
	b.add(fileKey, keyPEM)
	b.add(fileKnown, known)
	b.add(fileConfig, []byte(ansibleConfig(rc)))
	b.add(fileInventory, []byte(inventory(req.Conn, rc, phaseLockVars(rc, b.kind))))

	switch b.kind {
	case kindVerified:
		if err := buildVerified(b, req, ctx, rc); err != nil {
			return nil, err
		}
	case kindScript:
		body, err := renderScript(req.Phase, req.Source.Script, ctx)
		if err != nil {
			return nil, err
		}
		pre, err := Preamble(Env(req.Phase, ctx, true))
		if err != nil {
			return nil, err
		}
		if body != "" && !strings.HasSuffix(body, "\n") {
			body += "\n"
		}
		script := pre + body
		b.scriptLen = len(script)
		b.add(fileScript, []byte(script))
		b.playbook = scriptPlaybook(req, rc)
	default:
		vars, err := varsFile(req.Phase, ctx)
		if err != nil {
			return nil, err
		}
		b.add(fileVars, []byte(vars))
		b.hasVars = true
		if b.kind == kindTasks {
			b.add(fileTasks, []byte(req.Source.Tasks))
		}
		b.playbook = ansiblePlaybook(req, ctx, rc, b.kind)
	}
	b.add(filePlaybook, []byte(b.playbook))
	return b, nil
}

func (rc renderConfig) path(name string) string { return rc.dir + "/" + name }

// checkModeAllowed: check mode is for the drift check of role and task
// profiles, whose modules know check mode; a script cannot be run without
// running it (a script profile's drift check is its own check phase).
func checkModeAllowed(req Request) error {
	if !req.Check {
		return nil
	}
	if k := sourceKind(req.Source); k != kindRole && k != kindTasks {
		return fmt.Errorf("check mode runs role and task profiles only (a script profile checks drift with its scripts.check)")
	}
	if req.Phase != PhaseInstall && req.Phase != PhaseJoin {
		return fmt.Errorf("check mode runs install and join only, not %s", req.Phase)
	}
	return nil
}

// ansibleConfig is the run's ansible.cfg: nothing from /etc/ansible or the
// controller's home is read (ANSIBLE_CONFIG points here, HOME is the run
// directory).
func ansibleConfig(rc renderConfig) string {
	var b strings.Builder
	ct := int(math.Ceil(rc.connectTimeout.Seconds()))
	if ct <= 0 {
		ct = 15
	}
	fmt.Fprintf(&b, `# rendered by the kpssh engine for one phase run
[defaults]
stdout_callback = dklesev.kpssh.kpssh_events
%[5]snocows = True
nocolor = True
retry_files_enabled = False
host_key_checking = True
interpreter_python = %[2]s
collections_path = %[3]s
local_tmp = %[1]s/tmp
timeout = %[4]d
forks = 1
gathering = explicit
deprecation_warnings = False
system_warnings = False
localhost_warning = False
`, rc.dir, rc.python, strings.Join(append([]string{rc.collectionsPath}, rc.extraColls...), ":"), ct, tuningLines(rc))
	if len(rc.rolesPath) > 0 {
		fmt.Fprintf(&b, "roles_path = %s\n", strings.Join(rc.rolesPath, ":"))
	}
	if rc.mitogen != "" {
		// only makes the strategy loadable: the role/tasks play names it
		// (a warm runner's ansible.cfg is written before the run's kind is known)
		fmt.Fprintf(&b, "strategy_plugins = %s\n", rc.mitogen)
	}
	fmt.Fprintf(&b, `
[inventory]
enable_plugins = yaml

[ssh_connection]
pipelining = True
reconnection_retries = 0
control_path_dir = %[1]s
ssh_args = -F /dev/null -o ControlMaster=auto -o ControlPersist=60s -o ControlPath=%[1]s/%[2]s -o StrictHostKeyChecking=yes -o UserKnownHostsFile=%[1]s/%[3]s -o GlobalKnownHostsFile=/dev/null -o IdentitiesOnly=yes -o IdentityAgent=none -o BatchMode=yes -o ServerAliveInterval=15 -o ServerAliveCountMax=4 -o LogLevel=ERROR
`, rc.dir, sockControl, fileKnown)
	return b.String()
}

// tuningLines are the [defaults] lines that differ between the legacy
// configuration and the current one:
//   - "callbacks_enabled =" enabled a callback named "" (a failed plugin
//     lookup and a warning on every run); the default, no extra callback,
//     is what it meant;
//   - "transport = ssh": the inventory names the ssh connection anyway, and
//     the default "smart" transport makes every run spawn `ssh -o
//     ControlPersist` to find out whether ssh supports it;
//   - "vars_plugins_enabled =" (none): host_group_vars looks for
//     group_vars/ and host_vars/ next to the inventory and the playbook —
//     the run directory, which has neither — several times per task.
func tuningLines(rc renderConfig) string {
	if rc.legacyConfig {
		return "callbacks_enabled =\n"
	}
	return "transport = ssh\nvars_plugins_enabled =\n"
}

// inventory is the run's one-host inventory. ssh is told which host-key
// algorithms to negotiate: those of the pinned key (HostKeyAlgorithms), the
// only key in the run's known_hosts. A stock host has rsa, ecdsa and
// ed25519 keys; ssh would otherwise choose by its default order, adjusted
// by what known_hosts holds — the pin decides, not that heuristic.
// c.HostKey was checked by checkConnection.
func inventory(c Connection, rc renderConfig, extra string) string {
	var keyType string
	if pub, _, _, _, err := ssh.ParseAuthorizedKey([]byte(c.HostKey)); err == nil {
		keyType = pub.Type()
	}
	if algos := sshx.HostKeyAlgorithms(keyType); len(algos) > 0 {
		extra += "      ansible_ssh_extra_args: " + yq("-o HostKeyAlgorithms="+strings.Join(algos, ",")) + "\n"
	}
	return fmt.Sprintf(`all:
  hosts:
    %[1]s:
      ansible_connection: ssh
      ansible_host: %[1]s
      ansible_port: %[2]d
      ansible_user: %[3]s
      ansible_ssh_private_key_file: %[4]s
      ansible_python_interpreter: %[5]s
%[6]s`, yq(c.Address), connPort(c), yq(connUser(c)), yq(rc.path(fileKey)), yq(rc.python), extra)
}

// modulesLocked: a run of kind k with mitogen (its strategy path, "" = off)
// runs its modules under the phase lock, their command lines tagged.
func modulesLocked(k kind, mitogen string) bool {
	return (k == kindRole || k == kindTasks) && mitogen == ""
}

// phaseLockVars are the inventory variables that run a role or tasks
// phase's modules under the host's phase lock, the one script phases hold
// for their whole script (the dklesev.kpssh.phase_lock shell plugin: each
// module's interpreter under flock, the run's tag in its command line). A
// module left running by a killed ansible-playbook (a controller crash, a
// cancel) holds the lock until it ends, and the resumed run's modules wait
// for it instead of running beside it (two apt runs, two kubelet restarts);
// only the module in flight can outlive its ansible-playbook, so a lock per
// module suffices. Not with mitogen, whose one interpreter serves the whole
// run; not for scripts, whose command takes the lock itself (a lock held
// around it too would deadlock the script's own flock).
func phaseLockVars(rc renderConfig, k kind) string {
	if !modulesLocked(k, rc.mitogen) {
		return ""
	}
	return fmt.Sprintf("      ansible_shell_type: dklesev.kpssh.phase_lock\n      kpssh_phase_lock_wait: %d\n      kpssh_run_tag: %s\n",
		int(math.Ceil(rc.timeout.Seconds())), yq(rc.tag))
}

// connectTask is the first task of every play: a no-op command over the
// connection, so a host that cannot be reached fails here, before anything
// could have run (Touched=false), and everything after it counts as reached.
const connectTaskName = "kpssh: connect"

func connectTask() string {
	return `    - name: ` + yq(connectTaskName) + `
      vars:
        kpssh_internal: connect
      dklesev.kpssh.stdin_exec:
        cmd: "true"
        changed: false
`
}

// scriptCommand is the remote command a script is piped into: bash -s as
// root (sudo -n for other users) with the run tag as $1, under a parent that
// stays alive and carries the tag too — timeout(1), which also bounds the
// script on the host with the phase timeout, or a plain sh. The controller
// stops an interrupted script by the sessions of the tagged processes.
//
// With a tag, the script first takes the host's phase lock (flock(1) on
// hostPhaseLock): a phase resumed after a controller crash or a cancel waits
// for its predecessor's script, still running on the host, to end (bounded
// by the phase timeout, as that script is) instead of running beside it —
// two joins restarting one kubelet mid-bootstrap send two CSRs.
func scriptCommand(req Request, rc renderConfig) string {
	var cmd string
	switch {
	case rc.remoteTimeout && rc.timeout > 0:
		secs := int(math.Ceil(rc.timeout.Seconds()))
		cmd = fmt.Sprintf("flock -w %d %s timeout -k %d %d bash -s %s", secs, hostPhaseLock, remoteKillAfter, secs, rc.tag)
	case rc.tag != "":
		cmd = fmt.Sprintf(`flock %s sh -c 'bash -s "$0"; exit $?' %s`, hostPhaseLock, rc.tag)
	default:
		cmd = "bash -s"
	}
	if connUser(req.Conn) != "root" {
		cmd = "sudo -n " + cmd
	}
	return cmd
}

func playHeader(req Request, how string) string {
	return fmt.Sprintf("# kpssh %s phase (%s), rendered by the kpssh engine\n- name: %s\n  hosts: all\n  gather_facts: false\n",
		req.Phase, how, yq("kpssh "+string(req.Phase)))
}

func scriptPlaybook(req Request, rc renderConfig) string {
	var b strings.Builder
	b.WriteString(playHeader(req, "script"))
	b.WriteString("  tasks:\n")
	connect := ""
	if rc.separateConnect {
		b.WriteString(connectTask())
	} else {
		// One task less per phase (each costs ~0.1 s of Ansible's task
		// machinery): the plugin runs the connect check itself and records
		// in result_file whether the session was established.
		connect = "        connect_check: true\n"
	}
	fmt.Fprintf(&b, `    - name: %s
      # The rendered script (preamble with the KPSSH_* exports, secrets
      # included) goes to the command's stdin over the SSH channel: never on
      # the host's disk or in its process arguments. no_log keeps the output
      # out of every callback; the controller reads the redacted tail from
      # result_file instead.%s
      no_log: true
      vars:
        kpssh_internal: script
      dklesev.kpssh.stdin_exec:
        cmd: %s
        stdin_file: %s
        remove_stdin_file: true
        result_file: %s
%s`, yq("kpssh: "+string(req.Phase)+" script"), connectComment(rc), yq(scriptCommand(req, rc)), yq(rc.path(fileScript)), yq(rc.path(fileResult)), connect)
	return b.String()
}

// connectComment explains, in the rendered playbook, where the connect check
// of a script profile went.
func connectComment(rc renderConfig) string {
	if rc.separateConnect {
		return ""
	}
	return "\n      # The connect check (" + yq(connectTaskName) + ") runs first, inside this\n" +
		"      # task (connect_check: a session running `true`); if it fails,\n" +
		"      # nothing of the script ran."
}

// ansibleEnvNames are the fixed KPSSH_* names of the play environment of
// role/task profiles and the kpssh.* key each comes from. The bootstrap token
// is not among them: `environment:` values end up in the remote command line
// of every module; it is available as kpssh.bootstrap_token only.
var ansibleEnvNames = []struct{ env, key string }{
	{EnvClusterCAB64, "cluster_ca_b64"},
	{EnvClusterEndpoint, "cluster_endpoint"},
	{EnvHostAddress, "host_address"},
	{EnvNodeAddress, "node_address"},
	{EnvNodeLabels, "node_labels"},
	{EnvNodeName, "node_name"},
	{EnvProviderID, "provider_id"},
	{EnvTaints, "taints"},
}

func ansiblePlaybook(req Request, ctx Context, rc renderConfig, k kind) string {
	var b strings.Builder
	how := "tasks"
	if k == kindRole {
		how = "role " + req.Source.Role
	}
	b.WriteString(playHeader(req, how))
	if rc.mitogen != "" {
		b.WriteString("  strategy: mitogen_linear\n")
	}
	if connUser(req.Conn) != "root" {
		b.WriteString("  become: true\n")
	}
	// KPSSH_* for shell/command tasks, from the (!unsafe) variables. Secrets
	// are not exported here (this would put them into remote command lines):
	// tasks use kpssh_secrets.
	b.WriteString("  environment:\n")
	for _, e := range ansibleEnvNames {
		fmt.Fprintf(&b, "    %s: \"{{ kpssh['%s'] }}\"\n", e.env, e.key)
	}
	if !req.Phase.AddressesOnly() {
		for _, k := range sortedKeys(ctx.Vars) {
			fmt.Fprintf(&b, "    %s%s: \"{{ kpssh_vars['%s'] }}\"\n", EnvVarPrefix, k, k)
		}
	}
	b.WriteString("  tasks:\n")
	b.WriteString(connectTask())
	if k == kindTasks {
		fmt.Fprintf(&b, "    - ansible.builtin.import_tasks: %s\n", yq(rc.path(fileTasks)))
	} else {
		fmt.Fprintf(&b, "    - ansible.builtin.import_role:\n        name: %s\n        tasks_from: %s\n", yq(req.Source.Role), yq(string(req.Phase)))
	}
	return b.String()
}

// varsFile is the 0600 extra-vars file (-e @vars.yml) of role/task profiles:
// kpssh (the fixed values), kpssh_vars, kpssh_secrets — each map !unsafe so
// Ansible never templates a value in it. The tag goes on the map, not on
// each scalar: ansible-core 2.19 re-resolves an !unsafe scalar as if it were
// plain, so `!unsafe ""` would load as None and `!unsafe "yes"` as True.
func varsFile(p Phase, ctx Context) (string, error) {
	var b strings.Builder
	b.WriteString("# kpssh phase variables (mode 0600; removed with the run directory)\n")
	fmt.Fprintf(&b, "kpssh_phase: %s\n", yq(string(p)))
	fixed := []struct{ key, val string }{
		{"bootstrap_token", ctx.BootstrapToken},
		{"cluster_ca_b64", ctx.ClusterCAB64},
		{"cluster_endpoint", ctx.ClusterEndpoint},
		{"host_address", ctx.HostAddress},
		{"node_address", ctx.NodeAddress},
		{"node_labels", ctx.NodeLabels},
		{"node_name", ctx.NodeName},
		{"provider_id", ctx.ProviderID},
		{"taints", ctx.Taints},
	}
	b.WriteString("kpssh: !unsafe\n")
	for _, f := range fixed {
		if err := checkYAMLString(f.val); err != nil {
			return "", fmt.Errorf("%s: %w", f.key, err)
		}
		fmt.Fprintf(&b, "  %s: %s\n", f.key, yq(f.val))
	}
	for _, m := range []struct {
		name string
		vals map[string]string
	}{{"kpssh_vars", ctx.Vars}, {"kpssh_secrets", ctx.Secrets}} {
		if p.AddressesOnly() || len(m.vals) == 0 {
			fmt.Fprintf(&b, "%s: {}\n", m.name)
			continue
		}
		fmt.Fprintf(&b, "%s: !unsafe\n", m.name)
		for _, k := range sortedKeys(m.vals) {
			if err := checkYAMLString(m.vals[k]); err != nil {
				return "", fmt.Errorf("%s %s: %w", m.name, k, err)
			}
			fmt.Fprintf(&b, "  %s: %s\n", k, yq(m.vals[k]))
		}
	}
	return b.String(), nil
}

// hostPort renders address:port for messages.
func hostPort(c Connection) string {
	return net.JoinHostPort(c.Address, strconv.Itoa(int(connPort(c))))
}

// renderPlaceholderDir stands for the run directory in Render output.
const renderPlaceholderDir = "/dev/shm/kpssh-RUN"

// Render returns what a phase would run, for `kpssh render HOST PHASE`: the
// playbook and, for scripts, the rendered script (the preamble included);
// for role/task profiles the variables file and the task list. With
// secretsMasked the bootstrap token's secret half, every secret value and
// every Request.Redact value are replaced by ***. The SSH key is never shown.
// Paths use the default collection/roles locations and a placeholder run
// directory. See (*Local).Render for an engine's own paths.
func Render(req Request, secretsMasked bool) (string, error) {
	if req.Timeout <= 0 {
		req.Timeout = DefaultTimeout
	}
	return renderText(req, secretsMasked, renderConfig{
		dir: renderPlaceholderDir, python: DefaultPythonInterpreter, tag: filepath.Base(renderPlaceholderDir),
		collectionsPath: "/usr/share/kpssh/collections", connectTimeout: DefaultConnectTimeout,
		timeout: req.Timeout, remoteTimeout: true,
	})
}

func renderText(req Request, masked bool, rc renderConfig) (string, error) {
	red := redactorFor(req)
	if masked {
		if req.Source.Verified != nil {
			// the policy is about the real values, not their masks
			if err := VerifyParams(req.Phase, req.Source, req.Context); err != nil {
				return "", errors.New(red.Redact(err.Error()))
			}
			rc.policyChecked = true
		}
		req = maskRequest(req)
	}
	b, err := build(req, rc)
	if err != nil {
		if masked {
			return "", errors.New(red.Redact(err.Error()))
		}
		return "", err
	}
	var out strings.Builder
	state := "secrets shown"
	if masked {
		state = "secrets masked"
	}
	fmt.Fprintf(&out, "# kpssh render: phase %s for %s@%s (%s)\n", req.Phase, connUser(req.Conn), hostPort(req.Conn), state)
	section := func(name, what string) {
		fmt.Fprintf(&out, "\n# ==> %s/%s%s <==\n", rc.dir, name, what)
		data := b.file(name)
		out.Write(data)
		if len(data) > 0 && data[len(data)-1] != '\n' {
			out.WriteByte('\n')
		}
	}
	section(filePlaybook, "")
	switch b.kind {
	case kindScript:
		section(fileScript, " (stdin of the script task)")
	case kindVerified:
		if req.Source.Verified.ProvisionedLeave {
			fmt.Fprintf(&out, "\n# (no envelope: the shim runs the host's /etc/kpssh/fallback-leave)\n")
		} else {
			section(fileEnvelope, " (stdin of the shim; base64 fields)")
		}
	case kindTasks:
		section(fileVars, " (-e @vars.yml)")
		section(fileTasks, "")
	default:
		section(fileVars, " (-e @vars.yml)")
	}
	text := out.String()
	if masked {
		text = red.Redact(text)
	}
	return text, nil
}

// maskRequest replaces secret values in a request by Mask (the token keeps
// its public id).
func maskRequest(req Request) Request {
	c := req.Context
	if t := c.BootstrapToken; t != "" {
		if i := strings.IndexByte(t, '.'); i >= 0 {
			c.BootstrapToken = t[:i+1] + Mask
		} else {
			c.BootstrapToken = Mask
		}
	}
	if len(c.Secrets) > 0 {
		m := make(map[string]string, len(c.Secrets))
		for k := range c.Secrets {
			m[k] = Mask
		}
		c.Secrets = m
	}
	req.Context = c
	return req
}
