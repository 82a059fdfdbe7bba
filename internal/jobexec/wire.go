package jobexec

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/dklesev/kpssh/internal/engine"
)

// The wire formats between the controller and the phase pod: the request
// (the inputs Secret's only key) and the result (the container's termination
// message). Explicit structs rather than engine types marshalled as they are:
// the format is versioned, and engine.Verified carries a clock (a func).

// WireVersion is the version of both formats; a pod of another version
// refuses the input, a controller of another version refuses the result.
const WireVersion = 1

// MaxTerminationMessage is what the kubelet keeps of a termination message.
const MaxTerminationMessage = 4096

// maxInput bounds a decoded input (a Secret holds at most 1 MiB anyway).
const maxInput = 1 << 20

type wireInput struct {
	Version int           `json:"version"`
	Phase   engine.Phase  `json:"phase"`
	Conn    wireConn      `json:"conn"`
	Source  wireSource    `json:"source"`
	Context wireContext   `json:"context"`
	Timeout time.Duration `json:"timeoutNs"`
	Redact  []string      `json:"redact,omitempty"`
	// Check: check mode (engine.Request.Check).
	Check bool `json:"check,omitempty"`
}

type wireConn struct {
	Address    string `json:"address"`
	Port       int32  `json:"port,omitempty"`
	User       string `json:"user,omitempty"`
	PrivateKey []byte `json:"privateKey"`
	HostKey    string `json:"hostKey"`
}

type wireSource struct {
	Script   string        `json:"script,omitempty"`
	Tasks    string        `json:"tasks,omitempty"`
	Role     string        `json:"role,omitempty"`
	Verified *wireVerified `json:"verified,omitempty"`
}

type wireVerified struct {
	Signature      string   `json:"signature"`
	Profile        string   `json:"profile,omitempty"`
	TrustedSigners []string `json:"trustedSigners,omitempty"`
	ShimCommand    string   `json:"shimCommand,omitempty"`
	// ProvisionedLeave: leave through the host's own fallback (no script).
	ProvisionedLeave bool `json:"provisionedLeave,omitempty"`
}

type wireContext struct {
	ClusterEndpoint string            `json:"clusterEndpoint,omitempty"`
	ClusterCAB64    string            `json:"clusterCAB64,omitempty"`
	BootstrapToken  string            `json:"bootstrapToken,omitempty"`
	NodeName        string            `json:"nodeName,omitempty"`
	ProviderID      string            `json:"providerID,omitempty"`
	HostAddress     string            `json:"hostAddress,omitempty"`
	NodeAddress     string            `json:"nodeAddress,omitempty"`
	NodeLabels      string            `json:"nodeLabels,omitempty"`
	Taints          string            `json:"taints,omitempty"`
	Vars            map[string]string `json:"vars,omitempty"`
	Secrets         map[string]string `json:"secrets,omitempty"`
}

// EncodeInput is the inputs Secret's content for req (the run key stays out:
// it names the Job, the pod does not need it).
func EncodeInput(req engine.Request) ([]byte, error) {
	if !req.Phase.Valid() {
		return nil, fmt.Errorf("unknown phase %q", req.Phase)
	}
	in := wireInput{
		Version: WireVersion,
		Phase:   req.Phase,
		Conn: wireConn{Address: req.Conn.Address, Port: req.Conn.Port, User: req.Conn.User,
			PrivateKey: req.Conn.PrivateKey, HostKey: req.Conn.HostKey},
		Source: wireSource{Script: req.Source.Script, Tasks: req.Source.Tasks, Role: req.Source.Role},
		Context: wireContext{ClusterEndpoint: req.Context.ClusterEndpoint, ClusterCAB64: req.Context.ClusterCAB64,
			BootstrapToken: req.Context.BootstrapToken, NodeName: req.Context.NodeName, ProviderID: req.Context.ProviderID,
			HostAddress: req.Context.HostAddress, NodeAddress: req.Context.NodeAddress, NodeLabels: req.Context.NodeLabels,
			Taints: req.Context.Taints, Vars: req.Context.Vars, Secrets: req.Context.Secrets},
		Timeout: req.Timeout,
		Redact:  req.Redact,
		Check:   req.Check,
	}
	if v := req.Source.Verified; v != nil {
		in.Source.Verified = &wireVerified{Signature: v.Signature, Profile: v.Profile, TrustedSigners: v.TrustedSigners, ShimCommand: v.ShimCommand, ProvisionedLeave: v.ProvisionedLeave}
	}
	b, err := json.Marshal(in)
	if err != nil {
		return nil, err
	}
	if len(b) > maxInput {
		return nil, fmt.Errorf("phase inputs are %d bytes, more than a Secret holds (%d)", len(b), maxInput)
	}
	return b, nil
}

