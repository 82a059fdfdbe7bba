package engine

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func boolp(b bool) *bool { return &b }

func TestInterpreterOf(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	py := filepath.Join(bin, "python3")
	if err := os.WriteFile(py, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, script string
		want         []string // nil: error
	}{
		{"debian", "#! /usr/bin/python3\n# -*- coding: utf-8 -*-\nimport re\n", []string{"/usr/bin/python3"}},
		{"pip venv", "#!/opt/venv/bin/python3.11\nimport sys\n", []string{"/opt/venv/bin/python3.11"}},
		{"with flag", "#!/usr/bin/python3 -E\n", []string{"/usr/bin/python3", "-E"}},
		{"flags as one argument", "#!/usr/bin/python3 -E -s\n", []string{"/usr/bin/python3", "-E -s"}},
		{"env", "#!/usr/bin/env python3\n", []string{py}},
		{"env not found", "#!/usr/bin/env python9\n", nil},
		{"env with flags", "#!/usr/bin/env -S python3 -E\n", nil},
		{"shell wrapper", "#!/bin/sh\nexec python3 -m ansible playbook \"$@\"\n", nil},
		{"relative", "#!python3\n", nil},
		{"no shebang", "import sys\n", nil},
		{"empty shebang", "#!\n", nil},
		{"empty file", "", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "_"))
			if err := os.WriteFile(f, []byte(tc.script), 0o755); err != nil {
				t.Fatal(err)
			}
			got, err := interpreterOf(f, bin+":/nonexistent")
			if tc.want == nil {
				if err == nil {
					t.Fatalf("accepted: %v", got)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %v, %v; want %v", got, err, tc.want)
			}
		})
	}
	if _, err := interpreterOf(filepath.Join(dir, "missing"), bin); err == nil {
		t.Fatal("missing file accepted")
	}
}

// The connect check inside the script task: result_file decides Touched and
// the failed step is reported as the connect task it replaces.
func TestDecideConnectInTask(t *testing.T) {
	red := NewRedactor("S3CRET-VALUE-1")
	script := func(ev string) *Event {
		return &Event{Event: ev, Task: "kpssh: join script", Internal: internalScript, Censored: true, Msg: "the output has been hidden"}
	}
	cases := []struct {
		name    string
		f       facts
		outcome Outcome
		touched bool
		task    string
		rc      int
		msg     string
	}{
		{"refused", facts{exitCode: 4, connectInTask: true, sum: Summary{Started: true, Reached: true, LastTask: "kpssh: join script", LastTaskInternal: internalScript, Unreachable: script("unreachable")},
			script: &scriptResult{RC: intp(255), Connected: boolp(false), ConnectionError: "Failed to connect to the host via ssh: Connection refused"}},
			Failed, false, connectTaskName, 0, "host unreachable; nothing ran: Failed to connect to the host via ssh: Connection refused"},
		{"host key mismatch", facts{exitCode: 4, connectInTask: true, sum: Summary{Started: true, Reached: true, Unreachable: script("unreachable")},
			script: &scriptResult{RC: intp(255), Connected: boolp(false), ConnectionError: "Host key verification failed."}},
			Failed, false, connectTaskName, 0, "host key mismatch"},
		{"connect check fails on the host", facts{exitCode: 2, connectInTask: true, sum: Summary{Started: true, Reached: true, Failed: script("failed")},
			script: &scriptResult{RC: intp(1), Connected: boolp(true), ConnectRC: intp(1), Stderr: "broken login shell S3CRET-VALUE-1"}},
			Failed, true, connectTaskName, 1, "connect check failed on the host (rc=1): stderr: broken login shell ***"},
		{"script fails", facts{exitCode: 2, connectInTask: true, sum: Summary{Started: true, Reached: true, Failed: script("failed")},
			script: &scriptResult{RC: intp(3), Connected: boolp(true), Stderr: "fatal"}},
			Failed, true, "kpssh: join script", 3, "(rc=3): stderr: fatal"},
		{"link lost mid-script", facts{exitCode: 4, connectInTask: true, sum: Summary{Started: true, Reached: true, Unreachable: script("unreachable")},
			script: &scriptResult{RC: intp(255), Connected: boolp(true), ConnectionError: "Data could not be sent"}},
			Failed, true, "kpssh: join script", 255, "ssh exited 255"},
		{"timeout while the script runs", facts{interrupted: "timeout", timeout: time.Minute, exitCode: -1, connectInTask: true, sum: Summary{Started: true, LastTask: "kpssh: join script", LastTaskInternal: internalScript},
			script: &scriptResult{Connected: boolp(true)}},
			TimedOut, true, "kpssh: join script", 0, `during task "kpssh: join script"`},
		{"timeout while connecting", facts{interrupted: "timeout", timeout: time.Minute, exitCode: -1, connectInTask: true, sum: Summary{Started: true, LastTask: "kpssh: join script", LastTaskInternal: internalScript}},
			TimedOut, false, connectTaskName, 0, `during task "kpssh: connect"`},
		{"canceled before the play", facts{interrupted: "canceled", exitCode: -1, connectInTask: true, sum: Summary{Started: true}},
			TimedOut, false, "", 0, "interrupted"},
		{"success", facts{exitCode: 0, connectInTask: true, sum: Summary{Started: true, Reached: true, Stats: &Stats{OK: 1}}, script: &scriptResult{RC: intp(0), Connected: boolp(true)}},
			Succeeded, true, "", 0, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := decide(tc.f, red)
			if r.Outcome != tc.outcome || r.Touched != tc.touched || r.FailedTask != tc.task || r.RC != tc.rc {
				t.Fatalf("got %+v", r)
			}
			if !strings.Contains(r.Message, tc.msg) {
				t.Fatalf("message %q lacks %q", r.Message, tc.msg)
			}
			if strings.Contains(r.Message, "S3CRET-VALUE-1") {
				t.Fatalf("secret in message %q", r.Message)
			}
		})
	}
}

