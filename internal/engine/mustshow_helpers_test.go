package engine

import (
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Helpers shared by the must-show tests (outcomes, equivalence, canary,
// soak). The older hosts_test.go helpers (testEngine, checkRunGone,
// groupMembers, runProcesses, processesMentioning) are reused as they are.

// procStat is the part of /proc/<pid>/stat the tests look at.
type procStat struct {
	pid, ppid, pgrp int
	state           byte
}

func readProcStat(pid int) (procStat, bool) {
	st, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, false
	}
	s := string(st)
	i := strings.LastIndexByte(s, ')') // comm may hold spaces and ')'
	if i < 0 {
		return procStat{}, false
	}
	f := strings.Fields(s[i+1:]) // state ppid pgrp …
	if len(f) < 3 || len(f[0]) != 1 {
		return procStat{}, false
	}
	ppid, _ := strconv.Atoi(f[1])
	pgrp, _ := strconv.Atoi(f[2])
	return procStat{pid: pid, ppid: ppid, pgrp: pgrp, state: f[0][0]}, true
}

func allPids() []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			out = append(out, pid)
		}
	}
	return out
}

// zombieChildren lists children of the test process in state Z: a child
// the engine started and never reaped.
func zombieChildren() []int {
	self := os.Getpid()
	var out []int
	for _, pid := range allPids() {
		if st, ok := readProcStat(pid); ok && st.ppid == self && st.state == 'Z' {
			out = append(out, pid)
		}
	}
	return out
}

// assertNoZombieChildren fails t if the test process has a zombie child.
// Reaping is synchronous in the engine (cmd.Wait before Run returns), so
// there is no grace period.
func assertNoZombieChildren(t *testing.T) {
	t.Helper()
	if z := zombieChildren(); len(z) > 0 {
		t.Errorf("zombie children of the test process: %s", describe(z))
	}
}

// waitGroupEmpty waits (bounded) until process group pgid has no member,
// zombies included: orphans of a killed run are reaped by init.
func waitGroupEmpty(t *testing.T, pgid int, within time.Duration) {
	t.Helper()
	end := time.Now().Add(within)
	for {
		m := groupMembers(pgid)
		if len(m) == 0 {
			return
		}
		if time.Now().After(end) {
			t.Errorf("process group %d not empty after %s: %s", pgid, within, describe(m))
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// runTag is what every run directory (and so every run tag, ssh ControlPath
// and mux master title) of this test process contains.
func runTag() string { return runDirPrefix + runDirOwner() + "-" }

// dirNames lists the entries of dir ("" entries when it is empty).
func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("read %s: %v", dir, err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// runBase creates a private RunDirBase on tmpfs (short path: the ssh
// ControlPath must fit into sun_path) so a test can assert that nothing is
// left in the run directories' parent.
func runBase(t *testing.T, name string) string {
	t.Helper()
	base := "/dev/shm"
	if fi, err := os.Stat(base); err != nil || !fi.IsDir() {
		base = os.TempDir()
	}
	d, err := os.MkdirTemp(base, "eng-"+name+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(d) })
	return d
}

// countingProxy is a loopback TCP forwarder to a host's sshd that counts
// the connections it accepted: a run that must not reach the host (config
// errors) is shown to open no connection at all, and the count of a run
// that does reach it proves the counter works.
type countingProxy struct {
	ln     net.Listener
	target string
	n      atomic.Int64
	mu     sync.Mutex
	conns  map[net.Conn]bool
	wg     sync.WaitGroup
}

func newCountingProxy(t *testing.T, target string) *countingProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &countingProxy{ln: ln, target: target, conns: map[net.Conn]bool{}}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(p.close)
	return p
}

func (p *countingProxy) port() int32 { return int32(p.ln.Addr().(*net.TCPAddr).Port) }

func (p *countingProxy) count() int64 { return p.n.Load() }

func (p *countingProxy) track(c net.Conn, add bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if add {
		if p.conns == nil {
			return false // closed
		}
		p.conns[c] = true
	} else if p.conns != nil {
		delete(p.conns, c)
	}
	return true
}

func (p *countingProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.n.Add(1)
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer c.Close()
			u, err := net.DialTimeout("tcp", p.target, 10*time.Second)
			if err != nil {
				return
			}
			defer u.Close()
			if !p.track(c, true) || !p.track(u, true) {
				return
			}
			defer p.track(c, false)
			defer p.track(u, false)
			done := make(chan struct{}, 2)
			pipe := func(dst, src net.Conn) {
				_, _ = io.Copy(dst, src)
				if tc, ok := dst.(*net.TCPConn); ok {
					_ = tc.CloseWrite()
				}
				done <- struct{}{}
			}
			go pipe(u, c)
			go pipe(c, u)
			<-done
			<-done
		}()
	}
}

