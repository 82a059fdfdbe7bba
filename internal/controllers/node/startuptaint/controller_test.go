package startuptaint

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/scheme"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/karpenter/pkg/events"

	"github.com/dklesev/kpssh/apis/v1beta1"
)

const (
	nodeName = "node-a"
	otherNde = "node-b"
	pid      = "kpssh://kpssh-system/h1"
	agentNS  = "kube-system"
	age      = 90 * time.Second
)

var now = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

type recorder struct {
	mu     sync.Mutex
	events []events.Event
}

func (r *recorder) Publish(evs ...events.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, evs...)
}

func (r *recorder) all() []events.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]events.Event(nil), r.events...)
}

func taint(key string, effect corev1.TaintEffect) corev1.Taint {
	return corev1.Taint{Key: key, Value: "true", Effect: effect}
}

func newNode(name string, taints []corev1.Taint, mut ...func(*corev1.Node)) *corev1.Node {
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name), CreationTimestamp: metav1.NewTime(now.Add(-age)),
			Labels: map[string]string{karpv1.NodePoolLabelKey: "pool", karpv1.NodeRegisteredLabelKey: "true"}},
		Spec: corev1.NodeSpec{ProviderID: pid, Taints: taints},
	}
	for _, m := range mut {
		m(n)
	}
	return n
}

func withCondition(t corev1.NodeConditionType, s corev1.ConditionStatus) func(*corev1.Node) {
	return func(n *corev1.Node) {
		n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: t, Status: s})
	}
}

func newClaim(name, providerID, node, group, kind, class string) *karpv1.NodeClaim {
	return &karpv1.NodeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name)},
		Spec:       karpv1.NodeClaimSpec{NodeClassRef: &karpv1.NodeClassReference{Group: group, Kind: kind, Name: class}},
		Status:     karpv1.NodeClaimStatus{ProviderID: providerID, NodeName: node},
	}
}

func ourClaim() *karpv1.NodeClaim {
	return newClaim("nc-1", pid, nodeName, v1beta1.Group, nodeClassKind, "ssh")
}

func newClass(name string, gates ...v1beta1.StartupTaintGate) *v1beta1.SSHNodeClass {
	return &v1beta1.SSHNodeClass{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1beta1.SSHNodeClassSpec{JoinProfileRef: v1beta1.ObjectReference{Name: "p"}, StartupTaintGates: gates}}
}

func podsGate(key string, minReady int32, sel *metav1.LabelSelector) v1beta1.StartupTaintGate {
	return v1beta1.StartupTaintGate{TaintKey: key, RemoveWhen: v1beta1.RemoveWhen{
		PodsReady: &v1beta1.PodsReadyGate{Namespace: agentNS, Selector: sel, MinReady: minReady}}}
}

func condGate(key, typ string, s corev1.ConditionStatus) v1beta1.StartupTaintGate {
	return v1beta1.StartupTaintGate{TaintKey: key, RemoveWhen: v1beta1.RemoveWhen{
		NodeCondition: &v1beta1.NodeConditionGate{Type: typ, Status: s}}}
}

var agentSel = &metav1.LabelSelector{MatchLabels: map[string]string{"app": "agent"}}

func newPod(name, ns, node string, ready bool, mut ...func(*corev1.Pod)) *corev1.Pod {
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": "agent"}},
		Spec:       corev1.PodSpec{NodeName: node},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}},
	}
	for _, m := range mut {
		m(p)
	}
	return p
}

type world struct {
	c       client.Client
	ctrl    *Controller
	rec     *recorder
	patches int
}

