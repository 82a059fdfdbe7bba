package host

import (
	"context"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/dklesev/kpssh/apis/v1beta1"
)

var (
	claimedAt = time.Date(2026, 11, 29, 11, 0, 0, 0, time.UTC)
	beforeIt  = metav1.NewTime(claimedAt.Add(-time.Hour))
	afterIt   = metav1.NewTime(claimedAt.Add(2 * time.Minute))
)

func liveClaim(name string, uid types.UID) *karpv1.NodeClaim {
	return &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, UID: uid, CreationTimestamp: metav1.NewTime(claimedAt)}}
}

func tokenSecretFor(id string) *corev1.Secret {
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "bootstrap-token-" + id, Namespace: "kube-system"}, Type: "bootstrap.kubernetes.io/token"}
}

func mkNode(name string, mut ...func(*corev1.Node)) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: afterIt}}
	for _, m := range mut {
		m(n)
	}
	return n
}

func withProviderID(id string) func(*corev1.Node) {
	return func(n *corev1.Node) { n.Spec.ProviderID = id }
}

// withHostLabel is the label kpssh gives an Adopt join of host.
func withHostLabel(host string) func(*corev1.Node) {
	return func(n *corev1.Node) {
		n.Labels = map[string]string{v1beta1.LabelHost: v1beta1.HostLabelValue(ns, host)}
	}
}

func withAddr(typ corev1.NodeAddressType, ip string) func(*corev1.Node) {
	return func(n *corev1.Node) {
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: typ, Address: ip})
	}
}

// joining is a host mid-join in Static mode: token recorded, providerID not
// yet (the join records it when it succeeds).
func joining(h *v1beta1.SSHHost) {
	claimed(v1beta1.HostClaimed, "nc-1", "uid-1")(h)
	h.Status.ProviderID = ""
}