func (p *countingProxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}

// scanFilesFor reports regular files under the bases, modified since
// `since`, holding any of needles.
func scanFilesFor(since time.Time, needles []string, bases ...string) []string {
	var hits []string
	for _, base := range bases {
		_ = filepath.WalkDir(base, func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return nil
			}
			fi, err := d.Info()
			if err != nil || !fi.Mode().IsRegular() || fi.ModTime().Before(since) || fi.Size() > 8<<20 {
				return nil
			}
			data, err := os.ReadFile(p)
			if err != nil {
				return nil
			}
			for _, n := range needles {
				if strings.Contains(string(data), n) {
					hits = append(hits, p+" holds "+n)
				}
			}
			return nil
		})
	}
	return hits
}

// gone reports whether path does not exist.
func gone(path string) bool {
	_, err := os.Lstat(path)
	return errors.Is(err, os.ErrNotExist)
}

// idleWarmRunner reports whether dir is the directory of an idle pre-warmed
// runner (warm.go): a live kpssh_runner.py process carries it, and it holds
// nothing but the runner's ansible.cfg, scratch directories and the module
// payloads it builds ahead — no key, no inventory, no secrets.
func idleWarmRunner(dir string) bool {
	runner := false
	for _, p := range processesMentioning(dir) {
		if cl, err := os.ReadFile("/proc/" + strconv.Itoa(p) + "/cmdline"); err == nil && isWarmRunnerCmdline(cl) {
			runner = true
		}
	}
	if !runner {
		return false
	}
	clean := true
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		// its ansible.cfg, and the module payloads it builds ahead (module
		// code, in ansible's payload cache: no run's data)
		if !d.IsDir() && p != filepath.Join(dir, fileConfig) && filepath.Base(filepath.Dir(p)) != "ansiballz_cache" {
			clean = false
		}
		return nil
	})
	return clean
}

// leftInBase lists the entries of a RunDirBase that are not idle warm
// runners' directories: what runs left behind. A warm runner being started
// right now has its directory (with its ansible.cfg) before any process of
// it mentions the directory — longer when the interpreter is the runner
// image's, behind sh and bwrap — so an entry counts only if it is still not
// one after 3 s; what a run left behind does not change.
func leftInBase(t *testing.T, base string) []string {
	t.Helper()
	var out []string
	for end := time.Now().Add(3 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		out = out[:0]
		for _, n := range dirNames(t, base) {
			if !idleWarmRunner(filepath.Join(base, n)) {
				out = append(out, n)
			}
		}
		if len(out) == 0 || time.Now().After(end) {
			return out
		}
	}
}

// closeAndCheckEmpty closes the engines (stopping idle warm runners) and
// asserts that nothing of them is left: an empty RunDirBase, no process
// carrying a run directory of this test process, no zombie child.
func closeAndCheckEmpty(t *testing.T, base string, engines ...*Local) {
	t.Helper()
	for _, e := range engines {
		if err := e.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}
	if names := dirNames(t, base); len(names) > 0 {
		t.Errorf("after Close, left in the run directories' parent %s: %v", base, names)
	}
	var left []int
	for end := time.Now().Add(5 * time.Second); ; {
		left = append(processesMentioning(runTag()), processesMentioning(base)...)
		if len(left) == 0 || time.Now().After(end) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(left) > 0 {
		t.Errorf("after Close, processes carry a run directory: %s", describe(left))
	}
	assertNoZombieChildren(t)
}