func newWorld(t *testing.T, funcs *interceptor.Funcs, objs ...client.Object) *world {
	t.Helper()
	w := &world{rec: &recorder{}}
	f := interceptor.Funcs{}
	if funcs != nil {
		f = *funcs
	}
	inner := f.Patch
	f.Patch = func(ctx context.Context, c client.WithWatch, o client.Object, p client.Patch, opts ...client.PatchOption) error {
		w.patches++
		if inner != nil {
			return inner(ctx, c, o, p, opts...)
		}
		return c.Patch(ctx, o, p, opts...)
	}
	w.c = fake.NewClientBuilder().WithScheme(scheme.Scheme).
		WithIndex(&karpv1.NodeClaim{}, claimIndex, claimKeys).
		WithIndex(&corev1.Pod{}, podNodeIndex, podNode).
		WithIndex(&corev1.Node{}, nodePIDIndex, nodePID).
		WithObjects(objs...).WithInterceptorFuncs(f).Build()
	w.ctrl = &Controller{Client: w.c, Recorder: w.rec, Clock: clocktesting.NewFakeClock(now)}
	return w
}

func (w *world) reconcile(t *testing.T, name string) reconcile.Result {
	t.Helper()
	res, err := w.ctrl.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Name: name}})
	if err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	return res
}

func (w *world) node(t *testing.T, name string) *corev1.Node {
	t.Helper()
	n := &corev1.Node{}
	if err := w.c.Get(context.Background(), types.NamespacedName{Name: name}, n); err != nil {
		t.Fatal(err)
	}
	return n
}

func taintKeys(n *corev1.Node) []string {
	var out []string
	for _, t := range n.Spec.Taints {
		out = append(out, t.Key+":"+string(t.Effect))
	}
	return out
}

