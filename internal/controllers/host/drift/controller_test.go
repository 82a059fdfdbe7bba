package drift

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/scheme"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/karpenter/pkg/events"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/cloudprovider"
	"github.com/dklesev/kpssh/internal/engine"
	"github.com/dklesev/kpssh/internal/providers/phase"
)

const ns = v1beta1.DefaultPoolNamespace

type recorder struct {
	mu  sync.Mutex
	evs []events.Event
}

func (r *recorder) Publish(evs ...events.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.evs = append(r.evs, evs...)
}

// fakeChecker answers checks in turn (the last one repeats).
type fakeChecker struct {
	answers []answer
	calls   int
}

type answer struct {
	d   phase.Drift
	err error
}

func (f *fakeChecker) CheckHostDrift(_ context.Context, nc *karpv1.NodeClaim) (phase.Drift, error) {
	a := f.answers[min(f.calls, len(f.answers)-1)]
	f.calls++
	return a.d, a.err
}

type world struct {
	c     client.Client
	ctrl  *Controller
	chk   *fakeChecker
	rec   *recorder
	clock *clocktesting.FakeClock
}

func claim() *karpv1.NodeClaim {
	return &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: "claim-a", UID: "uid-a"},
		Spec: karpv1.NodeClaimSpec{NodeClassRef: &karpv1.NodeClassReference{Group: v1beta1.Group, Kind: "SSHNodeClass", Name: "pool"}}}
}

func joined(mut ...func(*v1beta1.SSHHost)) *v1beta1.SSHHost {
	h := &v1beta1.SSHHost{ObjectMeta: metav1.ObjectMeta{Name: "h1", Namespace: ns, UID: "host-uid", Labels: map[string]string{v1beta1.LabelHostClass: "big"}},
		Status: v1beta1.SSHHostStatus{State: v1beta1.HostInUse, ClaimRef: &v1beta1.ClaimRef{Name: "claim-a", UID: "uid-a"},
			ProviderID: "kpssh://" + ns + "/h1", InstalledProfile: "prof@1"}}
	for _, m := range mut {
		m(h)
	}
	return h
}

func nodeClass(interval string) *v1beta1.SSHNodeClass {
	nc := &v1beta1.SSHNodeClass{ObjectMeta: metav1.ObjectMeta{Name: "pool"}, Spec: v1beta1.SSHNodeClassSpec{JoinProfileRef: v1beta1.ObjectReference{Name: "prof"}}}
	if interval != "" {
		nc.Spec.HostDrift = &v1beta1.HostDriftSpec{Interval: v1beta1.Duration(interval)}
	}
	return nc
}

func newWorld(t *testing.T, answers []answer, objs ...client.Object) *world {
	t.Helper()
	w := &world{chk: &fakeChecker{answers: answers}, rec: &recorder{},
		clock: clocktesting.NewFakeClock(time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC))}
	w.c = fake.NewClientBuilder().WithScheme(scheme.Scheme).WithStatusSubresource(&v1beta1.SSHHost{}).WithObjects(objs...).Build()
	w.ctrl = New(w.c, w.c, w.chk, w.rec, w.clock, ns)
	w.ctrl.Pool.Now = func() metav1.Time { return metav1.NewTime(w.clock.Now()) }
	return w
}

func (w *world) reconcile(t *testing.T) reconcile.Result {
	t.Helper()
	res, err := w.ctrl.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: "h1"}})
	if err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	return res
}

func (w *world) host(t *testing.T) *v1beta1.SSHHost {
	t.Helper()
	h := &v1beta1.SSHHost{}
	if err := w.c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "h1"}, h); err != nil {
		t.Fatal(err)
	}
	return h
}

func (w *world) nodeClaim(t *testing.T) *karpv1.NodeClaim {
	t.Helper()
	c := &karpv1.NodeClaim{}
	if err := w.c.Get(context.Background(), client.ObjectKey{Name: "claim-a"}, c); err != nil {
		t.Fatal(err)
	}
	return c
}

