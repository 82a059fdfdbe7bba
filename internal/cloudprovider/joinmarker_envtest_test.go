package cloudprovider

import (
	"context"
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/engine"
)

// errCrash stands for the process dying at a status write: the write never
// lands and nothing after it runs (Create returns it without releasing).
var errCrash = errors.New("crash: the process died before this write")

// Issue 17 item 7, on the real apiserver: join ran and the kubelet
// registered, so the host controller collected the token (clearing its id on
// the host), and then the process died before the InUse write. The host is
// Claimed with no token id. A Delete of the NodeClaim must still run leave —
// its kubelet runs — and delete the Node it registered.
func TestDeleteAfterJoinWithoutInUseRunsLeave(t *testing.T) {
	ctx := context.Background()
	w := identityWorld(t, "join-crash", v1beta1.ProviderIDStatic)
	w.host(t, "h1", "10.69.1.1")
	claim := w.claim(t, w.ns+"-a")
	real, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	crashing := interceptor.NewClient(real, interceptor.Funcs{
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, o client.Object, p client.Patch, opts ...client.SubResourcePatchOption) error {
			if h, ok := o.(*v1beta1.SSHHost); ok && h.Status.State == v1beta1.HostInUse {
				return errCrash
			}
			return c.SubResource(sub).Patch(ctx, o, p, opts...)
		}})
	w.cp = New(crashing, env.Client, w.ns, w.ph, w.cp.Tokens, w.rec, clock.RealClock{})
	w.cp.Cluster = fakeCluster{}
	var node *corev1.Node
	w.ph.during = func(ph engine.Phase) {
		if ph != engine.PhaseJoin {
			return
		}
		// The join's kubelet registers, and the token GC collects its
		// token at once: the same status write tokengc makes.
		node = idNode(t, w.ns+"-h1", ProviderID(w.ns, "h1"), "10.69.1.1", nil)
		h := w.get(t, "h1")
		orig := h.DeepCopy()
		h.Status.BootstrapTokenID = ""
		if err := env.Client.Status().Patch(ctx, h, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})); err != nil {
			t.Errorf("token GC write: %v", err)
		}
	}
	if _, err := w.cp.Create(ctx, claim); !errors.Is(err, errCrash) {
		t.Fatalf("Create: %v, want the crash at the InUse write", err)
	}
	h := w.get(t, "h1")
	if h.Status.State != v1beta1.HostClaimed || h.Status.BootstrapTokenID != "" || h.Status.ClaimRef == nil {
		t.Fatalf("crash point not reached: state %s, token %q, claim %v", h.Status.State, h.Status.BootstrapTokenID, h.Status.ClaimRef)
	}
	w.ph.during = nil
	if err := w.cp.Delete(ctx, claim); err != nil {
		t.Fatal(err)
	}
	if got := w.ph.phases(); got[len(got)-1] != engine.PhaseLeave {
		t.Fatalf("phases %v: Delete released a host whose join ran without running leave", got)
	}
	if h := w.get(t, "h1"); h.Status.State != v1beta1.HostAvailable || h.Status.ClaimRef != nil {
		t.Fatalf("host after Delete: %+v", h.Status)
	}
	if nodeExists(t, node) {
		t.Fatal("the Node the join registered survived the Delete")
	}
}

// A host that Delete released is claimed again before Karpenter has removed
// its previous Node (its termination finalizer still on it): the join
// waits for that Node to be gone, the host kept claimed, or the new kubelet
// registers into the terminating object (seen in the e2e: a Node of the
// host created twice within one claim). On the real apiserver.
func TestCreateWaitsForThePreviousNodeGone(t *testing.T) {
	ctx := context.Background()
	w := identityWorld(t, "prevnode", v1beta1.ProviderIDStatic)
	name := w.ns + "-h1"
	w.host(t, name, "10.69.2.1")
	old := idNode(t, name, ProviderID(w.ns, name), "10.69.2.1", nil)
	old.Finalizers = []string{"karpenter.sh/termination"}
	if err := env.Client.Update(ctx, old); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Delete(ctx, old); err != nil {
		t.Fatal(err)
	}
	claim := w.claim(t, w.ns+"-a")
	joins := func() int {
		n := 0
		for _, c := range w.ph.phases() {
			if c == engine.PhaseJoin {
				n++
			}
		}
		return n
	}
	_, err := w.cp.Create(ctx, claim)
	if err == nil || !strings.Contains(err.Error(), "still being deleted") {
		t.Fatalf("Create with the host's previous Node terminating: %v, want a retry naming it", err)
	}
	if joins() != 0 {
		t.Fatalf("phases %v: the join ran while the previous Node was being deleted", w.ph.phases())
	}
	if h := w.get(t, name); h.Status.State != v1beta1.HostClaimed || h.Status.ClaimRef == nil || h.Status.BootstrapTokenID != "" {
		t.Fatalf("host while waiting: %+v, want still Claimed by the claim, no token minted", h.Status)
	}
	// Karpenter removes its finalizer: the Node is gone and the Create goes on.
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(old), old); err != nil {
		t.Fatal(err)
	}
	old.Finalizers = nil
	if err := env.Client.Update(ctx, old); err != nil {
		t.Fatal(err)
	}
	if _, err := w.cp.Create(ctx, claim); err != nil {
		t.Fatalf("Create once the previous Node is gone: %v", err)
	}
	if joins() != 1 {
		t.Fatalf("phases %v, want one join", w.ph.phases())
	}
	if h := w.get(t, name); h.Status.State != v1beta1.HostInUse {
		t.Fatalf("host after the Create: %+v, want InUse", h.Status)
	}
}
