package cloudprovider

import (
	"context"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/engine"
	"github.com/dklesev/kpssh/internal/profile"
	"github.com/dklesev/kpssh/internal/providers/phase"
	"github.com/dklesev/kpssh/internal/providers/pool"
)

// VerifyHookName names the hook in a waiting NodeClaim's Registered
// condition (Unknown, reason RegistrationHookPending, message the hook).
const VerifyHookName = "kpssh-verify"

// VerifyHook is Karpenter's registration hook for the profile's verify
// phase (wired by controllers.WithRegistrationHook). Karpenter asks it on
// every reconcile of a launched NodeClaim whose Node exists, until it
// answers an empty result: only then does the Node lose
// karpenter.sh/unregistered and the NodeClaim turn Registered.
type VerifyHook struct{ c *CloudProvider }

var _ cloudprovider.NodeLifecycleHook = VerifyHook{}

// VerifyHook returns the registration hook that runs the verify phase.
func (c *CloudProvider) VerifyHook() VerifyHook { return VerifyHook{c: c} }

// Name implements cloudprovider.NodeLifecycleHook.
func (VerifyHook) Name() string { return VerifyHookName }

// Registered implements cloudprovider.NodeLifecycleHook: it runs the
// verify phase of the host's install-marker profile on the host the
// NodeClaim holds, once per claim, and answers
//   - an empty result (register) when the profile has no verify phase or
//     verify passed — recorded on the host (status.verify, a CAS write)
//     before answering, so a later call (Karpenter's patch of the Node
//     may conflict and ask again; a restarted controller) runs nothing;
//   - an error when verify failed: the failure is recorded with lastPhase,
//     and the NodeClaim is deleted, so it never registers; Karpenter's
//     finalizer calls Delete, which runs leave and releases the host
//     Unhealthy.
//
// Verify runs inside the call, as Create runs install and join inside
// Karpenter's launch: the claim's reconcile waits for it (bounded by the
// profile's verify timeout), and Karpenter never reconciles one claim twice
// at once. An API error (not the host's verdict) is returned as it is:
// Karpenter asks again.
func (v VerifyHook) Registered(ctx context.Context, nodeClaim *karpv1.NodeClaim) (cloudprovider.NodeLifecycleHookResult, error) {
	return v.c.verify(ctx, nodeClaim)
}

var (
	registerNow = cloudprovider.NodeLifecycleHookResult{}
	// notLaunched: the host has no providerID yet. Karpenter asks only once
	// the Node exists, which it finds by the NodeClaim's providerID, so
	// this is a guard, not a path.
	notLaunched = cloudprovider.NodeLifecycleHookResult{RequeueAfter: 5 * time.Second}
)

func (c *CloudProvider) verify(ctx context.Context, nodeClaim *karpv1.NodeClaim) (cloudprovider.NodeLifecycleHookResult, error) {
	if !ours(nodeClaim.Spec.NodeClassRef) {
		return registerNow, nil
	}
	claim := pool.Claim{Name: nodeClaim.Name, UID: nodeClaim.UID}
	h, err := c.heldBy(ctx, claim)
	if err != nil || h == nil {
		return registerNow, notHeld(nodeClaim, err)
	}
	if rec := h.VerifyOf(claim.UID); rec != nil {
		return c.verifyAnswer(ctx, nodeClaim, h, rec)
	}
	// Serialised with Create, Delete and Reboot of the host.
	unlock := c.lock(h.Name)
	defer unlock()
	if h, err = c.heldBy(ctx, claim); err != nil || h == nil {
		return registerNow, notHeld(nodeClaim, err)
	}
	ctx = withHost(ctx, h)
	if rec := h.VerifyOf(claim.UID); rec != nil {
		return c.verifyAnswer(ctx, nodeClaim, h, rec)
	}
	if h.Status.ProviderID == "" {
		return notLaunched, nil
	}
	prof, err := c.markerProfile(ctx, h)
	if err != nil {
		return registerNow, err
	}
	if prof != nil {
		if _, ok := profile.Source(prof, engine.PhaseVerify); !ok {
			return registerNow, nil // no verify phase: nothing gates registration
		}
	}
	out, err := c.runVerify(ctx, nodeClaim, h, prof)
	if err != nil {
		return registerNow, err
	}
	if ctx.Err() != nil {
		// Stopped (shutdown, leadership lost): no verdict on the host; the
		// next reconcile runs verify again.
		return registerNow, ctx.Err()
	}
	return c.verifyDone(ctx, nodeClaim, h, claim, prof, out)
}

func notHeld(nodeClaim *karpv1.NodeClaim, err error) error {
	if err != nil {
		return err
	}
	// Not ours to pass: Karpenter's registration timeout removes the claim.
	return fmt.Errorf("no host is claimed by NodeClaim %s (uid %s): nothing to verify", nodeClaim.Name, nodeClaim.UID)
}

// markerProfile is the profile the host's install marker names: the one
// whose join just ran. (nil, nil) when it is gone — verify cannot run, a
// config failure.
func (c *CloudProvider) markerProfile(ctx context.Context, h *v1beta1.SSHHost) (*v1beta1.SSHJoinProfile, error) {
	name, _, ok := profile.ParseMarker(h.Status.InstalledProfile)
	if !ok {
		return nil, nil
	}
	return c.profile(ctx, name)
}

