package engine

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/dklesev/kpssh/internal/sshx"
)

// The pre-warmed runner (docs/engine.md, "Performance"): most of a phase's
// fixed cost is Python importing ansible and loading plugins, which does not
// depend on the run. The engine therefore starts the *next* run's process
// ahead of time — in the next run's private directory, process group and
// minimal environment — running the collection's runner/kpssh_runner.py,
// which does that work and then blocks on stdin. A run writes its files into
// that directory, sends the argv (paths only) on stdin and treats the
// process exactly like a freshly started ansible-playbook.

// runnerScript is the launcher inside the collection.
const runnerScript = "ansible_collections/dklesev/kpssh/runner/kpssh_runner.py"

// DefaultWarmRunners is the pool size when Options.WarmRunners is 0.
const DefaultWarmRunners = 1

// maxWarmRunners bounds Options.WarmRunners (each is an idle Python process:
// ~57 MB RSS, ~45 MB of it private).
const maxWarmRunners = 8

// warmRetry is how long the engine waits before starting another warm runner
// after one failed to warm up (a broken launcher must not loop).
const warmRetry = time.Minute

// proc is one ansible-playbook process of a run: started cold, or taken from
// the warm pool.
type proc struct {
	cmd     *exec.Cmd
	dir     *runDir
	ew      *eventWriter
	errTail *sshx.TailBuffer
	exited  chan struct{} // closed when the process has exited (not reaped)

	stopOnce sync.Once

	// warm only
	stdin   io.WriteCloser
	cfg     []byte        // the ansible.cfg written at spawn
	ready   chan struct{} // closed once the launcher reported (or failed)
	readyOK bool          // valid after ready is closed
	failed  chan struct{} // closed once a failed warm-up is recorded
}

// warmPool holds the idle pre-warmed processes of a Local.
type warmPool struct {
	mu       sync.Mutex
	idle     []*proc
	closed   bool
	retryAt  time.Time // no new runner before (one failed to start)
	lastErr  error
	interp   []string // interpreter (+ its shebang argument) of AnsiblePlaybook
	launcher string
}

// interpreterOf returns the Python interpreter (and its optional argument)
// from an ansible-playbook entry script's shebang line, or an error when the
// file is not a Python script the launcher can stand in for.
func interpreterOf(path, searchPath string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	line, err := bufio.NewReaderSize(io.LimitReader(f, 512), 512).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	if !strings.HasPrefix(line, "#!") {
		return nil, fmt.Errorf("%s has no #! line", path)
	}
	fields := strings.Fields(strings.TrimSpace(line[2:]))
	if len(fields) == 0 {
		return nil, fmt.Errorf("%s: empty #! line", path)
	}
	// "#!/usr/bin/env python3": resolve the interpreter in the child's PATH.
	if filepath.Base(fields[0]) == "env" && len(fields) == 2 && !strings.HasPrefix(fields[1], "-") {
		p, err := lookPathIn(fields[1], searchPath)
		if err != nil {
			return nil, err
		}
		fields = []string{p}
	}
	if !filepath.IsAbs(fields[0]) || !strings.HasPrefix(filepath.Base(fields[0]), "python") {
		return nil, fmt.Errorf("%s is not run by a Python interpreter (#!%s)", path, strings.Join(fields, " "))
	}
	if len(fields) > 2 {
		// Linux passes everything after the interpreter as one argument.
		fields = []string{fields[0], strings.Join(fields[1:], " ")}
	}
	return fields, nil
}

