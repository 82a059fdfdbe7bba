package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dklesev/kpssh/internal/sshx"
	"github.com/dklesev/kpssh/test/hostenv"
)

// testEngine returns an engine whose every run is checked afterwards: the
// run directory is gone, no process mentions it, and its process group is
// empty (nothing left running, no zombie).
func testEngine(t *testing.T, mod func(*Options)) *Local {
	t.Helper()
	coll, err := FindCollectionsPath()
	if err != nil {
		t.Fatal(err)
	}
	roles, err := filepath.Abs("testdata/roles")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	pids := map[string]int{}
	o := Options{AnsiblePlaybook: playbookBin(t), CollectionsPath: coll, RolesPath: []string{roles}}
	o.onStart = func(pid int, dir string) {
		mu.Lock()
		pids[dir] = pid
		mu.Unlock()
	}
	o.onDone = func(dir string) {
		mu.Lock()
		pid := pids[dir]
		mu.Unlock()
		checkRunGone(t, dir, pid)
	}
	if mod != nil {
		mod(&o)
	}
	e, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	// An engine keeps an idle pre-warmed runner: stop it with the test, or
	// later tests' "no process carries a run dir" checks see it.
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// checkRunGone checks that a finished run left nothing: its directory is
// gone, and no process mentions it or sits in its process group within a
// grace. Under load a child that ansible forked (pre-exec: it still carries
// the run directory in its command line) as the group was SIGKILLed, or a
// zombie init has not reaped yet, may still be on its way out when Run
// returns; one that stays past the grace is a leak. It returns a
// description of such transient processes ("" when there were none).
func checkRunGone(t *testing.T, dir string, pid int) (transient string) {
	t.Helper()
	if !gone(dir) {
		t.Errorf("run directory %s still exists", dir)
	}
	procs := func() []int {
		if pid <= 0 {
			// no process was started (pgrp 0 would be the kernel's)
			return processesMentioning(dir)
		}
		return runProcesses(pid, dir)
	}
	first := procs()
	if len(first) == 0 {
		return ""
	}
	for end := time.Now().Add(10 * time.Second); len(procs()) > 0 && time.Now().Before(end); {
		time.Sleep(20 * time.Millisecond)
	}
	if left := procs(); len(left) > 0 {
		t.Errorf("processes of run %s survive 10s after Run returned: %s", dir, describe(left))
	}
	return describe(first)
}

// groupMembers lists processes (zombies included) in process group pgid.
func groupMembers(pgid int) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(st)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:]) // state ppid pgrp …
		if len(f) > 2 && f[2] == strconv.Itoa(pgid) {
			out = append(out, pid)
		}
	}
	return out
}

func describe(pids []int) string {
	var parts []string
	for _, p := range pids {
		cl, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p))
		st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p))
		parts = append(parts, fmt.Sprintf("%d %q [%s]", p, strings.ReplaceAll(string(cl), "\x00", " "), strings.TrimSpace(string(st))))
	}
	return strings.Join(parts, "; ")
}

type world struct {
	*hostenv.World
	key []byte
}

func (w *world) conn(i int) Connection {
	h := w.Host(i)
	return Connection{Address: h.Address, Port: int32(h.Port), User: h.User, PrivateKey: w.key, HostKey: h.HostKey}
}

