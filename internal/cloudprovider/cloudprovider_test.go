package cloudprovider

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/awslabs/operatorpkg/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/scheme"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"
	"sigs.k8s.io/karpenter/pkg/events"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/engine"
	"github.com/dklesev/kpssh/internal/providers/clusterinfo"
	"github.com/dklesev/kpssh/internal/providers/phase"
	"github.com/dklesev/kpssh/internal/providers/pool"
	"github.com/dklesev/kpssh/internal/providers/token"
)

const ns = "kpssh-system"

// --- fakes -------------------------------------------------------------

type call struct {
	Host  string
	Phase engine.Phase
	Ctx   engine.Context
	Prof  string
}

type fakePhases struct {
	mu      sync.Mutex
	calls   []call
	results map[engine.Phase]engine.Result
	// during runs inside a phase (e.g. a concurrent release).
	during func(ph engine.Phase)
	// drift is what Check returns (InSync when unset); checking runs
	// inside it with its context.
	drift    phase.Drift
	checking func(ctx context.Context)
	// fallback is what RunFallbackLeave returns (Succeeded when nil).
	fallback *engine.Result
}

func (f *fakePhases) Run(_ context.Context, h *v1beta1.SSHHost, p *v1beta1.SSHJoinProfile, ph engine.Phase, c engine.Context, _ []string) phase.Outcome {
	f.mu.Lock()
	f.calls = append(f.calls, call{Host: h.Name, Phase: ph, Ctx: c, Prof: p.Name})
	res, ok := f.results[ph]
	f.mu.Unlock()
	if f.during != nil {
		f.during(ph)
	}
	if !ok {
		res = engine.Result{Outcome: engine.Succeeded}
	}
	return phase.Outcome{Result: res, LastPhase: phase.Record(ph, res, time.Now())}
}

// RunFallbackLeave records a leave of phase.FallbackLeaveProfile.
func (f *fakePhases) RunFallbackLeave(_ context.Context, h *v1beta1.SSHHost, c engine.Context) phase.Outcome {
	f.mu.Lock()
	f.calls = append(f.calls, call{Host: h.Name, Phase: engine.PhaseLeave, Ctx: c, Prof: phase.FallbackLeaveProfile})
	res := engine.Result{Outcome: engine.Succeeded}
	if f.fallback != nil {
		res = *f.fallback
	}
	f.mu.Unlock()
	return phase.Outcome{Result: res, LastPhase: phase.Record(engine.PhaseLeave, res, time.Now())}
}

// checkCall is the phase a drift check records in calls.
const checkCall engine.Phase = "drift-check"

func (f *fakePhases) Check(ctx context.Context, h *v1beta1.SSHHost, p *v1beta1.SSHJoinProfile, c engine.Context, _ []string) phase.Drift {
	f.mu.Lock()
	f.calls = append(f.calls, call{Host: h.Name, Phase: checkCall, Ctx: c, Prof: p.Name})
	d := f.drift
	f.mu.Unlock()
	if f.checking != nil {
		f.checking(ctx)
	}
	if d.Result == "" {
		d.Result = v1beta1.DriftInSync
	}
	return d
}

func (f *fakePhases) phases() []engine.Phase {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []engine.Phase
	for _, c := range f.calls {
		out = append(out, c.Phase)
	}
	return out
}

// runs counts the runs of phase ph.
func (w *world) runs(ph engine.Phase) int {
	n := 0
	for _, p := range w.ph.phases() {
		if p == ph {
			n++
		}
	}
	return n
}

type fakeTokens struct {
	mu      sync.Mutex
	n       int
	live    map[string]bool
	deleted []string
	mintErr error
}

func (f *fakeTokens) Mint(_ context.Context, _ string) (token.Token, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.mintErr != nil {
		return token.Token{}, f.mintErr
	}
	f.n++
	id := []string{"aaaaaa", "bbbbbb", "cccccc", "dddddd"}[f.n%4]
	if f.live == nil {
		f.live = map[string]bool{}
	}
	f.live[id] = true
	return token.Token{ID: id, Secret: "0123456789abcdef"}, nil
}

func (f *fakeTokens) Delete(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if id != "" {
		f.deleted = append(f.deleted, id)
		delete(f.live, id)
	}
	return nil
}

func (f *fakeTokens) leaked() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.live)
}

type fakeCluster struct{ err error }

func (f fakeCluster) Get(context.Context, *v1beta1.SSHNodeClass) (clusterinfo.Info, error) {
	return clusterinfo.Info{Endpoint: "https://10.0.0.1:6443", CAB64: "Q0E="}, f.err
}

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

// --- fixtures ----------------------------------------------------------

func newHost(name, class string, mut ...func(*v1beta1.SSHHost)) *v1beta1.SSHHost {
	h := &v1beta1.SSHHost{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{v1beta1.LabelHostClass: class},
			CreationTimestamp: metav1.NewTime(time.Date(2026, 1, 1, 0, 0, len(name), 0, time.UTC))},
		Spec: v1beta1.SSHHostSpec{Address: hostAddress(name), Port: 22, User: "root",
			SSHKeySecretRef: v1beta1.LocalObjectReference{Name: "key"},
			Capacity:        corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("8Gi")}},
		Status: v1beta1.SSHHostStatus{State: v1beta1.HostAvailable, ObservedArch: "amd64", HostKeyFingerprint: "SHA256:x"},
	}
	for _, m := range mut {
		m(h)
	}
	id := pool.Identity(h) // as the host controller writes it
	h.Status.Machine = &id
	return h
}

// fakeAPIServer is a fake client builder with the status subresources and
// the CRD's selectable fields of SSHHost (a missing field selects as "").
func fakeAPIServer() *fake.ClientBuilder {
	field := func(f func(*v1beta1.SSHHost) string) client.IndexerFunc {
		return func(o client.Object) []string { return []string{f(o.(*v1beta1.SSHHost))} }
	}
	machine := func(f func(*v1beta1.MachineIdentity) string) client.IndexerFunc {
		return field(func(h *v1beta1.SSHHost) string {
			if h.Status.Machine == nil {
				return ""
			}
			return f(h.Status.Machine)
		})
	}
	return fake.NewClientBuilder().WithScheme(scheme.Scheme).
		WithStatusSubresource(&v1beta1.SSHHost{}, &v1beta1.SSHNodeClass{}, &karpv1.NodeClaim{}).
		WithIndex(&v1beta1.SSHHost{}, v1beta1.FieldClaimUID, field(func(h *v1beta1.SSHHost) string {
			if r := h.Status.ClaimRef; r != nil {
				return string(r.UID)
			}
			return ""
		})).
		WithIndex(&v1beta1.SSHHost{}, v1beta1.FieldMachineAddress, machine(func(m *v1beta1.MachineIdentity) string { return m.Address })).
		WithIndex(&v1beta1.SSHHost{}, v1beta1.FieldMachineNodeAddress, machine(func(m *v1beta1.MachineIdentity) string { return m.NodeAddress }))
}

// hostAddress gives each fixture host a machine of its own (two hosts of
// one machine are duplicates, and only one is ever claimed): h<N> is at
// 10.0.0.<N> (tests place Nodes there), any other name at 10.1.x.y.
func hostAddress(name string) string {
	if n, err := strconv.Atoi(strings.TrimPrefix(name, "h")); err == nil && name[0] == 'h' && n > 0 && n < 255 {
		return "10.0.0." + strconv.Itoa(n)
	}
	f := fnv.New32a()
	_, _ = f.Write([]byte(name))
	v := f.Sum32()
	return fmt.Sprintf("10.1.%d.%d", v>>8&0xff, v&0xff)
}

