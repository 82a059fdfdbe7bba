package leave

import (
	"context"
	"errors"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/engine"
	"github.com/dklesev/kpssh/internal/profile"
	"github.com/dklesev/kpssh/internal/providers/hostkey"
	"github.com/dklesev/kpssh/internal/providers/phase"
)

// Runner runs a phase on a host (*phase.Runner).
type Runner interface {
	Run(ctx context.Context, h *v1beta1.SSHHost, p *v1beta1.SSHJoinProfile, ph engine.Phase, c engine.Context, redact []string) phase.Outcome
}

// NewEngine returns the Provider that runs leave through the phase engine
// (the default: the same playbook path as every other phase).
func NewEngine(c client.Reader, r Runner) Provider { return &viaEngine{c: c, r: r} }

type viaEngine struct {
	c client.Reader
	r Runner
}

// Leave runs the marker profile's leave; creds are resolved by the runner.
func (v *viaEngine) Leave(ctx context.Context, host *v1beta1.SSHHost, _ hostkey.Credentials) error {
	p, err := Profile(ctx, v.c, host)
	if err != nil {
		return err
	}
	out := v.r.Run(ctx, host, p, engine.PhaseLeave, EmptyContext(host), nil)
	if !out.OK() {
		return errors.New(phase.Summary(engine.PhaseLeave, out.Result))
	}
	return nil
}

// Profile is the profile whose leave undoes what a host has installed: the
// one its install marker names, whatever any node class says today. With no
// marker, or the profile deleted since, it is the fallback: the seed's
// minimal warm-pool leave.
func Profile(ctx context.Context, c client.Reader, host *v1beta1.SSHHost) (*v1beta1.SSHJoinProfile, error) {
	if name, _, ok := profile.ParseMarker(host.Status.InstalledProfile); ok {
		p := &v1beta1.SSHJoinProfile{}
		err := c.Get(ctx, client.ObjectKey{Name: name}, p)
		if err == nil {
			return p, nil
		}
		if !apierrors.IsNotFound(err) {
			return nil, err
		}
	}
	return FallbackProfile(), nil
}

// FallbackProfile carries only FallbackScript as its leave.
func FallbackProfile() *v1beta1.SSHJoinProfile {
	return &v1beta1.SSHJoinProfile{
		ObjectMeta: metav1.ObjectMeta{Name: "kpssh-fallback-leave"},
		Spec:       v1beta1.SSHJoinProfileSpec{Version: "1", Scripts: &v1beta1.ProfileScripts{Leave: FallbackScript}},
	}
}
