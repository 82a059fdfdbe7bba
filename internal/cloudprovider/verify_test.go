package cloudprovider

import (
	"context"
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/engine"
)

// verifyProfile is the standard profile with a verify phase.
func verifyProfile() *v1beta1.SSHJoinProfile {
	p := joinProfile()
	p.Spec.Scripts.Verify = "test -e /dev/kvm"
	return p
}

// launchedClaim is a NodeClaim as Karpenter holds it when it asks the hook:
// stored, launched (providerID), Karpenter's finalizer on it.
func launchedClaim(name string) *karpv1.NodeClaim {
	return newNodeClaim(name, func(nc *karpv1.NodeClaim) {
		nc.Finalizers = []string{karpv1.TerminationFinalizer}
		nc.Status.ProviderID = ProviderID(ns, "h1")
	})
}

func (w *world) verifies() int { return w.runs(engine.PhaseVerify) }

func (w *world) claimDeleting(t *testing.T, c *karpv1.NodeClaim) bool {
	t.Helper()
	got := &karpv1.NodeClaim{}
	if err := w.c.Get(context.Background(), client.ObjectKeyFromObject(c), got); err != nil {
		return apierrors.IsNotFound(err)
	}
	return !got.DeletionTimestamp.IsZero()
}

var registered = cloudprovider.NodeLifecycleHookResult{}

func TestVerifyHookName(t *testing.T) {
	w := newWorld(t, nil, standard()...)
	if n := w.cp.VerifyHook().Name(); n != VerifyHookName || n == w.cp.Name() {
		t.Fatalf("hook name %q", n)
	}
}

// A profile without a verify phase: registration does not wait, nothing
// runs, nothing is written.
func TestVerifyHookWithoutVerifyPhase(t *testing.T) {
	claim := launchedClaim("a")
	w := newWorld(t, nil, standard(newHost("h1", "small", inUse(claim)), claim)...)
	res, err := w.cp.VerifyHook().Registered(context.Background(), claim)
	if err != nil || res != registered {
		t.Fatalf("Registered = %+v, %v", res, err)
	}
	if len(w.ph.calls) != 0 || w.writes != 0 || w.host(t, "h1").Status.Verify != nil {
		t.Fatalf("ran %v, %d writes, verify %+v", w.ph.phases(), w.writes, w.host(t, "h1").Status.Verify)
	}
}

// A passing verify runs once per claim with install's context; the record
// (one CAS write) answers every later call.
func TestVerifyHookPassesOnce(t *testing.T) {
	claim := launchedClaim("a")
	w := newWorld(t, nil, nodeClass(), verifyProfile(), newHost("h1", "small", inUse(claim)), claim)
	hook := w.cp.VerifyHook()
	for i := 0; i < 3; i++ {
		res, err := hook.Registered(context.Background(), claim)
		if err != nil || res != registered {
			t.Fatalf("call %d: %+v, %v", i, res, err)
		}
	}
	if n := w.verifies(); n != 1 || len(w.ph.calls) != 1 {
		t.Fatalf("phases %v: want verify once", w.ph.phases())
	}
	c := w.ph.calls[0]
	if c.Prof != "prof" || c.Ctx.NodeName != "h1" || c.Ctx.Vars["k8sMinor"] != "1.36" || c.Ctx.ClusterEndpoint == "" ||
		c.Ctx.ProviderID != ProviderID(ns, "h1") || c.Ctx.BootstrapToken != "" || !strings.HasPrefix(c.Ctx.Taints, UnregisteredTaint) {
		t.Fatalf("verify context %+v: want install's (vars, cluster, node name; no token)", c.Ctx)
	}
	h := w.host(t, "h1")
	if v := h.Status.Verify; v == nil || v.Result != v1beta1.VerifyPassed || v.ClaimUID != claim.UID {
		t.Fatalf("status.verify %+v", v)
	}
	if lp := h.Status.LastPhase; lp == nil || lp.Phase != v1beta1.PhaseVerify || lp.Result != v1beta1.PhaseSucceeded {
		t.Fatalf("lastPhase %+v", lp)
	}
	if h.Status.State != v1beta1.HostInUse || w.writes != 1 || w.claimDeleting(t, claim) {
		t.Fatalf("state %s, %d writes, claim deleting %v", h.Status.State, w.writes, w.claimDeleting(t, claim))
	}
	// A controller that restarts (another CloudProvider, same API server)
	// reads the record: nothing runs again.
	other := New(w.c, w.c, ns, w.ph, w.tok, w.rec, w.cp.Clock)
	if res, err := other.VerifyHook().Registered(context.Background(), claim); err != nil || res != registered || w.verifies() != 1 {
		t.Fatalf("after a restart: %+v %v, %d runs", res, err, w.verifies())
	}
}

