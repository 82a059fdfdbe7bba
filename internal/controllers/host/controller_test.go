package host

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/karpenter/pkg/events"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/engine"
	"github.com/dklesev/kpssh/internal/probe"
	"github.com/dklesev/kpssh/internal/providers/hostkey"
	"github.com/dklesev/kpssh/internal/providers/leave"
	"github.com/dklesev/kpssh/internal/providers/phase"
	"github.com/dklesev/kpssh/internal/providers/pool"
	"github.com/dklesev/kpssh/internal/providers/token"
	"github.com/dklesev/kpssh/internal/sshx"
	"k8s.io/client-go/kubernetes/scheme"
)

const ns = v1beta1.DefaultPoolNamespace

var fpA = "SHA256:" + strings.Repeat("A", 43)

type recorder struct {
	mu     sync.Mutex
	events []events.Event
}

func (r *recorder) Publish(evs ...events.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, evs...)
}

func (r *recorder) reasons() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, e := range r.events {
		out = append(out, e.Reason)
	}
	return out
}

type fakeProber struct {
	results []probe.Result
	errs    []error
	calls   int
}

func (p *fakeProber) probe(_ context.Context, _ sshx.Target, _ bool, _ string, _ time.Duration) (probe.Result, error) {
	i := p.calls
	if i >= len(p.results) {
		i = len(p.results) - 1
	}
	p.calls++
	var err error
	if i < len(p.errs) {
		err = p.errs[i]
	}
	return p.results[i], err
}

type fakeLeaver struct {
	err   error
	calls int
	onRun func()
}

func (l *fakeLeaver) Leave(context.Context, *v1beta1.SSHHost, hostkey.Credentials) error {
	l.calls++
	if l.onRun != nil {
		l.onRun()
	}
	return l.err
}

func facts(kubelet bool) probe.Result {
	return probe.Result{Facts: probe.Facts{CPU: 4, MemoryKiB: 8 * 1024 * 1024, Arch: "amd64", KubeletActive: kubelet}, Fingerprint: fpA}
}

func newHost(name string, mut ...func(*v1beta1.SSHHost)) *v1beta1.SSHHost {
	h := &v1beta1.SSHHost{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Generation: 1},
		Spec: v1beta1.SSHHostSpec{Address: "10.0.0.11", Port: 22, User: "root",
			SSHKeySecretRef: v1beta1.LocalObjectReference{Name: "key"},
			Capacity:        corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("8Gi")}},
	}
	for _, m := range mut {
		m(h)
	}
	id := pool.Identity(h) // written by an earlier reconcile
	h.Status.Machine = &id
	return h
}

var testKeyPEM = func() []byte {
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	blk, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		panic(err)
	}
	return pem.EncodeToMemory(blk)
}()

func keySecret(knownHost string) *corev1.Secret {
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "key", Namespace: ns}, Data: map[string][]byte{"privateKey": testKeyPEM}}
	if knownHost != "" {
		s.Data["knownHost"] = []byte(knownHost)
	}
	return s
}

type world struct {
	c       client.Client
	ctrl    *Controller
	clock   *clocktesting.FakeClock
	prober  *fakeProber
	leaver  *fakeLeaver
	rec     *recorder
	patches int
}

// withPoolIndexes adds the cache's SSHHost indexes (pool.Index) to a fake.
func withPoolIndexes(b *fake.ClientBuilder) *fake.ClientBuilder {
	for name, keys := range pool.Indexes {
		b = b.WithIndex(&v1beta1.SSHHost{}, name, keys)
	}
	return b
}

func newWorld(t *testing.T, funcs *interceptor.Funcs, objs ...client.Object) *world {
	t.Helper()
	w := &world{clock: clocktesting.NewFakeClock(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)),
		prober: &fakeProber{results: []probe.Result{facts(false)}}, leaver: &fakeLeaver{}, rec: &recorder{}}
	f := interceptor.Funcs{}
	if funcs != nil {
		f = *funcs
	}
	inner := f.SubResourcePatch
	f.SubResourcePatch = func(ctx context.Context, c client.Client, sub string, o client.Object, p client.Patch, opts ...client.SubResourcePatchOption) error {
		w.patches++
		if inner != nil {
			return inner(ctx, c, sub, o, p, opts...)
		}
		return c.SubResource(sub).Patch(ctx, o, p, opts...)
	}
	w.c = withPoolIndexes(fake.NewClientBuilder().WithScheme(scheme.Scheme).WithStatusSubresource(&v1beta1.SSHHost{})).
		WithObjects(append([]client.Object{keySecret("")}, objs...)...).WithInterceptorFuncs(f).Build()
	w.ctrl = &Controller{Client: w.c, Recorder: w.rec, Clock: w.clock, Keys: hostkey.New(w.c), Leaver: w.leaver,
		Tokens: token.New(w.c), Prober: w.prober.probe, Namespace: ns, Interval: 2 * time.Minute, Timeout: 30 * time.Second}
	return w
}

