package phase_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/engine"
	"github.com/dklesev/kpssh/internal/providers/hostkey"
	"github.com/dklesev/kpssh/internal/providers/phase"
	"github.com/dklesev/kpssh/internal/providers/pool"
	"github.com/dklesev/kpssh/test/hostenv"
	"github.com/dklesev/kpssh/test/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { os.Exit(testenv.RunMain(m, &env)) }

// The install below waits at its second task until the test lets it go.
const (
	waitTask = "wait for the test's go-ahead"
	goFile   = "/tmp/kpssh-progress-go"
)

var installTasks = `- name: first task
  ansible.builtin.command: "true"
  changed_when: false
- name: ` + waitTask + `
  ansible.builtin.wait_for:
    path: ` + goFile + `
    timeout: 120
- name: last task
  ansible.builtin.command: "true"
`

// A running phase on a real host, through the real engine
// (ansible-playbook), recorded on the real API server: while install sits
// at a task, the host's status.lastPhase says install Running at that task
// (written by the pool's CAS under the claim); the caller's final write
// replaces it and nothing comes after; each task that ended is in the log
// at V(1).
func TestRunningPhaseShowsCurrentTask(t *testing.T) {
	if env == nil || testing.Short() {
		t.Skip("-short: needs envtest, an nspawn host and ansible-playbook")
	}
	w := hostenv.Up(t, 1)
	ctx := context.Background()
	ns := "phase-progress"
	key, err := os.ReadFile(w.Inventory().ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	hw := w.Host(0)
	h := &v1beta1.SSHHost{ObjectMeta: metav1.ObjectMeta{Name: "h1", Namespace: ns},
		Spec: v1beta1.SSHHostSpec{Address: hw.Address, Port: int32(hw.Port), User: hw.User,
			SSHKeySecretRef: v1beta1.LocalObjectReference{Name: "world-key"},
			Capacity:        corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("256Mi")}}}
	for _, o := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "world-key"}, Data: map[string][]byte{"privateKey": key}},
		h,
	} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	// Claimed, its key pinned (as the probe and a claim leave it).
	claim := pool.Claim{Name: "claim-1", UID: "uid-1"}
	orig := h.DeepCopy()
	h.Status.ClaimRef = &v1beta1.ClaimRef{Name: claim.Name, UID: claim.UID}
	h.Status.HostKeyFingerprint = hw.Fingerprint
	h.SetState(v1beta1.HostClaimed, "claimed by NodeClaim claim-1", metav1.Now())
	if err := env.Client.Status().Patch(ctx, h, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})); err != nil {
		t.Fatal(err)
	}

	coll, err := engine.FindCollectionsPath()
	if err != nil {
		t.Fatal(err)
	}
	eng, err := engine.New(engine.Options{CollectionsPath: coll})
	if err != nil {
		t.Fatal(err)
	}
	pl := pool.New(env.Client, env.Client, ns)
	r := phase.New(eng, hostkey.New(env.Client), nil)
	r.Status, r.ProgressInterval = pl, 500*time.Millisecond
	var mu sync.Mutex
	var logs []string
	lg := funcr.New(func(_, args string) { mu.Lock(); logs = append(logs, args); mu.Unlock() }, funcr.Options{Verbosity: 1})
	rctx := log.IntoContext(ctx, lg.WithValues("SSHHost", klog.KObj(h)))
	prof := &v1beta1.SSHJoinProfile{ObjectMeta: metav1.ObjectMeta{Name: "progress"}, Spec: v1beta1.SSHJoinProfileSpec{Version: "1",
		Ansible: &v1beta1.AnsibleSource{Tasks: &v1beta1.ProfileTasks{Install: v1beta1.TaskList(installTasks), Join: "- meta: noop\n", Leave: "- meta: noop\n"}}}}

	get := func() *v1beta1.SSHHost {
		t.Helper()
		x := &v1beta1.SSHHost{}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "h1"}, x); err != nil {
			t.Fatal(err)
		}
		return x
	}
	start := time.Now()
	done := make(chan phase.Outcome, 1)
	go func() { done <- r.Run(rctx, get(), prof, engine.PhaseInstall, engine.Context{NodeName: "h1"}, nil) }()

	// Running at the waiting task, seen through the API server.
	var running *v1beta1.LastPhase
	deadline := time.Now().Add(90 * time.Second)
	for running == nil {
		select {
		case out := <-done:
			t.Fatalf("install ended before the test let it go: %+v", out)
		default:
		}
		if lp := get().Status.LastPhase; lp != nil && lp.Result == v1beta1.PhaseRunning && lp.CurrentTask == waitTask {
			running = lp
		} else if time.Now().After(deadline) {
			t.Fatalf("lastPhase never showed install Running at %q: %+v", waitTask, lp)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if running.Phase != v1beta1.PhaseInstall || running.StartedAt.Time.Before(start.Truncate(time.Second)) || running.Duration.Duration <= 0 {
		t.Fatalf("running record %+v (started %s)", running, start)
	}
	t.Logf("while running: %+v, %s after the start", running, time.Since(start).Round(time.Millisecond))

	w.MustRun(0, "touch "+goFile)
	var out phase.Outcome
	select {
	case out = <-done:
	case <-time.After(2 * time.Minute):
		t.Fatal("install did not end after the go-ahead")
	}
	if !out.OK() {
		t.Fatalf("install %+v", out.Result)
	}
	// The caller's final write (create.go's, after install).
	if _, err := pl.Update(ctx, "h1", claim, func(x *v1beta1.SSHHost) {
		x.Status.InstalledProfile, x.Status.LastPhase = "progress@1", out.LastPhase
	}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(4 * r.ProgressInterval) // a late progress write would land here
	if lp := get().Status.LastPhase; lp == nil || lp.Result != v1beta1.PhaseSucceeded || lp.CurrentTask != "" || lp.Phase != v1beta1.PhaseInstall {
		t.Fatalf("lastPhase after the final write: %+v", lp)
	}

	mu.Lock()
	all := strings.Join(logs, "\n")
	mu.Unlock()
	for _, want := range []string{
		`"task"="first task" "status"="ok"`,
		fmt.Sprintf(`"task"=%q "status"="ok"`, waitTask),
		`"task"="last task" "status"="changed"`,
	} {
		if !strings.Contains(all, want) {
			t.Errorf("log lacks %s:\n%s", want, all)
		}
	}
	for _, l := range logs {
		if !strings.Contains(l, `"phase"="install"`) || strings.Count(l, `"SSHHost"=`) != 1 {
			t.Errorf("log line without its phase or with the host key other than once: %s", l)
		}
	}
}