func nodeClass(mut ...func(*v1beta1.SSHNodeClass)) *v1beta1.SSHNodeClass {
	nc := &v1beta1.SSHNodeClass{
		ObjectMeta: metav1.ObjectMeta{Name: "pool"},
		Spec: v1beta1.SSHNodeClassSpec{JoinProfileRef: v1beta1.ObjectReference{Name: "prof"},
			Vars: v1beta1.Vars{"k8sMinor": "1.36"}, PricePerCPUHour: "0.02"},
	}
	nc.StatusConditions().SetTrue(v1beta1.ConditionReady)
	for _, m := range mut {
		m(nc)
	}
	return nc
}

func joinProfile() *v1beta1.SSHJoinProfile {
	return &v1beta1.SSHJoinProfile{ObjectMeta: metav1.ObjectMeta{Name: "prof"},
		Spec: v1beta1.SSHJoinProfileSpec{Version: "2", Scripts: &v1beta1.ProfileScripts{Install: "true", Join: "true", Leave: "true"}}}
}

func newNodeClaim(name string, mut ...func(*karpv1.NodeClaim)) *karpv1.NodeClaim {
	nc := &karpv1.NodeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name), Labels: map[string]string{karpv1.NodePoolLabelKey: "default"}},
		Spec: karpv1.NodeClaimSpec{
			NodeClassRef: &karpv1.NodeClassReference{Group: v1beta1.Group, Kind: "SSHNodeClass", Name: "pool"},
			Requirements: []karpv1.NodeSelectorRequirementWithMinValues{{Key: karpv1.CapacityTypeLabelKey, Operator: corev1.NodeSelectorOpIn, Values: []string{"on-demand"}}},
			Resources:    karpv1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}},
			Taints:       []corev1.Taint{{Key: "dedicated", Value: "ssh", Effect: corev1.TaintEffectNoSchedule}},
		},
	}
	for _, m := range mut {
		m(nc)
	}
	return nc
}

type world struct {
	c      client.Client
	cp     *CloudProvider
	ph     *fakePhases
	tok    *fakeTokens
	rec    *recorder
	writes int
}

func newWorld(t *testing.T, funcs *interceptor.Funcs, objs ...client.Object) *world {
	t.Helper()
	w := &world{ph: &fakePhases{results: map[engine.Phase]engine.Result{}}, tok: &fakeTokens{}, rec: &recorder{}}
	f := interceptor.Funcs{}
	if funcs != nil {
		f = *funcs
	}
	inner := f.SubResourcePatch
	f.SubResourcePatch = func(ctx context.Context, c client.Client, sub string, o client.Object, p client.Patch, opts ...client.SubResourcePatchOption) error {
		w.writes++
		if inner != nil {
			return inner(ctx, c, sub, o, p, opts...)
		}
		return c.SubResource(sub).Patch(ctx, o, p, opts...)
	}
	w.c = fakeAPIServer().WithObjects(objs...).WithInterceptorFuncs(f).Build()
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	w.cp = New(w.c, w.c, ns, w.ph, w.tok, w.rec, clk)
	w.cp.Cluster = fakeCluster{}
	return w
}

func (w *world) host(t *testing.T, name string) *v1beta1.SSHHost {
	t.Helper()
	h := &v1beta1.SSHHost{}
	if err := w.c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, h); err != nil {
		t.Fatal(err)
	}
	return h
}

func standard(extra ...client.Object) []client.Object {
	return append([]client.Object{nodeClass(), joinProfile()}, extra...)
}

// --- Create -----------------------------------------------------------

func TestCreateHappyPath(t *testing.T) {
	w := newWorld(t, nil, standard(newHost("h1", "small"))...)
	nc := newNodeClaim("claim-a")
	out, err := w.cp.Create(context.Background(), nc)
	if err != nil {
		t.Fatal(err)
	}
	h := w.host(t, "h1")
	if h.Status.State != v1beta1.HostInUse || h.Status.ClaimRef == nil || h.Status.ClaimRef.UID != nc.UID {
		t.Fatalf("host not InUse under the claim: %+v", h.Status)
	}
	if want := ProviderID(ns, "h1"); out.Status.ProviderID != want || h.Status.ProviderID != want {
		t.Fatalf("providerID %q / host %q, want %q", out.Status.ProviderID, h.Status.ProviderID, want)
	}
	if h.Status.InstalledProfile != "prof@2" {
		t.Fatalf("install marker %q", h.Status.InstalledProfile)
	}
	if h.Status.BootstrapTokenID == "" {
		t.Fatal("token id not recorded (the host controller deletes it once the Node registers)")
	}
	if got := w.ph.phases(); len(got) != 2 || got[0] != engine.PhaseInstall || got[1] != engine.PhaseJoin {
		t.Fatalf("phases %v", got)
	}
	join := w.ph.calls[1].Ctx
	if join.BootstrapToken == "" || !strings.HasPrefix(join.BootstrapToken, h.Status.BootstrapTokenID+".") {
		t.Fatalf("join got token %q, host records %q", join.BootstrapToken, h.Status.BootstrapTokenID)
	}
	if w.ph.calls[0].Ctx.BootstrapToken != "" {
		t.Fatal("install must not get the token")
	}
	if !strings.HasPrefix(join.Taints, "karpenter.sh/unregistered:NoExecute,") || !strings.Contains(join.Taints, "dedicated=ssh:NoSchedule") {
		t.Fatalf("taints %q", join.Taints)
	}
	// The chart's anti-affinity keys on it: on the kubelet's own labels
	// and on the NodeClaim (Karpenter syncs it onto the Node).
	if !strings.Contains(join.NodeLabels, v1beta1.LabelManaged+"=true") || out.Labels[v1beta1.LabelManaged] != "true" {
		t.Fatalf("managed label: kubelet labels %q, NodeClaim labels %v", join.NodeLabels, out.Labels)
	}
	if !strings.Contains(join.NodeLabels, "karpenter.sh/nodepool=default") || !strings.Contains(join.NodeLabels, "node.kubernetes.io/instance-type=small") {
		t.Fatalf("labels %q", join.NodeLabels)
	}
	if join.ProviderID != ProviderID(ns, "h1") || join.NodeName != "h1" || join.Vars["k8sMinor"] != "1.36" || join.ClusterEndpoint == "" {
		t.Fatalf("join context %+v", join)
	}
	for k, v := range map[string]string{
		corev1.LabelInstanceTypeStable: "small", corev1.LabelArchStable: "amd64", corev1.LabelOSStable: "linux",
		corev1.LabelTopologyZone: "pool", karpv1.CapacityTypeLabelKey: "on-demand",
	} {
		if out.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, out.Labels[k], v)
		}
	}
	if out.Annotations[v1beta1.AnnotationNodeClassHash] != NodeClassHash(nodeClass()) || out.Annotations[v1beta1.AnnotationNodeClassHashVersion] != "v1" {
		t.Fatalf("hash annotations %v", out.Annotations)
	}
	if out.Status.Capacity.Cpu().String() != "4" || out.Status.Allocatable.Cpu().MilliValue() != 3920 {
		t.Fatalf("capacity %v allocatable %v", out.Status.Capacity, out.Status.Allocatable)
	}
}