func (w *world) reconcile(t *testing.T, name string) reconcile.Result {
	t.Helper()
	res, err := w.ctrl.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}})
	if err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	return res
}

// nextProbeLeaves lets a probe interval pass and reconciles h1 with the
// prober answering results and leave succeeding.
func (w *world) nextProbeLeaves(t *testing.T, results ...probe.Result) {
	t.Helper()
	w.prober.calls = 0
	w.prober.results = results
	w.leaver.err = nil
	w.clock.Step(2 * time.Minute)
	w.reconcile(t, "h1")
}

func (w *world) host(t *testing.T, name string) *v1beta1.SSHHost {
	t.Helper()
	h := &v1beta1.SSHHost{}
	if err := w.c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, h); err != nil {
		t.Fatal(err)
	}
	return h
}

func ready(h *v1beta1.SSHHost) (metav1.ConditionStatus, string) {
	c := h.StatusConditions().Get(v1beta1.ConditionReady)
	if c == nil {
		return "", ""
	}
	return c.Status, c.Reason
}

func TestProbeMakesPendingHostAvailableAndPinsKey(t *testing.T) {
	w := newWorld(t, nil, newHost("h1"))
	res := w.reconcile(t, "h1")
	h := w.host(t, "h1")
	if h.Status.State != v1beta1.HostAvailable || h.Status.HostKeyFingerprint != fpA || h.Status.ObservedArch != "amd64" {
		t.Fatalf("status %+v", h.Status)
	}
	if got := h.Status.ObservedCapacity.Cpu().Value(); got != 4 {
		t.Fatalf("observed cpu %d", got)
	}
	if s, r := ready(h); s != metav1.ConditionTrue || r != ReasonProbeSucceeded {
		t.Fatalf("ready %s/%s", s, r)
	}
	if res.RequeueAfter != 2*time.Minute {
		t.Fatalf("requeue %v", res)
	}
}

func TestStalenessGuard(t *testing.T) {
	w := newWorld(t, nil, newHost("h1"))
	w.reconcile(t, "h1")
	patches := w.patches
	w.clock.Step(30 * time.Second)
	res := w.reconcile(t, "h1")
	if w.prober.calls != 1 || res.RequeueAfter != 90*time.Second {
		t.Fatalf("fresh host probed again (calls %d) or wrong requeue %v", w.prober.calls, res.RequeueAfter)
	}
	if w.patches != patches {
		t.Fatal("guarded reconcile wrote status")
	}
	// A spec edit is the escape hatch: probe at once.
	h := w.host(t, "h1")
	h.Generation = 2
	if err := w.c.Update(context.Background(), h); err != nil {
		t.Fatal(err)
	}
	w.reconcile(t, "h1")
	if w.prober.calls != 2 {
		t.Fatalf("spec edit did not probe (calls %d)", w.prober.calls)
	}
	if h := w.host(t, "h1"); h.Status.ObservedGeneration != 2 {
		t.Fatalf("observedGeneration %d", h.Status.ObservedGeneration)
	}
	w.clock.Step(2 * time.Minute)
	w.reconcile(t, "h1")
	if w.prober.calls != 3 {
		t.Fatal("stale host not probed after the interval")
	}
}

func TestUnchangedStatusIsNotWritten(t *testing.T) {
	w := newWorld(t, nil, newHost("h1"))
	w.reconcile(t, "h1")
	first := w.patches
	// Same facts, same time: only lastProbeTime would change, so step no time
	// and force a probe with Pending→ no; use generation-equal stale path.
	w.clock.Step(3 * time.Minute)
	w.reconcile(t, "h1")
	if w.patches != first+1 {
		t.Fatalf("patches %d → %d; a re-probe writes exactly once (new lastProbeTime)", first, w.patches)
	}
}

