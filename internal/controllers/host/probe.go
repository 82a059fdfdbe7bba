package host

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/probe"
	"github.com/dklesev/kpssh/internal/providers/hostkey"
	"github.com/dklesev/kpssh/internal/providers/leave"
	"github.com/dklesev/kpssh/internal/sshx"
)

// fresh is the staleness guard: each status write re-triggers the controller
// through its own watch, so a host probed less than an interval ago at the
// current spec generation is not probed again. A spec edit (new generation)
// and a Pending host (needs a verdict) probe at once.
func (c *Controller) fresh(h *v1beta1.SSHHost) (time.Duration, bool) {
	if h.Status.LastProbeTime == nil || h.Status.ObservedGeneration != h.Generation || h.CurrentState() == v1beta1.HostPending || h.CurrentState() == v1beta1.HostLeaving {
		return 0, false
	}
	age := c.Clock.Since(h.Status.LastProbeTime.Time)
	if age < 0 || age >= c.Interval {
		return 0, false
	}
	return c.Interval - age, true
}

func (c *Controller) probe(ctx context.Context, h *v1beta1.SSHHost) (reconcile.Result, bool, error) {
	if remaining, ok := c.fresh(h); ok {
		return reconcile.Result{RequeueAfter: remaining}, true, nil
	}
	creds, err := c.Keys.Get(ctx, h)
	if errors.Is(err, hostkey.ErrUnavailable) {
		// The apiserver's hiccup, not the host's: leave its state alone (a
		// fleet would flap Unhealthy at once) and ask again next interval
		// (an error's backoff grows to minutes over a long outage).
		log.FromContext(ctx).Error(err, "key Secret not served: host left as it is until the next probe")
		return reconcile.Result{RequeueAfter: c.Interval}, true, nil
	}
	if err != nil {
		return c.probeFailed(ctx, h, probe.Result{}, creds, err)
	}
	start := c.Clock.Now()
	res, err := c.Prober(ctx, creds.Target(h), h.Spec.ExecMode == v1beta1.ExecModeVerified, h.Spec.ShimCommand, c.Timeout)
	if err != nil {
		probeDuration.WithLabelValues(ProbeError).Observe(c.Clock.Since(start).Seconds())
		return c.probeFailed(ctx, h, res, creds, err)
	}
	probeDuration.WithLabelValues(ProbeSuccess).Observe(c.Clock.Since(start).Seconds())
	if res.Facts.KubeletMayRun() || h.LeaveOwed() {
		// A host whose last leave failed owes one, whatever its kubelet
		// shows now: only a leave that succeeds clears it.
		return c.zombie(ctx, h, creds, res)
	}
	if h.CurrentState() == v1beta1.HostLeaving {
		// A zombie leave that stopped the kubelet but crashed before deleting
		// the Node: finish it.
		_, m, err := leave.DeleteNode(ctx, c.Client, h, zombieSince(h))
		if err != nil {
			return reconcile.Result{}, true, err
		}
		c.reportAmbiguous(ctx, h, m)
	}
	return reconcile.Result{RequeueAfter: c.Interval}, true, c.probeSucceeded(ctx, h, creds, res, "")
}

// probeSucceeded records a clean probe: Available, facts, TOFU pin.
func (c *Controller) probeSucceeded(ctx context.Context, h *v1beta1.SSHHost, creds hostkey.Credentials, res probe.Result, msg string) error {
	orig := h.DeepCopy()
	now := metav1.NewTime(c.Clock.Now())
	prevShort := shortfall(h.Spec.Capacity, h.Status.ObservedCapacity)
	recordProbe(h, creds, res, now)
	h.Status.ObservedCapacity = corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewQuantity(res.Facts.CPU, resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(res.Facts.MemoryKiB*1024, resource.BinarySI),
	}
	h.Status.ObservedArch = res.Facts.Arch
	h.Status.ObservedNodeAddress = res.Facts.NodeIP
	h.Status.LastProbeError = ""
	// Reached with no kubelet that may run, and only once an owed leave
	// succeeded (probe routes owing hosts through the zombie guard).
	h.SetLeaveFailed("", "", now)
	if msg == "" {
		msg = fmt.Sprintf("probe succeeded: %d CPU, %s memory, %s", res.Facts.CPU, h.Status.ObservedCapacity.Memory(), res.Facts.Arch)
	}
	setState(h, v1beta1.HostAvailable, msg, now)
	if err := patchStatus(ctx, c.Client, orig, h); err != nil {
		return err
	}
	// Warn only on a new shortfall, not on every probe of a known one.
	if short := shortfall(h.Spec.Capacity, h.Status.ObservedCapacity); short != "" && short != prevShort {
		c.Recorder.Publish(capacityDrift(h, short))
	}
	return nil
}

// probeFailed parks an unclaimed host Unhealthy with the error (never secret:
// transport errors carry addresses and fingerprints only).
func (c *Controller) probeFailed(ctx context.Context, h *v1beta1.SSHHost, res probe.Result, creds hostkey.Credentials, perr error) (reconcile.Result, bool, error) {
	orig := h.DeepCopy()
	now := metav1.NewTime(c.Clock.Now())
	recordProbe(h, creds, res, now)
	h.Status.LastProbeError = perr.Error()
	setState(h, v1beta1.HostUnhealthy, perr.Error(), now)
	var mm *sshx.HostKeyMismatchError
	if errors.As(perr, &mm) {
		log.FromContext(ctx).Info("host key mismatch; refusing to talk to this host", "expected", mm.Expected, "got", mm.Got)
	}
	return reconcile.Result{RequeueAfter: c.Interval}, true, patchStatus(ctx, c.Client, orig, h)
}

// recordProbe stamps probe time and generation and pins the host key on
// first contact. A pin from the Secret is authoritative and replaces status.
func recordProbe(h *v1beta1.SSHHost, creds hostkey.Credentials, res probe.Result, now metav1.Time) {
	h.Status.LastProbeTime = &now
	h.Status.ObservedGeneration = h.Generation
	// A shim refusal recorded before the host's spec changed (execMode,
	// trustedSigners, shimCommand, …) no longer applies.
	if r := h.Status.ShimRejection; r != nil && r.HostGeneration != h.Generation {
		h.SetShimRejection(nil, now)
	}
	switch {
	case creds.FromSecret:
		h.Status.HostKeyFingerprint = creds.PinnedFingerprint
	case h.Status.HostKeyFingerprint == "" && res.Fingerprint != "":
		h.Status.HostKeyFingerprint = res.Fingerprint
	}
}

// shortfall describes resources the host measured below its declared
// capacity ("" when none).
func shortfall(declared, observed corev1.ResourceList) string {
	if len(observed) == 0 {
		return ""
	}
	var parts []string
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		d, dok := declared[r]
		o, ook := observed[r]
		if dok && ook && o.Cmp(d) < 0 {
			parts = append(parts, fmt.Sprintf("%s declared %s, observed %s", r, d.String(), o.String()))
		}
	}
	sort.Strings(parts)
	return strings.Join(parts, "; ")
}
