package host

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/probe"
	"github.com/dklesev/kpssh/internal/providers/hostkey"
	"github.com/dklesev/kpssh/internal/providers/leave"
)

// zombie is the seed's flowchart for a kubelet active on an unclaimed host,
// and the retry of a leave the host owes (condition LeaveFailed: its last
// leave failed, whatever the kubelet shows now). Not ours (no Node tied to
// the host, no install marker, no leave owed) → park Unhealthy and touch
// nothing. Ours → CAS to Leaving first (fences a racing
// claim, which only takes Available hosts), run leave, check the kubelet is
// really stopped, and only then delete the Node tied to the host — or it
// simply re-registers. A Node is tied by identity (leave.Tied), never by
// the node address alone; several tied Nodes are none, and an event says so.
func (c *Controller) zombie(ctx context.Context, h *v1beta1.SSHHost, creds hostkey.Credentials, res probe.Result) (reconcile.Result, bool, error) {
	m, err := leave.MatchingNode(ctx, c.Client, h, zombieSince(h))
	if err != nil {
		return reconcile.Result{}, true, err
	}
	c.reportAmbiguous(ctx, h, m)
	node := m.Node
	now := metav1.NewTime(c.Clock.Now())
	if node == nil && h.Status.InstalledProfile == "" && !h.LeaveOwed() {
		orig := h.DeepCopy()
		recordProbe(h, creds, res, now)
		h.Status.LastProbeError = "foreign kubelet active: no Node is tied to the host (by providerID or host label) and it has no install marker"
		if e := m.Err(h); e != nil {
			h.Status.LastProbeError = "foreign kubelet active: no install marker, and " + e.Error()
		}
		setState(h, v1beta1.HostUnhealthy, h.Status.LastProbeError, now)
		first := orig.Status.LastProbeError != h.Status.LastProbeError
		if err := patchStatus(ctx, c.Client, orig, h); err != nil {
			return reconcile.Result{}, true, err
		}
		if first {
			zombieActions.WithLabelValues(ActionParkedForeign).Inc()
			c.Recorder.Publish(foreignKubelet(h))
		}
		return reconcile.Result{RequeueAfter: c.Interval}, true, nil
	}

	orig := h.DeepCopy()
	why := "zombie kubelet: running leave"
	if h.LeaveOwed() {
		why = "leave owed (the last one did not succeed): running leave"
	}
	setState(h, v1beta1.HostLeaving, why, now)
	if err := patchStatus(ctx, c.Client, orig, h); err != nil {
		return reconcile.Result{}, true, err
	}
	if res.Facts.KubeletMayRun() {
		c.Recorder.Publish(zombieKubelet(h))
	}
	log.FromContext(ctx).Info(why, "Node", klog.KRef("", nodeName(node)))

	leaveErr := c.Leaver.Leave(ctx, h, creds)
	var after probe.Result
	if leaveErr == nil {
		// Verify before deleting the Node: a leave that exits 0 but leaves the
		// kubelet running would just re-register it.
		after, leaveErr = c.Prober(ctx, creds.Target(h), h.Spec.ExecMode == v1beta1.ExecModeVerified, h.Spec.ShimCommand, c.Timeout)
		if leaveErr == nil && after.Facts.KubeletMayRun() {
			leaveErr = fmt.Errorf("leave exited 0 but kubelet is still active or enabled")
		}
	}
	if leaveErr == nil {
		// Look the Node up again now that the kubelet is stopped: one that
		// came back with its host (power restored) may have registered while
		// leave ran, after the lookup above.
		_, m, err := leave.DeleteNode(ctx, c.Client, h, zombieSince(h))
		if err != nil {
			leaveErr = fmt.Errorf("delete node: %w", err)
		}
		c.reportAmbiguous(ctx, h, m)
	}
	if leaveErr != nil {
		orig := h.DeepCopy()
		now = metav1.NewTime(c.Clock.Now())
		recordProbe(h, creds, res, now)
		h.Status.LastProbeError = "zombie leave failed: " + leaveErr.Error()
		setState(h, v1beta1.HostUnhealthy, h.Status.LastProbeError, now)
		// Owed until a leave succeeds: the next probe tries again even if
		// the kubelet looks stopped then.
		leave.RecordError(h, leaveErr, "by the zombie guard", now)
		zombieActions.WithLabelValues(ActionLeaveFailed).Inc()
		c.Recorder.Publish(zombieLeaveFailed(h, leaveErr))
		return reconcile.Result{RequeueAfter: c.Interval}, true, patchStatus(ctx, c.Client, orig, h)
	}
	zombieActions.WithLabelValues(ActionLeft).Inc()
	c.Recorder.Publish(zombieLeft(h))
	return reconcile.Result{RequeueAfter: c.Interval}, true, c.probeSucceeded(ctx, h, creds, after, "zombie kubelet left; host back in the pool")
}

func nodeName(n *corev1.Node) string {
	if n == nil {
		return ""
	}
	return n.Name
}

// zombieSince bounds the Nodes an unclaimed host's host label can tie: it
// has no claim, so none older than the host object (a host deleted and
// created again under the same name does not inherit its predecessor's).
func zombieSince(h *v1beta1.SSHHost) time.Time { return h.CreationTimestamp.Time }

// reportAmbiguous logs and publishes a match of several Nodes (the
// recorder dedupes the event).
func (c *Controller) reportAmbiguous(ctx context.Context, h *v1beta1.SSHHost, m leave.Match) {
	if err := m.Err(h); err != nil {
		log.FromContext(ctx).Info("several Nodes are tied to the host: none is taken as its Node", "nodes", m.Several)
		c.Recorder.Publish(leave.AmbiguousNodes(h, m))
	}
}