func TestProbeFailureParksUnhealthy(t *testing.T) {
	w := newWorld(t, nil, newHost("h1"))
	w.prober.errs = []error{errors.New("dial 10.0.0.11:22: connection refused")}
	w.reconcile(t, "h1")
	h := w.host(t, "h1")
	if h.Status.State != v1beta1.HostUnhealthy || !strings.Contains(h.Status.LastProbeError, "connection refused") {
		t.Fatalf("status %+v", h.Status)
	}
	if s, r := ready(h); s != metav1.ConditionFalse || r != ReasonProbeFailed {
		t.Fatalf("ready %s/%s", s, r)
	}
	// Unhealthy → Available on the next good probe.
	w.prober.errs = nil
	w.clock.Step(2 * time.Minute)
	w.reconcile(t, "h1")
	if h := w.host(t, "h1"); h.Status.State != v1beta1.HostAvailable || h.Status.LastProbeError != "" {
		t.Fatalf("status %+v", h.Status)
	}
}

func TestHostKeyMismatchReportsBothFingerprints(t *testing.T) {
	other := "SHA256:" + strings.Repeat("B", 42) + "A"
	w := newWorld(t, nil, newHost("h1", func(h *v1beta1.SSHHost) { h.Status.HostKeyFingerprint = other }))
	var gotTarget sshx.Target
	w.ctrl.Prober = func(_ context.Context, tg sshx.Target, _ bool, _ string, _ time.Duration) (probe.Result, error) {
		gotTarget = tg
		return probe.Result{}, &sshx.HostKeyMismatchError{Expected: other, Got: fpA}
	}
	w.reconcile(t, "h1")
	h := w.host(t, "h1")
	if gotTarget.ExpectedFingerprint != other {
		t.Fatalf("probe not pinned to status fingerprint: %q", gotTarget.ExpectedFingerprint)
	}
	if h.Status.State != v1beta1.HostUnhealthy || !strings.Contains(h.Status.LastProbeError, other) || !strings.Contains(h.Status.LastProbeError, fpA) {
		t.Fatalf("status %+v", h.Status)
	}
	if h.Status.HostKeyFingerprint != other {
		t.Fatal("mismatch overwrote the pin")
	}
}

func TestSecretKnownHostIsAuthoritative(t *testing.T) {
	pinned := "SHA256:" + strings.Repeat("C", 42) + "A"
	w := newWorld(t, nil, newHost("h1", func(h *v1beta1.SSHHost) { h.Status.HostKeyFingerprint = fpA }))
	if err := w.c.Update(context.Background(), keySecret(pinned)); err != nil {
		t.Fatal(err)
	}
	var gotTarget sshx.Target
	w.ctrl.Prober = func(_ context.Context, tg sshx.Target, _ bool, _ string, _ time.Duration) (probe.Result, error) {
		gotTarget = tg
		return probe.Result{Facts: facts(false).Facts, Fingerprint: pinned}, nil
	}
	w.reconcile(t, "h1")
	if gotTarget.ExpectedFingerprint != pinned || w.host(t, "h1").Status.HostKeyFingerprint != pinned {
		t.Fatalf("target %q status %q", gotTarget.ExpectedFingerprint, w.host(t, "h1").Status.HostKeyFingerprint)
	}
}

func TestMissingSecretIsAProbeError(t *testing.T) {
	w := newWorld(t, nil, newHost("h1", func(h *v1beta1.SSHHost) { h.Spec.SSHKeySecretRef.Name = "nope" }))
	w.reconcile(t, "h1")
	h := w.host(t, "h1")
	if h.Status.State != v1beta1.HostUnhealthy || !strings.Contains(h.Status.LastProbeError, "kpssh-system/nope not found") || w.prober.calls != 0 {
		t.Fatalf("status %+v calls %d", h.Status, w.prober.calls)
	}
}

