package leave

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/karpenter/pkg/events"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/engine"
	"github.com/dklesev/kpssh/internal/providers/hostkey"
	"github.com/dklesev/kpssh/internal/providers/phase"
)

// fakeRunner answers leave with profile (the profile's leave) and fallback
// (the fallback leave's) and records what ran.
type fakeRunner struct {
	profile, fallback engine.Result
	ran               []string
}

func (f *fakeRunner) Run(_ context.Context, _ *v1beta1.SSHHost, p *v1beta1.SSHJoinProfile, ph engine.Phase, c engine.Context, _ []string) phase.Outcome {
	f.ran = append(f.ran, p.Marker()+" "+string(ph))
	return phase.Outcome{Result: f.profile, LastPhase: phase.Record(ph, f.profile, time.Now())}
}

func (f *fakeRunner) RunFallbackLeave(_ context.Context, _ *v1beta1.SSHHost, c engine.Context) phase.Outcome {
	f.ran = append(f.ran, "fallback")
	return phase.Outcome{Result: f.fallback, LastPhase: phase.Record(engine.PhaseLeave, f.fallback, time.Now())}
}

type recorder struct{ events []events.Event }

func (r *recorder) Publish(evs ...events.Event) { r.events = append(r.events, evs...) }

func TestRun(t *testing.T) {
	ok := engine.Result{Outcome: engine.Succeeded}
	prof := &v1beta1.SSHJoinProfile{ObjectMeta: metav1.ObjectMeta{Name: "prof"}, Spec: v1beta1.SSHJoinProfileSpec{Version: "2"}}
	for _, tc := range []struct {
		name              string
		marker            string
		objs              []client.Object
		profile, fallback engine.Result
		wantRan           string
		wantFallback      string // in Result.Fallback; "" = none
		wantOK            bool
	}{
		{name: "the marker's profile leaves", marker: "prof@1", objs: []client.Object{prof}, profile: ok,
			wantRan: "prof@2 leave", wantOK: true},
		{name: "no marker → fallback", profile: ok, fallback: ok,
			wantRan: "fallback", wantFallback: "no install marker", wantOK: true},
		{name: "profile deleted → fallback", marker: "gone@4", fallback: ok,
			wantRan: "fallback", wantFallback: "install marker gone@4 names no existing profile", wantOK: true},
		{name: "refused by the controller (expired manifest) → fallback", marker: "prof@2", objs: []client.Object{prof},
			profile: engine.Result{Outcome: engine.ConfigError, Message: "execMode Verified: leave: manifest expired at 2026-11-01T00:00:00Z"}, fallback: ok,
			wantRan: "prof@2 leave,fallback", wantFallback: "the leave of prof@2 was refused before it ran: leave ConfigError: execMode Verified: leave: manifest expired", wantOK: true},
		{name: "refused by the shim → fallback", marker: "prof@2", objs: []client.Object{prof},
			profile: engine.Result{Outcome: engine.Rejected, RC: engine.ShimBadSignature, Touched: true}, fallback: ok,
			wantRan: "prof@2 leave,fallback", wantFallback: "leave Rejected (rc 2)", wantOK: true},
		// It ran (or may have): the fallback would hide a broken leave.
		{name: "failed → no fallback", marker: "prof@2", objs: []client.Object{prof},
			profile: engine.Result{Outcome: engine.Failed, RC: 10, Touched: true}, fallback: ok, wantRan: "prof@2 leave"},
		{name: "timed out → no fallback", marker: "prof@2", objs: []client.Object{prof},
			profile: engine.Result{Outcome: engine.TimedOut, Touched: true}, fallback: ok, wantRan: "prof@2 leave"},
		{name: "shim failed internally (1) → no fallback", marker: "prof@2", objs: []client.Object{prof},
			profile: engine.Result{Outcome: engine.Failed, RC: engine.ShimInternal, Touched: true}, fallback: ok, wantRan: "prof@2 leave"},
		{name: "refused, and the fallback refused too", marker: "prof@2", objs: []client.Object{prof},
			profile:  engine.Result{Outcome: engine.ConfigError, Message: "expired"},
			fallback: engine.Result{Outcome: engine.Rejected, RC: engine.ShimMalformed, Touched: true},
			wantRan:  "prof@2 leave,fallback", wantFallback: "refused before it ran"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(tc.objs...).Build()
			h := testHost(func(h *v1beta1.SSHHost) { h.Status.InstalledProfile = tc.marker })
			r := &fakeRunner{profile: tc.profile, fallback: tc.fallback}
			res, err := Run(context.Background(), c, r, h)
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(r.ran, ","); got != tc.wantRan {
				t.Fatalf("ran %q, want %q", got, tc.wantRan)
			}
			if (tc.wantFallback == "") != (res.Fallback == "") || !strings.Contains(res.Fallback, tc.wantFallback) {
				t.Fatalf("fallback %q, want %q", res.Fallback, tc.wantFallback)
			}
			if res.OK() != tc.wantOK {
				t.Fatalf("ok %v (%s), want %v", res.OK(), res.Summary(), tc.wantOK)
			}
			// The provider the zombie guard uses: an *Error carrying the
			// outcome, and LeaveFallback when the fallback ran.
			r.ran = nil
			rec := &recorder{}
			err = NewEngine(c, r, rec).Leave(context.Background(), h, hostkey.Credentials{})
			if (err == nil) != tc.wantOK {
				t.Fatalf("Leave: %v, want ok %v", err, tc.wantOK)
			}
			if err != nil {
				h := h.DeepCopy()
				RecordError(h, err, "by the zombie guard", metav1.Now())
				if c := h.StatusConditions().Get(v1beta1.ConditionLeaveFailed); c == nil || c.Reason != string(res.Result.Outcome) {
					t.Fatalf("LeaveFailed after %v: %+v, want reason %s", err, c, res.Result.Outcome)
				}
			}
			if got := len(rec.events) == 1 && rec.events[0].Reason == ReasonLeaveFallback; got != (tc.wantFallback != "") {
				t.Fatalf("events %+v, want LeaveFallback %v", rec.events, tc.wantFallback != "")
			}
		})
	}
}

func TestRecord(t *testing.T) {
	now := metav1.NewTime(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	h := testHost()
	failed := Result{Outcome: phase.Outcome{Result: engine.Result{Outcome: engine.Rejected, RC: 4, Message: "unknown op"}}, Fallback: "no install marker"}
	Record(h, failed, "under NodeClaim a", now)
	c := h.StatusConditions().Get(v1beta1.ConditionLeaveFailed)
	if !h.LeaveOwed() || c.Reason != "Rejected" || !strings.Contains(c.Message, "under NodeClaim a") || !strings.Contains(c.Message, "fallback leave Rejected (rc 4)") {
		t.Fatalf("condition %+v", c)
	}
	Record(h, Result{Outcome: phase.Outcome{Result: engine.Result{Outcome: engine.Succeeded}}}, "by the zombie guard", now)
	if h.LeaveOwed() || h.StatusConditions().Get(v1beta1.ConditionLeaveFailed) != nil {
		t.Fatalf("condition left after a leave succeeded: %+v", h.Status.Conditions)
	}
}