// A failing verify: the failure is recorded with the failed task, the
// NodeClaim is deleted before it registers and every later call fails
// without running verify again; Karpenter's Delete then runs leave and
// releases the host Unhealthy, lastPhase still naming the failed task.
func TestVerifyHookFails(t *testing.T) {
	for _, tc := range []struct {
		name      string
		leave     *engine.Result
		wantPhase v1beta1.Phase // lastPhase after Delete
		// the leave ran long enough for its progress record (lastPhase
		// Running, written under the claim) to replace the failed verify's
		progress bool
	}{
		{"leave ok", nil, v1beta1.PhaseVerify, false},
		{"leave fails too", &engine.Result{Outcome: engine.Failed, FailedTask: "stop kubelet"}, v1beta1.PhaseLeave, false},
		{"a slow leave's progress record", nil, v1beta1.PhaseVerify, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			claim := launchedClaim("a")
			w := newWorld(t, nil, nodeClass(), verifyProfile(), newHost("h1", "small", inUse(claim)), claim)
			w.ph.results[engine.PhaseVerify] = engine.Result{Outcome: engine.Failed, FailedTask: "expected devices exist", RC: 1, Message: "missing: /dev/kvm"}
			if tc.leave != nil {
				w.ph.results[engine.PhaseLeave] = *tc.leave
			}
			if tc.progress {
				w.ph.during = func(ph engine.Phase) {
					if ph != engine.PhaseLeave {
						return
					}
					h := w.host(t, "h1")
					h.Status.LastPhase = &v1beta1.LastPhase{Phase: v1beta1.PhaseLeave, Result: v1beta1.PhaseRunning, CurrentTask: "stop kubelet"}
					if err := w.c.Status().Update(context.Background(), h); err != nil {
						t.Error(err)
					}
				}
			}
			hook := w.cp.VerifyHook()
			for i := 0; i < 2; i++ {
				_, err := hook.Registered(context.Background(), claim)
				if err == nil || !strings.Contains(err.Error(), "missing: /dev/kvm") || !strings.Contains(err.Error(), "host h1") {
					t.Fatalf("call %d: %v, want the verify failure", i, err)
				}
				if !w.claimDeleting(t, claim) {
					t.Fatalf("call %d: the NodeClaim is not being deleted", i)
				}
			}
			if n := w.verifies(); n != 1 {
				t.Fatalf("verify ran %d times", n)
			}
			h := w.host(t, "h1")
			if v := h.Status.Verify; v == nil || v.Result != v1beta1.VerifyFailed || !strings.Contains(v.Message, `at task "expected devices exist"`) {
				t.Fatalf("status.verify %+v", v)
			}
			lp := h.Status.LastPhase
			if lp == nil || lp.Phase != v1beta1.PhaseVerify || lp.Result != v1beta1.PhaseFailed || lp.FailedTask != "expected devices exist" {
				t.Fatalf("lastPhase %+v", lp)
			}
			if h.Status.State != v1beta1.HostInUse || !contains(w.rec.reasons(), ReasonVerifyFailed) {
				t.Fatalf("before Delete: state %s, events %v", h.Status.State, w.rec.reasons())
			}
			// Karpenter's finalizer: Delete, with the NodeClaim as it stands.
			deleting := &karpv1.NodeClaim{}
			if err := w.c.Get(context.Background(), client.ObjectKeyFromObject(claim), deleting); err != nil {
				t.Fatal(err)
			}
			if err := w.cp.Delete(context.Background(), deleting); err != nil {
				t.Fatal(err)
			}
			h = w.host(t, "h1")
			if got := w.ph.phases(); len(got) != 2 || got[1] != engine.PhaseLeave {
				t.Fatalf("phases %v, want verify then leave", got)
			}
			if h.Status.State != v1beta1.HostUnhealthy || h.Status.ClaimRef != nil || h.Status.Verify != nil || !contains(w.tok.deleted, "eeeeee") {
				t.Fatalf("after Delete: %+v", h.Status)
			}
			if h.Status.LastPhase == nil || h.Status.LastPhase.Phase != tc.wantPhase {
				t.Fatalf("lastPhase after Delete %+v, want %s", h.Status.LastPhase, tc.wantPhase)
			}
			if tc.wantPhase == v1beta1.PhaseVerify && (h.Status.LastPhase.Result != v1beta1.PhaseFailed || h.Status.LastPhase.FailedTask != "expected devices exist") {
				t.Fatalf("lastPhase after Delete %+v, want the failed verify", h.Status.LastPhase)
			}
			if tc.leave == nil && !strings.Contains(h.Status.LastProbeError, "verify failed under NodeClaim a (leave ran)") {
				t.Fatalf("lastProbeError %q", h.Status.LastProbeError)
			}
			if _, err := hook.Registered(context.Background(), deleting); err == nil {
				t.Fatal("the hook passed a claim whose host was released")
			}
		})
	}
}

