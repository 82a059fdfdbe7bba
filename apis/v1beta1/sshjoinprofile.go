package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// MaxScriptBytes bounds each profile script (seed: ≤ 256 KiB).
const MaxScriptBytes = 256 * 1024

// Script is one bash phase body.
// +kubebuilder:validation:MaxLength=262144
type Script string

// TaskList is an Ansible task list as YAML text.
// +kubebuilder:validation:MaxLength=262144
type TaskList string

// Signature is an armored SSHSIG.
// +kubebuilder:validation:MaxLength=16384
type Signature string

// Duration is restricted to ^([0-9]+(s|m|h))+$ (90s, 10m, 1h30m; not 1.5h, not 500ms).
// +kubebuilder:validation:Pattern=`^([0-9]+(s|m|h))+$`
// +kubebuilder:validation:MaxLength=32
type Duration string

// SSHJoinProfileSpec is pure input; it has no status.
// +kubebuilder:validation:XValidation:rule="has(self.scripts) != has(self.ansible)",message="exactly one profile source must be set: scripts or ansible"
// +kubebuilder:validation:XValidation:rule="!has(self.signatures) || has(self.scripts)",message="signatures apply to scripts profiles only"
type SSHJoinProfileSpec struct {
	// Version is the install cache key and the only rollout trigger.
	// +kubebuilder:default="1"
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9._-]{1,63}$`
	// +optional
	Version string `json:"version,omitempty"`
	// Scripts are bash phases (seed-compatible), rendered into a playbook.
	// +optional
	Scripts *ProfileScripts `json:"scripts,omitempty"`
	// Ansible is a role or inline task lists.
	// +optional
	Ansible *AnsibleSource `json:"ansible,omitempty"`
	// Timeouts bound each phase.
	// +kubebuilder:default={}
	// +optional
	Timeouts PhaseTimeouts `json:"timeouts,omitempty"`
	// Signatures are armored SSHSIGs over the scripts, for Verified hosts.
	// +optional
	Signatures *ProfileSignatures `json:"signatures,omitempty"`
}

// ProfileScripts holds one bash script per phase.
type ProfileScripts struct {
	// +kubebuilder:validation:MinLength=1
	Install Script `json:"install"`
	// +kubebuilder:validation:MinLength=1
	Join Script `json:"join"`
	// +kubebuilder:validation:MinLength=1
	Leave Script `json:"leave"`
	// Uninstall is never run by the controller.
	// +optional
	Uninstall Script `json:"uninstall,omitempty"`
	// Reboot restarts the joined host in place (Karpenter's RebootNode
	// repair). It must return before the host goes down and keep the
	// node's units enabled; absent, kpssh's default reboot runs.
	// +optional
	Reboot Script `json:"reboot,omitempty"`
	// Verify checks the joined host (kubelet healthz, expected devices, a
	// CNI file, ...) before Karpenter completes the NodeClaim's
	// registration; a failure fails the launch and runs leave. Absent,
	// registration does not wait.
	// +optional
	Verify Script `json:"verify,omitempty"`
	// Check is the drift check of a joined host (node class hostDrift):
	// exit 0 when the host is what install and join would leave, 1 when it
	// drifted (its output says how), anything else when it cannot tell. It
	// gets install's context (no bootstrap token) and must change nothing.
	// Absent, a script profile's hosts are not checked.
	// +optional
	Check Script `json:"check,omitempty"`
}

// AnsibleSource is either a role in the runner's roles path or inline task lists.
// +kubebuilder:validation:XValidation:rule="has(self.role) != has(self.tasks)",message="ansible needs exactly one of role or tasks"
type AnsibleSource struct {
	// Role is a role name (or collection FQCN); phase P runs its tasks/P.yml.
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_]+(\.[A-Za-z0-9_]+){0,2}$`
	// +optional
	Role string `json:"role,omitempty"`
	// Tasks are inline task lists per phase.
	// +optional
	Tasks *ProfileTasks `json:"tasks,omitempty"`
	// Vars are non-secret defaults, overridden by the node class vars.
	// +optional
	Vars Vars `json:"vars,omitempty"`
}

// ProfileTasks holds an Ansible task list (YAML) per phase.
type ProfileTasks struct {
	// +kubebuilder:validation:MinLength=1
	Install TaskList `json:"install"`
	// +kubebuilder:validation:MinLength=1
	Join TaskList `json:"join"`
	// +kubebuilder:validation:MinLength=1
	Leave TaskList `json:"leave"`
	// +optional
	Uninstall TaskList `json:"uninstall,omitempty"`
	// Reboot: see ProfileScripts.Reboot; absent, the default reboot runs.
	// +optional
	Reboot TaskList `json:"reboot,omitempty"`
	// Verify: see ProfileScripts.Verify; absent, nothing is verified.
	// +optional
	Verify TaskList `json:"verify,omitempty"`
}

// PhaseTimeouts bound each phase run.
type PhaseTimeouts struct {
	// +kubebuilder:default="10m"
	// +optional
	Install Duration `json:"install,omitempty"`
	// +kubebuilder:default="5m"
	// +optional
	Join Duration `json:"join,omitempty"`
	// +kubebuilder:default="3m"
	// +optional
	Leave Duration `json:"leave,omitempty"`
	// Reboot bounds the reboot phase, which only schedules the reboot
	// (Karpenter gives a provider 5m to accept one).
	// +kubebuilder:default="2m"
	// +optional
	Reboot Duration `json:"reboot,omitempty"`
	// Verify bounds the verify phase. Install + join + verify must fit
	// Karpenter's 15-minute registration window.
	// +kubebuilder:default="2m"
	// +optional
	Verify Duration `json:"verify,omitempty"`
	// Check bounds scripts.check (default 2m); the check mode runs of role
	// and task profiles are bounded by install's and join's.
	// +optional
	Check Duration `json:"check,omitempty"`
}

// ProfileSignatures holds one armored SSHSIG per script.
type ProfileSignatures struct {
	// +optional
	Install Signature `json:"install,omitempty"`
	// +optional
	Join Signature `json:"join,omitempty"`
	// +optional
	Leave Signature `json:"leave,omitempty"`
	// +optional
	Uninstall Signature `json:"uninstall,omitempty"`
	// Reboot signs scripts.reboot: Verified hosts have no default reboot.
	// +optional
	Reboot Signature `json:"reboot,omitempty"`
	// Verify signs scripts.verify.
	// +optional
	Verify Signature `json:"verify,omitempty"`
	// Check signs scripts.check.
	// +optional
	Check Signature `json:"check,omitempty"`
}

// SSHJoinProfile says how a host becomes a node.
// +kubebuilder:object:root=true
// +kubebuilder:resource:path=sshjoinprofiles,scope=Cluster,categories=karpenter,shortName=sjp
// +kubebuilder:printcolumn:name="Version",type=string,JSONPath=`.spec.version`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type SSHJoinProfile struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec SSHJoinProfileSpec `json:"spec"`
}

// SSHJoinProfileList is a list of SSHJoinProfiles.
// +kubebuilder:object:root=true
type SSHJoinProfileList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []SSHJoinProfile `json:"items"`
}

// Marker is the install cache key `<profile>@<version>`.
func (in *SSHJoinProfile) Marker() string { return in.Name + "@" + in.Spec.Version }
