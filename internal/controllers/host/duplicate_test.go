package host

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/dklesev/kpssh/apis/v1beta1"
)

func duplicateCond(h *v1beta1.SSHHost) (reason, msg string, ok bool) {
	for _, c := range h.Status.Conditions {
		if c.Type == v1beta1.ConditionDuplicate && c.Status == metav1.ConditionTrue {
			return c.Reason, c.Message, true
		}
	}
	return "", "", false
}

func aged(sec int) func(*v1beta1.SSHHost) {
	return func(h *v1beta1.SSHHost) {
		h.CreationTimestamp = metav1.NewTime(time.Date(2026, 11, 1, 0, 0, sec, 0, time.UTC))
	}
}

// The later of two hosts of one machine carries Duplicate naming the
// earlier one and the field, is parked without a probe (its zombie guard
// would act on the other host's kubelet), and is handed back to the probe
// when the earlier host goes.
func TestDuplicateIsMarkedParkedAndReleased(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t, nil,
		newHost("a", aged(0), func(h *v1beta1.SSHHost) { h.Spec.Address = "2001:db8::1" }),
		newHost("b", aged(1), func(h *v1beta1.SSHHost) { h.Spec.Address = "2001:DB8:0::1" }))
	w.reconcile(t, "b")
	b := w.host(t, "b")
	reason, msg, ok := duplicateCond(b)
	if !ok || reason != v1beta1.ReasonDuplicateAddress || !strings.Contains(msg, "host a") || !strings.Contains(msg, "spec.address") || !strings.Contains(msg, "[2001:db8::1]:22") {
		t.Fatalf("Duplicate on b: %v %q %q", ok, reason, msg)
	}
	if s, r := ready(b); b.Status.State != v1beta1.HostUnhealthy || s != metav1.ConditionFalse || r != v1beta1.ReasonDuplicate {
		t.Fatalf("b: state %s, ready %s/%s; want parked Unhealthy, reason Duplicate", b.Status.State, s, r)
	}
	if w.prober.calls != 0 {
		t.Fatalf("the duplicate was probed (%d calls)", w.prober.calls)
	}
	w.reconcile(t, "b") // again: no second event
	if got := w.rec.reasons(); len(got) != 1 || got[0] != ReasonDuplicateHost {
		t.Fatalf("events %v, want one %s", got, ReasonDuplicateHost)
	}
	w.reconcile(t, "a")
	if a := w.host(t, "a"); a.Status.State != v1beta1.HostAvailable {
		t.Fatalf("the earlier host: %s", a.Status.State)
	} else if _, _, dup := duplicateCond(a); dup {
		t.Fatal("the earlier host is marked Duplicate")
	}
	// The other host's events wake b.
	if reqs := w.ctrl.hostsOfMachine(ctx, w.host(t, "a")); len(reqs) != 1 || reqs[0].Name != "b" {
		t.Fatalf("hostsOfMachine(a) = %v, want b", reqs)
	}
	// a is deleted: b is its machine's host again, probed at once.
	if err := w.c.Delete(ctx, w.host(t, "a")); err != nil {
		t.Fatal(err)
	}
	w.reconcile(t, "b")
	if b := w.host(t, "b"); b.Status.State != v1beta1.HostPending {
		t.Fatalf("b after a went: %s (want Pending: probe now)", b.Status.State)
	} else if _, _, dup := duplicateCond(b); dup {
		t.Fatal("b still Duplicate")
	}
	w.reconcile(t, "b")
	if b := w.host(t, "b"); b.Status.State != v1beta1.HostAvailable || w.prober.calls != 2 {
		t.Fatalf("b: %s after %d probes", b.Status.State, w.prober.calls)
	}
}

// status.machine, the identity the claim path reads a machine's hosts by,
// is written from the spec before the first probe and after a spec edit.
func TestMachineIdentityWritten(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t, nil, newHost("h1", func(h *v1beta1.SSHHost) { h.Spec.Address, h.Spec.Port, h.Status.Machine = "2001:DB8:0::1", 2222, nil }))
	w.reconcile(t, "h1")
	h := w.host(t, "h1")
	if m := h.Status.Machine; m == nil || *m != (v1beta1.MachineIdentity{Address: "[2001:db8::1]:2222", NodeAddress: "2001:db8::1"}) || h.Status.State != v1beta1.HostAvailable {
		t.Fatalf("machine %+v, state %s", h.Status.Machine, h.Status.State)
	}
	h.Spec.NodeAddress, h.Generation = "10.0.0.9", h.Generation+1
	if err := w.c.Update(ctx, h); err != nil {
		t.Fatal(err)
	}
	w.reconcile(t, "h1")
	if m := w.host(t, "h1").Status.Machine; m == nil || m.NodeAddress != "10.0.0.9" {
		t.Fatalf("machine after the edit: %+v", m)
	}
}