func condition(h *v1beta1.SSHHost) *metav1.Condition {
	for _, c := range h.Status.Conditions {
		if c.Type == v1beta1.ConditionHostDrift {
			return &metav1.Condition{Type: c.Type, Status: c.Status, Reason: c.Reason, Message: c.Message}
		}
	}
	return nil
}

var (
	inSync      = answer{d: phase.Drift{Result: v1beta1.DriftInSync, Duration: time.Second}}
	unreachable = answer{d: phase.Drift{Result: v1beta1.DriftUnreachable, Message: "check mode: install Failed: host unreachable; nothing ran"}}
	drifted     = answer{d: phase.Drift{Result: v1beta1.DriftDrifted, Changes: []engine.Change{
		{Task: "join: Write the node's credentials and kubelet configuration", Diff: "--- /var/lib/kubelet/config.yaml\n+++ /var/lib/kubelet/config.yaml\n-maxPods: 12\n+maxPods: 110"},
		{Task: "join: Enable and start containerd and kubelet", Censored: true},
	}}}
)

// A joined host is checked every interval: in sync, drifted (condition True
// with the tasks and diffs, an event, the metric), unreachable (counted as
// such; the drift verdict stands), in sync again (condition False).
func TestReconcileChecksEveryInterval(t *testing.T) {
	w := newWorld(t, []answer{inSync, drifted, unreachable, inSync}, joined(), claim(), nodeClass("5m"))
	before := testutil.ToFloat64(checksTotal.WithLabelValues("big", OutcomeDrifted))
	if res := w.reconcile(t); res.RequeueAfter != 5*time.Minute || w.chk.calls != 1 {
		t.Fatalf("first check: %+v, %d calls", res, w.chk.calls)
	}
	h := w.host(t)
	if d := h.Status.HostDrift; d == nil || d.LastResult != v1beta1.DriftInSync || d.ClaimUID != "uid-a" || d.Checks != 1 {
		t.Fatalf("status %+v", d)
	}
	if v, ok := w.nodeClaim(t).Annotations[v1beta1.AnnotationHostDrift]; ok {
		t.Fatalf("in sync from the start: NodeClaim annotated %q", v)
	}
	if c := condition(h); c == nil || c.Status != metav1.ConditionFalse || h.HostDrifted() {
		t.Fatalf("condition %+v", c)
	}
	// not due yet: nothing runs, the rest of the interval is waited
	w.clock.Step(2 * time.Minute)
	if res := w.reconcile(t); res.RequeueAfter != 3*time.Minute || w.chk.calls != 1 {
		t.Fatalf("not due: %+v, %d calls", res, w.chk.calls)
	}
	w.clock.Step(3 * time.Minute)
	w.reconcile(t)
	h = w.host(t)
	c := condition(h)
	if !h.HostDrifted() || c.Reason != v1beta1.ReasonDriftDetected || h.Status.HostDrift.Checks != 2 {
		t.Fatalf("drift not recorded: %+v %+v", c, h.Status.HostDrift)
	}
	for _, want := range []string{"2 task(s) would change the host", "- join: Write the node's credentials and kubelet configuration\n  --- /var/lib/kubelet/config.yaml", "  +maxPods: 110", "Enable and start containerd and kubelet (no_log: diff hidden)"} {
		if !strings.Contains(c.Message, want) {
			t.Errorf("condition lacks %q:\n%s", want, c.Message)
		}
	}
	if got := h.Status.HostDrift.ChangedTasks; len(got) != 2 {
		t.Fatalf("changedTasks %v", got)
	}
	// the verdict's change is written on the NodeClaim: it wakes Karpenter's drift check
	if v := w.nodeClaim(t).Annotations[v1beta1.AnnotationHostDrift]; v != "true" {
		t.Fatalf("NodeClaim annotation %q after drift", v)
	}
	if len(w.rec.evs) != 1 || w.rec.evs[0].Reason != ReasonHostDrift || !strings.Contains(w.rec.evs[0].Message, "Karpenter replaces NodeClaim claim-a") {
		t.Fatalf("events %+v", w.rec.evs)
	}
	if after := testutil.ToFloat64(checksTotal.WithLabelValues("big", OutcomeDrifted)); after != before+1 {
		t.Fatalf("kpssh_host_drift_checks_total{drifted} %v → %v", before, after)
	}
	// unreachable: not drift, but not in sync either — the verdict stands
	w.clock.Step(5 * time.Minute)
	w.reconcile(t)
	h = w.host(t)
	if !h.HostDrifted() || h.Status.HostDrift.LastResult != v1beta1.DriftUnreachable || len(h.Status.HostDrift.ChangedTasks) != 2 ||
		!strings.Contains(h.Status.HostDrift.Message, "unreachable") {
		t.Fatalf("after unreachable: drifted %t %+v", h.HostDrifted(), h.Status.HostDrift)
	}
	if ev := w.rec.evs[len(w.rec.evs)-1]; ev.Reason != ReasonDriftCheckInconclusive || !strings.Contains(ev.Message, "Unreachable (not drift)") {
		t.Fatalf("event %+v", ev)
	}
	w.clock.Step(5 * time.Minute)
	w.reconcile(t)
	h = w.host(t)
	if h.HostDrifted() || condition(h).Status != metav1.ConditionFalse || h.Status.HostDrift.ChangedTasks != nil || h.Status.HostDrift.Checks != 4 {
		t.Fatalf("in sync again: %+v %+v", condition(h), h.Status.HostDrift)
	}
	if v := w.nodeClaim(t).Annotations[v1beta1.AnnotationHostDrift]; v != "false" {
		t.Fatalf("NodeClaim annotation %q in sync again", v)
	}
}

