package nodeclass

import (
	"context"
	"errors"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/scheme"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/karpenter/pkg/events"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/engine"
	"github.com/dklesev/kpssh/internal/envelope"
	"github.com/dklesev/kpssh/internal/profile"
)

const ns = v1beta1.DefaultPoolNamespace

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

type recorder struct {
	mu     sync.Mutex
	events []events.Event
}

func (r *recorder) Publish(evs ...events.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, evs...)
}

func (r *recorder) reasons() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, e := range r.events {
		out = append(out, e.Reason)
	}
	return out
}

type roles map[engine.Phase]error

func (r roles) ValidateRole(_ string, p engine.Phase) error { return r[p] }

// writes counts every mutating call the controller makes.
type writes struct {
	mu                   sync.Mutex
	patches, statusPatch int
	creates, updates     int
}

func (w *writes) total() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.patches + w.statusPatch + w.creates + w.updates
}

type harness struct {
	c     *Controller
	cl    client.Client
	rec   *recorder
	w     *writes
	clock *clocktesting.FakeClock
}

// newHarness builds the controller over a fake client. fail, when set, may
// return an error for a call (by verb) before it reaches the fake.
func newHarness(t *testing.T, rv roles, fail func(verb string, o client.Object) error, objs ...client.Object) *harness {
	t.Helper()
	w := &writes{}
	check := func(verb string, o client.Object) error {
		if fail != nil {
			return fail(verb, o)
		}
		return nil
	}
	cl := fake.NewClientBuilder().WithScheme(scheme.Scheme).
		WithStatusSubresource(&v1beta1.SSHNodeClass{}, &v1beta1.SSHHost{}, &karpv1.NodeClaim{}).
		WithObjects(objs...).
		WithInterceptorFuncs(interceptor.Funcs{
			Get: func(ctx context.Context, c client.WithWatch, k client.ObjectKey, o client.Object, opts ...client.GetOption) error {
				if err := check("get", o); err != nil {
					return err
				}
				return c.Get(ctx, k, o, opts...)
			},
			Patch: func(ctx context.Context, c client.WithWatch, o client.Object, p client.Patch, opts ...client.PatchOption) error {
				w.mu.Lock()
				w.patches++
				w.mu.Unlock()
				if err := check("patch", o); err != nil {
					return err
				}
				return c.Patch(ctx, o, p, opts...)
			},
			SubResourcePatch: func(ctx context.Context, c client.Client, sub string, o client.Object, p client.Patch, opts ...client.SubResourcePatchOption) error {
				w.mu.Lock()
				w.statusPatch++
				w.mu.Unlock()
				if err := check("statuspatch", o); err != nil {
					return err
				}
				return c.SubResource(sub).Patch(ctx, o, p, opts...)
			},
			Create: func(ctx context.Context, c client.WithWatch, o client.Object, opts ...client.CreateOption) error {
				w.mu.Lock()
				w.creates++
				w.mu.Unlock()
				return c.Create(ctx, o, opts...)
			},
			Update: func(ctx context.Context, c client.WithWatch, o client.Object, opts ...client.UpdateOption) error {
				w.mu.Lock()
				w.updates++
				w.mu.Unlock()
				return c.Update(ctx, o, opts...)
			},
		}).Build()
	clk := clocktesting.NewFakeClock(t0)
	var rvv profile.RoleValidator
	if rv != nil {
		rvv = rv
	}
	c := New(cl, rvv, ns, clk)
	rec := &recorder{}
	c.Recorder = rec
	return &harness{c: c, cl: cl, rec: rec, w: w, clock: clk}
}

func (h *harness) reconcile(t *testing.T, name string) (reconcile.Result, error) {
	t.Helper()
	return h.c.Reconcile(context.Background(), reconcile.Request{NamespacedName: client.ObjectKey{Name: name}})
}

func (h *harness) mustReconcile(t *testing.T, name string) reconcile.Result {
	t.Helper()
	res, err := h.reconcile(t, name)
	if err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	return res
}

func (h *harness) get(t *testing.T, name string) *v1beta1.SSHNodeClass {
	t.Helper()
	nc := &v1beta1.SSHNodeClass{}
	if err := h.cl.Get(context.Background(), client.ObjectKey{Name: name}, nc); err != nil {
		t.Fatal(err)
	}
	return nc
}