func lookPathIn(name, searchPath string) (string, error) {
	for _, d := range filepath.SplitList(searchPath) {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found in %s", name, searchPath)
}

// initWarm decides whether this engine keeps warm runners.
func (l *Local) initWarm() {
	if l.opts.NoWarmRunner {
		return
	}
	if l.launchErr != nil {
		// Not an error of the engine: runs start ansible-playbook cold
		// (and unsandboxed: initSandbox).
		l.warmOff = fmt.Errorf("warm runner off: %w", l.launchErr)
		return
	}
	l.warm = &warmPool{interp: l.interp, launcher: l.launcher}
}

// warmSize is the configured pool size.
func (l *Local) warmSize() int {
	n := l.opts.WarmRunners
	if n <= 0 {
		n = DefaultWarmRunners
	}
	if n > maxWarmRunners {
		n = maxWarmRunners
	}
	return n
}

// Prewarm starts the warm runners now instead of after the first run (a
// controller calls it at start-up so that its first phase is warm too). It
// returns at once; it is a no-op when warm runners are off.
func (l *Local) Prewarm() { l.refill() }

// refill starts warm runners until the pool is full. Starting one takes a
// few milliseconds (a directory, a file, fork+exec); the Python warm-up then
// runs in the child. Synchronous on purpose: once Run returns, the next
// run's directory exists and warmDirs lists it.
func (l *Local) refill() {
	p := l.warm
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for !p.closed && !time.Now().Before(p.retryAt) && len(p.idle) < l.warmSize() {
		w, err := l.spawnWarm()
		if err != nil {
			p.lastErr, p.retryAt = err, time.Now().Add(warmRetry)
			return
		}
		p.idle = append(p.idle, w)
		go l.watchReady(w)
	}
}

// watchReady records a runner that failed to warm up: it is reaped and
// dropped from the pool (a run that took it meanwhile starts cold), and no
// new runner is started for warmRetry.
func (l *Local) watchReady(w *proc) {
	<-w.ready
	if w.readyOK {
		return
	}
	w.stop() // reaped: stderr is complete
	p := l.warm
	p.mu.Lock()
	p.lastErr = fmt.Errorf("warm runner failed to start: %s", strings.TrimSpace(w.errTail.String()))
	p.retryAt = time.Now().Add(warmRetry)
	idle := false
	for i, x := range p.idle {
		if x == w {
			p.idle = append(p.idle[:i], p.idle[i+1:]...)
			idle = true
			break
		}
	}
	p.mu.Unlock()
	if idle {
		_ = w.dir.remove() // a run that took it owns its directory
	}
	close(w.failed)
}

// takeWarm returns an idle warm runner that is still alive, or nil.
func (l *Local) takeWarm() *proc {
	p := l.warm
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for len(p.idle) > 0 {
		w := p.idle[0]
		p.idle = p.idle[1:]
		select {
		case <-w.exited:
			go w.discard() // died while idle (killed, failed to warm up)
			continue
		default:
		}
		return w
	}
	return nil
}

// spawnWarm creates the next run directory with its ansible.cfg and starts
// the launcher in it.
func (l *Local) spawnWarm() (*proc, error) {
	dir, err := newRunDir(l.opts.RunDirBase)
	if err != nil {
		return nil, err
	}
	cfg := []byte(ansibleConfig(l.renderConfig(dir.path, 0)))
	if err := dir.write(fileConfig, cfg); err != nil {
		_ = dir.remove()
		return nil, err
	}
	readyR, readyW, err := os.Pipe()
	if err != nil {
		_ = dir.remove()
		return nil, err
	}
	args := append(append([]string{}, l.warm.interp...), l.warm.launcher)
	if l.opts.slowExit {
		args = append(args, "--slow-exit")
	}
	if l.opts.noPrebuild {
		args = append(args, "--no-prebuild")
	}
	args = append(args, l.opts.AnsiblePlaybook, dir.path)
	w := l.newProc(args, dir)
	// SIGTERM, not SIGKILL, when the controller dies: an idle runner removes
	// its directory and exits (kpssh_runner.py); it is SIGKILL again once
	// the runner has its run.
	w.cmd.SysProcAttr.Pdeathsig = syscall.SIGTERM
	w.cfg, w.ready, w.failed = cfg, make(chan struct{}), make(chan struct{})
	w.cmd.ExtraFiles = []*os.File{readyW} // fd 3
	if w.stdin, err = w.cmd.StdinPipe(); err != nil {
		readyR.Close()
		readyW.Close()
		_ = dir.remove()
		return nil, err
	}
	err = w.start()
	readyW.Close()
	if err != nil {
		readyR.Close()
		_ = dir.remove()
		return nil, fmt.Errorf("start warm runner: %w", err)
	}
	go func() {
		var b [1]byte
		n, _ := readyR.Read(b[:])
		readyR.Close()
		w.readyOK = n == 1 && b[0] == 'R'
		close(w.ready)
	}()
	return w, nil
}

// handOff gives a warm runner its run: the launch request (launchRequest).
func (w *proc) handOff(req []byte) error {
	_, err := w.stdin.Write(req)
	if cerr := w.stdin.Close(); err == nil {
		err = cerr
	}
	return err
}

// stop kills the process's group and reaps the process, once: after the
// reap the group id may be reused, so nothing may signal it again.
func (w *proc) stop() {
	w.stopOnce.Do(func() {
		pid := w.cmd.Process.Pid
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		<-w.exited
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		_ = w.cmd.Wait()
	})
}

// discard stops an unused warm runner and removes its directory.
func (w *proc) discard() {
	w.stop()
	_ = w.dir.remove()
}

// waitWarm (tests, benchmarks) starts a warm runner if none is idle and
// waits until one is ready.
func (l *Local) waitWarm(ctx context.Context) error {
	p := l.warm
	if p == nil {
		return l.warmOff
	}
	l.refill()
	p.mu.Lock()
	var w *proc
	if len(p.idle) > 0 {
		w = p.idle[0]
	}
	closed, lastErr := p.closed, p.lastErr
	p.mu.Unlock()
	switch {
	case closed:
		return errors.New("engine closed")
	case w == nil:
		return lastErr
	}
	select {
	case <-w.ready:
	case <-ctx.Done():
		return ctx.Err()
	}
	if w.readyOK {
		return nil
	}
	select {
	case <-w.failed:
	case <-ctx.Done():
		return ctx.Err()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lastErr
}

// Close stops the idle warm runners and removes their directories. Runs in
// progress are not affected; runs after Close start ansible-playbook cold.
func (l *Local) Close() error {
	p := l.warm
	if p == nil {
		return nil
	}
	p.mu.Lock()
	p.closed = true
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	for _, w := range idle {
		w.discard()
	}
	return nil
}

// warmDirs (tests) lists the directories of the idle warm runners.
func (l *Local) warmDirs() []string {
	p := l.warm
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, w := range p.idle {
		out = append(out, w.dir.path)
	}
	return out
}

// newProc builds a run's process: argv, cwd = the run directory, the
// minimal environment, its own process group, SIGKILL when the starting
// thread dies, stdout parsed as the event stream, stderr's tail kept.
func (l *Local) newProc(args []string, dir *runDir) *proc {
	p := &proc{dir: dir, ew: &eventWriter{}, errTail: &sshx.TailBuffer{Max: stderrTail}, exited: make(chan struct{})}
	cmd := &exec.Cmd{Path: args[0], Args: args, Dir: dir.path, Env: l.childEnv(dir)}
	cmd.Stdout, cmd.Stderr = p.ew, p.errTail
	// Own process group (the whole run is signalled at once); SIGKILL if
	// the thread that started it dies (the controller crashed).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	// Output pipes held open by a stray grandchild must not block Wait.
	cmd.WaitDelay = 2 * time.Second
	p.cmd = cmd
	return p
}

// start starts the process and the watcher that closes exited once it has
// exited, leaving it unreaped (its pid, the group id, stays reserved until
// cmd.Wait).
func (p *proc) start() error {
	if err := startLocked(p.cmd); err != nil {
		return err
	}
	pid := p.cmd.Process.Pid
	go func() { waitExitedNoReap(pid); close(p.exited) }()
	return nil
}

// startLocked starts cmd on a locked OS thread: Pdeathsig is tied to the
// starting thread.
func startLocked(cmd *exec.Cmd) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return cmd.Start()
}

// sameConfig reports whether a warm runner was started with the ansible.cfg
// this run renders.
func (w *proc) sameConfig(cfg []byte) bool { return bytes.Equal(w.cfg, cfg) }