// What a crashed controller left: a record of this claim answers without a
// run; one of an earlier claim of the host means nothing.
func TestVerifyHookResumes(t *testing.T) {
	claim := launchedClaim("a")
	for _, tc := range []struct {
		name     string
		rec      *v1beta1.HostVerify
		wantRuns int
		wantErr  bool
	}{
		{"passed", &v1beta1.HostVerify{ClaimUID: claim.UID, Result: v1beta1.VerifyPassed}, 0, false},
		{"failed, the claim's delete lost", &v1beta1.HostVerify{ClaimUID: claim.UID, Result: v1beta1.VerifyFailed, Message: "verify Failed"}, 0, true},
		{"an earlier claim's", &v1beta1.HostVerify{ClaimUID: "earlier", Result: v1beta1.VerifyFailed}, 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHost("h1", "small", inUse(claim), func(h *v1beta1.SSHHost) { h.Status.Verify = tc.rec })
			w := newWorld(t, nil, nodeClass(), verifyProfile(), h, claim)
			_, err := w.cp.VerifyHook().Registered(context.Background(), claim)
			if (err != nil) != tc.wantErr || w.verifies() != tc.wantRuns {
				t.Fatalf("err %v, %d runs", err, w.verifies())
			}
			if w.claimDeleting(t, claim) != tc.wantErr {
				t.Fatalf("claim deleting %v", w.claimDeleting(t, claim))
			}
		})
	}
}

// Verify cannot run: what is wrong in the configuration fails the gate
// like a failure on the host (a Rejected lastPhase); an API error is only
// an error (Karpenter asks again).
func TestVerifyHookCannotRun(t *testing.T) {
	for _, tc := range []struct {
		name    string
		objs    func(claim *karpv1.NodeClaim) []client.Object
		wantMsg string
	}{
		// A profile that is gone may have had a verify: the gate fails
		// rather than pass unverified.
		{"the marker's profile is gone", func(claim *karpv1.NodeClaim) []client.Object {
			return []client.Object{nodeClass(), newHost("h1", "small", inUse(claim)), claim}
		}, `join profile of install marker "prof@2" is gone`},
		{"node class gone", func(claim *karpv1.NodeClaim) []client.Object {
			return []client.Object{verifyProfile(), newHost("h1", "small", inUse(claim)), claim}
		}, `SSHNodeClass "pool" not found`},
		{"join secret missing", func(claim *karpv1.NodeClaim) []client.Object {
			nc := nodeClass(func(nc *v1beta1.SSHNodeClass) { nc.Spec.JoinSecretRef = &v1beta1.LocalObjectReference{Name: "gone"} })
			return []client.Object{nc, verifyProfile(), newHost("h1", "small", inUse(claim)), claim}
		}, "read join secret kpssh-system/gone"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			claim := launchedClaim("a")
			w := newWorld(t, nil, tc.objs(claim)...)
			_, err := w.cp.VerifyHook().Registered(context.Background(), claim)
			if err == nil || !strings.Contains(err.Error(), tc.wantMsg) || !w.claimDeleting(t, claim) {
				t.Fatalf("err %v, claim deleting %v", err, w.claimDeleting(t, claim))
			}
			h := w.host(t, "h1")
			if h.Status.Verify == nil || h.Status.Verify.Result != v1beta1.VerifyFailed || h.Status.LastPhase == nil ||
				h.Status.LastPhase.Phase != v1beta1.PhaseVerify || h.Status.LastPhase.Result != v1beta1.PhaseRejected {
				t.Fatalf("verify %+v lastPhase %+v", h.Status.Verify, h.Status.LastPhase)
			}
		})
	}
	claim := launchedClaim("a")
	boom := errors.New("apiserver unavailable")
	w := newWorld(t, &interceptor.Funcs{Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
		if _, ok := obj.(*corev1.Secret); ok {
			return boom
		}
		return c.Get(ctx, key, obj, opts...)
	}}, nodeClass(func(nc *v1beta1.SSHNodeClass) { nc.Spec.JoinSecretRef = &v1beta1.LocalObjectReference{Name: "s"} }),
		verifyProfile(), newHost("h1", "small", inUse(claim)), claim)
	if _, err := w.cp.VerifyHook().Registered(context.Background(), claim); !errors.Is(err, boom) || w.claimDeleting(t, claim) || w.host(t, "h1").Status.Verify != nil {
		t.Fatalf("API error: %v, claim deleting %v", err, w.claimDeleting(t, claim))
	}
}

