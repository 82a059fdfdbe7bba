package engine

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Which run directories the sweep takes: dead owners and reused pids, never
// a live owner's (this process's own included) or a name it cannot parse.
func TestSweepStaleOwners(t *testing.T) {
	self := strconv.Itoa(os.Getpid())
	start := selfStart()
	if start == "" {
		t.Fatal("cannot read this process's start time from /proc/self/stat")
	}
	one := procStart(1)
	if one == "" {
		t.Fatal("cannot read pid 1's start time")
	}
	cases := []struct {
		name  string
		owner string
		gone  bool
	}{
		{"dead pid", "999999999." + start, true},
		{"dead pid, no start time", "999999999", true},
		{"this process", self + "." + start, false},
		{"this pid, another start time: a predecessor's", self + ".1", true},
		{"this pid, no start time: a predecessor's", self, true},
		{"live pid 1", "1." + one, false},
		{"live pid 1, no start time: not ours to judge", "1", false},
		{"pid 1 reused (another start time)", "1." + one + "0", true},
		{"empty start", "1.", false},
		{"not a pid", "x.1", false},
	}
	base := t.TempDir()
	for _, tc := range cases {
		if got := ownerGone(tc.owner + "-abc"); got != tc.gone {
			t.Errorf("%s (%q): gone = %v, want %v", tc.name, tc.owner, got, tc.gone)
		}
		if err := os.Mkdir(filepath.Join(base, runDirPrefix+tc.owner+"-abc"), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	removed, err := SweepStale(base)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, tc := range cases {
		if tc.gone {
			want = append(want, filepath.Join(base, runDirPrefix+tc.owner+"-abc"))
		}
	}
	if strings.Join(sortedCopy(removed), "\n") != strings.Join(sortedCopy(want), "\n") {
		t.Fatalf("removed:\n%s\nwant:\n%s", strings.Join(removed, "\n"), strings.Join(want, "\n"))
	}
	d, err := newRunDir(base)
	if err != nil {
		t.Fatal(err)
	}
	if want := runDirPrefix + self + "." + start + "-"; !strings.HasPrefix(filepath.Base(d.path), want) {
		t.Fatalf("run directory %s: want the prefix %s", d.path, want)
	}
}

func sortedCopy(s []string) []string { c := slices.Clone(s); slices.Sort(c); return c }

// childEnv selects what TestRunDirChild does when this test binary is run
// as a child by the tests below.
const childEnv = "KPSSH_TEST_RUNDIR_CHILD"

// TestRunDirChild is the child process of the tests below, not a test of
// its own: without childEnv it does nothing.
//
//	make BASE:  a run directory with a secret under BASE, its path printed; then exit, leaving it
//	sweep BASE: SweepStale(BASE), what it removed printed as JSON
//	warm BASE:  an engine whose warm runner is ready, its directory printed; then it waits to be killed
//	run BASE:   an engine amid a run (a fake ansible-playbook), its pid and directory printed; then it waits to be killed
func TestRunDirChild(t *testing.T) {
	mode, base, ok := strings.Cut(os.Getenv(childEnv), " ")
	if !ok {
		return
	}
	out := func(k string, v any) {
		b, _ := json.Marshal(v)
		fmt.Printf("%s=%s\n", k, b)
	}
	out("pid", os.Getpid())
	switch mode {
	case "make":
		d, err := newRunDir(base)
		if err != nil {
			t.Fatal(err)
		}
		if err := d.write(fileKey, []byte("kpssh-canary-ssh-key-material")); err != nil {
			t.Fatal(err)
		}
		out("dir", d.path)
		_ = os.Stdout.Sync()
		// Gone without removing it, as a crash would (a pid 1 cannot
		// SIGKILL itself: init ignores signals from its own namespace).
		os.Exit(3)
	case "sweep":
		removed, err := SweepStale(base)
		if err != nil {
			t.Fatal(err)
		}
		out("removed", removed)
	case "warm":
		coll, err := FindCollectionsPath()
		if err != nil {
			t.Fatal(err)
		}
		e, err := New(Options{AnsiblePlaybook: playbookBin(t), CollectionsPath: coll, RunDirBase: base})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := e.waitWarm(ctx); err != nil {
			t.Fatal(err)
		}
		out("dir", e.warmDirs()[0])
		_ = os.Stdout.Sync()
		time.Sleep(10 * time.Minute) // killed by the parent
	case "run":
		runUntilKilled(t, base) // parentdeath_test.go
	default:
		t.Fatalf("%s=%q", childEnv, os.Getenv(childEnv))
	}
}

// startChild starts TestRunDirChild in mode in its own process group (3
// minutes at most; killed, group and all, when t ends) and returns it with
// its stdout.
func startChild(t *testing.T, mode, base string) (*exec.Cmd, io.Reader) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestRunDirChild$", "-test.count=1", "-test.timeout=3m")
	cmd.Env = append(os.Environ(), childEnv+"="+mode+" "+base)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); _ = cmd.Wait(); cancel() })
	return cmd, stdout
}

