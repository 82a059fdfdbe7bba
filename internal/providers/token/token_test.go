package token

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	bootstrapapi "k8s.io/cluster-bootstrap/token/api"
	bootstraputil "k8s.io/cluster-bootstrap/token/util"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.FixedZone("CET", 3600))

// sequence hands out the given tokens in order, then repeats the last.
func sequence(toks ...string) (gen func() (string, error), calls *int) {
	n := 0
	return func() (string, error) {
		i := min(n, len(toks)-1)
		n++
		return toks[i], nil
	}, &n
}

func newProvider(c client.Client, gen func() (string, error)) *provider {
	p := NewWithClock(c, clocktesting.NewFakePassiveClock(t0)).(*provider)
	if gen != nil {
		p.generate = gen
	}
	return p
}

func fakeClient(funcs *interceptor.Funcs, objs ...client.Object) client.Client {
	b := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(objs...)
	if funcs != nil {
		b = b.WithInterceptorFuncs(*funcs)
	}
	return b.Build()
}

func getSecret(t *testing.T, c client.Client, id string) *corev1.Secret {
	t.Helper()
	s := &corev1.Secret{}
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: "kube-system", Name: "bootstrap-token-" + id}, s); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestMintSecretIsWhatBootstrapExpects(t *testing.T) {
	c := fakeClient(nil)
	tok, err := NewWithClock(c, clocktesting.NewFakePassiveClock(t0)).Mint(context.Background(), "default-x7k2p")
	if err != nil {
		t.Fatal(err)
	}
	if !bootstraputil.IsValidBootstrapToken(tok.String()) || tok.String() != tok.ID+"."+tok.Secret {
		t.Fatalf("token %s is not <id>.<secret> in the bootstrap alphabet", tok.Redacted())
	}
	s := getSecret(t, c, tok.ID)
	if s.Namespace != "kube-system" || s.Name != bootstrapapi.BootstrapTokenSecretPrefix+tok.ID {
		t.Fatalf("secret %s/%s", s.Namespace, s.Name)
	}
	if s.Type != bootstrapapi.SecretTypeBootstrapToken {
		t.Fatalf("type %q", s.Type)
	}
	want := map[string]string{
		bootstrapapi.BootstrapTokenIDKey:               tok.ID,
		bootstrapapi.BootstrapTokenSecretKey:           tok.Secret,
		bootstrapapi.BootstrapTokenExpirationKey:       "2026-11-29T12:00:00Z", // t0 (11:00 UTC) + 1 h, in UTC
		bootstrapapi.BootstrapTokenUsageAuthentication: "true",
		bootstrapapi.BootstrapTokenUsageSigningKey:     "true",
		bootstrapapi.BootstrapTokenExtraGroupsKey:      "system:bootstrappers:kpssh",
		bootstrapapi.BootstrapTokenDescriptionKey:      "karpenter-provider-ssh nodeclaim default-x7k2p",
	}
	if len(s.Data) != len(want) {
		t.Errorf("secret has %d keys, want %d: %v", len(s.Data), len(want), keys(s.Data))
	}
	for k, v := range want {
		if got := string(s.Data[k]); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	exp, err := time.Parse(time.RFC3339, string(s.Data[bootstrapapi.BootstrapTokenExpirationKey]))
	if err != nil || exp.Sub(t0) != TTL {
		t.Errorf("expiration %v (%v), want clock + %s", exp, err, TTL)
	}
	if err := bootstraputil.ValidateBootstrapGroupName(string(s.Data[bootstrapapi.BootstrapTokenExtraGroupsKey])); err != nil {
		t.Error(err)
	}
}

func keys(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestMintDrawsFreshRandomTokens(t *testing.T) {
	c := fakeClient(nil)
	p := New(c)
	seen := map[string]bool{}
	for range 20 {
		tok, err := p.Mint(context.Background(), "nc")
		if err != nil {
			t.Fatal(err)
		}
		if seen[tok.ID] || seen[tok.Secret] || !bootstraputil.IsValidBootstrapToken(tok.String()) {
			t.Fatalf("token %s repeated or malformed", tok.Redacted())
		}
		seen[tok.ID], seen[tok.Secret] = true, true
	}
}

func TestMintIDCollision(t *testing.T) {
	const taken, free = "aaaaaa.0123456789abcdef", "bbbbbb.fedcba9876543210"
	theirs := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "bootstrap-token-aaaaaa"},
		Data: map[string][]byte{"description": []byte("someone else's")}}
	for _, tc := range []struct {
		name      string
		toks      []string
		wantID    string
		wantCalls int
	}{
		{"retries with a new id", []string{taken, free}, "bbbbbb", 2},
		{"gives up after a bounded number of tries", []string{taken}, "", mintAttempts},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := fakeClient(nil, theirs.DeepCopy())
			gen, calls := sequence(tc.toks...)
			tok, err := newProvider(c, gen).Mint(context.Background(), "nc")
			if *calls != tc.wantCalls {
				t.Errorf("%d draws, want %d", *calls, tc.wantCalls)
			}
			if tc.wantID == "" {
				if err == nil || !strings.Contains(err.Error(), "collisions") {
					t.Fatalf("err %v", err)
				}
				if strings.Contains(err.Error(), "0123456789abcdef") {
					t.Fatalf("error holds the secret: %v", err)
				}
			} else if err != nil || tok.ID != tc.wantID {
				t.Fatalf("token %s err %v", tok.Redacted(), err)
			}
			if got := string(getSecret(t, c, "aaaaaa").Data["description"]); got != "someone else's" {
				t.Fatalf("colliding Secret was overwritten: %q", got)
			}
		})
	}
}