// The token id is on the host before join runs: a crash during join leaves
// it findable (and deletable).
func TestCreateRecordsTokenBeforeJoin(t *testing.T) {
	w := newWorld(t, nil, standard(newHost("h1", "small"))...)
	var seen string
	var marker types.UID
	w.ph.during = func(ph engine.Phase) {
		if ph == engine.PhaseJoin {
			seen, marker = w.host(t, "h1").Status.BootstrapTokenID, w.host(t, "h1").Status.JoinClaimUID
		}
	}
	if _, err := w.cp.Create(context.Background(), newNodeClaim("a")); err != nil {
		t.Fatal(err)
	}
	join := w.ph.calls[len(w.ph.calls)-1].Ctx.BootstrapToken
	if seen == "" || !strings.HasPrefix(join, seen+".") {
		t.Fatalf("host recorded %q when join ran with token %q", seen, join)
	}
	if marker != "uid-a" {
		t.Fatalf("join marker %q when join ran, want the claim's UID", marker)
	}
}

func TestCreateSkipsInstallWhenMarkerCurrent(t *testing.T) {
	w := newWorld(t, nil, standard(newHost("h1", "small", func(h *v1beta1.SSHHost) { h.Status.InstalledProfile = "prof@2" }))...)
	if _, err := w.cp.Create(context.Background(), newNodeClaim("a")); err != nil {
		t.Fatal(err)
	}
	if got := w.ph.phases(); len(got) != 1 || got[0] != engine.PhaseJoin {
		t.Fatalf("phases %v, want join only", got)
	}
	// claim, token id, InUse: three status writes per claim with a warm install.
	if w.writes != 3 {
		t.Fatalf("%d host status writes, want 3", w.writes)
	}
}

func TestCreateVerdicts(t *testing.T) {
	notReady := nodeClass(func(nc *v1beta1.SSHNodeClass) {
		nc.StatusConditions().SetFalse(v1beta1.ConditionReady, v1beta1.ReasonProfileInvalid, "leave uses .Vars")
	})
	for _, tc := range []struct {
		name      string
		objs      []client.Object
		claim     *karpv1.NodeClaim
		results   map[engine.Phase]engine.Result
		cluster   error
		mintErr   error
		wantErr   func(error) bool
		wantState v1beta1.HostState
		wantEvent string
		wantLast  v1beta1.PhaseResult
	}{
		{name: "missing node class", objs: []client.Object{joinProfile(), newHost("h1", "small")},
			wantErr: cloudprovider.IsInsufficientCapacityError, wantState: v1beta1.HostAvailable},
		{name: "node class not ready", objs: []client.Object{notReady, joinProfile(), newHost("h1", "small")},
			wantErr: cloudprovider.IsNodeClassNotReadyError, wantState: v1beta1.HostAvailable},
		{name: "no free host", objs: standard(newHost("h1", "small", func(h *v1beta1.SSHHost) { h.Status.State = v1beta1.HostUnhealthy })),
			wantErr: cloudprovider.IsInsufficientCapacityError, wantState: v1beta1.HostUnhealthy},
		{name: "maintenance host never claimed", objs: standard(newHost("h1", "small", func(h *v1beta1.SSHHost) {
			h.Annotations = map[string]string{v1beta1.AnnotationMaintenance: ""}
		})), wantErr: cloudprovider.IsInsufficientCapacityError, wantState: v1beta1.HostAvailable},
		{name: "requirements exclude every class", objs: standard(newHost("h1", "small")),
			claim: newNodeClaim("c", func(nc *karpv1.NodeClaim) {
				nc.Spec.Requirements = append(nc.Spec.Requirements, karpv1.NodeSelectorRequirementWithMinValues{Key: corev1.LabelArchStable, Operator: corev1.NodeSelectorOpIn, Values: []string{"arm64"}})
			}), wantErr: cloudprovider.IsInsufficientCapacityError, wantState: v1beta1.HostAvailable},
		{name: "requests exceed allocatable", objs: standard(newHost("h1", "small")),
			claim:   newNodeClaim("c", func(nc *karpv1.NodeClaim) { nc.Spec.Resources.Requests[corev1.ResourceCPU] = resource.MustParse("8") }),
			wantErr: cloudprovider.IsInsufficientCapacityError, wantState: v1beta1.HostAvailable},
		{name: "missing profile → config error, Available", objs: []client.Object{nodeClass(), newHost("h1", "small")},
			wantErr: isCreateError, wantState: v1beta1.HostAvailable, wantEvent: ReasonJoinFailed},
		{name: "missing join secret → config error", objs: standard(newHost("h1", "small")),
			claim: nil, wantErr: isCreateError, wantState: v1beta1.HostAvailable, wantEvent: ReasonJoinFailed},
		{name: "cluster info error → config error", objs: standard(newHost("h1", "small")), cluster: errors.New("configmap kube-public/cluster-info not found"),
			wantErr: isCreateError, wantState: v1beta1.HostAvailable, wantEvent: ReasonJoinFailed},
		{name: "install fails on host → Unhealthy", objs: standard(newHost("h1", "small")),
			results: map[engine.Phase]engine.Result{engine.PhaseInstall: {Outcome: engine.Failed, FailedTask: "apt", RC: 100, Message: "E: nope", Touched: true}},
			wantErr: isCreateError, wantState: v1beta1.HostUnhealthy, wantEvent: ReasonJoinFailed, wantLast: v1beta1.PhaseFailed},
		{name: "install config error → Available", objs: standard(newHost("h1", "small")),
			results: map[engine.Phase]engine.Result{engine.PhaseInstall: {Outcome: engine.ConfigError, Message: "role not found"}},
			wantErr: isCreateError, wantState: v1beta1.HostAvailable, wantEvent: ReasonJoinFailed, wantLast: v1beta1.PhaseRejected},
		{name: "Verified host's shim rejects join → Unhealthy, lastPhase Rejected", objs: standard(newHost("h1", "small")),
			results: map[engine.Phase]engine.Result{engine.PhaseJoin: {Outcome: engine.Rejected, FailedTask: "kpssh: join verified script", RC: 2, Touched: true}},
			wantErr: isCreateError, wantState: v1beta1.HostUnhealthy, wantEvent: ReasonJoinFailed, wantLast: v1beta1.PhaseRejected},
		{name: "join times out → Unhealthy", objs: standard(newHost("h1", "small")),
			results: map[engine.Phase]engine.Result{engine.PhaseJoin: {Outcome: engine.TimedOut, FailedTask: "kpssh: join script"}},
			wantErr: isCreateError, wantState: v1beta1.HostUnhealthy, wantEvent: ReasonJoinFailed, wantLast: v1beta1.PhaseTimedOut},
		{name: "token mint fails → Available, CreateFailed", objs: standard(newHost("h1", "small")), mintErr: errors.New("forbidden"),
			wantErr: isCreateError, wantState: v1beta1.HostAvailable, wantEvent: ReasonCreateFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := tc.objs
			if tc.name == "missing join secret → config error" {
				objs = []client.Object{nodeClass(func(nc *v1beta1.SSHNodeClass) {
					nc.Spec.JoinSecretRef = &v1beta1.LocalObjectReference{Name: "absent"}
				}), joinProfile(), newHost("h1", "small")}
			}
			w := newWorld(t, nil, objs...)
			w.cp.Cluster = fakeCluster{err: tc.cluster}
			w.tok.mintErr = tc.mintErr
			for k, v := range tc.results {
				w.ph.results[k] = v
			}
			claim := tc.claim
			if claim == nil {
				claim = newNodeClaim("c")
			}
			_, err := w.cp.Create(context.Background(), claim)
			if err == nil || !tc.wantErr(err) {
				t.Fatalf("err = %v (%T)", err, err)
			}
			h := w.host(t, "h1")
			if h.Status.State != tc.wantState {
				t.Fatalf("host state %s, want %s", h.Status.State, tc.wantState)
			}
			if h.Status.ClaimRef != nil || h.Status.BootstrapTokenID != "" {
				t.Fatalf("host still claimed or carries a token: %+v", h.Status)
			}
			if w.tok.leaked() != 0 {
				t.Fatalf("tokens leaked: %v", w.tok.live)
			}
			if tc.wantEvent != "" && !contains(w.rec.reasons(), tc.wantEvent) {
				t.Fatalf("events %v, want %s", w.rec.reasons(), tc.wantEvent)
			}
			if tc.wantLast != "" && (h.Status.LastPhase == nil || h.Status.LastPhase.Result != tc.wantLast) {
				t.Fatalf("lastPhase %+v, want %s", h.Status.LastPhase, tc.wantLast)
			}
		})
	}
}

