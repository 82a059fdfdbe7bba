package cloudprovider

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"
	"sigs.k8s.io/karpenter/pkg/events"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/controllers/host"
	"github.com/dklesev/kpssh/internal/probe"
	"github.com/dklesev/kpssh/internal/sshx"
	"github.com/dklesev/kpssh/internal/sshx/sshtest"
	"github.com/dklesev/kpssh/test/testenv"
)

// The attack of issue 15 item 9, against the real apiserver with the host
// controller running: whoever may create SSHHosts adds a second one for a
// machine the pool already has — the same IPv4 again, another spelling of
// the same IPv6 address, or another address with the same node address —
// and two NodeClaims are created at once. Each host is a different object,
// so each claim's compare-and-swap succeeds on its own: the machine was
// claimed (and joined) twice. The later host (by creationTimestamp, then
// name) must carry Duplicate, naming the earlier host and the field, and
// must never be claimed; once the earlier host is deleted or changed, the
// later one is claimable again.
func TestTwoHostsOneMachineAreClaimedOnce(t *testing.T) {
	ctx := context.Background()
	addr := func(a string) func(*v1beta1.SSHHost) { return func(h *v1beta1.SSHHost) { h.Spec.Address = a } }
	nodeAddr := func(a, n string) func(*v1beta1.SSHHost) {
		return func(h *v1beta1.SSHHost) { h.Spec.Address, h.Spec.NodeAddress = a, n }
	}
	for _, tc := range []struct {
		name  string
		a, b  func(*v1beta1.SSHHost)
		field string
		// free changes the pool so that the later host is no longer a
		// duplicate: the earlier host is deleted, or edited.
		free func(t *testing.T, w *idWorld)
	}{
		{"ipv6", addr("2001:db8::1"), addr("2001:DB8:0::1"), "spec.address", deleteHost("a")},
		{"ipv4", addr("192.0.2.7"), addr("192.0.2.7"), "spec.address", deleteHost("a")},
		{"nodeaddress", nodeAddr("192.0.2.8", "10.70.0.1"), nodeAddr("192.0.2.9", "10.70.0.1"), "spec.nodeAddress",
			func(t *testing.T, w *idWorld) {
				a := w.get(t, "a")
				a.Spec.NodeAddress = "10.70.0.2"
				if err := env.Client.Update(ctx, a); err != nil {
					t.Fatal(err)
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := identityWorld(t, "dup-"+tc.name, v1beta1.ProviderIDStatic)
			runHostController(t, w.ns)
			for _, h := range []struct {
				name string
				spec func(*v1beta1.SSHHost)
			}{{"a", tc.a}, {"b", tc.b}} {
				obj := newHost(h.name, "small", func(o *v1beta1.SSHHost) { o.Namespace, o.Status = w.ns, v1beta1.SSHHostStatus{} }, h.spec)
				if err := env.Client.Create(ctx, obj); err != nil {
					t.Fatal(err)
				}
			}
			testenv.Eventually(t, "a Available, b Available or Duplicate", 30*time.Second, func() (bool, string) {
				a, b := w.get(t, "a"), w.get(t, "b")
				return a.Status.State == v1beta1.HostAvailable && (b.Status.State == v1beta1.HostAvailable || duplicateCond(b) != nil),
					fmt.Sprintf("a %s, b %s %v", a.Status.State, b.Status.State, b.Status.Conditions)
			})

			// Two NodeClaims at once, as Karpenter launches them.
			claims := []*karpv1.NodeClaim{w.claim(t, w.ns+"-1"), w.claim(t, w.ns+"-2")}
			var wg sync.WaitGroup
			for _, nc := range claims {
				wg.Add(1)
				go func() { defer wg.Done(); _, _ = w.cp.Create(ctx, nc) }()
			}
			wg.Wait()
			if held := heldHosts(t, w.ns); len(held) != 1 || held[0] != "a" {
				t.Fatalf("hosts holding a claim: %v — one machine, claimed by %d NodeClaims; want only a, the earlier host", held, len(held))
			}
			b := w.get(t, "b")
			cond := duplicateCond(b)
			if cond == nil || !strings.Contains(cond.Message, "host a") || !strings.Contains(cond.Message, tc.field) {
				t.Fatalf("later host b: Duplicate %+v, want True naming host a and %s", cond, tc.field)
			}
			if b.Status.State == v1beta1.HostAvailable {
				t.Fatalf("the duplicate is counted Available: %+v", b.Status)
			}

			// The earlier host goes (or changes): the later one is the
			// machine's only host now, and claimable.
			tc.free(t, w)
			testenv.Eventually(t, "b no longer Duplicate and Available", 30*time.Second, func() (bool, string) {
				b := w.get(t, "b")
				return duplicateCond(b) == nil && b.Status.State == v1beta1.HostAvailable, fmt.Sprintf("b %s %v", b.Status.State, b.Status.Conditions)
			})
			if _, err := w.cp.Create(ctx, w.claim(t, w.ns+"-3")); err != nil {
				t.Fatal(err)
			}
			if h := w.get(t, "b"); h.Status.ClaimRef == nil || h.Status.ClaimRef.Name != w.ns+"-3" {
				t.Fatalf("b after the earlier host went: %+v", h.Status)
			}
		})
	}
}

func deleteHost(name string) func(t *testing.T, w *idWorld) {
	return func(t *testing.T, w *idWorld) {
		if err := env.Client.Delete(context.Background(), w.get(t, name)); err != nil {
			t.Fatal(err)
		}
	}
}

// duplicateCond is the host's Duplicate condition when True, else nil.
func duplicateCond(h *v1beta1.SSHHost) *metav1.Condition {
	for _, c := range h.Status.Conditions {
		if c.Type == "Duplicate" && c.Status == metav1.ConditionTrue {
			return &metav1.Condition{Type: c.Type, Status: c.Status, Reason: c.Reason, Message: c.Message}
		}
	}
	return nil
}

func heldHosts(t *testing.T, ns string) []string {
	t.Helper()
	list := &v1beta1.SSHHostList{}
	if err := env.Client.List(context.Background(), list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, h := range list.Items {
		if h.Status.ClaimRef != nil {
			out = append(out, h.Name)
		}
	}
	return out
}

// runHostController runs the host controller for ns in a manager of its
// own; its probe reports a reachable host without a kubelet.
func runHostController(t *testing.T, ns string) {
	t.Helper()
	_, key := sshtest.NewKey(t)
	if err := env.Client.Create(context.Background(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "key", Namespace: ns},
		Data: map[string][]byte{"privateKey": key}}); err != nil {
		t.Fatal(err)
	}
	mgr, err := manager.New(env.Config, manager.Options{Scheme: env.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0"})
	if err != nil {
		t.Fatal(err)
	}
	hc := host.New(mgr.GetClient(), events.NewRecorder(mgr.GetEventRecorderFor("kpssh")), ns)
	hc.Interval = 2 * time.Second
	hc.Prober = func(context.Context, sshx.Target, bool, string, time.Duration) (probe.Result, error) {
		return probe.Result{Facts: probe.Facts{CPU: 4, MemoryKiB: 8 << 20, Arch: "amd64"}, Fingerprint: "SHA256:" + strings.Repeat("D", 43)}, nil
	}
	if err := hc.Register(mgr); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = mgr.Start(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// The claim path's own view (no host controller, no condition yet): a host
// whose machine another host of the pool already has is neither offered
// available nor claimed — whatever the node class selects, since the other
// host may be of another class — and a host whose Duplicate condition is
// True is not free either.
func TestDuplicatesAreNotOfferedOrClaimed(t *testing.T) {
	ctx := context.Background()
	parked := func(h *v1beta1.SSHHost) { h.Annotations = map[string]string{v1beta1.AnnotationMaintenance: ""} }
	for _, tc := range []struct {
		name     string
		selector *metav1.LabelSelector
		hosts    []client.Object
	}{
		{"twin in another class", nil, []client.Object{
			newHost("s1", "small", parked, func(h *v1beta1.SSHHost) { h.Spec.Address = "2001:db8::7" }),
			newHost("b11", "big", func(h *v1beta1.SSHHost) { h.Spec.Address = "2001:DB8::0:7" })}},
		{"twin outside the node class's selector",
			&metav1.LabelSelector{MatchLabels: map[string]string{v1beta1.LabelHostClass: "big"}}, []client.Object{
				newHost("s1", "small", parked, func(h *v1beta1.SSHHost) { h.Spec.NodeAddress = "10.9.9.9" }),
				newHost("b11", "big", func(h *v1beta1.SSHHost) { h.Spec.NodeAddress = "10.9.9.9" })}},
		{"condition set", nil, []client.Object{
			newHost("b11", "big", func(h *v1beta1.SSHHost) {
				h.SetDuplicate(v1beta1.ReasonDuplicateAddress, "same machine as host x", metav1.Now())
			})}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nc := nodeClass(func(nc *v1beta1.SSHNodeClass) { nc.Spec.HostSelector = tc.selector })
			w := newWorld(t, nil, append([]client.Object{nc, joinProfile()}, tc.hosts...)...)
			its, err := w.cp.GetInstanceTypes(ctx, ourPool)
			if err != nil {
				t.Fatal(err)
			}
			for _, it := range its {
				if it.Name == "big" && len(it.Offerings.Launchable()) > 0 {
					t.Fatalf("the duplicate's class is offered available: %v", its)
				}
			}
			if _, err := w.cp.Create(ctx, newNodeClaim("a")); !cloudprovider.IsInsufficientCapacityError(err) {
				t.Fatalf("Create: %v, want insufficient capacity", err)
			}
			if h := w.host(t, "b11"); h.Status.ClaimRef != nil {
				t.Fatalf("the duplicate was claimed: %+v", h.Status)
			}
		})
	}
}
