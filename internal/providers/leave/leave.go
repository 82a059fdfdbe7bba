// Package leave runs a host's profile leave phase with the empty context
// (only KPSSH_HOST_ADDRESS/KPSSH_NODE_ADDRESS). It is the seam the zombie
// guard and release use; the Ansible phase engine replaces this
// script-over-SSH implementation.
package leave

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/engine"
	"github.com/dklesev/kpssh/internal/providers/hostkey"
	"github.com/dklesev/kpssh/internal/sshx"
)

// Provider runs leave on a host.
type Provider interface {
	Leave(ctx context.Context, host *v1beta1.SSHHost, creds hostkey.Credentials) error
}

// FallbackScript is what leave runs on a host that carries no install marker
// (a Node matched it, so it is ours, but we do not know its profile): the
// minimal warm-pool invariant of the seed's contract.
const FallbackScript = engine.FallbackLeaveScript

// NewScript returns the script-over-SSH Provider.
func NewScript(c client.Reader) Provider { return &script{c: c} }

type script struct{ c client.Reader }

func (s *script) Leave(ctx context.Context, host *v1beta1.SSHHost, creds hostkey.Credentials) error {
	body, timeout, err := s.resolve(ctx, host)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn, err := sshx.Dial(ctx, creds.Target(host))
	if err != nil {
		return err
	}
	defer conn.Close()
	preamble, err := engine.Preamble(engine.Env(engine.PhaseLeave, EmptyContext(host), false))
	if err != nil {
		return err
	}
	res, err := conn.Run(ctx, Shell(host.Spec.User), strings.NewReader(preamble+body))
	if err != nil {
		var ee *sshx.ExitError
		if errors.As(err, &ee) {
			return fmt.Errorf("leave exited %d: %s", ee.Code, lastLine(res.Stderr))
		}
		return fmt.Errorf("leave: %w", err)
	}
	return nil
}

func (s *script) resolve(ctx context.Context, host *v1beta1.SSHHost) (string, time.Duration, error) {
	marker := host.Status.InstalledProfile
	if marker == "" {
		return FallbackScript, 3 * time.Minute, nil
	}
	name, _, _ := strings.Cut(marker, "@")
	p := &v1beta1.SSHJoinProfile{}
	if err := s.c.Get(ctx, client.ObjectKey{Name: name}, p); err != nil {
		if apierrors.IsNotFound(err) {
			return "", 0, fmt.Errorf("join profile %q of install marker %q not found", name, marker)
		}
		return "", 0, err
	}
	if p.Spec.Scripts == nil {
		return "", 0, fmt.Errorf("join profile %q has no scripts; ansible profiles need the phase engine", name)
	}
	timeout := 3 * time.Minute
	if d, err := time.ParseDuration(string(p.Spec.Timeouts.Leave)); err == nil && d > 0 {
		timeout = d
	}
	return string(p.Spec.Scripts.Leave), timeout, nil
}

// EmptyContext is the whole context leave gets: the host's own addresses.
// engine.Env applies the rest of the contract (other fixed names exported
// empty, no KPSSH_VAR_*/KPSSH_SECRET_*).
func EmptyContext(host *v1beta1.SSHHost) engine.Context {
	return engine.Context{HostAddress: host.Spec.Address, NodeAddress: NodeAddress(host)}
}

// Shell is how a raw script runs: bash as root (sudo for other users).
func Shell(user string) string {
	if user == "" || user == "root" {
		return "bash -s"
	}
	return "sudo -n bash -s"
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	if len(s) > 300 {
		s = s[len(s)-300:]
	}
	return s
}