// histogram reads the global histogram; tests that check it do not run in parallel.
func histogram(t *testing.T) (uint64, float64) {
	t.Helper()
	m := &dto.Metric{}
	if err := gateSeconds.Write(m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
}

func TestGates(t *testing.T) {
	const key = "agent.example/not-ready"
	other := taint("keep.example/other", corev1.TaintEffectNoSchedule)
	terminating := func(p *corev1.Pod) {
		p.DeletionTimestamp = &metav1.Time{Time: now}
		p.Finalizers = []string{"example/hold"}
	}
	wrongLabels := func(p *corev1.Pod) { p.Labels = map[string]string{"app": "other"} }
	for _, tc := range []struct {
		name     string
		gate     v1beta1.StartupTaintGate
		nodeMut  []func(*corev1.Node)
		pods     []client.Object
		removed  bool
		gateText string
	}{
		{name: "podsReady satisfied", gate: podsGate(key, 1, agentSel),
			pods: []client.Object{newPod("a1", agentNS, nodeName, true)}, removed: true, gateText: "podsReady 1/1"},
		{name: "podsReady minReady unset means one", gate: podsGate(key, 0, agentSel),
			pods: []client.Object{newPod("a1", agentNS, nodeName, true)}, removed: true, gateText: "podsReady 1/1"},
		{name: "podsReady not yet: pod not Ready", gate: podsGate(key, 1, agentSel),
			pods: []client.Object{newPod("a1", agentNS, nodeName, false)}},
		{name: "podsReady not yet: no pods", gate: podsGate(key, 1, agentSel)},
		{name: "podsReady minReady counts only Ready pods on this node", gate: podsGate(key, 2, agentSel),
			pods: []client.Object{
				newPod("a1", agentNS, nodeName, true), newPod("a2", agentNS, nodeName, false),
				newPod("b1", agentNS, otherNde, true), newPod("x1", "other-ns", nodeName, true),
				newPod("u1", agentNS, "", true), newPod("t1", agentNS, nodeName, true, terminating),
				newPod("w1", agentNS, nodeName, true, wrongLabels),
			}},
		{name: "podsReady minReady reached", gate: podsGate(key, 2, agentSel),
			pods:    []client.Object{newPod("a1", agentNS, nodeName, true), newPod("a2", agentNS, nodeName, true)},
			removed: true, gateText: "podsReady 2/2"},
		{name: "podsReady pods on other nodes ignored", gate: podsGate(key, 1, agentSel),
			pods: []client.Object{newPod("b1", agentNS, otherNde, true), newPod("b2", agentNS, otherNde, true)}},
		{name: "podsReady other namespace ignored", gate: podsGate(key, 1, agentSel),
			pods: []client.Object{newPod("x1", "other-ns", nodeName, true)}},
		{name: "podsReady empty selector matches every pod in the namespace", gate: podsGate(key, 1, &metav1.LabelSelector{}),
			pods: []client.Object{newPod("w1", agentNS, nodeName, true, wrongLabels)}, removed: true},
		{name: "podsReady matchExpressions", gate: podsGate(key, 1, &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: "app", Operator: metav1.LabelSelectorOpIn, Values: []string{"agent", "agent2"}}}}),
			pods: []client.Object{newPod("a1", agentNS, nodeName, true)}, removed: true},
		{name: "nodeCondition satisfied", gate: condGate(key, "NetworkReady", corev1.ConditionTrue),
			nodeMut: []func(*corev1.Node){withCondition("NetworkReady", corev1.ConditionTrue)}, removed: true, gateText: "nodeCondition NetworkReady=True"},
		{name: "nodeCondition False wanted and present", gate: condGate(key, string(corev1.NodeNetworkUnavailable), corev1.ConditionFalse),
			nodeMut: []func(*corev1.Node){withCondition(corev1.NodeNetworkUnavailable, corev1.ConditionFalse)}, removed: true},
		{name: "nodeCondition other status", gate: condGate(key, "NetworkReady", corev1.ConditionTrue),
			nodeMut: []func(*corev1.Node){withCondition("NetworkReady", corev1.ConditionUnknown)}},
		{name: "nodeCondition absent", gate: condGate(key, "NetworkReady", corev1.ConditionTrue),
			nodeMut: []func(*corev1.Node){withCondition(corev1.NodeReady, corev1.ConditionTrue)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := newNode(nodeName, []corev1.Taint{other, taint(key, corev1.TaintEffectNoSchedule)}, tc.nodeMut...)
			objs := append([]client.Object{node, ourClaim(), newClass("ssh", tc.gate)}, tc.pods...)
			w := newWorld(t, nil, objs...)
			count0, sum0 := histogram(t)
			if res := w.reconcile(t, nodeName); !res.IsZero() {
				t.Fatalf("result %+v: a gate decision needs no requeue", res)
			}
			got := taintKeys(w.node(t, nodeName))
			count, sum := histogram(t)
			evs := w.rec.all()
			if !tc.removed {
				if len(got) != 2 || w.patches != 0 || len(evs) != 0 || count != count0 {
					t.Fatalf("gate does not hold yet, but taints %v patches %d events %+v metric samples +%d", got, w.patches, evs, count-count0)
				}
				return
			}
			if !reflect.DeepEqual(got, []string{"keep.example/other:NoSchedule"}) {
				t.Fatalf("taints %v: want only the ungated one left", got)
			}
			if len(evs) != 1 || evs[0].Reason != ReasonStartupTaintRemoved || evs[0].Type != corev1.EventTypeNormal ||
				!strings.Contains(evs[0].Message, key) || !strings.Contains(evs[0].Message, tc.gateText) || evs[0].InvolvedObject.(*corev1.Node).Name != nodeName {
				t.Fatalf("events %+v", evs)
			}
			if count != count0+1 || sum-sum0 != age.Seconds() {
				t.Fatalf("metric: +%d samples, +%v s; want +1, +%v s (node age on the injected clock)", count-count0, sum-sum0, age.Seconds())
			}
		})
	}
}