// DecodeInput parses an inputs Secret's content back into a request.
func DecodeInput(b []byte) (engine.Request, error) {
	if len(b) > maxInput {
		return engine.Request{}, fmt.Errorf("input is %d bytes, over the %d byte bound", len(b), maxInput)
	}
	var in wireInput
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(&in); err != nil {
		// json's messages quote at most a type or field name, never values.
		return engine.Request{}, fmt.Errorf("input is not a kpssh phase request: %w", err)
	}
	if d.More() {
		return engine.Request{}, errors.New("input has trailing data after the request")
	}
	if in.Version != WireVersion {
		return engine.Request{}, fmt.Errorf("input version %d, this binary reads %d (controller and phase image differ)", in.Version, WireVersion)
	}
	if !in.Phase.Valid() {
		return engine.Request{}, fmt.Errorf("input phase %q is unknown", in.Phase)
	}
	if in.Timeout < 0 {
		return engine.Request{}, fmt.Errorf("input timeout %s is negative", in.Timeout)
	}
	req := engine.Request{
		Phase: in.Phase,
		Conn: engine.Connection{Address: in.Conn.Address, Port: in.Conn.Port, User: in.Conn.User,
			PrivateKey: in.Conn.PrivateKey, HostKey: in.Conn.HostKey},
		Source: engine.Source{Script: in.Source.Script, Tasks: in.Source.Tasks, Role: in.Source.Role},
		Context: engine.Context{ClusterEndpoint: in.Context.ClusterEndpoint, ClusterCAB64: in.Context.ClusterCAB64,
			BootstrapToken: in.Context.BootstrapToken, NodeName: in.Context.NodeName, ProviderID: in.Context.ProviderID,
			HostAddress: in.Context.HostAddress, NodeAddress: in.Context.NodeAddress, NodeLabels: in.Context.NodeLabels,
			Taints: in.Context.Taints, Vars: in.Context.Vars, Secrets: in.Context.Secrets},
		Timeout: in.Timeout,
		Redact:  in.Redact,
		Check:   in.Check,
	}
	if v := in.Source.Verified; v != nil {
		req.Source.Verified = &engine.Verified{Signature: v.Signature, Profile: v.Profile, TrustedSigners: v.TrustedSigners, ShimCommand: v.ShimCommand, ProvisionedLeave: v.ProvisionedLeave}
	}
	return req, nil
}

type wireResult struct {
	Version    int            `json:"v"`
	Outcome    engine.Outcome `json:"outcome"`
	DurationMs int64          `json:"durationMs,omitempty"`
	FailedTask string         `json:"failedTask,omitempty"`
	RC         int            `json:"rc,omitempty"`
	ExitCode   int            `json:"exitCode"`
	Message    string         `json:"message,omitempty"`
	Touched    bool           `json:"touched,omitempty"`
	// AnsibleVersion: the pod's ansible-core (bounded, for the same reason as the rest)
	AnsibleVersion string `json:"ansibleVersion,omitempty"`
	// Changes: the changed tasks (a check's verdict), their diffs if room.
	Changes []wireChange `json:"changes,omitempty"`
}

type wireChange struct {
	Task     string `json:"task"`
	Diff     string `json:"diff,omitempty"`
	Censored bool   `json:"censored,omitempty"`
}

// EncodeResult is the termination message of a finished phase: the
// (already redacted) result as JSON, never more than MaxTerminationMessage
// bytes. The changed tasks' diffs give way first (the last first), then the
// message is shortened (its start and end kept), then the failed task's
// name, then the changed tasks' names and number (down to one: whether a
// check found a change survives); outcome, codes and Touched always
// survive.
func EncodeResult(r engine.Result) []byte {
	w := wireResult{Version: WireVersion, Outcome: r.Outcome, DurationMs: r.Duration.Milliseconds(),
		FailedTask: r.FailedTask, RC: r.RC, ExitCode: r.ExitCode, Message: r.Message, Touched: r.Touched,
		AnsibleVersion: r.AnsibleVersion}
	if len(w.AnsibleVersion) > 64 {
		w.AnsibleVersion = w.AnsibleVersion[:64]
	}
	for _, c := range r.Changes {
		w.Changes = append(w.Changes, wireChange{Task: c.Task, Diff: c.Diff, Censored: c.Censored})
	}
	for i := len(w.Changes) - 1; i >= 0; i-- {
		if b, err := json.Marshal(w); err == nil && len(b) <= MaxTerminationMessage {
			break
		}
		w.Changes[i].Diff = ""
	}
	for {
		b, err := json.Marshal(w)
		if err != nil { // cannot happen for these field types
			b = []byte(fmt.Sprintf(`{"v":%d,"outcome":"Failed","exitCode":-1,"message":"encoding the result failed"}`, WireVersion))
		}
		if len(b) <= MaxTerminationMessage {
			return b
		}
		// JSON escaping can grow a byte up to six: scale by what is over.
		// The message gives way first, down to 512 bytes, then the task
		// name down to 256, then both further.
		scale := func(s string, floor int) string {
			return shorten(s, max(floor, int(float64(len(s))*float64(MaxTerminationMessage)/float64(len(b))*0.9)))
		}
		switch {
		case len(w.Message) > 512:
			w.Message = scale(w.Message, 512)
		case len(w.FailedTask) > 256:
			w.FailedTask = scale(w.FailedTask, 256)
		case len(w.Changes) > 1:
			w.Changes = w.Changes[:len(w.Changes)/2]
		case len(w.Changes) == 1 && len(w.Changes[0].Task) > 64:
			w.Changes[0].Task = shorten(w.Changes[0].Task, 64)
		case w.Message != "":
			w.Message = scale(w.Message, 0)
		case w.FailedTask != "":
			w.FailedTask = scale(w.FailedTask, 0)
		default:
			return b // unreachable: the rest is a few dozen bytes
		}
	}
}

