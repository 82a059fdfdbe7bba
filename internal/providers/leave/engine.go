package leave

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/karpenter/pkg/events"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/engine"
	"github.com/dklesev/kpssh/internal/profile"
	"github.com/dklesev/kpssh/internal/providers/hostkey"
	"github.com/dklesev/kpssh/internal/providers/phase"
)

// Runner runs a phase on a host (*phase.Runner).
type Runner interface {
	Run(ctx context.Context, h *v1beta1.SSHHost, p *v1beta1.SSHJoinProfile, ph engine.Phase, c engine.Context, redact []string) phase.Outcome
	RunFallbackLeave(ctx context.Context, h *v1beta1.SSHHost, c engine.Context) phase.Outcome
}

// NewEngine returns the Provider that runs leave through the phase engine
// (the default: the same playbook path as every other phase); rec (may be
// nil) gets the LeaveFallback event when the fallback leave ran.
func NewEngine(c client.Reader, r Runner, rec events.Recorder) Provider {
	return &viaEngine{c: c, r: r, rec: rec}
}

type viaEngine struct {
	c   client.Reader
	r   Runner
	rec events.Recorder
}

// Leave runs the host's leave (Run); creds are resolved by the runner. A
// leave that did not succeed is an *Error.
func (v *viaEngine) Leave(ctx context.Context, host *v1beta1.SSHHost, _ hostkey.Credentials) error {
	res, err := Run(ctx, v.c, v.r, host)
	if err != nil {
		return err
	}
	if e := FallbackEvent(host, res, "by the zombie guard"); e != nil && v.rec != nil {
		v.rec.Publish(*e)
	}
	if !res.OK() {
		return &Error{Result: res}
	}
	return nil
}

// Error is a leave that ran (or was refused) and did not succeed.
type Error struct{ Result Result }

func (e *Error) Error() string { return e.Result.Summary() }

// Result is a leave run: its outcome, and why the fallback leave ran
// instead of the profile's ("" when it did not).
type Result struct {
	phase.Outcome
	Fallback string
}

// Summary describes a failed leave for events and conditions.
func (r Result) Summary() string {
	s := phase.Summary(engine.PhaseLeave, r.Result)
	if r.Fallback != "" {
		s = "fallback " + s + " (" + r.Fallback + ")"
	}
	return phase.Truncate(s, 1024)
}

// Run runs host h's leave with the empty context: the leave of the profile
// its install marker names, whatever any node class says today. The
// fallback leave (phase.FallbackLeaveRequest: on a Verified host the leave
// its provisioning installed) runs instead when there is none to run — no
// marker, or the profile deleted — and after the profile's leave was
// refused before anything of it ran: a config error (on a Verified host an
// expired, missing or untrusted signature) or a shim refusal. So leave
// stays runnable when the profile's signed leave no longer is; a leave
// that ran and failed is not replaced.
func Run(ctx context.Context, c client.Reader, r Runner, h *v1beta1.SSHHost) (Result, error) {
	p, why, err := Resolve(ctx, c, h)
	if err != nil {
		return Result{}, err
	}
	ec := EmptyContext(h)
	if p != nil {
		out := r.Run(ctx, h, p, engine.PhaseLeave, ec, nil)
		if out.Outcome != engine.ConfigError && !out.ShimRefused() {
			return Result{Outcome: out}, nil
		}
		why = fmt.Sprintf("the leave of %s was refused before it ran: %s", p.Marker(), phase.Summary(engine.PhaseLeave, out.Result))
	}
	return Result{Outcome: r.RunFallbackLeave(ctx, h, ec), Fallback: phase.Truncate(why, 768)}, nil
}

// Resolve finds the profile whose leave undoes what h has installed (its
// install marker's, whatever any node class says today), or nil and why
// there is none.
func Resolve(ctx context.Context, c client.Reader, h *v1beta1.SSHHost) (*v1beta1.SSHJoinProfile, string, error) {
	m := h.Status.InstalledProfile
	name, _, ok := profile.ParseMarker(m)
	if !ok {
		return nil, "the host has no install marker", nil
	}
	p := &v1beta1.SSHJoinProfile{}
	if err := c.Get(ctx, client.ObjectKey{Name: name}, p); err != nil {
		if !apierrors.IsNotFound(err) {
			return nil, "", err
		}
		return nil, fmt.Sprintf("install marker %s names no existing profile", m), nil
	}
	return p, "", nil
}

// Profile is the profile whose leave undoes what a host has installed (its
// install marker's), else FallbackProfile: what reboot and kpssh render
// take phases from.
func Profile(ctx context.Context, c client.Reader, host *v1beta1.SSHHost) (*v1beta1.SSHJoinProfile, error) {
	p, _, err := Resolve(ctx, c, host)
	if err != nil || p != nil {
		return p, err
	}
	return FallbackProfile(), nil
}

// FallbackProfile carries only FallbackScript as its leave.
func FallbackProfile() *v1beta1.SSHJoinProfile {
	return &v1beta1.SSHJoinProfile{
		ObjectMeta: metav1.ObjectMeta{Name: phase.FallbackLeaveProfile},
		Spec:       v1beta1.SSHJoinProfileSpec{Version: "1", Scripts: &v1beta1.ProfileScripts{Leave: FallbackScript}},
	}
}
