package host_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/karpenter/pkg/events"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/controllers/host"
	"github.com/dklesev/kpssh/test/hostenv"
	"github.com/dklesev/kpssh/test/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	flag.Parse()
	ctrllog.SetLogger(logr.Discard())
	if testing.Short() {
		os.Exit(m.Run())
	}
	var err error
	if env, err = testenv.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "start control plane:", err)
		os.Exit(1)
	}
	code := m.Run()
	_ = env.Stop()
	os.Exit(code)
}

// startController runs the host controller in a manager against the real
// apiserver with a short probe interval, in its own namespace.
func startController(t *testing.T, ns string, interval time.Duration) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	mgr, err := manager.New(env.Config, manager.Options{Scheme: env.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0"})
	if err != nil {
		t.Fatal(err)
	}
	c := host.New(mgr.GetClient(), events.NewRecorder(mgr.GetEventRecorderFor("kpssh")), ns)
	c.Interval = interval
	c.Timeout = 10 * time.Second
	if err := c.Register(mgr); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = mgr.Start(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

func createNS(t *testing.T, name string) {
	t.Helper()
	if err := env.Client.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
		t.Fatal(err)
	}
}

func hostFor(ns string, h hostenv.Host) *v1beta1.SSHHost {
	return &v1beta1.SSHHost{
		ObjectMeta: metav1.ObjectMeta{Name: h.Name, Namespace: ns},
		Spec: v1beta1.SSHHostSpec{Address: h.Address, Port: int32(h.Port), User: h.User,
			SSHKeySecretRef: v1beta1.LocalObjectReference{Name: "world-key"},
			Capacity:        corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("256Mi")}},
	}
}

func get(t *testing.T, ns, name string) *v1beta1.SSHHost {
	t.Helper()
	h := &v1beta1.SSHHost{}
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, h); err != nil {
		t.Fatal(err)
	}
	return h
}

