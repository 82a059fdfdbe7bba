package cloudprovider

import (
	"context"
	"strings"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/engine"
)

// A Verified host's shim refusal is sticky: the refused host is neither
// offered nor claimed again for the node class while the node class, its
// profile and the host's spec are unchanged (each retry would mint and ship
// a token for the same refusal); a change of any of them lifts it, and a
// successful launch clears the record. A script failure (rc 10) is not
// sticky.
func TestShimRejectionIsStickyUntilSomethingChanges(t *testing.T) {
	ctx := context.Background()
	refused := engine.Result{Outcome: engine.Rejected, RC: engine.ShimBadSignature, FailedTask: "kpssh: join verified script",
		Message: "the host's shim refused the phase (exit 2, signature rejected)"}
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, w *world)
	}{
		{"profile re-signed", func(t *testing.T, w *world) {
			p := &v1beta1.SSHJoinProfile{}
			if err := w.c.Get(ctx, client.ObjectKey{Name: joinProfile().Name}, p); err != nil {
				t.Fatal(err)
			}
			p.Generation++
			if err := w.c.Update(ctx, p); err != nil {
				t.Fatal(err)
			}
		}},
		{"node class changed", func(t *testing.T, w *world) {
			nc := &v1beta1.SSHNodeClass{}
			if err := w.c.Get(ctx, client.ObjectKey{Name: nodeClass().Name}, nc); err != nil {
				t.Fatal(err)
			}
			nc.Generation++
			if err := w.c.Update(ctx, nc); err != nil {
				t.Fatal(err)
			}
		}},
		{"host spec changed", func(t *testing.T, w *world) {
			h := w.host(t, "h1")
			h.Generation++
			if err := w.c.Update(ctx, h); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, nil, standard(newHost("h1", "small", func(h *v1beta1.SSHHost) { h.Status.InstalledProfile = "prof@2" }))...)
			w.ph.results[engine.PhaseJoin] = refused
			if _, err := w.cp.Create(ctx, newNodeClaim("a")); err == nil {
				t.Fatal("a refused join succeeded")
			}
			h := w.host(t, "h1")
			r := h.Status.ShimRejection
			if r == nil || r.RC != 2 || r.Phase != v1beta1.PhaseJoin || r.NodeClass != nodeClass().Name || r.Profile != joinProfile().Name {
				t.Fatalf("shimRejection %+v", r)
			}
			cond := h.StatusConditions().Get(v1beta1.ConditionShimRejected)
			if cond == nil || !cond.IsTrue() || cond.Reason != "SignatureRejected" || !strings.Contains(cond.Message, "signature rejected") ||
				!strings.Contains(cond.Message, "until it, its profile "+joinProfile().Name+" or this host's spec changes") {
				t.Fatalf("ShimRejected condition %+v", cond)
			}
			if h.Status.BootstrapTokenID != "" || w.tok.leaked() != 0 {
				t.Fatalf("the refused launch left its token: host %q, %d live", h.Status.BootstrapTokenID, w.tok.leaked())
			}
			// The host is back Available (as the probe would make it), and
			// still neither offered nor claimed.
			h.SetState(v1beta1.HostAvailable, "probed", h.Status.ShimRejection.At)
			if err := w.c.Status().Update(ctx, h); err != nil {
				t.Fatal(err)
			}
			joins := len(w.ph.calls)
			_, err := w.cp.Create(ctx, newNodeClaim("b"))
			if !cloudprovider.IsInsufficientCapacityError(err) {
				t.Fatalf("second claim: %v, want insufficient capacity", err)
			}
			if len(w.ph.calls) != joins || w.tok.n != 1 {
				t.Fatalf("the refused host was launched again: %d phase calls (was %d), %d tokens minted", len(w.ph.calls), joins, w.tok.n)
			}
			its, err := w.cp.GetInstanceTypes(ctx, ourPool)
			if err != nil {
				t.Fatal(err)
			}
			if len(its) != 1 || its[0].Name != "small" || len(its[0].Offerings.Launchable()) > 0 {
				t.Fatalf("instance types with the only host refused: %v (want small, offered, unavailable)", its)
			}
			// What was refused changes: claimed again; success clears the record.
			tc.change(t, w)
			delete(w.ph.results, engine.PhaseJoin)
			if _, err := w.cp.Create(ctx, newNodeClaim("c")); err != nil {
				t.Fatalf("after the change: %v", err)
			}
			h = w.host(t, "h1")
			if h.Status.ShimRejection != nil || h.StatusConditions().Get(v1beta1.ConditionShimRejected) != nil {
				t.Fatalf("a successful launch kept the rejection: %+v %+v", h.Status.ShimRejection, h.Status.Conditions)
			}
		})
	}
	t.Run("a failed script is not sticky", func(t *testing.T) {
		w := newWorld(t, nil, standard(newHost("h1", "small", func(h *v1beta1.SSHHost) { h.Status.InstalledProfile = "prof@2" }))...)
		w.ph.results[engine.PhaseJoin] = engine.Result{Outcome: engine.Failed, RC: engine.ShimScriptFailed, Message: "shim exit 10 (script failed)"}
		if _, err := w.cp.Create(ctx, newNodeClaim("a")); err == nil {
			t.Fatal("a failed join succeeded")
		}
		if r := w.host(t, "h1").Status.ShimRejection; r != nil {
			t.Fatalf("a script failure recorded a shim rejection: %+v", r)
		}
	})
}

var ourPool = &karpv1.NodePool{Spec: karpv1.NodePoolSpec{Template: karpv1.NodeClaimTemplate{Spec: karpv1.NodeClaimTemplateSpec{
	NodeClassRef: &karpv1.NodeClassReference{Group: v1beta1.Group, Kind: "SSHNodeClass", Name: "pool"}}}}}
