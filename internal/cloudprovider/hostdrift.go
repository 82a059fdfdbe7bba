package cloudprovider

import (
	"context"
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/providers/phase"
	"github.com/dklesev/kpssh/internal/providers/pool"
)

// ErrHostBusy: a phase runs on the host or waits for it; the drift check
// gives way and is tried again later.
var ErrHostBusy = errors.New("a phase runs on the host: drift check deferred")

// ErrNotCheckable wraps why a host is not checked now (not joined under
// this claim, rebooting, already drifted from its profile): nothing to
// record, the next interval looks again.
var ErrNotCheckable = errors.New("host not checked")

// CheckHostDrift runs the drift check (node class spec.hostDrift) of the
// host holding nodeClaim: the profile's install and join in check mode
// with the context a join would get now (no token: check mode gets a
// placeholder), or its scripts.check. At most one per host at a time and
// never beside a phase: it takes the host's lock only when no phase holds
// or waits for it (else ErrHostBusy), and a phase that asks for the host
// meanwhile cancels it (ErrHostBusy too). Only an InUse, joined host whose
// install marker is the profile's current one is checked (else
// ErrNotCheckable). Configuration the check cannot get (profile, join
// Secret, cluster endpoint) is a DriftFailed result, not an error.
func (c *CloudProvider) CheckHostDrift(ctx context.Context, nodeClaim *karpv1.NodeClaim) (phase.Drift, error) {
	claim := pool.Claim{Name: nodeClaim.Name, UID: nodeClaim.UID}
	h, err := c.heldBy(ctx, claim)
	if err != nil || h == nil {
		return phase.Drift{}, errors.Join(err, fmt.Errorf("%w: NodeClaim %s holds no host", ErrNotCheckable, nodeClaim.Name))
	}
	cctx, unlock, ok := c.lockForCheck(ctx, h.Name)
	if !ok {
		return phase.Drift{}, ErrHostBusy
	}
	defer unlock()
	// Under the lock: the host as it is now (a phase may have just ended).
	if h, err = c.heldBy(ctx, claim); err != nil || h == nil {
		return phase.Drift{}, errors.Join(err, fmt.Errorf("%w: NodeClaim %s holds no host", ErrNotCheckable, nodeClaim.Name))
	}
	if h.Status.State != v1beta1.HostInUse || h.Status.ProviderID == "" || h.Status.Reboot.Active() {
		return phase.Drift{}, fmt.Errorf("%w: host %s is %s (joined: %t, rebooting: %t)", ErrNotCheckable, h.Name, h.CurrentState(), h.Status.ProviderID != "", h.Status.Reboot.Active())
	}
	nc, err := c.nodeClass(ctx, nodeClaim.Spec.NodeClassRef)
	if err != nil {
		return phase.Drift{}, err
	}
	if nc == nil {
		return phase.Drift{}, fmt.Errorf("%w: SSHNodeClass %s not found", ErrNotCheckable, nodeClaim.Spec.NodeClassRef.Name)
	}
	prof, err := c.profile(ctx, nc.Spec.JoinProfileRef.Name)
	if err != nil {
		return phase.Drift{}, err
	}
	if prof == nil {
		return failed("SSHJoinProfile %q not found", nc.Spec.JoinProfileRef.Name), nil
	}
	if h.Status.InstalledProfile != prof.Marker() {
		// ProfileDrift already replaces the node; checking it against a
		// profile it never ran would only say so twice.
		return phase.Drift{}, fmt.Errorf("%w: host %s runs %s, the profile is %s (ProfileDrift)", ErrNotCheckable, h.Name, h.Status.InstalledProfile, prof.Marker())
	}
	secrets, err := JoinSecrets(ctx, c.Live, c.Pool.Namespace, nc)
	if err != nil {
		if !apierrors.IsNotFound(err) && !errors.Is(err, ErrSecretKey) {
			return phase.Drift{}, err
		}
		return failed("%s", err), nil
	}
	info, err := c.Cluster.Get(ctx, nc)
	if err != nil {
		return failed("%s", err), nil
	}
	its, _, err := c.instanceTypes(ctx, nc)
	if err != nil {
		return phase.Drift{}, err
	}
	// The launched NodeClaim carries the labels join derived from the
	// instance type (hydrate): a class no longer offered changes nothing.
	pc := JoinContext(h, nc, prof, nodeClaim, byName(its, h.Class()), info, secrets)
	d := c.Phases.Check(cctx, h, prof, pc, secretValues(secrets))
	if cctx.Err() != nil && ctx.Err() == nil {
		return phase.Drift{}, ErrHostBusy // a phase took the host
	}
	return d, nil
}

func failed(format string, a ...any) phase.Drift {
	return phase.Drift{Result: v1beta1.DriftFailed, Message: phase.Truncate(fmt.Sprintf(format, a...), 1024)}
}
