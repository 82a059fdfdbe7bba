package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"
)

// Defaults of Options.
const (
	DefaultTimeout        = 10 * time.Minute
	DefaultKillGrace      = 5 * time.Second
	DefaultConnectTimeout = 15 * time.Second
	// DefaultMitogenStrategyPath is where Debian's ansible-mitogen (in the
	// runner image) keeps its strategy plugins.
	DefaultMitogenStrategyPath = "/usr/lib/python3/dist-packages/ansible_mitogen/plugins/strategy"
	// MaxMessage bounds Result.Message.
	MaxMessage = 2048
	// stderrTail is how much of ansible-playbook's own stderr is kept.
	stderrTail = 64 * 1024
)

// Options configure a Local engine.
type Options struct {
	// AnsiblePlaybook is the ansible-playbook executable; empty means the one
	// on PATH.
	AnsiblePlaybook string
	// CollectionsPath is the directory holding
	// ansible_collections/dklesev/kpssh (the repo's playbooks/collections).
	CollectionsPath string
	// ExtraCollectionsPaths are operator content (KPSSH_COLLECTIONS_PATH),
	// searched after CollectionsPath: directories holding
	// ansible_collections/<namespace>/<name>.
	ExtraCollectionsPaths []string
	// RolesPath lists role directories, searched in order: the shipped
	// roles (the repo's roles/), then operator content (KPSSH_ROLES_PATH).
	RolesPath []string
	// RunDirBase is where run directories are created; empty means /dev/shm
	// when writable, else os.TempDir().
	RunDirBase string
	// DefaultTimeout bounds runs whose Request.Timeout is 0.
	DefaultTimeout time.Duration
	// KillGrace is the time between SIGTERM and SIGKILL of a run's process
	// group when it times out.
	KillGrace time.Duration
	// ConnectTimeout bounds ssh connection setup (ansible's `timeout`).
	ConnectTimeout time.Duration
	// PythonInterpreter is the host's Python for modules.
	PythonInterpreter string
	// Path is the child's PATH; empty means the directory of
	// AnsiblePlaybook plus the standard system directories.
	Path string
	// NoRemoteTimeout disables the host-side timeout(1) around scripts.
	NoRemoteTimeout bool
	// NoRoleSyntaxCheck: ValidateRole does not run ansible-playbook
	// --syntax-check (kpssh validate where ansible is not installed).
	NoRoleSyntaxCheck bool
	// MitogenStrategyPath, when set, is the directory of mitogen's strategy
	// plugins (ansible_mitogen/plugins/strategy; in the runner image
	// DefaultMitogenStrategyPath): role and task-list phases then run with
	// strategy mitogen_linear — one Python interpreter per host for the whole
	// play instead of one per module task (docs/performance.md). Script and
	// verified phases (one task) keep the linear strategy: mitogen's start-up
	// costs more than it saves there.
	MitogenStrategyPath string
	// Verbosity (0–4) passes -v … -vvvv to ansible-playbook, for debugging.
	// The verbose output goes to ansible's stderr (ANSIBLE_VERBOSE_TO_STDERR:
	// the stdout event stream stays clean), of which the engine keeps only
	// the 64 KiB tail; that tail is redacted and surfaces only in Message, for
	// ansible's own errors. Secrets of no_log tasks (the script task is one)
	// stay censored at every level. At 4 Ansible also runs ssh -vvv, whose
	// debug lines become part of every task's stderr (script failure tails
	// in Message included).
	Verbosity int

	// NoWarmRunner turns the pre-warmed runner off: every run starts a fresh
	// ansible-playbook (the original path, ~1 s slower per phase; see
	// docs/engine.md, "Performance"). Warm runners are also off when
	// AnsiblePlaybook is not a Python script or the collection has no
	// runner/kpssh_runner.py.
	NoWarmRunner bool
	// WarmRunners is how many pre-warmed runners are kept ready (0 means
	// DefaultWarmRunners; at most 8): concurrent runs beyond it start cold.
	// Each is an idle Python process (~45 MB private memory) with a run
	// directory holding only its ansible.cfg.
	WarmRunners int
	// Sandbox says when runs must be sandboxed (Landlock, see sandbox.go
	// and docs/security.md): SandboxAuto (default) or SandboxRequired.
	Sandbox SandboxMode

	// noSandbox and noTaskCheck (tests): run without the sandbox, without
	// CheckInlineTasks — to show what each stops alone.
	noSandbox, noTaskCheck bool

	// legacyConfig and separateConnect (benchmarks): see renderConfig;
	// slowExit: warm runners exit through the interpreter's own shutdown;
	// legacyCleanup: `ssh -O exit` before the master is signalled;
	// noPrebuild: warm runners build no module payloads ahead.
	legacyConfig, separateConnect, slowExit, legacyCleanup, noPrebuild bool

	// onStart (tests) is called with the ansible-playbook pid and the run
	// directory right after the process started.
	onStart func(pid int, dir string)
	// onDone (tests) is called with the run directory after cleanup.
	onDone func(dir string)
	// afterHandOff (tests) is called with a warm runner's pid once it has
	// its run's request.
	afterHandOff func(pid int)
}

