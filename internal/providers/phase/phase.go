// Package phase runs one join-profile phase on one SSHHost: it turns the
// Kubernetes objects (host, profile, credentials) into a plain engine
// request, runs it, and records the outcome on the host (status.lastPhase,
// a PhaseFailed event, kpssh_instance_phase_duration_seconds). It is the
// only place where the API types meet the engine; the cloud provider calls
// it and knows nothing of playbooks, and the engine knows nothing of hosts.
// While a phase runs, each task that ends is logged (V(1)) and a claimed
// host's lastPhase shows the phase Running at its current task (progress.go).
package phase

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	"sigs.k8s.io/karpenter/pkg/events"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/engine"
	"github.com/dklesev/kpssh/internal/profile"
	"github.com/dklesev/kpssh/internal/providers/hostkey"
)

// ReasonPhaseFailed is the SSHHost event of a failed phase.
const ReasonPhaseFailed = "PhaseFailed"

// Runner runs phases on hosts.
type Runner struct {
	Engine engine.Engine
	Keys   hostkey.Provider
	// HostKey turns the pinned fingerprint into the key line known_hosts
	// needs (status keeps only the fingerprint); engine.FetchHostKey.
	HostKey  func(ctx context.Context, conn engine.Connection, fingerprint string) (string, error)
	Recorder events.Recorder
	Now      func() time.Time
	// Status, when set, shows a phase that runs longer than
	// ProgressInterval in the claimed host's status.lastPhase (Running, the
	// current task) until its end is recorded (*pool.Pool).
	Status StatusWriter
	// ProgressInterval paces those writes (0: DefaultProgressInterval).
	ProgressInterval time.Duration
	// Clock times them (nil: the real clock).
	Clock clock.Clock
}

// New returns a Runner with the default host-key fetcher and clock.
func New(e engine.Engine, keys hostkey.Provider, rec events.Recorder) *Runner {
	return &Runner{Engine: e, Keys: keys, HostKey: engine.FetchHostKey, Recorder: rec, Now: time.Now}
}

// Outcome is a phase result plus the lastPhase record for the host.
type Outcome struct {
	engine.Result
	LastPhase *v1beta1.LastPhase
}

// OK reports success.
func (o Outcome) OK() bool { return o.Outcome == engine.Succeeded }

// HostSide reports whether the failure is the host's (→ Unhealthy) rather
// than configuration found before the host was touched (→ Available).
func (o Outcome) HostSide() bool {
	// Unreachable counts as the host's problem too (SPEC: unreachable →
	// Unhealthy); only config errors release the host Available.
	return o.Outcome != engine.ConfigError && o.Outcome != engine.Succeeded
}

// ShimRefused reports whether a Verified host's shim refused the phase
// (exit 2–5: signature, param, envelope, phase) — nothing of it ran, and
// running it again unchanged is refused again.
func (o Outcome) ShimRefused() bool {
	return o.Outcome == engine.Rejected && o.RC >= engine.ShimBadSignature && o.RC <= engine.ShimUnknownPhase
}

// Connection builds the engine connection for a host; keyLine is the pinned
// host key line.
func Connection(h *v1beta1.SSHHost, creds hostkey.Credentials, keyLine string) engine.Connection {
	return engine.Connection{
		Address:    h.Spec.Address,
		Port:       h.Spec.Port,
		User:       h.Spec.User,
		PrivateKey: creds.PrivateKey,
		HostKey:    keyLine,
	}
}

// Request builds the engine request for phase ph of profile p on host h. A
// Verified host gets the signed script for the shim, its signature checked
// here in Go, so that a missing or untrusted one is an error before anything
// connects.
func Request(h *v1beta1.SSHHost, p *v1beta1.SSHJoinProfile, ph engine.Phase, conn engine.Connection, c engine.Context, redact []string) (engine.Request, error) {
	if p == nil {
		return engine.Request{}, fmt.Errorf("no join profile for %s", ph)
	}
	var src engine.Source
	if h.Spec.ExecMode == v1beta1.ExecModeVerified {
		var err error
		if src, err = profile.VerifiedSource(p, ph, h); err == nil {
			err = engine.VerifyParams(ph, src, c)
		}
		if err != nil {
			return engine.Request{}, fmt.Errorf("execMode Verified: %w", err)
		}
	} else {
		var ok bool
		if src, ok = profile.Source(p, ph); !ok {
			return engine.Request{}, fmt.Errorf("join profile %q has no %s phase", p.Name, ph)
		}
	}
	return engine.Request{Phase: ph, Conn: conn, Source: src, Context: c, Timeout: profile.Timeout(p, ph), Redact: redact}, nil
}

