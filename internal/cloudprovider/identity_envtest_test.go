package cloudprovider

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/engine"
)

// The attack of issue 15 item 4 on Delete and Adopt, against the real
// apiserver: whoever may edit an SSHHost sets spec.nodeAddress to the
// InternalIP of a Node that is not the host's (or two sites share an
// address plan). Delete must not delete that Node after leave, and Adopt
// must not take its providerID: only a Node tied to the host by identity
// (its providerID, or kpssh's host label on a Node created since the claim)
// is the host's. Every Node here is created after the NodeClaim, so the
// time bound alone never saves the other Node.

// idWorld is one pool namespace with its own node class and profile, and a
// cloud provider reading the apiserver directly (lists sorted by name).
type idWorld struct {
	ns  string
	cp  *CloudProvider
	ph  *fakePhases
	rec *recorder
}

func identityWorld(t *testing.T, name string, src v1beta1.ProviderIDSource) *idWorld {
	t.Helper()
	if env == nil {
		t.Skip("-short: needs the real apiserver")
	}
	ctx := context.Background()
	w := &idWorld{ns: "ident-" + name, ph: &fakePhases{results: map[engine.Phase]engine.Result{}}, rec: &recorder{}}
	nc := nodeClass(func(nc *v1beta1.SSHNodeClass) {
		nc.Name, nc.Spec.JoinProfileRef.Name, nc.Spec.ProviderIDSource = w.ns, w.ns, src
	})
	prof := joinProfile()
	prof.Name = w.ns
	for _, o := range []client.Object{&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: w.ns}}, nc, prof} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), o) })
	}
	w.cp = New(env.Client, env.Client, w.ns, w.ph, &fakeTokens{}, w.rec, clock.RealClock{})
	w.cp.Cluster = fakeCluster{}
	w.cp.AdoptTimeout, w.cp.AdoptPoll = 3*time.Second, 100*time.Millisecond
	return w
}

// claim creates a NodeClaim of the world's node class in the apiserver.
func (w *idWorld) claim(t *testing.T, name string) *karpv1.NodeClaim {
	t.Helper()
	nc := newNodeClaim(name, func(nc *karpv1.NodeClaim) { nc.UID, nc.Spec.NodeClassRef.Name = "", w.ns })
	if err := env.Client.Create(context.Background(), nc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), nc) })
	return nc
}

// host creates an Available host with the given node address, then
// applies status (claims, markers) as the cloud provider would have.
func (w *idWorld) host(t *testing.T, name, nodeAddress string, status ...func(*v1beta1.SSHHost)) {
	t.Helper()
	ctx := context.Background()
	h := newHost(name, "small", func(h *v1beta1.SSHHost) { h.Namespace, h.Spec.NodeAddress = w.ns, nodeAddress })
	st := h.Status
	if err := env.Client.Create(ctx, h); err != nil {
		t.Fatal(err)
	}
	h.Status = st
	for _, s := range status {
		s(h)
	}
	if err := env.Client.Status().Update(ctx, h); err != nil {
		t.Fatal(err)
	}
}

func (w *idWorld) get(t *testing.T, name string) *v1beta1.SSHHost {
	t.Helper()
	h := &v1beta1.SSHHost{}
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: w.ns, Name: name}, h); err != nil {
		t.Fatal(err)
	}
	return h
}

// idNode creates a Node with an InternalIP (deleted after the test).
func idNode(t *testing.T, name, providerID, ip string, labels map[string]string) *corev1.Node {
	t.Helper()
	return env.CreateNode(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Spec: corev1.NodeSpec{ProviderID: providerID}}, ip)
}

func nodeExists(t *testing.T, n *corev1.Node) bool {
	t.Helper()
	got := &corev1.Node{}
	err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(n), got)
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	return err == nil && got.DeletionTimestamp.IsZero()
}

// heldAs is the status of a host claim holds: InUse with providerID, or,
// with none, mid-join (Claimed, a token minted).
func heldAs(claim *karpv1.NodeClaim, providerID string) func(*v1beta1.SSHHost) {
	return func(h *v1beta1.SSHHost) {
		inUse(claim)(h)
		h.Status.ProviderID = providerID
		if providerID == "" {
			h.Status.State = v1beta1.HostClaimed
		}
	}
}

func hostLabel(ns, name string) map[string]string {
	return map[string]string{v1beta1.LabelHost: v1beta1.HostLabelValue(ns, name)}
}

