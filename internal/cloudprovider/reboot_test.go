package cloudprovider

import (
	"context"
	"sync"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/engine"
)

const preBoot = "0b8e4a4e-1111-4c1c-9d7e-2f0e5b6f7a80"

func rebootClaim() *karpv1.NodeClaim {
	return newNodeClaim("a", func(nc *karpv1.NodeClaim) {
		nc.Annotations = map[string]string{karpv1.RebootPreBootIDAnnotationKey: preBoot}
	})
}

func (w *world) reboots() int { return w.runs(engine.PhaseReboot) }

func TestRebootRunsOncePerOperation(t *testing.T) {
	ctx := context.Background()
	claim := rebootClaim()
	w := newWorld(t, nil, standard(newHost("h1", "small", inUse(claim)))...)
	if err := w.cp.Reboot(ctx, claim, "op-1"); err != nil {
		t.Fatalf("reboot: %v", err)
	}
	h := w.host(t, "h1")
	r := h.Status.Reboot
	if r == nil || r.OperationID != "op-1" || r.Result != v1beta1.RebootIssued || r.BootID != preBoot || r.ClaimUID != claim.UID {
		t.Fatalf("status.reboot = %+v", r)
	}
	if h.Status.State != v1beta1.HostInUse || h.Status.ClaimRef == nil || h.Status.ClaimRef.UID != claim.UID || h.Status.ProviderID == "" {
		t.Fatalf("host left its claim: state %s claim %+v providerID %q", h.Status.State, h.Status.ClaimRef, h.Status.ProviderID)
	}
	if h.Status.LastPhase == nil || h.Status.LastPhase.Phase != v1beta1.PhaseReboot {
		t.Fatalf("lastPhase = %+v", h.Status.LastPhase)
	}
	c := w.ph.calls[0]
	if c.Prof != "prof" || c.Ctx.NodeName != "" || len(c.Ctx.Vars) != 0 || c.Ctx.HostAddress != h.Spec.Address {
		t.Fatalf("reboot ran %+v: want the marker's profile with the empty context", c)
	}
	// The same operation again (Karpenter retries, or a second replica):
	// nothing runs.
	for i := 0; i < 3; i++ {
		if err := w.cp.Reboot(ctx, claim, "op-1"); err != nil {
			t.Fatalf("repeat %d: %v", i, err)
		}
	}
	if n := w.reboots(); n != 1 {
		t.Fatalf("reboot phase ran %d times for one operation", n)
	}
	// A new operation is a new reboot.
	if err := w.cp.Reboot(ctx, claim, "op-2"); err != nil {
		t.Fatal(err)
	}
	if n := w.reboots(); n != 2 {
		t.Fatalf("second operation: %d reboot runs, want 2", n)
	}
	if got := w.rec.reasons(); len(got) != 2 || got[0] != ReasonRebootIssued {
		t.Fatalf("events %v", got)
	}
}

// A controller that died after recording the operation and before (or
// while) the phase ran: the retry with the same id runs nothing.
func TestRebootAfterCrashBetweenRecordAndRun(t *testing.T) {
	claim := rebootClaim()
	h := newHost("h1", "small", inUse(claim), func(h *v1beta1.SSHHost) {
		h.SetReboot(&v1beta1.HostReboot{OperationID: "op-1", ClaimUID: claim.UID, Result: v1beta1.RebootRequested}, metav1.Now())
	})
	w := newWorld(t, nil, standard(h)...)
	if err := w.cp.Reboot(context.Background(), claim, "op-1"); err != nil {
		t.Fatal(err)
	}
	if n := w.reboots(); n != 0 {
		t.Fatalf("reboot ran %d times after a recorded operation", n)
	}
	// The record of an earlier claim of the host is not this operation's.
	h = newHost("h1", "small", inUse(claim), func(h *v1beta1.SSHHost) {
		h.SetReboot(&v1beta1.HostReboot{OperationID: "op-1", ClaimUID: "earlier", Result: v1beta1.RebootReturned}, metav1.Now())
	})
	w = newWorld(t, nil, standard(h)...)
	if err := w.cp.Reboot(context.Background(), claim, "op-1"); err != nil || w.reboots() != 1 {
		t.Fatalf("earlier claim's record: err %v, %d runs", err, w.reboots())
	}
}

func TestRebootConcurrentCallsRunOnce(t *testing.T) {
	claim := rebootClaim()
	w := newWorld(t, nil, standard(newHost("h1", "small", inUse(claim)))...)
	// Two providers (two replicas, no shared lock) over one API server.
	other := New(w.c, w.c, ns, w.ph, w.tok, w.rec, w.cp.Clock)
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			cp := w.cp
			if i%2 == 1 {
				cp = other
			}
			errs[i] = cp.Reboot(context.Background(), claim, "op-1")
		}(i)
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("call %d: %v", i, err)
		}
	}
	if n := w.reboots(); n != 1 {
		t.Fatalf("reboot ran %d times for one operation from 8 concurrent calls", n)
	}
}