func secretExists(t *testing.T, c client.Client, id string) bool {
	t.Helper()
	err := c.Get(context.Background(), client.ObjectKey{Namespace: "kube-system", Name: "bootstrap-token-" + id}, &corev1.Secret{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	return err == nil
}

// countSecretDeletes counts Delete calls on Secrets.
func countSecretDeletes(n *int) *interceptor.Funcs {
	return &interceptor.Funcs{Delete: func(ctx context.Context, c client.WithWatch, o client.Object, opts ...client.DeleteOption) error {
		if _, ok := o.(*corev1.Secret); ok {
			*n++
		}
		return c.Delete(ctx, o, opts...)
	}}
}

func TestTokenGC(t *testing.T) {
	for _, tc := range []struct {
		name    string
		host    func(*v1beta1.SSHHost)
		objs    []client.Object
		collect bool // Secret deleted and id cleared
	}{
		{"no token: nothing to do", func(h *v1beta1.SSHHost) {
			claimed(v1beta1.HostInUse, "nc-1", "uid-1")(h)
			h.Status.BootstrapTokenID = ""
		}, []client.Object{mkNode("h1", withProviderID("kpssh://kpssh-system/h1"))}, false},
		{"token, no node yet", joining, nil, false},
		{"node by recorded providerID", claimed(v1beta1.HostInUse, "nc-1", "uid-1"),
			[]client.Object{mkNode("h1", withProviderID("kpssh://kpssh-system/h1"), withAddr(corev1.NodeInternalIP, "10.9.9.9"))}, true},
		{"node by Static providerID before the join recorded it", joining,
			[]client.Object{mkNode("h1", withProviderID("kpssh://kpssh-system/h1"))}, true},
		{"Adopt: node by host label and InternalIP equal to nodeAddress", func(h *v1beta1.SSHHost) {
			joining(h)
			h.Spec.NodeAddress = "192.168.50.7"
		}, []client.Object{mkNode("mi-0123", withProviderID("eks-hybrid:///us-west-2/c1/mi-0123"), withHostLabel("h1"), withAddr(corev1.NodeInternalIP, "192.168.50.7"))}, true},
		{"node by host label and InternalIP equal to address (no nodeAddress)", joining,
			[]client.Object{mkNode("h1", withHostLabel("h1"), withAddr(corev1.NodeExternalIP, "203.0.113.1"), withAddr(corev1.NodeInternalIP, "10.0.0.11"))}, true},
		{"IPv6 spelled differently", func(h *v1beta1.SSHHost) {
			joining(h)
			h.Spec.NodeAddress = "2001:db8::7"
		}, []client.Object{mkNode("h1", withHostLabel("h1"), withAddr(corev1.NodeInternalIP, "2001:DB8:0:0::7"))}, true},
		{"only an ExternalIP matches", joining,
			[]client.Object{mkNode("h1", withHostLabel("h1"), withAddr(corev1.NodeExternalIP, "10.0.0.11"), withAddr(corev1.NodeInternalIP, "10.9.9.9"))}, false},
		{"InternalIP alone (no providerID of the host, no host label) ties nothing", func(h *v1beta1.SSHHost) {
			joining(h)
			h.Spec.NodeAddress = "192.168.50.7"
		}, []client.Object{mkNode("mi-0123", withProviderID("eks-hybrid:///us-west-2/c1/mi-0123"), withAddr(corev1.NodeInternalIP, "192.168.50.7"))}, false},
		{"another host's label with the same IP", joining,
			[]client.Object{mkNode("mi-0123", withHostLabel("h2"), withAddr(corev1.NodeInternalIP, "10.0.0.11"))}, false},
		{"host label on a Node older than the claim", joining,
			[]client.Object{mkNode("mi-0123", withHostLabel("h1"), withAddr(corev1.NodeInternalIP, "10.0.0.11"), func(n *corev1.Node) {
				n.CreationTimestamp = beforeIt
				n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: afterIt}}
			})}, false},
		{"another kpssh host's node with the same IP", joining,
			[]client.Object{mkNode("h2", withProviderID("kpssh://kpssh-system/h2"), withAddr(corev1.NodeInternalIP, "10.0.0.11"))}, false},
		{"another adopted identity than the recorded one", func(h *v1beta1.SSHHost) {
			claimed(v1beta1.HostInUse, "nc-1", "uid-1")(h)
			h.Status.ProviderID = "eks-hybrid:///us-west-2/c1/mi-0001"
		}, []client.Object{mkNode("mi-0002", withProviderID("eks-hybrid:///us-west-2/c1/mi-0002"), withAddr(corev1.NodeInternalIP, "10.0.0.11"))}, false},
		{"node being deleted (an earlier life of the host)", joining,
			[]client.Object{mkNode("h1", withProviderID("kpssh://kpssh-system/h1"), func(n *corev1.Node) {
				n.DeletionTimestamp = &afterIt
				n.Finalizers = []string{"karpenter.sh/termination"}
			})}, false},
		{"node older than the claim, silent since", joining,
			[]client.Object{mkNode("h1", withProviderID("kpssh://kpssh-system/h1"), func(n *corev1.Node) {
				n.CreationTimestamp = beforeIt
				n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionUnknown, LastHeartbeatTime: beforeIt}}
			})}, false},
		{"node older than the claim, re-used by the new kubelet", joining,
			[]client.Object{mkNode("h1", withProviderID("kpssh://kpssh-system/h1"), func(n *corev1.Node) {
				n.CreationTimestamp = beforeIt
				n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: afterIt}}
			})}, true},
		{"NodeClaim of another UID: released by stale-claim repair, token with it", func(h *v1beta1.SSHHost) {
			joining(h)
			h.Status.ClaimRef.UID = "uid-old"
		}, []client.Object{mkNode("h1", withProviderID("kpssh://kpssh-system/h1"))}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			deletes := 0
			objs := append([]client.Object{liveClaim("nc-1", "uid-1"), tokenSecretFor("abcdef"), newHost("h1", tc.host)}, tc.objs...)
			w := newWorld(t, countSecretDeletes(&deletes), objs...)
			before := w.host(t, "h1")
			w.reconcile(t, "h1")
			h := w.host(t, "h1")
			if gone := !secretExists(t, w.c, "abcdef"); gone != tc.collect {
				t.Fatalf("token Secret gone=%v, want %v", gone, tc.collect)
			}
			if cleared := before.Status.BootstrapTokenID != "" && h.Status.BootstrapTokenID == ""; cleared != tc.collect {
				t.Fatalf("token id %q → %q, want collected=%v", before.Status.BootstrapTokenID, h.Status.BootstrapTokenID, tc.collect)
			}
			if !tc.collect && deletes != 0 {
				t.Fatalf("%d Secret deletes for a token that must stay", deletes)
			}
			if h.Status.ClaimRef != nil && !equalRef(h.Status.ClaimRef, before.Status.ClaimRef) {
				t.Fatalf("claim changed: %+v", h.Status.ClaimRef)
			}
		})
	}
}