func TestMaintenanceParksAndReturnsPending(t *testing.T) {
	w := newWorld(t, nil, newHost("h1", func(h *v1beta1.SSHHost) {
		h.Annotations = map[string]string{v1beta1.AnnotationMaintenance: ""}
		h.Status.State = v1beta1.HostAvailable
	}))
	w.reconcile(t, "h1")
	h := w.host(t, "h1")
	if h.Status.State != v1beta1.HostMaintenance || w.prober.calls != 0 {
		t.Fatalf("state %s, probes %d", h.Status.State, w.prober.calls)
	}
	if s, r := ready(h); s != metav1.ConditionFalse || r != ReasonMaintenance {
		t.Fatalf("ready %s/%s", s, r)
	}
	w.clock.Step(time.Hour)
	w.reconcile(t, "h1")
	if w.prober.calls != 0 {
		t.Fatal("maintenance host probed")
	}
	h.Annotations = nil
	if err := w.c.Update(context.Background(), h); err != nil {
		t.Fatal(err)
	}
	res := w.reconcile(t, "h1")
	if h := w.host(t, "h1"); h.Status.State != v1beta1.HostPending || !res.Requeue {
		t.Fatalf("state %s res %+v", h.Status.State, res)
	}
	w.reconcile(t, "h1")
	if h := w.host(t, "h1"); h.Status.State != v1beta1.HostAvailable || w.prober.calls != 1 {
		t.Fatalf("after unpark: %s, probes %d", h.Status.State, w.prober.calls)
	}
}

func claimed(state v1beta1.HostState, claim string, uid types.UID) func(*v1beta1.SSHHost) {
	return func(h *v1beta1.SSHHost) {
		h.Status.State = state
		h.Status.ClaimRef = &v1beta1.ClaimRef{Name: claim, UID: uid}
		h.Status.BootstrapTokenID = "abcdef"
		h.Status.ProviderID = "kpssh://kpssh-system/h1"
	}
}

func tokenSecret() *corev1.Secret {
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "bootstrap-token-abcdef", Namespace: "kube-system"}}
}

func TestLiveClaimIsLeftAloneEvenUnderMaintenance(t *testing.T) {
	nc := &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: "nc-1", UID: "uid-1"}}
	w := newWorld(t, nil, nc, tokenSecret(), newHost("h1", claimed(v1beta1.HostInUse, "nc-1", "uid-1"), func(h *v1beta1.SSHHost) {
		h.Annotations = map[string]string{v1beta1.AnnotationMaintenance: "true"}
	}))
	w.reconcile(t, "h1")
	h := w.host(t, "h1")
	if h.Status.State != v1beta1.HostInUse || h.Status.ClaimRef == nil || w.prober.calls != 0 {
		t.Fatalf("claimed host touched: %+v probes %d", h.Status, w.prober.calls)
	}
}

func TestStaleClaimReleased(t *testing.T) {
	for _, tc := range []struct {
		name string
		objs []client.Object
	}{
		{"nodeclaim gone", nil},
		{"same name other uid", []client.Object{&karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: "nc-1", UID: "uid-2"}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, st := range []v1beta1.HostState{v1beta1.HostClaimed, v1beta1.HostInUse} {
				// The claim's install was shown Running when its NodeClaim went.
				running := func(h *v1beta1.SSHHost) {
					h.Status.LastPhase = &v1beta1.LastPhase{Phase: v1beta1.PhaseInstall, Result: v1beta1.PhaseRunning, StartedAt: metav1.Now(), CurrentTask: "fetch kubelet"}
				}
				drifted := func(h *v1beta1.SSHHost) {
					h.SetHostDrift(&v1beta1.HostDriftStatus{ClaimUID: "uid-1", LastResult: v1beta1.DriftDrifted}, "drifted", metav1.Now())
				}
				objs := append([]client.Object{tokenSecret(), newHost("h1", claimed(st, "nc-1", "uid-1"), running, drifted)}, tc.objs...)
				w := newWorld(t, nil, objs...)
				w.reconcile(t, "h1")
				h := w.host(t, "h1")
				if h.Status.State != v1beta1.HostPending || h.Status.ClaimRef != nil || h.Status.BootstrapTokenID != "" || h.Status.ProviderID != "" {
					t.Fatalf("%s: status %+v", st, h.Status)
				}
				if lp := h.Status.LastPhase; lp.Result != v1beta1.PhaseInterrupted || lp.CurrentTask != "" || !strings.Contains(lp.Message, `NodeClaim nc-1 no longer exists`) || !strings.Contains(lp.Message, `"fetch kubelet"`) {
					t.Fatalf("%s: an unfinished phase after the release: %+v", st, lp)
				}
				if h.Status.HostDrift != nil || h.HostDrifted() || strings.Contains(fmt.Sprint(h.Status.Conditions), v1beta1.ConditionHostDrift) {
					t.Fatalf("%s: the claim's drift record survived its release: %+v %+v", st, h.Status.HostDrift, h.Status.Conditions)
				}
				err := w.c.Get(context.Background(), client.ObjectKey{Namespace: "kube-system", Name: "bootstrap-token-abcdef"}, &corev1.Secret{})
				if err == nil {
					t.Fatalf("%s: token secret survived release", st)
				}
			}
		})
	}
}