func upWorld(t testing.TB, n int) *world {
	w := hostenv.Up(t, n)
	key, err := os.ReadFile(w.Inventory().ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	return &world{World: w, key: key}
}

const apiKey = "api-KEY-0123456789-secret"
const token = "k8sabc.0123456789abcdef"

func joinContext(h hostenv.Host) Context {
	return Context{
		ClusterEndpoint: "https://10.99.0.1:6443", ClusterCAB64: "Q0EtQlVORExF", BootstrapToken: token,
		NodeName: "node-" + h.Name, ProviderID: "kpssh://kpssh-system/" + h.Name, HostAddress: h.Address, NodeAddress: h.Address,
		NodeLabels: "pool=test", Taints: "karpenter.sh/unregistered:NoExecute",
		Vars:    map[string]string{"greeting": "hello", "tricky": `it's {{ lookup('pipe', 'id') }} $(id)`},
		Secrets: map[string]string{"apiKey": apiKey},
	}
}

// mustRun runs cmd on host i and fails t (not the world's test) on error.
func mustRun(t *testing.T, w *world, i int, cmd string) string {
	t.Helper()
	out, _, err := w.Run(i, cmd)
	if err != nil {
		t.Fatalf("host %d: %v", i, err)
	}
	return strings.TrimSpace(out)
}

func mustOutcome(t *testing.T, r Result, want Outcome) {
	t.Helper()
	if r.Outcome != want {
		t.Fatalf("outcome %s, want %s: %+v", r.Outcome, want, r)
	}
}

func noLeak(t *testing.T, r Result, secrets ...string) {
	t.Helper()
	for _, s := range secrets {
		for name, v := range map[string]string{"Message": r.Message, "FailedTask": r.FailedTask} {
			if strings.Contains(v, s) {
				t.Errorf("%s holds secret %q: %q", name, s, v)
			}
		}
	}
}

func TestHosts(t *testing.T) {
	if testing.Short() {
		t.Skip("real hosts: not in -short")
	}
	w := upWorld(t, 3)
	// h1 and h2 in parallel; then h3 alone (its timeout test wants the
	// machine as idle as it gets).
	t.Run("group", func(t *testing.T) {
		t.Run("h1", func(t *testing.T) {
			t.Parallel()
			e := testEngine(t, nil)
			t.Run("ScriptLifecycle", func(t *testing.T) { testScriptLifecycle(t, w, e) })
			t.Run("InlineTasks", func(t *testing.T) { testInlineTasks(t, w, e) })
			t.Run("Role", func(t *testing.T) { testRole(t, w, e) })
			t.Run("RoleMitogen", func(t *testing.T) {
				testRole(t, w, testEngine(t, func(o *Options) { o.MitogenStrategyPath = DefaultMitogenStrategyPath }))
			})
			t.Run("FailingScriptRedacted", func(t *testing.T) { testFailingScript(t, w, e) })
			t.Run("FailingTask", func(t *testing.T) { testFailingTask(t, w, e) })
			t.Run("CanarySecret", func(t *testing.T) { testCanary(t, w) })
			t.Run("WrongPortUnreachable", func(t *testing.T) { testWrongPort(t, w, e) })
			t.Run("HostKeyMismatch", func(t *testing.T) { testHostKeyMismatch(t, w, e) })
			t.Run("FetchHostKey", func(t *testing.T) { testFetchHostKey(t, w) })
		})
		t.Run("h2", func(t *testing.T) {
			t.Parallel()
			e := testEngine(t, nil)
			t.Run("SudoUser", func(t *testing.T) { testSudoUser(t, w, e) })
			t.Run("NoPython", func(t *testing.T) { testNoPython(t, w, e) })
		})
	})
	t.Run("h3", func(t *testing.T) {
		t.Run("Timeout", func(t *testing.T) { testTimeout(t, w) })
		t.Run("TimeoutStopsHostScript", func(t *testing.T) { testTimeoutStopsHostScript(t, w) })
		t.Run("CanceledStopsHostScript", func(t *testing.T) { testCanceled(t, w) })
		t.Run("CutLinkUnreachable", func(t *testing.T) { testCutLink(t, w) })
		t.Run("PhaseLockWaitsForPredecessor", func(t *testing.T) { testPhaseLock(t, w) })
	})
}

const dummyUnit = `[Unit]
Description=kpssh engine test dummy
[Service]
ExecStart=/bin/sleep infinity
[Install]
WantedBy=multi-user.target
`

func testScriptLifecycle(t *testing.T, w *world, e *Local) {
	h := w.Host(0)
	ctx := context.Background()
	c := joinContext(h)

	install := `install -d -m 0755 /opt/kpssh-test
cat > /etc/systemd/system/kpssh-dummy.service <<'EOF'
` + dummyUnit + `EOF
systemctl daemon-reload
printf '%s|%s|%s|token=[%s]\n' '{{ .Vars.greeting }}' "$KPSSH_VAR_greeting" "$KPSSH_NODE_NAME" "$KPSSH_BOOTSTRAP_TOKEN" > /opt/kpssh-test/install.txt
printf '%s\n' "$KPSSH_VAR_tricky" > /opt/kpssh-test/tricky.txt
`
	r := e.Run(ctx, Request{Phase: PhaseInstall, Conn: w.conn(0), Source: Source{Script: install}, Context: c, Timeout: time.Minute})
	mustOutcome(t, r, Succeeded)
	mustRunnerAnsible(t, r)
	if !r.Touched || r.ExitCode != 0 {
		t.Fatalf("install: %+v", r)
	}
	if got := mustRun(t, w, 0, "cat /opt/kpssh-test/install.txt"); got != "hello|hello|node-h1|token=[]" {
		t.Fatalf("install saw %q (install must not get the token)", got)
	}
	if got := mustRun(t, w, 0, "cat /opt/kpssh-test/tricky.txt"); got != c.Vars["tricky"] {
		t.Fatalf("tricky var arrived as %q", got)
	}

	join := `test -f /etc/systemd/system/kpssh-dummy.service
systemctl enable --now kpssh-dummy.service
[ "$KPSSH_BOOTSTRAP_TOKEN" = '{{ .BootstrapToken }}' ]
[ "$KPSSH_SECRET_APIKEY" = '{{ .Secrets.apiKey }}' ]
printf '%s' "$KPSSH_BOOTSTRAP_TOKEN" | sha256sum | cut -d' ' -f1 > /opt/kpssh-test/token.sha
env | grep '^KPSSH_' | grep -v -e SECRET -e TOKEN | sort > /opt/kpssh-test/join.env
`
	r = e.Run(ctx, Request{Phase: PhaseJoin, Conn: w.conn(0), Source: Source{Script: join}, Context: c, Timeout: time.Minute})
	mustOutcome(t, r, Succeeded)
	if got := mustRun(t, w, 0, "systemctl is-active kpssh-dummy; systemctl is-enabled kpssh-dummy"); got != "active\nenabled" {
		t.Fatalf("after join: %q", got)
	}
	if got, want := mustRun(t, w, 0, "cat /opt/kpssh-test/token.sha"), sha256hex(token); got != want {
		t.Fatalf("token sha %s, want %s", got, want)
	}
	env := mustRun(t, w, 0, "cat /opt/kpssh-test/join.env")
	for _, want := range []string{"KPSSH_NODE_NAME=node-h1", "KPSSH_VAR_greeting=hello", "KPSSH_TAINTS=karpenter.sh/unregistered:NoExecute", "KPSSH_PROVIDER_ID=kpssh://kpssh-system/h1"} {
		if !strings.Contains(env, want) {
			t.Errorf("join env lacks %s:\n%s", want, env)
		}
	}

	leave := `systemctl disable --now kpssh-dummy.service
env | grep '^KPSSH_' | sort > /opt/kpssh-test/leave.env
echo '{{ .HostAddress }}' > /opt/kpssh-test/leave.txt
`
	r = e.Run(ctx, Request{Phase: PhaseLeave, Conn: w.conn(0), Source: Source{Script: leave}, Context: c, Timeout: time.Minute})
	mustOutcome(t, r, Succeeded)
	out, _, _ := w.Run(0, "systemctl is-active kpssh-dummy; systemctl is-enabled kpssh-dummy")
	if strings.TrimSpace(out) != "inactive\ndisabled" {
		t.Fatalf("after leave: %q", out)
	}
	want := strings.Join([]string{
		"KPSSH_BOOTSTRAP_TOKEN=", "KPSSH_CLUSTER_CA_B64=", "KPSSH_CLUSTER_ENDPOINT=", "KPSSH_HOST_ADDRESS=" + h.Address,
		"KPSSH_NODE_ADDRESS=" + h.Address, "KPSSH_NODE_LABELS=", "KPSSH_NODE_NAME=", "KPSSH_PROVIDER_ID=", "KPSSH_TAINTS=",
	}, "\n")
	if got := mustRun(t, w, 0, "cat /opt/kpssh-test/leave.env"); got != want {
		t.Fatalf("leave env:\n%s\nwant:\n%s", got, want)
	}
	if got := mustRun(t, w, 0, "cat /opt/kpssh-test/leave.txt"); got != h.Address {
		t.Fatalf("leave.txt %q", got)
	}
}

func testInlineTasks(t *testing.T, w *world, e *Local) {
	h := w.Host(0)
	c := joinContext(h)
	tasks := `- name: record the variables
  ansible.builtin.copy:
    dest: /opt/kpssh-test/tasks.json
    mode: "0600"
    content: "{{ {'kpssh': kpssh, 'vars': kpssh_vars, 'secrets': kpssh_secrets} | to_json }}"
  no_log: true
- name: record the environment
  ansible.builtin.shell: env | grep '^KPSSH_' | sort > /opt/kpssh-test/tasks.env
`
	r := e.Run(context.Background(), Request{Phase: PhaseJoin, Conn: w.conn(0), Source: Source{Tasks: tasks}, Context: c, Timeout: time.Minute})
	mustOutcome(t, r, Succeeded)
	var got struct {
		Kpssh   map[string]string `json:"kpssh"`
		Vars    map[string]string `json:"vars"`
		Secrets map[string]string `json:"secrets"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, w, 0, "cat /opt/kpssh-test/tasks.json")), &got); err != nil {
		t.Fatal(err)
	}
	if got.Kpssh["node_name"] != "node-h1" || got.Kpssh["bootstrap_token"] != token || got.Kpssh["cluster_endpoint"] != c.ClusterEndpoint || got.Kpssh["host_address"] != h.Address {
		t.Errorf("kpssh = %v", got.Kpssh)
	}
	if got.Vars["greeting"] != "hello" || got.Vars["tricky"] != c.Vars["tricky"] {
		t.Errorf("kpssh_vars = %v (values must arrive untemplated)", got.Vars)
	}
	if got.Secrets["apiKey"] != apiKey {
		t.Errorf("kpssh_secrets = %v", got.Secrets)
	}
	env := mustRun(t, w, 0, "cat /opt/kpssh-test/tasks.env")
	if !strings.Contains(env, "KPSSH_VAR_greeting=hello") || !strings.Contains(env, "KPSSH_NODE_NAME=node-h1") {
		t.Errorf("task environment:\n%s", env)
	}
	if strings.Contains(env, "SECRET") || strings.Contains(env, apiKey) || strings.Contains(env, "BOOTSTRAP_TOKEN") {
		t.Errorf("secret in the task environment:\n%s", env)
	}
}

// mustRunnerAnsible fails unless the run's ansible-core is the runner
// image's (Debian 13: 2.19 or newer), not an older one of the machine.
func mustRunnerAnsible(t *testing.T, r Result) {
	t.Helper()
	var major, minor int
	if _, err := fmt.Sscanf(r.AnsibleVersion, "%d.%d", &major, &minor); err != nil || major < 2 || major == 2 && minor < 19 {
		t.Errorf("the phase ran on ansible-core %q, want the runner image's (>= 2.19)", r.AnsibleVersion)
	}
}

// checkJoinProgress: kpssh_test_role's join reported each of its tasks as
// it started and as it ended, with a duration within the run's.
func checkJoinProgress(t *testing.T, got []TaskProgress, run time.Duration) {
	t.Helper()
	want := map[string]string{
		"join records kpssh, kpssh_vars and kpssh_secrets": "ok changed", // unchanged on a second run
		"join records its KPSSH_* environment":             "changed",
	}
	started := map[string]bool{}
	for _, tp := range got {
		tp.Task = strings.TrimPrefix(tp.Task, "kpssh_test_role : ") // ansible names a role's task so
		if _, ok := want[tp.Task]; !ok {
			continue
		}
		switch {
		case tp.Status == "started":
			started[tp.Task] = true
		case !started[tp.Task] || !slices.Contains(strings.Fields(want[tp.Task]), tp.Status) || tp.Duration <= 0 || tp.Duration > run:
			t.Errorf("progress %+v (started %v, want %s within %v)", tp, started[tp.Task], want[tp.Task], run)
		default:
			delete(want, tp.Task)
		}
	}
	if len(want) > 0 {
		t.Errorf("no progress for %v in %+v", want, got)
	}
}

func testRole(t *testing.T, w *world, e *Local) {
	h := w.Host(0)
	c := joinContext(h)
	for _, p := range []Phase{PhaseInstall, PhaseJoin, PhaseLeave} {
		if err := e.ValidateRole("kpssh_test_role", p); err != nil {
			t.Fatalf("ValidateRole %s: %v", p, err)
		}
		var mu sync.Mutex
		var progress []TaskProgress
		r := e.Run(context.Background(), Request{Phase: p, Conn: w.conn(0), Source: Source{Role: "kpssh_test_role"}, Context: c, Timeout: time.Minute,
			Progress: func(tp TaskProgress) { mu.Lock(); progress = append(progress, tp); mu.Unlock() }})
		mustOutcome(t, r, Succeeded)
		mustRunnerAnsible(t, r)
		if p == PhaseJoin {
			mu.Lock()
			checkJoinProgress(t, progress, r.Duration)
			mu.Unlock()
		}
	}
	var inst map[string]any
	if err := json.Unmarshal([]byte(mustRun(t, w, 0, "cat /var/lib/kpssh-test-role/install.json")), &inst); err != nil {
		t.Fatal(err)
	}
	if inst["phase"] != "install" || inst["token"] != "" || inst["node_name"] != "node-h1" {
		t.Errorf("install got %v", inst)
	}
	var join struct {
		Phase   string            `json:"phase"`
		Kpssh   map[string]string `json:"kpssh"`
		Vars    map[string]string `json:"vars"`
		Secrets map[string]string `json:"secrets"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, w, 0, "cat /var/lib/kpssh-test-role/join.json")), &join); err != nil {
		t.Fatal(err)
	}
	if join.Phase != "join" || join.Kpssh["bootstrap_token"] != token || join.Vars["greeting"] != "hello" || join.Secrets["apiKey"] != apiKey {
		t.Errorf("join got %+v", join)
	}
	if got := mustRun(t, w, 0, "cat /var/lib/kpssh-test-role/leave.txt"); got != h.Address+" "+h.Address {
		t.Errorf("leave got %q", got)
	}
	leaveEnv := mustRun(t, w, 0, "cat /var/lib/kpssh-test-role/leave.env")
	if strings.Contains(leaveEnv, "KPSSH_VAR_") || strings.Contains(leaveEnv, "KPSSH_NODE_NAME=node") || !strings.Contains(leaveEnv, "KPSSH_HOST_ADDRESS="+h.Address) {
		t.Errorf("leave environment:\n%s", leaveEnv)
	}
	// a role whose leave needs the node class is rejected up front
	if err := e.ValidateRole("kpssh_bad_leave_role", PhaseLeave); err == nil || !strings.Contains(err.Error(), "kpssh_vars") {
		t.Errorf("bad leave role: %v", err)
	}
	if err := e.ValidateRole("kpssh_test_role", PhaseUninstall); err == nil {
		t.Error("missing tasks/uninstall.yml accepted")
	}
	if err := e.ValidateRole("no_such_role", PhaseJoin); err == nil {
		t.Error("unknown role accepted")
	}
}