func isCreateError(err error) bool {
	var ce *cloudprovider.CreateError
	return errors.As(err, &ce)
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

func TestCreateCheapestClassFirstAndOldestHost(t *testing.T) {
	big := func(h *v1beta1.SSHHost) { h.Spec.Capacity[corev1.ResourceCPU] = resource.MustParse("16") }
	w := newWorld(t, nil, standard(newHost("b1", "big", big), newHost("s2", "small"), newHost("s1", "small"))...)
	out, err := w.cp.Create(context.Background(), newNodeClaim("a"))
	if err != nil {
		t.Fatal(err)
	}
	// small costs 4 × 0.02, big 16 × 0.02; s1 and s2 differ in age by name length → same; then name.
	if out.Labels[corev1.LabelInstanceTypeStable] != "small" {
		t.Fatalf("picked %s", out.Labels[corev1.LabelInstanceTypeStable])
	}
	if h := w.host(t, "s1"); h.Status.ClaimRef == nil {
		t.Fatal("oldest (then first by name) small host not claimed")
	}
}

// A NodeClaim launches as what Karpenter accounted it: into the class's
// reservation when it names it (its slot was reserved), on-demand when it
// allows only that; the kubelet registers with the same labels the
// NodeClaim carries. A reservation of another class is no capacity here.
func TestCreateCapacityType(t *testing.T) {
	req := func(key string, v ...string) karpv1.NodeSelectorRequirementWithMinValues {
		return karpv1.NodeSelectorRequirementWithMinValues{Key: key, Operator: corev1.NodeSelectorOpIn, Values: v}
	}
	for _, tc := range []struct {
		name        string
		reqs        []karpv1.NodeSelectorRequirementWithMinValues
		ct, reserve string // "" ct: InsufficientCapacity
	}{
		{name: "on-demand only", reqs: []karpv1.NodeSelectorRequirementWithMinValues{req(karpv1.CapacityTypeLabelKey, "on-demand")}, ct: "on-demand"},
		{name: "reserved by the scheduler", reqs: []karpv1.NodeSelectorRequirementWithMinValues{req(karpv1.CapacityTypeLabelKey, "reserved"), req(v1beta1.LabelReservationID, "pool_small")},
			ct: "reserved", reserve: "pool_small"},
		{name: "another class's reservation", reqs: []karpv1.NodeSelectorRequirementWithMinValues{req(karpv1.CapacityTypeLabelKey, "reserved"), req(v1beta1.LabelReservationID, "pool_big")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, nil, standard(newHost("h1", "small"))...)
			out, err := w.cp.Create(context.Background(), newNodeClaim("a", func(nc *karpv1.NodeClaim) { nc.Spec.Requirements = tc.reqs }))
			if tc.ct == "" {
				if !cloudprovider.IsInsufficientCapacityError(err) || w.host(t, "h1").Status.ClaimRef != nil {
					t.Fatalf("err %v, host %+v: want InsufficientCapacity, host untouched", err, w.host(t, "h1").Status.ClaimRef)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if out.Labels[karpv1.CapacityTypeLabelKey] != tc.ct || out.Labels[v1beta1.LabelReservationID] != tc.reserve {
				t.Errorf("NodeClaim labels %v, want capacity-type %q reservation-id %q", out.Labels, tc.ct, tc.reserve)
			}
			kubelet := w.ph.calls[len(w.ph.calls)-1].Ctx.NodeLabels
			want := karpv1.CapacityTypeLabelKey + "=" + tc.ct
			if !strings.Contains(kubelet, want) || strings.Contains(kubelet, v1beta1.LabelReservationID) != (tc.reserve != "") {
				t.Errorf("kubelet labels %q, want %s and reservation-id %q", kubelet, want, tc.reserve)
			}
		})
	}
}

func TestCreateClaimConflictMovesOn(t *testing.T) {
	var once sync.Once
	funcs := &interceptor.Funcs{SubResourcePatch: func(ctx context.Context, c client.Client, sub string, o client.Object, p client.Patch, opts ...client.SubResourcePatchOption) error {
		conflict := false
		once.Do(func() { conflict = o.GetName() == "s1" })
		if conflict {
			// Someone else claimed s1 between our read and our write.
			other := &v1beta1.SSHHost{}
			_ = c.Get(ctx, client.ObjectKeyFromObject(o), other)
			other.Status.ClaimRef = &v1beta1.ClaimRef{Name: "rival", UID: "rival"}
			other.Status.State = v1beta1.HostClaimed
			_ = c.Status().Update(ctx, other)
		}
		return c.SubResource(sub).Patch(ctx, o, p, opts...)
	}}
	w := newWorld(t, funcs, standard(newHost("s1", "small"), newHost("s2", "small"))...)
	if _, err := w.cp.Create(context.Background(), newNodeClaim("a")); err != nil {
		t.Fatal(err)
	}
	if h := w.host(t, "s1"); h.Status.ClaimRef.Name != "rival" {
		t.Fatalf("s1 owner %v: the rival's claim was overwritten", h.Status.ClaimRef)
	}
	if h := w.host(t, "s2"); h.Status.ClaimRef == nil || h.Status.ClaimRef.Name != "a" {
		t.Fatalf("loser did not move on to s2: %+v", h.Status.ClaimRef)
	}
}

func TestCreateResumesExistingClaim(t *testing.T) {
	nc := newNodeClaim("a")
	held := newHost("h2", "small", func(h *v1beta1.SSHHost) {
		h.Status.State = v1beta1.HostClaimed
		h.Status.ClaimRef = &v1beta1.ClaimRef{Name: "a", UID: nc.UID}
		h.Status.InstalledProfile = "prof@2"
		h.Status.BootstrapTokenID = "zzzzzz" // a join was interrupted by a crash
	})
	w := newWorld(t, nil, standard(newHost("h1", "small"), held)...)
	if _, err := w.cp.Create(context.Background(), nc); err != nil {
		t.Fatal(err)
	}
	if h := w.host(t, "h1"); h.Status.ClaimRef != nil {
		t.Fatal("a second host was claimed instead of resuming")
	}
	if h := w.host(t, "h2"); h.Status.State != v1beta1.HostInUse {
		t.Fatalf("resumed host state %s", h.Status.State)
	}
	if !contains(w.tok.deleted, "zzzzzz") {
		t.Fatal("the interrupted join's token was not deleted")
	}
	// Launched already: a second Create returns without running anything.
	before := len(w.ph.phases())
	if _, err := w.cp.Create(context.Background(), nc); err != nil {
		t.Fatal(err)
	}
	if len(w.ph.phases()) != before {
		t.Fatal("phases re-ran for a launched claim")
	}
}

// A resumed claim whose join ran (the marker survives the token GC) may run
// a kubelet: a config error now must not release the host Available, where
// the next claim would join a machine whose old kubelet still runs.
func TestCreateResumedAfterJoinNeverReleasesAvailable(t *testing.T) {
	for _, tc := range []struct {
		name   string
		marker types.UID
		want   v1beta1.HostState
	}{
		{name: "join ran under this claim → Unhealthy", marker: "uid-a", want: v1beta1.HostUnhealthy},
		{name: "no join yet → Available", want: v1beta1.HostAvailable},
		{name: "marker of an earlier claim → Available", marker: "uid-earlier", want: v1beta1.HostAvailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nc := newNodeClaim("a")
			held := newHost("h1", "small", func(h *v1beta1.SSHHost) {
				h.Status.State = v1beta1.HostClaimed
				h.Status.ClaimRef = &v1beta1.ClaimRef{Name: "a", UID: nc.UID}
				h.Status.InstalledProfile, h.Status.JoinClaimUID = "prof@2", tc.marker
			})
			w := newWorld(t, nil, nodeClass(), held) // the profile is gone: a config error
			if _, err := w.cp.Create(context.Background(), nc); !isCreateError(err) {
				t.Fatalf("err %v, want a CreateError", err)
			}
			if h := w.host(t, "h1"); h.Status.State != tc.want || h.Status.ClaimRef != nil || h.Status.JoinClaimUID != "" {
				t.Fatalf("host %+v, want released %s", h.Status, tc.want)
			}
			if len(w.ph.calls) != 0 {
				t.Fatalf("phases ran: %v", w.ph.phases())
			}
		})
	}
}

// Issue 17 item 2: a host addressed by DNS name without nodeAddress. The
// name is no --node-ip (KPSSH_NODE_ADDRESS) and no InternalIP; the IP its
// probe learnt is, and a host with neither is refused before anything runs.
func TestCreateDNSAddressedHostNodeAddress(t *testing.T) {
	for _, tc := range []struct {
		name     string
		observed string
		want     string // KPSSH_NODE_ADDRESS; "" = refused
	}{
		{name: "the probe's IP", observed: "10.0.0.9", want: "10.0.0.9"},
		{name: "no IP learnt: config error, nothing runs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, nil, standard(newHost("h1", "small", func(h *v1beta1.SSHHost) {
				h.Spec.Address, h.Status.ObservedNodeAddress = "node-1.pool.example", tc.observed
			}))...)
			_, err := w.cp.Create(context.Background(), newNodeClaim("a"))
			if tc.want == "" {
				h := w.host(t, "h1")
				if !isCreateError(err) || len(w.ph.calls) != 0 || h.Status.State != v1beta1.HostAvailable || h.Status.ClaimRef != nil {
					t.Fatalf("err %v, phases %v, host %s: want a config error, nothing run, the host Available", err, w.ph.phases(), h.Status.State)
				}
				if !strings.Contains(err.Error(), "spec.nodeAddress") || !contains(w.rec.reasons(), ReasonJoinFailed) {
					t.Fatalf("err %v, events %v: want JoinFailed naming spec.nodeAddress", err, w.rec.reasons())
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range w.ph.calls {
				if c.Ctx.NodeAddress != tc.want || c.Ctx.HostAddress != "node-1.pool.example" {
					t.Fatalf("%s ran with node address %q, host address %q", c.Phase, c.Ctx.NodeAddress, c.Ctx.HostAddress)
				}
			}
		})
	}
}