// warmProcess returns the pid of the idle warm runner in dir (or 0): not
// its cleanup helper (kpssh_runner.py's fork, the same command line, a
// child of the runner).
func warmProcess(dir string) int {
	pids := processesMentioning(dir)
	for _, p := range pids {
		cl, _ := os.ReadFile("/proc/" + strconv.Itoa(p) + "/cmdline")
		if st, ok := readProcStat(p); isWarmRunnerCmdline(cl) && !(ok && slices.Contains(pids, st.ppid)) {
			return p
		}
	}
	return 0
}

// isWarmRunnerCmdline reports whether a /proc cmdline is a warm runner's:
// the launcher, not in --cold mode (cold runs go through it too).
func isWarmRunnerCmdline(cl []byte) bool {
	s := string(cl)
	return strings.Contains(s, "kpssh_runner.py") && !strings.Contains(s, "\x00--cold\x00")
}

// waitPrebuilt waits until the idle runner in dir has built every PREBUILD
// payload (or d passes) and returns the payload files; any other file but
// the configuration fails the test.
func waitPrebuilt(t testing.TB, dir string, d time.Duration) []string {
	t.Helper()
	var payloads []string
	for end := time.Now().Add(d); ; time.Sleep(200 * time.Millisecond) {
		payloads = payloads[:0]
		_ = filepath.WalkDir(dir, func(p string, e os.DirEntry, err error) error {
			switch {
			case err != nil || e.IsDir() || p == filepath.Join(dir, fileConfig):
			case filepath.Base(filepath.Dir(p)) == "ansiballz_cache" && !strings.HasSuffix(p, ".lock"):
				payloads = append(payloads, filepath.Base(p))
			case filepath.Base(filepath.Dir(p)) == "ansiballz_cache": // the build's lock file
			default:
				t.Errorf("idle warm run directory holds %s", p)
			}
			return nil
		})
		if len(payloads) >= len(prebuildList(t)) || time.Now().After(end) {
			return payloads
		}
	}
}