// An unreachable host that has not drifted is Unknown, never drifted; an
// event says so once, not every interval.
func TestUnreachableIsNotDrift(t *testing.T) {
	w := newWorld(t, []answer{unreachable, unreachable, unreachable, drifted, drifted}, joined(), claim(), nodeClass("1m"))
	w.reconcile(t)
	h := w.host(t)
	if h.HostDrifted() || condition(h).Status != metav1.ConditionUnknown || condition(h).Reason != v1beta1.ReasonDriftUnknown {
		t.Fatalf("%+v", condition(h))
	}
	for i := 0; i < 4; i++ {
		w.clock.Step(time.Minute)
		w.reconcile(t)
	}
	var reasons []string
	for _, e := range w.rec.evs {
		reasons = append(reasons, e.Reason)
	}
	if strings.Join(reasons, ",") != ReasonDriftCheckInconclusive+","+ReasonHostDrift {
		t.Fatalf("events %v: want one per change of news", reasons)
	}
}

func TestReconcileSkips(t *testing.T) {
	for _, tc := range []struct {
		name string
		host *v1beta1.SSHHost
		objs []client.Object
	}{
		{"hostDrift off", joined(), []client.Object{claim(), nodeClass("")}},
		{"claimed, not joined", joined(func(h *v1beta1.SSHHost) { h.Status.State, h.Status.ProviderID = v1beta1.HostClaimed, "" }), []client.Object{claim(), nodeClass("1m")}},
		{"unclaimed", joined(func(h *v1beta1.SSHHost) { h.Status.ClaimRef, h.Status.State = nil, v1beta1.HostAvailable }), []client.Object{nodeClass("1m")}},
		{"NodeClaim gone", joined(), []client.Object{nodeClass("1m")}},
		{"NodeClaim of the same name, another object", joined(), []client.Object{nodeClass("1m"), func() client.Object { c := claim(); c.UID = "other"; return c }()}},
		{"rebooting", joined(func(h *v1beta1.SSHHost) {
			h.Status.Reboot = &v1beta1.HostReboot{OperationID: "op", ClaimUID: "uid-a", Result: v1beta1.RebootIssued}
		}), []client.Object{claim(), nodeClass("1m")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, []answer{drifted}, append(tc.objs, tc.host)...)
			w.reconcile(t)
			if w.chk.calls != 0 || w.host(t).Status.HostDrift != nil {
				t.Fatalf("checked: %d calls, status %+v", w.chk.calls, w.host(t).Status.HostDrift)
			}
		})
	}
}

