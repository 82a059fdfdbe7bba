package host

import (
	"errors"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/probe"
)

const bootA, bootB = "11111111-1111-4111-8111-111111111111", "22222222-2222-4222-8222-222222222222"

func booted(id string) probe.Result {
	r := facts(true) // a joined host: its kubelet runs, and is not a zombie
	r.Facts.BootID = id
	return r
}

func rebooting(claim *karpv1.NodeClaim, bootID string, at time.Time) func(*v1beta1.SSHHost) {
	return func(h *v1beta1.SSHHost) {
		h.Status.ClaimRef = &v1beta1.ClaimRef{Name: claim.Name, UID: claim.UID}
		h.Status.ProviderID = "kpssh://" + ns + "/" + h.Name
		h.Status.HostKeyFingerprint = fpA
		h.SetState(v1beta1.HostInUse, "joined", metav1.NewTime(at))
		h.SetReboot(&v1beta1.HostReboot{OperationID: "op-1", ClaimUID: claim.UID, Result: v1beta1.RebootIssued,
			BootID: bootID, RequestedAt: metav1.NewTime(at)}, metav1.NewTime(at))
	}
}

func rebootCond(h *v1beta1.SSHHost) (metav1.ConditionStatus, string) {
	c := h.StatusConditions().Get(v1beta1.ConditionRebooting)
	if c == nil {
		return "", ""
	}
	return c.Status, c.Reason
}

func TestRebootWatchSeesTheNewBoot(t *testing.T) {
	claim := liveClaim("a", "uid-a")
	w := newWorld(t, nil, claim)
	if err := w.c.Create(t.Context(), newHost("h1", rebooting(claim, bootA, w.clock.Now()))); err != nil {
		t.Fatal(err)
	}
	// Still the old boot (the reboot is 2 s out), then down, then back.
	w.prober.results = []probe.Result{booted(bootA), {}, booted(bootB)}
	w.prober.errs = []error{nil, errors.New("dial tcp 10.0.0.11:22: connection refused"), nil}
	if res := w.reconcile(t, "h1"); res.RequeueAfter != DefaultRebootPoll {
		t.Fatalf("requeue %v while rebooting, want %v", res.RequeueAfter, DefaultRebootPoll)
	}
	patches := w.patches
	w.clock.Step(5 * time.Second)
	w.reconcile(t, "h1")
	h := w.host(t, "h1")
	if !h.Status.Reboot.WentDown || h.Status.State != v1beta1.HostInUse {
		t.Fatalf("outage: %+v state %s", h.Status.Reboot, h.Status.State)
	}
	if w.patches != patches+1 {
		t.Fatalf("%d writes for one outage: only transitions are written", w.patches-patches)
	}
	w.clock.Step(5 * time.Second)
	if res := w.reconcile(t, "h1"); res.RequeueAfter != w.ctrl.Interval {
		t.Fatalf("requeue %v once back", res.RequeueAfter)
	}
	h = w.host(t, "h1")
	if r := h.Status.Reboot; r.Result != v1beta1.RebootReturned || r.ReturnedAt == nil {
		t.Fatalf("reboot %+v", r)
	}
	if st, reason := rebootCond(h); st != metav1.ConditionFalse || reason != "RebootReturned" {
		t.Fatalf("Rebooting condition %s/%s", st, reason)
	}
	if h.Status.State != v1beta1.HostInUse || h.Status.ClaimRef == nil || h.Status.ProviderID == "" {
		t.Fatalf("claim not kept: %+v", h.Status)
	}
	if got := w.rec.reasons(); len(got) != 1 || got[0] != ReasonRebootReturned {
		t.Fatalf("events %v", got)
	}
	// Returned: the host is the provider's again, not probed.
	calls := w.prober.calls
	w.reconcile(t, "h1")
	if w.prober.calls != calls || w.leaver.calls != 0 {
		t.Fatalf("a returned host was probed (%d) or left (%d)", w.prober.calls-calls, w.leaver.calls)
	}
}