// No verdict without a run: a claim no host holds, one not launched, and a
// run cut short by the controller stopping.
func TestVerifyHookNoVerdict(t *testing.T) {
	claim := launchedClaim("a")
	w := newWorld(t, nil, nodeClass(), verifyProfile(), newHost("h1", "small"), claim)
	if _, err := w.cp.VerifyHook().Registered(context.Background(), claim); err == nil || !strings.Contains(err.Error(), "no host is claimed") {
		t.Fatalf("no host: %v", err)
	}
	other := newNodeClaim("x", func(nc *karpv1.NodeClaim) {
		nc.Spec.NodeClassRef = &karpv1.NodeClassReference{Group: "karpenter.k8s.aws", Kind: "EC2NodeClass", Name: "default"}
	})
	if res, err := w.cp.VerifyHook().Registered(context.Background(), other); err != nil || res != registered {
		t.Fatalf("another provider's NodeClaim: %+v %v", res, err)
	}

	w = newWorld(t, nil, nodeClass(), verifyProfile(), newHost("h1", "small", inUse(claim), func(h *v1beta1.SSHHost) { h.Status.ProviderID = "" }), claim)
	if res, err := w.cp.VerifyHook().Registered(context.Background(), claim); err != nil || res.RequeueAfter == 0 || w.verifies() != 0 {
		t.Fatalf("not launched: %+v %v", res, err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	w = newWorld(t, nil, nodeClass(), verifyProfile(), newHost("h1", "small", inUse(claim)), claim)
	w.ph.results[engine.PhaseVerify] = engine.Result{Outcome: engine.TimedOut, Message: "canceled"}
	w.ph.during = func(engine.Phase) { cancel() }
	if _, err := w.cp.VerifyHook().Registered(ctx, claim); !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled: %v", err)
	}
	if h := w.host(t, "h1"); h.Status.Verify != nil || w.claimDeleting(t, claim) {
		t.Fatalf("a canceled run left a verdict: %+v", h.Status.Verify)
	}
}

// The record did not land: the next call runs verify again (it is
// idempotent), and only a recorded pass registers.
func TestVerifyHookRecordLost(t *testing.T) {
	claim := launchedClaim("a")
	fail := 1
	funcs := &interceptor.Funcs{SubResourcePatch: func(ctx context.Context, c client.Client, sub string, o client.Object, p client.Patch, opts ...client.SubResourcePatchOption) error {
		if fail > 0 {
			fail--
			return errors.New("etcd timeout")
		}
		return c.SubResource(sub).Patch(ctx, o, p, opts...)
	}}
	w := newWorld(t, funcs, nodeClass(), verifyProfile(), newHost("h1", "small", inUse(claim)), claim)
	if _, err := w.cp.VerifyHook().Registered(context.Background(), claim); err == nil || !strings.Contains(err.Error(), "etcd timeout") {
		t.Fatalf("first call: %v", err)
	}
	if res, err := w.cp.VerifyHook().Registered(context.Background(), claim); err != nil || res != registered {
		t.Fatalf("second call: %+v %v", res, err)
	}
	if n := w.verifies(); n != 2 {
		t.Fatalf("verify ran %d times, want 2 (the first record was lost)", n)
	}
}

// A Verified host's shim refusing verify (an old shim knows no verify
// phase: exit 5) makes the refusal sticky, as for install and join.
func TestVerifyHookShimRefusal(t *testing.T) {
	claim := launchedClaim("a")
	w := newWorld(t, nil, nodeClass(), verifyProfile(), newHost("h1", "small", inUse(claim)), claim)
	w.ph.results[engine.PhaseVerify] = engine.Result{Outcome: engine.Rejected, RC: engine.ShimUnknownPhase, Message: "kpssh-shim: unknown phase"}
	if _, err := w.cp.VerifyHook().Registered(context.Background(), claim); err == nil {
		t.Fatal("a refused verify passed")
	}
	r := w.host(t, "h1").Status.ShimRejection
	if r == nil || r.Phase != v1beta1.PhaseVerify || r.RC != engine.ShimUnknownPhase || r.Profile != "prof" || r.NodeClass != "pool" {
		t.Fatalf("shimRejection %+v", r)
	}
}
