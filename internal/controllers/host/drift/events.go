package drift

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/karpenter/pkg/events"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/providers/phase"
)

// Event reasons on SSHHost objects.
const (
	// ReasonHostDrift: a check found that install or join would change the
	// host; Karpenter replaces the node (IsDrifted: HostDrift).
	ReasonHostDrift = "HostDrift"
	// ReasonDriftCheckInconclusive: a check could not decide (the host
	// unreachable, a task failing in check mode, no scripts.check).
	ReasonDriftCheckInconclusive = "DriftCheckInconclusive"
)

func hostDrift(h *v1beta1.SSHHost, ref *v1beta1.ClaimRef, tasks []string) events.Event {
	msg := fmt.Sprintf("install or join would change the host (%s): Karpenter replaces NodeClaim %s", strings.Join(tasks, "; "), ref.Name)
	return events.Event{InvolvedObject: h, Type: corev1.EventTypeWarning, Reason: ReasonHostDrift,
		Message:      phase.Truncate(msg, 1024),
		DedupeValues: []string{string(h.UID), string(ref.UID), strings.Join(tasks, "\x00")}}
}

func checkInconclusive(h *v1beta1.SSHHost, res phase.Drift) events.Event {
	return events.Event{InvolvedObject: h, Type: corev1.EventTypeWarning, Reason: ReasonDriftCheckInconclusive,
		Message:      phase.Truncate(fmt.Sprintf("drift check %s (not drift): %s", res.Result, res.Message), 1024),
		DedupeValues: []string{string(h.UID), string(res.Result), res.Message}}
}