// A node address shared by two hosts; editing it away clears the mark.
func TestDuplicateNodeAddressFollowsEdits(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t, nil,
		newHost("a", aged(0), func(h *v1beta1.SSHHost) { h.Spec.Address, h.Spec.NodeAddress = "192.0.2.1", "10.0.0.5" }),
		newHost("b", aged(1), func(h *v1beta1.SSHHost) { h.Spec.Address = "10.0.0.5" })) // defaults to it
	w.reconcile(t, "b")
	if reason, msg, ok := duplicateCond(w.host(t, "b")); !ok || reason != v1beta1.ReasonDuplicateNodeAddress || !strings.Contains(msg, "spec.nodeAddress") {
		t.Fatalf("Duplicate on b: %v %q %q", ok, reason, msg)
	}
	a := w.host(t, "a")
	a.Spec.NodeAddress = "10.0.0.6"
	a.Generation++
	if err := w.c.Update(ctx, a); err != nil {
		t.Fatal(err)
	}
	w.reconcile(t, "b")
	if _, _, dup := duplicateCond(w.host(t, "b")); dup {
		t.Fatal("b still Duplicate after a's nodeAddress changed")
	}
}

// A host claimed before its twin existed keeps its claim and is marked;
// the older unclaimed twin yields to the claim (no probe: its zombie guard
// would see the claimed host's kubelet), and a maintenance annotation still
// parks a duplicate as Maintenance.
func TestDuplicateClaimedAndMaintenance(t *testing.T) {
	w := newWorld(t, nil,
		newHost("a", aged(0)), // 10.0.0.11 like every fixture host
		newHost("b", aged(1), func(h *v1beta1.SSHHost) {
			h.Status.State, h.Status.ClaimRef = v1beta1.HostInUse, &v1beta1.ClaimRef{Name: "nc", UID: "u"}
		}),
		newHost("c", aged(2), func(h *v1beta1.SSHHost) { h.Annotations = map[string]string{v1beta1.AnnotationMaintenance: ""} }),
		&karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: "nc", UID: "u"}})
	w.reconcile(t, "b")
	b := w.host(t, "b")
	if _, _, dup := duplicateCond(b); dup || b.Status.ClaimRef == nil {
		t.Fatalf("the claimed host: %+v", b.Status)
	}
	w.reconcile(t, "a")
	a := w.host(t, "a")
	if _, msg, dup := duplicateCond(a); !dup || !strings.Contains(msg, "host b") || !strings.Contains(msg, "holds a claim") || a.Status.State != v1beta1.HostUnhealthy {
		t.Fatalf("the unclaimed older twin of a claimed host: %+v", a.Status)
	}
	w.reconcile(t, "c")
	c := w.host(t, "c")
	if _, _, dup := duplicateCond(c); !dup || c.Status.State != v1beta1.HostMaintenance {
		t.Fatalf("a duplicate in maintenance: %+v", c.Status)
	}
	if w.prober.calls != 0 {
		t.Fatalf("%d probes of hosts of a claimed machine", w.prober.calls)
	}
}

func TestMachineChangePredicate(t *testing.T) {
	base := newHost("a")
	p := machineChange()
	for _, tc := range []struct {
		name string
		mut  func(*v1beta1.SSHHost)
		want bool
	}{
		{"probe result", func(h *v1beta1.SSHHost) { h.Status.State = v1beta1.HostAvailable }, false},
		{"spec edit", func(h *v1beta1.SSHHost) { h.Generation++ }, true},
		{"claimed", func(h *v1beta1.SSHHost) { h.Status.ClaimRef = &v1beta1.ClaimRef{Name: "x"} }, true},
		{"deleting", func(h *v1beta1.SSHHost) { now := metav1.Now(); h.DeletionTimestamp = &now }, true},
	} {
		n := base.DeepCopy()
		tc.mut(n)
		if got := p.Update(event.UpdateEvent{ObjectOld: base, ObjectNew: n}); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