func equalRef(a, b *v1beta1.ClaimRef) bool { return a != nil && b != nil && *a == *b }

// Collection leaves the rest of the host alone: claim, state, providerID.
func TestTokenGCTouchesOnlyTheTokenID(t *testing.T) {
	w := newWorld(t, nil, liveClaim("nc-1", "uid-1"), tokenSecretFor("abcdef"),
		newHost("h1", claimed(v1beta1.HostInUse, "nc-1", "uid-1")), mkNode("h1", withProviderID("kpssh://kpssh-system/h1")))
	before := w.host(t, "h1")
	w.reconcile(t, "h1")
	h := w.host(t, "h1")
	want := before.Status.DeepCopy()
	want.BootstrapTokenID = ""
	if h.Status.State != want.State || !equalRef(h.Status.ClaimRef, want.ClaimRef) || h.Status.ProviderID != want.ProviderID || h.Status.BootstrapTokenID != "" {
		t.Fatalf("status %+v, want %+v", h.Status, want)
	}
	if w.prober.calls != 0 {
		t.Fatal("a claimed host was probed")
	}
}

func TestTokenGCSecretAlreadyGone(t *testing.T) {
	// A crash between the delete and the clear: the id is still recorded,
	// the Secret is not. NotFound is success; the id is cleared.
	w := newWorld(t, nil, liveClaim("nc-1", "uid-1"), newHost("h1", joining), mkNode("h1", withProviderID("kpssh://kpssh-system/h1")))
	w.reconcile(t, "h1")
	if id := w.host(t, "h1").Status.BootstrapTokenID; id != "" {
		t.Fatalf("id %q kept", id)
	}
}

// The Secret goes first, the id second; a failed write in between leaves
// the id for the next reconcile, which re-deletes and then clears it.
func TestTokenGCDeletesBeforeForgetting(t *testing.T) {
	var ops []string
	failPatch := true
	funcs := &interceptor.Funcs{
		Delete: func(ctx context.Context, c client.WithWatch, o client.Object, opts ...client.DeleteOption) error {
			ops = append(ops, "delete "+o.GetName())
			return c.Delete(ctx, o, opts...)
		},
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, o client.Object, p client.Patch, opts ...client.SubResourcePatchOption) error {
			ops = append(ops, "patch "+o.GetName())
			if failPatch {
				failPatch = false
				return apierrors.NewServiceUnavailable("apiserver went away")
			}
			return c.SubResource(sub).Patch(ctx, o, p, opts...)
		},
	}
	w := newWorld(t, funcs, liveClaim("nc-1", "uid-1"), tokenSecretFor("abcdef"), newHost("h1", joining), mkNode("h1", withProviderID("kpssh://kpssh-system/h1")))
	if _, err := w.ctrl.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: "h1"}}); err == nil {
		t.Fatal("failed status write not reported")
	}
	if secretExists(t, w.c, "abcdef") || w.host(t, "h1").Status.BootstrapTokenID != "abcdef" {
		t.Fatal("after a failed clear: want the Secret gone and the id still recorded")
	}
	w.reconcile(t, "h1")
	if id := w.host(t, "h1").Status.BootstrapTokenID; id != "" {
		t.Fatalf("id %q kept after the retry", id)
	}
	want := []string{"delete bootstrap-token-abcdef", "patch h1", "delete bootstrap-token-abcdef", "patch h1"}
	if len(ops) != len(want) {
		t.Fatalf("ops %q, want %q", ops, want)
	}
	for i := range want {
		if ops[i] != want[i] {
			t.Fatalf("ops %q, want %q", ops, want)
		}
	}
}