func class(name, prof string, mut ...func(*v1beta1.SSHNodeClass)) *v1beta1.SSHNodeClass {
	nc := &v1beta1.SSHNodeClass{ObjectMeta: metav1.ObjectMeta{Name: name, Generation: 1, UID: types.UID("uid-" + name)},
		Spec: v1beta1.SSHNodeClassSpec{JoinProfileRef: v1beta1.ObjectReference{Name: prof}}}
	for _, m := range mut {
		m(nc)
	}
	return nc
}

func selector(s *metav1.LabelSelector) func(*v1beta1.SSHNodeClass) {
	return func(nc *v1beta1.SSHNodeClass) { nc.Spec.HostSelector = s }
}

func scriptProfile(name, leave string) *v1beta1.SSHJoinProfile {
	return &v1beta1.SSHJoinProfile{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1beta1.SSHJoinProfileSpec{Version: "1",
		Scripts: &v1beta1.ProfileScripts{Install: "echo install", Join: "echo join {{ .Vars.k8sMinor }}", Leave: v1beta1.Script(leave)}}}
}

func timedProfile(name string, install, join v1beta1.Duration) *v1beta1.SSHJoinProfile {
	p := scriptProfile(name, goodLeave)
	p.Spec.Timeouts = v1beta1.PhaseTimeouts{Install: install, Join: join}
	return p
}

func roleProfile(name string) *v1beta1.SSHJoinProfile {
	return &v1beta1.SSHJoinProfile{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1beta1.SSHJoinProfileSpec{Version: "1",
		Ansible: &v1beta1.AnsibleSource{Role: "tls_bootstrap"}}}
}

func host(name, namespace string, labels map[string]string) *v1beta1.SSHHost {
	return &v1beta1.SSHHost{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: labels},
		Spec: v1beta1.SSHHostSpec{Address: "10.0.0.1", SSHKeySecretRef: v1beta1.LocalObjectReference{Name: "k"},
			Capacity: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("1Gi")}}}
}

func claim(name, group, kind, class string) *karpv1.NodeClaim {
	return &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: karpv1.NodeClaimSpec{NodeClassRef: &karpv1.NodeClassReference{Group: group, Kind: kind, Name: class}}}
}

func ready(nc *v1beta1.SSHNodeClass) (metav1.ConditionStatus, string, string) {
	c := readyCondition(nc)
	if c == nil {
		return "", "", ""
	}
	return c.Status, c.Reason, c.Message
}

const goodLeave = "systemctl disable --now kubelet containerd # {{ .HostAddress }}"

