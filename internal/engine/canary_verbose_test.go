package engine

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestCanaryVerbose extends hosts_test.go's testCanary (one failing set -x
// join script, default verbosity) to the worst case for leaks: ansible at
// -vvvv (Options.Verbosity 4, which also makes Ansible run ssh -vvv), both
// install and join, both a set -x script and an inline task list whose
// no_log tasks use the secret and the bootstrap token and whose later task
// fails. The canaries — a joinSecretRef-like value, the token and its secret
// half — must appear:
//   - in no Result field;
//   - in no log line: the engine has no logger (the standard log and slog
//     defaults are hooked anyway), and ansible-playbook's complete stdout and
//     stderr are captured through a wrapper (not just the tail the engine
//     keeps);
//   - in no file left in the run directories' parent (which must be empty)
//     nor any file written on the controller's /dev/shm and tmp meanwhile;
//   - in no /proc/*/cmdline of any process on the machine — the nspawn
//     hosts' processes included — nor the /proc/*/environ of our processes
//     (the test's descendants and anything carrying a run directory, i.e.
//     the ssh mux masters), sampled every ~20 ms while the runs go on.
//
// The host's bash legitimately holds the secrets in its environment (the
// KPSSH_SECRET_* contract), so the hosts' environ is not checked.
func TestCanaryVerbose(t *testing.T) {
	if testing.Short() {
		t.Skip("real ansible-playbook against nspawn hosts: skipped under -short")
	}
	start := time.Now()
	w := upWorld(t, 1)
	h := w.Host(0)

	rnd := make([]byte, 8)
	if _, err := rand.Read(rnd); err != nil {
		t.Fatal(err)
	}
	secret := fmt.Sprintf("CANARY-%d-5ec7e7-activation", time.Now().UnixNano())
	tok := "kpscan." + hex.EncodeToString(rnd) // [a-z0-9]{6}.[a-z0-9]{16}
	half := tok[strings.IndexByte(tok, '.')+1:]
	needles := []string{secret, tok, half}

	// The engine has no logger; hook the process-wide defaults anyway, in
	// case a dependency (or a future change) logs through them.
	var logBuf lockedBuffer
	prevLog := log.Writer()
	log.SetOutput(&logBuf)
	prevSlog := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&logBuf, nil)))
	defer func() { log.SetOutput(prevLog); slog.SetDefault(prevSlog) }()

	// ansible-playbook's whole stdout and stderr, copied by a wrapper: the
	// engine runs the wrapper as "ansible-playbook" (same argv, same
	// minimal environment, same process group).
	capDir := t.TempDir()
	wrapper := filepath.Join(capDir, "ansible-playbook")
	if err := os.WriteFile(wrapper, []byte(`#!/bin/bash
# test wrapper: the real ansible-playbook, with a full copy of its output
o=`+capDir+`/run-$$
`+playbookBin(t)+` "$@" >"$o.out" 2>"$o.err"
rc=$?
cat "$o.out"
cat "$o.err" >&2
exit $rc
`), 0o755); err != nil {
		t.Fatal(err)
	}
	base := runBase(t, "can")
	// Two engines at -vvvv: one runs the wrapper (a shell script, so always a
	// freshly started ansible-playbook) for the full output capture; the
	// other is the default configuration (pre-warmed runners when
	// available), the path production takes.
	var warmStarts, starts int
	var startsMu sync.Mutex
	captured := testEngine(t, func(o *Options) {
		o.AnsiblePlaybook = wrapper
		o.Verbosity = 4
		o.RunDirBase = base
		// a shell wrapper cannot carry the run sandbox (the Python launcher
		// applies it): this engine runs inline tasks without it; the
		// default engine below runs them sandboxed
		o.noSandbox = true
	})
	dflt := testEngine(t, func(o *Options) {
		o.Verbosity = 4
		o.RunDirBase = base
		prev := o.onStart
		o.onStart = func(pid int, dir string) {
			prev(pid, dir)
			cl, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			startsMu.Lock()
			starts++
			if isWarmRunnerCmdline(cl) {
				warmStarts++
			}
			startsMu.Unlock()
		}
	})
	engines := []struct {
		name string
		e    *Local
	}{{"captured", captured}, {"default", dflt}}

	c := joinContext(h)
	c.BootstrapToken = tok
	c.Secrets = map[string]string{"activationCode": secret}
	script := func(join bool) string {
		s := "set -x\necho \"canary out $KPSSH_SECRET_ACTIVATIONCODE\"\necho \"canary err {{ .Secrets.activationCode }}\" >&2\n"
		if join {
			s += "echo \"token $KPSSH_BOOTSTRAP_TOKEN {{ .BootstrapToken }}\" >&2\necho \"half ${KPSSH_BOOTSTRAP_TOKEN#*.}\" >&2\n"
		}
		return s + "sleep 1 # the sampler sees the host's bash\nexit 1\n"
	}
	tasks := func(join bool) string {
		s := `- name: store the activation code
  ansible.builtin.shell:
    cmd: umask 077 && cat > /root/kpssh-canary.secret
    stdin: "{{ kpssh_secrets.activationCode }}"
    stdin_add_newline: false
  no_log: true
`
		if join {
			s += `- name: store the token
  ansible.builtin.shell:
    cmd: umask 077 && cat > /root/kpssh-canary.token
    stdin: "{{ kpssh.bootstrap_token }}"
    stdin_add_newline: false
  no_log: true
`
		}
		return s + `- name: fail after the secret was used
  ansible.builtin.shell: echo "failing on purpose" >&2; sleep 1; exit 4
`
	}
	cases := []struct {
		name  string
		phase Phase
		src   Source
		task  string
		rc    int
		msg   []string
		host  map[string]string // file on the host → sha256 of its content
	}{
		{"script/install", PhaseInstall, Source{Script: script(false)}, "kpssh: install script", 1,
			[]string{"canary err ***", "echo 'canary err ***'", "canary out ***"}, nil},
		{"script/join", PhaseJoin, Source{Script: script(true)}, "kpssh: join script", 1,
			[]string{"canary err ***", "token *** ***", "half ***"}, nil},
		{"tasks/install", PhaseInstall, Source{Tasks: tasks(false)}, "fail after the secret was used", 4,
			[]string{"failing on purpose"}, map[string]string{"/root/kpssh-canary.secret": sha256hex(secret)}},
		{"tasks/join", PhaseJoin, Source{Tasks: tasks(true)}, "fail after the secret was used", 4,
			[]string{"failing on purpose"}, map[string]string{"/root/kpssh-canary.secret": sha256hex(secret), "/root/kpssh-canary.token": sha256hex(tok)}},
	}

	probeSampler(t)
	s := startSampler(needles)
	sampleStart := time.Now()
	for _, eng := range engines {
		for _, tc := range cases {
			t.Run(eng.name+"/"+tc.name, func(t *testing.T) {
				mustRun(t, w, 0, "rm -f /root/kpssh-canary.*")
				t0 := time.Now()
				r := eng.e.Run(context.Background(), Request{Phase: tc.phase, Conn: w.conn(0), Source: tc.src, Context: c, Timeout: 5 * time.Minute})
				t.Logf("%s in %s: %s", r.Outcome, time.Since(t0).Round(time.Millisecond), r.Message)
				mustOutcome(t, r, Failed)
				if !r.Touched || r.FailedTask != tc.task || r.RC != tc.rc || r.ExitCode != 2 {
					t.Errorf("result %+v, want FailedTask %q RC %d", r, tc.task, tc.rc)
				}
				for _, m := range tc.msg {
					if !strings.Contains(r.Message, m) {
						t.Errorf("Message lacks %q (the run must have printed the canary, redacted): %q", m, r.Message)
					}
				}
				all := fmt.Sprintf("%+v", r) // every field
				for _, n := range needles {
					if strings.Contains(all, n) {
						t.Errorf("a Result field holds a canary: %s", all)
					}
				}
				// the no_log tasks really used the values
				for f, sum := range tc.host {
					if got := mustRun(t, w, 0, "sha256sum < "+f+" | cut -d' ' -f1"); got != sum {
						t.Errorf("%s on the host: sha256 %s, want %s", f, got, sum)
					}
				}
				if left := leftInBase(t, base); len(left) > 0 {
					t.Errorf("left in the run directories' parent %s: %v", base, left)
				}
			})
		}
	}
	s.close()
	t.Logf("default engine: %d of %d runs on a pre-warmed runner", warmStarts, starts)

	st := s.stats()
	sampled := time.Since(sampleStart)
	t.Logf("sampler: %d samples in %s (every %s on average, asked 20 ms), %d processes inspected (%d ours); seen %v",
		st.samples, sampled.Round(time.Millisecond), (sampled / time.Duration(max(st.samples, 1))).Round(time.Millisecond), st.inspected, st.ours, st.seen)
	for _, hit := range st.hits {
		t.Errorf("canary in %s", hit)
	}
	// the sampler saw what it was meant to watch (it cannot pass by
	// looking at nothing)
	for _, what := range []string{"ansible-playbook", "ssh", "ssh mux master", "host bash"} {
		if st.seen[what] == 0 {
			t.Errorf("the sampler never saw a %s process: %v", what, st.seen)
		}
	}
	if st.samples < 20 {
		t.Errorf("only %d samples", st.samples)
	}

	// ansible's complete output
	outs, _ := filepath.Glob(filepath.Join(capDir, "run-*.out"))
	errs, _ := filepath.Glob(filepath.Join(capDir, "run-*.err"))
	if len(outs) != len(cases) || len(errs) != len(cases) {
		t.Fatalf("captured %d stdout and %d stderr files for %d runs", len(outs), len(errs), len(cases))
	}
	for _, f := range append(outs, errs...) {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range needles {
			if bytes.Contains(data, []byte(n)) {
				t.Errorf("ansible-playbook output %s holds a canary", filepath.Base(f))
			}
		}
		if strings.HasSuffix(f, ".err") {
			// -vvvv reached ansible and its verbose output goes to stderr
			if !bytes.Contains(data, []byte("ESTABLISH SSH CONNECTION")) || !bytes.Contains(data, []byte("SSH: EXEC ssh -vvv")) {
				t.Errorf("%s: no -vvvv output on stderr (%d bytes)", filepath.Base(f), len(data))
			}
			continue
		}
		// stdout is only the event stream: verbose output stays off it
		sc := bufio.NewScanner(bytes.NewReader(data))
		sc.Buffer(make([]byte, 0, 64*1024), 2<<20)
		events := 0
		for sc.Scan() {
			if len(bytes.TrimSpace(sc.Bytes())) == 0 {
				continue
			}
			if _, ok := ParseEventLine(sc.Bytes()); !ok {
				t.Errorf("%s: a line that is not an event: %.200q", filepath.Base(f), sc.Text())
			} else {
				events++
			}
		}
		if events == 0 {
			t.Errorf("%s: no events", filepath.Base(f))
		}
	}
	if logBuf.Len() > 0 {
		t.Logf("log output during the runs: %d bytes", logBuf.Len())
	}
	for _, n := range needles {
		if strings.Contains(logBuf.String(), n) {
			t.Error("a canary was logged")
		}
	}
	// no file left, none written meanwhile on the controller's tmpfs/tmp
	closeAndCheckEmpty(t, base, captured, dflt)
	for _, hit := range scanFilesFor(start, needles, "/dev/shm", os.TempDir()) {
		t.Errorf("controller file: %s", hit)
	}
	t.Logf("TestCanaryVerbose wall time %s", time.Since(start).Round(time.Millisecond))
}

