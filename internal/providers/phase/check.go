package phase

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/engine"
	"github.com/dklesev/kpssh/internal/profile"
)

// Drift is the result of one drift check of a joined host.
type Drift struct {
	Result v1beta1.HostDriftResult
	// Changes: what would change (Drifted), redacted.
	Changes []engine.Change
	// Message: why a check could not decide (Unreachable, Failed,
	// Unsupported), redacted.
	Message  string
	Duration time.Duration
}

// Check runs the drift check of profile p on the joined host h with the
// context install and join get (c, without a token): a role or task
// profile's install and join in check mode (--check --diff; join with
// engine.CheckModeToken), a script profile's scripts.check. Nothing is
// recorded on the host and no phase metric, lastPhase or PhaseFailed event
// is written: a check is not a phase.
func (r *Runner) Check(ctx context.Context, h *v1beta1.SSHHost, p *v1beta1.SSHJoinProfile, c engine.Context, redact []string) Drift {
	start := r.Now()
	d := r.check(ctx, h, p, c, redact)
	d.Duration = r.Now().Sub(start)
	return d
}

func (r *Runner) check(ctx context.Context, h *v1beta1.SSHHost, p *v1beta1.SSHJoinProfile, c engine.Context, redact []string) Drift {
	if p == nil {
		return Drift{Result: v1beta1.DriftFailed, Message: "no join profile"}
	}
	if p.Spec.Scripts != nil {
		if _, ok := profile.Source(p, engine.PhaseCheck); !ok {
			return Drift{Result: v1beta1.DriftUnsupported, Message: fmt.Sprintf("join profile %s is a scripts profile without scripts.check: its hosts cannot be checked for drift", p.Name)}
		}
		return scriptDrift(r.run(ctx, h, engine.PhaseCheck, profileRequest(h, p, engine.PhaseCheck, c, redact), nil, false))
	}
	var out Drift
	for _, ph := range []engine.Phase{engine.PhaseInstall, engine.PhaseJoin} {
		res := r.run(ctx, h, ph, profileRequest(h, p, ph, c, redact), nil, true)
		if res.Outcome != engine.Succeeded {
			return inconclusive(ph, res)
		}
		for _, ch := range res.Changes {
			ch.Task = string(ph) + ": " + ch.Task
			out.Changes = append(out.Changes, ch)
		}
	}
	out.Result = v1beta1.DriftInSync
	if len(out.Changes) > 0 {
		out.Result = v1beta1.DriftDrifted
	}
	return out
}

// scriptDrift maps a check script's run: exit 0 in sync, exit 1 drifted
// (its output tail says how), anything else undecided. On a Verified host
// the shim exits 10 for any failing script and says with what status.
func scriptDrift(res engine.Result) Drift {
	if res.Outcome == engine.Succeeded {
		return Drift{Result: v1beta1.DriftInSync}
	}
	exit1 := res.RC == 1 ||
		res.RC == engine.ShimScriptFailed && strings.HasSuffix(strings.TrimSpace(res.Message), "kpssh-shim: script exited 1")
	if res.Outcome == engine.Failed && res.Touched && exit1 && res.FailedTask != connectTask {
		return Drift{Result: v1beta1.DriftDrifted, Changes: []engine.Change{{Task: res.FailedTask, Diff: scriptOutput(res.Message)}}}
	}
	return inconclusive(engine.PhaseCheck, res)
}

// connectTask is the engine's connect check (engine's connectTaskName).
const connectTask = "kpssh: connect"

// scriptOutput is the output part of a failed script's message ("task … failed
// (rc=1): stderr: …").
func scriptOutput(msg string) string {
	for _, k := range []string{"): stderr: ", "): stdout: "} {
		if i := strings.Index(msg, k); i >= 0 {
			return msg[i+3:]
		}
	}
	return msg
}

// inconclusive: the run could not say. A host never reached is
// Unreachable, never drift.
func inconclusive(ph engine.Phase, res engine.Result) Drift {
	r := v1beta1.DriftFailed
	if !res.Touched && (res.Outcome == engine.Failed || res.Outcome == engine.TimedOut) {
		r = v1beta1.DriftUnreachable
	}
	msg := Summary(ph, res)
	if ph != engine.PhaseCheck {
		msg = "check mode: " + msg
	}
	return Drift{Result: r, Message: Truncate(msg, 1024)}
}