// The host is released and re-claimed (new NodeClaim, new token) between
// the GC's read and its write: the write is a 409, the successor's id and
// Secret stay, and the reconcile starts over.
func TestTokenGCClaimChangedBeforeTheWrite(t *testing.T) {
	raced := false
	funcs := &interceptor.Funcs{Delete: func(ctx context.Context, c client.WithWatch, o client.Object, opts ...client.DeleteOption) error {
		if err := c.Delete(ctx, o, opts...); err != nil {
			return err
		}
		if raced {
			return nil
		}
		raced = true
		h := &v1beta1.SSHHost{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "h1"}, h); err != nil {
			return err
		}
		h.Status.ClaimRef = &v1beta1.ClaimRef{Name: "nc-2", UID: "uid-2"}
		h.Status.BootstrapTokenID = "ghijkl"
		return c.Status().Update(ctx, h)
	}}
	nc2 := liveClaim("nc-2", "uid-2")
	nc2.CreationTimestamp = metav1.NewTime(afterIt.Add(time.Minute)) // after the Node: not its registration
	w := newWorld(t, funcs, liveClaim("nc-1", "uid-1"), nc2, tokenSecretFor("abcdef"), tokenSecretFor("ghijkl"),
		newHost("h1", joining), mkNode("h1", withProviderID("kpssh://kpssh-system/h1")))
	res := w.reconcile(t, "h1")
	if !res.Requeue {
		t.Fatalf("res %+v: a lost race must start over", res)
	}
	h := w.host(t, "h1")
	if h.Status.BootstrapTokenID != "ghijkl" || h.Status.ClaimRef.Name != "nc-2" {
		t.Fatalf("successor's claim/token overwritten: %+v", h.Status)
	}
	if secretExists(t, w.c, "abcdef") || !secretExists(t, w.c, "ghijkl") {
		t.Fatal("want the old token gone and the successor's kept")
	}
	// Starting over: the Node predates nc-2, so the successor's token stays.
	w.reconcile(t, "h1")
	if h := w.host(t, "h1"); h.Status.BootstrapTokenID != "ghijkl" || !secretExists(t, w.c, "ghijkl") {
		t.Fatal("successor's token collected on the strength of its predecessor's Node")
	}
}

func TestTokenGCOrphanedID(t *testing.T) {
	// An unclaimed host never legitimately holds a token id.
	w := newWorld(t, nil, tokenSecretFor("abcdef"), newHost("h1", func(h *v1beta1.SSHHost) { h.Status.BootstrapTokenID = "abcdef" }))
	w.reconcile(t, "h1")
	h := w.host(t, "h1")
	if h.Status.BootstrapTokenID != "" || secretExists(t, w.c, "abcdef") {
		t.Fatalf("orphaned token kept: id %q", h.Status.BootstrapTokenID)
	}
	if h.Status.State != v1beta1.HostAvailable {
		t.Fatalf("the rest of the reconcile did not run: %s", h.Status.State)
	}
}

func TestMalformedTokenIDNeverWedgesAHost(t *testing.T) {
	for _, tc := range []struct {
		name string
		host func(*v1beta1.SSHHost)
		objs []client.Object
	}{
		{"token GC", joining, []client.Object{liveClaim("nc-1", "uid-1"), mkNode("h1", withProviderID("kpssh://kpssh-system/h1"))}},
		{"stale-claim release", joining, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			deletes := 0
			w := newWorld(t, countSecretDeletes(&deletes), append(tc.objs, newHost("h1", tc.host, func(h *v1beta1.SSHHost) {
				h.Status.BootstrapTokenID = "abcdef.0123456789abcdef"
			}))...)
			w.reconcile(t, "h1")
			if id := w.host(t, "h1").Status.BootstrapTokenID; id != "" || deletes != 0 {
				t.Fatalf("id %q, %d deletes", id, deletes)
			}
		})
	}
}

// Stale claims (NodeClaim gone) are released with their token deleted,
// whether or not a Node registered: the GC step must not get in the way.
func TestStaleClaimStillDeletesTheToken(t *testing.T) {
	for _, objs := range [][]client.Object{nil, {mkNode("h1", withProviderID("kpssh://kpssh-system/h1"))}} {
		w := newWorld(t, nil, append(objs, tokenSecretFor("abcdef"), newHost("h1", joining))...)
		w.reconcile(t, "h1")
		h := w.host(t, "h1")
		if h.Status.ClaimRef != nil || h.Status.BootstrapTokenID != "" || secretExists(t, w.c, "abcdef") {
			t.Fatalf("stale claim: status %+v, secret kept=%v", h.Status, secretExists(t, w.c, "abcdef"))
		}
	}
}