// A Node with the host's InternalIP but nothing tying it to the host (its
// providerID, kpssh's host label) does not make the kubelet ours.
func TestForeignKubeletParkedUntouched(t *testing.T) {
	w := newWorld(t, nil, newHost("h1"), node("someone-elses", "10.0.0.11"))
	w.prober.results = []probe.Result{facts(true)}
	before := testutil.ToFloat64(zombieActions.WithLabelValues(ActionParkedForeign))
	w.reconcile(t, "h1")
	h := w.host(t, "h1")
	if h.Status.State != v1beta1.HostUnhealthy || w.leaver.calls != 0 || !strings.Contains(h.Status.LastProbeError, "foreign kubelet") {
		t.Fatalf("status %+v leave calls %d", h.Status, w.leaver.calls)
	}
	if got := w.rec.reasons(); len(got) != 1 || got[0] != ReasonForeignKubelet {
		t.Fatalf("events %v", got)
	}
	w.clock.Step(2 * time.Minute)
	w.reconcile(t, "h1")
	if got := testutil.ToFloat64(zombieActions.WithLabelValues(ActionParkedForeign)) - before; got != 1 {
		t.Fatalf("parked_foreign counted %v times for one parking", got)
	}
	if w.leaver.calls != 0 {
		t.Fatal("leave ran on a foreign host")
	}
	if err := w.c.Get(context.Background(), client.ObjectKey{Name: "someone-elses"}, &corev1.Node{}); err != nil {
		t.Fatalf("a Node with the host's InternalIP was deleted: %v", err)
	}
}

// node is a Node with an InternalIP and nothing else: tied to no host.
func node(name, ip string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}}}
}

// ownNode is the Node h1's kubelet registered in Static mode: its
// providerID ties it to the host.
func ownNode(name string) *corev1.Node {
	n := node(name, "10.0.0.11")
	n.Spec.ProviderID = "kpssh://" + ns + "/h1"
	return n
}

func TestZombieOursLeavesThenDeletesNode(t *testing.T) {
	for _, tc := range []struct {
		name   string
		marker string
		node   bool
	}{
		{"node tied, no marker", "", true},
		{"marker, no node", "tls-bootstrap@1", false},
		{"both", "tls-bootstrap@1", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := []client.Object{newHost("h1", func(h *v1beta1.SSHHost) { h.Status.InstalledProfile = tc.marker })}
			if tc.node {
				// other has the host's InternalIP, and nothing else of it.
				objs = append(objs, ownNode("zombie"), node("other", "10.0.0.11"))
			}
			w := newWorld(t, nil, objs...)
			w.prober.results = []probe.Result{facts(true), facts(false)}
			before := testutil.ToFloat64(zombieActions.WithLabelValues(ActionLeft))
			w.leaver.onRun = func() {
				// Leaving is written before leave runs (fences a racing claim),
				// and the Node still exists while the kubelet is being stopped.
				if st := w.host(t, "h1").Status.State; st != v1beta1.HostLeaving {
					t.Errorf("state during leave %s, want Leaving", st)
				}
				if tc.node {
					if err := w.c.Get(context.Background(), client.ObjectKey{Name: "zombie"}, &corev1.Node{}); err != nil {
						t.Errorf("node deleted before leave ran: %v", err)
					}
				}
			}
			w.reconcile(t, "h1")
			h := w.host(t, "h1")
			if h.Status.State != v1beta1.HostAvailable || w.leaver.calls != 1 {
				t.Fatalf("state %s leave calls %d", h.Status.State, w.leaver.calls)
			}
			if err := w.c.Get(context.Background(), client.ObjectKey{Name: "zombie"}, &corev1.Node{}); err == nil {
				t.Fatal("zombie node not deleted")
			}
			if tc.node {
				if err := w.c.Get(context.Background(), client.ObjectKey{Name: "other"}, &corev1.Node{}); err != nil {
					t.Fatal("unrelated node deleted")
				}
			}
			if got := strings.Join(w.rec.reasons(), ","); got != "ZombieKubelet,ZombieLeft" {
				t.Fatalf("events %s", got)
			}
			if got := testutil.ToFloat64(zombieActions.WithLabelValues(ActionLeft)) - before; got != 1 {
				t.Fatalf("left counted %v", got)
			}
		})
	}
}

