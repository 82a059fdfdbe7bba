package host_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/providers/token"
)

// Token GC against the real apiserver: real token Secrets (minted by the
// token provider), real Nodes, the controller in a manager. The probe
// interval is an hour, so only the Node watch can make the GC run after the
// start: a collected token proves registration wakes the host.
func TestTokenGCAgainstAPIServer(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: needs the real apiserver")
	}
	ctx := context.Background()
	ns := "pool-tokengc"
	createNS(t, ns)
	tokens := token.New(env.Client)

	// claimedHost creates a host claimed by a fresh NodeClaim, mid-join with
	// a freshly minted token.
	claimedHost := func(name, nodeAddress string) (*v1beta1.SSHHost, token.Token) {
		t.Helper()
		nc := &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: "nc-" + name}, Spec: karpv1.NodeClaimSpec{
			NodeClassRef: &karpv1.NodeClassReference{Group: v1beta1.Group, Kind: "SSHNodeClass", Name: "default"},
			Requirements: []karpv1.NodeSelectorRequirementWithMinValues{{Key: karpv1.CapacityTypeLabelKey, Operator: corev1.NodeSelectorOpIn, Values: []string{karpv1.CapacityTypeOnDemand}}},
		}}
		if err := env.Client.Create(ctx, nc); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), nc) })
		tok, err := tokens.Mint(ctx, nc.Name)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tokens.Delete(context.Background(), tok.ID) })
		h := &v1beta1.SSHHost{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: v1beta1.SSHHostSpec{
			Address: "10.77.0.1", NodeAddress: nodeAddress, SSHKeySecretRef: v1beta1.LocalObjectReference{Name: "unused"},
			Capacity: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("1Gi")}}}
		if err := env.Client.Create(ctx, h); err != nil {
			t.Fatal(err)
		}
		orig := h.DeepCopy()
		h.SetState(v1beta1.HostClaimed, "claimed by NodeClaim "+nc.Name, metav1.Now())
		h.Status.ClaimRef = &v1beta1.ClaimRef{Name: nc.Name, UID: nc.UID}
		h.Status.BootstrapTokenID = tok.ID
		if err := env.Client.Status().Patch(ctx, h, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})); err != nil {
			t.Fatal(err)
		}
		return h, tok
	}
	tokenState := func(h *v1beta1.SSHHost, tok token.Token) (secretGone bool, id string) {
		err := env.Client.Get(ctx, client.ObjectKey{Namespace: token.Namespace, Name: token.SecretName(tok.ID)}, &corev1.Secret{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		return apierrors.IsNotFound(err), get(t, ns, h.Name).Status.BootstrapTokenID
	}
	waitCollected := func(h *v1beta1.SSHHost, tok token.Token) {
		t.Helper()
		eventually(t, h.Name+"'s token collected", 30*time.Second, func() (bool, string) {
			gone, id := tokenState(h, tok)
			return gone && id == "", fmt.Sprintf("secret gone=%v id=%q", gone, id)
		})
	}
	mkNode := func(n *corev1.Node) *corev1.Node {
		t.Helper()
		if err := env.Client.Create(ctx, n); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), n) })
		return n
	}

	static, staticTok := claimedHost("gc-static", "")
	adopt, adoptTok := claimedHost("gc-adopt", "10.77.0.2")
	waiting, waitingTok := claimedHost("gc-waiting", "10.77.0.3")
	// A Node that registered while the controller was down is found by
	// its first pass. That takes a Node list, so once this token is
	// collected the pass has run and the Node cache is synced: whatever is
	// collected after is the Node watch's doing.
	early, earlyTok := claimedHost("gc-early", "10.77.0.4")
	n := mkNode(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gc-early", Labels: map[string]string{v1beta1.LabelHost: v1beta1.HostLabelValue(ns, early.Name)}}})
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.77.0.4"}}
	if err := env.Client.Status().Update(ctx, n); err != nil {
		t.Fatal(err)
	}
	startController(t, ns, time.Hour)
	waitCollected(early, earlyTok)

	t.Run("Static: the Node's providerID names the host", func(t *testing.T) {
		mkNode(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gc-static"}, Spec: corev1.NodeSpec{ProviderID: "kpssh://" + ns + "/gc-static"}})
		waitCollected(static, staticTok)
		if h := get(t, ns, static.Name); h.Status.ClaimRef == nil || h.Status.State != v1beta1.HostClaimed {
			t.Fatalf("GC touched more than the token id: %+v", h.Status)
		}
	})

	t.Run("Adopt: the Node (with the host label) gets the host's InternalIP after it is created", func(t *testing.T) {
		n := mkNode(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "mi-0123456789abcdef0", Labels: map[string]string{v1beta1.LabelHost: v1beta1.HostLabelValue(ns, adopt.Name)}},
			Spec: corev1.NodeSpec{ProviderID: "eks-hybrid:///us-west-2/c1/mi-0123456789abcdef0"}})
		// Without an address the Node cannot be matched yet.
		if gone, id := tokenState(adopt, adoptTok); gone || id == "" {
			t.Fatalf("collected before the Node could be matched: gone=%v id=%q", gone, id)
		}
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.77.0.2"}}
		if err := env.Client.Status().Update(ctx, n); err != nil {
			t.Fatal(err)
		}
		waitCollected(adopt, adoptTok)
	})

	t.Run("a host whose Node has not registered keeps its token", func(t *testing.T) {
		// An unrelated Node wakes nobody and collects nothing.
		mkNode(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gc-unrelated"}, Spec: corev1.NodeSpec{ProviderID: "kpssh://" + ns + "/someone-else"}})
		time.Sleep(2 * time.Second)
		if gone, id := tokenState(waiting, waitingTok); gone || id != waitingTok.ID {
			t.Fatalf("token of a host still joining collected: gone=%v id=%q", gone, id)
		}
	})
}
