package leave

import (
	"errors"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/karpenter/pkg/events"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/engine"
)

// SSHHost event reasons of a leave.
const (
	// ReasonLeaveFallback: the fallback leave ran instead of the profile's
	// (no marker, the profile deleted, its leave refused before it ran).
	ReasonLeaveFallback = "LeaveFallback"
	// ReasonLeaveFailed: no leave succeeded; the host is held Unhealthy
	// with condition LeaveFailed until one does.
	ReasonLeaveFailed = "LeaveFailed"
)

// Record sets host h's LeaveFailed condition from a leave's result (when
// names the occasion: "under NodeClaim x", "by the zombie guard"): True
// with its outcome when it failed, removed when it succeeded.
func Record(h *v1beta1.SSHHost, res Result, when string, now metav1.Time) {
	if res.OK() {
		h.SetLeaveFailed("", "", now)
		return
	}
	h.SetLeaveFailed(string(res.Result.Outcome), FailedMessage(res, when), now)
}

// RecordError is Record for the error of a Provider's Leave (an *Error, or
// any other failure: reason Failed).
func RecordError(h *v1beta1.SSHHost, err error, when string, now metav1.Time) {
	var le *Error
	if errors.As(err, &le) {
		Record(h, le.Result, when, now)
		return
	}
	h.SetLeaveFailed(string(engine.Failed), failedMessage(err.Error(), when), now)
}

// FailedMessage says what failed and what the host controller does next.
func FailedMessage(res Result, when string) string { return failedMessage(res.Summary(), when) }

func failedMessage(summary, when string) string {
	return "leave " + when + " did not succeed, so the kubelet may still run: " + summary +
		"; the host stays Unhealthy and the probe runs leave again until one succeeds"
}

// FallbackEvent is the LeaveFallback event of a leave whose fallback ran
// (when names the occasion), nil when it did not.
func FallbackEvent(h *v1beta1.SSHHost, res Result, when string) *events.Event {
	if res.Fallback == "" {
		return nil
	}
	return &events.Event{InvolvedObject: h, Type: corev1.EventTypeWarning, Reason: ReasonLeaveFallback,
		Message:      "leave " + when + " ran the fallback leave (on a Verified host the one its provisioning installed): " + res.Fallback,
		DedupeValues: []string{string(h.UID), res.Fallback}}
}

// FailedEvent is the LeaveFailed event of a leave that did not succeed.
func FailedEvent(h *v1beta1.SSHHost, res Result, when string) events.Event {
	msg := FailedMessage(res, when)
	return events.Event{InvolvedObject: h, Type: corev1.EventTypeWarning, Reason: ReasonLeaveFailed,
		Message: msg, DedupeValues: []string{string(h.UID), msg}}
}
