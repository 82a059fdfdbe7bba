package host

import (
	"context"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dklesev/kpssh/apis/v1beta1"
)

func setState(h *v1beta1.SSHHost, s v1beta1.HostState, msg string, now metav1.Time) {
	h.SetState(s, msg, now)
}

// Ready condition reasons, re-exported for the controller's readers.
const (
	ReasonProbeSucceeded = v1beta1.ReasonProbeSucceeded
	ReasonProbeFailed    = v1beta1.ReasonProbeFailed
	ReasonAwaitingProbe  = v1beta1.ReasonAwaitingProbe
	ReasonMaintenance    = v1beta1.ReasonMaintenance
)

// patchStatus writes the status of h as a compare-and-swap against orig's
// resourceVersion (merge patch with optimistic lock). An unchanged status is
// not written. A conflict comes back as an error the caller requeues on.
func patchStatus(ctx context.Context, c client.Client, orig, h *v1beta1.SSHHost) error {
	if equality.Semantic.DeepEqual(orig.Status, h.Status) {
		return nil
	}
	return c.Status().Patch(ctx, h, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{}))
}
