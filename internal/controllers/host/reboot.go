package host

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/probe"
)

// Defaults of the reboot watch.
const (
	// DefaultRebootPoll: a rebooting host is probed this often; a reboot
	// takes seconds to minutes and Karpenter polls the Node every 15 s.
	DefaultRebootPoll = 5 * time.Second
	// DefaultRebootTimeout: a host not back this long after the reboot was
	// asked is Unhealthy (claim kept) — before Karpenter's 20-minute
	// observation window replaces the node.
	DefaultRebootTimeout = 15 * time.Minute
)

// watchReboot probes a claimed host while its reboot (status.reboot, under
// this claim) has not been seen to return: it has returned when the probe
// reports a boot id other than the one before the reboot — or, with none
// known, when SSH answers after an outage. Not back after RebootTimeout:
// Unhealthy with the claim kept (Lost), still watched; back later: InUse.
// Only transitions are written, so the watch does not wake itself.
func (c *Controller) watchReboot(ctx context.Context, h *v1beta1.SSHHost) (reconcile.Result, error) {
	r := h.Status.Reboot
	if !r.Active() || h.Status.ClaimRef == nil || r.ClaimUID != h.Status.ClaimRef.UID {
		return reconcile.Result{RequeueAfter: c.Interval}, nil
	}
	poll, limit := c.RebootPoll, c.RebootTimeout
	if poll <= 0 {
		poll = DefaultRebootPoll
	}
	if limit <= 0 {
		limit = DefaultRebootTimeout
	}
	creds, err := c.Keys.Get(ctx, h)
	var res probe.Result
	if err == nil {
		start := c.Clock.Now()
		res, err = c.Prober(ctx, creds.Target(h), h.Spec.ExecMode == v1beta1.ExecModeVerified, h.Spec.ShimCommand, c.Timeout)
		outcome := ProbeSuccess
		if err != nil {
			outcome = ProbeError
		}
		probeDuration.WithLabelValues(outcome).Observe(c.Clock.Since(start).Seconds())
	}
	orig := h.DeepCopy()
	now := metav1.NewTime(c.Clock.Now())
	next := r.DeepCopy()
	switch {
	case err == nil && returned(r, res.Facts):
		recordProbe(h, creds, res, now)
		h.Status.LastProbeError = ""
		next.Result, next.ReturnedAt, next.Message = v1beta1.RebootReturned, &now, ""
		h.SetReboot(next, now)
		took := now.Sub(r.RequestedAt.Time)
		setState(h, v1beta1.HostInUse, fmt.Sprintf("back from reboot %s after %s", r.OperationID, took.Round(time.Second)), now)
		if err := patchStatus(ctx, c.Client, orig, h); err != nil {
			return reconcile.Result{}, err
		}
		rebootSeconds.WithLabelValues(RebootReturned).Observe(took.Seconds())
		c.Recorder.Publish(rebootReturned(h, r.OperationID, took))
		log.FromContext(ctx).Info("host back from reboot", "operationID", r.OperationID, "after", took)
		return reconcile.Result{RequeueAfter: c.Interval}, nil
	case err != nil:
		next.WentDown = true
	}
	if next.Result != v1beta1.RebootLost && now.Sub(r.RequestedAt.Time) > limit {
		next.Result = v1beta1.RebootLost
		next.Message = fmt.Sprintf("not back %s after the reboot was asked", limit)
		if err != nil {
			next.Message += ": " + err.Error()
			h.Status.LastProbeError = err.Error()
		}
		next.Message = truncate(next.Message, 1024)
		setState(h, v1beta1.HostUnhealthy, next.Message, now) // the claim stays: Karpenter's repair decides
		rebootSeconds.WithLabelValues(RebootLost).Observe(now.Sub(r.RequestedAt.Time).Seconds())
		c.Recorder.Publish(rebootLost(h, r.OperationID, next.Message))
	}
	h.SetReboot(next, now)
	return reconcile.Result{RequeueAfter: poll}, patchStatus(ctx, c.Client, orig, h)
}

// returned decides from one successful probe whether the host has been
// through the reboot.
func returned(r *v1beta1.HostReboot, f probe.Facts) bool {
	if r.BootID != "" && f.BootID != "" {
		return f.BootID != r.BootID
	}
	return r.WentDown
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n]
}
