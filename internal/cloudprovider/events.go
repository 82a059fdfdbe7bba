package cloudprovider

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/karpenter/pkg/events"

	"github.com/dklesev/kpssh/apis/v1beta1"
)

// NodeClaim event reasons (operators alert on these; keep the names).
const (
	// ReasonJoinFailed: install or join failed, or the configuration they
	// need (profile, secret, cluster info) is wrong.
	ReasonJoinFailed = "JoinFailed"
	// ReasonAdoptFailed: join succeeded but no Node with the host's
	// InternalIP appeared in time (providerIDSource Adopt).
	ReasonAdoptFailed = "AdoptFailed"
	// ReasonCreateFailed: anything else (token, lost claim, class gone).
	ReasonCreateFailed = "CreateFailed"
	// ReasonVerifyFailed: the joined host failed the profile's verify
	// phase; the NodeClaim is deleted before it registers.
	ReasonVerifyFailed = "VerifyFailed"
)

func nodeClaimFailed(nc *karpv1.NodeClaim, reason, msg string) events.Event {
	return events.Event{InvolvedObject: nc, Type: corev1.EventTypeWarning, Reason: reason, Message: msg,
		DedupeValues: []string{string(nc.UID), reason, msg}}
}

// Reboot event reasons, on the NodeClaim and the SSHHost.
const (
	ReasonRebootIssued = "RebootIssued"
	ReasonRebootFailed = "RebootFailed"
)

func rebootIssued(nc *karpv1.NodeClaim, h *v1beta1.SSHHost, op string) events.Event {
	return events.Event{InvolvedObject: h, Type: corev1.EventTypeNormal, Reason: ReasonRebootIssued,
		Message:      fmt.Sprintf("reboot %s of NodeClaim %s issued; the host stays claimed", op, nc.Name),
		DedupeValues: []string{string(h.UID), op}}
}

func rebootFailed(nc *karpv1.NodeClaim, h *v1beta1.SSHHost, msg string) events.Event {
	return events.Event{InvolvedObject: nc, Type: corev1.EventTypeWarning, Reason: ReasonRebootFailed,
		Message: fmt.Sprintf("host %s: %s", h.Name, msg), DedupeValues: []string{string(nc.UID), msg}}
}