func TestCreateClaimLostDuringJoin(t *testing.T) {
	w := newWorld(t, nil, standard(newHost("h1", "small"))...)
	w.ph.during = func(ph engine.Phase) {
		if ph != engine.PhaseJoin {
			return
		}
		// Stale-claim repair released the host while join ran.
		_, _ = w.cp.Pool.Release(context.Background(), "h1", pool.Claim{Name: "a", UID: "uid-a"}, v1beta1.HostPending, "stale")
	}
	_, err := w.cp.Create(context.Background(), newNodeClaim("a"))
	if err == nil {
		t.Fatal("create succeeded without its claim")
	}
	if h := w.host(t, "h1"); h.Status.State != v1beta1.HostPending || h.Status.ProviderID != "" {
		t.Fatalf("host %+v: the lost claim's writes landed", h.Status)
	}
}

func TestCreateAdopt(t *testing.T) {
	adopt := nodeClass(func(nc *v1beta1.SSHNodeClass) { nc.Spec.ProviderIDSource = v1beta1.ProviderIDAdopt })
	hostLabel := v1beta1.LabelHost + "=" + v1beta1.HostLabelValue(ns, "h1")
	// The join's kubelet registers with the labels it was given; another
	// Node with the same InternalIP (listed first) is not the host's.
	other := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "mi-0"}, Spec: corev1.NodeSpec{ProviderID: "eks-hybrid:///eu/c/mi-0"},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.0.1"}}}}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "mi-1", Labels: map[string]string{v1beta1.LabelHost: v1beta1.HostLabelValue(ns, "h1")}},
		Spec:   corev1.NodeSpec{ProviderID: "eks-hybrid:///eu/c/mi-1"},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.0.1"}}}}
	w := newWorld(t, nil, adopt, joinProfile(), newHost("h1", "small"), other, node)
	// A NodePool's template cannot hand the kubelet another host's identity.
	out, err := w.cp.Create(context.Background(), newNodeClaim("a", func(nc *karpv1.NodeClaim) { nc.Labels[v1beta1.LabelHost] = "kpssh-system.h9" }))
	if err != nil {
		t.Fatal(err)
	}
	if out.Status.ProviderID != "eks-hybrid:///eu/c/mi-1" {
		t.Fatalf("adopted providerID %q", out.Status.ProviderID)
	}
	c := w.ph.calls[0].Ctx
	if c.ProviderID != "" {
		t.Fatal("Adopt mode must pass an empty KPSSH_PROVIDER_ID")
	}
	if labels := strings.Split(c.NodeLabels, ","); !contains(labels, hostLabel) || strings.Contains(c.NodeLabels, "h9") || !sort.StringsAreSorted(labels) {
		t.Fatalf("KPSSH_NODE_LABELS %q: want %s (sorted in), not the NodeClaim's", c.NodeLabels, hostLabel)
	}
}

