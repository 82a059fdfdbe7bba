package host_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/controllers/host"
	"github.com/dklesev/kpssh/internal/probe"
	"github.com/dklesev/kpssh/internal/providers/hostkey"
	"github.com/dklesev/kpssh/internal/sshx"
	"github.com/dklesev/kpssh/internal/sshx/sshtest"
)

// The apiserver fails the controller's read of a host's key Secret (503,
// as an apiserver restarting behind a load balancer or an etcd leader
// change answers). That is the apiserver's state, not the host's: the host
// stays Available (no Unhealthy flap across a fleet), nothing is probed
// without its key, and once the reads get through the probes go on. The
// fault is on the wire: the reader is the controller's live client (as the
// operator wires it) through a loopback proxy to the real apiserver that
// answers key Secret reads itself while failing.
func TestUnavailableKeyReadLeavesHostAlone(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: needs the real apiserver")
	}
	ns := "pool-keyread"
	createNS(t, ns)
	px := newFaultProxy(t, "/api/v1/namespaces/"+ns+"/secrets/")
	reader, err := client.New(px.config, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	_, pemBytes := sshtest.NewKey(t)
	mustCreate(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "key", Namespace: ns}, Data: map[string][]byte{hostkey.KeyPrivateKey: pemBytes}})
	h := &v1beta1.SSHHost{ObjectMeta: metav1.ObjectMeta{Name: "h1", Namespace: ns}, Spec: v1beta1.SSHHostSpec{
		Address: "10.77.0.2", SSHKeySecretRef: v1beta1.LocalObjectReference{Name: "key"},
		Capacity: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("1Gi")}}}
	mustCreate(t, h)
	var probes atomic.Int32
	startController(t, ns, 300*time.Millisecond, func(c *host.Controller) {
		c.Keys = hostkey.New(reader)
		c.Prober = func(context.Context, sshx.Target, bool, string, time.Duration) (probe.Result, error) {
			probes.Add(1)
			return probe.Result{Facts: probe.Facts{CPU: 1, MemoryKiB: 1 << 20, Arch: "amd64"}, Fingerprint: "SHA256:" + strings.Repeat("A", 43)}, nil
		}
	})
	waitState(t, ns, h.Name, v1beta1.HostAvailable, 30*time.Second)
	if px.passed.Load() == 0 {
		t.Fatal("no key read went through the proxy")
	}

	px.failing.Store(true)
	start := probes.Load()
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if g := get(t, ns, h.Name); g.Status.State != v1beta1.HostAvailable {
			t.Fatalf("with its key read failing (503), host %s went %s: %q", h.Name, g.Status.State, g.Status.LastProbeError)
		}
	}
	if px.failed.Load() < 3 {
		t.Fatalf("%d key reads failed in 5 s, want several (probe interval 300 ms)", px.failed.Load())
	}
	if n := probes.Load() - start; n > 1 { // one may have read its key just before
		t.Errorf("%d probes while the key could not be read", n)
	}
	t.Logf("%d key reads failed (503) in 5 s; host Available throughout", px.failed.Load())

	px.failing.Store(false)
	before := probes.Load()
	eventually(t, "probes again once the reads get through", 30*time.Second, func() (bool, string) {
		g := get(t, ns, h.Name)
		return probes.Load() > before && g.Status.State == v1beta1.HostAvailable, fmt.Sprintf("%d probes, %s", probes.Load()-before, g.Status.State)
	})
}

// faultProxy is a plain-HTTP loopback proxy to the real apiserver (its
// transport carries the test's credentials). While failing, GETs under
// prefix get the apiserver's 503 Status (no Retry-After: client-go does
// not retry it) and never reach the apiserver.
type faultProxy struct {
	config         *rest.Config
	failing        atomic.Bool
	passed, failed atomic.Int32
}

func newFaultProxy(t *testing.T, prefix string) *faultProxy {
	t.Helper()
	up, err := url.Parse(env.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := rest.TransportFor(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	px := &faultProxy{}
	rp := httputil.NewSingleHostReverseProxy(up)
	rp.Transport = tr
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, prefix) {
			if px.failing.Load() {
				px.failed.Add(1)
				st := apierrors.NewServiceUnavailable("the apiserver is shutting down").Status()
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusServiceUnavailable)
				_ = json.NewEncoder(w).Encode(&st)
				return
			}
			px.passed.Add(1)
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	px.config = &rest.Config{Host: srv.URL, QPS: -1}
	return px
}

func mustCreate(t *testing.T, o client.Object) {
	t.Helper()
	if err := env.Client.Create(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), o) })
}