// Local runs phases as child processes of the calling process (executor
// `local`). It is safe for concurrent use: every run has its own directory,
// process group and ControlPath.
type Local struct {
	opts    Options
	warm    *warmPool // nil: warm runners are off
	warmOff error     // why they are off
	// interp and launcher start runner/kpssh_runner.py (warm or cold); both
	// empty when it cannot be used (launchErr says why).
	interp     []string
	launcher   string
	launchErr  error
	sandboxErr error // nil: runs are sandboxed
	// isolationErr: sandboxed, but the run directories are where every
	// run may read (in /dev/shm)
	isolationErr error
	syntax       syntaxCache // ValidateRole's ansible verdicts (content.go)
}

var _ Engine = (*Local)(nil)

// New checks the options and returns an engine.
func New(o Options) (*Local, error) {
	if o.AnsiblePlaybook == "" {
		p, err := exec.LookPath("ansible-playbook")
		if err != nil {
			return nil, fmt.Errorf("ansible-playbook not found on PATH (install ansible-core): %w", err)
		}
		o.AnsiblePlaybook = p
	}
	if !filepath.IsAbs(o.AnsiblePlaybook) {
		p, err := exec.LookPath(o.AnsiblePlaybook)
		if err != nil {
			return nil, err
		}
		o.AnsiblePlaybook = p
	}
	if o.CollectionsPath == "" {
		return nil, errors.New("engine: CollectionsPath is required (the directory holding ansible_collections/dklesev/kpssh)")
	}
	abs, err := filepath.Abs(o.CollectionsPath)
	if err != nil {
		return nil, err
	}
	o.CollectionsPath = abs
	for _, f := range []string{"plugins/action/stdin_exec.py", "plugins/callback/kpssh_events.py"} {
		if _, err := os.Stat(filepath.Join(o.CollectionsPath, "ansible_collections/dklesev/kpssh", f)); err != nil {
			return nil, fmt.Errorf("engine: collection dklesev.kpssh not found under %s: %w", o.CollectionsPath, err)
		}
	}
	// Operator content is only made absolute and checked for characters
	// ansible.cfg cannot carry here: a missing or unreadable source is
	// reported by ValidateRole for the profiles that use it, the others
	// keep running.
	for _, list := range [][]string{o.RolesPath, o.ExtraCollectionsPaths} {
		for i, r := range list {
			if list[i], err = filepath.Abs(r); err != nil {
				return nil, err
			}
			if !pathRE.MatchString(list[i]) {
				return nil, fmt.Errorf("engine: content path %q holds characters the engine does not put into ansible.cfg", list[i])
			}
		}
	}
	if o.Sandbox != SandboxAuto && o.Sandbox != SandboxRequired {
		return nil, fmt.Errorf("engine: Sandbox %q (want \"\" or %q)", o.Sandbox, SandboxRequired)
	}
	if o.Verbosity < 0 || o.Verbosity > 4 {
		return nil, fmt.Errorf("engine: Verbosity %d out of range (0–4)", o.Verbosity)
	}
	if o.DefaultTimeout <= 0 {
		o.DefaultTimeout = DefaultTimeout
	}
	if o.KillGrace <= 0 {
		o.KillGrace = DefaultKillGrace
	}
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = DefaultConnectTimeout
	}
	if o.PythonInterpreter == "" {
		o.PythonInterpreter = DefaultPythonInterpreter
	}
	if o.Path == "" {
		o.Path = filepath.Dir(o.AnsiblePlaybook) + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	}
	// Run directories of a crashed process hold secrets: clear them now.
	_, _ = SweepStale(o.RunDirBase)
	l := &Local{opts: o}
	l.initSandbox()
	l.initWarm()
	return l, nil
}

// FindCollectionsPath looks for the project's collection: the runner image
// location /usr/share/kpssh/collections, else playbooks/collections in a
// parent of the working directory (a checkout), else where ansible-galaxy
// installed it (installedCollection: an author's machine).
func FindCollectionsPath() (string, error) {
	p, err := findShared("collections", "playbooks/collections", "ansible_collections/dklesev/kpssh")
	if err == nil {
		return p, nil
	}
	if p, ok := installedCollection(); ok {
		return p, nil
	}
	return "", fmt.Errorf("%w, nor installed in ansible's collections path %s (ansible-galaxy collection install dklesev-kpssh-<version>.tar.gz: make collection builds it)",
		err, strings.Join(ansibleCollectionsPaths(), ":"))
}

// FindRolesPath looks for the shipped roles: the runner image's collection
// (they ship inside dklesev.kpssh; /usr/share/kpssh/roles links there), else
// roles/ in a parent of the working directory.
func FindRolesPath() (string, error) {
	if p := filepath.Join("/usr/share/kpssh/collections", collectionRolesDir); exists(p) {
		return p, nil
	}
	p, err := findShared("roles", "roles", "")
	if err == nil {
		return p, nil
	}
	if c, ok := installedCollection(); ok && exists(filepath.Join(c, collectionRolesDir)) {
		return filepath.Join(c, collectionRolesDir), nil
	}
	return "", err
}

// collectionRolesDir is the project collection's roles directory, relative
// to a collections path. In a checkout it is a symlink to the top-level
// roles/ (their source).
const collectionRolesDir = "ansible_collections/dklesev/kpssh/roles"