func TestHostsOfNode(t *testing.T) {
	withToken := func(h *v1beta1.SSHHost) { h.Status.BootstrapTokenID = "abcdef" }
	w := newWorld(t, nil,
		newHost("a", withToken), // 10.0.0.11
		newHost("b", withToken, func(h *v1beta1.SSHHost) { h.Spec.Address = "10.0.0.12" }),
		newHost("c"), // 10.0.0.11, no token
		newHost("d", withToken, func(h *v1beta1.SSHHost) { h.Namespace = "elsewhere" }),
	)
	for _, tc := range []struct {
		name string
		node *corev1.Node
		want []string
	}{
		{"by host label and InternalIP", mkNode("n", withHostLabel("a"), withAddr(corev1.NodeInternalIP, "10.0.0.11")), []string{"a"}},
		{"by InternalIP alone: nobody", mkNode("n", withAddr(corev1.NodeInternalIP, "10.0.0.11")), nil},
		{"by Static providerID", mkNode("n", withProviderID("kpssh://kpssh-system/b")), []string{"b"}},
		{"another pool's host", mkNode("n", withProviderID("kpssh://elsewhere/d")), nil},
		{"unrelated", mkNode("n", withAddr(corev1.NodeInternalIP, "10.0.0.99")), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, r := range w.ctrl.hostsOfNode(context.Background(), tc.node) {
				if r.Namespace != ns {
					t.Fatalf("request outside the pool: %v", r)
				}
				got = append(got, r.Name)
			}
			if len(got) != len(tc.want) || (len(got) > 0 && got[0] != tc.want[0]) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// TestHostsOfClaim: a NodeClaim event wakes the pool's host holding that
// claim (by the cache's claim index), no other.
func TestHostsOfClaim(t *testing.T) {
	claimedBy := func(name string) func(*v1beta1.SSHHost) {
		return func(h *v1beta1.SSHHost) {
			h.Status.ClaimRef = &v1beta1.ClaimRef{Name: name, UID: "u-" + types.UID(name)}
		}
	}
	w := newWorld(t, nil,
		newHost("a", claimedBy("x")),
		newHost("b", claimedBy("y")),
		newHost("c"),
		newHost("d", claimedBy("x"), func(h *v1beta1.SSHHost) { h.Namespace = "elsewhere" }),
	)
	for _, tc := range []struct {
		claim string
		want  []string
	}{
		{"x", []string{"a"}},
		{"y", []string{"b"}},
		{"z", nil},
	} {
		t.Run(tc.claim, func(t *testing.T) {
			var got []string
			for _, r := range w.ctrl.hostsOfClaim(context.Background(), &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: tc.claim}}) {
				if r.Namespace != ns {
					t.Fatalf("request outside the pool: %v", r)
				}
				got = append(got, r.Name)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestNodeRegistrationPredicate(t *testing.T) {
	p := nodeRegistration()
	base := mkNode("n", withProviderID("kpssh://kpssh-system/h1"), withAddr(corev1.NodeInternalIP, "10.0.0.11"))
	heartbeat := base.DeepCopy()
	heartbeat.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, LastHeartbeatTime: afterIt}}
	readdressed := base.DeepCopy()
	readdressed.Status.Addresses = append(readdressed.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeHostName, Address: "n"})
	reidentified := base.DeepCopy()
	reidentified.Spec.ProviderID = "kpssh://kpssh-system/h2"
	for _, tc := range []struct {
		name string
		got  bool
		want bool
	}{
		{"create", p.Create(event.CreateEvent{Object: base}), true},
		{"delete", p.Delete(event.DeleteEvent{Object: base}), false},
		{"heartbeat only", p.Update(event.UpdateEvent{ObjectOld: base, ObjectNew: heartbeat}), false},
		{"addresses changed", p.Update(event.UpdateEvent{ObjectOld: base, ObjectNew: readdressed}), true},
		{"providerID changed", p.Update(event.UpdateEvent{ObjectOld: base, ObjectNew: reidentified}), true},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, tc.got, tc.want)
		}
	}
}