func TestDeleteDeletesOnlyTheHostsOwnNode(t *testing.T) {
	ctx := context.Background()
	t.Run("nodeAddress of an unrelated Node: it survives the Delete", func(t *testing.T) {
		w := identityWorld(t, "del-unrelated", v1beta1.ProviderIDStatic)
		claim := w.claim(t, w.ns+"-a")
		w.host(t, "h1", "10.67.1.1", heldAs(claim, ProviderID(w.ns, "h1")))
		victim := idNode(t, w.ns+"-victim", "aws:///eu-west-1a/i-0bbbbbbbbbbbbbbb1", "10.67.1.1", nil)
		if err := w.cp.Delete(ctx, claim); err != nil {
			t.Fatal(err)
		}
		if !nodeExists(t, victim) {
			t.Fatal("Delete deleted an unrelated Node whose InternalIP the host's nodeAddress names")
		}
		if h := w.get(t, "h1"); h.Status.State != v1beta1.HostAvailable || h.Status.ClaimRef != nil {
			t.Fatalf("host not released: %+v", h.Status)
		}
	})
	t.Run("overlapping site addresses: the host's own Node is deleted, the other site's is not", func(t *testing.T) {
		w := identityWorld(t, "del-overlap", v1beta1.ProviderIDStatic)
		claim := w.claim(t, w.ns+"-a")
		w.host(t, "h2", "10.67.1.2", heldAs(claim, ProviderID(w.ns, "h2")))
		other := idNode(t, w.ns+"-a-site-b", "kpssh://site-b/h2", "10.67.1.2", nil)
		own := idNode(t, w.ns+"-h2", ProviderID(w.ns, "h2"), "10.67.1.2", nil)
		if err := w.cp.Delete(ctx, claim); err != nil {
			t.Fatal(err)
		}
		if !nodeExists(t, other) {
			t.Fatal("Delete deleted another site's Node with the same InternalIP")
		}
		if nodeExists(t, own) {
			t.Fatal("Delete left the host's own Node (the flow of TestDeleteRemovesTheNodeLeftByTheClaim)")
		}
	})
	t.Run("Adopt host deleted mid-join: the Node with its host label is deleted, the unrelated one is not", func(t *testing.T) {
		w := identityWorld(t, "del-midjoin", v1beta1.ProviderIDAdopt)
		claim := w.claim(t, w.ns+"-a")
		w.host(t, "h3", "10.67.1.3", heldAs(claim, ""))
		victim := idNode(t, w.ns+"-a-victim", "eks-hybrid:///eu/c/mi-0victim", "10.67.1.3", nil)
		own := idNode(t, w.ns+"-mi-own", "eks-hybrid:///eu/c/mi-0own", "10.67.1.3", hostLabel(w.ns, "h3"))
		if err := w.cp.Delete(ctx, claim); err != nil {
			t.Fatal(err)
		}
		if !nodeExists(t, victim) {
			t.Fatal("Delete deleted an unrelated Node with the host's InternalIP")
		}
		if nodeExists(t, own) {
			t.Fatal("Delete left the Node that registered from the host")
		}
	})
}

func TestAdoptTakesOnlyTheHostsOwnNode(t *testing.T) {
	ctx := context.Background()
	t.Run("nodeAddress of an unrelated Node: not adopted", func(t *testing.T) {
		w := identityWorld(t, "adopt-unrelated", v1beta1.ProviderIDAdopt)
		w.host(t, "h1", "10.68.1.1")
		claim := w.claim(t, w.ns+"-a")
		victim := idNode(t, w.ns+"-victim", "aws:///eu-west-1a/i-0ccccccccccccccc1", "10.68.1.1", nil)
		_, err := w.cp.Create(ctx, claim)
		h := w.get(t, "h1")
		if h.Status.ProviderID == victim.Spec.ProviderID || err == nil {
			t.Fatalf("adopted the unrelated Node's providerID %q (err %v)", h.Status.ProviderID, err)
		}
		if !isCreateError(err) || !contains(w.rec.reasons(), ReasonAdoptFailed) || h.Status.State != v1beta1.HostUnhealthy {
			t.Fatalf("err %v, events %v, state %s: want AdoptFailed and the host Unhealthy", err, w.rec.reasons(), h.Status.State)
		}
		if !nodeExists(t, victim) {
			t.Fatal("the unrelated Node was deleted")
		}
	})
	t.Run("overlapping addresses: the Node that joined from the host is adopted, not the other", func(t *testing.T) {
		w := identityWorld(t, "adopt-overlap", v1beta1.ProviderIDAdopt)
		w.host(t, "h2", "10.68.1.2")
		claim := w.claim(t, w.ns+"-a")
		idNode(t, w.ns+"-a-other", "eks-hybrid:///eu/c/mi-0other", "10.68.1.2", nil)
		w.ph.during = func(ph engine.Phase) {
			if ph == engine.PhaseJoin { // the join's kubelet registers
				idNode(t, w.ns+"-mi-own", "eks-hybrid:///eu/c/mi-0own", "10.68.1.2", hostLabel(w.ns, "h2"))
			}
		}
		out, err := w.cp.Create(ctx, claim)
		if err != nil {
			t.Fatal(err)
		}
		if out.Status.ProviderID != "eks-hybrid:///eu/c/mi-0own" || w.get(t, "h2").Status.ProviderID != out.Status.ProviderID {
			t.Fatalf("adopted %q, want the host's own Node's eks-hybrid:///eu/c/mi-0own", out.Status.ProviderID)
		}
	})
	t.Run("two Nodes carry the host's identity: neither is adopted, the failure names both", func(t *testing.T) {
		w := identityWorld(t, "adopt-ambiguous", v1beta1.ProviderIDAdopt)
		w.host(t, "h3", "10.68.1.3")
		claim := w.claim(t, w.ns+"-a")
		idNode(t, w.ns+"-mi-one", "eks-hybrid:///eu/c/mi-0one", "10.68.1.3", hostLabel(w.ns, "h3"))
		idNode(t, w.ns+"-mi-two", "eks-hybrid:///eu/c/mi-0two", "10.68.1.3", hostLabel(w.ns, "h3"))
		_, err := w.cp.Create(ctx, claim)
		if h := w.get(t, "h3"); err == nil || h.Status.ProviderID != "" {
			t.Fatalf("adopted %q out of two Nodes carrying the host's identity (err %v)", h.Status.ProviderID, err)
		}
		if !strings.Contains(err.Error(), w.ns+"-mi-one") || !strings.Contains(err.Error(), w.ns+"-mi-two") {
			t.Fatalf("the failure does not name both Nodes: %v", err)
		}
	})
}