// shorten cuts s to at most n bytes on rune boundaries, keeping a quarter
// from its start and the rest from its end (where errors usually are).
func shorten(s string, n int) string {
	if n <= 0 {
		return ""
	}
	if len(s) <= n {
		return s
	}
	const sep = " … "
	if n <= len(sep)+8 {
		return validPrefix(s, n)
	}
	head := validPrefix(s, (n-len(sep))/4)
	tail := s[len(s)-(n-len(sep)-len(head)):]
	for len(tail) > 0 && !utf8.RuneStart(tail[0]) {
		tail = tail[1:]
	}
	return head + sep + tail
}

func validPrefix(s string, n int) string {
	if n >= len(s) {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// ErrNoResult: the termination message holds no result of ours (empty, the
// tail of a crash's output, another version's).
var ErrNoResult = errors.New("no phase result in the termination message")

// ParseResult reads a termination message written by EncodeResult. It
// refuses anything else with an error wrapping ErrNoResult.
func ParseResult(msg string) (engine.Result, error) {
	msg = strings.TrimSpace(msg)
	if msg == "" {
		return engine.Result{}, fmt.Errorf("%w: it is empty", ErrNoResult)
	}
	if len(msg) > MaxTerminationMessage {
		return engine.Result{}, fmt.Errorf("%w: %d bytes, over the %d the kubelet keeps", ErrNoResult, len(msg), MaxTerminationMessage)
	}
	var w wireResult
	d := json.NewDecoder(strings.NewReader(msg))
	d.DisallowUnknownFields()
	if err := d.Decode(&w); err != nil {
		return engine.Result{}, fmt.Errorf("%w: %v", ErrNoResult, err)
	}
	if d.More() {
		return engine.Result{}, fmt.Errorf("%w: trailing data after the result", ErrNoResult)
	}
	if w.Version != WireVersion {
		return engine.Result{}, fmt.Errorf("%w: result version %d, want %d (controller and phase image differ)", ErrNoResult, w.Version, WireVersion)
	}
	switch w.Outcome {
	case engine.Succeeded, engine.Failed, engine.TimedOut, engine.ConfigError, engine.Rejected:
	default:
		return engine.Result{}, fmt.Errorf("%w: unknown outcome %q", ErrNoResult, w.Outcome)
	}
	if w.DurationMs < 0 || w.DurationMs > int64(365*24*time.Hour/time.Millisecond) {
		return engine.Result{}, fmt.Errorf("%w: duration %d ms out of range", ErrNoResult, w.DurationMs)
	}
	if !utf8.ValidString(w.Message) || !utf8.ValidString(w.FailedTask) || !utf8.ValidString(w.AnsibleVersion) {
		return engine.Result{}, fmt.Errorf("%w: invalid UTF-8", ErrNoResult)
	}
	if len(w.Changes) > engine.MaxChanges {
		return engine.Result{}, fmt.Errorf("%w: %d changed tasks, over %d", ErrNoResult, len(w.Changes), engine.MaxChanges)
	}
	r := engine.Result{Outcome: w.Outcome, Duration: time.Duration(w.DurationMs) * time.Millisecond,
		FailedTask: w.FailedTask, RC: w.RC, ExitCode: w.ExitCode, Message: w.Message, Touched: w.Touched,
		AnsibleVersion: w.AnsibleVersion}
	for _, c := range w.Changes {
		if !utf8.ValidString(c.Task) || !utf8.ValidString(c.Diff) {
			return engine.Result{}, fmt.Errorf("%w: invalid UTF-8", ErrNoResult)
		}
		r.Changes = append(r.Changes, engine.Change{Task: c.Task, Diff: c.Diff, Censored: c.Censored})
	}
	return r, nil
}