func TestReadiness(t *testing.T) {
	cases := []struct {
		name       string
		objs       []client.Object
		roles      roles
		wantStatus metav1.ConditionStatus
		wantReason string
		wantMsg    string // substring
	}{
		{name: "profile missing", objs: []client.Object{class("c", "nope"), host("h1", ns, nil)},
			wantStatus: metav1.ConditionFalse, wantReason: ReasonProfileNotFound, wantMsg: `"nope" not found`},
		{name: "leave uses vars", objs: []client.Object{class("c", "p"), scriptProfile("p", "echo {{ .Vars.clusterName }}"), host("h1", ns, nil)},
			wantStatus: metav1.ConditionFalse, wantReason: ReasonProfileInvalid, wantMsg: "leave script references .Vars"},
		{name: "leave uses secrets", objs: []client.Object{class("c", "p"), scriptProfile("p", "echo {{ .Secrets.token }}"), host("h1", ns, nil)},
			wantStatus: metav1.ConditionFalse, wantReason: ReasonProfileInvalid, wantMsg: "leave"},
		{name: "check script does not parse", objs: []client.Object{class("c", "p"), func() client.Object {
			p := scriptProfile("p", goodLeave)
			p.Spec.Scripts.Check = "test -f {{ .Vars.x"
			return p
		}(), host("h1", ns, nil)},
			wantStatus: metav1.ConditionFalse, wantReason: ReasonProfileInvalid, wantMsg: "check"},
		{name: "role without leave", objs: []client.Object{class("c", "p"), roleProfile("p"), host("h1", ns, nil)},
			roles:      roles{engine.PhaseLeave: errors.New("role tls_bootstrap has no tasks/leave.yml")},
			wantStatus: metav1.ConditionFalse, wantReason: ReasonProfileInvalid, wantMsg: "leave"},
		{name: "role resolves", objs: []client.Object{class("c", "p"), roleProfile("p"), host("h1", ns, nil)},
			roles:      roles{engine.PhaseVerify: &engine.NoRolePhaseError{Role: "tls_bootstrap", Phase: engine.PhaseVerify}},
			wantStatus: metav1.ConditionTrue, wantReason: ReasonReady},
		// A role with tasks/verify.yml: verify runs in the registration
		// window too, and the default install + join leave it no room.
		{name: "role with verify.yml, default timeouts", objs: []client.Object{class("c", "p"), roleProfile("p"), host("h1", ns, nil)}, roles: roles{},
			wantStatus: metav1.ConditionFalse, wantReason: ReasonTimeoutsExceedRegistration, wantMsg: "install 10m + join 5m + verify 2m = 17m"},
		{name: "bad selector operator", objs: []client.Object{scriptProfile("p", goodLeave), host("h1", ns, nil),
			class("c", "p", selector(&metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "a", Operator: "Near"}}}))},
			wantStatus: metav1.ConditionFalse, wantReason: ReasonSelectorError, wantMsg: "hostSelector"},
		{name: "bad selector key", objs: []client.Object{scriptProfile("p", goodLeave), host("h1", ns, nil),
			class("c", "p", selector(&metav1.LabelSelector{MatchLabels: map[string]string{"not a key!": "x"}}))},
			wantStatus: metav1.ConditionFalse, wantReason: ReasonSelectorError, wantMsg: "hostSelector"},
		{name: "no hosts at all", objs: []client.Object{class("c", "p"), scriptProfile("p", goodLeave)},
			wantStatus: metav1.ConditionFalse, wantReason: ReasonNoHosts, wantMsg: "namespace " + ns},
		{name: "hosts only in another namespace", objs: []client.Object{class("c", "p"), scriptProfile("p", goodLeave), host("h1", "elsewhere", nil)},
			wantStatus: metav1.ConditionFalse, wantReason: ReasonNoHosts},
		{name: "selector matches nothing", objs: []client.Object{scriptProfile("p", goodLeave), host("h1", ns, map[string]string{v1beta1.LabelHostClass: "arm"}),
			class("c", "p", selector(&metav1.LabelSelector{MatchLabels: map[string]string{v1beta1.LabelHostClass: "x86"}}))},
			wantStatus: metav1.ConditionFalse, wantReason: ReasonNoHosts},
		{name: "selector matches", objs: []client.Object{scriptProfile("p", goodLeave), host("h1", ns, map[string]string{v1beta1.LabelHostClass: "arm"}),
			class("c", "p", selector(&metav1.LabelSelector{MatchLabels: map[string]string{v1beta1.LabelHostClass: "arm"}}))},
			wantStatus: metav1.ConditionTrue, wantReason: ReasonReady},
		{name: "empty selector selects all", objs: []client.Object{scriptProfile("p", goodLeave), host("h1", ns, nil), class("c", "p", selector(&metav1.LabelSelector{}))},
			wantStatus: metav1.ConditionTrue, wantReason: ReasonReady},
		// Karpenter deletes a NodeClaim not registered 15 min after it was created
		{name: "install + join exceed the registration window", objs: []client.Object{class("c", "p"), timedProfile("p", "12m", "5m"), host("h1", ns, nil)},
			wantStatus: metav1.ConditionFalse, wantReason: ReasonTimeoutsExceedRegistration,
			wantMsg: "install 12m + join 5m = 17m exceeds Karpenter's registration window of 15m"},
		{name: "hours count", objs: []client.Object{class("c", "p"), timedProfile("p", "1h", "30s"), host("h1", ns, nil)},
			wantStatus: metav1.ConditionFalse, wantReason: ReasonTimeoutsExceedRegistration, wantMsg: "install 1h + join 30s = 1h0m30s"},
		{name: "install + join fill the window exactly", objs: []client.Object{class("c", "p"), timedProfile("p", "10m", "5m"), host("h1", ns, nil)},
			wantStatus: metav1.ConditionTrue, wantReason: ReasonReady},
		{name: "unset timeouts are the defaults 10m + 5m", objs: []client.Object{class("c", "p"), timedProfile("p", "", ""), host("h1", ns, nil)},
			wantStatus: metav1.ConditionTrue, wantReason: ReasonReady},
		{name: "unset install default counts", objs: []client.Object{class("c", "p"), timedProfile("p", "", "6m"), host("h1", ns, nil)},
			wantStatus: metav1.ConditionFalse, wantReason: ReasonTimeoutsExceedRegistration, wantMsg: "install 10m + join 6m = 16m"},
		{name: "invalid profile before its timeouts", objs: []client.Object{class("c", "p"), host("h1", ns, nil),
			func() client.Object {
				p := timedProfile("p", "20m", "5m")
				p.Spec.Scripts.Leave = "echo {{ .Vars.x }}"
				return p
			}()},
			wantStatus: metav1.ConditionFalse, wantReason: ReasonProfileInvalid},
		// the first problem wins, in the order a user fixes them
		{name: "missing profile before bad selector", objs: []client.Object{class("c", "nope", selector(&metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "a", Operator: "Near"}}}))},
			wantStatus: metav1.ConditionFalse, wantReason: ReasonProfileNotFound},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, tc.roles, nil, tc.objs...)
			// watches wake the class; role profiles are also re-checked
			// (their content is files no watch reports)
			want := reconcile.Result{}
			for _, o := range tc.objs {
				if p, ok := o.(*v1beta1.SSHJoinProfile); ok && p.Spec.Ansible != nil && tc.roles != nil {
					want.RequeueAfter = DefaultContentRecheck
				}
			}
			if res := h.mustReconcile(t, "c"); res != want {
				t.Errorf("result = %+v, want %+v", res, want)
			}
			nc := h.get(t, "c")
			st, reason, msg := ready(nc)
			if st != tc.wantStatus || reason != tc.wantReason || !strings.Contains(msg, tc.wantMsg) {
				t.Fatalf("Ready = %s/%s %q; want %s/%s containing %q", st, reason, msg, tc.wantStatus, tc.wantReason, tc.wantMsg)
			}
			if c := readyCondition(nc); c.ObservedGeneration != 1 || !c.LastTransitionTime.Time.Equal(t0) {
				t.Errorf("condition = %+v; want observedGeneration 1 and lastTransitionTime from the clock", c)
			}
			if !reflect.DeepEqual(nc.Finalizers, []string{v1beta1.TerminationFinalizer}) {
				t.Errorf("finalizers = %v", nc.Finalizers)
			}
			var wantEvents []string
			if tc.wantStatus == metav1.ConditionFalse {
				wantEvents = []string{tc.wantReason}
			}
			if got := h.rec.reasons(); !reflect.DeepEqual(got, wantEvents) {
				t.Errorf("events = %v, want %v", got, wantEvents)
			}
			// a second pass changes nothing and writes nothing
			before := h.w.total()
			h.mustReconcile(t, "c")
			if n := h.w.total() - before; n != 0 {
				t.Errorf("unchanged class: %d writes, want 0", n)
			}
			if got := h.rec.reasons(); len(got) != len(wantEvents) {
				t.Errorf("events after an unchanged pass = %v", got)
			}
		})
	}
}