// FallbackLeaveProfile names the fallback leave in metrics and messages.
const FallbackLeaveProfile = "kpssh-fallback-leave"

// FallbackLeaveRequest is the leave of a host with no profile leave to run:
// engine.FallbackLeaveScript on a Raw host; on a Verified host the leave its
// provisioning installed, run by the shim (the controller holds no signed
// script for it, and sends none).
func FallbackLeaveRequest(h *v1beta1.SSHHost, conn engine.Connection, c engine.Context) engine.Request {
	src := engine.Source{Script: engine.FallbackLeaveScript}
	if h.Spec.ExecMode == v1beta1.ExecModeVerified {
		src = engine.Source{Verified: &engine.Verified{ProvisionedLeave: true, ShimCommand: h.Spec.ShimCommand}}
	}
	return engine.Request{Phase: engine.PhaseLeave, Conn: conn, Source: src, Context: c, Timeout: profile.DefaultLeaveTimeout}
}

// Run runs phase ph of profile p on host h. It never returns an error: every
// failure is an Outcome (ConfigError when nothing reached the host).
func (r *Runner) Run(ctx context.Context, h *v1beta1.SSHHost, p *v1beta1.SSHJoinProfile, ph engine.Phase, c engine.Context, redact []string) Outcome {
	return r.runPhase(ctx, h, ph, profileName(p), profileRequest(h, p, ph, c, redact))
}

// profileRequest builds phase ph of profile p (Request).
func profileRequest(h *v1beta1.SSHHost, p *v1beta1.SSHJoinProfile, ph engine.Phase, c engine.Context, redact []string) requestFunc {
	return func(conn engine.Connection) (engine.Request, error) { return Request(h, p, ph, conn, c, redact) }
}

// RunFallbackLeave runs FallbackLeaveRequest on host h, like Run.
func (r *Runner) RunFallbackLeave(ctx context.Context, h *v1beta1.SSHHost, c engine.Context) Outcome {
	return r.runPhase(ctx, h, engine.PhaseLeave, FallbackLeaveProfile, func(conn engine.Connection) (engine.Request, error) {
		return FallbackLeaveRequest(h, conn, c), nil
	})
}

func (r *Runner) runPhase(ctx context.Context, h *v1beta1.SSHHost, ph engine.Phase, prof string, build requestFunc) Outcome {
	start := r.Now()
	pr := r.newProgress(ctx, h, ph, start)
	res := r.run(ctx, h, ph, build, pr.observe, false)
	// Before the outcome goes back: the caller's lastPhase write is the last.
	pr.stop()
	if res.Duration == 0 {
		res.Duration = r.Now().Sub(start)
	}
	PhaseDuration.WithLabelValues(string(ph), string(res.Outcome), prof).Observe(res.Duration.Seconds())
	o := Outcome{Result: res, LastPhase: Record(ph, res, start)}
	if o.ShimRefused() {
		ShimRejections.WithLabelValues(string(ph), v1beta1.ShimRejectionReason(int32(res.RC))).Inc()
	}
	if !o.OK() && r.Recorder != nil {
		r.Recorder.Publish(phaseFailed(h, ph, res))
	}
	return o
}

// requestFunc builds a phase's engine request for a connection (no host
// key yet); an error is a config error.
type requestFunc func(conn engine.Connection) (engine.Request, error)