// runChild runs TestRunDirChild in mode (prefix: a command to run it under)
// and returns what it printed, key by key; the child has 3 minutes.
func runChild(t *testing.T, prefix []string, mode, base string) map[string]json.RawMessage {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	argv := append(append([]string{}, prefix...), os.Args[0], "-test.run=^TestRunDirChild$", "-test.count=1", "-test.timeout=2m")
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), childEnv+"="+mode+" "+base)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	// Bounded: a child gone wrong must not fill the test process's memory.
	out := &cappedBuffer{max: 1 << 20}
	cmd.Stdout, cmd.Stderr = out, out
	err := cmd.Run()
	if mode != "make" && err != nil {
		t.Fatalf("child %s: %v\n%s", mode, err, out.b.Bytes())
	}
	if out.over {
		t.Fatalf("child %s wrote more than %d bytes", mode, out.max)
	}
	return parseChild(out.b.String())
}

// cappedBuffer keeps the first max bytes written to it.
type cappedBuffer struct {
	b    bytes.Buffer
	max  int
	over bool
}

func (c *cappedBuffer) Write(p []byte) (int, error) {
	n := len(p)
	if room := c.max - c.b.Len(); room < n {
		c.over = true
		p = p[:max(room, 0)]
	}
	c.b.Write(p)
	return n, nil // the rest is dropped, not refused: the child is not blocked
}

func parseChild(out string) map[string]json.RawMessage {
	m := map[string]json.RawMessage{}
	for _, line := range strings.Split(out, "\n") {
		if k, v, ok := strings.Cut(line, "="); ok && json.Valid([]byte(v)) {
			m[k] = json.RawMessage(v)
		}
	}
	return m
}

// A controller killed mid-run and restarted in its pod has the same pid (1,
// the pod's init): its predecessor's run directory — SSH key, token, join
// secrets — must still count as stale. Both processes here are pid 1 of a
// new pid namespace, sharing the run base, the way two container starts in
// one pod share its tmpfs.
func TestSweepAfterRestartWithTheSamePid(t *testing.T) {
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Fatalf("unshare (util-linux) is needed: %v", err)
	}
	asPid1 := []string{unshare, "--pid", "--fork", "--mount-proc"}
	base := t.TempDir()
	made := runChild(t, asPid1, "make", base)
	var dir string
	if err := json.Unmarshal(made["dir"], &dir); err != nil || dir == "" {
		t.Fatalf("the first process made no run directory: %v", made)
	}
	if string(made["pid"]) != "1" {
		t.Fatalf("the first process was pid %s, want 1", made["pid"])
	}
	if _, err := os.Stat(filepath.Join(dir, fileKey)); err != nil {
		t.Fatalf("the killed process's run directory is not there to sweep: %v", err)
	}
	swept := runChild(t, asPid1, "sweep", base)
	if string(swept["pid"]) != "1" {
		t.Fatalf("the second process was pid %s, want 1", swept["pid"])
	}
	var removed []string
	_ = json.Unmarshal(swept["removed"], &removed)
	if len(removed) != 1 || removed[0] != dir {
		t.Fatalf("the restarted pid 1 swept %v, want [%s]", removed, dir)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s is still there (%v)", dir, err)
	}
}

