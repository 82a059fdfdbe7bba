package token

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/go-logr/logr"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	bootstrapapi "k8s.io/cluster-bootstrap/token/api"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/dklesev/kpssh/test/testenv"
)

// apiserver is a real kube-apiserver with the bootstrap token authenticator
// on. testenv.Start has no hook for apiserver flags, so this package starts
// its own control plane (same binaries, testenv.Assets); it needs no CRDs.
var (
	apiserver *rest.Config
	admin     client.Client
)

func TestMain(m *testing.M) {
	flag.Parse()
	ctrllog.SetLogger(logr.Discard())
	if testing.Short() {
		os.Exit(m.Run())
	}
	os.Exit(runWithAPIServer(m))
}

func runWithAPIServer(m *testing.M) int {
	assets, err := testenv.Assets()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	env := &envtest.Environment{BinaryAssetsDirectory: assets, ControlPlaneStartTimeout: 2 * time.Minute, ControlPlaneStopTimeout: time.Minute}
	env.ControlPlane.GetAPIServer().Configure().Set("enable-bootstrap-token-auth", "true")
	cfg, err := env.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "start control plane:", err)
		return 1
	}
	defer func() {
		if err := env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stop control plane:", err)
		}
	}()
	if admin, err = client.New(cfg, client.Options{Scheme: scheme.Scheme}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	apiserver = cfg
	return m.Run()
}

func needAPIServer(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: needs the real apiserver")
	}
}

// whoAmI asks the apiserver who the bearer of tok is. A rejected token is
// an Unauthorized error.
func whoAmI(ctx context.Context, tok Token) (authnv1.UserInfo, error) {
	cfg := rest.AnonymousClientConfig(apiserver)
	cfg.BearerToken = tok.String()
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return authnv1.UserInfo{}, err
	}
	r, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authnv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return authnv1.UserInfo{}, err
	}
	return r.Status.UserInfo, nil
}

// eventually polls cond (the authenticator reads Secrets through an
// informer, so a fresh or deleted Secret takes a moment to count).
func eventually(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		ok, s := cond()
		if ok {
			return
		}
		last = s
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s; last: %s", what, last)
}

func TestMintedTokenAuthenticatesUntilDeleted(t *testing.T) {
	needAPIServer(t)
	ctx := context.Background()
	p := New(admin)
	tok, err := p.Mint(ctx, "default-abc12")
	if err != nil {
		t.Fatal(err)
	}
	s := &corev1.Secret{}
	if err := admin.Get(ctx, client.ObjectKey{Namespace: Namespace, Name: SecretName(tok.ID)}, s); err != nil {
		t.Fatal(err)
	}
	if s.Type != bootstrapapi.SecretTypeBootstrapToken || string(s.Data[bootstrapapi.BootstrapTokenSecretKey]) != tok.Secret {
		t.Fatalf("stored secret type %q", s.Type)
	}

	var user authnv1.UserInfo
	eventually(t, "the token to authenticate", func() (bool, string) {
		user, err = whoAmI(ctx, tok)
		return err == nil, fmt.Sprint(err)
	})
	if user.Username != bootstrapapi.BootstrapUserPrefix+tok.ID {
		t.Errorf("authenticated as %q", user.Username)
	}
	for _, g := range []string{bootstrapapi.BootstrapDefaultGroup, Group} {
		if !slices.Contains(user.Groups, g) {
			t.Errorf("groups %v lack %s", user.Groups, g)
		}
	}

	if err := p.Delete(ctx, tok.ID); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the deleted token to be refused", func() (bool, string) {
		_, err = whoAmI(ctx, tok)
		return apierrors.IsUnauthorized(err), fmt.Sprint(err)
	})
	if err := p.Delete(ctx, tok.ID); err != nil {
		t.Fatalf("second delete: %v", err)
	}
}

// The apiserver honours the expiration Mint writes: a token minted "two
// hours ago" is refused while a control token minted after it is accepted
// (the informer delivers in order, so the expired one has been seen).
func TestExpiredTokenIsRefused(t *testing.T) {
	needAPIServer(t)
	ctx := context.Background()
	expired, err := NewWithClock(admin, clocktesting.NewFakePassiveClock(time.Now().Add(-2*TTL))).Mint(ctx, "old")
	if err != nil {
		t.Fatal(err)
	}
	control, err := New(admin).Mint(ctx, "new")
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the control token to authenticate", func() (bool, string) {
		_, err := whoAmI(ctx, control)
		return err == nil, fmt.Sprint(err)
	})
	if _, err := whoAmI(ctx, expired); !apierrors.IsUnauthorized(err) {
		t.Fatalf("expired token: %v, want Unauthorized", err)
	}
	for _, tok := range []Token{expired, control} {
		if err := New(admin).Delete(ctx, tok.ID); err != nil {
			t.Fatal(err)
		}
	}
}

// A collision against the real apiserver: its AlreadyExists makes Mint draw
// again, and the other Secret is left alone.
func TestMintCollisionAgainstAPIServer(t *testing.T) {
	needAPIServer(t)
	ctx := context.Background()
	theirs := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: SecretName("k0k0k0")},
		Type: bootstrapapi.SecretTypeBootstrapToken, Data: map[string][]byte{"description": []byte("kubeadm's")}}
	if err := admin.Create(ctx, theirs); err != nil {
		t.Fatal(err)
	}
	gen, calls := sequence("k0k0k0.0123456789abcdef", "k1k1k1.0123456789abcdef")
	tok, err := newProvider(admin, gen).Mint(ctx, "nc")
	if err != nil || tok.ID != "k1k1k1" || *calls != 2 {
		t.Fatalf("token %s err %v draws %d", tok.Redacted(), err, *calls)
	}
	got := &corev1.Secret{}
	if err := admin.Get(ctx, client.ObjectKeyFromObject(theirs), got); err != nil || string(got.Data["description"]) != "kubeadm's" {
		t.Fatalf("their Secret changed: %v %q", err, got.Data["description"])
	}
}