func testFailingScript(t *testing.T, w *world, e *Local) {
	c := joinContext(w.Host(0))
	script := `echo visible-stdout-line
echo "secret is $KPSSH_SECRET_APIKEY" >&2
echo "token {{ .BootstrapToken }} half ${KPSSH_BOOTSTRAP_TOKEN#*.}" >&2
echo "last words" >&2
exit 3
`
	r := e.Run(context.Background(), Request{Phase: PhaseJoin, Conn: w.conn(0), Source: Source{Script: script}, Context: c, Timeout: time.Minute})
	mustOutcome(t, r, Failed)
	if r.FailedTask != "kpssh: join script" || r.RC != 3 || !r.Touched || r.ExitCode != 2 {
		t.Fatalf("result %+v", r)
	}
	for _, want := range []string{"rc=3", "secret is ***", "token ***", "half ***", "last words"} {
		if !strings.Contains(r.Message, want) {
			t.Errorf("message lacks %q: %q", want, r.Message)
		}
	}
	noLeak(t, r, apiKey, token, "0123456789abcdef")
}

func testFailingTask(t *testing.T, w *world, e *Local) {
	c := joinContext(w.Host(0))
	tasks := `- name: a step that works
  ansible.builtin.command: /bin/true
- name: step that fails
  ansible.builtin.shell: echo "oops {{ kpssh_secrets.apiKey }}" >&2; exit 5
- name: never reached
  ansible.builtin.command: touch /opt/kpssh-test/never
`
	r := e.Run(context.Background(), Request{Phase: PhaseJoin, Conn: w.conn(0), Source: Source{Tasks: tasks}, Context: c, Timeout: time.Minute})
	mustOutcome(t, r, Failed)
	if r.FailedTask != "step that fails" || r.RC != 5 || !r.Touched {
		t.Fatalf("result %+v", r)
	}
	if !strings.Contains(r.Message, "oops ***") || !strings.Contains(r.Message, "rc=5") {
		t.Errorf("message %q", r.Message)
	}
	noLeak(t, r, apiKey)
	if out, _, _ := w.Run(0, "test -e /opt/kpssh-test/never && echo yes || echo no"); strings.TrimSpace(out) != "no" {
		t.Error("a task after the failure ran")
	}
}

