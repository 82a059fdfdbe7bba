// Package engine runs one join-profile phase (install, join, leave,
// uninstall) on one host as an ansible-playbook run, and maps the run back to
// an outcome. It knows nothing about Kubernetes: the caller resolves hosts,
// profiles, secrets and tokens and hands in plain values.
//
// A run renders a private directory (0700, on tmpfs when available) holding a
// one-host inventory, the SSH key, a known_hosts with only the pinned host
// key, an ansible.cfg, the playbook and a 0600 variables file; runs
// ansible-playbook in its own process group with a minimal environment and
// the project's JSON-lines stdout callback; parses the event stream; and
// removes the directory and every process of the run (ControlPersist master
// included) on every exit path. Everything returned is redacted.
//
// See docs/engine.md for the design and the reasons behind it.
package engine

import (
	"context"
	"slices"
	"strings"
	"time"
)

// Phase is one step of a join profile.
type Phase string

const (
	PhaseInstall   Phase = "install"
	PhaseJoin      Phase = "join"
	PhaseLeave     Phase = "leave"
	PhaseUninstall Phase = "uninstall"
	// PhaseReboot restarts a joined host in place; like leave it gets only
	// the host's addresses.
	PhaseReboot Phase = "reboot"
	// PhaseVerify checks a joined host before its NodeClaim registers; it
	// gets install's context (no bootstrap token).
	PhaseVerify Phase = "verify"
	// PhaseCheck is a script profile's drift check of a joined host
	// (scripts.check): exit 0 in sync, 1 drifted. It gets install's
	// context.
	PhaseCheck Phase = "check"
)

// Phases are all phases, in a join profile's order; lists over phases
// (metric series, signatures, validation) range over it so a new phase
// reaches every one.
var Phases = []Phase{
	PhaseInstall, PhaseJoin, PhaseLeave, PhaseUninstall, PhaseReboot,
	PhaseVerify,
	PhaseCheck,
}

// PhaseNames lists the phases for messages: "install, join, …, verify".
func PhaseNames() string {
	var b strings.Builder
	for i, p := range Phases {
		switch {
		case i == len(Phases)-1:
			b.WriteString(" or ")
		case i > 0:
			b.WriteString(", ")
		}
		b.WriteString(string(p))
	}
	return b.String()
}

// Valid reports whether p is a known phase.
func (p Phase) Valid() bool {
	return slices.Contains(Phases, p)
}

// AddressesOnly reports whether the phase gets only the host's addresses
// (no vars, secrets, token or cluster data): leave, which must work without
// a node class, and reboot, which needs nothing more.
func (p Phase) AddressesOnly() bool { return p == PhaseLeave || p == PhaseReboot }

// FallbackLeaveScript is the leave of a host with no profile leave to run
// (no install marker, the profile deleted, or its leave refused before it
// ran): the warm-pool invariant of the seed's leave contract — kubelet and
// containerd stopped and disabled — on any host, including one where a unit
// was never installed. A Verified host runs its own copy, installed by
// provisioning (roles/verified_host/files/fallback-leave: this body after
// the shebang, comment and `set -euo pipefail`), through the shim's
// fallback-leave op (Verified.ProvisionedLeave).
const FallbackLeaveScript = `for unit in kubelet.service containerd.service; do
	if [ -n "$(systemctl list-unit-files --no-legend "$unit" 2>/dev/null)" ]; then
		systemctl disable --now "$unit"
	fi
done
if systemctl is-active --quiet kubelet.service; then
	echo "kubelet.service is still active" >&2
	exit 1
fi
`

// DefaultRebootScript is the reboot phase of a profile that has none: it
// schedules the reboot 2 s out, so the SSH session (and the phase) ends
// cleanly before the host goes down, and refuses when the kubelet would not
// start again after it.
const DefaultRebootScript = `# kpssh default reboot (a profile without a reboot phase gets this one)
if systemctl cat kubelet.service >/dev/null 2>&1; then
  state=$(systemctl is-enabled kubelet.service 2>/dev/null || true)
  case $state in
  enabled | enabled-runtime | static | indirect | alias | generated) ;;
  *)
    echo "kubelet.service is ${state:-unknown}, not enabled: after a reboot the node would not come back (the join phase must enable it)" >&2
    exit 1
    ;;
  esac
fi
if command -v systemd-run >/dev/null 2>&1; then
  systemd-run --quiet --collect --on-active=2 --timer-property=AccuracySec=100ms systemctl reboot
else
  nohup sh -c 'sleep 2; reboot' >/dev/null 2>&1 &
fi
echo "reboot scheduled in 2s"
`

// Connection is how to reach the host.
type Connection struct {
	Address string // IP or DNS name
	Port    int32  // 0 means 22
	User    string // "" means root; non-root needs passwordless sudo
	// PrivateKey is the PEM/OpenSSH private key (never logged, written 0600
	// into the run directory only).
	PrivateKey []byte
	// HostKey is the pinned public-key line ("ssh-ed25519 AAAA…"). Required:
	// the engine never trusts on first use. See FetchHostKey.
	HostKey string
}

