package v1beta1

import (
	"fmt"
	"unicode/utf8"

	"github.com/awslabs/operatorpkg/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// ExecMode selects how phases run on a host.
// +kubebuilder:validation:Enum=Raw;Verified
type ExecMode string

const (
	// ExecModeRaw runs rendered phases as root via bash (sudo for non-root users).
	ExecModeRaw ExecMode = "Raw"
	// ExecModeVerified only runs offline-signed scripts through the host-side shim.
	ExecModeVerified ExecMode = "Verified"
)

// SSHHostSpec describes one pre-existing machine reachable over SSH.
// +kubebuilder:validation:XValidation:rule="self.execMode != 'Verified' || (has(self.trustedSigners) && size(self.trustedSigners) > 0)",message="execMode Verified requires at least one trustedSigners entry"
type SSHHostSpec struct {
	// Address is the IP or DNS name the controller dials. Immutable: a host at
	// another address is another host.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="address is immutable; delete and recreate the SSHHost to change it"
	// +kubebuilder:validation:XValidation:rule="isIP(self) || self.matches('^[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?(\\\\.[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?)*$')",message="address must be an IP address or a DNS name"
	Address string `json:"address"`
	// Port is the SSH port.
	// +kubebuilder:default=22
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	// +optional
	Port int32 `json:"port,omitempty"`
	// User is the SSH login. A non-root user needs passwordless sudo in Raw mode.
	// +kubebuilder:default=root
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_][A-Za-z0-9_.-]*$`
	// +optional
	User string `json:"user,omitempty"`
	// SSHKeySecretRef names a Secret in the pool namespace holding `privateKey`
	// (PEM) and optionally `knownHost` (a SHA256: fingerprint, a known_hosts line
	// or a public-key line), which is authoritative over the TOFU pin.
	SSHKeySecretRef LocalObjectReference `json:"sshKeySecretRef"`
	// NodeAddress is the IP the node advertises; defaults to address when
	// that is an IP, else to the IP the probe learns (status.observedNodeAddress).
	// +kubebuilder:validation:MaxLength=45
	// +kubebuilder:validation:XValidation:rule="isIP(self)",message="nodeAddress must be an IP address"
	// +optional
	NodeAddress string `json:"nodeAddress,omitempty"`
	// Capacity is what the host offers; must hold cpu and memory. Extended
	// resources pass through; pods is honoured unless the node class sets maxPods.
	// +kubebuilder:validation:XValidation:rule="'cpu' in self && 'memory' in self",message="capacity must hold cpu and memory"
	Capacity corev1.ResourceList `json:"capacity"`
	// ExecMode is Raw (default) or Verified (only signed scripts run).
	// +kubebuilder:default=Raw
	// +optional
	ExecMode ExecMode `json:"execMode,omitempty"`
	// TrustedSigners are OpenSSH public-key lines whose signatures Verified mode accepts.
	// +kubebuilder:validation:MaxItems=16
	// +listType=atomic
	// +optional
	TrustedSigners []TrustedSigner `json:"trustedSigners,omitempty"`
	// ShimCommand overrides how the shim is invoked on a Verified host:
	// words of letters, digits and /._+=,@- separated by single spaces
	// ("/usr/local/sbin/kpssh-shim", "sudo -n /usr/local/sbin/kpssh-shim"),
	// since it becomes a remote command line.
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:Pattern=`^([A-Za-z0-9/._+=,@-]+( [A-Za-z0-9/._+=,@-]+)*)?$`
	// +optional
	ShimCommand string `json:"shimCommand,omitempty"`
}

// TrustedSigner is one OpenSSH public-key line (`<type> <base64> [comment]`).
// +kubebuilder:validation:MaxLength=16384
// +kubebuilder:validation:Pattern=`^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)|sk-ssh-ed25519@openssh\.com|sk-ecdsa-sha2-nistp256@openssh\.com) [A-Za-z0-9+/]+={0,2}( [^\n]*)?$`
type TrustedSigner string

// LocalObjectReference names an object in the same (or the pool) namespace.
type LocalObjectReference struct {
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
}

// HostState is the host's position in the lifecycle (SPEC §2).
// +kubebuilder:validation:Enum=Pending;Available;Claimed;InUse;Unhealthy;Leaving;Maintenance
type HostState string

const (
	HostPending     HostState = "Pending"
	HostAvailable   HostState = "Available"
	HostClaimed     HostState = "Claimed"
	HostInUse       HostState = "InUse"
	HostUnhealthy   HostState = "Unhealthy"
	HostLeaving     HostState = "Leaving"
	HostMaintenance HostState = "Maintenance"
)

// JoinRan says join has started on the host under its current claim, so
// its kubelet may run. A host claimed by an older controller has no
// JoinClaimUID: InUse or a token id say it there.
func (h *SSHHost) JoinRan() bool {
	st := h.Status
	if st.ClaimRef == nil {
		return false
	}
	return st.State == HostInUse || st.BootstrapTokenID != "" || (st.JoinClaimUID != "" && st.JoinClaimUID == st.ClaimRef.UID)
}

// ClaimRef binds a host to exactly one NodeClaim object (name and UID).
type ClaimRef struct {
	// +kubebuilder:validation:MinLength=1
	Name string    `json:"name"`
	UID  types.UID `json:"uid"`
}

// Phase names a lifecycle phase of a join profile.
// +kubebuilder:validation:Enum=install;join;leave;uninstall;reboot;verify
type Phase string

const (
	PhaseInstall   Phase = "install"
	PhaseJoin      Phase = "join"
	PhaseLeave     Phase = "leave"
	PhaseUninstall Phase = "uninstall"
	PhaseReboot    Phase = "reboot"
	PhaseVerify    Phase = "verify"
)

// PhaseResult is the outcome of one phase run, or Running while it runs.
// +kubebuilder:validation:Enum=Running;Succeeded;Failed;TimedOut;Rejected;Interrupted
type PhaseResult string

const (
	// PhaseRunning: the phase has not ended yet (lastPhase.currentTask
	// says where it is). The phase's own end replaces it.
	PhaseRunning   PhaseResult = "Running"
	PhaseSucceeded PhaseResult = "Succeeded"
	PhaseFailed    PhaseResult = "Failed"
	PhaseTimedOut  PhaseResult = "TimedOut"
	PhaseRejected  PhaseResult = "Rejected"
	// PhaseInterrupted: the claim the phase ran under ended before the
	// phase's end was recorded (InterruptPhase); how it ended is unknown.
	PhaseInterrupted PhaseResult = "Interrupted"
)

// InterruptPhase ends a Running lastPhase whose end will never be
// recorded: the claim it ran under is being released (its end is written
// under that claim only). Interrupted, why and the task it was at go to
// the message. Anything else is left alone.
func (h *SSHHost) InterruptPhase(why string) {
	lp := h.Status.LastPhase
	if lp == nil || lp.Result != PhaseRunning {
		return
	}
	lp.Result, lp.Message = PhaseInterrupted, why
	if lp.CurrentTask != "" {
		lp.Message += fmt.Sprintf(" (it was at task %q)", lp.CurrentTask)
	}
	if n := 4096; len(lp.Message) > n { // message's MaxLength; cut on a rune boundary
		for n > 0 && !utf8.RuneStart(lp.Message[n]) {
			n--
		}
		lp.Message = lp.Message[:n]
	}
	lp.CurrentTask = ""
}

// LastPhase records the most recent phase run on a host, redacted. While a
// phase that has run for a few seconds is still running, result is Running
// and currentTask names the task it is at (written at most every few
// seconds, on a claimed host); the phase's end replaces the record.
// +kubebuilder:validation:XValidation:rule="!has(self.currentTask) || self.result == 'Running'",message="currentTask is set only while the phase is Running"
type LastPhase struct {
	Phase     Phase       `json:"phase"`
	Result    PhaseResult `json:"result"`
	StartedAt metav1.Time `json:"startedAt"`
	// Duration of the run, e.g. "4.2s"; while Running, how long it had run
	// when the record was written.
	// +optional
	Duration metav1.Duration `json:"duration,omitempty"`
	// CurrentTask is, while Running, the task the phase is at (the last
	// one started, redacted).
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	CurrentTask string `json:"currentTask,omitempty"`
	// FailedTask is the name of the Ansible task that failed, if any.
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	FailedTask string `json:"failedTask,omitempty"`
	// Message is a redacted tail of the failure output.
	// +kubebuilder:validation:MaxLength=4096
	// +optional
	Message string `json:"message,omitempty"`
}

// SSHHostStatus is owned by the controller; every write is a compare-and-swap.
type SSHHostStatus struct {
	// State; empty means Pending.
	// +optional
	State HostState `json:"state,omitempty"`
	// Conditions: Ready mirrors state.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []status.Condition `json:"conditions,omitempty"`
	// ClaimRef is the NodeClaim holding this host.
	// +optional
	ClaimRef *ClaimRef `json:"claimRef,omitempty"`
	// InstalledProfile is the install cache marker `<profile>@<version>`.
	// +optional
	InstalledProfile string `json:"installedProfile,omitempty"`
	// BootstrapTokenID is the id of the token minted for the current join.
	// +optional
	BootstrapTokenID string `json:"bootstrapTokenID,omitempty"`
	// JoinClaimUID is the UID of the claim under which join last started:
	// written with BootstrapTokenID before join runs and, unlike it, kept when
	// the token is collected (the Node registered). While it is the current
	// claim's UID the host's kubelet may run: Delete runs leave, and a failed
	// launch does not release the host Available. Cleared on release; one of
	// an earlier claim means nothing.
	// +optional
	JoinClaimUID types.UID `json:"joinClaimUID,omitempty"`
	// ProviderID recorded after a successful join.
	// +optional
	ProviderID string `json:"providerID,omitempty"`
	// HostKeyFingerprint is the pinned host key, `SHA256:<base64>`.
	// +optional
	HostKeyFingerprint string `json:"hostKeyFingerprint,omitempty"`
	// ObservedCapacity is what the last probe measured.
	// +optional
	ObservedCapacity corev1.ResourceList `json:"observedCapacity,omitempty"`
	// ObservedArch is amd64, arm64 or the raw `uname -m`.
	// +optional
	ObservedArch string `json:"observedArch,omitempty"`
	// ObservedNodeAddress is the host's own IP on the probe's SSH
	// connection (the server address of $SSH_CONNECTION), canonical. It is
	// the node address of a host whose spec.address is a DNS name and that
	// has no spec.nodeAddress: a name is no --node-ip and no InternalIP.
	// +kubebuilder:validation:MaxLength=45
	// +kubebuilder:validation:XValidation:rule="isIP(self)",message="observedNodeAddress must be an IP address"
	// +optional
	ObservedNodeAddress string `json:"observedNodeAddress,omitempty"`
	// ObservedGeneration is the spec generation the last probe saw.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// +optional
	LastProbeTime *metav1.Time `json:"lastProbeTime,omitempty"`
	// +optional
	LastProbeError string `json:"lastProbeError,omitempty"`
	// LastPhase is the last phase run on this host.
	// +optional
	LastPhase *LastPhase `json:"lastPhase,omitempty"`
	// ShimRejection is the last refusal of a phase by this Verified host's
	// shim (a bad signature, param or envelope, an unknown phase). While the
	// node class, its profile and this host's spec are what they were then,
	// the node class does not claim the host again (each claim would mint
	// and ship another token for the same refusal); a later successful
	// launch clears it. Condition ShimRejected mirrors it.
	// +optional
	ShimRejection *ShimRejection `json:"shimRejection,omitempty"`
	// Machine is the host's identity as the pool compares hosts: its
	// address and port and its node address, normalised. The host
	// controller writes it from the spec before the host is first probed
	// and after each spec change; a host whose Machine is not its spec's is
	// not claimed. The claim path finds the other hosts of a machine by it
	// (selectable fields status.machine.address, status.machine.nodeAddress).
	// +optional
	Machine *MachineIdentity `json:"machine,omitempty"`
	// Reboot is the last in-place reboot Karpenter asked for (Reboot with
	// an operation id), recorded before the reboot phase runs so that the
	// same operation never reboots the host twice. Condition Rebooting
	// mirrors it.
	// +optional
	Reboot *HostReboot `json:"reboot,omitempty"`
	// Verify is the outcome of the profile's verify phase under the
	// current claim, recorded once it ran: a passed verify is not run again
	// (Karpenter asks the registration hook until it answers), a failed one
	// ends the claim. Cleared on release.
	// +optional
	Verify *HostVerify `json:"verify,omitempty"`
	// HostDrift is the last drift check of this joined host (node class
	// spec.hostDrift), under the claim it names. Condition HostDrift is
	// True while the last conclusive check found drift.
	// +optional
	HostDrift *HostDriftStatus `json:"hostDrift,omitempty"`
}

// VerifyResult is how the verify phase of a claim ended.
// +kubebuilder:validation:Enum=Passed;Failed
type VerifyResult string

const (
	// VerifyPassed: the verify phase succeeded; the NodeClaim registers.
	VerifyPassed VerifyResult = "Passed"
	// VerifyFailed: it failed, timed out or was refused; the NodeClaim is
	// deleted, leave runs, the host is released Unhealthy.
	VerifyFailed VerifyResult = "Failed"
)

// HostVerify records the verify phase of one claim.
type HostVerify struct {
	// ClaimUID is the claim whose join was verified.
	ClaimUID types.UID    `json:"claimUID"`
	Result   VerifyResult `json:"result"`
	At       metav1.Time  `json:"at"`
	// Message is the redacted failure, if any.
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Message string `json:"message,omitempty"`
}

// VerifyOf is the verify record of claim uid, nil when there is none.
func (h *SSHHost) VerifyOf(uid types.UID) *HostVerify {
	if v := h.Status.Verify; v != nil && uid != "" && v.ClaimUID == uid {
		return v
	}
	return nil
}

// RebootResult is where an in-place reboot stands.
// +kubebuilder:validation:Enum=Requested;Issued;Returned;Failed;Lost
type RebootResult string

const (
	// RebootRequested: recorded; the reboot phase has not finished (or the
	// controller died while it ran — the operation is not run again).
	RebootRequested RebootResult = "Requested"
	// RebootIssued: the reboot phase succeeded; the host goes down.
	RebootIssued RebootResult = "Issued"
	// RebootReturned: a probe saw the host back (a new boot id, or SSH
	// back after an outage).
	RebootReturned RebootResult = "Returned"
	// RebootFailed: the reboot phase failed or was refused.
	RebootFailed RebootResult = "Failed"
	// RebootLost: the host did not come back in time; it is Unhealthy,
	// the claim kept, until it returns or Karpenter replaces the node.
	RebootLost RebootResult = "Lost"
)

// HostReboot records one in-place reboot of a claimed host.
type HostReboot struct {
	// OperationID is Karpenter's id of the reboot operation.
	// +kubebuilder:validation:MaxLength=512
	OperationID string `json:"operationID"`
	// ClaimUID is the claim the reboot was asked under.
	ClaimUID types.UID    `json:"claimUID"`
	Result   RebootResult `json:"result"`
	// BootID is the host's boot id before the reboot (the Node's), when
	// known: the host has returned when a probe reports another one.
	// +kubebuilder:validation:MaxLength=64
	// +optional
	BootID      string      `json:"bootID,omitempty"`
	RequestedAt metav1.Time `json:"requestedAt"`
	// WentDown: a probe failed since the reboot was asked (without a
	// BootID, the host has returned when SSH answers after that).
	// +optional
	WentDown bool `json:"wentDown,omitempty"`
	// +optional
	ReturnedAt *metav1.Time `json:"returnedAt,omitempty"`
	// Message is the redacted failure, if any.
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Message string `json:"message,omitempty"`
}

// ConditionRebooting is True while a reboot is Requested or Issued, False
// once it Returned, Failed or was Lost (the reason says which).
const ConditionRebooting = "Rebooting"

// Active reports whether the reboot still waits for the host to return.
func (r *HostReboot) Active() bool {
	return r != nil && (r.Result == RebootRequested || r.Result == RebootIssued || r.Result == RebootLost)
}

// SetReboot records r with the Rebooting condition that mirrors it.
func (h *SSHHost) SetReboot(r *HostReboot, now metav1.Time) {
	h.Status.Reboot = r
	if r == nil {
		h.removeCondition(ConditionRebooting)
		return
	}
	cond := status.Condition{Type: ConditionRebooting, Status: metav1.ConditionFalse, ObservedGeneration: h.Generation,
		LastTransitionTime: now, Reason: "Reboot" + string(r.Result)}
	switch r.Result {
	case RebootRequested:
		cond.Status, cond.Message = metav1.ConditionTrue, "reboot "+r.OperationID+" requested: the reboot phase runs"
	case RebootIssued:
		cond.Status, cond.Message = metav1.ConditionTrue, "reboot "+r.OperationID+" issued: waiting for the host to come back"
	case RebootReturned:
		cond.Message = "the host came back from reboot " + r.OperationID
	case RebootFailed:
		cond.Message = "reboot " + r.OperationID + " failed: " + r.Message
	case RebootLost:
		cond.Message = "the host did not come back from reboot " + r.OperationID + ": " + r.Message
	}
	h.setCondition(cond)
}

// HostDriftResult is how one drift check ended.
// +kubebuilder:validation:Enum=InSync;Drifted;Unreachable;Failed;Unsupported
type HostDriftResult string

const (
	// DriftInSync: nothing would change.
	DriftInSync HostDriftResult = "InSync"
	// DriftDrifted: a task would change the host (role, tasks), or the
	// check script exited 1.
	DriftDrifted HostDriftResult = "Drifted"
	// DriftUnreachable: the host could not be reached; not drift.
	DriftUnreachable HostDriftResult = "Unreachable"
	// DriftFailed: the check could not decide (a task failed in check
	// mode, a timeout, a check script exiting other than 0 or 1, a config
	// error); not drift.
	DriftFailed HostDriftResult = "Failed"
	// DriftUnsupported: the profile cannot be checked (a script profile
	// without scripts.check).
	DriftUnsupported HostDriftResult = "Unsupported"
)

// Conclusive reports whether r decides drift (InSync or Drifted).
func (r HostDriftResult) Conclusive() bool { return r == DriftInSync || r == DriftDrifted }

// HostDriftStatus records the drift checks of one claim.
type HostDriftStatus struct {
	// ClaimUID is the claim the checks ran under: a record of another
	// claim means nothing.
	ClaimUID types.UID `json:"claimUID"`
	// LastCheckTime is when the last check ended, whatever its result.
	LastCheckTime metav1.Time `json:"lastCheckTime"`
	// LastResult is the last check's result.
	LastResult HostDriftResult `json:"lastResult"`
	// Checks counts the checks run under this claim.
	// +optional
	Checks int32 `json:"checks,omitempty"`
	// ChangedTasks are the tasks that would change the host, from the
	// last check that found drift (kept while later checks cannot decide).
	// +kubebuilder:validation:MaxItems=16
	// +listType=atomic
	// +optional
	ChangedTasks []string `json:"changedTasks,omitempty"`
	// Message is the redacted reason of the last check that could not
	// decide (Unreachable, Failed, Unsupported).
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Message string `json:"message,omitempty"`
}

// ConditionHostDrift is True while the last conclusive drift check of the
// current claim found drift (its message: the changed tasks and their
// redacted diffs), False when it found none, Unknown while no check could
// decide. IsDrifted reports HostDrift for a True one.
const ConditionHostDrift = "HostDrift"

// Reasons of the HostDrift condition.
const (
	ReasonDriftDetected   = "DriftDetected"
	ReasonInSync          = "InSync"
	ReasonDriftUnknown    = "CheckInconclusive"
	ReasonDriftNoCheck    = "CheckUnsupported"
	maxDriftConditionText = 8192
)

// HostDrifted reports whether the HostDrift condition is True for the
// host's current claim.
func (h *SSHHost) HostDrifted() bool {
	d := h.Status.HostDrift
	if d == nil || h.Status.ClaimRef == nil || d.ClaimUID != h.Status.ClaimRef.UID {
		return false
	}
	for _, c := range h.Status.Conditions {
		if c.Type == ConditionHostDrift {
			return c.Status == metav1.ConditionTrue
		}
	}
	return false
}

// SetHostDrift records a check (nil clears the record and the condition).
// message is the condition's text for a Drifted result (the changed tasks
// and their redacted diffs; cut to 8 KiB). A result that cannot decide
// keeps the condition of the last conclusive check of the same claim, and
// its changed tasks.
func (h *SSHHost) SetHostDrift(d *HostDriftStatus, message string, now metav1.Time) {
	prev := h.Status.HostDrift
	h.Status.HostDrift = d
	if d == nil {
		h.removeCondition(ConditionHostDrift)
		return
	}
	sameClaim := prev != nil && prev.ClaimUID == d.ClaimUID
	if !d.LastResult.Conclusive() && sameClaim {
		if d.ChangedTasks == nil {
			d.ChangedTasks = prev.ChangedTasks
		}
		for _, c := range h.Status.Conditions {
			if c.Type == ConditionHostDrift && c.Status != metav1.ConditionUnknown {
				return // the last verdict stands
			}
		}
	}
	cond := status.Condition{Type: ConditionHostDrift, ObservedGeneration: h.Generation, LastTransitionTime: now}
	switch d.LastResult {
	case DriftDrifted:
		cond.Status, cond.Reason = metav1.ConditionTrue, ReasonDriftDetected
		cond.Message = message
	case DriftInSync:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, ReasonInSync, "the last check found nothing that would change"
	case DriftUnsupported:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionUnknown, ReasonDriftNoCheck, d.Message
	default:
		cond.Status, cond.Reason = metav1.ConditionUnknown, ReasonDriftUnknown
		cond.Message = "the last check could not decide (" + string(d.LastResult) + "): " + d.Message
	}
	if len(cond.Message) > maxDriftConditionText {
		cut := maxDriftConditionText - len(" …")
		for cut > 0 && cond.Message[cut]&0xC0 == 0x80 {
			cut--
		}
		cond.Message = cond.Message[:cut] + " …"
	}
	h.setCondition(cond)
}

// MachineIdentity identifies the machine an SSHHost reaches. Two hosts with
// the same Address, or the same non-empty NodeAddress, are one machine.
type MachineIdentity struct {
	// Address is spec.address normalised (an IP in canonical form, a DNS
	// name in lowercase) with spec.port: "[2001:db8::1]:22", "node1.example:2222".
	// +kubebuilder:validation:MaxLength=270
	Address string `json:"address"`
	// NodeAddress is the node address as an IP in canonical form
	// (spec.nodeAddress, else spec.address when it is an IP); empty when
	// there is none.
	// +kubebuilder:validation:MaxLength=64
	// +optional
	NodeAddress string `json:"nodeAddress,omitempty"`
}

// ShimRejection records what a Verified host's shim refused, and the
// generations of the objects whose change lifts it.
type ShimRejection struct {
	Phase Phase `json:"phase"`
	// RC is the shim's exit code (2 signature rejected, 3 bad param, 4
	// malformed envelope, 5 unknown phase).
	// +kubebuilder:validation:Minimum=2
	// +kubebuilder:validation:Maximum=5
	RC int32 `json:"rc"`
	// Message is the redacted refusal.
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Message string `json:"message,omitempty"`
	// NodeClass whose launch was refused, at NodeClassGeneration.
	NodeClass           string `json:"nodeClass"`
	NodeClassGeneration int64  `json:"nodeClassGeneration"`
	// Profile is the SSHJoinProfile's name, at ProfileGeneration (its
	// scripts and signatures are in its spec).
	Profile           string `json:"profile"`
	ProfileGeneration int64  `json:"profileGeneration"`
	// HostGeneration is this SSHHost's metadata.generation then.
	HostGeneration int64       `json:"hostGeneration"`
	At             metav1.Time `json:"at"`
}

// Blocks reports whether the rejection still keeps node class nc (with
// profile p) from claiming host h: nothing it depends on has changed.
func (r *ShimRejection) Blocks(h *SSHHost, nc *SSHNodeClass, p *SSHJoinProfile) bool {
	return r != nil && nc != nil && p != nil &&
		r.NodeClass == nc.Name && r.NodeClassGeneration == nc.Generation &&
		r.Profile == p.Name && r.ProfileGeneration == p.Generation &&
		r.HostGeneration == h.Generation
}

// ConditionShimRejected is True while status.shimRejection is set.
const ConditionShimRejected = "ShimRejected"

// SSHHost is one machine of the pool.
// +kubebuilder:object:root=true
// +kubebuilder:resource:path=sshhosts,scope=Namespaced,categories=karpenter,shortName=sshh
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Address",type=string,JSONPath=`.spec.address`
// +kubebuilder:printcolumn:name="Class",type=string,JSONPath=`.metadata.labels.karpenter\.dklesev\.github\.io/host-class`
// +kubebuilder:printcolumn:name="State",type=string,JSONPath=`.status.state`
// +kubebuilder:printcolumn:name="Claim",type=string,JSONPath=`.status.claimRef.name`
// +kubebuilder:printcolumn:name="Installed",type=string,JSONPath=`.status.installedProfile`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:selectablefield:JSONPath=`.status.claimRef.uid`
// +kubebuilder:selectablefield:JSONPath=`.status.machine.address`
// +kubebuilder:selectablefield:JSONPath=`.status.machine.nodeAddress`
type SSHHost struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   SSHHostSpec   `json:"spec"`
	Status SSHHostStatus `json:"status,omitempty"`
}

// FieldClaimUID selects hosts by the UID of the NodeClaim holding them: a
// live, consistent "which host does this NodeClaim hold" that returns one
// object instead of the whole pool.
const FieldClaimUID = "status.claimRef.uid"

// FieldMachineAddress and FieldMachineNodeAddress select hosts by their
// status.machine: a live read of a machine's hosts, not of the pool.
const (
	FieldMachineAddress     = "status.machine.address"
	FieldMachineNodeAddress = "status.machine.nodeAddress"
)

// SSHHostList is a list of SSHHosts.
// +kubebuilder:object:root=true
type SSHHostList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []SSHHost `json:"items"`
}

// ConditionReady is the one condition SSHHost and SSHNodeClass publish.
const ConditionReady = status.ConditionReady

func (in *SSHHost) StatusConditions(opts ...status.ForOption) status.ConditionSet {
	return status.NewReadyConditions().For(in, opts...)
}
func (in *SSHHost) GetConditions() []status.Condition  { return in.Status.Conditions }
func (in *SSHHost) SetConditions(c []status.Condition) { in.Status.Conditions = c }

// CurrentState returns the state with the empty value read as Pending.
func (in *SSHHost) CurrentState() HostState {
	if in.Status.State == "" {
		return HostPending
	}
	return in.Status.State
}

// Class returns the host class (label, or "default").
func (in *SSHHost) Class() string { return HostClass(in.Labels) }

// InMaintenance reports whether the maintenance annotation is present.
func (in *SSHHost) InMaintenance() bool {
	_, ok := in.Annotations[AnnotationMaintenance]
	return ok
}

// Ready condition reasons on SSHHost.
const (
	ReasonProbeSucceeded = "ProbeSucceeded"
	ReasonProbeFailed    = "ProbeFailed"
	ReasonAwaitingProbe  = "AwaitingProbe"
	ReasonMaintenance    = "Maintenance"
)

// SetState sets the state and the Ready condition that mirrors it. Every
// writer of state goes through here so the two never disagree.
func (h *SSHHost) SetState(s HostState, msg string, now metav1.Time) {
	h.Status.State = s
	cond := status.Condition{Type: ConditionReady, ObservedGeneration: h.Generation, LastTransitionTime: now}
	switch s {
	case HostAvailable, HostClaimed, HostInUse:
		cond.Status, cond.Reason = metav1.ConditionTrue, ReasonProbeSucceeded
	case HostUnhealthy:
		cond.Status, cond.Reason = metav1.ConditionFalse, ReasonProbeFailed
	case HostMaintenance:
		cond.Status, cond.Reason = metav1.ConditionFalse, ReasonMaintenance
	default: // Pending, Leaving
		cond.Status, cond.Reason = metav1.ConditionUnknown, ReasonAwaitingProbe
	}
	cond.Message = msg
	h.setCondition(cond)
}

// setCondition replaces the condition of cond's type (keeping its transition
// time while its status stays) or adds it.
func (h *SSHHost) setCondition(cond status.Condition) {
	for i, c := range h.Status.Conditions {
		if c.Type != cond.Type {
			continue
		}
		if c.Status == cond.Status {
			cond.LastTransitionTime = c.LastTransitionTime
		}
		h.Status.Conditions[i] = cond
		return
	}
	h.Status.Conditions = append(h.Status.Conditions, cond)
}

// removeCondition drops the condition of type t, if any.
func (h *SSHHost) removeCondition(t string) {
	for i, c := range h.Status.Conditions {
		if c.Type == t {
			h.Status.Conditions = append(h.Status.Conditions[:i:i], h.Status.Conditions[i+1:]...)
			return
		}
	}
}

// Reasons of the ShimRejected condition, by the shim's exit code.
var shimRejectionReasons = map[int32]string{2: "SignatureRejected", 3: "BadParam", 4: "MalformedEnvelope", 5: "UnknownPhase"}

// ShimRejectionReason is the ShimRejected condition's reason for rc.
func ShimRejectionReason(rc int32) string {
	if r, ok := shimRejectionReasons[rc]; ok {
		return r
	}
	return "Rejected"
}

// SetShimRejection records r (nil clears it) with the ShimRejected condition
// that mirrors it: True naming the phase, the refusal and what to change.
func (h *SSHHost) SetShimRejection(r *ShimRejection, now metav1.Time) {
	h.Status.ShimRejection = r
	if r == nil {
		h.removeCondition(ConditionShimRejected)
		return
	}
	cond := status.Condition{Type: ConditionShimRejected, Status: metav1.ConditionTrue, ObservedGeneration: h.Generation,
		LastTransitionTime: now, Reason: ShimRejectionReason(r.RC),
		Message: fmt.Sprintf("the shim refused %s (rc %d): %s; node class %s does not claim this host until it, its profile %s or this host's spec changes",
			r.Phase, r.RC, r.Message, r.NodeClass, r.Profile)}
	h.setCondition(cond)
}

// ConditionLeaveFailed is True on a host whose leave did not succeed when
// its claim ended (Delete) or when the host controller last ran it: its
// kubelet may still run. Such a host is held Unhealthy, so it is never
// claimed, and the host controller runs leave again at each probe —
// whatever the kubelet's state, and as kpssh's own (never a foreign
// kubelet) — until one succeeds, which removes the condition. The reason
// is the leave's outcome (Failed, TimedOut, Rejected, ConfigError).
const ConditionLeaveFailed = "LeaveFailed"

// LeaveOwed reports whether the LeaveFailed condition is True.
func (h *SSHHost) LeaveOwed() bool { return h.isTrue(ConditionLeaveFailed) }

// SetLeaveFailed sets the LeaveFailed condition True with reason and msg;
// an empty reason removes it.
func (h *SSHHost) SetLeaveFailed(reason, msg string, now metav1.Time) {
	h.setTrue(ConditionLeaveFailed, reason, msg, now)
}

// isTrue reports whether condition t is True.
func (h *SSHHost) isTrue(t string) bool {
	for _, c := range h.Status.Conditions {
		if c.Type == t {
			return c.Status == metav1.ConditionTrue
		}
	}
	return false
}

// setTrue sets condition t True with reason and msg; an empty reason
// removes it.
func (h *SSHHost) setTrue(t, reason, msg string, now metav1.Time) {
	if reason == "" {
		h.removeCondition(t)
		return
	}
	h.setCondition(status.Condition{Type: t, Status: metav1.ConditionTrue, ObservedGeneration: h.Generation,
		LastTransitionTime: now, Reason: reason, Message: msg})
}

// ConditionDuplicate is True on a host that is the same machine as another
// host of its pool namespace which comes first (holds a claim, or is older,
// or has the smaller name): the same address and port, or the same node
// address, compared normalised. Such a host is never claimed and, while
// unclaimed, never probed; its message names the other host and the field.
// The host controller sets and clears it.
const ConditionDuplicate = "Duplicate"

// Reasons of the Duplicate condition; ReasonDuplicate is Ready's while the
// host controller holds an unclaimed duplicate Unhealthy.
const (
	ReasonDuplicateAddress     = "DuplicateAddress"
	ReasonDuplicateNodeAddress = "DuplicateNodeAddress"
	ReasonDuplicate            = "Duplicate"
)

// IsDuplicate reports whether the Duplicate condition is True.
func (h *SSHHost) IsDuplicate() bool { return h.isTrue(ConditionDuplicate) }

// SetDuplicate sets the Duplicate condition True with reason and message;
// an empty reason removes it.
func (h *SSHHost) SetDuplicate(reason, msg string, now metav1.Time) {
	h.setTrue(ConditionDuplicate, reason, msg, now)
}

// ParkedAsDuplicate reports whether the host's state is the host
// controller's parking of a duplicate (Unhealthy, Ready reason Duplicate).
func (h *SSHHost) ParkedAsDuplicate() bool {
	if h.Status.State != HostUnhealthy {
		return false
	}
	for _, c := range h.Status.Conditions {
		if c.Type == ConditionReady {
			return c.Reason == ReasonDuplicate
		}
	}
	return false
}

// ParkAsDuplicate sets the state Unhealthy with Ready False, reason
// Duplicate, and msg.
func (h *SSHHost) ParkAsDuplicate(msg string, now metav1.Time) {
	h.SetState(HostUnhealthy, msg, now)
	h.setCondition(status.Condition{Type: ConditionReady, Status: metav1.ConditionFalse, ObservedGeneration: h.Generation,
		LastTransitionTime: now, Reason: ReasonDuplicate, Message: msg})
}