// The canary: a failing join echoes a secret to stdout and stderr under
// set -x. The canary must appear in no returned field, in no argv or
// environment of any process of the run (captured while it runs), in no file
// left on the controller and in no process argument or file on the host.
func testCanary(t *testing.T, w *world) {
	canary := fmt.Sprintf("CANARY-%d-f00dfeed", time.Now().UnixNano())
	var mu sync.Mutex
	var seen []string
	var inspected, sshSeen int
	stop := make(chan struct{})
	var wg sync.WaitGroup
	started := time.Now()
	e := testEngine(t, func(o *Options) {
		prev := o.onStart
		o.onStart = func(pid int, dir string) {
			prev(pid, dir)
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					for _, p := range runProcesses(pid, dir) {
						cl, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p))
						env, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", p))
						mu.Lock()
						inspected++
						if strings.HasPrefix(filepath.Base(strings.SplitN(string(cl), "\x00", 2)[0]), "ssh") {
							sshSeen++
						}
						if strings.Contains(string(cl), canary) || strings.Contains(string(env), canary) {
							seen = append(seen, fmt.Sprintf("pid %d cmdline %q", p, cl))
						}
						mu.Unlock()
					}
					select {
					case <-stop:
						return
					case <-time.After(50 * time.Millisecond):
					}
				}
			}()
		}
	})
	c := joinContext(w.Host(0))
	// a multi-line secret (a PEM key in a join secret): one of its lines
	// printed alone must be masked too
	pemLine := fmt.Sprintf("PEMLINE%dx", time.Now().UnixNano())
	pem := "-----BEGIN KPSSH TEST KEY-----\nMIIEvQIBADANBgkqhkiG9w0B\n" + pemLine + "\n-----END KPSSH TEST KEY-----\n"
	c.Secrets = map[string]string{"canary": canary, "pem": pem}
	script := `set -x
echo "canary out $KPSSH_SECRET_CANARY"
echo "canary err {{ .Secrets.canary }}" >&2
printf '%s\n' "$KPSSH_SECRET_CANARY" | rev
printf '%s\n' "$KPSSH_SECRET_PEM" | sed -n 3p >&2
touch /tmp/kpssh-canary-started
sleep 3
exit 1
`
	hostScan := make(chan string, 1)
	go func() {
		// while the script sleeps: every process argument on the host
		for i := 0; i < 100; i++ {
			if out, _, err := w.Run(0, "test -e /tmp/kpssh-canary-started && for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f 2>/dev/null; echo; done"); err == nil {
				hostScan <- out
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		hostScan <- ""
	}()
	r := e.Run(context.Background(), Request{Phase: PhaseJoin, Conn: w.conn(0), Source: Source{Script: script}, Context: c, Timeout: time.Minute})
	close(stop)
	wg.Wait()
	mustOutcome(t, r, Failed)
	if r.RC != 1 || !strings.Contains(r.Message, "canary err ***") || !strings.Contains(r.Message, "echo 'canary err ***'") {
		t.Errorf("result %+v", r)
	}
	noLeak(t, r, canary)
	noLeak(t, r, pemLine)
	if !strings.Contains(r.Message, "sed -n 3p") {
		t.Errorf("the message does not reach the line that printed the PEM line (the check proves nothing): %q", r.Message)
	}
	mu.Lock()
	if len(seen) > 0 {
		t.Errorf("canary in process argv/environment: %v", seen)
	}
	if inspected == 0 || sshSeen == 0 {
		t.Errorf("the watcher inspected %d processes (%d ssh): the capture did not work", inspected, sshSeen)
	}
	mu.Unlock()
	scan := <-hostScan
	if scan == "" {
		t.Error("could not scan the host's processes while the script ran")
	} else {
		if strings.Contains(scan, canary) {
			t.Error("canary in a process argument on the host")
		}
		if !strings.Contains(scan, "bash -s") {
			t.Errorf("the host scan did not see the script's bash:\n%s", scan)
		}
	}
	// nothing on the controller's tmpfs/tmp written during the run holds it
	for _, base := range []string{"/dev/shm", os.TempDir()} {
		_ = filepath.WalkDir(base, func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return nil
			}
			if fi, err := d.Info(); err != nil || fi.ModTime().Before(started) || fi.Size() > 1<<20 || !fi.Mode().IsRegular() {
				return nil
			}
			if data, err := os.ReadFile(p); err == nil && strings.Contains(string(data), canary) {
				t.Errorf("canary in %s", p)
			}
			return nil
		})
	}
	// nor any file on the host (the script went over stdin)
	out, _, _ := w.Run(0, "grep -rl -s -- '"+canary+"' /root /tmp /var/tmp /home /etc /opt /run 2>/dev/null; true")
	if strings.TrimSpace(out) != "" {
		t.Errorf("canary in host files: %s", out)
	}
}

