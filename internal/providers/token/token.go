// Package token manages the kubelet bootstrap tokens minted per join: Secrets
// `bootstrap-token-<id>` in kube-system (SPEC §7).
package token

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	bootstrapapi "k8s.io/cluster-bootstrap/token/api"
	bootstraputil "k8s.io/cluster-bootstrap/token/util"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

const (
	// Namespace holds bootstrap token Secrets.
	Namespace = "kube-system"
	// TTL is how long a minted token authenticates. Install and join must
	// fit Karpenter's 15-minute registration window, so an hour is ample,
	// and it bounds the damage of a token the controller lost track of.
	TTL = time.Hour
	// Group is the extra group minted tokens authenticate as, on top of
	// system:bootstrappers; the cluster's bootstrap RBAC binds it.
	Group = bootstrapapi.BootstrapDefaultGroup + ":kpssh"
	// DescriptionPrefix starts every minted token's description; the seed's
	// runbook tells operators to look for it.
	DescriptionPrefix = "karpenter-provider-ssh nodeclaim "

	// mintAttempts bounds id-collision retries. 36^6 ids make even one
	// collision unlikely; several in a row mean something else is wrong.
	mintAttempts = 5
)

// ErrMalformedID marks an id that cannot name a bootstrap token. Callers
// may treat it as "nothing of ours to delete".
var ErrMalformedID = errors.New("malformed bootstrap token id")

// ValidID reports whether id can be a bootstrap token id (`[a-z0-9]{6}`).
func ValidID(id string) bool { return bootstraputil.IsValidBootstrapTokenID(id) }

// SecretName returns the Secret name for a token id.
func SecretName(id string) string { return bootstraputil.BootstrapTokenSecretName(id) }

// Token is a bootstrap token. String is the only way to its bearer value:
// every fmt verb, logr and JSON show Redacted, so passing a Token to a
// logger or an error by mistake does not leak the secret half.
type Token struct{ ID, Secret string }

// String returns the bearer token `<id>.<secret>`. Never log it.
func (t Token) String() string { return bootstraputil.TokenFromIDAndSecret(t.ID, t.Secret) }

// Redacted returns `<id>.<redacted>`: the id is public (it names the Secret).
func (t Token) Redacted() string { return t.ID + ".<redacted>" }

// GoString keeps %#v from printing the secret half.
func (t Token) GoString() string { return fmt.Sprintf("token.Token{ID:%q, Secret:<redacted>}", t.ID) }

// Format makes every fmt verb (%v, %s, %q, %+v, also inside structs) print
// the redacted form; fmt consults Format before String.
func (t Token) Format(f fmt.State, verb rune) {
	if verb == 'v' && f.Flag('#') {
		_, _ = io.WriteString(f, t.GoString())
		return
	}
	_, _ = io.WriteString(f, t.Redacted())
}

// MarshalLog is logr's hook: structured logs get the redacted form.
func (t Token) MarshalLog() any { return t.Redacted() }

// MarshalJSON keeps the secret half out of anything serialized.
func (t Token) MarshalJSON() ([]byte, error) { return json.Marshal(t.Redacted()) }

// Provider mints and deletes tokens.
type Provider interface {
	// Mint creates Secret bootstrap-token-<id> in kube-system for one
	// NodeClaim's join and returns the token. Errors never hold the secret.
	Mint(ctx context.Context, nodeClaimName string) (Token, error)
	// Delete removes the token's Secret; a missing Secret is success, an
	// empty id a no-op, a malformed id an error wrapping ErrMalformedID.
	Delete(ctx context.Context, id string) error
}

// New returns the default Provider.
func New(c client.Client) Provider { return NewWithClock(c, clock.RealClock{}) }

// NewWithClock returns the default Provider stamping expirations from clk.
func NewWithClock(c client.Client, clk clock.PassiveClock) Provider {
	return &provider{c: c, clock: clk, generate: bootstraputil.GenerateBootstrapToken}
}

type provider struct {
	c     client.Client
	clock clock.PassiveClock
	// generate returns a random "<id>.<secret>" (crypto/rand).
	generate func() (string, error)
}

func (p *provider) Mint(ctx context.Context, nodeClaimName string) (Token, error) {
	if nodeClaimName == "" {
		return Token{}, errors.New("mint bootstrap token: empty NodeClaim name")
	}
	for range mintAttempts {
		tok, err := p.newToken()
		if err != nil {
			return Token{}, err
		}
		err = p.c.Create(ctx, Secret(tok, nodeClaimName, p.clock.Now()))
		if err == nil {
			return tok, nil
		}
		if apierrors.IsAlreadyExists(err) {
			continue // someone holds this id: draw another
		}
		return Token{}, fmt.Errorf("create bootstrap token %s: %w", tok.ID, redactErr{err: err, secret: tok.Secret})
	}
	return Token{}, fmt.Errorf("create bootstrap token: %d id collisions in a row", mintAttempts)
}

func (p *provider) newToken() (Token, error) {
	s, err := p.generate()
	if err != nil {
		return Token{}, fmt.Errorf("generate bootstrap token: %w", err)
	}
	id, secret, ok := strings.Cut(s, ".")
	if !ok || !bootstraputil.IsValidBootstrapToken(s) {
		// Never echo s: it holds the secret half.
		return Token{}, errors.New("generate bootstrap token: generator returned a malformed token")
	}
	return Token{ID: id, Secret: secret}, nil
}

// Secret is the kube-system Secret the apiserver's bootstrap authenticator
// accepts for tok: signing is enabled too so the token can verify the
// kube-public/cluster-info JWS, as kubeadm's default tokens do.
func Secret(tok Token, nodeClaimName string, now time.Time) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: SecretName(tok.ID)},
		Type:       bootstrapapi.SecretTypeBootstrapToken,
		Data: map[string][]byte{
			bootstrapapi.BootstrapTokenIDKey:               []byte(tok.ID),
			bootstrapapi.BootstrapTokenSecretKey:           []byte(tok.Secret),
			bootstrapapi.BootstrapTokenExpirationKey:       []byte(now.Add(TTL).UTC().Format(time.RFC3339)),
			bootstrapapi.BootstrapTokenUsageAuthentication: []byte("true"),
			bootstrapapi.BootstrapTokenUsageSigningKey:     []byte("true"),
			bootstrapapi.BootstrapTokenExtraGroupsKey:      []byte(Group),
			bootstrapapi.BootstrapTokenDescriptionKey:      []byte(DescriptionPrefix + nodeClaimName),
		},
	}
}

func (p *provider) Delete(ctx context.Context, id string) error {
	if id == "" {
		return nil
	}
	if !ValidID(id) {
		// Never turn a corrupted status field into a delete of some other
		// Secret, and never echo it: it might be a whole "<id>.<secret>".
		return fmt.Errorf("bootstrap token id of %d bytes, want [a-z0-9]{6}: %w", len(id), ErrMalformedID)
	}
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: SecretName(id)}}
	if err := p.c.Delete(ctx, s); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete bootstrap token %s: %w", id, err)
	}
	return nil
}

// redactErr masks the secret half in an apiserver error's text while
// keeping it inspectable (apierrors.IsX unwraps).
type redactErr struct {
	err    error
	secret string
}

func (e redactErr) Error() string {
	if e.secret == "" {
		return e.err.Error()
	}
	return strings.ReplaceAll(e.err.Error(), e.secret, "<redacted>")
}
func (e redactErr) Unwrap() error { return e.err }