// runVerify runs the verify phase with install's context (everything but
// the bootstrap token). Configuration that is wrong (profile, node class,
// join Secret or cluster info gone or invalid) is a failed verify, a
// ConfigError outcome: the gate cannot pass. An API failure is an error.
func (c *CloudProvider) runVerify(ctx context.Context, nodeClaim *karpv1.NodeClaim, h *v1beta1.SSHHost, prof *v1beta1.SSHJoinProfile) (phase.Outcome, error) {
	refused := func(msg string) (phase.Outcome, error) {
		res := engine.Result{Outcome: engine.ConfigError, ExitCode: -1, Message: msg}
		return phase.Outcome{Result: res, LastPhase: phase.Record(engine.PhaseVerify, res, c.Clock.Now())}, nil
	}
	if prof == nil {
		return refused(fmt.Sprintf("the join profile of install marker %q is gone", h.Status.InstalledProfile))
	}
	nc, err := c.nodeClass(ctx, nodeClaim.Spec.NodeClassRef)
	if err != nil {
		return phase.Outcome{}, err
	}
	if nc == nil {
		return refused(fmt.Sprintf("SSHNodeClass %q not found", nodeClaim.Spec.NodeClassRef.Name))
	}
	secrets, err := JoinSecrets(ctx, c.Live, c.Pool.Namespace, nc)
	if err != nil {
		if !apierrors.IsNotFound(err) && !errors.Is(err, ErrSecretKey) {
			return phase.Outcome{}, err
		}
		return refused(err.Error())
	}
	info, err := c.Cluster.Get(ctx, nc)
	if err != nil {
		return refused(err.Error())
	}
	// The NodeClaim Karpenter hands in carries what Create returned (the
	// instance type's labels among them): no instance type needed.
	pc := JoinContext(h, nc, prof, nodeClaim, nil, info, secrets)
	return c.Phases.Run(ctx, h, prof, engine.PhaseVerify, pc, secretValues(secrets)), nil
}

// verifyDone records the outcome on the host (CAS, under the claim) and
// answers from the record.
func (c *CloudProvider) verifyDone(ctx context.Context, nodeClaim *karpv1.NodeClaim, h *v1beta1.SSHHost, claim pool.Claim, prof *v1beta1.SSHJoinProfile, out phase.Outcome) (cloudprovider.NodeLifecycleHookResult, error) {
	now := metav1.NewTime(c.Clock.Now())
	rec := &v1beta1.HostVerify{ClaimUID: claim.UID, Result: v1beta1.VerifyPassed, At: now}
	var rejection *v1beta1.ShimRejection
	if !out.OK() {
		rec.Result, rec.Message = v1beta1.VerifyFailed, phase.Truncate(phase.Summary(engine.PhaseVerify, out.Result), 1024)
		if nc, err := c.nodeClass(ctx, nodeClaim.Spec.NodeClassRef); err == nil && nc != nil && prof != nil {
			rejection = failure{}.refusedBy(out, engine.PhaseVerify, h, nc, prof, now).rejection
		}
	}
	h, err := c.Pool.Update(ctx, h.Name, claim, func(h *v1beta1.SSHHost) {
		if out.LastPhase != nil {
			h.Status.LastPhase = out.LastPhase
		}
		h.Status.Verify = rec.DeepCopy()
		if rejection != nil {
			h.SetShimRejection(rejection, now)
		}
	})
	if err != nil {
		if errors.Is(err, pool.ErrClaimLost) {
			err = notHeld(nodeClaim, nil)
		}
		return registerNow, fmt.Errorf("record verify on host: %w", err) // verify runs again
	}
	if rec.Result == v1beta1.VerifyFailed {
		c.Recorder.Publish(nodeClaimFailed(nodeClaim, ReasonVerifyFailed, fmt.Sprintf("host %s: %s", h.Name, rec.Message)))
	}
	return c.verifyAnswer(ctx, nodeClaim, h, rec)
}

// verifyAnswer answers Karpenter from the host's record: passed → register;
// failed → the NodeClaim is deleted (again, if an earlier call's delete did
// not land) and the error keeps it from registering meanwhile.
func (c *CloudProvider) verifyAnswer(ctx context.Context, nodeClaim *karpv1.NodeClaim, h *v1beta1.SSHHost, rec *v1beta1.HostVerify) (cloudprovider.NodeLifecycleHookResult, error) {
	if rec.Result == v1beta1.VerifyPassed {
		log.FromContext(ctx).Info("verify passed")
		return registerNow, nil
	}
	failed := fmt.Errorf("host %s: %s", h.Name, rec.Message)
	if nodeClaim.DeletionTimestamp.IsZero() {
		if err := c.Client.Delete(ctx, nodeClaim); client.IgnoreNotFound(err) != nil {
			return registerNow, errors.Join(failed, fmt.Errorf("delete the NodeClaim: %w", err))
		}
		log.FromContext(ctx).Info("verify failed; NodeClaim deleted, leave runs on the host", "failure", rec.Message)
	}
	return registerNow, failed
}
