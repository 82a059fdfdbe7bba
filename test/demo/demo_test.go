//go:build e2e

package demo

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/test/hostenv"
	"github.com/dklesev/kpssh/test/testexec"
)

// TestMakeDemo runs what the README's main command runs, `make demo`, then
// `make demo-down`, under a name of its own (KPSSH_DEMO_NAME): everything
// else is the default path — the role profile tls-bootstrap, the examples,
// a cold world (the test's hosts join for the first time).
func TestMakeDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the demo needs root, nspawn hosts, the Kubernetes binaries and the runner image (make test runs it)")
	}
	if os.Geteuid() != 0 {
		t.Fatal("the demo needs root (netns, mounts, cgroups, systemd-nspawn)")
	}
	for _, c := range []string{"make", "kubectl", "jq", "systemd-nspawn", "ip"} {
		if _, err := exec.LookPath(c); err != nil {
			t.Fatalf("%s: %v", c, err)
		}
	}
	repo, err := hostenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	name := "demotest-" + strconv.Itoa(os.Getpid())
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	// Every process the demo starts outside its hosts inherits this
	// variable: none may have it after make demo-down.
	mark := "KPSSH_DEMO_TEST_MARK=" + hex.EncodeToString(b)
	env := []string{mark, "KPSSH_DEMO_NAME=" + name, "KPSSH_OWNER_PID=" + strconv.Itoa(os.Getpid())}
	for _, kv := range os.Environ() {
		// the default path: not the script twin, not another demo's name
		if !strings.HasPrefix(kv, "KPSSH_DEMO_") && !strings.HasPrefix(kv, "KPSSH_OWNER_PID=") &&
			!strings.HasPrefix(kv, "KPSSH_WORLD=") && !strings.HasPrefix(kv, "KPSSH_CP=") && !strings.HasPrefix(kv, "MAKEFLAGS=") &&
			!strings.HasPrefix(kv, "MFLAGS=") && !strings.HasPrefix(kv, "MAKELEVEL=") {
			env = append(env, kv)
		}
	}
	run := func(timeout time.Duration, name string, args ...string) (string, string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		c := testexec.Command(ctx, name, args...)
		c.Dir, c.Env = repo, env
		return testexec.Output(ctx, c)
	}

	// Demos of killed earlier runs of this test (their owner is gone).
	if o, e, err := run(5*time.Minute, "hack/demo.sh", "gc"); err != nil {
		t.Fatalf("hack/demo.sh gc: %v\n%s%s", err, o, e)
	}
	runDir := "/run/kpssh-demo-" + name
	down := func() (string, error) {
		keepLogs(t, runDir, "/run/kpssh-cp/"+name)
		o, e, err := run(5*time.Minute, "make", "--no-print-directory", "demo-down")
		return o + e, err
	}
	downed := false
	t.Cleanup(func() {
		if !downed {
			if out, err := down(); err != nil {
				t.Errorf("make demo-down (cleanup): %v\n%s", err, out)
			}
		}
	})

	start := time.Now()
	out, stderr, err := run(45*time.Minute, "make", "--no-print-directory", "demo")
	elapsed := time.Since(start)
	if err != nil {
		log, _ := os.ReadFile(filepath.Join(runDir, "controller.log"))
		t.Fatalf("make demo after %v: %v\n--- stdout\n%s\n--- stderr\n%s\n--- hosts\n%s\n--- controller log (tail)\n%s",
			elapsed.Round(time.Second), err, out, tail(stderr, 6000), hostStates(run, name), tail(string(log), 6000))
	}
	t.Logf("make demo: %v\n%s", elapsed.Round(time.Second), out)
	if m := regexp.MustCompile(`world ready after ([0-9]+)s`).FindStringSubmatch(stderr); m != nil {
		t.Logf("world ready after %ss", m[1])
	}

	t.Run("timeline", func(t *testing.T) {
		tl, err := ParseTimeline(out)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range CheckColdCycle(tl, 2) {
			t.Error(b)
		}
	})

	kubeconfig := "/run/kpssh-cp/" + name + "/admin.kubeconfig"
	kubectl := func(args ...string) []byte {
		t.Helper()
		o, e, err := run(time.Minute, "kubectl", append([]string{"--kubeconfig=" + kubeconfig, "--request-timeout=30s"}, args...)...)
		if err != nil {
			t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, e)
		}
		return []byte(o)
	}
	t.Run("role profile tls-bootstrap joined", func(t *testing.T) {
		if !strings.Contains(stderr, "applying the examples (join profile: tls-bootstrap)") {
			t.Errorf("the demo did not apply the role profile tls-bootstrap:\n%s", tail(stderr, 3000))
		}
		var nc v1beta1.SSHNodeClass
		if err := json.Unmarshal(kubectl("get", "sshnodeclass", "pool", "-o", "json"), &nc); err != nil {
			t.Fatal(err)
		}
		if got := nc.Spec.JoinProfileRef.Name; got != "tls-bootstrap" {
			t.Errorf("node class pool joins with %q, want tls-bootstrap", got)
		}
		var hosts v1beta1.SSHHostList
		if err := json.Unmarshal(kubectl("-n", "kpssh-system", "get", "sshhosts", "-o", "json"), &hosts); err != nil {
			t.Fatal(err)
		}
		tl, _ := ParseTimeline(out)
		var joined []string
		for _, h := range hosts.Items {
			st := h.Status
			if st.State != v1beta1.HostAvailable {
				t.Errorf("%s is %s after the cycle, want Available", h.Name, st.State)
			}
			if st.LastPhase != nil && st.LastPhase.Phase == v1beta1.PhaseLeave && st.LastPhase.Result != v1beta1.PhaseSucceeded {
				t.Errorf("%s: leave %s (%s)", h.Name, st.LastPhase.Result, st.LastPhase.Message)
			}
			if _, onTimeline := tl[h.Name]; !onTimeline {
				if st.InstalledProfile != "" {
					t.Errorf("%s is not on the timeline but has installed %q", h.Name, st.InstalledProfile)
				}
				continue
			}
			joined = append(joined, h.Name)
			if !strings.HasPrefix(st.InstalledProfile, "tls-bootstrap@") {
				t.Errorf("%s installed %q, want the role profile tls-bootstrap@…", h.Name, st.InstalledProfile)
			}
			if st.LastPhase == nil || st.LastPhase.Phase != v1beta1.PhaseLeave {
				t.Errorf("%s: last phase %+v, want leave", h.Name, st.LastPhase)
			}
		}
		sort.Strings(joined)
		if len(joined) != 2 {
			t.Errorf("joined and left: %v, want 2 hosts", joined)
		}
		for _, kind := range []string{"nodeclaims", "nodes"} {
			if o := strings.TrimSpace(string(kubectl("get", kind, "-o", "name"))); o != "" {
				t.Errorf("%s left after the cycle:\n%s", kind, o)
			}
		}
	})

	// What must be gone after down: the world (hosts.sh's inventory), the
	// plane's and the controller's processes, the state dirs.
	invJSON, e, err := run(time.Minute, "bash", "-c", "KPSSH_WORLD="+name+" hack/hosts.sh inventory")
	if err != nil {
		t.Fatalf("hosts.sh inventory: %v\n%s", err, e)
	}
	var inv hostenv.Inventory
	if err := json.Unmarshal([]byte(invJSON), &inv); err != nil {
		t.Fatalf("hosts.sh inventory: %v\n%s", err, invJSON)
	}
	if len(inv.Hosts) != 3 {
		t.Errorf("the demo world has %d hosts, want 3", len(inv.Hosts))
	}
	pids := recordedPIDs(t, runDir+"/controller.pid", "/run/kpssh-cp/"+name+"/*.pid")
	if len(pids) != 5 { // the controller, etcd, apiserver, controller-manager, scheduler
		t.Errorf("recorded processes %v, want the controller and 4 of the control plane", pids)
	}

	start = time.Now()
	dout, err := down()
	downed = true
	if err != nil {
		t.Fatalf("make demo-down: %v\n%s", err, dout)
	}
	t.Logf("make demo-down: %v\n%s", time.Since(start).Round(time.Millisecond), dout)

	t.Run("down leaves nothing", func(t *testing.T) {
		hostenv.AssertGone(t, inv)
		for pid, st := range pids {
			if startTime(pid) == st {
				t.Errorf("process %d (%s) still runs", pid, cmdline(pid))
			}
		}
		for _, d := range []string{runDir, "/run/kpssh-cp/" + name, "/run/kpssh-world/" + name} {
			if _, err := os.Stat(d); !os.IsNotExist(err) {
				t.Errorf("state dir %s left (%v)", d, err)
			}
		}
		// Processes: what the demo started inherits mark; the controller's
		// phase runs (a minimal environment) name or sit in their run
		// directory, kpssh-<controller pid>.<start>-…
		refs := []string{runDir + "/", "/run/kpssh-cp/" + name + "/"}
		for pid, st := range pids {
			refs = append(refs, fmt.Sprintf("/kpssh-%d.%s-", pid, st))
		}
		procs, _ := filepath.Glob("/proc/[0-9]*")
		for _, p := range procs {
			pid, _ := strconv.Atoi(filepath.Base(p))
			if pid == os.Getpid() {
				continue
			}
			if b, err := os.ReadFile(p + "/environ"); err == nil && strings.Contains(string(b), mark) {
				t.Errorf("process %d started by the demo still runs: %s", pid, cmdline(pid))
				continue
			}
			cwd, _ := os.Readlink(p + "/cwd")
			for _, r := range refs {
				if c := cmdline(pid); strings.Contains(c, r) || strings.Contains(cwd+"/", r) {
					t.Errorf("process %d of the demo still runs (cwd %s): %s", pid, cwd, c)
					break
				}
			}
		}
		// the controller's phase run directories (tmpfs; secrets)
		for pid, st := range pids {
			left, _ := filepath.Glob(fmt.Sprintf("/dev/shm/kpssh-%d.%s-*", pid, st))
			more, _ := filepath.Glob(fmt.Sprintf("/run/kpssh/kpssh-%d.%s-*", pid, st))
			if left = append(left, more...); len(left) > 0 {
				t.Errorf("run directories of pid %d left: %v", pid, left)
			}
		}
	})
}