// run runs one phase (progress, when set, sees its tasks); check: in check
// mode, as a fresh run (no run key).
func (r *Runner) run(ctx context.Context, h *v1beta1.SSHHost, ph engine.Phase, build requestFunc, progress func(engine.TaskProgress), check bool) engine.Result {
	creds, err := r.Keys.Get(ctx, h)
	if err != nil {
		return configResult(err)
	}
	if creds.PinnedFingerprint == "" {
		// Never trust on first use inside a phase: the probe pins first.
		return configResult(fmt.Errorf("host %s has no pinned host key yet (not probed)", h.Name))
	}
	// Built before the host-key fetch, which dials.
	req, err := build(Connection(h, creds, ""))
	if err != nil {
		return configResult(err)
	}
	line, err := r.HostKey(ctx, req.Conn, creds.PinnedFingerprint)
	if err != nil {
		// Not reached: the dial or the host-key check failed. A host problem.
		return engine.Result{Outcome: engine.Failed, ExitCode: -1, Message: engine.NewRedactor(req.Redact...).Redact("connect: " + err.Error())}
	}
	req.Conn.HostKey = line
	req.Check = check
	if !check {
		req.Key = RunKey(h, ph)
	}
	req.Progress = progress
	return r.Engine.Run(ctx, req)
}

// RunKey identifies a phase run for executors that re-attach (executor
// job): host, phase and the holding claim's UID. Without a claim (a zombie
// leave) it is empty: such runs are never resumed, each one is fresh.
func RunKey(h *v1beta1.SSHHost, ph engine.Phase) string {
	if h.Status.ClaimRef == nil || h.Status.ClaimRef.UID == "" {
		return ""
	}
	k := h.Namespace + "/" + h.Name + "/" + string(ph) + "/" + string(h.Status.ClaimRef.UID)
	if r := h.Status.Reboot; ph == engine.PhaseReboot && r != nil {
		// A claim may be rebooted more than once: one run per operation.
		k += "/" + r.OperationID
	}
	return k
}

// profileName is the profile label of the phase histogram: bounded by the
// cluster's SSHJoinProfiles (and leave's fallback).
func profileName(p *v1beta1.SSHJoinProfile) string {
	if p == nil {
		return ""
	}
	return p.Name
}

func configResult(err error) engine.Result {
	return engine.Result{Outcome: engine.ConfigError, ExitCode: -1, Message: err.Error()}
}

// Record is the status.lastPhase entry of a run.
func Record(ph engine.Phase, res engine.Result, start time.Time) *v1beta1.LastPhase {
	lp := &v1beta1.LastPhase{
		Phase:      v1beta1.Phase(ph),
		StartedAt:  metav1.NewTime(start),
		Duration:   metav1.Duration{Duration: res.Duration.Round(time.Millisecond)},
		FailedTask: Truncate(res.FailedTask, 1024),
		Message:    Truncate(res.Message, 4096),
	}
	switch res.Outcome {
	case engine.Succeeded:
		lp.Result = v1beta1.PhaseSucceeded
	case engine.TimedOut:
		lp.Result = v1beta1.PhaseTimedOut
	case engine.Rejected:
		// a Verified host's shim refused the phase
		lp.Result = v1beta1.PhaseRejected
	case engine.ConfigError:
		// The API's word for "refused before running" (config errors, and
		// in Verified mode rejected signatures).
		lp.Result = v1beta1.PhaseRejected
	default:
		lp.Result = v1beta1.PhaseFailed
	}
	return lp
}

// Truncate cuts s to at most n bytes, on a rune boundary.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	// Cut on a rune boundary.
	for n > 0 && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n]
}

// Summary is a one-line description of a failed outcome for events and
// conditions (already redacted by the engine).
func Summary(ph engine.Phase, res engine.Result) string {
	s := fmt.Sprintf("%s %s", ph, res.Outcome)
	if res.FailedTask != "" {
		s += fmt.Sprintf(" at task %q", res.FailedTask)
	}
	if res.RC != 0 {
		s += fmt.Sprintf(" (rc %d)", res.RC)
	}
	if res.Message != "" {
		s += ": " + res.Message
	}
	return Truncate(s, 1024)
}

func phaseFailed(h *v1beta1.SSHHost, ph engine.Phase, res engine.Result) events.Event {
	return events.Event{InvolvedObject: h, Type: corev1.EventTypeWarning, Reason: ReasonPhaseFailed,
		Message:      Summary(ph, res),
		DedupeValues: []string{string(h.UID), string(ph), string(res.Outcome), res.FailedTask}}
}