func findShared(image, repo, marker string) (string, error) {
	if p := filepath.Join("/usr/share/kpssh", image); exists(filepath.Join(p, marker)) {
		return p, nil
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if p := filepath.Join(dir, repo); exists(filepath.Join(p, marker)) && exists(filepath.Join(dir, "go.mod")) {
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("%s not found (neither /usr/share/kpssh/%s nor a checkout above the working directory)", repo, image)
		}
		dir = parent
	}
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

func (l *Local) renderConfig(dir string, timeout time.Duration) renderConfig {
	return renderConfig{
		dir: dir, tag: filepath.Base(dir), collectionsPath: l.opts.CollectionsPath, extraColls: l.opts.ExtraCollectionsPaths, rolesPath: l.opts.RolesPath,
		python: l.opts.PythonInterpreter, connectTimeout: l.opts.ConnectTimeout,
		timeout: timeout, remoteTimeout: !l.opts.NoRemoteTimeout,
		legacyConfig: l.opts.legacyConfig, separateConnect: l.opts.separateConnect,
		mitogen: l.opts.MitogenStrategyPath, noTaskCheck: l.opts.noTaskCheck,
	}
}

// Render is the package Render with this engine's paths.
func (l *Local) Render(req Request, secretsMasked bool) (string, error) {
	t := req.Timeout
	if t <= 0 {
		t = l.opts.DefaultTimeout
	}
	return renderText(req, secretsMasked, l.renderConfig(renderPlaceholderDir, t))
}

// ValidateRole checks that a role resolves in the content sources the run
// will search (the roles path for a short name, the collections path for an
// FQCN: see content.go), that no later source holds a second copy of it
// (never loaded: a condition rather than a surprise), that every YAML file
// of the role parses, that it has tasks/<phase>.yml, and — for leave — that
// the file is a task list using none of the values leave does not get.
// Errors name the role, the searched paths or the offending file.
// Last, for operator content, ansible loads the role's phases
// (--syntax-check, cached; see roleSyntax) unless Options.NoRoleSyntaxCheck.
func (l *Local) ValidateRole(role string, phase Phase) error {
	return l.validateRole(role, phase, !l.opts.NoRoleSyntaxCheck)
}

func (l *Local) validateRole(role string, phase Phase, syntax bool) error {
	if err := Validate(phase, Source{Role: role}); err != nil {
		return err
	}
	d, shadowed, err := l.resolveRole(role)
	if err != nil {
		return err
	}
	if len(shadowed) > 0 {
		return fmt.Errorf("role %s in %s has the name of the role in %s, which ansible loads instead: rename the later one (its collection or directory)",
			role, strings.Join(shadowed, ", "), d)
	}
	fingerprint, err := checkRoleFiles(role, d)
	if err != nil {
		return err
	}
	f := filepath.Join(d, "tasks", string(phase)+".yml")
	data, err := os.ReadFile(f)
	if err != nil {
		return &NoRolePhaseError{Role: role, Dir: d, Phase: phase}
	}
	if phase.AddressesOnly() {
		if err := validateLeaveFile(phase, "role "+role+" tasks/"+string(phase)+".yml", data); err != nil {
			return err
		}
	} else if err := ValidateTaskList(string(data)); err != nil {
		return fmt.Errorf("role %s: %s: %w", role, f, err)
	}
	if !syntax || l.shippedRole(d) {
		return nil
	}
	return l.roleSyntax(role, d, fingerprint)
}

// NoRolePhaseError: the role resolves but has no tasks/<phase>.yml.
type NoRolePhaseError struct {
	Role, Dir string
	Phase     Phase
}

func (e *NoRolePhaseError) Error() string {
	return fmt.Sprintf("role %s (%s) has no tasks/%s.yml", e.Role, e.Dir, e.Phase)
}

// rebootSource: reboot is optional in a role too; without tasks/reboot.yml
// the default runs, as for a profile without a reboot phase. Decided here,
// where the roles path is (the Job executor's pod runs Local.Run too).
func (l *Local) rebootSource(req Request) Source {
	var np *NoRolePhaseError
	if req.Phase == PhaseReboot && req.Source.Verified == nil && strings.TrimSpace(req.Source.Role) != "" &&
		errors.As(l.validateRole(req.Source.Role, PhaseReboot, false), &np) {
		return Source{Script: DefaultRebootScript}
	}
	return req.Source
}

// noVerify: verify is optional in a role too; a role without
// tasks/verify.yml has nothing to check, and the run succeeds without
// touching the host.
func (l *Local) noVerify(req Request) (Result, bool) {
	var np *NoRolePhaseError
	if req.Phase == PhaseVerify && req.Source.Verified == nil && strings.TrimSpace(req.Source.Role) != "" &&
		errors.As(l.ValidateRole(req.Source.Role, PhaseVerify), &np) {
		return Result{Outcome: Succeeded, ExitCode: -1, Message: "nothing to verify: " + np.Error()}, true
	}
	return Result{}, false
}

// Run executes one phase and returns its redacted result. It never panics
// on bad input and always removes its run directory and processes.
func (l *Local) Run(ctx context.Context, req Request) Result {
	start := time.Now()
	if res, skip := l.noVerify(req); skip {
		return res
	}
	req.Source = l.rebootSource(req)
	red := redactorFor(req)
	res := l.run(ctx, req, red)
	res.Duration = time.Since(start)
	res.FailedTask = red.Redact(res.FailedTask)
	res.Message = boundMessage(red.Redact(strings.TrimSpace(res.Message)))
	for i := range res.Changes {
		res.Changes[i].Task = red.Redact(res.Changes[i].Task)
	}
	return res
}

// changes turns the summary's changed-task events into redacted Changes
// (a diff's start, where its file names are: at most MaxDiff bytes).
func changes(evs []Event, red *Redactor) []Change {
	var out []Change
	for _, ev := range evs {
		c := Change{Task: ev.Task, Censored: ev.Censored}
		if d := strings.TrimSpace(red.RedactHead(ev.Diff, ev.DiffTruncated)); d != "" {
			if h, cut := headString(d, MaxDiff-len("…")); cut {
				d = h + "…"
			}
			c.Diff = d
		}
		out = append(out, c)
	}
	return out
}

// scriptResult is the stdin_exec result_file.
type scriptResult struct {
	RC              *int   `json:"rc"`
	Stdout          string `json:"stdout"`
	Stderr          string `json:"stderr"`
	StdoutTruncated bool   `json:"stdout_truncated"`
	StderrTruncated bool   `json:"stderr_truncated"`
	ConnectionError string `json:"connection_error"`
	Error           string `json:"error"`
	// Connected and ConnectRC come from the connect check run inside the
	// script task (connect_check): nil when it did not get that far (or ran
	// as a task of its own).
	Connected *bool `json:"connected"`
	ConnectRC *int  `json:"connect_rc"`
}

// connected reports what the in-task connect check says: reached (true,
// true), failed to connect (false, true) or unknown (_, false).
func (sr *scriptResult) connected() (reached, known bool) {
	if sr == nil || sr.Connected == nil {
		return false, false
	}
	return *sr.Connected, true
}

// facts is everything a finished run tells us.
type facts struct {
	dir         string // the run directory (shown as <run> in messages)
	phase       Phase
	timeout     time.Duration
	interrupted string // "", "timeout", "canceled"
	ctxErr      error
	exitCode    int
	sum         Summary
	stderr      string
	stderrCut   bool
	script      *scriptResult
	// connectInTask: the script task runs the connect check itself.
	connectInTask bool
}

func configError(err error) Result {
	return Result{Outcome: ConfigError, ExitCode: -1, Message: err.Error()}
}

func (l *Local) run(ctx context.Context, req Request, red *Redactor) Result {
	timeout := req.Timeout
	if timeout <= 0 {
		timeout = l.opts.DefaultTimeout
	}
	// Everything that can be checked without a host is checked before any
	// file or process exists.
	pre, err := build(req, l.renderConfig("/dev/shm/kpssh-check", timeout))
	if err != nil {
		return configError(err)
	}
	if err := l.checkSandbox(pre.kind); err != nil {
		return configError(err)
	}
	if err := ctx.Err(); err != nil {
		return Result{Outcome: TimedOut, ExitCode: -1, Message: "not started: " + err.Error()}
	}
	deadline := time.Now().Add(timeout)

	// The run's directory and process: a pre-warmed runner brings both
	// (the directory holds only its ansible.cfg), else they are made now.
	w := l.takeWarm()
	var dir *runDir
	if w != nil {
		dir = w.dir
	} else if dir, err = newRunDir(l.opts.RunDirBase); err != nil {
		return configError(err)
	}
	var pr *proc // the process of this run once it runs
	defer func() {
		if w != nil && pr != w {
			w.stop() // taken but not used
		}
		_ = dir.remove()
		if l.opts.onDone != nil {
			l.opts.onDone(dir.path)
		}
		// the next run's warm runner starts once this one is done (it would
		// compete with this run for CPU otherwise)
		l.refill()
	}()
	b, args, launchReq, err := l.prepare(req, dir, w, timeout)
	if err != nil {
		return configError(err)
	}
	f := facts{dir: dir.path, phase: req.Phase, timeout: timeout, connectInTask: (b.kind == kindScript && !l.opts.separateConnect) || b.kind == kindVerified}
	progress := newProgress(req.Progress, red)
	if w != nil {
		// A runner still warming up reads the request when it is ready; one
		// that failed to warm up never will: start cold instead.
		select {
		case <-w.ready:
		case <-ctx.Done():
			return Result{Outcome: TimedOut, ExitCode: -1, Message: "not started: " + ctx.Err().Error()}
		case <-time.After(time.Until(deadline)): // garbage-collected once unreferenced (Go ≥ 1.23)
			return Result{Outcome: TimedOut, ExitCode: -1, Message: fmt.Sprintf("not started: phase timed out after %s", timeout)}
		}
		w.ew.setOnEvent(progress)
		if w.readyOK && w.handOff(launchReq) == nil {
			pr = w
			if l.opts.afterHandOff != nil {
				l.opts.afterHandOff(pr.cmd.Process.Pid)
			}
			l.await(ctx, pr, deadline, &f)
			// Killed (not by this run) before its playbook started: the
			// runner died while idle, after takeWarm saw it alive. Nothing
			// reached the host; the run starts cold instead.
			if !pr.diedBeforeStart(&f) {
				return l.finish(pr, b, req, &f, red)
			}
		}
		// A runner that failed to warm up or died before its playbook
		// started: the run starts cold in a directory of its own, rendered
		// again. Nothing the dead runner left (ansible's temp dirs, payloads
		// it was writing when it was killed) is trusted.
		w.stop()
		_ = dir.remove()
		if dir, err = newRunDir(l.opts.RunDirBase); err != nil {
			return configError(err)
		}
		if b, args, launchReq, err = l.prepare(req, dir, nil, timeout); err != nil {
			return configError(err)
		}
		f = facts{dir: dir.path, phase: f.phase, timeout: f.timeout, connectInTask: f.connectInTask}
	}
	if pr, err = l.startCold(args, launchReq, dir, progress); err != nil {
		return configError(fmt.Errorf("cannot start ansible-playbook: %w", err))
	}
	l.await(ctx, pr, deadline, &f)
	return l.finish(pr, b, req, &f, red)
}

// prepare renders the run into dir (a warm runner's directory already holds
// its ansible.cfg) and returns the ansible-playbook arguments and the launch
// request.
func (l *Local) prepare(req Request, dir *runDir, w *proc, timeout time.Duration) (*bundle, []string, []byte, error) {
	b, err := build(req, l.renderConfig(dir.path, timeout))
	if err != nil {
		return nil, nil, nil, err
	}
	if w != nil && !w.sameConfig(b.file(fileConfig)) {
		// cannot happen (same options, same directory); never run a
		// process started with another configuration
		return nil, nil, nil, errors.New("internal error: warm runner configuration differs")
	}
	for _, f := range b.files {
		if w != nil && f.name == fileConfig {
			continue // written when the warm runner was started
		}
		if err := dir.write(f.name, f.data); err != nil {
			return nil, nil, nil, fmt.Errorf("write run directory: %w", err)
		}
	}
	args := []string{"-i", dir.join(fileInventory)}
	if b.hasVars {
		args = append(args, "-e", "@"+dir.join(fileVars))
	}
	if l.opts.Verbosity > 0 {
		args = append(args, "-"+strings.Repeat("v", l.opts.Verbosity))
	}
	if req.Check {
		args = append(args, "--check", "--diff")
	}
	args = append(args, dir.join(filePlaybook))
	launchReq, err := launchRequest(args, req.Conn)
	if err != nil {
		return nil, nil, nil, err
	}
	return b, args, launchReq, nil
}

// await waits for the run's process until it exits, the deadline passes or
// ctx ends (then its group gets SIGTERM, SIGKILL after KillGrace), empties
// its process group and reaps it; it records how it ended in f.
func (l *Local) await(ctx context.Context, pr *proc, deadline time.Time, f *facts) {
	cmd, exited := pr.cmd, pr.exited
	pid := cmd.Process.Pid
	if l.opts.onStart != nil {
		l.opts.onStart(pid, f.dir)
	}
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	select {
	case <-exited:
	case <-timer.C:
		f.interrupted = "timeout"
	case <-ctx.Done():
		f.interrupted, f.ctxErr = "canceled", ctx.Err()
	}
	if f.interrupted != "" {
		_ = syscall.Kill(-pid, syscall.SIGTERM)
		grace := time.NewTimer(l.opts.KillGrace)
		select {
		case <-exited:
		case <-grace.C:
			_ = syscall.Kill(-pid, syscall.SIGKILL)
			<-exited
		}
		grace.Stop()
	}
	// The leader has exited but is not reaped yet, so its pid — the group
	// id — cannot have been reused: whatever is left in the group (workers,
	// ssh clients) belongs to this run. stop empties it and reaps, once.
	pr.stop()
	pr.ew.Close()
	f.exitCode = cmd.ProcessState.ExitCode()
	f.sum = pr.ew.sum
	f.stderr, f.stderrCut = pr.errTail.String(), pr.errTail.Truncated()
}

// diedBeforeStart reports whether the process was killed by a signal this
// run did not send before its playbook started (no event: no task ran).
func (pr *proc) diedBeforeStart(f *facts) bool {
	ws, ok := pr.cmd.ProcessState.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && f.interrupted == "" && !f.sum.Started
}

// finish stops what the run left on the host and the controller (an
// interrupted script, the ControlPersist master) and maps the facts to the
// run's result.
func (l *Local) finish(pr *proc, b *bundle, req Request, f *facts, red *Redactor) Result {
	if f.interrupted != "" && (b.kind == kindScript && f.sum.LastTaskInternal == internalScript || modulesLocked(b.kind, l.opts.MitogenStrategyPath)) {
		// Killing ssh does not stop the script (or a module) on the host:
		// stop it there through the still-open master (timeout(1) would,
		// but only when the phase timeout runs out there). A module's
		// command line carries the tag under the phase_lock shell plugin.
		l.stopRemoteScript(pr.dir, req.Conn)
	}
	// The ControlPersist master daemonized into its own session: stop it.
	l.stopControlMaster(pr.dir)
	if b.kind == kindScript || b.kind == kindVerified {
		if data, err := os.ReadFile(pr.dir.join(fileResult)); err == nil {
			var sr scriptResult
			if json.Unmarshal(data, &sr) == nil {
				f.script = &sr
			}
		}
	}
	if b.kind == kindVerified {
		return verifiedOutcome(decide(*f, red))
	}
	return decide(*f, red)
}

// childEnv is the whole environment of ansible-playbook: nothing of the
// controller's is passed through (no proxies, tokens, SSH_AUTH_SOCK,
// ANSIBLE_* overrides), and no secret is ever in it.
func (l *Local) childEnv(dir *runDir) []string {
	env := []string{
		"PATH=" + l.opts.Path,
		"HOME=" + dir.path,
		"TMPDIR=" + dir.join(dirTmp),
		"LANG=C.UTF-8",
		"LC_ALL=C.UTF-8",
		"ANSIBLE_CONFIG=" + dir.join(fileConfig),
		"ANSIBLE_LOCAL_TEMP=" + dir.join(dirTmp),
		"ANSIBLE_HOME=" + dir.join(".ansible"),
		"ANSIBLE_NOCOLOR=1",
		"PYTHONDONTWRITEBYTECODE=1",
		"PYTHONUNBUFFERED=1",
		"PYTHONNOUSERSITE=1",
	}
	env = append(env, l.sandboxEnv()...)
	if l.opts.Verbosity > 0 {
		env = append(env, "ANSIBLE_VERBOSE_TO_STDERR=True")
	}
	if l.opts.Verbosity >= 4 {
		// ansible-core < 2.19 added ssh -vvv at -vvvv by itself; 2.19 has
		// its own setting for it
		env = append(env, "ANSIBLE_SSH_VERBOSITY=3")
	}
	return env
}

// waitExitedNoReap blocks until pid has exited, leaving it a zombie (so its
// pid and process group id stay reserved until cmd.Wait reaps it).
func waitExitedNoReap(pid int) {
	const (
		pPID    = 1         // P_PID
		wExited = 0x4       // WEXITED
		wNoWait = 0x1000000 // WNOWAIT
	)
	var info [128]byte // siginfo_t
	for {
		_, _, errno := syscall.Syscall6(syscall.SYS_WAITID, pPID, uintptr(pid), uintptr(unsafe.Pointer(&info[0])), wExited|wNoWait, 0, 0)
		if errno != syscall.EINTR {
			return
		}
	}
}

// stopRemoteScript stops an interrupted script on the host: it finds the
// processes whose command line carries this run's tag (the script's parent —
// timeout(1) or sh — and bash), takes their sessions (sshd starts every
// session with setsid, so the script and whatever it started share one unless
// they left it on purpose), sends SIGTERM to every process of those sessions,
// and SIGKILL to what is left after up to 5 s. It runs through the run's
// ControlMaster (no new authentication) in POSIX sh without procps, and is
// bounded.
func (l *Local) stopRemoteScript(dir *runDir, conn Connection) {
	sock := dir.join(sockControl)
	if _, err := os.Stat(sock); err != nil {
		return
	}
	tag := filepath.Base(dir.path)
	i := strings.IndexByte(tag, '-')
	remote := "sh -c " + ShellQuote(fmt.Sprintf(stopScript, tag[:i], tag[i:]))
	if connUser(conn) != "root" {
		remote = "sudo -n " + remote
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := exec.CommandContext(ctx, "ssh", "-F", "/dev/null", "-o", "ControlPath="+sock, "-o", "ControlMaster=no", "-o", "BatchMode=yes", "kpssh-run", remote)
	c.Env = []string{"PATH=" + l.opts.Path, "HOME=" + dir.path, "LANG=C.UTF-8"}
	c.Dir = dir.path
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	c.WaitDelay = time.Second
	_ = c.Run()
}

// stopScript is the host side of stopRemoteScript. The tag is assembled at
// run time (%s%s) so that this command's own command line does not match it;
// its own session is never signalled.
const stopScript = `a=%s; p="$a%s"; sids=" "; me=
for d in /proc/self /proc/[0-9]*; do
  s=; read -r s 2>/dev/null <"$d/stat"; s=${s##*) }; set -- $s; [ -n "$4" ] || continue
  [ -z "$me" ] && me=$4 && continue
  c=; read -r c 2>/dev/null <"$d/cmdline" # NULs are dropped: the tag stays contiguous
  case "$c" in *"$p"*) sids="$sids$4 ";; esac
done
[ "$sids" = " " ] && exit 0
pass() {
  n=0
  for d in /proc/[0-9]*; do
    s=; read -r s 2>/dev/null <"$d/stat"; s=${s##*) }; set -- $s
    [ -n "$4" ] && [ "$4" != "$me" ] && [ "$4" != 0 ] && [ "$1" != Z ] || continue
    case "$sids" in *" $4 "*) kill -$sig "${d#/proc/}" 2>/dev/null && n=$((n+1));; esac
  done
}
sig=TERM; pass; sig=0; i=0
while [ "$n" != 0 ] && [ "$i" -lt 5 ]; do sleep 1; i=$((i+1)); pass; done
[ "$n" != 0 ] && sig=KILL && pass
exit 0`

// stopControlMaster ends the run's ssh ControlPersist master: every process
// still carrying the run directory in its command line (the master's title
// is "ssh: <dir>/cm [mux]") is terminated by pid, then killed. Only processes
// of this run match: the directory name is unique. SIGTERM makes the master
// close its connection and remove its socket just as `ssh -O exit` would,
// without starting another ssh (which cost 30-90 ms per run).
func (l *Local) stopControlMaster(dir *runDir) {
	if sock := dir.join(sockControl); l.opts.legacyCleanup && exists(sock) {
		// benchmarks: the old way first
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		c := exec.CommandContext(ctx, "ssh", "-F", "/dev/null", "-o", "ControlPath="+sock, "-O", "exit", "kpssh-run")
		c.Env = []string{"PATH=" + l.opts.Path, "HOME=" + dir.path, "LANG=C.UTF-8"}
		c.Dir = dir.path
		c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		c.WaitDelay = time.Second
		_ = c.Run()
		cancel()
	}
	stopMentioning(dir.path)
}

// stopMentioning terminates, then kills, every process whose command line
// names the path s (as a whole path: another run's directory whose name
// starts with s is not s), by pid.
func stopMentioning(s string) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		var hit []int
		for _, p := range processesMentioning(s) {
			if signalIfMentions(p, sig, s) {
				hit = append(hit, p)
			}
		}
		if len(hit) == 0 {
			return
		}
		waitGone(hit, 2*time.Second)
	}
}

