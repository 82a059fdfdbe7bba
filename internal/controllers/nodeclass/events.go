package nodeclass

import (
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/karpenter/pkg/events"

	"github.com/dklesev/kpssh/apis/v1beta1"
)

// ReasonWaitingOnNodeClaims is the event of a deletion held by the finalizer.
const ReasonWaitingOnNodeClaims = "WaitingOnNodeClaims"

func (c *Controller) publish(evs ...events.Event) {
	if c.Recorder != nil {
		c.Recorder.Publish(evs...)
	}
}

// notReadyEvent reports the class going Ready=False; its reason is the
// condition's (ProfileNotFound, ProfileInvalid, SelectorError, NoHosts).
func notReadyEvent(nc *v1beta1.SSHNodeClass, reason, message string) events.Event {
	return events.Event{InvolvedObject: nc, Type: corev1.EventTypeWarning, Reason: reason,
		Message:      "not ready, Karpenter will not launch against this class: " + message,
		DedupeValues: []string{string(nc.UID), reason, message}}
}

// waitingOnNodeClaimsEvent explains a deletion that does not finish.
func waitingOnNodeClaimsEvent(nc *v1beta1.SSHNodeClass, claims []string) events.Event {
	sort.Strings(claims)
	shown := claims
	if len(shown) > 5 {
		shown = shown[:5]
	}
	msg := fmt.Sprintf("deletion waits for %d NodeClaim(s) referencing this class: %s", len(claims), strings.Join(shown, ", "))
	if len(claims) > len(shown) {
		msg += ", …"
	}
	return events.Event{InvolvedObject: nc, Type: corev1.EventTypeNormal, Reason: ReasonWaitingOnNodeClaims,
		Message: msg, DedupeValues: []string{string(nc.UID)}}
}
