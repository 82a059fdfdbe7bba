package engine

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// SandboxMode says when a run must be sandboxed (Options.Sandbox).
type SandboxMode string

const (
	// SandboxAuto (the default): every run is sandboxed where the kernel
	// allows it; where it does not, inline task lists (API content) are
	// refused and scripts, verified scripts and roles run unsandboxed.
	SandboxAuto SandboxMode = ""
	// SandboxRequired refuses every run that cannot be sandboxed.
	SandboxRequired SandboxMode = "required"
)

// The run sandbox: the launcher (runner/kpssh_runner.py, warm or cold)
// restricts itself with Landlock before it imports ansible
// (runner/kpssh_sandbox.py), so that everything the run starts on the
// controller — ansible-playbook, its workers, ssh, a lookup's command, a
// delegated module, connection: local — sees only the system directories
// (read-only), the collection, the roles, the ansible-playbook and its
// interpreter (read-only), the files (not the listing) of /dev/shm (POSIX
// semaphores) and its own run directory: not the ServiceAccount token, not
// the other runs' directories (unless they are in /dev/shm: isolationErr),
// not /tmp or $HOME. A launcher that cannot apply it exits 71 ("kpssh
// sandbox: …" on stderr): a ConfigError.
// With Landlock ABI ≥ 4 it may connect over TCP only to the host's SSH port
// (and 53, DNS over TCP); with ABI ≥ 6 it cannot signal the controller.

// landlockABI is the kernel's Landlock ABI version, 0 when there is none
// (or seccomp refuses the call). The launcher, a child of this process
// under the same seccomp filter, sees the same.
func landlockABI() int {
	const sysLandlockCreateRuleset, versionFlag = 444, 1 // same on every architecture
	r, _, errno := syscall.Syscall(sysLandlockCreateRuleset, 0, 0, versionFlag)
	if errno != 0 {
		return 0
	}
	return int(r)
}

// initSandbox decides whether runs can be sandboxed: a Python
// ansible-playbook (the launcher runs it in-process), the collection's
// launcher, and Landlock in the kernel.
func (l *Local) initSandbox() {
	interp, err := interpreterOf(l.opts.AnsiblePlaybook, l.opts.Path)
	launcher := filepath.Join(l.opts.CollectionsPath, runnerScript)
	if err == nil {
		_, err = os.Stat(launcher)
	}
	if err != nil {
		l.launchErr = err
		l.sandboxErr = fmt.Errorf("the run sandbox needs the launcher: %w", err)
		return
	}
	l.interp, l.launcher = interp, launcher
	base := l.opts.RunDirBase
	if base == "" {
		base = defaultRunBase()
	}
	if real, err := filepath.EvalSymlinks(base); err == nil && (real == "/dev/shm" || strings.HasPrefix(real, "/dev/shm/")) {
		l.isolationErr = fmt.Errorf("run directories are in %s: the run sandbox grants /dev/shm to every run (semaphores), so a run can read another's directory — give them a tmpfs of their own (%s)", base, RunBaseOwn)
	}
	switch {
	case l.opts.noSandbox:
		l.sandboxErr = errors.New("the run sandbox is off (test)")
	case landlockABI() < 1:
		l.sandboxErr = errors.New("the run sandbox needs Landlock (Linux ≥ 5.13 with landlock in its lsm= list, and the landlock_* system calls allowed by the pod's seccomp profile), which this kernel does not offer")
	}
}

// sandboxed reports whether runs are sandboxed.
func (l *Local) sandboxed() bool { return l.sandboxErr == nil }

// checkSandbox refuses a run of kind k that needs the sandbox it cannot have.
func (l *Local) checkSandbox(k kind) error {
	if l.sandboxed() {
		if l.isolationErr != nil && l.opts.Sandbox == SandboxRequired {
			return fmt.Errorf("refusing to run (Sandbox: required): %w", l.isolationErr)
		}
		return nil
	}
	if l.opts.Sandbox == SandboxRequired {
		return fmt.Errorf("refusing to run unsandboxed (Sandbox: required): %w", l.sandboxErr)
	}
	if k == kindTasks && !l.opts.noSandbox {
		return fmt.Errorf("refusing inline tasks (API content) without the run sandbox: %w", l.sandboxErr)
	}
	return nil
}

// sandboxEnv is the launcher's policy (paths only, never a secret).
func (l *Local) sandboxEnv() []string {
	if !l.sandboxed() {
		return nil
	}
	read := []string{l.opts.CollectionsPath, filepath.Dir(l.opts.AnsiblePlaybook), filepath.Dir(l.interp[0])}
	// Landlock checks the resolved path: a checkout's collection roles/
	// symlink points outside CollectionsPath (FQCN roles without RolesPath).
	rolesLink := filepath.Join(l.opts.CollectionsPath, collectionRolesDir)
	if r, err := filepath.EvalSymlinks(rolesLink); err == nil && r != rolesLink {
		read = append(read, r)
	}
	read = append(append(read, l.opts.RolesPath...), l.opts.ExtraCollectionsPaths...)
	if l.opts.MitogenStrategyPath != "" {
		read = append(read, l.opts.MitogenStrategyPath)
	}
	return []string{"KPSSH_SANDBOX=1", "KPSSH_SANDBOX_READ=" + strings.Join(read, ":")}
}

// launchRequest is what the launcher reads on stdin: the argv of
// ansible-playbook and the TCP ports the run may connect to.
func launchRequest(args []string, conn Connection) ([]byte, error) {
	b, err := json.Marshal(struct {
		Argv []string `json:"argv"`
		TCP  []int    `json:"tcp"`
	}{args, []int{int(connPort(conn)), 53}})
	return append(b, '\n'), err
}

// startCold starts a run without a warm runner: through the launcher in
// --cold mode (it applies the sandbox, then runs ansible-playbook in
// process, the request on its stdin) when it can be used, else
// ansible-playbook itself (never for a kind that needs the sandbox:
// checkSandbox refused it).
func (l *Local) startCold(args []string, req []byte, dir *runDir, onEvent func(Event)) (*proc, error) {
	if l.launcher == "" {
		p := l.newProc(append([]string{l.opts.AnsiblePlaybook}, args...), dir)
		p.ew.setOnEvent(onEvent)
		return p, p.start()
	}
	argv := append(append([]string{}, l.interp...), l.launcher, "--cold")
	if l.opts.slowExit {
		argv = append(argv, "--slow-exit")
	}
	p := l.newProc(append(argv, l.opts.AnsiblePlaybook, dir.path), dir)
	p.ew.setOnEvent(onEvent)
	stdin, err := p.cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := p.start(); err != nil {
		return nil, err
	}
	p.stdin = stdin
	if err := p.handOff(req); err != nil {
		p.stop()
		return nil, err
	}
	return p, nil
}