func TestMultipleGatesAreIndependent(t *testing.T) {
	node := newNode(nodeName, []corev1.Taint{
		taint("a.example/cni", corev1.TaintEffectNoSchedule), taint("a.example/cni", corev1.TaintEffectNoExecute),
		taint("b.example/csi", corev1.TaintEffectNoSchedule),
		taint("c.example/net", corev1.TaintEffectNoSchedule), taint("c.example/net", corev1.TaintEffectPreferNoSchedule),
		taint("d.example/user", corev1.TaintEffectNoSchedule),
	}, withCondition("NetworkReady", corev1.ConditionTrue))
	class := newClass("ssh",
		podsGate("a.example/cni", 1, agentSel),
		podsGate("b.example/csi", 1, &metav1.LabelSelector{MatchLabels: map[string]string{"app": "csi"}}),
		condGate("c.example/net", "NetworkReady", corev1.ConditionTrue),
		condGate("e.example/absent", "NetworkReady", corev1.ConditionTrue),
	)
	w := newWorld(t, nil, node, ourClaim(), class, newPod("a1", agentNS, nodeName, true))
	count0, sum0 := histogram(t)
	w.reconcile(t, nodeName)
	if got := taintKeys(w.node(t, nodeName)); !reflect.DeepEqual(got, []string{"b.example/csi:NoSchedule", "d.example/user:NoSchedule"}) {
		t.Fatalf("taints %v: want every effect of a and c gone, b (gate not met) and d (no gate) kept", got)
	}
	if w.patches != 1 {
		t.Fatalf("%d patches: satisfied gates go out in one patch", w.patches)
	}
	var keys []string
	for _, e := range w.rec.all() {
		if e.Reason != ReasonStartupTaintRemoved {
			t.Fatalf("event %+v", e)
		}
		keys = append(keys, strings.Fields(e.Message)[3])
	}
	if !reflect.DeepEqual(keys, []string{"a.example/cni:", "c.example/net:"}) {
		t.Fatalf("events name %v", keys)
	}
	if count, sum := histogram(t); count != count0+2 || sum-sum0 != 2*age.Seconds() {
		t.Fatalf("metric +%d samples +%v s", count-count0, sum-sum0)
	}

	// Nothing left that a gate can remove: no further writes.
	w.reconcile(t, nodeName)
	if w.patches != 1 || len(w.rec.all()) != 2 {
		t.Fatalf("second pass wrote: patches %d events %d", w.patches, len(w.rec.all()))
	}
}

func TestSameKeyInTwoGatesEitherRemovesItOnce(t *testing.T) {
	const key = "a.example/cni"
	node := newNode(nodeName, []corev1.Taint{taint(key, corev1.TaintEffectNoSchedule)}, withCondition("NetworkReady", corev1.ConditionTrue))
	class := newClass("ssh", podsGate(key, 1, agentSel), condGate(key, "NetworkReady", corev1.ConditionTrue))
	w := newWorld(t, nil, node, ourClaim(), class)
	count0, _ := histogram(t)
	w.reconcile(t, nodeName)
	if got := taintKeys(w.node(t, nodeName)); len(got) != 0 {
		t.Fatalf("taints %v", got)
	}
	evs := w.rec.all()
	if len(evs) != 1 || !strings.Contains(evs[0].Message, "nodeCondition NetworkReady=True") {
		t.Fatalf("events %+v", evs)
	}
	if count, _ := histogram(t); count != count0+1 {
		t.Fatalf("metric +%d samples, want one per removed taint", count-count0)
	}
}