// TestTransitions walks one class through the lifecycle a user sees and
// checks what each step writes and publishes.
func TestTransitions(t *testing.T) {
	h := newHarness(t, nil, nil, class("c", "p"), host("h1", ns, nil))
	ctx := context.Background()
	step := func(name string, wantStatus metav1.ConditionStatus, wantReason string, wantEvents []string) *v1beta1.SSHNodeClass {
		t.Helper()
		h.clock.Step(time.Minute)
		h.mustReconcile(t, "c")
		nc := h.get(t, "c")
		if st, r, m := ready(nc); st != wantStatus || r != wantReason {
			t.Fatalf("%s: Ready = %s/%s %q; want %s/%s", name, st, r, m, wantStatus, wantReason)
		}
		if got := h.rec.reasons(); !reflect.DeepEqual(got, wantEvents) {
			t.Fatalf("%s: events = %v, want %v", name, got, wantEvents)
		}
		return nc
	}

	nc := step("no profile", metav1.ConditionFalse, ReasonProfileNotFound, []string{ReasonProfileNotFound})
	notFoundAt := readyCondition(nc).LastTransitionTime

	// an invalid profile appears: still False, a new reason, a new event, same transition time
	if err := h.cl.Create(ctx, scriptProfile("p", "echo {{ .Vars.x }}")); err != nil {
		t.Fatal(err)
	}
	nc = step("invalid profile", metav1.ConditionFalse, ReasonProfileInvalid, []string{ReasonProfileNotFound, ReasonProfileInvalid})
	if got := readyCondition(nc).LastTransitionTime; !got.Equal(&notFoundAt) {
		t.Errorf("lastTransitionTime moved on a False→False change: %v → %v", notFoundAt, got)
	}

	// fixed: Ready, no event, transition time moves
	p := &v1beta1.SSHJoinProfile{}
	if err := h.cl.Get(ctx, client.ObjectKey{Name: "p"}, p); err != nil {
		t.Fatal(err)
	}
	p.Spec.Scripts.Leave = goodLeave
	if err := h.cl.Update(ctx, p); err != nil {
		t.Fatal(err)
	}
	nc = step("fixed", metav1.ConditionTrue, ReasonReady, []string{ReasonProfileNotFound, ReasonProfileInvalid})
	if got := readyCondition(nc).LastTransitionTime; !got.Time.Equal(t0.Add(3 * time.Minute)) {
		t.Errorf("lastTransitionTime = %v, want the clock at the transition", got)
	}

	// the last host goes: NoHosts
	if err := h.cl.Delete(ctx, host("h1", ns, nil)); err != nil {
		t.Fatal(err)
	}
	step("host gone", metav1.ConditionFalse, ReasonNoHosts, []string{ReasonProfileNotFound, ReasonProfileInvalid, ReasonNoHosts})

	// a spec edit bumps the generation: observedGeneration follows, even with nothing else changed
	nc = h.get(t, "c")
	nc.Generation = 2 // the fake client does not bump it
	nc.Spec.Vars = v1beta1.Vars{"k8sMinor": "1.34"}
	if err := h.cl.Update(ctx, nc); err != nil {
		t.Fatal(err)
	}
	nc = step("generation bump", metav1.ConditionFalse, ReasonNoHosts, []string{ReasonProfileNotFound, ReasonProfileInvalid, ReasonNoHosts})
	if g := readyCondition(nc).ObservedGeneration; g != 2 {
		t.Errorf("observedGeneration = %d, want 2", g)
	}
}

