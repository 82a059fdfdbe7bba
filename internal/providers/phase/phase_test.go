package phase

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/karpenter/pkg/events"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/engine"
	"github.com/dklesev/kpssh/internal/providers/hostkey"
	"github.com/dklesev/kpssh/internal/sshx/sshtest"
)

type fakeEngine struct {
	req engine.Request
	res engine.Result
	n   int
}

func (f *fakeEngine) Run(_ context.Context, req engine.Request) engine.Result {
	f.n++
	f.req = req
	return f.res
}

type recorder struct{ evs []events.Event }

func (r *recorder) Publish(evs ...events.Event) { r.evs = append(r.evs, evs...) }

func host(fp string) *v1beta1.SSHHost {
	return &v1beta1.SSHHost{
		ObjectMeta: metav1.ObjectMeta{Name: "h1", Namespace: "pool", UID: "u1"},
		Spec:       v1beta1.SSHHostSpec{Address: "10.0.0.5", Port: 2222, User: "admin", SSHKeySecretRef: v1beta1.LocalObjectReference{Name: "key"}},
		Status:     v1beta1.SSHHostStatus{HostKeyFingerprint: fp},
	}
}

func testProfile() *v1beta1.SSHJoinProfile {
	return &v1beta1.SSHJoinProfile{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: v1beta1.SSHJoinProfileSpec{Version: "1",
		Scripts:  &v1beta1.ProfileScripts{Install: "i", Join: "j", Leave: "l"},
		Timeouts: v1beta1.PhaseTimeouts{Join: "90s"}}}
}

func runner(t *testing.T, e *fakeEngine, hostKeyErr error) (*Runner, *recorder) {
	t.Helper()
	_, pem := sshtest.NewKey(t)
	c := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(&corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: "pool", Name: "key"}, Data: map[string][]byte{"privateKey": pem}}).Build()
	rec := &recorder{}
	r := New(e, hostkey.New(c), rec)
	r.HostKey = func(_ context.Context, conn engine.Connection, fp string) (string, error) {
		if conn.Address != "10.0.0.5" || conn.Port != 2222 || conn.User != "admin" || len(conn.PrivateKey) == 0 {
			t.Errorf("host key fetch got connection %+v", conn)
		}
		return "ssh-ed25519 AAAAkey", hostKeyErr
	}
	return r, rec
}

func TestRunBuildsRequestAndRecords(t *testing.T) {
	e := &fakeEngine{res: engine.Result{Outcome: engine.Succeeded, Duration: 1500 * time.Millisecond}}
	r, rec := runner(t, e, nil)
	out := r.Run(context.Background(), host("SHA256:x"), testProfile(), engine.PhaseJoin, engine.Context{NodeName: "h1"}, []string{"s3cr3t-value"})
	if !out.OK() || e.n != 1 {
		t.Fatalf("outcome %+v runs %d", out, e.n)
	}
	if e.req.Conn.HostKey != "ssh-ed25519 AAAAkey" || e.req.Source.Script != "j" || e.req.Timeout != 90*time.Second || e.req.Redact[0] != "s3cr3t-value" {
		t.Fatalf("request %+v", e.req)
	}
	if out.LastPhase.Result != v1beta1.PhaseSucceeded || out.LastPhase.Phase != v1beta1.PhaseJoin || out.LastPhase.Duration.Duration != 1500*time.Millisecond {
		t.Fatalf("lastPhase %+v", out.LastPhase)
	}
	if len(rec.evs) != 0 {
		t.Fatal("event for a success")
	}
}

func TestRunVerdicts(t *testing.T) {
	for _, tc := range []struct {
		name       string
		fp         string
		hostKeyErr error
		res        engine.Result
		prof       *v1beta1.SSHJoinProfile
		ph         engine.Phase
		want       engine.Outcome
		wantResult v1beta1.PhaseResult
		hostSide   bool
		runs       int
	}{
		{name: "no pinned key → config error, nothing run", fp: "", want: engine.ConfigError, wantResult: v1beta1.PhaseRejected, ph: engine.PhaseJoin},
		{name: "host key mismatch / dial error → Failed (host side)", fp: "SHA256:x", hostKeyErr: errors.New("host key mismatch"), want: engine.Failed, wantResult: v1beta1.PhaseFailed, hostSide: true, ph: engine.PhaseJoin},
		{name: "profile without the phase → config error", fp: "SHA256:x", ph: engine.PhaseUninstall, want: engine.ConfigError, wantResult: v1beta1.PhaseRejected},
		{name: "no profile → config error", fp: "SHA256:x", ph: engine.PhaseLeave, prof: &v1beta1.SSHJoinProfile{}, want: engine.ConfigError, wantResult: v1beta1.PhaseRejected},
		{name: "engine failure", fp: "SHA256:x", ph: engine.PhaseJoin, res: engine.Result{Outcome: engine.Failed, FailedTask: "kubelet", RC: 3, Message: "boom"},
			want: engine.Failed, wantResult: v1beta1.PhaseFailed, hostSide: true, runs: 1},
		{name: "engine timeout", fp: "SHA256:x", ph: engine.PhaseJoin, res: engine.Result{Outcome: engine.TimedOut},
			want: engine.TimedOut, wantResult: v1beta1.PhaseTimedOut, hostSide: true, runs: 1},
		{name: "engine config error", fp: "SHA256:x", ph: engine.PhaseJoin, res: engine.Result{Outcome: engine.ConfigError, Message: "role x not found"},
			want: engine.ConfigError, wantResult: v1beta1.PhaseRejected, runs: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := &fakeEngine{res: tc.res}
			r, rec := runner(t, e, tc.hostKeyErr)
			p := tc.prof
			if p == nil {
				p = testProfile()
			} else if p.Name == "" {
				p = nil
			}
			out := r.Run(context.Background(), host(tc.fp), p, tc.ph, engine.Context{}, nil)
			if out.Outcome != tc.want || out.LastPhase.Result != tc.wantResult || out.HostSide() != tc.hostSide || e.n != tc.runs {
				t.Fatalf("outcome %s lastPhase %s hostSide %v runs %d", out.Outcome, out.LastPhase.Result, out.HostSide(), e.n)
			}
			if len(rec.evs) != 1 || rec.evs[0].Reason != ReasonPhaseFailed {
				t.Fatalf("events %+v", rec.evs)
			}
		})
	}
}