// Static mode needs no host label: the providerID is the identity.
func TestStaticJoinGetsNoHostLabel(t *testing.T) {
	w := newWorld(t, nil, standard(newHost("h1", "small"))...)
	if _, err := w.cp.Create(context.Background(), newNodeClaim("a")); err != nil {
		t.Fatal(err)
	}
	if c := w.ph.calls[0].Ctx; strings.Contains(c.NodeLabels, v1beta1.LabelHost+"=") || c.ProviderID != ProviderID(ns, "h1") {
		t.Fatalf("Static join context: labels %q providerID %q", c.NodeLabels, c.ProviderID)
	}
}

func TestCreateAdoptTimesOut(t *testing.T) {
	adopt := nodeClass(func(nc *v1beta1.SSHNodeClass) { nc.Spec.ProviderIDSource = v1beta1.ProviderIDAdopt })
	w := newWorld(t, nil, adopt, joinProfile(), newHost("h1", "small"))
	w.cp.AdoptTimeout, w.cp.AdoptPoll = 0, time.Millisecond
	_, err := w.cp.Create(context.Background(), newNodeClaim("a"))
	if err == nil || !isCreateError(err) {
		t.Fatalf("err %v", err)
	}
	h := w.host(t, "h1")
	if h.Status.State != v1beta1.HostUnhealthy || !contains(w.rec.reasons(), ReasonAdoptFailed) || w.tok.leaked() != 0 {
		t.Fatalf("state %s events %v tokens %v", h.Status.State, w.rec.reasons(), w.tok.live)
	}
}

// --- Delete -----------------------------------------------------------

func inUse(claim *karpv1.NodeClaim) func(*v1beta1.SSHHost) {
	return func(h *v1beta1.SSHHost) {
		h.Status.State = v1beta1.HostInUse
		h.Status.ClaimRef = &v1beta1.ClaimRef{Name: claim.Name, UID: claim.UID}
		h.Status.ProviderID = ProviderID(ns, h.Name)
		h.Status.InstalledProfile = "prof@2"
		h.Status.BootstrapTokenID = "eeeeee"
	}
}

// verifiedHost makes a host Verified (what leave runs is the fake's).
func verifiedHost(h *v1beta1.SSHHost) {
	h.Spec.User, h.Spec.ExecMode = "kpssh", v1beta1.ExecModeVerified
	h.Spec.TrustedSigners = []v1beta1.TrustedSigner{"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGbM5QZ0wz0o5r2x0M0n3X0XyY2m0a7Wq7vU1XW0eQ3S ops"}
}

