package cloudprovider

import (
	"context"
	"errors"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/log"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/providers/leave"
	"github.com/dklesev/kpssh/internal/providers/pool"
)

// Delete implements cloudprovider.CloudProvider: run leave with the profile
// named by the host's install marker (empty context; leave.Run: the
// fallback leave when there is no profile leave to run), delete the token,
// release the host (Available after a clean leave, Unhealthy otherwise, or
// after a failed verify). A host whose leave failed is released from the
// claim — Karpenter's finalizer goes, which is what lets a dead host's
// NodeClaim be replaced — but never Available: it is Unhealthy with
// condition LeaveFailed, and the host controller runs leave again until it
// succeeds (its kubelet may still run).
// Fenced: only the host whose claimRef carries this NodeClaim's name AND
// UID is touched; anything else is NodeClaimNotFound with no side effects,
// so a late Delete never runs leave on a successor's node.
func (c *CloudProvider) Delete(ctx context.Context, nodeClaim *karpv1.NodeClaim) error {
	claim := pool.Claim{Name: nodeClaim.Name, UID: nodeClaim.UID}
	h, err := c.heldBy(ctx, claim)
	if err != nil {
		return err
	}
	if h == nil {
		return cloudprovider.NewNodeClaimNotFoundError(fmt.Errorf("no host is claimed by NodeClaim %s (uid %s)", nodeClaim.Name, nodeClaim.UID))
	}
	unlock := c.lock(h.Name)
	defer unlock()
	// Re-read under the lock: a Create that held it may have released.
	if h, err = c.heldBy(ctx, claim); err != nil {
		return err
	} else if h == nil {
		return cloudprovider.NewNodeClaimNotFoundError(fmt.Errorf("no host is claimed by NodeClaim %s (uid %s)", nodeClaim.Name, nodeClaim.UID))
	}
	ctx = withHost(ctx, h)

	state, msg := v1beta1.HostAvailable, "released by NodeClaim "+nodeClaim.Name
	var lastPhase *v1beta1.LastPhase
	// The record leave's progress may replace (a Running lastPhase, written
	// while leave runs): a failed verify's is kept below.
	before := h.Status.LastPhase.DeepCopy()
	var left *leave.Result
	when := "under NodeClaim " + nodeClaim.Name
	// A host that never got to join has nothing to leave: the claim
	// happened, install may have run, but no kubelet was started. One whose
	// join started may run a kubelet even with no InUse written and its
	// token collected (JoinRan reads the marker that survives both).
	if h.JoinRan() {
		res, err := leave.Run(ctx, c.Client, c.Phases, h)
		if err != nil {
			return err
		}
		left, lastPhase = &res, res.LastPhase
		if e := leave.FallbackEvent(h, res, when); e != nil {
			c.Recorder.Publish(*e)
		}
		if !res.OK() {
			state, msg = v1beta1.HostUnhealthy, leave.FailedMessage(res, when)
			c.Recorder.Publish(leave.FailedEvent(h, res, when))
		} else if err := c.deleteLeftNode(ctx, nodeClaim, h); err != nil {
			return err // core retries; leave is idempotent
		}
	}
	if v := h.VerifyOf(claim.UID); v != nil && v.Result == v1beta1.VerifyFailed && state == v1beta1.HostAvailable {
		// The claim ended on a failed verify: leave ran, but what verify
		// found is still on the host, and lastPhase keeps the failed task.
		state, msg, lastPhase = v1beta1.HostUnhealthy, "verify failed under NodeClaim "+nodeClaim.Name+" (leave ran): "+v.Message, nil
		if before != nil && before.Phase == v1beta1.PhaseVerify {
			lastPhase = before
		}
	}
	if err := c.Tokens.Delete(ctx, h.Status.BootstrapTokenID); err != nil {
		return err
	}
	if _, err := c.Pool.Update(ctx, h.Name, claim, func(h *v1beta1.SSHHost) {
		now := metav1.NewTime(c.Clock.Now())
		pool.Released(h, state, msg, now)
		if left != nil {
			leave.Record(h, *left, when, now)
		}
		if lastPhase != nil {
			h.Status.LastPhase = lastPhase
		}
	}); err != nil {
		if errors.Is(err, pool.ErrClaimLost) {
			// Someone else (stale-claim repair) released it meanwhile.
			return cloudprovider.NewNodeClaimNotFoundError(err)
		}
		return fmt.Errorf("release host %s: %w", h.Name, err) // core retries
	}
	log.FromContext(ctx).Info("host left", "state", state)
	return nil
}

// deleteLeftNode deletes the Node tied to the host (leave.Tied: its
// providerID, or — mid-join in Adopt mode — the host label on a Node
// created since this claim; never its address alone) once leave stopped
// its kubelet. Registered after Karpenter looked for this claim's Nodes
// (deleted before it saw the registration), nothing else removes it.
// Several tied Nodes: none is deleted, the host gets an event.
func (c *CloudProvider) deleteLeftNode(ctx context.Context, nodeClaim *karpv1.NodeClaim, h *v1beta1.SSHHost) error {
	node, m, err := leave.DeleteNode(ctx, c.Client, h, nodeClaim.CreationTimestamp.Time)
	if err != nil {
		return err
	}
	if node != "" {
		log.FromContext(ctx).Info("deleted the Node left by the claim", "Node", klog.KRef("", node))
	}
	if err := m.Err(h); err != nil {
		log.FromContext(ctx).Info("no Node deleted: several are tied to the host", "nodes", m.Several)
		c.Recorder.Publish(leave.AmbiguousNodes(h, m))
	}
	return nil
}