// A host powered back on: its kubelet is probed active before it has
// registered, and registers while leave runs. The Node is looked up again
// once the kubelet is stopped, so it does not outlive the leave.
func TestZombieNodeRegisteredDuringLeaveIsDeleted(t *testing.T) {
	w := newWorld(t, nil, newHost("h1", func(h *v1beta1.SSHHost) { h.Status.InstalledProfile = "tls-bootstrap@1" }))
	w.prober.results = []probe.Result{facts(true), facts(false)}
	w.leaver.onRun = func() {
		if err := w.c.Create(context.Background(), ownNode("late")); err != nil {
			t.Error(err)
		}
	}
	w.reconcile(t, "h1")
	if h := w.host(t, "h1"); h.Status.State != v1beta1.HostAvailable || w.leaver.calls != 1 {
		t.Fatalf("state %s leave calls %d", h.Status.State, w.leaver.calls)
	}
	if err := w.c.Get(context.Background(), client.ObjectKey{Name: "late"}, &corev1.Node{}); err == nil {
		t.Fatal("the Node registered during leave outlived it")
	}
	if got := strings.Join(w.rec.reasons(), ","); got != "ZombieKubelet,ZombieLeft" {
		t.Fatalf("events %s", got)
	}
}

func TestZombieLeaveFailureKeepsNodeAndRetries(t *testing.T) {
	for _, tc := range []struct {
		name    string
		leave   error
		after   bool // kubelet active after leave
		wantMsg string
	}{
		{"leave exits non-zero", errors.New("leave exited 1: boom"), false, "boom"},
		{"leave exits 0 but kubelet runs", nil, true, "kubelet is still active"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, nil, newHost("h1"), ownNode("zombie"))
			w.prober.results = []probe.Result{facts(true), facts(tc.after)}
			w.leaver.err = tc.leave
			before := testutil.ToFloat64(zombieActions.WithLabelValues(ActionLeaveFailed))
			w.reconcile(t, "h1")
			h := w.host(t, "h1")
			if h.Status.State != v1beta1.HostUnhealthy || !strings.Contains(h.Status.LastProbeError, tc.wantMsg) {
				t.Fatalf("status %+v", h.Status)
			}
			if err := w.c.Get(context.Background(), client.ObjectKey{Name: "zombie"}, &corev1.Node{}); err != nil {
				t.Fatal("node deleted although leave failed")
			}
			if got := strings.Join(w.rec.reasons(), ","); got != "ZombieKubelet,ZombieLeaveFailed" {
				t.Fatalf("events %s", got)
			}
			if got := testutil.ToFloat64(zombieActions.WithLabelValues(ActionLeaveFailed)) - before; got != 1 {
				t.Fatalf("leave_failed counted %v", got)
			}
			if !h.LeaveOwed() {
				t.Fatal("no LeaveFailed condition after a failed zombie leave")
			}
			// Retried on the next probe.
			w.nextProbeLeaves(t, facts(true), facts(false))
			if h := w.host(t, "h1"); h.Status.State != v1beta1.HostAvailable || w.leaver.calls != 2 || h.LeaveOwed() {
				t.Fatalf("retry: state %s calls %d owed %v", h.Status.State, w.leaver.calls, h.LeaveOwed())
			}
		})
	}
}

