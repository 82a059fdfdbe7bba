package host

import (
	"context"
	"errors"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/providers/token"
)

// repairStaleClaim releases a host whose NodeClaim is gone or was replaced by
// another object of the same name (UID mismatch) — the repair path for a
// force-deleted NodeClaim. A live claim ends the reconcile: claimed hosts are
// the provider's, not the probe's — except while one reboots (watchReboot).
func (c *Controller) repairStaleClaim(ctx context.Context, h *v1beta1.SSHHost) (reconcile.Result, bool, error) {
	ref := h.Status.ClaimRef
	if ref == nil {
		return reconcile.Result{}, false, nil
	}
	nc := &karpv1.NodeClaim{}
	err := c.Client.Get(ctx, client.ObjectKey{Name: ref.Name}, nc)
	switch {
	case err == nil && nc.UID == ref.UID:
		res, err := c.watchReboot(ctx, h)
		return res, true, err
	case err != nil && !apierrors.IsNotFound(err):
		return reconcile.Result{}, true, err
	}
	// Delete the token before forgetting its id: a crash in between must not
	// leave an unrecorded token in kube-system. A malformed id names no
	// token of ours; refusing the release over it would wedge the host.
	if err := c.Tokens.Delete(ctx, h.Status.BootstrapTokenID); err != nil && !errors.Is(err, token.ErrMalformedID) {
		return reconcile.Result{}, true, err
	}
	orig := h.DeepCopy()
	h.Status.ClaimRef = nil
	h.Status.BootstrapTokenID = ""
	h.Status.ProviderID = ""
	h.SetReboot(nil, metav1.NewTime(c.Clock.Now()))
	// The claim's phase, if one was shown Running, can no longer record its end.
	h.InterruptPhase("interrupted: NodeClaim " + ref.Name + " no longer exists; the phase's end was not recorded")
	h.SetHostDrift(nil, "", metav1.NewTime(c.Clock.Now()))
	setState(h, v1beta1.HostPending, "released: NodeClaim "+ref.Name+" no longer exists", metav1.NewTime(c.Clock.Now()))
	if err := patchStatus(ctx, c.Client, orig, h); err != nil {
		return reconcile.Result{}, true, err
	}
	log.FromContext(ctx).Info("released stale claim", "NodeClaim", klog.KRef("", ref.Name), "uid", ref.UID)
	return reconcile.Result{Requeue: true}, true, nil
}
