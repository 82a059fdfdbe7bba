package cloudprovider

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/engine"
	"github.com/dklesev/kpssh/internal/providers/phase"
)

// The check gets the context join got, computed again from the launched
// NodeClaim: the same node labels (the host class included, which only the
// launched NodeClaim carries as a label), taints, vars and secrets, and no
// token. Labels that differed would be false drift on every host.
func TestCheckHostDriftComputesJoinsContext(t *testing.T) {
	ctx := context.Background()
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "join"}, Data: map[string][]byte{"apiKey": []byte("s3cr3t-join-value")}}
	nc := nodeClass(func(nc *v1beta1.SSHNodeClass) {
		nc.Spec.JoinSecretRef = &v1beta1.LocalObjectReference{Name: "join"}
		nc.Spec.HostDrift = &v1beta1.HostDriftSpec{Interval: "1m"}
	})
	w := newWorld(t, nil, nc, joinProfile(), sec, newHost("h1", "small"))
	launched, err := w.cp.Create(ctx, newNodeClaim("claim-a"))
	if err != nil {
		t.Fatal(err)
	}
	// what Karpenter keeps: the returned labels over the NodeClaim's own
	if launched.Labels[v1beta1.LabelHostClass] != "small" {
		t.Fatalf("launched NodeClaim labels %v", launched.Labels)
	}
	w.ph.drift = phase.Drift{Result: v1beta1.DriftDrifted, Changes: []engine.Change{{Task: "join: x"}}}
	d, err := w.cp.CheckHostDrift(ctx, launched)
	if err != nil || d.Result != v1beta1.DriftDrifted || len(d.Changes) != 1 {
		t.Fatalf("check: %+v %v", d, err)
	}
	calls := w.ph.calls
	if len(calls) != 3 || calls[1].Phase != engine.PhaseJoin || calls[2].Phase != checkCall {
		t.Fatalf("calls %v", w.ph.phases())
	}
	join, check := calls[1].Ctx, calls[2].Ctx
	if check.BootstrapToken != "" {
		t.Fatalf("the check got a token: %q", check.BootstrapToken)
	}
	join.BootstrapToken = ""
	if !equalContext(join, check) {
		t.Fatalf("check context differs from join's:\njoin  %+v\ncheck %+v", join, check)
	}
	if !strings.Contains(join.NodeLabels, v1beta1.LabelHostClass+"=small") {
		t.Fatalf("join's labels lack the host class: %s", join.NodeLabels)
	}
}

func equalContext(a, b engine.Context) bool { return reflect.DeepEqual(a, b) }

func TestCheckHostDriftNotCheckable(t *testing.T) {
	claim := newNodeClaim("a", func(nc *karpv1.NodeClaim) { nc.Status.ProviderID = ProviderID(ns, "h1") })
	for _, tc := range []struct {
		name string
		host *v1beta1.SSHHost
		objs []client.Object
	}{
		{"claimed, not joined yet", newHost("h1", "small", inUse(claim), func(h *v1beta1.SSHHost) {
			h.Status.State, h.Status.ProviderID = v1beta1.HostClaimed, ""
		}), nil},
		{"rebooting", newHost("h1", "small", inUse(claim), func(h *v1beta1.SSHHost) {
			h.Status.Reboot = &v1beta1.HostReboot{OperationID: "op", ClaimUID: claim.UID, Result: v1beta1.RebootIssued}
		}), nil},
		{"installed an older profile (ProfileDrift)", newHost("h1", "small", inUse(claim), func(h *v1beta1.SSHHost) { h.Status.InstalledProfile = "prof@1" }), nil},
		{"held by another claim", newHost("h1", "small", inUse(newNodeClaim("b"))), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, nil, standard(tc.host)...)
			_, err := w.cp.CheckHostDrift(context.Background(), claim)
			if !errors.Is(err, ErrNotCheckable) {
				t.Fatalf("err %v, want ErrNotCheckable", err)
			}
			if n := len(w.ph.phases()); n != 0 {
				t.Fatalf("%d runs", n)
			}
		})
	}
	// configuration the check cannot get is a Failed check, not an error
	w := newWorld(t, nil, nodeClass(func(nc *v1beta1.SSHNodeClass) { nc.Spec.JoinSecretRef = &v1beta1.LocalObjectReference{Name: "gone"} }),
		joinProfile(), newHost("h1", "small", inUse(claim)))
	d, err := w.cp.CheckHostDrift(context.Background(), claim)
	if err != nil || d.Result != v1beta1.DriftFailed || !strings.Contains(d.Message, "gone") {
		t.Fatalf("missing join secret: %+v %v", d, err)
	}
}