func TestNodesNotOursAreUntouched(t *testing.T) {
	const key = "a.example/cni"
	gate := condGate(key, "NetworkReady", corev1.ConditionTrue)
	tainted := func(mut ...func(*corev1.Node)) *corev1.Node {
		return newNode(nodeName, []corev1.Taint{taint(key, corev1.TaintEffectNoSchedule)},
			append([]func(*corev1.Node){withCondition("NetworkReady", corev1.ConditionTrue)}, mut...)...)
	}
	for _, tc := range []struct {
		name    string
		objs    []client.Object
		removed bool
	}{
		{name: "control: ours by providerID", objs: []client.Object{tainted(), ourClaim(), newClass("ssh", gate)}, removed: true},
		{name: "control: ours by nodeName before the node has a providerID",
			objs:    []client.Object{tainted(func(n *corev1.Node) { n.Spec.ProviderID = "" }), newClaim("nc-1", "", nodeName, v1beta1.Group, nodeClassKind, "ssh"), newClass("ssh", gate)},
			removed: true},
		{name: "control: providerID match wins over an earlier claim of the same node name (hosts are reused)",
			objs: []client.Object{tainted(), ourClaim(), newClaim("nc-old", "kpssh://kpssh-system/h0", nodeName, v1beta1.Group, nodeClassKind, "old"),
				newClass("ssh", gate), newClass("old")},
			removed: true},
		{name: "no karpenter nodepool label",
			objs: []client.Object{tainted(func(n *corev1.Node) { delete(n.Labels, karpv1.NodePoolLabelKey) }), ourClaim(), newClass("ssh", gate)}},
		{name: "not registered by karpenter yet",
			objs: []client.Object{tainted(func(n *corev1.Node) { delete(n.Labels, karpv1.NodeRegisteredLabelKey) }), ourClaim(), newClass("ssh", gate)}},
		{name: "claim of another provider",
			objs: []client.Object{tainted(), newClaim("nc-1", pid, nodeName, "karpenter.k8s.aws", "EC2NodeClass", "ssh"), newClass("ssh", gate)}},
		{name: "claim of another kind in our group",
			objs: []client.Object{tainted(), newClaim("nc-1", pid, nodeName, v1beta1.Group, "OtherNodeClass", "ssh"), newClass("ssh", gate)}},
		{name: "no claim", objs: []client.Object{tainted(), newClass("ssh", gate)}},
		{name: "claim of another node",
			objs: []client.Object{tainted(), newClaim("nc-1", "kpssh://kpssh-system/h2", otherNde, v1beta1.Group, nodeClassKind, "ssh"), newClass("ssh", gate)}},
		{name: "class gone", objs: []client.Object{tainted(), ourClaim()}},
		{name: "claims disagree on the class",
			objs: []client.Object{tainted(), ourClaim(), newClaim("nc-2", pid, nodeName, v1beta1.Group, nodeClassKind, "ssh2"), newClass("ssh", gate), newClass("ssh2", gate)}},
		{name: "node deleting",
			objs: []client.Object{tainted(func(n *corev1.Node) {
				n.DeletionTimestamp = &metav1.Time{Time: now}
				n.Finalizers = []string{"karpenter.sh/termination"}
			}), ourClaim(), newClass("ssh", gate)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, nil, tc.objs...)
			w.reconcile(t, nodeName)
			got := taintKeys(w.node(t, nodeName))
			if tc.removed {
				if len(got) != 0 || len(w.rec.all()) != 1 {
					t.Fatalf("taints %v events %+v", got, w.rec.all())
				}
				return
			}
			if len(got) != 1 || w.patches != 0 || len(w.rec.all()) != 0 {
				t.Fatalf("foreign node written: taints %v patches %d events %+v", got, w.patches, w.rec.all())
			}
		})
	}
}

func TestMissingNodeIsNoError(t *testing.T) {
	w := newWorld(t, nil, ourClaim(), newClass("ssh"))
	if res := w.reconcile(t, "gone"); !res.IsZero() {
		t.Fatalf("result %+v", res)
	}
}

func TestInvalidGateWarnsAndOtherGatesStillApply(t *testing.T) {
	for _, tc := range []struct {
		name string
		gate v1beta1.StartupTaintGate
		want string
	}{
		{name: "In without values", gate: podsGate("bad.example/x", 1, &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: "app", Operator: metav1.LabelSelectorOpIn}}}), want: "podsReady.selector"},
		{name: "bad label key", gate: podsGate("bad.example/x", 1, &metav1.LabelSelector{MatchLabels: map[string]string{"no spaces": "x"}}), want: "podsReady.selector"},
		{name: "unknown operator", gate: podsGate("bad.example/x", 1, &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: "app", Operator: "Near", Values: []string{"x"}}}}), want: "podsReady.selector"},
		{name: "nil selector", gate: podsGate("bad.example/x", 1, nil), want: "selector is required"},
		{name: "empty removeWhen", gate: v1beta1.StartupTaintGate{TaintKey: "bad.example/x"}, want: "exactly one"},
		{name: "both conditions", gate: v1beta1.StartupTaintGate{TaintKey: "bad.example/x", RemoveWhen: v1beta1.RemoveWhen{
			PodsReady: podsGate("", 1, agentSel).RemoveWhen.PodsReady, NodeCondition: &v1beta1.NodeConditionGate{Type: "X", Status: corev1.ConditionTrue}}}, want: "exactly one"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := newNode(nodeName, []corev1.Taint{taint("bad.example/x", corev1.TaintEffectNoSchedule), taint("good.example/y", corev1.TaintEffectNoSchedule)},
				withCondition("NetworkReady", corev1.ConditionTrue))
			class := newClass("ssh", tc.gate, condGate("good.example/y", "NetworkReady", corev1.ConditionTrue))
			w := newWorld(t, nil, node, ourClaim(), class, newPod("a1", agentNS, nodeName, true))
			if res := w.reconcile(t, nodeName); !res.IsZero() {
				t.Fatalf("result %+v: an invalid gate must not requeue (a class fix wakes the node)", res)
			}
			if got := taintKeys(w.node(t, nodeName)); !reflect.DeepEqual(got, []string{"bad.example/x:NoSchedule"}) {
				t.Fatalf("taints %v: want the valid gate's taint removed, the invalid gate's kept", got)
			}
			var warn *events.Event
			for _, e := range w.rec.all() {
				if e.Reason == ReasonStartupTaintGateInvalid {
					warn = &e
				}
			}
			if warn == nil || warn.Type != corev1.EventTypeWarning || !strings.Contains(warn.Message, "bad.example/x") ||
				!strings.Contains(warn.Message, tc.want) || len(warn.DedupeValues) == 0 {
				t.Fatalf("warning %+v (events %+v)", warn, w.rec.all())
			}
		})
	}
}