// probeSampler shows that the sampler finds a needle in the argv and in the
// environment of a child process (it cannot pass by looking at nothing).
func probeSampler(t *testing.T) {
	t.Helper()
	arg, env := fmt.Sprintf("PROBE-ARG-%d", time.Now().UnixNano()), fmt.Sprintf("PROBE-ENV-%d", time.Now().UnixNano())
	// "; true" keeps bash from exec'ing sleep (its argv holds the probe)
	c := exec.Command("/bin/bash", "-c", "sleep 60; true", arg)
	c.Env = []string{"PROBE=" + env}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Process.Kill(); _ = c.Wait() }()
	ps := startSampler([]string{arg, env})
	for end := time.Now().Add(time.Minute); ps.stats().samples < 2 && time.Now().Before(end); {
		time.Sleep(20 * time.Millisecond)
	}
	ps.close()
	hits := strings.Join(ps.stats().hits, "\n")
	if !strings.Contains(hits, "cmdline of pid") || !strings.Contains(hits, "environ of pid") {
		t.Fatalf("the sampler missed a probe in a child's argv or environment: %q", hits)
	}
}

// lockedBuffer is a bytes.Buffer safe for concurrent writers (loggers).
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) Len() int { l.mu.Lock(); defer l.mu.Unlock(); return l.b.Len() }

