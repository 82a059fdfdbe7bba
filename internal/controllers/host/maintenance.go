package host

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/dklesev/kpssh/apis/v1beta1"
)

// maintenance parks an unclaimed annotated host (no probes while parked) and
// hands it back as Pending when the annotation goes. Claimed hosts never get
// here: the annotation parks, it does not evict.
func (c *Controller) maintenance(ctx context.Context, h *v1beta1.SSHHost) (reconcile.Result, bool, error) {
	now := metav1.NewTime(c.Clock.Now())
	orig := h.DeepCopy()
	switch {
	case h.InMaintenance():
		setState(h, v1beta1.HostMaintenance, "maintenance annotation present", now)
		return reconcile.Result{}, true, patchStatus(ctx, c.Client, orig, h)
	case h.Status.State == v1beta1.HostMaintenance:
		setState(h, v1beta1.HostPending, "maintenance ended", now)
		if err := patchStatus(ctx, c.Client, orig, h); err != nil {
			return reconcile.Result{}, true, err
		}
		return reconcile.Result{Requeue: true}, true, nil
	}
	return reconcile.Result{}, false, nil
}