func TestConflictRequeuesAndRetries(t *testing.T) {
	const key = "a.example/cni"
	node := newNode(nodeName, []corev1.Taint{taint(key, corev1.TaintEffectNoSchedule), taint("late.example/x", corev1.TaintEffectNoSchedule)},
		withCondition("NetworkReady", corev1.ConditionTrue))
	first := true
	funcs := &interceptor.Funcs{Patch: func(ctx context.Context, c client.WithWatch, o client.Object, p client.Patch, opts ...client.PatchOption) error {
		if first {
			// Another writer changes the taints between our read and our
			// patch; the resourceVersion precondition must reject the patch.
			first = false
			cur := &corev1.Node{}
			if err := c.Get(ctx, client.ObjectKeyFromObject(o), cur); err != nil {
				return err
			}
			cur.Spec.Taints = append(cur.Spec.Taints, taint("late.example/y", corev1.TaintEffectNoSchedule))
			if err := c.Update(ctx, cur); err != nil {
				return err
			}
		}
		return c.Patch(ctx, o, p, opts...)
	}}
	w := newWorld(t, funcs, node, ourClaim(), newClass("ssh", condGate(key, "NetworkReady", corev1.ConditionTrue)))
	count0, _ := histogram(t)
	res := w.reconcile(t, nodeName)
	if !res.Requeue {
		t.Fatalf("result %+v: a conflict must requeue", res)
	}
	if got := taintKeys(w.node(t, nodeName)); len(got) != 3 || len(w.rec.all()) != 0 {
		t.Fatalf("after conflict: taints %v events %+v (the concurrent write must survive, nothing reported)", got, w.rec.all())
	}
	if count, _ := histogram(t); count != count0 {
		t.Fatal("metric observed for a removal that did not happen")
	}
	w.reconcile(t, nodeName)
	if got := taintKeys(w.node(t, nodeName)); !reflect.DeepEqual(got, []string{"late.example/x:NoSchedule", "late.example/y:NoSchedule"}) {
		t.Fatalf("after retry: taints %v", got)
	}
	if evs := w.rec.all(); len(evs) != 1 || evs[0].Reason != ReasonStartupTaintRemoved {
		t.Fatalf("events %+v", evs)
	}
}

func TestPatchErrorIsReturned(t *testing.T) {
	boom := errors.New("apiserver unavailable")
	funcs := &interceptor.Funcs{Patch: func(context.Context, client.WithWatch, client.Object, client.Patch, ...client.PatchOption) error {
		return boom
	}}
	node := newNode(nodeName, []corev1.Taint{taint("a.example/cni", corev1.TaintEffectNoSchedule)}, withCondition("NetworkReady", corev1.ConditionTrue))
	w := newWorld(t, funcs, node, ourClaim(), newClass("ssh", condGate("a.example/cni", "NetworkReady", corev1.ConditionTrue)))
	_, err := w.ctrl.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Name: nodeName}})
	if !errors.Is(err, boom) || len(w.rec.all()) != 0 {
		t.Fatalf("err %v events %+v", err, w.rec.all())
	}
}