func TestDelete(t *testing.T) {
	claim := newNodeClaim("a")
	for _, tc := range []struct {
		name      string
		host      *v1beta1.SSHHost
		del       *karpv1.NodeClaim
		leave     *engine.Result
		fallback  *engine.Result // the fallback leave's (Succeeded when nil)
		objs      []client.Object
		wantErr   func(error) bool
		wantState v1beta1.HostState
		wantLeave string // profiles whose leave ran, in order; "" = none
		// wantLeaveFailed: the LeaveFailed condition's reason ("" = none)
		wantLeaveFailed string
		wantEvents      []string // the leave's SSHHost events (Leave*)
	}{
		{name: "leave ok → Available", host: newHost("h1", "small", inUse(claim)), del: claim,
			wantState: v1beta1.HostAvailable, wantLeave: "prof"},
		{name: "leave fails → Unhealthy, LeaveFailed, no fallback (it ran)", host: newHost("h1", "small", inUse(claim)), del: claim,
			leave: &engine.Result{Outcome: engine.Failed, FailedTask: "stop"}, wantState: v1beta1.HostUnhealthy, wantLeave: "prof",
			wantLeaveFailed: "Failed", wantEvents: []string{"LeaveFailed"}},
		{name: "leave times out → Unhealthy, LeaveFailed, no fallback", host: newHost("h1", "small", inUse(claim)), del: claim,
			leave: &engine.Result{Outcome: engine.TimedOut}, wantState: v1beta1.HostUnhealthy, wantLeave: "prof",
			wantLeaveFailed: "TimedOut", wantEvents: []string{"LeaveFailed"}},
		// A Verified host's signed leave that can no longer run (expired,
		// unsigned, untrusted: the controller's config error; or the
		// shim's refusal): the fallback leave runs, the host is Available.
		{name: "leave refused by the controller (expired manifest) → fallback → Available", host: newHost("h1", "small", inUse(claim), verifiedHost), del: claim,
			leave:     &engine.Result{Outcome: engine.ConfigError, Message: "execMode Verified: leave: manifest expired at 2026-11-29T00:00:00Z"},
			wantState: v1beta1.HostAvailable, wantLeave: "prof,kpssh-fallback-leave", wantEvents: []string{"LeaveFallback"}},
		{name: "leave refused by the shim (rc 2) → fallback → Available", host: newHost("h1", "small", inUse(claim), verifiedHost), del: claim,
			leave:     &engine.Result{Outcome: engine.Rejected, RC: engine.ShimBadSignature, Touched: true},
			wantState: v1beta1.HostAvailable, wantLeave: "prof,kpssh-fallback-leave", wantEvents: []string{"LeaveFallback"}},
		// Nothing could run (an old shim without the fallback-leave op
		// refuses it): released from the claim, never Available.
		{name: "profile deleted, fallback refused → Unhealthy, LeaveFailed", host: newHost("h1", "small", inUse(claim), verifiedHost), del: claim,
			objs: []client.Object{nodeClass()}, fallback: &engine.Result{Outcome: engine.Rejected, RC: engine.ShimMalformed, Touched: true},
			wantState: v1beta1.HostUnhealthy, wantLeave: "kpssh-fallback-leave", wantLeaveFailed: "Rejected", wantEvents: []string{"LeaveFallback", "LeaveFailed"}},
		{name: "leave refused, fallback fails → Unhealthy, LeaveFailed", host: newHost("h1", "small", inUse(claim), verifiedHost), del: claim,
			leave:     &engine.Result{Outcome: engine.ConfigError, Message: "expired"},
			fallback:  &engine.Result{Outcome: engine.Failed, RC: engine.ShimInternal, Touched: true, Message: "no /etc/kpssh/fallback-leave"},
			wantState: v1beta1.HostUnhealthy, wantLeave: "prof,kpssh-fallback-leave", wantLeaveFailed: "Failed", wantEvents: []string{"LeaveFallback", "LeaveFailed"}},
		{name: "UID mismatch (successor) → NotFound, untouched", host: newHost("h1", "small", inUse(newNodeClaim("a", func(nc *karpv1.NodeClaim) { nc.UID = "successor" }))),
			del: claim, wantErr: cloudprovider.IsNodeClaimNotFoundError, wantState: v1beta1.HostInUse},
		{name: "name mismatch → NotFound", host: newHost("h1", "small", inUse(newNodeClaim("b"))), del: claim,
			wantErr: cloudprovider.IsNodeClaimNotFoundError, wantState: v1beta1.HostInUse},
		{name: "profile deleted → fallback leave", host: newHost("h1", "small", inUse(claim)), del: claim,
			objs: []client.Object{nodeClass()}, wantState: v1beta1.HostAvailable, wantLeave: "kpssh-fallback-leave", wantEvents: []string{"LeaveFallback"}},
		{name: "claimed, never joined → no leave", host: newHost("h1", "small", func(h *v1beta1.SSHHost) {
			h.Status.State = v1beta1.HostClaimed
			h.Status.ClaimRef = &v1beta1.ClaimRef{Name: claim.Name, UID: claim.UID}
		}), del: claim, wantState: v1beta1.HostAvailable},
		{name: "claimed, joined, token collected, InUse never written → leave", host: newHost("h1", "small", func(h *v1beta1.SSHHost) {
			h.Status.State = v1beta1.HostClaimed
			h.Status.ClaimRef = &v1beta1.ClaimRef{Name: claim.Name, UID: claim.UID}
			h.Status.InstalledProfile, h.Status.JoinClaimUID = "prof@2", claim.UID
		}), del: claim, wantState: v1beta1.HostAvailable, wantLeave: "prof"},
		{name: "a join marker of an earlier claim means nothing → no leave", host: newHost("h1", "small", func(h *v1beta1.SSHHost) {
			h.Status.State = v1beta1.HostClaimed
			h.Status.ClaimRef = &v1beta1.ClaimRef{Name: claim.Name, UID: claim.UID}
			h.Status.JoinClaimUID = "uid-of-an-earlier-claim"
		}), del: claim, wantState: v1beta1.HostAvailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := tc.objs
			if objs == nil {
				objs = standard()
			}
			w := newWorld(t, nil, append(objs, tc.host)...)
			if tc.leave != nil {
				w.ph.results[engine.PhaseLeave] = *tc.leave
			}
			w.ph.fallback = tc.fallback
			err := w.cp.Delete(context.Background(), tc.del)
			if tc.wantErr != nil {
				if err == nil || !tc.wantErr(err) {
					t.Fatalf("err %v", err)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			h := w.host(t, "h1")
			if h.Status.State != tc.wantState {
				t.Fatalf("state %s, want %s", h.Status.State, tc.wantState)
			}
			var ran []string
			for _, c := range w.ph.calls {
				if c.Phase == engine.PhaseLeave {
					ran = append(ran, c.Prof)
					if c.Ctx.Vars != nil || c.Ctx.Secrets != nil || c.Ctx.BootstrapToken != "" || c.Ctx.HostAddress == "" {
						t.Fatalf("leave context not empty: %+v", c.Ctx)
					}
				}
			}
			if got := strings.Join(ran, ","); got != tc.wantLeave {
				t.Fatalf("leave ran with %q, want %q", got, tc.wantLeave)
			}
			lf := h.StatusConditions().Get(v1beta1.ConditionLeaveFailed)
			switch {
			case tc.wantLeaveFailed == "" && lf != nil:
				t.Fatalf("LeaveFailed condition %+v on a host that left", lf)
			case tc.wantLeaveFailed != "" && (lf == nil || !lf.IsTrue() || lf.Reason != tc.wantLeaveFailed || !strings.Contains(lf.Message, "NodeClaim "+tc.del.Name)):
				t.Fatalf("LeaveFailed condition %+v, want True reason %s naming the NodeClaim", lf, tc.wantLeaveFailed)
			case tc.wantLeaveFailed != "" && !h.LeaveOwed():
				t.Fatal("LeaveOwed false with the condition set")
			}
			var leaveEvents []string
			for _, r := range w.rec.reasons() {
				if strings.HasPrefix(r, "Leave") {
					leaveEvents = append(leaveEvents, r)
				}
			}
			if strings.Join(leaveEvents, ",") != strings.Join(tc.wantEvents, ",") {
				t.Fatalf("leave events %v, want %v", leaveEvents, tc.wantEvents)
			}
			if tc.wantErr == nil {
				if tc.host.Status.BootstrapTokenID != "" && !contains(w.tok.deleted, tc.host.Status.BootstrapTokenID) {
					t.Fatalf("token %s not deleted on release (deleted %v)", tc.host.Status.BootstrapTokenID, w.tok.deleted)
				}
				if h.Status.ClaimRef != nil || h.Status.BootstrapTokenID != "" || h.Status.ProviderID != "" || h.Status.JoinClaimUID != "" {
					t.Fatalf("not released: %+v", h.Status)
				}
				// The next call (Karpenter keeps calling until NotFound) is NotFound.
				if err := w.cp.Delete(context.Background(), tc.del); !cloudprovider.IsNodeClaimNotFoundError(err) {
					t.Fatalf("second delete: %v", err)
				}
			} else if len(w.tok.deleted) != 0 || len(w.ph.calls) != 0 {
				t.Fatalf("fenced delete had side effects: tokens %v phases %v", w.tok.deleted, w.ph.phases())
			}
		})
	}
}

// The seed's late-Delete-after-reclaim sequence: NodeClaim a is deleted,
// its host released and re-claimed by b; a's Delete arrives again late.
func TestLateDeleteAfterReclaimLeavesSuccessorUntouched(t *testing.T) {
	a, b := newNodeClaim("a"), newNodeClaim("b")
	w := newWorld(t, nil, standard(newHost("h1", "small", inUse(a)))...)
	if err := w.cp.Delete(context.Background(), a); err != nil {
		t.Fatal(err)
	}
	if _, err := w.cp.Create(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	calls := len(w.ph.calls)
	if err := w.cp.Delete(context.Background(), a); !cloudprovider.IsNodeClaimNotFoundError(err) {
		t.Fatalf("late delete: %v", err)
	}
	h := w.host(t, "h1")
	if h.Status.State != v1beta1.HostInUse || h.Status.ClaimRef.Name != "b" || len(w.ph.calls) != calls {
		t.Fatalf("successor disturbed: %+v, calls %d→%d", h.Status, calls, len(w.ph.calls))
	}
}

// --- Get / List / GetInstanceTypes / IsDrifted --------------------------

func TestGetAndList(t *testing.T) {
	a := newNodeClaim("a")
	mid := newHost("h2", "small", func(h *v1beta1.SSHHost) {
		h.Status.State = v1beta1.HostClaimed
		h.Status.ClaimRef = &v1beta1.ClaimRef{Name: "b", UID: "uid-b"}
	})
	w := newWorld(t, nil, standard(newHost("h1", "small", inUse(a)), mid, newHost("h3", "small"))...)
	got, err := w.cp.Get(context.Background(), ProviderID(ns, "h1"))
	if err != nil {
		t.Fatal(err)
	}
	if got.Name != "a" || got.UID != a.UID || got.Labels[corev1.LabelInstanceTypeStable] != "small" {
		t.Fatalf("get %+v", got)
	}
	for _, id := range []string{ProviderID(ns, "h3"), ProviderID(ns, "h2"), "aws:///x", ""} {
		if _, err := w.cp.Get(context.Background(), id); !cloudprovider.IsNodeClaimNotFoundError(err) {
			t.Fatalf("get %q: %v", id, err)
		}
	}
	list, err := w.cp.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].Status.ProviderID != ProviderID(ns, "h1") {
		t.Fatalf("list %+v", list)
	}
}

func TestGetInstanceTypes(t *testing.T) {
	arm := func(h *v1beta1.SSHHost) { h.Status.ObservedArch = "arm64" }
	unprobed := func(h *v1beta1.SSHHost) { h.Status.ObservedArch = ""; h.Status.State = v1beta1.HostPending }
	taken := func(h *v1beta1.SSHHost) {
		h.Status.State = v1beta1.HostInUse
		h.Status.ClaimRef = &v1beta1.ClaimRef{Name: "x", UID: "x"}
	}
	w := newWorld(t, nil, standard(
		newHost("a1", "mixed"), newHost("a2", "mixed", arm), // mixed arch → skipped
		newHost("n1", "new", unprobed), // never probed → not advertised
		newHost("f1", "full", taken),   // exhausted → advertised, unavailable
		newHost("s1", "small"),
	)...)
	pools := map[string]*karpv1.NodePool{
		"ours":  {Spec: karpv1.NodePoolSpec{Template: karpv1.NodeClaimTemplate{Spec: karpv1.NodeClaimTemplateSpec{NodeClassRef: &karpv1.NodeClassReference{Group: v1beta1.Group, Kind: "SSHNodeClass", Name: "pool"}}}}},
		"other": {Spec: karpv1.NodePoolSpec{Template: karpv1.NodeClaimTemplate{Spec: karpv1.NodeClaimTemplateSpec{NodeClassRef: &karpv1.NodeClassReference{Group: "karpenter.k8s.aws", Kind: "EC2NodeClass", Name: "pool"}}}}},
		"gone":  {Spec: karpv1.NodePoolSpec{Template: karpv1.NodeClaimTemplate{Spec: karpv1.NodeClaimTemplateSpec{NodeClassRef: &karpv1.NodeClassReference{Group: v1beta1.Group, Kind: "SSHNodeClass", Name: "missing"}}}}},
	}
	its, err := w.cp.GetInstanceTypes(context.Background(), pools["ours"])
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, it := range its {
		got[it.Name] = len(it.Offerings.Launchable()) > 0
	}
	if len(got) != 2 || got["small"] != true || got["full"] != false {
		t.Fatalf("instance types launchable %v (want small launchable, full not; mixed and new absent)", got)
	}
	for _, name := range []string{"other", "gone"} {
		if its, err := w.cp.GetInstanceTypes(context.Background(), pools[name]); err != nil || len(its) != 0 {
			t.Fatalf("%s: %v %v", name, its, err)
		}
	}
	// On-demand only to a NodePool that cannot use the reservation.
	onDemand := pools["ours"].DeepCopy()
	onDemand.Spec.Template.Spec.Requirements = []karpv1.NodeSelectorRequirementWithMinValues{{Key: karpv1.CapacityTypeLabelKey, Operator: corev1.NodeSelectorOpIn, Values: []string{"on-demand"}}}
	for np, want := range map[*karpv1.NodePool]bool{pools["ours"]: false, onDemand: true} {
		its, err := w.cp.GetInstanceTypes(context.Background(), np)
		if err != nil {
			t.Fatal(err)
		}
		for _, it := range its {
			for _, o := range it.Offerings {
				if it.Name == "small" && o.CapacityType() == karpv1.CapacityTypeOnDemand && o.Available != want {
					t.Errorf("NodePool requirements %v: small on-demand available %v, want %v", np.Spec.Template.Spec.Requirements, o.Available, want)
				}
			}
		}
	}
}

func TestIsDrifted(t *testing.T) {
	a := newNodeClaim("a", func(nc *karpv1.NodeClaim) { nc.Status.ProviderID = ProviderID(ns, "h1") })
	stamp := func(nc *karpv1.NodeClaim, hash string) *karpv1.NodeClaim {
		nc = nc.DeepCopy()
		nc.Annotations = map[string]string{v1beta1.AnnotationNodeClassHash: hash, v1beta1.AnnotationNodeClassHashVersion: NodeClassHashVersion}
		return nc
	}
	cur := NodeClassHash(nodeClass())
	for _, tc := range []struct {
		name   string
		marker string
		claim  *karpv1.NodeClaim
		want   cloudprovider.DriftReason
	}{
		{"current", "prof@2", stamp(a, cur), ""},
		{"profile bumped", "prof@1", stamp(a, cur), ProfileDrift},
		{"node class changed", "prof@2", stamp(a, "123"), NodeClassDrift},
		{"unstamped abstains", "prof@2", a, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHost("h1", "small", inUse(a), func(h *v1beta1.SSHHost) { h.Status.InstalledProfile = tc.marker })
			w := newWorld(t, nil, standard(h)...)
			got, err := w.cp.IsDrifted(context.Background(), tc.claim)
			if err != nil || got != tc.want {
				t.Fatalf("drift %q err %v, want %q", got, err, tc.want)
			}
		})
	}
}