// namesPath reports whether the command line cl (NUL-separated) names the
// path p itself or something under it: p followed by the end, a NUL, a '/'
// or any byte that cannot continue a run directory's name. MkdirTemp's
// suffixes differ in length, so run-12 is a prefix of run-1234.
func namesPath(cl, p string) bool {
	if strings.HasSuffix(p, "/") { // "dir/": already a whole path element
		return strings.Contains(cl, p)
	}
	for i := 0; p != ""; {
		j := strings.Index(cl[i:], p)
		if j < 0 {
			return false
		}
		end := i + j + len(p)
		if end == len(cl) {
			return true
		}
		switch c := cl[end]; {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_', c == '.':
		default:
			return true
		}
		i += j + 1
	}
	return false
}

// signalIfMentions signals pid only if it still names the path s (namesPath): through a pidfd,
// so that a pid that exited and was reused since the scan is never hit.
// Without pidfds (Linux < 5.3) it is a plain kill. It reports whether the
// signal was sent.
func signalIfMentions(pid int, sig syscall.Signal, s string) bool {
	const sysPidfdOpen, sysPidfdSendSignal = 434, 424 // same on every Linux architecture
	fd, _, errno := syscall.Syscall(sysPidfdOpen, uintptr(pid), 0, 0)
	if errno != 0 {
		return errno == syscall.ENOSYS && syscall.Kill(pid, sig) == nil // else gone (ESRCH)
	}
	defer syscall.Close(int(fd))
	cl, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil || !namesPath(string(cl), s) {
		return false // not the process we found any more, or another run's
	}
	_, _, errno = syscall.Syscall6(sysPidfdSendSignal, fd, uintptr(sig), 0, 0, 0, 0)
	return errno == 0
}