// A host released with condition LeaveFailed (Delete's leave did not
// succeed, nothing of it may have run) owes a leave: every probe runs leave,
// also when the kubelet looks stopped (a leave that failed half-way) and
// with no marker and no Node (it is ours: Delete said so), and the host
// stays Unhealthy, never Available, until one succeeds.
func TestOwedLeaveRunsUntilItSucceeds(t *testing.T) {
	owes := func(h *v1beta1.SSHHost) {
		h.Status.LastProbeTime = &metav1.Time{Time: time.Date(2026, 11, 29, 11, 0, 0, 0, time.UTC)}
		h.Status.ObservedGeneration = h.Generation
		h.SetState(v1beta1.HostUnhealthy, "leave under NodeClaim a did not succeed", metav1.Now())
		h.SetLeaveFailed("Rejected", "leave under NodeClaim a did not succeed, so the kubelet may still run: fallback leave Rejected (rc 4)", metav1.Now())
	}
	for _, tc := range []struct {
		name    string
		kubelet bool
	}{
		{"kubelet looks stopped", false},
		{"kubelet active, no marker, no Node: ours all the same", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, nil, newHost("h1", owes))
			w.prober.results = []probe.Result{facts(tc.kubelet)}
			w.leaver.err = &leave.Error{Result: leave.Result{Outcome: phase.Outcome{Result: engine.Result{Outcome: engine.Rejected, RC: 4}}}}
			w.reconcile(t, "h1")
			h := w.host(t, "h1")
			c := h.StatusConditions().Get(v1beta1.ConditionLeaveFailed)
			if h.Status.State != v1beta1.HostUnhealthy || w.leaver.calls != 1 || c == nil || !c.IsTrue() || c.Reason != "Rejected" ||
				!strings.Contains(c.Message, "zombie guard") {
				t.Fatalf("after a failed owed leave: state %s, leave calls %d, LeaveFailed %+v", h.Status.State, w.leaver.calls, c)
			}
			if strings.Contains(strings.Join(w.rec.reasons(), ","), ReasonForeignKubelet) {
				t.Fatal("a host owing a leave was parked as a foreign kubelet")
			}
			// A running kubelet is a zombie all the same (a host back from
			// a power cut that failed its leave): it is reported as one.
			if got := slices.Contains(w.rec.reasons(), ReasonZombieKubelet); got != tc.kubelet {
				t.Fatalf("events %v: ZombieKubelet %v, want %v", w.rec.reasons(), got, tc.kubelet)
			}
			// The next probe, kubelet stopped: leave runs again (the owed
			// one), and only its success makes the host Available.
			w.nextProbeLeaves(t, facts(false), facts(false))
			h = w.host(t, "h1")
			if h.Status.State != v1beta1.HostAvailable || w.leaver.calls != 2 || h.LeaveOwed() ||
				h.StatusConditions().Get(v1beta1.ConditionLeaveFailed) != nil {
				t.Fatalf("after the owed leave succeeded: state %s, leave calls %d, conditions %+v", h.Status.State, w.leaver.calls, h.Status.Conditions)
			}
		})
	}
}

func TestCapacityDriftOnlyOnNewShortfall(t *testing.T) {
	w := newWorld(t, nil, newHost("h1", func(h *v1beta1.SSHHost) { h.Spec.Capacity[corev1.ResourceCPU] = resource.MustParse("8") }))
	for i := 0; i < 3; i++ {
		w.reconcile(t, "h1")
		w.clock.Step(2 * time.Minute)
	}
	if got := w.rec.reasons(); len(got) != 1 || got[0] != ReasonCapacityDrift {
		t.Fatalf("events %v, want one CapacityDrift", got)
	}
}

func TestConflictRequeuesWithoutOverwriting(t *testing.T) {
	raced := false
	funcs := &interceptor.Funcs{SubResourcePatch: func(ctx context.Context, cl client.Client, sub string, o client.Object, p client.Patch, opts ...client.SubResourcePatchOption) error {
		if !raced {
			raced = true
			// Another writer (a claim) lands between our read and our write.
			other := &v1beta1.SSHHost{}
			if err := cl.Get(ctx, client.ObjectKeyFromObject(o), other); err != nil {
				return err
			}
			other.Status.State = v1beta1.HostClaimed
			other.Status.ClaimRef = &v1beta1.ClaimRef{Name: "nc-1", UID: "uid-1"}
			if err := cl.Status().Update(ctx, other); err != nil {
				return err
			}
		}
		return cl.SubResource(sub).Patch(ctx, o, p, opts...)
	}}
	w := newWorld(t, funcs, newHost("h1"), &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: "nc-1", UID: "uid-1"}})
	res := w.reconcile(t, "h1")
	h := w.host(t, "h1")
	if !res.Requeue || h.Status.State != v1beta1.HostClaimed || h.Status.ClaimRef == nil {
		t.Fatalf("res %+v status %+v: the probe overwrote a concurrent claim", res, h.Status)
	}
}

func TestHostOutsidePoolNamespaceIgnored(t *testing.T) {
	w := newWorld(t, nil, newHost("h1", func(h *v1beta1.SSHHost) { h.Namespace = "default" }))
	if _, err := w.ctrl.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: "h1"}}); err != nil {
		t.Fatal(err)
	}
	if w.prober.calls != 0 {
		t.Fatal("probed a host outside the pool namespace")
	}
}