func TestFinalizer(t *testing.T) {
	deleting := func(nc *v1beta1.SSHNodeClass) {
		now := metav1.NewTime(t0)
		nc.DeletionTimestamp = &now
		nc.Finalizers = []string{v1beta1.TerminationFinalizer}
	}
	cases := []struct {
		name        string
		objs        []client.Object
		wantGone    bool
		wantRequeue time.Duration
		wantEvents  []string
	}{
		{name: "no claims: removed", objs: []client.Object{class("c", "p", deleting)}, wantGone: true},
		{name: "referenced: kept", objs: []client.Object{class("c", "p", deleting), claim("nc-1", v1beta1.Group, Kind, "c")},
			wantRequeue: DefaultBlockedRequeue, wantEvents: []string{ReasonWaitingOnNodeClaims}},
		{name: "terminating claim still holds it", objs: []client.Object{class("c", "p", deleting), func() client.Object {
			cl := claim("nc-1", v1beta1.Group, Kind, "c")
			now := metav1.NewTime(t0)
			cl.DeletionTimestamp, cl.Finalizers = &now, []string{karpv1.TerminationFinalizer}
			return cl
		}()}, wantRequeue: DefaultBlockedRequeue, wantEvents: []string{ReasonWaitingOnNodeClaims}},
		{name: "claims of other classes and providers do not hold it", objs: []client.Object{class("c", "p", deleting),
			claim("other-class", v1beta1.Group, Kind, "d"),
			claim("other-kind", v1beta1.Group, "EC2NodeClass", "c"),
			claim("other-group", "karpenter.k8s.aws", Kind, "c")}, wantGone: true},
		{name: "foreign finalizer stays", objs: []client.Object{class("c", "p", deleting, func(nc *v1beta1.SSHNodeClass) {
			nc.Finalizers = append(nc.Finalizers, "example.com/other")
		})}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, nil, nil, tc.objs...)
			res := h.mustReconcile(t, "c")
			if res.RequeueAfter != tc.wantRequeue {
				t.Errorf("RequeueAfter = %v, want %v", res.RequeueAfter, tc.wantRequeue)
			}
			nc := &v1beta1.SSHNodeClass{}
			err := h.cl.Get(context.Background(), client.ObjectKey{Name: "c"}, nc)
			if tc.wantGone {
				if !apierrors.IsNotFound(err) {
					t.Fatalf("class still there (err=%v, finalizers=%v)", err, nc.Finalizers)
				}
			} else {
				if err != nil {
					t.Fatal(err)
				}
				wantFin := tc.wantRequeue != 0
				if has := contains(nc.Finalizers, v1beta1.TerminationFinalizer); has != wantFin {
					t.Errorf("finalizers = %v, want ours present=%v", nc.Finalizers, wantFin)
				}
			}
			if got := h.rec.reasons(); !reflect.DeepEqual(got, tc.wantEvents) {
				t.Errorf("events = %v, want %v", got, tc.wantEvents)
			}
			// deletion never touches the status
			if h.w.statusPatch != 0 {
				t.Errorf("%d status writes during deletion", h.w.statusPatch)
			}
		})
	}
}

