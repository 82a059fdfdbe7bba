// Package token manages the kubelet bootstrap tokens minted per join: Secrets
// `bootstrap-token-<id>` in kube-system (SPEC §7).
package token

import (
	"context"
	"fmt"
	"regexp"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Namespace holds bootstrap token Secrets.
const Namespace = "kube-system"

var idPattern = regexp.MustCompile(`^[a-z0-9]{6}$`)

// SecretName returns the Secret name for a token id.
func SecretName(id string) string { return "bootstrap-token-" + id }

// Provider mints and deletes tokens.
type Provider interface {
	// Delete removes the token's Secret; a missing Secret is success.
	Delete(ctx context.Context, id string) error
}

// New returns the default Provider.
func New(c client.Client) Provider { return &provider{c: c} }

type provider struct{ c client.Client }

func (p *provider) Delete(ctx context.Context, id string) error {
	if id == "" {
		return nil
	}
	if !idPattern.MatchString(id) {
		// Never turn a corrupted status field into a delete of some other Secret.
		return fmt.Errorf("bootstrap token id %q is malformed", id)
	}
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: SecretName(id)}}
	if err := p.c.Delete(ctx, s); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete bootstrap token %s: %w", id, err)
	}
	return nil
}