// hostStates is the pool's state and last phases (why a cycle did not
// finish), or why it could not be read.
func hostStates(run func(time.Duration, string, ...string) (string, string, error), name string) string {
	o, e, err := run(time.Minute, "kubectl", "--kubeconfig=/run/kpssh-cp/"+name+"/admin.kubeconfig", "--request-timeout=30s",
		"-n", "kpssh-system", "get", "sshhosts", "-o", "json")
	if err != nil {
		return fmt.Sprintf("kubectl get sshhosts: %v %s", err, e)
	}
	var hosts v1beta1.SSHHostList
	if err := json.Unmarshal([]byte(o), &hosts); err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, h := range hosts.Items {
		fmt.Fprintf(&b, "%s %s", h.Name, h.Status.State)
		if lp := h.Status.LastPhase; lp != nil {
			fmt.Fprintf(&b, ": %s %s after %v (task %q) %s", lp.Phase, lp.Result, lp.Duration.Duration, lp.FailedTask, tail(lp.Message, 1000))
		}
		b.WriteString("\n")
	}
	return b.String()
}

// keepLogs copies the demo's logs (controller, control plane) to
// $KPSSH_E2E_LOGS/demo, when set, before make demo-down removes them.
func keepLogs(t *testing.T, dirs ...string) {
	d := os.Getenv("KPSSH_E2E_LOGS")
	if d == "" {
		return
	}
	d = filepath.Join(d, "demo")
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Error(err)
		return
	}
	for _, dir := range dirs {
		logs, _ := filepath.Glob(filepath.Join(dir, "*.log"))
		for _, f := range logs {
			if b, err := os.ReadFile(f); err == nil {
				_ = os.WriteFile(filepath.Join(d, filepath.Base(f)), b, 0o600)
			}
		}
	}
	t.Logf("logs kept in %s", d)
}

// recordedPIDs reads "PID START" files (the demo's and controlplane.sh's).
func recordedPIDs(t *testing.T, globs ...string) map[int]string {
	t.Helper()
	pids := map[int]string{}
	for _, g := range globs {
		files, _ := filepath.Glob(g)
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			var pid int
			var st string
			if _, err := fmt.Sscan(string(b), &pid, &st); err != nil {
				t.Fatalf("%s: %q: %v", f, b, err)
			}
			pids[pid] = st
		}
	}
	return pids
}

// startTime is field 22 of /proc/PID/stat, empty when the process is gone.
func startTime(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 20 || f[0] == "Z" {
		return ""
	}
	return f[19]
}

func cmdline(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}