func TestRebootRecordConflictRetries(t *testing.T) {
	claim := rebootClaim()
	conflicts := 1
	funcs := &interceptor.Funcs{SubResourcePatch: func(ctx context.Context, c client.Client, sub string, o client.Object, p client.Patch, opts ...client.SubResourcePatchOption) error {
		if conflicts > 0 {
			conflicts--
			return apierrors.NewConflict(schema.GroupResource{Resource: "sshhosts"}, o.GetName(), nil)
		}
		return c.SubResource(sub).Patch(ctx, o, p, opts...)
	}}
	w := newWorld(t, funcs, standard(newHost("h1", "small", inUse(claim)))...)
	if err := w.cp.Reboot(context.Background(), claim, "op-1"); err != nil {
		t.Fatal(err)
	}
	if n := w.reboots(); n != 1 || w.host(t, "h1").Status.Reboot.Result != v1beta1.RebootIssued {
		t.Fatalf("%d runs, reboot %+v", n, w.host(t, "h1").Status.Reboot)
	}
}

func TestRebootFailed(t *testing.T) {
	claim := rebootClaim()
	for _, tc := range []struct {
		name string
		res  engine.Result
	}{
		{"on the host", engine.Result{Outcome: engine.Failed, FailedTask: "reboot", RC: 1, Message: "kubelet.service is disabled"}},
		{"refused before the host (Verified, unsigned)", engine.Result{Outcome: engine.ConfigError, Message: "execMode Verified: join profile prof has no signatures.reboot"}},
		{"unreachable", engine.Result{Outcome: engine.Failed, ExitCode: -1, Message: "connect: dial tcp: i/o timeout"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, nil, standard(newHost("h1", "small", inUse(claim)))...)
			w.ph.results[engine.PhaseReboot] = tc.res
			err := w.cp.Reboot(context.Background(), claim, "op-1")
			if !cloudprovider.IsNodeRebootFailedError(err) {
				t.Fatalf("want NodeRebootFailedError (Karpenter replaces at once), got %v", err)
			}
			h := w.host(t, "h1")
			if h.Status.Reboot.Result != v1beta1.RebootFailed || h.Status.State != v1beta1.HostInUse || h.Status.ClaimRef == nil {
				t.Fatalf("host %s, reboot %+v", h.Status.State, h.Status.Reboot)
			}
			// Replayed: the same answer, nothing runs again.
			if err2 := w.cp.Reboot(context.Background(), claim, "op-1"); !cloudprovider.IsNodeRebootFailedError(err2) || w.reboots() != 1 {
				t.Fatalf("replay: %v, %d runs", err2, w.reboots())
			}
			if got := w.rec.reasons(); len(got) != 1 || got[0] != ReasonRebootFailed {
				t.Fatalf("events %v", got)
			}
		})
	}
}

func TestRebootNotFoundAndNotJoined(t *testing.T) {
	claim := rebootClaim()
	for _, tc := range []struct {
		name string
		host *v1beta1.SSHHost
		want func(error) bool
	}{
		{"no host claimed", newHost("h1", "small"), cloudprovider.IsNodeClaimNotFoundError},
		{"another claim of the same name (successor)", newHost("h1", "small", inUse(newNodeClaim("a", func(nc *karpv1.NodeClaim) { nc.UID = "successor" }))), cloudprovider.IsNodeClaimNotFoundError},
		{"claimed, not joined", newHost("h1", "small", func(h *v1beta1.SSHHost) {
			h.Status.State = v1beta1.HostClaimed
			h.Status.ClaimRef = &v1beta1.ClaimRef{Name: claim.Name, UID: claim.UID}
		}), cloudprovider.IsNodeRebootFailedError},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, nil, standard(tc.host)...)
			before := w.host(t, "h1").Status
			if err := w.cp.Reboot(context.Background(), claim, "op-1"); !tc.want(err) {
				t.Fatalf("got %v", err)
			}
			if n := w.reboots(); n != 0 {
				t.Fatalf("reboot ran %d times", n)
			}
			if after := w.host(t, "h1").Status; after.Reboot != nil || after.State != before.State {
				t.Fatalf("host touched: %+v", after)
			}
		})
	}
	w := newWorld(t, nil, standard(newHost("h1", "small", inUse(claim)))...)
	if err := w.cp.Reboot(context.Background(), claim, ""); !cloudprovider.IsNodeRebootFailedError(err) || w.reboots() != 0 {
		t.Fatalf("empty operation id: %v", err)
	}
}

// A deleted marker profile: the fallback profile, whose reboot is the default.
func TestRebootWithoutMarkerProfileRunsDefault(t *testing.T) {
	claim := rebootClaim()
	w := newWorld(t, nil, nodeClass(), newHost("h1", "small", inUse(claim)))
	if err := w.cp.Reboot(context.Background(), claim, "op-1"); err != nil {
		t.Fatal(err)
	}
	if c := w.ph.calls[0]; c.Phase != engine.PhaseReboot || c.Prof != "kpssh-fallback-leave" {
		t.Fatalf("ran %+v", c)
	}
}