// Without a boot id from before the reboot, the host has returned when SSH
// answers after an outage.
func TestRebootWatchWithoutBootIDWaitsForTheOutage(t *testing.T) {
	claim := liveClaim("a", "uid-a")
	w := newWorld(t, nil, claim)
	if err := w.c.Create(t.Context(), newHost("h1", rebooting(claim, "", w.clock.Now()))); err != nil {
		t.Fatal(err)
	}
	w.prober.results = []probe.Result{facts(true), {}, facts(true)}
	w.prober.errs = []error{nil, errors.New("connection refused"), nil}
	w.reconcile(t, "h1")
	if r := w.host(t, "h1").Status.Reboot; r.Result != v1beta1.RebootIssued {
		t.Fatalf("returned before going down: %+v", r)
	}
	w.reconcile(t, "h1")
	w.reconcile(t, "h1")
	if r := w.host(t, "h1").Status.Reboot; r.Result != v1beta1.RebootReturned {
		t.Fatalf("after the outage: %+v", r)
	}
}

// A host that never comes back: Unhealthy with the claim kept; when it
// does come back later, InUse again.
func TestRebootWatchHostThatDoesNotReturn(t *testing.T) {
	claim := liveClaim("a", "uid-a")
	w := newWorld(t, nil, claim)
	w.ctrl.RebootTimeout = time.Minute
	if err := w.c.Create(t.Context(), newHost("h1", rebooting(claim, bootA, w.clock.Now()))); err != nil {
		t.Fatal(err)
	}
	w.prober.results = []probe.Result{{}}
	w.prober.errs = []error{errors.New("dial tcp 10.0.0.11:22: i/o timeout")}
	w.reconcile(t, "h1")
	if h := w.host(t, "h1"); h.Status.State != v1beta1.HostInUse {
		t.Fatalf("Unhealthy before the timeout: %s", h.Status.State)
	}
	w.clock.Step(61 * time.Second)
	w.reconcile(t, "h1")
	h := w.host(t, "h1")
	if h.Status.State != v1beta1.HostUnhealthy || h.Status.Reboot.Result != v1beta1.RebootLost {
		t.Fatalf("state %s reboot %+v", h.Status.State, h.Status.Reboot)
	}
	if h.Status.ClaimRef == nil || h.Status.ClaimRef.UID != claim.UID || h.Status.ProviderID == "" {
		t.Fatalf("the claim must be kept until Karpenter replaces the node: %+v", h.Status.ClaimRef)
	}
	if st, _ := ready(h); st != metav1.ConditionFalse || h.Status.LastProbeError == "" {
		t.Fatalf("Ready %s, lastProbeError %q", st, h.Status.LastProbeError)
	}
	if got := w.rec.reasons(); len(got) != 1 || got[0] != ReasonRebootLost {
		t.Fatalf("events %v", got)
	}
	// Lost is written once.
	patches := w.patches
	w.clock.Step(5 * time.Second)
	w.reconcile(t, "h1")
	if w.patches != patches {
		t.Fatalf("%d more writes while still lost", w.patches-patches)
	}
	// It comes back after all.
	w.prober.results, w.prober.errs = []probe.Result{booted(bootB)}, nil
	w.reconcile(t, "h1")
	h = w.host(t, "h1")
	if h.Status.State != v1beta1.HostInUse || h.Status.Reboot.Result != v1beta1.RebootReturned || w.leaver.calls != 0 {
		t.Fatalf("back late: state %s reboot %+v leaves %d", h.Status.State, h.Status.Reboot, w.leaver.calls)
	}
}

// A record of an earlier claim, or a finished reboot, is not watched.
func TestRebootWatchIgnoresOtherClaimsAndFinishedReboots(t *testing.T) {
	claim := liveClaim("a", "uid-a")
	for name, mut := range map[string]func(*v1beta1.SSHHost){
		"earlier claim": func(h *v1beta1.SSHHost) { h.Status.Reboot.ClaimUID = "earlier" },
		"failed":        func(h *v1beta1.SSHHost) { h.Status.Reboot.Result = v1beta1.RebootFailed },
		"returned":      func(h *v1beta1.SSHHost) { h.Status.Reboot.Result = v1beta1.RebootReturned },
	} {
		t.Run(name, func(t *testing.T) {
			w := newWorld(t, nil, claim)
			if err := w.c.Create(t.Context(), newHost("h1", rebooting(claim, bootA, w.clock.Now()), mut)); err != nil {
				t.Fatal(err)
			}
			w.reconcile(t, "h1")
			if w.prober.calls != 0 {
				t.Fatalf("probed %d times", w.prober.calls)
			}
		})
	}
}
