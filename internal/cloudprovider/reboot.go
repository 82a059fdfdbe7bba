package cloudprovider

import (
	"context"
	"errors"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/log"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/engine"
	"github.com/dklesev/kpssh/internal/providers/leave"
	"github.com/dklesev/kpssh/internal/providers/phase"
	"github.com/dklesev/kpssh/internal/providers/pool"
)

// Reboot implements cloudprovider.CloudProvider: it runs the reboot phase
// of the host's install-marker profile (its own, or the default) on the host
// the NodeClaim holds, with the empty context, and returns once the phase
// has scheduled the reboot; the host stays claimed and InUse, and the host
// controller watches it come back. At most once per operationID: the id is
// recorded on the host (CAS) before the phase runs, and a call that finds it
// recorded runs nothing — after a crash between the record and the phase,
// the operation is not retried, and Karpenter's observation window decides.
func (c *CloudProvider) Reboot(ctx context.Context, nodeClaim *karpv1.NodeClaim, operationID string) error {
	if operationID == "" {
		return cloudprovider.NewNodeRebootFailedError(errors.New("reboot without an operation id"))
	}
	claim := pool.Claim{Name: nodeClaim.Name, UID: nodeClaim.UID}
	notFound := func() error {
		return cloudprovider.NewNodeClaimNotFoundError(fmt.Errorf("no host is claimed by NodeClaim %s (uid %s)", nodeClaim.Name, nodeClaim.UID))
	}
	h, err := c.heldBy(ctx, claim)
	if err != nil {
		return err
	} else if h == nil {
		return notFound()
	}
	// Serialised with Create and Delete of the same host.
	unlock := c.lock(h.Name)
	defer unlock()
	if h, err = c.heldBy(ctx, claim); err != nil {
		return err
	} else if h == nil {
		return notFound()
	}
	ctx = withHost(ctx, h)
	if r := h.Status.Reboot; r != nil && r.OperationID == operationID && r.ClaimUID == nodeClaim.UID {
		return c.replayed(ctx, nodeClaim, h, r)
	}
	if h.Status.ProviderID == "" {
		rebootsTotal.WithLabelValues(RebootRefused).Inc()
		return cloudprovider.NewNodeRebootFailedError(fmt.Errorf("host %s is %s: it has not joined yet, nothing to reboot", h.Name, h.CurrentState()))
	}
	now := metav1.NewTime(c.Clock.Now())
	rec := &v1beta1.HostReboot{OperationID: operationID, ClaimUID: nodeClaim.UID, Result: v1beta1.RebootRequested,
		BootID: preBootID(nodeClaim), RequestedAt: now}
	var seen *v1beta1.HostReboot
	name := h.Name
	h, err = c.Pool.Update(ctx, name, claim, func(h *v1beta1.SSHHost) {
		if r := h.Status.Reboot; r != nil && r.OperationID == operationID && r.ClaimUID == nodeClaim.UID {
			seen = r.DeepCopy() // another caller recorded it first: write nothing
			return
		}
		seen = nil
		h.SetReboot(rec.DeepCopy(), now)
	})
	switch {
	case errors.Is(err, pool.ErrClaimLost):
		return notFound()
	case err != nil:
		return fmt.Errorf("record reboot %s on host %s: %w", operationID, name, err)
	case seen != nil:
		return c.replayed(ctx, nodeClaim, h, seen)
	}
	prof, err := leave.Profile(ctx, c.Client, h)
	if err != nil {
		return c.rebootDone(ctx, nodeClaim, h, claim, rec, phase.Outcome{Result: engine.Result{Outcome: engine.ConfigError, Message: "read the install marker's profile: " + err.Error()}})
	}
	out := c.Phases.Run(ctx, h, prof, engine.PhaseReboot, leave.EmptyContext(h), nil)
	return c.rebootDone(ctx, nodeClaim, h, claim, rec, out)
}

// rebootDone records the reboot phase's outcome (Issued or Failed) unless
// the host controller already saw the host return, and answers Karpenter.
func (c *CloudProvider) rebootDone(ctx context.Context, nodeClaim *karpv1.NodeClaim, h *v1beta1.SSHHost, claim pool.Claim, rec *v1beta1.HostReboot, out phase.Outcome) error {
	now := metav1.NewTime(c.Clock.Now())
	var failure error
	if out.OK() {
		rec.Result = v1beta1.RebootIssued
	} else {
		rec.Result, rec.Message = v1beta1.RebootFailed, phase.Truncate(phase.Summary(engine.PhaseReboot, out.Result), 1024)
		failure = cloudprovider.NewNodeRebootFailedError(fmt.Errorf("host %s: %s", h.Name, rec.Message))
	}
	_, err := c.Pool.Update(ctx, h.Name, claim, func(h *v1beta1.SSHHost) {
		if out.LastPhase != nil {
			h.Status.LastPhase = out.LastPhase
		}
		if r := h.Status.Reboot; r != nil && r.OperationID == rec.OperationID && r.Result == v1beta1.RebootRequested {
			h.SetReboot(rec.DeepCopy(), now)
		}
	})
	if errors.Is(err, pool.ErrClaimLost) {
		return cloudprovider.NewNodeClaimNotFoundError(err)
	}
	if failure != nil {
		rebootsTotal.WithLabelValues(RebootFailedLabel).Inc()
		c.Recorder.Publish(rebootFailed(nodeClaim, h, rec.Message))
		return failure
	}
	if err != nil {
		// The reboot is under way; the record stays Requested, which the
		// host controller watches the same way.
		log.FromContext(ctx).Error(err, "recording an issued reboot")
	}
	rebootsTotal.WithLabelValues(RebootIssuedLabel).Inc()
	c.Recorder.Publish(rebootIssued(nodeClaim, h, rec.OperationID))
	log.FromContext(ctx).Info("reboot issued", "operationID", rec.OperationID)
	return nil
}

// replayed answers a repeated operation from its record: the same error
// for a failed one, accepted for anything else. Nothing runs.
func (c *CloudProvider) replayed(ctx context.Context, nodeClaim *karpv1.NodeClaim, h *v1beta1.SSHHost, r *v1beta1.HostReboot) error {
	rebootsTotal.WithLabelValues(RebootReplayed).Inc()
	log.FromContext(ctx).Info("reboot already recorded; not rebooting again", "operationID", r.OperationID, "result", r.Result)
	if r.Result == v1beta1.RebootFailed {
		return cloudprovider.NewNodeRebootFailedError(fmt.Errorf("host %s: %s", h.Name, r.Message))
	}
	return nil
}

// preBootID is the boot id the host had before the reboot: Karpenter's
// reboot controller records the Node's on the NodeClaim before it calls
// Reboot. "" when unknown (the host controller then waits for an outage).
func preBootID(nodeClaim *karpv1.NodeClaim) string {
	if id := nodeClaim.Annotations[karpv1.RebootPreBootIDAnnotationKey]; len(id) <= 64 {
		return id
	}
	return ""
}