// An idle warm runner outlives nothing: when the process that started it
// dies (SIGKILL, no Close), the runner removes its directory and exits.
func TestIdleWarmRunnerLeavesWithItsParent(t *testing.T) {
	if testing.Short() {
		t.Skip("runs ansible-playbook: skipped under -short")
	}
	base := t.TempDir()
	cmd, stdout := startChild(t, "warm", base)
	var dir string
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if v, ok := parseChild(sc.Text())["dir"]; ok {
			_ = json.Unmarshal(v, &dir)
			break
		}
	}
	if dir == "" {
		t.Fatal("the child printed no warm runner directory")
	}
	runner := warmProcess(dir)
	if runner == 0 {
		t.Fatalf("no runner process in %s", dir)
	}
	// The child alone (not its group: the runner has its own) dies.
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		_, err := os.Stat(dir)
		if errors.Is(err, os.ErrNotExist) && !pidAlive(runner) && len(processesMentioning(dir)) == 0 {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	_, err := os.Stat(dir)
	t.Fatalf("20 s after its parent died: directory %s: %v; runner %d alive: %v; processes: %v",
		dir, err, runner, pidAlive(runner), processesMentioning(dir))
}

// A controller that crashed mid-run leaves, besides its run directory, the
// run's ssh ControlPersist master: daemonized out of the run's process
// group, without a parent-death signal, it keeps its connection to the
// host (and the session of a module still running there) open long after
// the restarted controller swept the directory (seen in the e2e's
// CrashResumeRoles: masters of a SIGKILLed controller 110 s after the
// kill). The sweep stops the processes that name the directory it removes.
func TestSweepStaleStopsTheDeadRunsMaster(t *testing.T) {
	base := t.TempDir()
	dead := filepath.Join(base, runDirPrefix+"999999999."+selfStart()+"-abc")
	live := filepath.Join(base, runDirPrefix+runDirOwner()+"-abc")
	for _, d := range []string{dead, live} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	// Stand-ins for the masters, titled as ssh titles them.
	master := func(dir string, reap bool) *exec.Cmd {
		c := exec.Command("bash", "-c", `exec -a "ssh: $0/cm [mux]" sleep 300`, dir)
		c.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = c.Process.Kill()
			if reap {
				_ = c.Wait()
			}
		})
		return c
	}
	deadMaster, liveMaster := master(dead, false), master(live, true) // the dead one is reaped below
	for end := time.Now().Add(5 * time.Second); len(processesMentioning(dead+"/cm")) == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the stand-in master never showed its title")
		}
	}
	removed, err := SweepStale(base)
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != 1 || removed[0] != dead {
		t.Fatalf("removed %v, want [%s]", removed, dead)
	}
	exited := make(chan error, 1)
	go func() { exited <- deadMaster.Wait() }()
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		t.Fatalf("the dead run's master (pid %d) still runs after the sweep removed %s", deadMaster.Process.Pid, dead)
	}
	if err := liveMaster.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("the live run's master was stopped too: %v", err)
	}
}

// TestNamesPath: a run directory's processes are those naming it as a whole
// path; MkdirTemp's suffixes differ in length, so another run's directory
// may start with this one's name.
func TestNamesPath(t *testing.T) {
	const dir = "/dev/shm/kpssh/run-a-12"
	for _, c := range []struct {
		cl   string
		want bool
	}{
		{"ssh\x00-o\x00ControlPath=" + dir + "/cm\x00host", true},
		{"python3\x00" + dir, true},
		{"python3\x00" + dir + "\x00--cold", true},
		{"ssh\x00-oControlPath=" + dir + "345/cm", false},
		{"ssh\x00" + dir + "_x/cm", false},
		{"ssh\x00" + dir + "345/cm\x00" + dir + "/ansible.cfg", true},
		{"bash\x00-s", false},
		{"", false},
	} {
		if got := namesPath(c.cl, dir); got != c.want {
			t.Errorf("namesPath(%q) = %v, want %v", c.cl, got, c.want)
		}
	}
	// With its slash (SweepStale's form) the path is already whole.
	if !namesPath("ssh: "+dir+"/cm [mux]", dir+"/") || namesPath("ssh: "+dir+"345/cm [mux]", dir+"/") {
		t.Errorf("namesPath with a trailing slash: wrong")
	}
}
