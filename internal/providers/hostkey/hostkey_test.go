package hostkey_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"net"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/providers/hostkey"
	"github.com/dklesev/kpssh/internal/sshx"
	"github.com/dklesev/kpssh/internal/sshx/sshtest"
)

func pemKey(t *testing.T, passphrase string) ([]byte, ssh.PublicKey) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	var blk *pem.Block
	if passphrase == "" {
		blk, err = ssh.MarshalPrivateKey(priv, "")
	} else {
		blk, err = ssh.MarshalPrivateKeyWithPassphrase(priv, "", []byte(passphrase))
	}
	if err != nil {
		t.Fatal(err)
	}
	sp, _ := ssh.NewPublicKey(pub)
	return pem.EncodeToMemory(blk), sp
}

func TestGet(t *testing.T) {
	good, pub := pemKey(t, "")
	enc, _ := pemKey(t, "hunter2-canary")
	canary := "c2VjcmV0LWNhbmFyeS1ub3QtYS1rZXk"
	bad := sshtest.FakePEM(canary)
	fp := sshx.Fingerprint(pub)
	for _, tc := range []struct {
		name     string
		data     map[string][]byte
		noSecret bool
		wantFP   string
		fromSec  bool
		wantErr  string
	}{
		{name: "key only, TOFU pin from status", data: map[string][]byte{"privateKey": good}, wantFP: "SHA256:status"},
		{name: "knownHost fingerprint", data: map[string][]byte{"privateKey": good, "knownHost": []byte(fp)}, wantFP: fp, fromSec: true},
		{name: "knownHost public key line", data: map[string][]byte{"privateKey": good, "knownHost": []byte(sshx.PublicKeyLine(pub))}, wantFP: fp, fromSec: true},
		{name: "no secret", noSecret: true, wantErr: "ssh key secret kpssh-system/key not found"},
		{name: "no privateKey", data: map[string][]byte{"knownHost": []byte(fp)}, wantErr: `kpssh-system/key has no "privateKey"`},
		{name: "encrypted key", data: map[string][]byte{"privateKey": enc}, wantErr: "kpssh-system/key: privateKey is passphrase-protected"},
		{name: "malformed key", data: map[string][]byte{"privateKey": bad}, wantErr: "kpssh-system/key: privateKey is not a PEM or OpenSSH private key"},
		{name: "malformed knownHost", data: map[string][]byte{"privateKey": good, "knownHost": []byte("SHA256:nope")}, wantErr: "kpssh-system/key: knownHost"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := fake.NewClientBuilder().WithScheme(scheme.Scheme)
			if !tc.noSecret {
				b = b.WithObjects(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "key", Namespace: "kpssh-system"}, Data: tc.data})
			}
			h := &v1beta1.SSHHost{ObjectMeta: metav1.ObjectMeta{Name: "h", Namespace: "kpssh-system"},
				Spec:   v1beta1.SSHHostSpec{SSHKeySecretRef: v1beta1.LocalObjectReference{Name: "key"}},
				Status: v1beta1.SSHHostStatus{HostKeyFingerprint: "SHA256:status"}}
			c, err := hostkey.New(b.Build()).Get(context.Background(), h)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				for _, leak := range []string{canary, "hunter2", "PRIVATE KEY"} {
					if strings.Contains(err.Error(), leak) {
						t.Fatalf("error leaks key material: %v", err)
					}
				}
				return
			}
			if err != nil || c.PinnedFingerprint != tc.wantFP || c.FromSecret != tc.fromSec {
				t.Fatalf("got %+v %v", c, err)
			}
		})
	}
}

// Which read failures are the apiserver's (ErrUnavailable: the caller asks
// again, the host keeps its state) and which are settings to fix.
func TestGetReadErrors(t *testing.T) {
	gr := schema.GroupResource{Resource: "secrets"}
	for _, tc := range []struct {
		name        string
		err         error
		unavailable bool
	}{
		{"503", apierrors.NewServiceUnavailable("shutting down"), true},
		{"500 etcd leader changed", apierrors.NewInternalError(errors.New("etcdserver: leader changed")), true},
		{"504 server timeout", apierrors.NewTimeoutError("the server was unable to return a response", 0), true},
		{"429 past client-go's retries", apierrors.NewTooManyRequests("throttled", 1), true},
		{"connection refused", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, true},
		{"context deadline", context.DeadlineExceeded, true},
		{"forbidden: the controller's RBAC", apierrors.NewForbidden(gr, "key", errors.New("no get")), false},
		{"unauthorized", apierrors.NewUnauthorized("token expired"), false},
		{"not found", apierrors.NewNotFound(gr, "key"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithInterceptorFuncs(interceptor.Funcs{
				Get: func(context.Context, client.WithWatch, client.ObjectKey, client.Object, ...client.GetOption) error {
					return tc.err
				},
			}).Build()
			h := &v1beta1.SSHHost{ObjectMeta: metav1.ObjectMeta{Name: "h", Namespace: "kpssh-system"},
				Spec: v1beta1.SSHHostSpec{SSHKeySecretRef: v1beta1.LocalObjectReference{Name: "key"}}}
			_, err := hostkey.New(c).Get(context.Background(), h)
			if err == nil || !strings.Contains(err.Error(), "kpssh-system/key") {
				t.Fatalf("err %v, want one naming the Secret", err)
			}
			if got := errors.Is(err, hostkey.ErrUnavailable); got != tc.unavailable {
				t.Fatalf("errors.Is(%v, ErrUnavailable) = %v, want %v", err, got, tc.unavailable)
			}
			if !errors.Is(err, tc.err) && !apierrors.IsNotFound(tc.err) {
				t.Fatalf("%v does not wrap %v", err, tc.err)
			}
		})
	}
}