func TestSummaryAndRecordBounds(t *testing.T) {
	s := Summary(engine.PhaseJoin, engine.Result{Outcome: engine.Failed, FailedTask: "start kubelet", RC: 1, Message: "unit failed"})
	if s != `join Failed at task "start kubelet" (rc 1): unit failed` {
		t.Fatalf("summary %q", s)
	}
	long := strings.Repeat("é", 5000)
	lp := Record(engine.PhaseJoin, engine.Result{Outcome: engine.Failed, FailedTask: long, Message: long}, time.Now())
	if len(lp.FailedTask) > 1024 || len(lp.Message) > 4096 || !strings.HasSuffix(lp.Message, "é") {
		t.Fatalf("bounds: task %d message %d", len(lp.FailedTask), len(lp.Message))
	}
	if len(Summary(engine.PhaseJoin, engine.Result{Message: long})) > 1024 {
		t.Fatal("summary unbounded")
	}
}

func samples(t *testing.T, ph, outcome, profile string) uint64 {
	t.Helper()
	m := &dto.Metric{}
	if err := PhaseDuration.WithLabelValues(ph, outcome, profile).(prometheus.Histogram).Write(m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount()
}

// kpssh_instance_phase_duration_seconds{phase,outcome,profile}: the run's
// profile by name, and nothing else (another profile's series is untouched).
func TestPhaseDurationMetric(t *testing.T) {
	e := &fakeEngine{res: engine.Result{Outcome: engine.Failed, Duration: 2 * time.Second}}
	r, _ := runner(t, e, nil)
	before, other := samples(t, "install", "Failed", "p"), samples(t, "install", "Failed", "other")
	r.Run(context.Background(), host("SHA256:x"), testProfile(), engine.PhaseInstall, engine.Context{}, nil)
	if got := samples(t, "install", "Failed", "p"); got != before+1 {
		t.Fatalf("kpssh_instance_phase_duration_seconds{install,Failed,p} samples %d → %d", before, got)
	}
	if got := samples(t, "install", "Failed", "other"); got != other {
		t.Fatalf("another profile's series moved: %d → %d", other, got)
	}
}

// kpssh_instance_shim_rejections_total counts shim refusals (rc 2–5) by
// reason, from 0; a failed script behind the shim (rc 10) is not one.
func TestShimRejectionsMetric(t *testing.T) {
	count := func(ph, reason string) float64 {
		m := &dto.Metric{}
		if err := ShimRejections.WithLabelValues(ph, reason).Write(m); err != nil {
			t.Fatal(err)
		}
		return m.GetCounter().GetValue()
	}
	for _, tc := range []struct {
		res    engine.Result
		reason string
		counts bool
	}{
		{engine.Result{Outcome: engine.Rejected, RC: engine.ShimBadSignature}, "SignatureRejected", true},
		{engine.Result{Outcome: engine.Rejected, RC: engine.ShimBadParam}, "BadParam", true},
		{engine.Result{Outcome: engine.Rejected, RC: engine.ShimMalformed}, "MalformedEnvelope", true},
		{engine.Result{Outcome: engine.Rejected, RC: engine.ShimUnknownPhase}, "UnknownPhase", true},
		{engine.Result{Outcome: engine.Failed, RC: engine.ShimScriptFailed}, "SignatureRejected", false},
	} {
		r, _ := runner(t, &fakeEngine{res: tc.res}, nil)
		before := count("join", tc.reason)
		r.Run(context.Background(), host("SHA256:x"), testProfile(), engine.PhaseJoin, engine.Context{}, nil)
		want := before
		if tc.counts {
			want++
		}
		if got := count("join", tc.reason); got != want {
			t.Errorf("rc %d: kpssh_instance_shim_rejections_total{join,%s} %v → %v, want %v", tc.res.RC, tc.reason, before, got, want)
		}
	}
}