func TestMintErrorsNeverHoldTheSecret(t *testing.T) {
	const tok = "cccccc.0123456789abcdef"
	for _, tc := range []struct {
		name  string
		gen   func() (string, error)
		funcs *interceptor.Funcs
		check func(error) bool
	}{
		{"apiserver error echoing the secret", func() (string, error) { return tok, nil }, &interceptor.Funcs{
			Create: func(_ context.Context, _ client.WithWatch, o client.Object, _ ...client.CreateOption) error {
				s := o.(*corev1.Secret)
				return apierrors.NewBadRequest("rejected token-secret " + string(s.Data["token-secret"]))
			}}, apierrors.IsBadRequest},
		{"generator failure", func() (string, error) { return "", errors.New("entropy exhausted") }, nil, nil},
		{"malformed generator output", func() (string, error) { return "cccccc.0123456789ABCDEF", nil }, nil, nil},
		{"generator output without a dot", func() (string, error) { return "0123456789abcdef", nil }, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := newProvider(fakeClient(tc.funcs), tc.gen).Mint(context.Background(), "nc")
			if err == nil {
				t.Fatal("no error")
			}
			for _, secret := range []string{"0123456789abcdef", "0123456789ABCDEF"} {
				if strings.Contains(err.Error(), secret) {
					t.Fatalf("error holds the secret: %v", err)
				}
			}
			if tc.check != nil && !tc.check(err) {
				t.Fatalf("error %v lost its kind", err)
			}
		})
	}
}

func TestMintRefusesEmptyNodeClaimName(t *testing.T) {
	c := fakeClient(nil)
	if _, err := New(c).Mint(context.Background(), ""); err == nil {
		t.Fatal("minted a token for no NodeClaim")
	}
	list := &corev1.SecretList{}
	if err := c.List(context.Background(), list); err != nil || len(list.Items) != 0 {
		t.Fatalf("secrets %d err %v", len(list.Items), err)
	}
}

func TestDelete(t *testing.T) {
	mine := func() *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "bootstrap-token-abcdef"}}
	}
	for _, tc := range []struct {
		name      string
		id        string
		malformed bool
		gone      bool // bootstrap-token-abcdef deleted
	}{
		{"existing token", "abcdef", false, true},
		{"already gone is success", "zzzzzz", false, false},
		{"empty id is a no-op", "", false, false},
		{"upper case", "ABCDEF", true, false},
		{"too short", "abcde", true, false},
		{"too long", "abcdefg", true, false},
		{"whole token in the id field", "abcdef.0123456789abcdef", true, false},
		{"path", "../abc", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			deletes := 0
			c := fakeClient(&interceptor.Funcs{Delete: func(ctx context.Context, c client.WithWatch, o client.Object, opts ...client.DeleteOption) error {
				deletes++
				return c.Delete(ctx, o, opts...)
			}}, mine())
			err := New(c).Delete(context.Background(), tc.id)
			if tc.malformed {
				if !errors.Is(err, ErrMalformedID) || deletes != 0 {
					t.Fatalf("err %v, %d deletes", err, deletes)
				}
				if strings.Contains(err.Error(), tc.id) {
					t.Fatalf("error echoes the id field: %v", err)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			err = c.Get(context.Background(), client.ObjectKeyFromObject(mine()), &corev1.Secret{})
			if gone := apierrors.IsNotFound(err); gone != tc.gone {
				t.Fatalf("bootstrap-token-abcdef gone=%v, want %v (%v)", gone, tc.gone, err)
			}
		})
	}
}

func TestTokenPrintsRedacted(t *testing.T) {
	tok := Token{ID: "abcdef", Secret: "0123456789abcdef"}
	if tok.String() != "abcdef.0123456789abcdef" {
		t.Fatalf("String() = %q", tok.String())
	}
	var logged strings.Builder
	log := funcr.New(func(prefix, args string) { logged.WriteString(args) }, funcr.Options{})
	log.Info("minted", "token", tok, "wrapped", struct{ T Token }{tok})
	js, err := json.Marshal(struct{ T Token }{tok})
	if err != nil {
		t.Fatal(err)
	}
	for _, out := range []string{
		fmt.Sprint(tok), fmt.Sprintf("%s", tok), fmt.Sprintf("%v", tok), fmt.Sprintf("%+v", tok), fmt.Sprintf("%#v", tok),
		fmt.Sprintf("%q", tok), fmt.Sprintf("%v", struct{ T Token }{tok}), fmt.Sprintf("%+v", &struct{ T Token }{tok}),
		fmt.Errorf("join with %v", tok).Error(), logged.String(), string(js),
	} {
		if strings.Contains(out, tok.Secret) {
			t.Errorf("secret in %q", out)
		}
		if !strings.Contains(out, "abcdef") {
			t.Errorf("id missing from %q", out)
		}
	}
}