// processesMentioning lists live (non-zombie) processes whose command line
// contains s.
func processesMentioning(s string) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	self := os.Getpid()
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		cl, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || len(cl) == 0 {
			continue
		}
		if strings.Contains(string(cl), s) && !isZombie(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func isZombie(pid int) bool {
	st, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true // gone
	}
	// pid (comm) S …: the state follows the last ')'
	i := strings.LastIndexByte(string(st), ')')
	return i < 0 || i+2 >= len(st) || st[i+2] == 'Z' || st[i+2] == 'X'
}

func waitGone(pids []int, d time.Duration) {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		alive := false
		for _, p := range pids {
			if !isZombie(p) {
				alive = true
				break
			}
		}
		if !alive {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// decide maps a finished run to a Result (SPEC §4.5). Messages are built
// from tails redacted before they are joined; Run redacts the whole again.
func decide(f facts, red *Redactor) Result {
	res := decideRaw(f, red)
	if f.dir != "" {
		// the run directory is gone by the time anyone reads this
		res.Message = strings.ReplaceAll(res.Message, f.dir, "<run>")
	}
	return res
}

func decideRaw(f facts, red *Redactor) Result {
	res := Result{ExitCode: f.exitCode, Touched: f.sum.Reached, AnsibleVersion: f.sum.AnsibleVersion, Changes: changes(f.sum.Changed, red)}
	// The connect check inside the script task (connect_check) says in
	// result_file whether the session was established: it decides Touched
	// where the event stream cannot (no_log censors the script task's
	// results, and a run killed mid-script has no result event at all).
	connected, known := f.script.connected()
	if known {
		res.Touched = connected
	}
	switch {
	case f.interrupted != "":
		interrupted(&res, f, connected)
	case !f.sum.Started:
		res.Outcome, res.Touched = ConfigError, false
		res.Message = fmt.Sprintf("ansible-playbook could not run the phase (exit %d): %s", f.exitCode, ansibleErrorText(f.stderrTail(red)))
	case f.sum.Failed != nil:
		taskFailed(&res, f, red)
	case f.sum.Unreachable != nil:
		unreachable(&res, f, red, connected, known)
	case f.exitCode == 0 && f.sum.Stats != nil && f.sum.Stats.Failures == 0 && f.sum.Stats.Unreachable == 0:
		res.Outcome = Succeeded
	case f.sum.Reached:
		// Non-zero exit without a failed or unreachable result: ansible's
		// own error during the run (or a crash).
		res.Outcome, res.FailedTask = Failed, f.sum.LastTask
		res.Message = joinMessage(fmt.Sprintf("ansible-playbook exited %d", f.exitCode), ansibleErrorText(f.stderrTail(red)))
	default:
		res.Outcome = ConfigError
		res.Message = joinMessage(fmt.Sprintf("ansible-playbook exited %d before reaching the host", f.exitCode), ansibleErrorText(f.stderrTail(red)))
	}
	return res
}

// stderrTail is ansible-playbook's stderr, redacted, its tail.
func (f facts) stderrTail(red *Redactor) string {
	return strings.TrimSpace(red.RedactTail(f.stderr, f.stderrCut))
}

// interrupted: the run was stopped (timeout or cancel) and terminated.
func interrupted(res *Result, f facts, connected bool) {
	res.Outcome = TimedOut
	res.FailedTask = f.sum.LastTask
	if f.connectInTask && f.sum.LastTaskInternal == internalScript && !connected {
		// the script task had not got past its connect check: report
		// the step as the separate connect task was reported
		res.FailedTask = connectTaskName
	}
	if f.interrupted == "timeout" {
		res.Message = fmt.Sprintf("phase timed out after %s", f.timeout)
	} else {
		res.Message = fmt.Sprintf("phase interrupted: %v", f.ctxErr)
	}
	if res.FailedTask != "" {
		res.Message += fmt.Sprintf(" during task %q", res.FailedTask)
	}
	res.Message += "; ansible-playbook was terminated"
}

// taskFailed: a task's result was failed; the script task's details come
// from its result_file (no_log censors the event).
func taskFailed(res *Result, f facts, red *Redactor) {
	ev := f.sum.Failed
	res.Outcome = Failed
	res.FailedTask = ev.Task
	if ev.RC != nil {
		res.RC = *ev.RC
	}
	details := eventDetails(ev, red)
	script := ev.Internal == internalScript && f.script != nil
	if script {
		if f.script.RC != nil {
			res.RC = *f.script.RC
		}
		details = scriptDetails(f.script, red)
	}
	head := fmt.Sprintf("task %q failed", ev.Task)
	if ev.RC != nil || (script && f.script.RC != nil) {
		head += fmt.Sprintf(" (rc=%d)", res.RC)
	}
	internal := ev.Internal
	if script && f.script.ConnectRC != nil {
		// the in-task connect check failed: report it as the connect
		// task it replaces
		internal, res.FailedTask = internalConnect, connectTaskName
	}
	if internal == internalConnect {
		head = "connect check failed on the host (rc=" + strconv.Itoa(res.RC) + ")"
	}
	res.Message = joinMessage(head, details)
}

// unreachable: a task's result was unreachable; which step it was and
// whether anything ran decide the message.
func unreachable(res *Result, f facts, red *Redactor, connected, known bool) {
	ev := f.sum.Unreachable
	res.Outcome = Failed
	res.FailedTask = ev.Task
	msg := strings.TrimSpace(red.RedactTail(ev.Msg, ev.MsgTruncated))
	internal := ev.Internal
	if internal == internalScript && known && !connected {
		// the in-task connect check could not connect: nothing ran (the
		// event's own message is censored by no_log; result_file has it)
		internal, res.FailedTask = internalConnect, connectTaskName
		msg = strings.TrimSpace(red.Redact(f.script.ConnectionError))
	}
	if internal == internalScript && f.script != nil && f.script.ConnectionError != "" {
		res.RC = 255
		res.Message = joinMessage(fmt.Sprintf("task %q: ssh exited 255 (connection lost, or the script exited 255)", ev.Task), strings.TrimSpace(red.Redact(f.script.ConnectionError)))
		return
	}
	var head string
	switch {
	case strings.Contains(msg, "Host key verification failed") || strings.Contains(msg, "REMOTE HOST IDENTIFICATION HAS CHANGED"):
		head = "host key mismatch: the host did not present the pinned key; nothing ran"
	case internal == internalConnect:
		head = "host unreachable; nothing ran"
	default:
		head = fmt.Sprintf("host unreachable during task %q", ev.Task)
	}
	res.Message = joinMessage(head, msg)
}

// ansibleErrorText picks ansible's "ERROR! …" part of its stderr (warnings
// and tracebacks around it are noise), or the tail.
func ansibleErrorText(stderr string) string {
	if i := strings.Index(stderr, "ERROR!"); i >= 0 {
		return strings.TrimSpace(stderr[i:])
	}
	if i := strings.LastIndex(stderr, "[ERROR]"); i >= 0 {
		return strings.TrimSpace(stderr[i:])
	}
	return stderr
}

func eventDetails(ev *Event, red *Redactor) string {
	var parts []string
	if ev.Censored {
		parts = append(parts, "(output hidden by no_log)")
	}
	if m := strings.TrimSpace(red.RedactTail(ev.Msg, ev.MsgTruncated)); m != "" {
		parts = append(parts, m)
	}
	if s := strings.TrimSpace(red.RedactTail(ev.Stderr, ev.StderrTruncated)); s != "" {
		parts = append(parts, "stderr: "+s)
	} else if s := strings.TrimSpace(red.RedactTail(ev.Stdout, ev.StdoutTruncated)); s != "" {
		parts = append(parts, "stdout: "+s)
	}
	if len(parts) == 0 && ev.Exception != "" {
		parts = append(parts, strings.TrimSpace(red.RedactTail(ev.Exception, true)))
	}
	return strings.Join(parts, "\n")
}

func scriptDetails(sr *scriptResult, red *Redactor) string {
	if sr.Error != "" {
		return red.Redact(sr.Error)
	}
	if s := strings.TrimSpace(red.RedactTail(sr.Stderr, sr.StderrTruncated)); s != "" {
		return "stderr: " + s
	}
	if s := strings.TrimSpace(red.RedactTail(sr.Stdout, sr.StdoutTruncated)); s != "" {
		return "stdout: " + s
	}
	return "(no output)"
}

// joinMessage keeps the head and the tail of the details within MaxMessage.
func joinMessage(head, details string) string {
	details = strings.TrimSpace(details)
	if details == "" {
		return head
	}
	room := MaxMessage - len(head) - 2
	if room < 64 {
		room = 64
	}
	if t, cut := tailString(details, room-len("…")); cut {
		details = "…" + t
	}
	return head + ": " + details
}

// boundMessage caps a (redacted) message at MaxMessage, keeping its start
// and end.
func boundMessage(s string) string {
	if len(s) <= MaxMessage {
		return s
	}
	head := MaxMessage / 4
	for head > 0 && !isRuneStart(s, head) {
		head--
	}
	tail, _ := tailString(s, MaxMessage-head-len(" … "))
	return s[:head] + " … " + tail
}

func isRuneStart(s string, i int) bool { return i >= len(s) || s[i]&0xC0 != 0x80 }