func TestNameAndNodeClasses(t *testing.T) {
	w := newWorld(t, nil)
	if w.cp.Name() != "ssh" || len(w.cp.GetSupportedNodeClasses()) != 1 {
		t.Fatal("name / node classes")
	}
	var _ status.Object = w.cp.GetSupportedNodeClasses()[0]
}

func TestNodeLabelsDropKubeletForbidden(t *testing.T) {
	nc := newNodeClaim("a", func(nc *karpv1.NodeClaim) {
		nc.Labels["node-restriction.kubernetes.io/x"] = "1"
		nc.Labels["kubernetes.io/custom"] = "1"
		nc.Labels["node.kubernetes.io/role"] = "ssh"
		nc.Labels["example.com/team"] = "a"
	})
	w := newWorld(t, nil, standard(newHost("h1", "small"))...)
	its, _, err := w.cp.instanceTypes(context.Background(), nodeClass())
	if err != nil {
		t.Fatal(err)
	}
	got := NodeLabels(nc, its[0], "small")
	for _, bad := range []string{"node-restriction.kubernetes.io/x", "kubernetes.io/custom"} {
		if strings.Contains(got, bad) {
			t.Errorf("%s passed to kubelet: %s", bad, got)
		}
	}
	for _, good := range []string{"node.kubernetes.io/role=ssh", "example.com/team=a", "kubernetes.io/arch=amd64", "karpenter.sh/nodepool=default"} {
		if !strings.Contains(got, good) {
			t.Errorf("%s missing: %s", good, got)
		}
	}
}

// A Node that registered after Karpenter looked for the claim's Nodes (the
// claim deleted before Karpenter saw it register) is deleted once leave
// stopped its kubelet; one Karpenter is terminating is left to it, and none
// is touched when leave failed (the kubelet may still run: the zombie guard
// follows up).
func TestDeleteRemovesTheNodeLeftByTheClaim(t *testing.T) {
	claim := newNodeClaim("a")
	node := func(opts ...func(*corev1.Node)) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "h1"}, Spec: corev1.NodeSpec{ProviderID: ProviderID(ns, "h1")}}
		for _, o := range opts {
			o(n)
		}
		return n
	}
	terminating := func(n *corev1.Node) {
		n.Finalizers = []string{karpv1.TerminationFinalizer}
		n.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	}
	for _, tc := range []struct {
		name     string
		node     *corev1.Node
		leave    *engine.Result
		wantNode bool
	}{
		{name: "registered late → deleted", node: node()},
		{name: "terminating → Karpenter's", node: node(terminating), wantNode: true},
		{name: "leave failed → kept", node: node(), leave: &engine.Result{Outcome: engine.Failed, FailedTask: "stop"}, wantNode: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, nil, standard(newHost("h1", "small", inUse(claim)), tc.node)...)
			if tc.leave != nil {
				w.ph.results[engine.PhaseLeave] = *tc.leave
			}
			if err := w.cp.Delete(context.Background(), claim); err != nil {
				t.Fatal(err)
			}
			err := w.c.Get(context.Background(), client.ObjectKey{Name: "h1"}, &corev1.Node{})
			if got := err == nil; got != tc.wantNode {
				t.Fatalf("Node there after Delete: %v (%v), want %v", got, err, tc.wantNode)
			}
		})
	}
}
