package cloudprovider

import (
	"context"
	"errors"
	"fmt"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/log"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/engine"
	"github.com/dklesev/kpssh/internal/providers/phase"
	"github.com/dklesev/kpssh/internal/providers/pool"
)

// failure says how a launch ended badly and where the host goes.
type failure struct {
	event     string
	state     v1beta1.HostState // Available: host untouched; Unhealthy: host-side
	msg       string
	lastPhase *v1beta1.LastPhase
	rejection *v1beta1.ShimRejection // the host's shim refused the phase: sticky
}

func configFailure(msg string) failure {
	return failure{event: ReasonJoinFailed, state: v1beta1.HostAvailable, msg: msg}
}

func phaseFailure(ph engine.Phase, out phase.Outcome) failure {
	f := failure{event: ReasonJoinFailed, state: v1beta1.HostAvailable, msg: phase.Summary(ph, out.Result), lastPhase: out.LastPhase}
	if out.HostSide() {
		f.state = v1beta1.HostUnhealthy
	}
	return f
}

// after keeps a host whose join ran under this claim (joined) from being
// released Available: its kubelet may run, so it goes Unhealthy, where the
// zombie guard runs leave before the host is offered again.
func (f failure) after(joined bool) failure {
	if joined && f.state == v1beta1.HostAvailable {
		f.state = v1beta1.HostUnhealthy
		f.msg += " (a join ran under this claim: its kubelet may run)"
	}
	return f
}

// refusedBy makes a phase failure sticky when the host's shim refused the
// phase: the same node class, profile and host spec would be refused again,
// so the node class does not claim the host until one of them changes
// (classHosts), instead of minting and shipping a token per retry.
func (f failure) refusedBy(out phase.Outcome, ph engine.Phase, h *v1beta1.SSHHost, nc *v1beta1.SSHNodeClass, p *v1beta1.SSHJoinProfile, now metav1.Time) failure {
	if !out.ShimRefused() {
		return f
	}
	f.rejection = &v1beta1.ShimRejection{Phase: v1beta1.Phase(ph), RC: int32(out.RC), Message: phase.Truncate(out.Message, 1024),
		NodeClass: nc.Name, NodeClassGeneration: nc.Generation, Profile: p.Name, ProfileGeneration: p.Generation,
		HostGeneration: h.Generation, At: now}
	return f
}

// fail releases the host as f says (deleting the bootstrap token it
// carries), emits the NodeClaim event and returns the error for Karpenter:
// a CreateError, so the NodeClaim shows why and Karpenter retries — on
// another host, since this one is no longer held.
func (c *CloudProvider) fail(ctx context.Context, nodeClaim *karpv1.NodeClaim, h *v1beta1.SSHHost, claim pool.Claim, f failure) error {
	log.FromContext(ctx).Info("launch failed; releasing host", "releaseTo", f.state, "reason", f.event, "message", f.msg)
	c.Recorder.Publish(nodeClaimFailed(nodeClaim, f.event, fmt.Sprintf("host %s: %s", h.Name, f.msg)))
	var errs []error
	// Token first: the release clears the id that makes it findable.
	if cur, err := c.heldBy(ctx, claim); err == nil && cur != nil && cur.Status.BootstrapTokenID != "" {
		if err := c.Tokens.Delete(ctx, cur.Status.BootstrapTokenID); err != nil {
			errs = append(errs, err)
		}
	} else if err != nil {
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		_, err := c.Pool.Update(ctx, h.Name, claim, func(h *v1beta1.SSHHost) {
			pool.Released(h, f.state, f.msg, metav1.NewTime(c.Clock.Now()))
			if f.lastPhase != nil {
				h.Status.LastPhase = f.lastPhase
			}
			if f.rejection != nil {
				h.SetShimRejection(f.rejection, metav1.NewTime(c.Clock.Now()))
			}
		})
		if err != nil && !errors.Is(err, pool.ErrClaimLost) {
			errs = append(errs, fmt.Errorf("release host %s: %w", h.Name, err))
		}
	}
	err := fmt.Errorf("host %s: %s", h.Name, f.msg)
	if len(errs) > 0 {
		// Not released: the retry resumes this claim and fails or succeeds again.
		err = errors.Join(append([]error{err}, errs...)...)
	}
	return cloudprovider.NewCreateError(err, f.event, truncateMsg(err.Error()))
}

// lost handles a claim that vanished under a launch (the host was released
// by a stale-claim repair or a Delete): nothing to release.
func (c *CloudProvider) lost(ctx context.Context, nodeClaim *karpv1.NodeClaim, err error) error {
	if errors.Is(err, pool.ErrClaimLost) {
		c.Recorder.Publish(nodeClaimFailed(nodeClaim, ReasonCreateFailed, "the host claim was lost during launch"))
		return cloudprovider.NewCreateError(err, ReasonCreateFailed, "the host claim was lost during launch")
	}
	return err
}

func truncateMsg(s string) string {
	if len(s) > 1024 {
		return phase.Truncate(s, 1021) + "..."
	}
	return s
}

// hostLock serialises what runs on one host within this process: Create,
// Delete and Reboot (a NodeClaim deleted mid-launch must not run leave
// beside join), and the drift check, which gives way to all of them.
type hostLock struct {
	mu sync.Mutex
	// guarded by check:
	check   sync.Mutex
	waiting int                // phases waiting for mu
	cancel  context.CancelFunc // of the drift check holding mu
}

func (c *CloudProvider) hostLock(host string) *hostLock {
	v, _ := c.locks.LoadOrStore(host, &hostLock{})
	return v.(*hostLock)
}

// lock takes the host for a phase: a drift check holding it is cancelled
// (it is only a check; the phase decides the host's fate anyway).
func (c *CloudProvider) lock(host string) func() {
	l := c.hostLock(host)
	l.check.Lock()
	l.waiting++
	if l.cancel != nil {
		l.cancel()
	}
	l.check.Unlock()
	l.mu.Lock()
	l.check.Lock()
	l.waiting--
	l.check.Unlock()
	return l.mu.Unlock
}

// lockForCheck takes the host for a drift check unless a phase holds it or
// waits for it (ok=false). The check runs under the returned context, which
// a phase asking for the host cancels.
func (c *CloudProvider) lockForCheck(ctx context.Context, host string) (context.Context, func(), bool) {
	l := c.hostLock(host)
	l.check.Lock()
	defer l.check.Unlock()
	if l.waiting > 0 || !l.mu.TryLock() {
		return nil, nil, false
	}
	cctx, cancel := context.WithCancel(ctx)
	l.cancel = cancel
	return cctx, func() {
		l.check.Lock()
		l.cancel = nil
		l.check.Unlock()
		cancel()
		l.mu.Unlock()
	}, true
}
