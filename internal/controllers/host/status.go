package host

import (
	"context"

	"github.com/awslabs/operatorpkg/status"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dklesev/kpssh/apis/v1beta1"
)

// Ready condition reasons on SSHHost.
const (
	ReasonProbeSucceeded = "ProbeSucceeded"
	ReasonProbeFailed    = "ProbeFailed"
	ReasonAwaitingProbe  = "AwaitingProbe"
	ReasonMaintenance    = "Maintenance"
)

// setState sets state and the Ready condition that mirrors it.
func setState(h *v1beta1.SSHHost, s v1beta1.HostState, msg string, now metav1.Time) {
	h.Status.State = s
	cond := status.Condition{Type: v1beta1.ConditionReady, ObservedGeneration: h.Generation, LastTransitionTime: now}
	switch s {
	case v1beta1.HostAvailable, v1beta1.HostClaimed, v1beta1.HostInUse:
		cond.Status, cond.Reason = metav1.ConditionTrue, ReasonProbeSucceeded
	case v1beta1.HostUnhealthy:
		cond.Status, cond.Reason = metav1.ConditionFalse, ReasonProbeFailed
	case v1beta1.HostMaintenance:
		cond.Status, cond.Reason = metav1.ConditionFalse, ReasonMaintenance
	default: // Pending, Leaving
		cond.Status, cond.Reason = metav1.ConditionUnknown, ReasonAwaitingProbe
	}
	cond.Message = msg
	for i, c := range h.Status.Conditions {
		if c.Type != cond.Type {
			continue
		}
		if c.Status == cond.Status {
			cond.LastTransitionTime = c.LastTransitionTime
		}
		h.Status.Conditions[i] = cond
		return
	}
	h.Status.Conditions = append(h.Status.Conditions, cond)
}

// patchStatus writes the status of h as a compare-and-swap against orig's
// resourceVersion (merge patch with optimistic lock). An unchanged status is
// not written. A conflict comes back as an error the caller requeues on.
func patchStatus(ctx context.Context, c client.Client, orig, h *v1beta1.SSHHost) error {
	if equality.Semantic.DeepEqual(orig.Status, h.Status) {
		return nil
	}
	return c.Status().Patch(ctx, h, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{}))
}
