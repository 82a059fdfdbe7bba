package host

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/karpenter/pkg/events"

	"github.com/dklesev/kpssh/apis/v1beta1"
)

// Event reasons on SSHHost objects (operators alert on these; keep the names).
const (
	ReasonCapacityDrift     = "CapacityDrift"
	ReasonZombieKubelet     = "ZombieKubelet"
	ReasonZombieLeft        = "ZombieLeft"
	ReasonZombieLeaveFailed = "ZombieLeaveFailed"
	ReasonForeignKubelet    = "ForeignKubelet"
	ReasonDuplicateHost     = "DuplicateHost"
	ReasonRebootReturned    = "RebootReturned"
	ReasonRebootLost        = "RebootLost"
)

func rebootReturned(h *v1beta1.SSHHost, op string, took time.Duration) events.Event {
	return events.Event{InvolvedObject: h, Type: corev1.EventTypeNormal, Reason: ReasonRebootReturned,
		Message:      fmt.Sprintf("host back from reboot %s after %s; still claimed", op, took.Round(time.Second)),
		DedupeValues: []string{string(h.UID), op}}
}

func rebootLost(h *v1beta1.SSHHost, op, msg string) events.Event {
	return events.Event{InvolvedObject: h, Type: corev1.EventTypeWarning, Reason: ReasonRebootLost,
		Message:      fmt.Sprintf("reboot %s: %s; Unhealthy, the claim kept until the host returns or Karpenter replaces the node", op, msg),
		DedupeValues: []string{string(h.UID), op}}
}

func capacityDrift(h *v1beta1.SSHHost, shortfall string) events.Event {
	return events.Event{InvolvedObject: h, Type: corev1.EventTypeWarning, Reason: ReasonCapacityDrift,
		Message:      fmt.Sprintf("probe measured less than spec.capacity: %s", shortfall),
		DedupeValues: []string{string(h.UID), shortfall}}
}

func zombieKubelet(h *v1beta1.SSHHost) events.Event {
	return events.Event{InvolvedObject: h, Type: corev1.EventTypeWarning, Reason: ReasonZombieKubelet,
		Message:      "kubelet active on an unclaimed host; running the profile's leave (fix the profile's leave: it must disable kubelet and containerd)",
		DedupeValues: []string{string(h.UID)}}
}

func zombieLeft(h *v1beta1.SSHHost) events.Event {
	return events.Event{InvolvedObject: h, Type: corev1.EventTypeNormal, Reason: ReasonZombieLeft,
		Message: "zombie kubelet stopped and the Node tied to the host, if any, deleted; host is back in the pool", DedupeValues: []string{string(h.UID)}}
}

func zombieLeaveFailed(h *v1beta1.SSHHost, err error) events.Event {
	return events.Event{InvolvedObject: h, Type: corev1.EventTypeWarning, Reason: ReasonZombieLeaveFailed,
		Message: fmt.Sprintf("leave on a zombie kubelet failed, retrying each probe: %v", err), DedupeValues: []string{string(h.UID)}}
}

func foreignKubelet(h *v1beta1.SSHHost) events.Event {
	return events.Event{InvolvedObject: h, Type: corev1.EventTypeWarning, Reason: ReasonForeignKubelet,
		Message:      "a kubelet not started by kpssh runs on this host (no Node tied to it, no install marker); parked Unhealthy, nothing touched",
		DedupeValues: []string{string(h.UID)}}
}

func duplicateHost(h *v1beta1.SSHHost, msg string) events.Event {
	return events.Event{InvolvedObject: h, Type: corev1.EventTypeWarning, Reason: ReasonDuplicateHost,
		Message: msg, DedupeValues: []string{string(h.UID), msg}}
}
