package cloudprovider

import (
	corev1 "k8s.io/api/core/v1"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/karpenter/pkg/events"
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
)

func nodeClaimFailed(nc *karpv1.NodeClaim, reason, msg string) events.Event {
	return events.Event{InvolvedObject: nc, Type: corev1.EventTypeWarning, Reason: reason, Message: msg,
		DedupeValues: []string{string(nc.UID), reason, msg}}
}
