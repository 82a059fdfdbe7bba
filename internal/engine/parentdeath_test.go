package engine

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
)

// fakePlaybook is an "ansible-playbook" for the launcher (run in-process
// like the real one) that leaves what a real run has while a task runs: a
// worker in the run's process group (ansible's forked workers and their ssh
// clients) and a daemon in a session of its own whose command line names the
// run directory (the ssh ControlPersist master, "ssh: RUN_DIR/cm [mux]").
// Then it writes "started" into the run directory and waits.
const fakePlaybook = `import os, subprocess, sys, time
d = os.getcwd()
subprocess.Popen(['sleep', '600'])
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(600)', d + '/cm'])
    os._exit(0)
open(os.path.join(d, 'started'), 'w').close()
time.sleep(600)
`

// runUntilKilled is TestRunDirChild's "run" mode: an engine whose
// ansible-playbook is fakePlaybook starts a run; once the fake has started
// its processes, the run's pid and directory are printed and the child waits
// to be killed.
func runUntilKilled(t *testing.T, base string) {
	coll, err := FindCollectionsPath()
	if err != nil {
		t.Fatal(err)
	}
	interp, err := interpreterOf(playbookBin(t), "")
	if err != nil {
		t.Fatal(err)
	}
	fake := filepath.Join(base, "ansible-playbook")
	if err := os.WriteFile(fake, []byte("#!"+strings.Join(interp, " ")+"\n"+fakePlaybook), 0o755); err != nil {
		t.Fatal(err)
	}
	runs := filepath.Join(base, "runs")
	if err := os.Mkdir(runs, 0o700); err != nil {
		t.Fatal(err)
	}
	started := make(chan [2]string, 1)
	// Cold (the launcher in --cold mode): no warm-up to wait for; a warm
	// runner arms the same parent-death handling at its hand-off (the e2e
	// HA scenario kills one).
	e, err := New(Options{AnsiblePlaybook: fake, CollectionsPath: coll, RunDirBase: runs, NoWarmRunner: true,
		onStart: func(pid int, dir string) { started <- [2]string{fmt.Sprint(pid), dir} }})
	if err != nil {
		t.Fatal(err)
	}
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	block, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	signer, _ := ssh.NewSignerFromKey(priv)
	conn := Connection{Address: "192.0.2.1", PrivateKey: pem.EncodeToMemory(block), HostKey: strings.TrimSpace(string(ssh.MarshalAuthorizedKey(signer.PublicKey())))}
	done := make(chan Result, 1)
	go func() {
		done <- e.Run(context.Background(), Request{Phase: PhaseJoin, Conn: conn, Source: Source{Script: "true\n"}, Timeout: 5 * time.Minute})
	}()
	var s [2]string
	select {
	case s = <-started:
	case r := <-done:
		t.Fatalf("the run ended before it started: %+v", r)
	}
	for end := time.Now().Add(90 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(filepath.Join(s[1], "started")); err == nil {
			break
		}
		if time.Now().After(end) {
			t.Fatal("the fake ansible-playbook did not start")
		}
	}
	fmt.Printf("runpid=%s\nrundir=%q\n", s[0], s[1])
	_ = os.Stdout.Sync()
	time.Sleep(10 * time.Minute) // killed by the parent
}

// A controller killed mid-run (SIGKILL of its process alone: the OOM
// killer, a leader's replica killed outside a pod) takes the run with it:
// nothing of the run's process group (ansible's workers, their ssh clients)
// and no process naming its directory (the ssh ControlPersist master) is
// left, and the directory holds no secret any more.
func TestRunEndsWithItsEngine(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the launcher with the runner image's Python: skipped under -short")
	}
	base := t.TempDir()
	cmd, stdout := startChild(t, "run", base)
	var pid int
	var dir string
	sc := bufio.NewScanner(stdout)
	for (pid == 0 || dir == "") && sc.Scan() {
		m := parseChild(sc.Text())
		if v, ok := m["runpid"]; ok {
			_ = json.Unmarshal(v, &pid)
		}
		if v, ok := m["rundir"]; ok {
			_ = json.Unmarshal(v, &dir)
		}
	}
	if pid == 0 || dir == "" {
		t.Fatal("the child printed no run")
	}
	for end := time.Now().Add(10 * time.Second); len(groupMembers(pid)) < 2 || len(processesMentioning(dir+"/cm")) != 1; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) { // the daemon execs after "started"
			t.Fatalf("the run has not started its processes: group %s, daemon %v", describe(groupMembers(pid)), processesMentioning(dir+"/cm"))
		}
	}
	// The child alone (not its group: the run has its own) dies.
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	live := func() []int {
		var out []int
		for _, p := range append(groupMembers(pid), processesMentioning(dir)...) {
			if !isZombie(p) {
				out = append(out, p)
			}
		}
		return out
	}
	deadline := time.Now().Add(20 * time.Second)
	for len(live()) > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if l := live(); len(l) > 0 {
		t.Errorf("20 s after the engine died, the run's processes live on: %s", describe(l))
		for _, p := range l {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
	}
	for _, f := range []string{fileKey} {
		if _, err := os.Stat(filepath.Join(dir, f)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the dead run's %s is still in %s (%v)", f, dir, err)
		}
	}
}
