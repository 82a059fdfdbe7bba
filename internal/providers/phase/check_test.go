package phase

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/engine"
)

// scriptedEngine answers each run by its phase and records the requests.
type scriptedEngine struct {
	res  map[engine.Phase]engine.Result
	reqs []engine.Request
}

func (s *scriptedEngine) Run(_ context.Context, req engine.Request) engine.Result {
	s.reqs = append(s.reqs, req)
	if r, ok := s.res[req.Phase]; ok {
		return r
	}
	return engine.Result{Outcome: engine.Succeeded, Touched: true}
}

func roleProfile() *v1beta1.SSHJoinProfile {
	return &v1beta1.SSHJoinProfile{Spec: v1beta1.SSHJoinProfileSpec{Version: "1", Ansible: &v1beta1.AnsibleSource{Role: "tls_bootstrap"},
		Timeouts: v1beta1.PhaseTimeouts{Install: "7m", Join: "3m"}}}
}

func TestCheckVerdicts(t *testing.T) {
	withCheck := testProfile()
	withCheck.Spec.Scripts.Check = "test -f /etc/x || exit 1"
	unreachable := engine.Result{Outcome: engine.Failed, FailedTask: "kpssh: connect", Message: "host unreachable; nothing ran"}
	changed := func(task, diff string) engine.Result {
		return engine.Result{Outcome: engine.Succeeded, Touched: true, Changes: []engine.Change{{Task: task, Diff: diff}}}
	}
	for _, tc := range []struct {
		name       string
		prof       *v1beta1.SSHJoinProfile
		hostKeyErr error
		res        map[engine.Phase]engine.Result
		want       v1beta1.HostDriftResult
		runs       []engine.Phase
		tasks      []string
		inMsg      string
	}{
		{name: "role: nothing would change → InSync", prof: roleProfile(), want: v1beta1.DriftInSync,
			runs: []engine.Phase{engine.PhaseInstall, engine.PhaseJoin}},
		{name: "role: join would change a file → Drifted, tasks named by phase", prof: roleProfile(),
			res:  map[engine.Phase]engine.Result{engine.PhaseJoin: changed("Write the kubelet configuration", "--- /var/lib/kubelet/config.yaml")},
			want: v1beta1.DriftDrifted, runs: []engine.Phase{engine.PhaseInstall, engine.PhaseJoin}, tasks: []string{"join: Write the kubelet configuration"}},
		{name: "role: install and join both would change", prof: roleProfile(),
			res:  map[engine.Phase]engine.Result{engine.PhaseInstall: changed("binaries", ""), engine.PhaseJoin: changed("units", "")},
			want: v1beta1.DriftDrifted, runs: []engine.Phase{engine.PhaseInstall, engine.PhaseJoin}, tasks: []string{"install: binaries", "join: units"}},
		{name: "role: host unreachable at install → Unreachable, join not run", prof: roleProfile(),
			res:  map[engine.Phase]engine.Result{engine.PhaseInstall: unreachable},
			want: v1beta1.DriftUnreachable, runs: []engine.Phase{engine.PhaseInstall}, inMsg: "check mode: install Failed"},
		{name: "role: dial fails before the engine → Unreachable", prof: roleProfile(), hostKeyErr: errors.New("dial tcp: connection refused"),
			want: v1beta1.DriftUnreachable, inMsg: "connection refused"},
		{name: "role: a task fails in check mode → Failed, not drift", prof: roleProfile(),
			res:  map[engine.Phase]engine.Result{engine.PhaseJoin: {Outcome: engine.Failed, Touched: true, FailedTask: "assert", Message: "x is undefined"}},
			want: v1beta1.DriftFailed, runs: []engine.Phase{engine.PhaseInstall, engine.PhaseJoin}, inMsg: "x is undefined"},
		{name: "role: timeout after reaching → Failed", prof: roleProfile(),
			res:  map[engine.Phase]engine.Result{engine.PhaseInstall: {Outcome: engine.TimedOut, Touched: true}},
			want: v1beta1.DriftFailed, runs: []engine.Phase{engine.PhaseInstall}},
		{name: "scripts without check → Unsupported, nothing run", prof: testProfile(), want: v1beta1.DriftUnsupported, inMsg: "without scripts.check"},
		{name: "check script exit 0 → InSync", prof: withCheck, want: v1beta1.DriftInSync, runs: []engine.Phase{engine.PhaseCheck}},
		{name: "check script exit 1 → Drifted with its output", prof: withCheck,
			res: map[engine.Phase]engine.Result{engine.PhaseCheck: {Outcome: engine.Failed, Touched: true, RC: 1, FailedTask: "kpssh: check script",
				Message: `task "kpssh: check script" failed (rc=1): stderr: /etc/x is missing`}},
			want: v1beta1.DriftDrifted, runs: []engine.Phase{engine.PhaseCheck}, tasks: []string{"kpssh: check script"}},
		{name: "check script exit 1 through a Verified host's shim → Drifted", prof: withCheck,
			res: map[engine.Phase]engine.Result{engine.PhaseCheck: {Outcome: engine.Failed, Touched: true, RC: engine.ShimScriptFailed, FailedTask: "kpssh: check script",
				Message: "shim exit 10 (script failed): task \"kpssh: check script\" failed (rc=10): stderr: /etc/x is missing\nkpssh-shim: script exited 1"}},
			want: v1beta1.DriftDrifted, runs: []engine.Phase{engine.PhaseCheck}, tasks: []string{"kpssh: check script"}},
		{name: "check script exit 3 → Failed", prof: withCheck,
			res:  map[engine.Phase]engine.Result{engine.PhaseCheck: {Outcome: engine.Failed, Touched: true, RC: 3, FailedTask: "kpssh: check script", Message: "boom"}},
			want: v1beta1.DriftFailed, runs: []engine.Phase{engine.PhaseCheck}, inMsg: "boom"},
		{name: "check script: shim exit 10 for exit 12 → Failed", prof: withCheck,
			res: map[engine.Phase]engine.Result{engine.PhaseCheck: {Outcome: engine.Failed, Touched: true, RC: engine.ShimScriptFailed, FailedTask: "kpssh: check script",
				Message: "shim exit 10 (script failed): kpssh-shim: script exited 12"}},
			want: v1beta1.DriftFailed, runs: []engine.Phase{engine.PhaseCheck}},
		{name: "check script: host unreachable (rc 1 is not the script's) → Unreachable", prof: withCheck,
			res:  map[engine.Phase]engine.Result{engine.PhaseCheck: {Outcome: engine.Failed, RC: 1, FailedTask: "kpssh: connect", Message: "connect check failed on the host (rc=1)"}},
			want: v1beta1.DriftUnreachable, runs: []engine.Phase{engine.PhaseCheck}},
		{name: "check script refused by the shim → Failed", prof: withCheck,
			res:  map[engine.Phase]engine.Result{engine.PhaseCheck: {Outcome: engine.Rejected, Touched: true, RC: engine.ShimUnknownPhase}},
			want: v1beta1.DriftFailed, runs: []engine.Phase{engine.PhaseCheck}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := &scriptedEngine{res: tc.res}
			r, rec := runner(t, &fakeEngine{}, tc.hostKeyErr)
			r.Engine = e
			// the caller's context: join's, without a token
			c := engine.Context{NodeName: "h1", Vars: map[string]string{"k8sMinor": "1.36"}}
			d := r.Check(context.Background(), host("SHA256:x"), tc.prof, c, []string{"s3cr3t-value"})
			if d.Result != tc.want {
				t.Fatalf("result %s, want %s (%+v)", d.Result, tc.want, d)
			}
			var ran []engine.Phase
			for _, req := range e.reqs {
				ran = append(ran, req.Phase)
				if req.Phase == engine.PhaseCheck {
					if req.Check || req.Source.Script == "" || req.Timeout != 2*time.Minute {
						t.Errorf("check script run %+v: want a plain script run bounded by 2m", req)
					}
				} else {
					if !req.Check || req.Source.Role != "tls_bootstrap" || req.Key != "" {
						t.Errorf("%s: want a check-mode role run without a run key, got %+v", req.Phase, req)
					}
					if want := map[engine.Phase]float64{engine.PhaseInstall: 420, engine.PhaseJoin: 180}[req.Phase]; req.Timeout.Seconds() != want {
						t.Errorf("%s: timeout %s, want the phase's own", req.Phase, req.Timeout)
					}
				}
				if req.Context.BootstrapToken != "" || len(req.Redact) != 1 {
					t.Errorf("%s: context %+v redact %v", req.Phase, req.Context, req.Redact)
				}
			}
			if strings.Join(phaseNames(ran), ",") != strings.Join(phaseNames(tc.runs), ",") {
				t.Errorf("ran %v, want %v", ran, tc.runs)
			}
			var tasks []string
			for _, ch := range d.Changes {
				tasks = append(tasks, ch.Task)
			}
			if strings.Join(tasks, "|") != strings.Join(tc.tasks, "|") {
				t.Errorf("changed tasks %q, want %q", tasks, tc.tasks)
			}
			if !strings.Contains(d.Message, tc.inMsg) {
				t.Errorf("message %q lacks %q", d.Message, tc.inMsg)
			}
			if len(rec.evs) != 0 {
				t.Errorf("a check published %d events (a check is not a phase)", len(rec.evs))
			}
		})
	}
}

func phaseNames(ps []engine.Phase) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = string(p)
	}
	return out
}

// A check is not a phase: it leaves kpssh_instance_phase_duration_seconds alone.
func TestCheckRecordsNoPhaseMetric(t *testing.T) {
	before := samples(t, "install", "Succeeded", "")
	r, _ := runner(t, &fakeEngine{}, nil)
	r.Engine = &scriptedEngine{}
	if d := r.Check(context.Background(), host("SHA256:x"), roleProfile(), engine.Context{}, nil); d.Result != v1beta1.DriftInSync {
		t.Fatalf("%+v", d)
	}
	if after := samples(t, "install", "Succeeded", ""); after != before {
		t.Fatalf("phase histogram count %d → %d after a check", before, after)
	}
}