func (l *lockedBuffer) String() string { l.mu.Lock(); defer l.mu.Unlock(); return l.b.String() }

// procSampler scans /proc every ~20 ms: the cmdline of every process on the
// machine (nspawn hosts included: their processes are visible here) and the
// environ of ours, for the needles.
type procSampler struct {
	needles []string
	tag     string // run directories of this test process
	selfNS  string
	stop    chan struct{}
	done    chan struct{}
	mu      sync.Mutex
	st      samplerStats
}

type samplerStats struct {
	samples, inspected, ours int
	seen                     map[string]int
	hits                     []string
}

func startSampler(needles []string) *procSampler {
	ns, _ := os.Readlink("/proc/self/ns/pid")
	s := &procSampler{needles: needles, tag: runTag(), selfNS: ns, stop: make(chan struct{}), done: make(chan struct{}),
		st: samplerStats{seen: map[string]int{}}}
	go func() {
		defer close(s.done)
		for {
			s.sample()
			select {
			case <-s.stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	return s
}

func (s *procSampler) close() { close(s.stop); <-s.done }

func (s *procSampler) stats() samplerStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st
}

func (s *procSampler) sample() {
	// Our processes: the test process's subtree, walked through
	// /proc/<pid>/task/<tid>/children (far cheaper than reading every
	// process's stat), plus whatever carries a run directory (the ssh mux
	// masters daemonize out of the tree).
	tree := map[int]bool{}
	for queue := []int{os.Getpid()}; len(queue) > 0; queue = queue[1:] {
		p := queue[0]
		if tree[p] {
			continue
		}
		tree[p] = true
		tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", p))
		for _, tk := range tasks {
			data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", p, tk.Name()))
			for _, f := range strings.Fields(string(data)) {
				if c, err := strconv.Atoi(f); err == nil {
					queue = append(queue, c)
				}
			}
		}
	}
	var hits []string
	var inspected, ours int
	seen := map[string]int{}
	for _, p := range allPids() {
		cl, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p))
		if err != nil {
			continue
		}
		inspected++
		args := strings.Split(string(cl), "\x00")
		for _, n := range s.needles {
			if bytes.Contains(cl, []byte(n)) {
				hits = append(hits, fmt.Sprintf("cmdline of pid %d (%s)", p, args[0])) // not the canary itself
			}
		}
		mine := strings.Contains(string(cl), s.tag)
		switch {
		case strings.Contains(string(cl), "bin/ansible-playbook"):
			seen["ansible-playbook"]++
		case strings.HasPrefix(args[0], "ssh: ") && mine:
			seen["ssh mux master"]++
		case filepath.Base(args[0]) == "ssh" && mine:
			seen["ssh"]++
		case len(args) > 2 && filepath.Base(args[0]) == "bash" && args[1] == "-s" && strings.HasPrefix(args[2], s.tag):
			seen["host bash"]++
		}
		if !mine && !tree[p] {
			continue
		}
		// the hosts' processes (other pid namespaces) hold the secrets in
		// their environment by contract
		if ns, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", p)); ns != s.selfNS {
			continue
		}
		ours++
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", p))
		if err != nil {
			continue
		}
		for _, n := range s.needles {
			if bytes.Contains(env, []byte(n)) {
				hits = append(hits, fmt.Sprintf("environ of pid %d (%s)", p, args[0]))
			}
		}
	}
	s.mu.Lock()
	s.st.samples++
	s.st.inspected += inspected
	s.st.ours += ours
	for k, v := range seen {
		s.st.seen[k] += v
	}
	s.st.hits = append(s.st.hits, hits...)
	s.mu.Unlock()
}