// Source is what the phase runs: exactly one of the fields is set.
type Source struct {
	// Script is a bash body, a Go text/template (seed-compatible).
	Script string
	// Tasks is an inline Ansible task list (YAML).
	Tasks string
	// Role is a role name (or collection FQCN) whose tasks/<phase>.yml runs.
	Role string
	// Verified (with Script) runs the script's exact bytes through the
	// host's shim, signature checked first (execMode Verified; verified.go);
	// with ProvisionedLeave (no Script) the host's own fallback leave.
	Verified *Verified
}

// Context is the data given to a phase (KPSSH_* environment, template data,
// Ansible variables). The engine enforces the contract whatever the caller
// passes: leave gets only HostAddress/NodeAddress, install and uninstall get
// no bootstrap token.
type Context struct {
	ClusterEndpoint string
	ClusterCAB64    string
	BootstrapToken  string // "<id>.<secret>", join only
	NodeName        string
	ProviderID      string
	HostAddress     string
	NodeAddress     string
	NodeLabels      string
	Taints          string
	// Vars are non-secret values (node class vars over profile defaults);
	// keys are shell identifiers.
	Vars map[string]string
	// Secrets are the joinSecretRef values; keys are shell identifiers,
	// exported upper-cased as KPSSH_SECRET_<KEY>.
	Secrets map[string]string
}

// Request is one phase run.
type Request struct {
	Phase   Phase
	Conn    Connection
	Source  Source
	Context Context
	// Timeout bounds the whole run; 0 means Options.DefaultTimeout.
	Timeout time.Duration
	// Redact lists extra values to scrub from everything returned (values
	// shorter than MinRedactLen are ignored).
	Redact []string
	// Check runs the phase in Ansible's check mode with diffs
	// (--check --diff): nothing is changed on the host, and Result.Changes
	// lists what would be. Role and task sources, install and join only. A
	// check-mode join gets CheckModeToken as its bootstrap token, whatever
	// Context holds: no real token is needed or shipped.
	Check bool
	// Key names this run for executors whose runs outlive their caller
	// (executor job): the same key is the same run, so a restarted caller
	// re-attaches instead of starting it twice. Opaque to the engine and
	// not secret; empty means a fresh run every time. Local ignores it.
	Key string
	// Progress, when set, is told of each task as it starts and ends
	// (redacted names and statuses only, never output): a long phase is
	// not silent. Called from the run's output goroutine: it must not block.
	Progress func(TaskProgress)
}

// Outcome is how a phase ended.
type Outcome string

const (
	// Succeeded: every task ran and succeeded.
	Succeeded Outcome = "Succeeded"
	// Failed: a task failed on the host, or the host was unreachable.
	Failed Outcome = "Failed"
	// TimedOut: the run exceeded its timeout (or its context ended) and was
	// interrupted, then killed.
	TimedOut Outcome = "TimedOut"
	// ConfigError: the phase could not be started — bad template, invalid
	// variable name, unknown role, playbook syntax error, missing phase… The
	// host was not reached.
	ConfigError Outcome = "ConfigError"
	// Rejected: a Verified host's shim refused the phase (signature, param,
	// envelope or phase rejected: shim exit 2–5); nothing of it ran.
	Rejected Outcome = "Rejected"
)

// Result is the redacted outcome of a run.
type Result struct {
	Outcome  Outcome
	Duration time.Duration
	// FailedTask names the failed (or, for TimedOut, the running) task.
	FailedTask string
	// RC is the failed task's return code (the script's exit status for
	// script profiles; 255 when ssh failed), 0 when there is none.
	RC int
	// ExitCode is ansible-playbook's own exit status (0 ok, 2 a host failed,
	// 4 unreachable or parse error, …); -1 when it was killed or never ran.
	ExitCode int
	// Message is a redacted, bounded tail explaining the outcome.
	Message string
	// Touched reports whether the host was reached (an authenticated SSH
	// session ran at least the engine's connect check). False for config
	// errors, connection failures and host key mismatches.
	Touched bool
	// AnsibleVersion is the ansible-core version that ran the playbook
	// (empty when it never started).
	AnsibleVersion string
	// Changes are the profile's tasks that reported a change (in check
	// mode: would change), in order, at most MaxChanges; the engine's own
	// tasks are not listed. Redacted.
	Changes []Change
}

// Change is a task that changed (or in check mode would change) the host.
type Change struct {
	Task string
	// Diff is the task's diff (check mode runs with --diff), redacted and
	// at most MaxDiff bytes (its tail); empty when the module gives none.
	Diff string
	// Censored: the task is no_log, its diff is not shown.
	Censored bool
}

// Bounds of Result.Changes.
const (
	MaxChanges = 32
	MaxDiff    = 2048
)

// CheckModeToken is the bootstrap token a check-mode join gets: the shape
// of a token (<6>.<16> of [a-z0-9]), so a role's checks pass, but no
// cluster knows it. A role must not compare the file it writes the token
// to in check mode (ansible_check_mode), or every check reports drift.
const CheckModeToken = "kpssh0.checkmode0000000"

// Engine runs phases.
type Engine interface {
	Run(ctx context.Context, req Request) Result
}