func TestClockSkewObservesZero(t *testing.T) {
	node := newNode(nodeName, []corev1.Taint{taint("a.example/cni", corev1.TaintEffectNoSchedule)}, withCondition("NetworkReady", corev1.ConditionTrue),
		func(n *corev1.Node) { n.CreationTimestamp = metav1.NewTime(now.Add(time.Minute)) })
	w := newWorld(t, nil, node, ourClaim(), newClass("ssh", condGate("a.example/cni", "NetworkReady", corev1.ConditionTrue)))
	count0, sum0 := histogram(t)
	w.reconcile(t, nodeName)
	if count, sum := histogram(t); count != count0+1 || sum != sum0 {
		t.Fatalf("metric +%d samples +%v s; want one zero sample", count-count0, sum-sum0)
	}
}

func TestMappings(t *testing.T) {
	ctx := context.Background()
	names := func(rs []reconcile.Request) []string {
		var out []string
		for _, r := range rs {
			out = append(out, r.Name)
		}
		return out
	}
	if got := names(podToNode(ctx, newPod("a1", agentNS, nodeName, true))); !reflect.DeepEqual(got, []string{nodeName}) {
		t.Fatalf("pod → %v", got)
	}
	if got := podToNode(ctx, newPod("a1", agentNS, "", true)); got != nil {
		t.Fatalf("unscheduled pod → %v", got)
	}
	if got := names(claimToNode(ctx, ourClaim())); !reflect.DeepEqual(got, []string{nodeName}) {
		t.Fatalf("claim → %v", got)
	}
	if got := claimToNode(ctx, newClaim("nc-x", pid, nodeName, "karpenter.k8s.aws", "EC2NodeClass", "ssh")); got != nil {
		t.Fatalf("foreign claim → %v", got)
	}
	if got := claimToNode(ctx, newClaim("nc-x", pid, "", v1beta1.Group, nodeClassKind, "ssh")); got != nil {
		t.Fatalf("unlinked claim → %v", got)
	}
	w := newWorld(t, nil, ourClaim(), newClaim("nc-2", "kpssh://kpssh-system/h2", otherNde, v1beta1.Group, nodeClassKind, "ssh"),
		newClaim("nc-3", "kpssh://kpssh-system/h3", "", v1beta1.Group, nodeClassKind, "ssh"),
		newNode("node-c", nil, func(n *corev1.Node) { n.Spec.ProviderID = "kpssh://kpssh-system/h3" }),
		newClaim("nc-6", "kpssh://kpssh-system/h6", "", v1beta1.Group, nodeClassKind, "ssh"),
		newClaim("nc-4", "kpssh://kpssh-system/h4", "node-d", v1beta1.Group, nodeClassKind, "other"),
		newClaim("nc-5", "aws:///i-1", "node-e", "karpenter.k8s.aws", "EC2NodeClass", "ssh"))
	got := names(w.ctrl.classToNodes(ctx, newClass("ssh")))
	if !reflect.DeepEqual(got, []string{nodeName, otherNde, "node-c"}) {
		t.Fatalf("class → %v: want the nodes of its own claims only (by nodeName, else by providerID)", got)
	}
	for _, tc := range []struct {
		name string
		node *corev1.Node
		want bool
	}{
		{"tainted karpenter node", newNode(nodeName, []corev1.Taint{taint("x", corev1.TaintEffectNoSchedule)}), true},
		{"untainted", newNode(nodeName, nil), false},
		{"not karpenter", newNode(nodeName, []corev1.Taint{taint("x", corev1.TaintEffectNoSchedule)}, func(n *corev1.Node) { n.Labels = nil }), false},
	} {
		if got := candidate(tc.node); got != tc.want {
			t.Errorf("candidate(%s) = %v", tc.name, got)
		}
	}
}