// TestFinalizerReleasedWhenClaimGoes: the class held by a claim is released
// by the reconcile after the claim is deleted.
func TestFinalizerReleasedWhenClaimGoes(t *testing.T) {
	now := metav1.NewTime(t0)
	nc := class("c", "p", func(nc *v1beta1.SSHNodeClass) {
		nc.DeletionTimestamp, nc.Finalizers = &now, []string{v1beta1.TerminationFinalizer}
	})
	cl := claim("nc-1", v1beta1.Group, Kind, "c")
	h := newHarness(t, nil, nil, nc, cl)
	if res := h.mustReconcile(t, "c"); res.RequeueAfter == 0 {
		t.Fatal("not held by the claim")
	}
	if err := h.cl.Delete(context.Background(), cl); err != nil {
		t.Fatal(err)
	}
	if res := h.mustReconcile(t, "c"); res != (reconcile.Result{}) {
		t.Fatalf("result = %+v after the claim went", res)
	}
	if err := h.cl.Get(context.Background(), client.ObjectKey{Name: "c"}, &v1beta1.SSHNodeClass{}); !apierrors.IsNotFound(err) {
		t.Fatalf("class not released: %v", err)
	}
	// a reconcile of the vanished class is a no-op
	if _, err := h.reconcile(t, "c"); err != nil {
		t.Fatal(err)
	}
}

func TestErrors(t *testing.T) {
	conflict := apierrors.NewConflict(schema.GroupResource{Group: v1beta1.Group, Resource: "sshnodeclasses"}, "c", errors.New("stale"))
	boom := errors.New("apiserver unavailable")
	cases := []struct {
		name        string
		fail        func(verb string, o client.Object) error
		wantErr     bool
		wantRequeue bool
		wantStatus  metav1.ConditionStatus // "" = no condition written
	}{
		{name: "status conflict requeues", fail: func(v string, _ client.Object) error {
			if v == "statuspatch" {
				return conflict
			}
			return nil
		}, wantRequeue: true},
		{name: "finalizer conflict requeues", fail: func(v string, _ client.Object) error {
			if v == "patch" {
				return conflict
			}
			return nil
		}, wantRequeue: true},
		{name: "profile read error is not ProfileNotFound", fail: func(v string, o client.Object) error {
			if _, ok := o.(*v1beta1.SSHJoinProfile); ok && v == "get" {
				return boom
			}
			return nil
		}, wantErr: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, nil, tc.fail, class("c", "p"), scriptProfile("p", goodLeave), host("h1", ns, nil))
			res, err := h.reconcile(t, "c")
			if (err != nil) != tc.wantErr || res.Requeue != tc.wantRequeue { //nolint:staticcheck // Requeue is what the host controller uses too
				t.Fatalf("Reconcile = %+v, %v; want error=%v requeue=%v", res, err, tc.wantErr, tc.wantRequeue)
			}
			if st, _, _ := ready(h.get(t, "c")); st != tc.wantStatus {
				t.Errorf("Ready = %q, want %q (nothing written)", st, tc.wantStatus)
			}
			if len(h.rec.reasons()) != 0 {
				t.Errorf("events = %v, want none", h.rec.reasons())
			}
		})
	}
}

