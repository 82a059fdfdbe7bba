package startuptaint

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/karpenter/pkg/events"
)

// Event reasons on Node objects (operators alert on these; keep the names).
const (
	ReasonStartupTaintRemoved     = "StartupTaintRemoved"
	ReasonStartupTaintGateInvalid = "StartupTaintGateInvalid"
)

func taintRemoved(n *corev1.Node, class string, v verdict) events.Event {
	return events.Event{InvolvedObject: n, Type: corev1.EventTypeNormal, Reason: ReasonStartupTaintRemoved,
		Message: fmt.Sprintf("removed startup taint %s: gate %s of SSHNodeClass %s holds", v.key, v.gate, class)}
}

// gateInvalid is deduplicated per node, taint and error: every Pod or Node
// change re-evaluates the gate, and one event per dedupe window is enough.
func gateInvalid(n *corev1.Node, class, key string, err error) events.Event {
	return events.Event{InvolvedObject: n, Type: corev1.EventTypeWarning, Reason: ReasonStartupTaintGateInvalid,
		Message:      fmt.Sprintf("startup taint %s stays: gate of SSHNodeClass %s is invalid: %v", key, class, err),
		DedupeValues: []string{string(n.UID), key, err.Error()}}
}