// Turning hostDrift off drops the record and its verdict; a record of an
// earlier claim is no reason to wait.
func TestReconcileOffClearsAndNewClaimChecksNow(t *testing.T) {
	old := joined(func(h *v1beta1.SSHHost) {
		h.SetHostDrift(&v1beta1.HostDriftStatus{ClaimUID: "uid-a", LastResult: v1beta1.DriftDrifted, LastCheckTime: metav1.Now()}, "x", metav1.Now())
	})
	w := newWorld(t, []answer{inSync}, old, claim(), nodeClass(""))
	w.reconcile(t)
	if h := w.host(t); h.Status.HostDrift != nil || condition(h) != nil {
		t.Fatalf("not cleared: %+v %+v", h.Status.HostDrift, condition(h))
	}
	other := joined(func(h *v1beta1.SSHHost) {
		h.SetHostDrift(&v1beta1.HostDriftStatus{ClaimUID: "uid-old", LastResult: v1beta1.DriftDrifted, LastCheckTime: metav1.NewTime(time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC))}, "x", metav1.Now())
	})
	w = newWorld(t, []answer{inSync}, other, claim(), nodeClass("1h"))
	w.reconcile(t)
	if h := w.host(t); w.chk.calls != 1 || h.Status.HostDrift.ClaimUID != "uid-a" || h.Status.HostDrift.Checks != 1 || h.HostDrifted() {
		t.Fatalf("new claim: %d calls %+v", w.chk.calls, h.Status.HostDrift)
	}
}

// A phase holding the host defers the check (soon, not an interval);
// a host not checkable now waits an interval; neither writes anything.
func TestReconcileBusyAndNotCheckable(t *testing.T) {
	w := newWorld(t, []answer{{err: cloudprovider.ErrHostBusy}}, joined(), claim(), nodeClass("10m"))
	if res := w.reconcile(t); res.RequeueAfter != DefaultBusyRetry || w.host(t).Status.HostDrift != nil {
		t.Fatalf("busy: %+v", res)
	}
	w = newWorld(t, []answer{{err: errors.Join(cloudprovider.ErrNotCheckable, errors.New("ProfileDrift"))}}, joined(), claim(), nodeClass("10m"))
	if res := w.reconcile(t); res.RequeueAfter != 10*time.Minute || w.host(t).Status.HostDrift != nil {
		t.Fatalf("not checkable: %+v", res)
	}
	w = newWorld(t, []answer{{err: errors.New("apiserver down")}}, joined(), claim(), nodeClass("10m"))
	if _, err := w.ctrl.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: "h1"}}); err == nil {
		t.Fatal("an API error is not returned")
	}
}

// The condition is bounded however many tasks and diffs a check finds.
func TestConditionBounded(t *testing.T) {
	var chs []engine.Change
	for i := 0; i < engine.MaxChanges; i++ {
		chs = append(chs, engine.Change{Task: strings.Repeat("t", 300), Diff: strings.Repeat("d", engine.MaxDiff)})
	}
	w := newWorld(t, []answer{{d: phase.Drift{Result: v1beta1.DriftDrifted, Changes: chs}}}, joined(), claim(), nodeClass("1m"))
	w.reconcile(t)
	h := w.host(t)
	if c := condition(h); len(c.Message) > 8192 || !strings.HasSuffix(c.Message, "…") {
		t.Fatalf("condition message %d bytes", len(c.Message))
	}
	if d := h.Status.HostDrift; len(d.ChangedTasks) != 16 || len(d.ChangedTasks[0]) != 256 {
		t.Fatalf("changedTasks %d, first %d bytes", len(d.ChangedTasks), len(d.ChangedTasks[0]))
	}
}