// runProcesses lists the live processes of a run: its process group and
// anything mentioning its directory (the ControlPersist master).
func runProcesses(pgid int, dir string) []int {
	seen := map[int]bool{}
	var out []int
	for _, p := range append(groupMembers(pgid), processesMentioning(dir)...) {
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	return out
}

func testWrongPort(t *testing.T, w *world, e *Local) {
	conn := w.conn(0)
	conn.Port = 2 // nothing listens
	r := e.Run(context.Background(), Request{Phase: PhaseJoin, Conn: conn, Source: Source{Script: "touch /tmp/kpssh-wrongport-ran"}, Context: joinContext(w.Host(0)), Timeout: time.Minute})
	mustOutcome(t, r, Failed)
	if r.Touched || r.FailedTask != connectTaskName || r.ExitCode != 4 || !strings.Contains(r.Message, "unreachable") {
		t.Fatalf("result %+v", r)
	}
}

func testHostKeyMismatch(t *testing.T, w *world, e *Local) {
	conn := w.conn(0)
	conn.HostKey = w.Host(1).HostKey // another host's key
	mustRun(t, w, 0, "rm -f /tmp/kpssh-hostkey-ran")
	r := e.Run(context.Background(), Request{Phase: PhaseJoin, Conn: conn, Source: Source{Script: "touch /tmp/kpssh-hostkey-ran"}, Context: joinContext(w.Host(0)), Timeout: time.Minute})
	mustOutcome(t, r, Failed)
	if r.Touched || r.FailedTask != connectTaskName || !strings.Contains(r.Message, "host key mismatch") {
		t.Fatalf("result %+v", r)
	}
	if out := mustRun(t, w, 0, "test -e /tmp/kpssh-hostkey-ran && echo ran || echo not"); out != "not" {
		t.Fatal("the script ran despite the host key mismatch")
	}
}

func testFetchHostKey(t *testing.T, w *world) {
	h := w.Host(0)
	ctx := context.Background()
	got, err := FetchHostKey(ctx, w.conn(0), h.Fingerprint)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(strings.Fields(got)[:2], " ") != strings.Join(strings.Fields(h.HostKey)[:2], " ") {
		t.Fatalf("FetchHostKey = %q, want %q", got, h.HostKey)
	}
	_, err = FetchHostKey(ctx, w.conn(0), w.Host(1).Fingerprint)
	var mm *sshx.HostKeyMismatchError
	if !errors.As(err, &mm) {
		t.Fatalf("want a host key mismatch, got %v", err)
	}
	if _, err := FetchHostKey(ctx, w.conn(0), ""); err == nil {
		t.Fatal("empty fingerprint accepted")
	}
}

func testSudoUser(t *testing.T, w *world, e *Local) {
	mustRun(t, w, 1, `set -e
id deploy >/dev/null 2>&1 || useradd -m -s /bin/bash deploy
install -d -m 0700 -o deploy -g deploy /home/deploy/.ssh
install -m 0600 -o deploy -g deploy /root/.ssh/authorized_keys /home/deploy/.ssh/authorized_keys
echo 'deploy ALL=(ALL) NOPASSWD:ALL' > /etc/sudoers.d/deploy && chmod 0440 /etc/sudoers.d/deploy
id nosudo >/dev/null 2>&1 || useradd -m -s /bin/bash nosudo
install -d -m 0700 -o nosudo -g nosudo /home/nosudo/.ssh
install -m 0600 -o nosudo -g nosudo /root/.ssh/authorized_keys /home/nosudo/.ssh/authorized_keys
rm -f /root/sudo-id /root/become-id`)
	conn := w.conn(1)
	conn.User = "deploy"
	c := joinContext(w.Host(1))
	r := e.Run(context.Background(), Request{Phase: PhaseJoin, Conn: conn, Source: Source{Script: `printf '%s %s %s\n' "$(id -u)" "$SUDO_USER" "$KPSSH_NODE_NAME" > /root/sudo-id`}, Context: c, Timeout: time.Minute})
	mustOutcome(t, r, Succeeded)
	if got := mustRun(t, w, 1, "cat /root/sudo-id"); got != "0 deploy node-h2" {
		t.Fatalf("script ran as %q, want root via sudo from deploy", got)
	}
	tasks := `- name: whoami
  ansible.builtin.command: id -u
  register: who
- name: record
  ansible.builtin.copy:
    dest: /root/become-id
    content: "{{ who.stdout }}\n"
`
	r = e.Run(context.Background(), Request{Phase: PhaseJoin, Conn: conn, Source: Source{Tasks: tasks}, Context: c, Timeout: time.Minute})
	mustOutcome(t, r, Succeeded)
	if got := mustRun(t, w, 1, "cat /root/become-id"); got != "0" {
		t.Fatalf("tasks ran as %q", got)
	}
	// an interrupted script of a sudo user is stopped on the host too
	r = cancelWhenStarted(t, w, e, 1, conn, "/tmp/kpssh-sudocancel-started", Source{Script: "touch /tmp/kpssh-sudocancel-started\nsleep 600 &\nexec -a kpssh-sudocancel-marker sleep 600\n"})
	mustOutcome(t, r, TimedOut)
	hostScriptGone(t, w, 1, "kpssh-sudocancel-marker", 5*time.Second)
	if out, _, _ := w.Run(1, "pgrep -x sleep || true"); strings.TrimSpace(out) != "" {
		t.Errorf("the script's background child survives: %s", out)
	}

	// without sudo rights the phase fails on the host, with sudo's message
	conn.User = "nosudo"
	r = e.Run(context.Background(), Request{Phase: PhaseJoin, Conn: conn, Source: Source{Script: "id"}, Context: c, Timeout: time.Minute})
	mustOutcome(t, r, Failed)
	if !r.Touched || r.RC != 1 || !strings.Contains(r.Message, "sudo") {
		t.Fatalf("nosudo: %+v", r)
	}
}

func testNoPython(t *testing.T, w *world, e *Local) {
	mustRun(t, w, 1, "for p in /usr/bin/python3 /usr/bin/python3.11; do mv $p $p.kpssh-aside; done; rm -f /root/nopython")
	t.Cleanup(func() {
		if _, _, err := w.Run(1, "for p in /usr/bin/python3 /usr/bin/python3.11; do mv $p.kpssh-aside $p; done"); err != nil {
			t.Errorf("restore python: %v", err)
		}
	})
	if out, _, _ := w.Run(1, "command -v python3 python3.11 python || echo none"); strings.TrimSpace(out) != "none" {
		t.Fatalf("python still there: %s", out)
	}
	r := e.Run(context.Background(), Request{Phase: PhaseInstall, Conn: w.conn(1), Source: Source{Script: "echo works-without-python > /root/nopython"}, Context: joinContext(w.Host(1)), Timeout: time.Minute})
	mustOutcome(t, r, Succeeded)
	if got := mustRun(t, w, 1, "cat /root/nopython"); got != "works-without-python" {
		t.Fatalf("got %q", got)
	}
	// a module-based profile does need Python: it fails on the host, reached
	r = e.Run(context.Background(), Request{Phase: PhaseInstall, Conn: w.conn(1), Source: Source{Tasks: "- ansible.builtin.command: /bin/true\n"}, Context: joinContext(w.Host(1)), Timeout: time.Minute})
	mustOutcome(t, r, Failed)
	if !r.Touched {
		t.Fatalf("tasks without python: %+v", r)
	}
}

// hostScriptGone waits until no process on host i carries marker.
func hostScriptGone(t *testing.T, w *world, i int, marker string, within time.Duration) {
	t.Helper()
	pat := marker[:1] + "[" + marker[1:2] + "]" + marker[2:] // pgrep must not match its own shell
	end := time.Now().Add(within)
	for {
		out, _, _ := w.Run(i, "pgrep -af '"+pat+"' || true")
		if strings.TrimSpace(out) == "" {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("the script still runs on the host %s after the run ended: %s", within, out)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func testTimeout(t *testing.T, w *world) {
	e := testEngine(t, func(o *Options) { o.KillGrace = 2 * time.Second })
	mustRun(t, w, 2, "pkill -f kpssh-timeout-[m]arker; true")
	start := time.Now()
	r := e.Run(context.Background(), Request{Phase: PhaseJoin, Conn: w.conn(2), Source: Source{Script: "echo started\nexec -a kpssh-timeout-marker sleep 600\n"}, Context: joinContext(w.Host(2)), Timeout: 3 * time.Second})
	el := time.Since(start)
	mustOutcome(t, r, TimedOut)
	// 3 s, then at most the 2 s grace, plus cleanup (ssh -O exit, remote stop)
	if el < 3*time.Second || el > 3*time.Second+2*time.Second+8*time.Second {
		t.Fatalf("took %s for a 3s timeout with 2s grace", el)
	}
	if !strings.Contains(r.Message, "timed out after 3s") || r.ExitCode == 0 {
		t.Fatalf("result %+v", r)
	}
	// checkRunGone (onDone) verified the controller side. On a loaded
	// machine ansible may not reach the script within 3 s; when it did,
	// the script must be gone from the host too.
	if r.FailedTask != "kpssh: join script" {
		t.Logf("ansible did not reach the script within 3s (machine load): %+v", r)
		return
	}
	if !r.Touched {
		t.Fatalf("script task running but Touched=false: %+v", r)
	}
	hostScriptGone(t, w, 2, "kpssh-timeout-marker", 10*time.Second)
}

// A timeout long enough for ansible to reach the script even on a loaded
// machine, and no host-side timeout(1): only the engine's active stop through
// the ControlMaster can end the script on the host.
func testTimeoutStopsHostScript(t *testing.T, w *world) {
	e := testEngine(t, func(o *Options) { o.KillGrace = 2 * time.Second; o.NoRemoteTimeout = true })
	mustRun(t, w, 2, "rm -f /tmp/kpssh-timeout2-started; pkill -f kpssh-timeout2-[m]arker; true")
	t.Cleanup(func() { _, _, _ = w.Run(2, "pkill -f kpssh-timeout2-[m]arker; true") })
	r := e.Run(context.Background(), Request{Phase: PhaseJoin, Conn: w.conn(2), Source: Source{Script: "touch /tmp/kpssh-timeout2-started\nexec -a kpssh-timeout2-marker sleep 600\n"}, Context: joinContext(w.Host(2)), Timeout: 15 * time.Second})
	mustOutcome(t, r, TimedOut)
	if r.FailedTask != "kpssh: join script" || !r.Touched || !strings.Contains(r.Message, "timed out after 15s") {
		t.Fatalf("result %+v", r)
	}
	if out := mustRun(t, w, 2, "test -e /tmp/kpssh-timeout2-started && echo yes || echo no"); out != "yes" {
		t.Fatal("the script never started")
	}
	hostScriptGone(t, w, 2, "kpssh-timeout2-marker", 5*time.Second)
}

// cancelWhenStarted runs src (which must touch started on the host) and
// cancels the run's context as soon as that file exists.
func cancelWhenStarted(t *testing.T, w *world, e *Local, i int, conn Connection, started string, src Source) Result {
	t.Helper()
	mustRun(t, w, i, "rm -f "+started)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		for ctx.Err() == nil {
			if out, _, _ := w.Run(i, "test -e "+started+" && echo yes"); strings.TrimSpace(out) == "yes" {
				cancel()
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	return e.Run(ctx, Request{Phase: PhaseJoin, Conn: conn, Source: src, Context: joinContext(w.Host(i)), Timeout: time.Minute})
}

// Cancel the context once the script provably runs on the host: the run is
// interrupted (TimedOut) and the script is stopped on the host at once, not
// when its host-side timeout (1 minute here) runs out.
func testCanceled(t *testing.T, w *world) {
	e := testEngine(t, nil)
	mustRun(t, w, 2, "pkill -f kpssh-cancel-[m]arker; true")
	r := cancelWhenStarted(t, w, e, 2, w.conn(2), "/tmp/kpssh-cancel-started", Source{Script: "touch /tmp/kpssh-cancel-started\nexec -a kpssh-cancel-marker sleep 600\n"})
	mustOutcome(t, r, TimedOut)
	if !strings.Contains(r.Message, "interrupted") || r.FailedTask != "kpssh: join script" || !r.Touched {
		t.Fatalf("result %+v", r)
	}
	hostScriptGone(t, w, 2, "kpssh-cancel-marker", 5*time.Second)

	// so is a module of a tasks phase (its command line carries the tag
	// under the phase_lock shell plugin)
	mustRun(t, w, 2, "pkill -f kpssh-cancelmod-[m]arker; true")
	r = cancelWhenStarted(t, w, e, 2, w.conn(2), "/tmp/kpssh-cancelmod-started",
		Source{Tasks: "- name: long module\n  ansible.builtin.shell: touch /tmp/kpssh-cancelmod-started; exec -a kpssh-cancelmod-marker sleep 600\n  args: {executable: /bin/bash}\n"})
	mustOutcome(t, r, TimedOut)
	if r.FailedTask != "long module" {
		t.Fatalf("result %+v", r)
	}
	hostScriptGone(t, w, 2, "kpssh-cancelmod-marker", 5*time.Second)

	// a context that is already done starts nothing
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r = e.Run(ctx, Request{Phase: PhaseJoin, Conn: w.conn(2), Source: Source{Script: "true"}, Context: joinContext(w.Host(2))})
	if r.Outcome != TimedOut || r.Touched || !strings.Contains(r.Message, "not started") {
		t.Fatalf("done context: %+v", r)
	}
}

func testCutLink(t *testing.T, w *world) {
	e := testEngine(t, func(o *Options) { o.ConnectTimeout = 3 * time.Second })
	w.Cut(2)
	defer w.Heal(2)
	start := time.Now()
	r := e.Run(context.Background(), Request{Phase: PhaseJoin, Conn: w.conn(2), Source: Source{Script: "true"}, Context: joinContext(w.Host(2)), Timeout: time.Minute})
	mustOutcome(t, r, Failed)
	if r.Touched || r.FailedTask != connectTaskName || r.ExitCode != 4 {
		t.Fatalf("result %+v", r)
	}
	if el := time.Since(start); el > 20*time.Second {
		t.Fatalf("unreachable took %s with a 3s connect timeout", el)
	}
}

// A script phase waits for the one still running on the host (what a
// controller crash or a cancel leaves behind: the remote script outlives its
// SSH connection) instead of running beside it: the predecessor holds the
// host's phase lock, as every script phase does, and the new run's script
// starts only once the predecessor ended.
//
// Module phases (roles, tasks) take the same lock for every module they run
// on the host (the interpreter is flock'd): what a killed ansible-playbook
// leaves behind is the one module it was running, and the resumed run's
// modules wait for it.
func testPhaseLock(t *testing.T, w *world) {
	e := testEngine(t, nil)
	for name, src := range map[string]Source{
		"script": {Script: "echo B >>/tmp/kpssh-lock.log\n"},
		"tasks":  {Tasks: "- name: B\n  ansible.builtin.shell: echo B >>/tmp/kpssh-lock.log\n  changed_when: false\n"},
	} {
		mustRun(t, w, 2, "rm -f /tmp/kpssh-lock.log")
		// the predecessor: the lock as a phase takes it, held for 6 s
		mustRun(t, w, 2, "setsid -f flock "+hostPhaseLock+" sh -c 'echo start-A >>/tmp/kpssh-lock.log; sleep 6; echo end-A >>/tmp/kpssh-lock.log' </dev/null >/dev/null 2>&1; "+
			"for i in $(seq 50); do [ -s /tmp/kpssh-lock.log ] && exit 0; sleep 0.1; done; exit 1")
		r := e.Run(context.Background(), Request{Phase: PhaseJoin, Conn: w.conn(2), Source: src, Context: joinContext(w.Host(2)), Timeout: time.Minute})
		mustOutcome(t, r, Succeeded)
		if got := mustRun(t, w, 2, "cat /tmp/kpssh-lock.log"); got != "start-A\nend-A\nB" {
			t.Fatalf("%s phase: host log %q: the phase ran beside its predecessor (want start-A, end-A, B)", name, got)
		}
	}
}

// Config errors that only ansible itself can find still happen before the
// host is contacted: the address is unroutable (TEST-NET-1), and a run that
// tried to connect would take the connect timeout and fail as unreachable.
func TestConfigErrorsBeforeHost(t *testing.T) {
	if testing.Short() {
		t.Skip("runs ansible-playbook")
	}
	e := testEngine(t, func(o *Options) { o.ConnectTimeout = 2 * time.Second })
	conn := testConn(t)
	conn.Address = "192.0.2.1"
	cases := map[string]Source{
		"unknown role":            {Role: "no_such_role_anywhere"},
		"role without phase":      {Role: "kpssh_bad_leave_role"}, // has only leave.yml
		"unknown module":          {Tasks: "- name: x\n  no.such.module_here: {}\n"},
		"bad task keyword":        {Tasks: "- name: x\n  ansible.builtin.command: /bin/true\n  not_a_keyword: 1\n"},
		"unknown collection role": {Role: "nope.nope.nope"},
	}
	for name, src := range cases {
		t.Run(name, func(t *testing.T) {
			r := e.Run(context.Background(), Request{Phase: PhaseJoin, Conn: conn, Source: src, Context: Context{Secrets: map[string]string{"x": "a-secret-value"}}, Timeout: time.Minute})
			t.Logf("%s: %s", r.Outcome, r.Message)
			if r.Outcome != ConfigError || r.Touched {
				t.Fatalf("result %+v", r)
			}
			if name == "unknown module" && !strings.Contains(r.Message, "no.such.module_here") {
				t.Errorf("the message does not name the missing module: %q", r.Message)
			}
			if r.Duration > 30*time.Second {
				t.Fatalf("took %s", r.Duration)
			}
		})
	}
	// checks before anything is written or started
	for name, req := range map[string]Request{
		"invalid var name": {Phase: PhaseJoin, Conn: conn, Source: Source{Script: "true"}, Context: Context{Vars: map[string]string{"a-b": "x"}}},
		"template error":   {Phase: PhaseJoin, Conn: conn, Source: Source{Script: "{{ .Vars.missing }}"}},
		"leave with vars":  {Phase: PhaseLeave, Conn: conn, Source: Source{Script: "{{ .Vars.x }}"}},
		"missing host key": {Phase: PhaseJoin, Conn: Connection{Address: "192.0.2.1", PrivateKey: conn.PrivateKey}, Source: Source{Script: "true"}},
		"unknown phase":    {Phase: "bogus", Conn: conn, Source: Source{Script: "true"}},
		"not a task list":  {Phase: PhaseJoin, Conn: conn, Source: Source{Tasks: "command: x"}},
	} {
		r := e.Run(context.Background(), req)
		if r.Outcome != ConfigError || r.Touched || r.ExitCode != -1 || r.Duration > time.Second {
			t.Errorf("%s: %+v", name, r)
		}
	}
}
