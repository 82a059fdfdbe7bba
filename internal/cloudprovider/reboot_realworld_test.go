package cloudprovider

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/controllers/host"
	"github.com/dklesev/kpssh/internal/engine"
	"github.com/dklesev/kpssh/internal/providers/hostkey"
	"github.com/dklesev/kpssh/internal/providers/phase"
	"github.com/dklesev/kpssh/test/hostenv"
)

// The default reboot on a real host: the real apiserver, the host
// controller, ansible-playbook from the runner image and an nspawn host
// (whose launcher boots it again, as systemd-nspawn@.service would). The
// boot id changes, sshd comes back, the host stays claimed and InUse, the
// probe records the return; the same operation again reboots nothing.
func TestRebootRealHost(t *testing.T) {
	if env == nil || testing.Short() {
		t.Skip("-short: needs envtest, nspawn hosts and ansible-playbook")
	}
	w := hostenv.Up(t, 1)
	ctx := context.Background()
	ns := "reboot-real"
	key, err := os.ReadFile(w.Inventory().ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	hw := w.Host(0)
	h := &v1beta1.SSHHost{ObjectMeta: metav1.ObjectMeta{Name: "h1", Namespace: ns},
		Spec: v1beta1.SSHHostSpec{Address: hw.Address, Port: int32(hw.Port), User: hw.User,
			SSHKeySecretRef: v1beta1.LocalObjectReference{Name: "world-key"},
			Capacity:        corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("256Mi")}}}
	for _, o := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "world-key"}, Data: map[string][]byte{"privateKey": key}},
		h,
	} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	rec := &recorder{}
	mgr, err := manager.New(env.Config, manager.Options{Scheme: env.Scheme, Metrics: metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0", Controller: config.Controller{SkipNameValidation: ptr.To(true)}})
	if err != nil {
		t.Fatal(err)
	}
	hc := host.New(mgr.GetClient(), rec, ns)
	hc.Interval, hc.Timeout, hc.RebootPoll = 5*time.Second, 10*time.Second, time.Second
	if err := hc.Register(mgr); err != nil {
		t.Fatal(err)
	}
	mctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = mgr.Start(mctx) }()
	t.Cleanup(func() { cancel(); <-done })

	get := func() *v1beta1.SSHHost {
		t.Helper()
		h := &v1beta1.SSHHost{}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "h1"}, h); err != nil {
			t.Fatal(err)
		}
		return h
	}
	wait := func(what string, d time.Duration, cond func(h *v1beta1.SSHHost) bool) *v1beta1.SSHHost {
		t.Helper()
		deadline := time.Now().Add(d)
		for {
			h := get()
			if cond(h) {
				return h
			}
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s: state %s, reboot %+v, lastProbeError %q", what, h.Status.State, h.Status.Reboot, h.Status.LastProbeError)
			}
			time.Sleep(250 * time.Millisecond)
		}
	}
	wait("Available", 2*time.Minute, func(h *v1beta1.SSHHost) bool { return h.Status.State == v1beta1.HostAvailable })

	// The host joined under a NodeClaim (as Create leaves it).
	claim := newNodeClaim("reboot-a", func(nc *karpv1.NodeClaim) { nc.UID = "" })
	if err := env.Client.Create(ctx, claim); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), claim) })
	cur := get()
	orig := cur.DeepCopy()
	cur.Status.ClaimRef = &v1beta1.ClaimRef{Name: claim.Name, UID: claim.UID}
	cur.Status.ProviderID = ProviderID(ns, "h1")
	cur.SetState(v1beta1.HostInUse, "joined", metav1.Now())
	if err := env.Client.Status().Patch(ctx, cur, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})); err != nil {
		t.Fatal(err)
	}

	coll, err := engine.FindCollectionsPath()
	if err != nil {
		t.Fatal(err)
	}
	eng, err := engine.New(engine.Options{CollectionsPath: coll})
	if err != nil {
		t.Fatal(err)
	}
	cp := New(env.Client, env.Client, ns, phase.New(eng, hostkey.New(env.Client), rec), &fakeTokens{}, rec, clock.RealClock{})
	bootID := func() string { return strings.TrimSpace(w.MustRun(0, "cat /proc/sys/kernel/random/boot_id")) }
	before := bootID()
	// Karpenter's reboot controller records the Node's boot id first.
	claim.Annotations = map[string]string{karpv1.RebootPreBootIDAnnotationKey: before}
	start := time.Now()
	if err := cp.Reboot(ctx, claim, "op-1"); err != nil {
		t.Fatalf("Reboot: %v (lastPhase %+v)", err, get().Status.LastPhase)
	}
	took := time.Since(start)
	t.Logf("Reboot returned after %s (the reboot phase schedules it and returns)", took.Round(time.Millisecond))
	back := wait("the host back from the reboot", 3*time.Minute, func(h *v1beta1.SSHHost) bool {
		return h.Status.Reboot != nil && h.Status.Reboot.Result == v1beta1.RebootReturned
	})
	t.Logf("host seen back %s after Reboot was called", back.Status.Reboot.ReturnedAt.Sub(start).Round(time.Second))
	after := bootID()
	if after == before || after == "" {
		t.Fatalf("boot id %q → %q: the host did not reboot", before, after)
	}
	if back.Status.State != v1beta1.HostInUse || back.Status.ClaimRef == nil || back.Status.ClaimRef.UID != claim.UID || back.Status.ProviderID == "" {
		t.Fatalf("the host left its claim: state %s claim %+v", back.Status.State, back.Status.ClaimRef)
	}
	if lp := back.Status.LastPhase; lp == nil || lp.Phase != v1beta1.PhaseReboot || lp.Result != v1beta1.PhaseSucceeded {
		t.Fatalf("lastPhase %+v", lp)
	}
	// Replayed: nothing runs, the host does not go down again.
	if err := cp.Reboot(ctx, claim, "op-1"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Second)
	if again := bootID(); again != after {
		t.Fatalf("the same operation rebooted the host again: boot id %s → %s", after, again)
	}
	reasons := rec.reasons()
	if got := fmt.Sprint(reasons); !strings.Contains(got, ReasonRebootIssued) || !strings.Contains(got, host.ReasonRebootReturned) {
		t.Fatalf("events %v", reasons)
	}
}