// prebuildList is PREBUILD of runner/kpssh_runner.py.
func prebuildList(t testing.TB) []string {
	t.Helper()
	coll, err := FindCollectionsPath()
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile(filepath.Join(coll, runnerScript))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?s)\nPREBUILD = \((.*?)\)`).FindSubmatch(src)
	if m == nil {
		t.Fatal("no PREBUILD tuple in the runner")
	}
	var names []string
	for _, q := range regexp.MustCompile(`'([a-z0-9_.]+)'`).FindAllSubmatch(m[1], -1) {
		names = append(names, string(q[1]))
	}
	return names
}

// The idle runner builds ahead exactly the modules the shipped roles run on
// hosts (FQCN keys of their tasks; controller-side actions left out, the
// actions that run other modules mapped to them), so a role edit that adds
// a module cannot leave it out unnoticed.
func TestPrebuiltModules(t *testing.T) {
	coll, err := FindCollectionsPath()
	if err != nil {
		t.Fatal(err)
	}
	controllerOnly := []string{"assert", "debug", "fail", "import_role", "import_tasks", "include_role", "include_tasks", "meta", "set_fact", "validate_argument_spec"}
	runs := map[string][]string{"systemd": {"systemd_service"}, "shell": {"command"}, "template": {"stat", "copy", "file"}}
	key := regexp.MustCompile(`(?m)^\s*(?:- )?(ansible\.builtin|dklesev\.kpssh)\.([a-z_]+):`)
	want := map[string]bool{}
	files, _ := filepath.Glob(filepath.Join(coll, collectionRolesDir, "*", "*", "*.yml"))
	for _, f := range files {
		if d := filepath.Base(filepath.Dir(f)); d != "tasks" && d != "handlers" {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range key.FindAllStringSubmatch(string(b), -1) {
			if slices.Contains(controllerOnly, m[2]) {
				continue
			}
			mods := runs[m[2]]
			if mods == nil {
				mods = []string{m[2]}
			}
			for _, mod := range mods {
				want[m[1]+"."+mod] = true
			}
		}
	}
	if len(files) < 10 || !want["dklesev.kpssh.files"] {
		t.Fatalf("scanned %d files, found %v: the scan is broken", len(files), want)
	}
	got := prebuildList(t)
	for _, m := range got {
		if !want[m] {
			t.Errorf("PREBUILD has %s, which no shipped role runs", m)
		}
		delete(want, m)
	}
	for m := range want {
		t.Errorf("a shipped role runs %s: add it to PREBUILD", m)
	}
}

// pidLog records the pids of the runs' processes in start order.
type pidLog struct {
	mu   sync.Mutex
	pids []int
}

// hook chains the recording onto o.onStart.
func (p *pidLog) hook(o *Options) {
	prev := o.onStart
	o.onStart = func(pid int, dir string) {
		prev(pid, dir)
		p.mu.Lock()
		p.pids = append(p.pids, pid)
		p.mu.Unlock()
	}
}

func (p *pidLog) list() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.pids)
}

func pidAlive(pid int) bool { return syscall.Kill(pid, 0) == nil && !isZombie(pid) }

// The pre-warmed runner against a real host: the next run's directory and
// process exist between runs (0700, only the ansible.cfg), the next run is
// handed to that very process and keeps every property of a cold run (its
// group is emptied, its directory removed, a timeout stops the script on the
// host); a runner that died while idle or failed to warm up costs only the
// warm start; Close removes the idle runner and its directory.
func TestWarmRunner(t *testing.T) {
	if testing.Short() {
		t.Skip("real ansible-playbook against an nspawn host: skipped under -short")
	}
	w := upWorld(t, 1)
	h := w.Host(0)
	var started pidLog
	e := testEngine(t, func(o *Options) {
		o.KillGrace = 2 * time.Second
		started.hook(o)
	})
	t.Cleanup(func() { _ = e.Close() })
	ctx := context.Background()
	c := joinContext(h)
	run := func(script string, timeout time.Duration) Result {
		t.Helper()
		return e.Run(ctx, Request{Phase: PhaseJoin, Conn: w.conn(0), Source: Source{Script: script}, Context: c, Timeout: timeout})
	}
	lastPid := func() int { p := started.list(); return p[len(p)-1] }

	// the first run starts cold and leaves the next run's runner behind
	mustOutcome(t, run("echo first > /tmp/kpssh-warm-1\n", time.Minute), Succeeded)
	dirs := e.warmDirs()
	if len(dirs) != 1 {
		t.Fatalf("warm runners after the first run: %v", dirs)
	}
	fi, err := os.Stat(dirs[0])
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("warm run directory: %v %v", fi, err)
	}
	if err := e.waitWarm(ctx); err != nil {
		t.Fatal(err)
	}
	wpid := warmProcess(dirs[0])
	if wpid == 0 {
		t.Fatalf("no runner process in %s", dirs[0])
	}
	// idle: only the configuration, ansible's own temp dirs and the module
	// payloads it builds ahead (all of PREBUILD, given time)
	prebuilt := waitPrebuilt(t, dirs[0], 90*time.Second)
	for _, m := range []string{"dklesev.kpssh.plugins.modules.host_state", "dklesev.kpssh.plugins.modules.files", "ansible.modules.command"} {
		if !slices.ContainsFunc(prebuilt, func(p string) bool { return strings.Contains(p, m+"-") }) {
			t.Errorf("the idle runner did not build %s ahead: %v", m, prebuilt)
		}
	}

	// the second run is handed to that process, in that directory
	r := run("test \"$KPSSH_SECRET_APIKEY\" = '{{ .Secrets.apiKey }}'\necho second > /tmp/kpssh-warm-2\n", time.Minute)
	mustOutcome(t, r, Succeeded)
	if !r.Touched || lastPid() != wpid {
		t.Fatalf("run used pid %d, the warm runner was %d: %+v", lastPid(), wpid, r)
	}
	if got := mustRun(t, w, 0, "cat /tmp/kpssh-warm-2"); got != "second" {
		t.Fatalf("host has %q", got)
	}
	if pidAlive(wpid) {
		t.Fatalf("the warm runner %d outlived its run", wpid)
	}

	// a timeout through a warm runner: group emptied, directory removed
	// (checked by testEngine's onDone) and the script stopped on the host
	if err := e.waitWarm(ctx); err != nil {
		t.Fatal(err)
	}
	mustRun(t, w, 0, "pkill -f kpssh-warm-[m]arker; rm -f /tmp/kpssh-warm-started; true")
	wpid = warmProcess(e.warmDirs()[0])
	r = run("touch /tmp/kpssh-warm-started\nexec -a kpssh-warm-marker sleep 600\n", 15*time.Second)
	mustOutcome(t, r, TimedOut)
	if lastPid() != wpid {
		t.Fatalf("timeout run did not use the warm runner")
	}
	if r.FailedTask == "kpssh: join script" {
		if !r.Touched {
			t.Fatalf("script ran, Touched=false: %+v", r)
		}
		hostScriptGone(t, w, 0, "kpssh-warm-marker", 10*time.Second)
	} else {
		t.Logf("ansible did not reach the script within 15s (machine load): %+v", r)
	}

	// a runner killed while idle: the next run starts cold and works
	if err := e.waitWarm(ctx); err != nil {
		t.Fatal(err)
	}
	dead := warmProcess(e.warmDirs()[0])
	if err := syscall.Kill(dead, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(5 * time.Second); pidAlive(dead) && time.Now().Before(end); {
		time.Sleep(20 * time.Millisecond)
	}
	deadDir := e.warmDirs()[0]
	mustOutcome(t, run("echo third > /tmp/kpssh-warm-3\n", time.Minute), Succeeded)
	if lastPid() == dead {
		t.Fatal("the run was handed to a dead runner")
	}
	if _, err := os.Stat(deadDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the dead runner's directory %s is left (%v)", deadDir, err)
	}

	// Close: the idle runner is stopped and reaped, its directory removed;
	// later runs start cold and leave no runner behind
	if err := e.waitWarm(ctx); err != nil {
		t.Fatal(err)
	}
	dirs = e.warmDirs()
	wpid = warmProcess(dirs[0])
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if pidAlive(wpid) {
		t.Errorf("warm runner %d survives Close", wpid)
	}
	if _, err := os.Stat(dirs[0]); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("warm run directory %s survives Close", dirs[0])
	}
	assertNoZombieChildren(t)
	mustOutcome(t, run("true\n", time.Minute), Succeeded)
	if d := e.warmDirs(); len(d) != 0 {
		t.Errorf("warm runners after Close: %v", d)
	}
}

// A warm runner that dies after it was taken for a run and handed the
// request, before its playbook started (killed by someone else: the OOM
// killer, an operator): nothing reached the host, so the run starts cold and
// succeeds. CI once saw this as a ConfigError "exit -1" when the runner died
// between the pool's liveness check and the hand-off.
func TestWarmRunnerDiesAfterHandOff(t *testing.T) {
	if testing.Short() {
		t.Skip("real ansible-playbook against an nspawn host: skipped under -short")
	}
	w := upWorld(t, 1)
	var mu sync.Mutex
	var killed []int
	var starts pidLog
	e := testEngine(t, func(o *Options) {
		starts.hook(o)
		o.afterHandOff = func(pid int) {
			mu.Lock()
			defer mu.Unlock()
			if len(killed) == 0 { // the first warm run only
				killed = append(killed, pid)
				_ = syscall.Kill(-pid, syscall.SIGKILL)
			}
		}
	})
	t.Cleanup(func() { _ = e.Close() })
	if err := e.waitWarm(context.Background()); err != nil {
		t.Fatal(err)
	}
	r := e.Run(context.Background(), Request{Phase: PhaseJoin, Conn: w.conn(0), Source: Source{Script: "echo cold > /tmp/kpssh-warm-died\n"},
		Context: joinContext(w.Host(0)), Timeout: time.Minute})
	mustOutcome(t, r, Succeeded)
	mu.Lock()
	defer mu.Unlock()
	if started := starts.list(); len(killed) != 1 || len(started) != 2 || started[0] != killed[0] || started[1] == killed[0] {
		t.Fatalf("killed %v, started %v: want the killed warm runner, then a cold start", killed, started)
	}
	if got := mustRun(t, w, 0, "cat /tmp/kpssh-warm-died"); got != "cold" {
		t.Fatalf("host has %q", got)
	}
	assertNoZombieChildren(t)
}

// A launcher that cannot warm up (here: one that exits at once) costs
// nothing but the warm start: runs start cold, and no new runner is started
// for a while.
func TestWarmRunnerBrokenLauncher(t *testing.T) {
	if testing.Short() {
		t.Skip("runs ansible-playbook: skipped under -short")
	}
	coll, err := FindCollectionsPath()
	if err != nil {
		t.Fatal(err)
	}
	// a copy of the collection whose launcher fails
	broken := t.TempDir()
	if err := os.CopyFS(broken, os.DirFS(coll)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(broken, runnerScript), []byte("import sys\nsys.stderr.write('kpssh runner: no ansible here\\n')\nsys.exit(70)\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	e := testEngine(t, func(o *Options) { o.CollectionsPath = broken; o.ConnectTimeout = 2 * time.Second })
	t.Cleanup(func() { _ = e.Close() })
	conn := testConn(t)
	conn.Address = "192.0.2.1" // unroutable: the run ends at ansible's own parse error
	req := Request{Phase: PhaseJoin, Conn: conn, Source: Source{Role: "no_such_role_warm"}, Timeout: time.Minute}
	// Cold runs go through the same launcher (it applies the run sandbox):
	// a broken launcher is a ConfigError naming its failure, never an
	// unsandboxed run.
	for i := 0; i < 2; i++ {
		r := e.Run(context.Background(), req)
		if r.Outcome != ConfigError || !strings.Contains(r.Message, "no ansible here") || r.Touched {
			t.Fatalf("run %d: %+v", i, r)
		}
	}
	err = e.waitWarm(context.Background())
	if err == nil || !strings.Contains(err.Error(), "no ansible here") {
		t.Fatalf("waitWarm = %v, want the launcher's failure", err)
	}
	if d := e.warmDirs(); len(d) != 0 {
		t.Fatalf("broken runners kept: %v", d)
	}
}
