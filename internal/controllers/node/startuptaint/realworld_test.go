package startuptaint_test

import (
	"context"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/karpenter/pkg/events"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/controllers/node/startuptaint"
	"github.com/dklesev/kpssh/test/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { os.Exit(testenv.RunMain(m, &env)) }

func needEnv(t *testing.T) {
	t.Helper()
	if env == nil {
		t.Skip("-short: needs the real kube-apiserver")
	}
}

func startController(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	mgr, err := manager.New(env.Config, manager.Options{Scheme: env.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0"})
	if err != nil {
		t.Fatal(err)
	}
	if err := startuptaint.New(mgr.GetClient(), events.NewRecorder(mgr.GetEventRecorderFor("kpssh"))).Register(mgr); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = mgr.Start(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

func eventually(t *testing.T, what string, timeout time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		ok, s := cond()
		if ok {
			return
		}
		last = s
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s; last: %s", what, last)
}

func create(t *testing.T, o client.Object) {
	t.Helper()
	if err := env.Client.Create(context.Background(), o); err != nil {
		t.Fatalf("create %T %s: %v", o, o.GetName(), err)
	}
}

func taints(t *testing.T, name string) []string {
	t.Helper()
	n := &corev1.Node{}
	if err := env.Client.Get(context.Background(), client.ObjectKey{Name: name}, n); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, tt := range n.Spec.Taints {
		if strings.HasPrefix(tt.Key, "node.kubernetes.io/") {
			continue // the apiserver's TaintNodesByCondition admission adds not-ready; no gate names it
		}
		out = append(out, tt.Key+":"+string(tt.Effect))
	}
	return out
}

func waitTaints(t *testing.T, node string, want []string) {
	t.Helper()
	eventually(t, fmt.Sprintf("taints of %s = %v", node, want), time.Minute, func() (bool, string) {
		got := taints(t, node)
		return reflect.DeepEqual(got, want), fmt.Sprint(got)
	})
}

func nodeWith(name, providerID string, ts ...string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name,
		Labels: map[string]string{karpv1.NodePoolLabelKey: "pool", karpv1.NodeRegisteredLabelKey: "true"}},
		Spec: corev1.NodeSpec{ProviderID: providerID}}
	for _, s := range ts {
		k, e, _ := strings.Cut(s, ":")
		n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: k, Effect: corev1.TaintEffect(e)})
	}
	return n
}

// claimFor creates a NodeClaim and sets its status.providerID through the
// status subresource, as the cloud provider's Create does.
func claimFor(t *testing.T, name, group, kind, class, providerID string) {
	t.Helper()
	nc := &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: karpv1.NodeClaimSpec{NodeClassRef: &karpv1.NodeClassReference{Group: group, Kind: kind, Name: class},
			Requirements: []karpv1.NodeSelectorRequirementWithMinValues{{Key: karpv1.CapacityTypeLabelKey, Operator: corev1.NodeSelectorOpIn, Values: []string{"on-demand"}}}}}
	create(t, nc)
	nc.Status.ProviderID = providerID
	if err := env.Client.Status().Update(context.Background(), nc); err != nil {
		t.Fatal(err)
	}
}

func agentPod(t *testing.T, name, ns, node string) *corev1.Pod {
	t.Helper()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": "agent"}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "agent", Image: "agent:1"}}}}
	create(t, p)
	return p
}

func setReady(t *testing.T, p *corev1.Pod) {
	t.Helper()
	p.Status.Phase = corev1.PodRunning
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}}
	if err := env.Client.Status().Update(context.Background(), p); err != nil {
		t.Fatal(err)
	}
}

func setCondition(t *testing.T, node string, typ corev1.NodeConditionType, s corev1.ConditionStatus) {
	t.Helper()
	n := &corev1.Node{}
	if err := env.Client.Get(context.Background(), client.ObjectKey{Name: node}, n); err != nil {
		t.Fatal(err)
	}
	n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: typ, Status: s,
		LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now(), Reason: "Test"})
	if err := env.Client.Status().Update(context.Background(), n); err != nil {
		t.Fatal(err)
	}
}

func removedEvents(t *testing.T, node string) []string {
	t.Helper()
	list := &corev1.EventList{}
	if err := env.Client.List(context.Background(), list, client.InNamespace(metav1.NamespaceDefault)); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range list.Items {
		if e.InvolvedObject.Kind == "Node" && e.InvolvedObject.Name == node && e.Reason == startuptaint.ReasonStartupTaintRemoved {
			out = append(out, e.Message)
		}
	}
	return out
}

// gateSamples reads kpssh_node_startup_taint_gate_seconds from the registry
// the manager's metrics endpoint serves.
func gateSamples(t *testing.T) uint64 {
	t.Helper()
	mfs, err := crmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "kpssh_node_startup_taint_gate_seconds" {
			var n uint64
			for _, m := range mf.GetMetric() {
				n += m.GetHistogram().GetSampleCount()
			}
			return n
		}
	}
	t.Fatal("kpssh_node_startup_taint_gate_seconds not registered")
	return 0
}