func TestMessageBounded(t *testing.T) {
	v := notReady(ReasonProfileInvalid, "%s", strings.Repeat("é", 2000))
	if len(v.message) > maxMessage || !strings.HasSuffix(v.message, "…") || !utf8.ValidString(v.message) {
		t.Fatalf("message of %d bytes, valid UTF-8=%v", len(v.message), utf8.ValidString(v.message))
	}
}

func TestMapFuncs(t *testing.T) {
	h := newHarness(t, nil, nil, class("a", "p1"), class("b", "p2"), class("c", "p1"))
	ctx := context.Background()
	names := func(reqs []reconcile.Request) []string {
		var out []string
		for _, r := range reqs {
			out = append(out, r.Name)
		}
		sort.Strings(out)
		return out
	}
	cases := []struct {
		name string
		got  []reconcile.Request
		want []string
	}{
		{"profile p1", h.c.classesOfProfile(ctx, scriptProfile("p1", goodLeave)), []string{"a", "c"}},
		{"profile p2", h.c.classesOfProfile(ctx, scriptProfile("p2", goodLeave)), []string{"b"}},
		{"unused profile", h.c.classesOfProfile(ctx, scriptProfile("p3", goodLeave)), nil},
		{"pool host", h.c.classesOfHost(ctx, host("h", ns, nil)), []string{"a", "b", "c"}},
		{"host elsewhere", h.c.classesOfHost(ctx, host("h", "default", nil)), nil},
		{"our claim", classOfClaim(ctx, claim("x", v1beta1.Group, Kind, "b")), []string{"b"}},
		{"foreign claim", classOfClaim(ctx, claim("x", "karpenter.k8s.aws", "EC2NodeClass", "b")), nil},
		{"claim without ref", classOfClaim(ctx, &karpv1.NodeClaim{}), nil},
		{"not a claim", classOfClaim(ctx, host("h", ns, nil)), nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := names(tc.got); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestClaimGonePredicate: of a NodeClaim's events only its deletion wakes
// the class it references (the finalizer waits for it).
func TestClaimGonePredicate(t *testing.T) {
	p := claimGone()
	nc := &karpv1.NodeClaim{}
	for _, tc := range []struct {
		name string
		got  bool
		want bool
	}{
		{"create", p.Create(event.CreateEvent{Object: nc}), false},
		{"update", p.Update(event.UpdateEvent{ObjectOld: nc, ObjectNew: nc}), false},
		{"generic", p.Generic(event.GenericEvent{Object: nc}), false},
		{"delete", p.Delete(event.DeleteEvent{Object: nc}), true},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, tc.got, tc.want)
		}
	}
}

// signedProfile is a template-free script profile whose phases carry v2
// manifests expiring at the given times (only their text is read here: the
// signature after each is a stub).
func signedProfile(t *testing.T, name string, notAfter map[engine.Phase]time.Time) *v1beta1.SSHJoinProfile {
	t.Helper()
	p := &v1beta1.SSHJoinProfile{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1beta1.SSHJoinProfileSpec{Version: "3",
		Scripts:    &v1beta1.ProfileScripts{Install: "set -euo pipefail\n", Join: "set -euo pipefail\n", Leave: "set -euo pipefail\n"},
		Signatures: &v1beta1.ProfileSignatures{}}}
	for ph, na := range notAfter {
		m, err := envelope.MarshalManifest(envelope.Manifest{Phase: string(ph), Profile: name + "@3", ScriptSHA256: envelope.ScriptDigest([]byte("set -euo pipefail\n")),
			IssuedAt: t0.Add(-24 * time.Hour), NotAfter: na, Params: map[string]envelope.ParamRule{"KPSSH_NODE_NAME": {Kind: envelope.RuleRE, Arg: ".*"}}})
		if err != nil {
			t.Fatal(err)
		}
		f := v1beta1.Signature(string(m) + "-----BEGIN SSH SIGNATURE-----\nU1NIU0lH\n-----END SSH SIGNATURE-----\n")
		switch ph {
		case engine.PhaseJoin:
			p.Spec.Signatures.Join = f
		case engine.PhaseLeave:
			p.Spec.Signatures.Leave = f
		}
	}
	return p
}

// TestSignaturesExpiring: a profile manifest expiring within two weeks
// (the default validity is 30 days) shows on the node class as condition
// SignaturesExpiring with the phase and date, and an event; time alone
// brings it (the class is requeued for the window and the expiry), Ready
// is not its concern, and a re-signed profile clears it.
func TestSignaturesExpiring(t *testing.T) {
	leaveAt, joinAt := t0.Add(10*24*time.Hour), t0.Add(60*24*time.Hour)
	h := newHarness(t, nil, nil, class("c", "p"), host("h1", ns, nil),
		signedProfile(t, "p", map[engine.Phase]time.Time{engine.PhaseLeave: leaveAt, engine.PhaseJoin: joinAt}))
	expiring := func(name, wantReason, wantIn string, wantRequeue time.Duration) {
		t.Helper()
		res := h.mustReconcile(t, "c")
		nc := h.get(t, "c")
		c := nc.StatusConditions().Get(v1beta1.ConditionSignaturesExpiring)
		switch {
		case wantReason == "" && c != nil:
			t.Fatalf("%s: condition %+v, want none", name, c)
		case wantReason != "" && (c == nil || !c.IsTrue() || c.Reason != wantReason || !strings.Contains(c.Message, wantIn)):
			t.Fatalf("%s: condition %+v, want True %s containing %q", name, c, wantReason, wantIn)
		}
		if st, r, m := ready(nc); st != metav1.ConditionTrue || r != ReasonReady {
			t.Fatalf("%s: Ready %s/%s %q: the expiry must not change it", name, st, r, m)
		}
		if res.RequeueAfter != wantRequeue {
			t.Fatalf("%s: requeue after %v, want %v", name, res.RequeueAfter, wantRequeue)
		}
	}
	expiring("leave in 10 days", profile.ReasonSignaturesExpiring, "leave manifest expires 2026-03-11T12:00:00Z", 10*24*time.Hour+time.Second)
	if c := h.get(t, "c").StatusConditions().Get(v1beta1.ConditionSignaturesExpiring); strings.Contains(c.Message, "join manifest") {
		t.Fatalf("join, 60 days out, is named: %s", c.Message)
	}
	expiring("again, unchanged", profile.ReasonSignaturesExpiring, "expires 2026-03-11", 10*24*time.Hour+time.Second)
	if got := h.rec.reasons(); !reflect.DeepEqual(got, []string{ReasonSignaturesExpiring}) {
		t.Fatalf("events %v, want one SignaturesExpiring", got)
	}
	h.clock.SetTime(leaveAt.Add(time.Second))
	expiring("leave expired", profile.ReasonSignaturesExpired, "leave manifest expired 2026-03-11T12:00:00Z", joinAt.Add(-profile.ExpiryWarning).Sub(leaveAt.Add(time.Second))+time.Second)
	if got := h.rec.reasons(); len(got) != 2 {
		t.Fatalf("events %v, want a second SignaturesExpiring for the expiry", got)
	}
	// re-signed for longer: gone
	p := signedProfile(t, "p", map[engine.Phase]time.Time{engine.PhaseLeave: joinAt, engine.PhaseJoin: joinAt})
	old := &v1beta1.SSHJoinProfile{}
	if err := h.cl.Get(context.Background(), client.ObjectKey{Name: "p"}, old); err != nil {
		t.Fatal(err)
	}
	p.ResourceVersion = old.ResourceVersion
	if err := h.cl.Update(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	expiring("re-signed", "", "", joinAt.Add(-profile.ExpiryWarning).Sub(leaveAt.Add(time.Second))+time.Second)
}