func TestPoolCollector(t *testing.T) {
	probed := func(unix int64) *metav1.Time { t := metav1.Unix(unix, 0); return &t }
	w := newWorld(t, nil,
		newHost("a", func(h *v1beta1.SSHHost) {
			h.Status.State = v1beta1.HostAvailable
			h.Status.LastProbeTime = probed(1796461200)
		}),
		newHost("b", func(h *v1beta1.SSHHost) {
			h.Labels = map[string]string{v1beta1.LabelHostClass: "big"}
			h.Status.State = v1beta1.HostInUse
			h.Status.LastProbeTime = probed(1796461321)
		}),
		newHost("c"), // empty state counts as Pending in class default; never probed: no series
		newHost("d", func(h *v1beta1.SSHHost) {
			h.Namespace = "elsewhere"
			h.Status.LastProbeTime = probed(1796461200)
		}),
	)
	col := NewPoolCollector(w.c, ns)
	want := `
# HELP kpssh_host_last_probe_timestamp_seconds Unix time of each host's last probe (status.lastProbeTime), by SSHHost name and host class.
# TYPE kpssh_host_last_probe_timestamp_seconds gauge
kpssh_host_last_probe_timestamp_seconds{class="big",host="b"} 1.796461321e+09
kpssh_host_last_probe_timestamp_seconds{class="default",host="a"} 1.7964612e+09
# HELP kpssh_pool_hosts Hosts in the pool by state and host class.
# TYPE kpssh_pool_hosts gauge
kpssh_pool_hosts{class="big",state="Available"} 0
kpssh_pool_hosts{class="big",state="Claimed"} 0
kpssh_pool_hosts{class="big",state="InUse"} 1
kpssh_pool_hosts{class="big",state="Leaving"} 0
kpssh_pool_hosts{class="big",state="Maintenance"} 0
kpssh_pool_hosts{class="big",state="Pending"} 0
kpssh_pool_hosts{class="big",state="Unhealthy"} 0
kpssh_pool_hosts{class="default",state="Available"} 1
kpssh_pool_hosts{class="default",state="Claimed"} 0
kpssh_pool_hosts{class="default",state="InUse"} 0
kpssh_pool_hosts{class="default",state="Leaving"} 0
kpssh_pool_hosts{class="default",state="Maintenance"} 0
kpssh_pool_hosts{class="default",state="Pending"} 1
kpssh_pool_hosts{class="default",state="Unhealthy"} 0
`
	if err := testutil.CollectAndCompare(col, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
}

// A host probed right after power-on, before systemd reached the kubelet:
// inactive but enabled, it will start by itself. An unclaimed host of ours
// like that is a zombie (leave, then Available), never Available with a
// kubelet about to start; and a leave that stops but does not disable the
// kubelet has not left.
func TestZombieEnabledKubeletNotStartedYet(t *testing.T) {
	enabled := facts(false)
	enabled.Facts.KubeletEnabled = true
	w := newWorld(t, nil, newHost("h1", func(h *v1beta1.SSHHost) { h.Status.InstalledProfile = "tls-bootstrap@1" }))
	w.prober.results = []probe.Result{enabled, facts(false)}
	w.leaver.onRun = func() {
		if st := w.host(t, "h1").Status.State; st != v1beta1.HostLeaving {
			t.Errorf("state during leave %s, want Leaving", st)
		}
	}
	w.reconcile(t, "h1")
	if h := w.host(t, "h1"); h.Status.State != v1beta1.HostAvailable || w.leaver.calls != 1 {
		t.Fatalf("state %s, leave calls %d: want leave, then Available", h.Status.State, w.leaver.calls)
	}

	w = newWorld(t, nil, newHost("h1", func(h *v1beta1.SSHHost) { h.Status.InstalledProfile = "tls-bootstrap@1" }))
	w.prober.results = []probe.Result{facts(true), enabled}
	w.reconcile(t, "h1")
	if h := w.host(t, "h1"); h.Status.State == v1beta1.HostAvailable || !strings.Contains(h.Status.LastProbeError, "still active or enabled") {
		t.Fatalf("a leave that left the kubelet enabled: state %s (%q)", h.Status.State, h.Status.LastProbeError)
	}
}
