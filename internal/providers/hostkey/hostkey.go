// Package hostkey resolves a host's SSH credentials from its key Secret in
// the pool namespace. The private key never leaves this struct except into
// an SSH client or a 0600 file of a run directory.
package hostkey

import (
	"context"
	"errors"
	"fmt"

	"golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/sshx"
)

// Secret keys, as the seed documents them.
const (
	KeyPrivateKey = "privateKey"
	KeyKnownHost  = "knownHost"
)

// Credentials are what connecting to one host needs.
type Credentials struct {
	PrivateKey []byte
	// PinnedFingerprint is the Secret's knownHost (authoritative) or else the
	// TOFU pin from status; empty means trust on first use.
	PinnedFingerprint string
	// FromSecret says the pin came from the Secret (so status must follow it).
	FromSecret bool
}

// ErrUnavailable marks a key Secret the apiserver did not serve this time
// (unavailable, timed out, throttled past client-go's retries, connection
// lost): the apiserver's state, neither the host's nor a setting; ask
// again later. A missing Secret, a refused read (the controller's RBAC)
// and a bad key are not marked.
var ErrUnavailable = errors.New("apiserver did not serve the key Secret")

// unavailable keeps the apiserver's message and matches ErrUnavailable.
type unavailable struct{ error }

func (e unavailable) Unwrap() error      { return e.error }
func (unavailable) Is(target error) bool { return target == ErrUnavailable }

// Provider resolves credentials.
type Provider interface {
	Get(ctx context.Context, host *v1beta1.SSHHost) (Credentials, error)
}

// New returns the default Provider reading Secrets with c.
func New(c client.Reader) Provider { return &provider{c: c} }

type provider struct{ c client.Reader }

func (p *provider) Get(ctx context.Context, host *v1beta1.SSHHost) (Credentials, error) {
	s := &corev1.Secret{}
	key := client.ObjectKey{Namespace: host.Namespace, Name: host.Spec.SSHKeySecretRef.Name}
	if err := p.c.Get(ctx, key, s); err != nil {
		if apierrors.IsNotFound(err) {
			return Credentials{}, fmt.Errorf("ssh key secret %s/%s not found", key.Namespace, key.Name)
		}
		err = fmt.Errorf("read ssh key secret %s/%s: %w", key.Namespace, key.Name, err)
		if apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) {
			return Credentials{}, err // the controller's RBAC or credentials: a setting to fix
		}
		return Credentials{}, unavailable{err}
	}
	pk := s.Data[KeyPrivateKey]
	if len(pk) == 0 {
		return Credentials{}, fmt.Errorf("ssh key secret %s/%s has no %q", key.Namespace, key.Name, KeyPrivateKey)
	}
	if _, err := ssh.ParsePrivateKey(pk); err != nil {
		var pp *ssh.PassphraseMissingError
		if errors.As(err, &pp) {
			return Credentials{}, fmt.Errorf("ssh key secret %s/%s: %s is passphrase-protected; kpssh needs an unencrypted key", key.Namespace, key.Name, KeyPrivateKey)
		}
		// The parser's own message is not relayed: keep key bytes out of errors.
		return Credentials{}, fmt.Errorf("ssh key secret %s/%s: %s is not a PEM or OpenSSH private key", key.Namespace, key.Name, KeyPrivateKey)
	}
	c := Credentials{PrivateKey: pk, PinnedFingerprint: host.Status.HostKeyFingerprint}
	if kh := s.Data[KeyKnownHost]; len(kh) > 0 {
		fp, err := sshx.ParseKnownHost(string(kh))
		if err != nil {
			return Credentials{}, fmt.Errorf("ssh key secret %s/%s: %w", key.Namespace, key.Name, err)
		}
		c.PinnedFingerprint, c.FromSecret = fp, true
	}
	return c, nil
}

// Target builds the SSH target for a host with these credentials.
func (c Credentials) Target(host *v1beta1.SSHHost) sshx.Target {
	return sshx.Target{
		Address:             host.Spec.Address,
		Port:                host.Spec.Port,
		User:                host.Spec.User,
		PrivateKey:          c.PrivateKey,
		ExpectedFingerprint: c.PinnedFingerprint,
	}
}