// At most one check per host, never beside a phase: a phase holding the
// host defers the check; a phase asking for the host cancels a running
// check and gets the host.
func TestCheckHostDriftGivesWayToPhases(t *testing.T) {
	ctx := context.Background()
	claim := newNodeClaim("a", func(nc *karpv1.NodeClaim) { nc.Status.ProviderID = ProviderID(ns, "h1") })
	w := newWorld(t, nil, standard(newHost("h1", "small", inUse(claim)))...)

	unlock := w.cp.lock("h1")
	if _, err := w.cp.CheckHostDrift(ctx, claim); !errors.Is(err, ErrHostBusy) {
		t.Fatalf("check beside a phase: %v", err)
	}
	unlock()

	phaseGot := make(chan time.Duration, 1)
	phaseDone := make(chan struct{})
	w.ph.checking = func(cctx context.Context) {
		start := time.Now()
		go func() {
			defer close(phaseDone)
			u := w.cp.lock("h1") // Delete, Create or Reboot asking for the host
			phaseGot <- time.Since(start)
			u()
		}()
		select {
		case <-cctx.Done():
		case <-time.After(10 * time.Second):
			t.Error("the check was not cancelled by the phase")
		}
	}
	if _, err := w.cp.CheckHostDrift(ctx, claim); !errors.Is(err, ErrHostBusy) {
		t.Fatalf("check pre-empted by a phase: %v, want ErrHostBusy", err)
	}
	if d := <-phaseGot; d > 5*time.Second {
		t.Fatalf("the phase waited %v for the check", d)
	}
	<-phaseDone
	w.ph.checking = nil

	// two checks at once: one runs, the other is deferred
	release := make(chan struct{})
	w.ph.checking = func(context.Context) { <-release }
	done := make(chan error, 1)
	before := w.checks()
	go func() { _, err := w.cp.CheckHostDrift(ctx, claim); done <- err }()
	deadline := time.Now().Add(5 * time.Second)
	for w.checks() == before && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if _, err := w.cp.CheckHostDrift(ctx, claim); !errors.Is(err, ErrHostBusy) {
		t.Fatalf("second check at once: %v", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := w.checks() - before; n != 1 {
		t.Fatalf("%d checks ran, want 1", n)
	}
}

func (w *world) checks() int {
	n := 0
	for _, ph := range w.ph.phases() {
		if ph == checkCall {
			n++
		}
	}
	return n
}

// IsDrifted reports HostDrift for the HostDrift condition of the claim's
// own host, while its node class checks hosts.
func TestIsDriftedHostDrift(t *testing.T) {
	a := newNodeClaim("a", func(nc *karpv1.NodeClaim) { nc.Status.ProviderID = ProviderID(ns, "h1") })
	drifted := func(claimUID string, result v1beta1.HostDriftResult) func(*v1beta1.SSHHost) {
		return func(h *v1beta1.SSHHost) {
			h.SetHostDrift(&v1beta1.HostDriftStatus{ClaimUID: a.UID, LastResult: v1beta1.DriftDrifted, ChangedTasks: []string{"join: x"}}, "1 task", metav1.Now())
			if claimUID != "" || result != v1beta1.DriftDrifted {
				d := h.Status.HostDrift.DeepCopy()
				if claimUID != "" {
					d.ClaimUID = "uid-" + "old"
				}
				d.LastResult = result
				h.SetHostDrift(d, "", metav1.Now())
			}
		}
	}
	checking := func(nc *v1beta1.SSHNodeClass) { nc.Spec.HostDrift = &v1beta1.HostDriftSpec{Interval: "1m"} }
	for _, tc := range []struct {
		name string
		host func(*v1beta1.SSHHost)
		nc   *v1beta1.SSHNodeClass
		want cloudprovider.DriftReason
	}{
		{"drifted", drifted("", v1beta1.DriftDrifted), nodeClass(checking), HostDrift},
		{"drifted, then unreachable: the verdict stands", drifted("", v1beta1.DriftUnreachable), nodeClass(checking), HostDrift},
		{"drifted, then in sync", drifted("", v1beta1.DriftInSync), nodeClass(checking), ""},
		{"a record of another claim", drifted("old", v1beta1.DriftDrifted), nodeClass(checking), ""},
		{"node class no longer checks", drifted("", v1beta1.DriftDrifted), nodeClass(), ""},
		{"no check yet", func(*v1beta1.SSHHost) {}, nodeClass(checking), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHost("h1", "small", inUse(a), tc.host)
			w := newWorld(t, nil, tc.nc, joinProfile(), h)
			got, err := w.cp.IsDrifted(context.Background(), a)
			if err != nil || got != tc.want {
				t.Fatalf("drift %q err %v, want %q", got, err, tc.want)
			}
		})
	}
}