func eventually(t *testing.T, what string, timeout time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		ok, s := cond()
		if ok {
			return
		}
		last = s
		time.Sleep(250 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s; last: %s", what, last)
}

func waitState(t *testing.T, ns, name string, want v1beta1.HostState, timeout time.Duration) *v1beta1.SSHHost {
	t.Helper()
	var h *v1beta1.SSHHost
	eventually(t, fmt.Sprintf("%s %s", name, want), timeout, func() (bool, string) {
		h = get(t, ns, name)
		return h.Status.State == want, fmt.Sprintf("state=%s error=%q", h.Status.State, h.Status.LastProbeError)
	})
	return h
}

func hostEvents(t *testing.T, ns, name string) []string {
	t.Helper()
	list := &corev1.EventList{}
	if err := env.Client.List(context.Background(), list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range list.Items {
		if e.InvolvedObject.Name == name {
			out = append(out, e.Reason)
		}
	}
	return out
}

// The host controller against the real apiserver and real sshd on nspawn
// hosts: probes, TOFU pin, host-key mismatch after a rebuild, link loss,
// maintenance, and both branches of the zombie guard with a real leave script.
func TestHostControllerAgainstRealHosts(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: needs the real apiserver and nspawn hosts")
	}
	ctx := context.Background()
	w := hostenv.Up(t, 3)
	ns := "pool-real"
	createNS(t, ns)
	key, err := os.ReadFile(w.Inventory().ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "world-key", Namespace: ns}, Data: map[string][]byte{"privateKey": key}}); err != nil {
		t.Fatal(err)
	}
	for _, h := range w.Hosts() {
		if err := env.Client.Create(ctx, hostFor(ns, h)); err != nil {
			t.Fatal(err)
		}
	}
	startController(t, ns, 2*time.Second)

	t.Run("probe pins host keys and reads capacity", func(t *testing.T) {
		nproc := strings.TrimSpace(w.MustRun(0, "nproc"))
		for i, hh := range w.Hosts() {
			h := waitState(t, ns, hh.Name, v1beta1.HostAvailable, time.Minute)
			if h.Status.HostKeyFingerprint != hh.Fingerprint {
				t.Errorf("%s pinned %s, host key is %s", hh.Name, h.Status.HostKeyFingerprint, hh.Fingerprint)
			}
			if h.Status.ObservedArch != "amd64" || h.Status.ObservedCapacity.Cpu().String() != nproc {
				t.Errorf("%s observed %s cpu=%s, want amd64 cpu=%s", hh.Name, h.Status.ObservedArch, h.Status.ObservedCapacity.Cpu(), nproc)
			}
			if c := h.StatusConditions().Get(v1beta1.ConditionReady); c == nil || c.Reason != host.ReasonProbeSucceeded {
				t.Errorf("%s ready condition %+v", hh.Name, c)
			}
			_ = i
		}
	})

	t.Run("link cut parks Unhealthy, heal recovers", func(t *testing.T) {
		w.Cut(2)
		h := waitState(t, ns, w.Host(2).Name, v1beta1.HostUnhealthy, time.Minute)
		if h.Status.LastProbeError == "" {
			t.Fatal("no lastProbeError")
		}
		w.Heal(2)
		waitState(t, ns, w.Host(2).Name, v1beta1.HostAvailable, time.Minute)
	})

	t.Run("rebuilt host fails the pin with both fingerprints", func(t *testing.T) {
		old := w.Host(1).Fingerprint
		w.Wipe(1)
		w.Refresh()
		fresh := w.Host(1).Fingerprint
		if fresh == old {
			t.Fatal("wipe kept the host key")
		}
		h := waitState(t, ns, w.Host(1).Name, v1beta1.HostUnhealthy, time.Minute)
		if !strings.Contains(h.Status.LastProbeError, old) || !strings.Contains(h.Status.LastProbeError, fresh) {
			t.Fatalf("lastProbeError %q does not name both %s and %s", h.Status.LastProbeError, old, fresh)
		}
		// The seed's runbook: clear the fingerprint so TOFU re-pins.
		orig := h.DeepCopy()
		h.Status.HostKeyFingerprint = ""
		if err := env.Client.Status().Patch(ctx, h, client.MergeFrom(orig)); err != nil {
			t.Fatal(err)
		}
		h = waitState(t, ns, w.Host(1).Name, v1beta1.HostAvailable, time.Minute)
		if h.Status.HostKeyFingerprint != fresh {
			t.Fatalf("re-pinned %s, want %s", h.Status.HostKeyFingerprint, fresh)
		}
	})

	t.Run("maintenance parks without probing and unparks", func(t *testing.T) {
		name := w.Host(0).Name
		h := get(t, ns, name)
		h.Annotations = map[string]string{v1beta1.AnnotationMaintenance: "true"}
		if err := env.Client.Update(ctx, h); err != nil {
			t.Fatal(err)
		}
		h = waitState(t, ns, name, v1beta1.HostMaintenance, 30*time.Second)
		frozen := h.Status.LastProbeTime
		time.Sleep(5 * time.Second)
		if h = get(t, ns, name); !h.Status.LastProbeTime.Equal(frozen) {
			t.Fatal("maintenance host was probed")
		}
		delete(h.Annotations, v1beta1.AnnotationMaintenance)
		if err := env.Client.Update(ctx, h); err != nil {
			t.Fatal(err)
		}
		waitState(t, ns, name, v1beta1.HostAvailable, 30*time.Second)
	})

	fakeKubelet := "printf '[Service]\\nExecStart=/bin/sleep infinity\\n[Install]\\nWantedBy=multi-user.target\\n' > /etc/systemd/system/kubelet.service && systemctl daemon-reload && systemctl enable --now kubelet"

	t.Run("foreign kubelet is parked and left running", func(t *testing.T) {
		name := w.Host(2).Name
		w.MustRun(2, fakeKubelet)
		h := waitState(t, ns, name, v1beta1.HostUnhealthy, 30*time.Second)
		if !strings.Contains(h.Status.LastProbeError, "foreign kubelet") {
			t.Fatalf("lastProbeError %q", h.Status.LastProbeError)
		}
		time.Sleep(3 * time.Second)
		if out := strings.TrimSpace(w.MustRun(2, "systemctl is-active kubelet || true")); out != "active" {
			t.Fatalf("foreign kubelet touched: %s", out)
		}
		eventually(t, "ForeignKubelet event", 10*time.Second, func() (bool, string) {
			ev := hostEvents(t, ns, name)
			return strings.Contains(strings.Join(ev, ","), "ForeignKubelet"), strings.Join(ev, ",")
		})
		w.MustRun(2, "systemctl disable --now kubelet")
		waitState(t, ns, name, v1beta1.HostAvailable, 30*time.Second)
	})

	t.Run("our zombie kubelet is left and its Node deleted", func(t *testing.T) {
		hh := w.Host(0)
		profile := &v1beta1.SSHJoinProfile{ObjectMeta: metav1.ObjectMeta{Name: "zombie-test"},
			Spec: v1beta1.SSHJoinProfileSpec{Version: "1", Scripts: &v1beta1.ProfileScripts{
				Install: "true", Join: "true",
				Leave: "echo \"leaving $KPSSH_HOST_ADDRESS\" > /root/left\nsystemctl disable --now kubelet\n",
			}}}
		if err := env.Client.Create(ctx, profile); err != nil {
			t.Fatal(err)
		}
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "zombie-" + hh.Name}}
		if err := env.Client.Create(ctx, node); err != nil {
			t.Fatal(err)
		}
		node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: hh.Address}}
		if err := env.Client.Status().Update(ctx, node); err != nil {
			t.Fatal(err)
		}
		h := get(t, ns, hh.Name)
		orig := h.DeepCopy()
		h.Status.InstalledProfile = "zombie-test@1"
		if err := env.Client.Status().Patch(ctx, h, client.MergeFrom(orig)); err != nil {
			t.Fatal(err)
		}
		w.MustRun(0, fakeKubelet)

		eventually(t, "zombie node deleted", time.Minute, func() (bool, string) {
			err := env.Client.Get(ctx, client.ObjectKey{Name: node.Name}, &corev1.Node{})
			return err != nil, fmt.Sprint(get(t, ns, hh.Name).Status.State)
		})
		waitState(t, ns, hh.Name, v1beta1.HostAvailable, 30*time.Second)
		if out := strings.TrimSpace(w.MustRun(0, "systemctl is-enabled kubelet || true; systemctl is-active kubelet || true; cat /root/left")); out != "disabled\ninactive\nleaving "+hh.Address {
			t.Fatalf("host after zombie leave: %q", out)
		}
		eventually(t, "ZombieKubelet and ZombieLeft events", 10*time.Second, func() (bool, string) {
			ev := strings.Join(hostEvents(t, ns, hh.Name), ",")
			return strings.Contains(ev, "ZombieKubelet") && strings.Contains(ev, "ZombieLeft"), ev
		})
	})
}