// TestGatesAgainstRealAPIServer runs the controller in a manager against the
// real apiserver: pods becoming Ready (status subresource), a Node condition
// and a class edit each remove their taint, with events and metric samples;
// a Node of another provider with the same taints and conditions is left alone.
func TestGatesAgainstRealAPIServer(t *testing.T) {
	needEnv(t)
	const (
		node, foreign = "st-node", "st-foreign"
		pidOurs       = "kpssh://kpssh-system/st-h1"
		pidForeign    = "aws:///zone/i-0123"
		agentKey      = "agent.example/not-ready"
		netKey        = "net.example/not-ready"
		lateKey       = "late.example/not-ready"
		keepKey       = "user.example/keep"
		agents        = "st-agents"
	)
	samples0 := gateSamples(t)
	startController(t)
	create(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: agents}})
	class := &v1beta1.SSHNodeClass{ObjectMeta: metav1.ObjectMeta{Name: "st-class"},
		Spec: v1beta1.SSHNodeClassSpec{JoinProfileRef: v1beta1.ObjectReference{Name: "p"}, StartupTaintGates: []v1beta1.StartupTaintGate{
			{TaintKey: agentKey, RemoveWhen: v1beta1.RemoveWhen{PodsReady: &v1beta1.PodsReadyGate{Namespace: agents,
				Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "agent"}}, MinReady: 2}}},
			{TaintKey: netKey, RemoveWhen: v1beta1.RemoveWhen{NodeCondition: &v1beta1.NodeConditionGate{Type: "NetworkReady", Status: corev1.ConditionTrue}}},
		}}}
	create(t, class)
	claimFor(t, "st-nc", v1beta1.Group, "SSHNodeClass", class.Name, pidOurs)
	claimFor(t, "st-nc-foreign", "karpenter.k8s.aws", "EC2NodeClass", class.Name, pidForeign)
	all := []string{agentKey + ":NoSchedule", agentKey + ":NoExecute", netKey + ":NoSchedule", lateKey + ":NoSchedule", keepKey + ":NoSchedule"}
	create(t, nodeWith(node, pidOurs, all...))
	create(t, nodeWith(foreign, pidForeign, all...))

	// One Ready agent on the node (a second not Ready yet), plus Ready agents
	// that must not count: on another node, in another namespace.
	a1, a2 := agentPod(t, "a1", agents, node), agentPod(t, "a2", agents, node)
	setReady(t, a1)
	setReady(t, agentPod(t, "elsewhere", agents, "st-other"))
	setReady(t, agentPod(t, "other-ns", metav1.NamespaceDefault, node))
	for _, p := range []*corev1.Pod{agentPod(t, "f1", agents, foreign), agentPod(t, "f2", agents, foreign)} {
		setReady(t, p)
	}

	// nodeCondition gate via the Node's status.
	setCondition(t, node, "NetworkReady", corev1.ConditionTrue)
	setCondition(t, foreign, "NetworkReady", corev1.ConditionTrue)
	waitTaints(t, node, []string{agentKey + ":NoSchedule", agentKey + ":NoExecute", lateKey + ":NoSchedule", keepKey + ":NoSchedule"})

	// Only one Ready agent on this node so far: the agent taint must stay.
	// (Settling can only hide a bug under load, never fail a correct controller.)
	time.Sleep(2 * time.Second)
	if got := taints(t, node); len(got) != 4 {
		t.Fatalf("taints %v: agent taint removed with one of two Ready pods on the node", got)
	}

	setReady(t, a2)
	waitTaints(t, node, []string{lateKey + ":NoSchedule", keepKey + ":NoSchedule"})

	// A gate added to the live class applies through the class watch.
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(class), class); err != nil {
		t.Fatal(err)
	}
	class.Spec.StartupTaintGates = append(class.Spec.StartupTaintGates, v1beta1.StartupTaintGate{TaintKey: lateKey,
		RemoveWhen: v1beta1.RemoveWhen{NodeCondition: &v1beta1.NodeConditionGate{Type: "NetworkReady", Status: corev1.ConditionTrue}}})
	if err := env.Client.Update(context.Background(), class); err != nil {
		t.Fatal(err)
	}
	waitTaints(t, node, []string{keepKey + ":NoSchedule"})

	eventually(t, "three StartupTaintRemoved events on the node", 30*time.Second, func() (bool, string) {
		evs := removedEvents(t, node)
		for _, k := range []string{agentKey, netKey, lateKey} {
			n := 0
			for _, m := range evs {
				if strings.Contains(m, "taint "+k+":") {
					n++
				}
			}
			if n != 1 {
				return false, fmt.Sprintf("%d events for %s: %q", n, k, evs)
			}
		}
		return len(evs) == 3, fmt.Sprintf("%q", evs)
	})
	if got := gateSamples(t) - samples0; got != 3 {
		t.Fatalf("kpssh_node_startup_taint_gate_seconds: %d new samples, want 3", got)
	}
	if got := taints(t, foreign); !reflect.DeepEqual(got, all) {
		t.Fatalf("foreign node's taints changed: %v", got)
	}
	if evs := removedEvents(t, foreign); len(evs) != 0 {
		t.Fatalf("events on the foreign node: %q", evs)
	}
}
