package v1beta1

import (
	"github.com/awslabs/operatorpkg/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ProviderIDSource says who sets the node's providerID.
// +kubebuilder:validation:Enum=Static;Adopt
type ProviderIDSource string

const (
	// ProviderIDStatic: the provider sets kpssh://<namespace>/<host>.
	ProviderIDStatic ProviderIDSource = "Static"
	// ProviderIDAdopt: the join mechanism sets it; the provider adopts it by InternalIP.
	ProviderIDAdopt ProviderIDSource = "Adopt"
)

// VarValue is one non-secret profile variable value.
// +kubebuilder:validation:MaxLength=2048
type VarValue string

// Vars are non-secret variables handed to install and join.
// +kubebuilder:validation:MaxProperties=64
// +kubebuilder:validation:XValidation:rule="self.all(k, k.matches('^[A-Za-z_][A-Za-z0-9_]*$'))",message="var names must match ^[A-Za-z_][A-Za-z0-9_]*$"
type Vars map[string]VarValue

// SSHNodeClassSpec is what Karpenter NodePools reference.
type SSHNodeClassSpec struct {
	// HostSelector picks pool hosts by label; empty selects all.
	// +optional
	HostSelector *metav1.LabelSelector `json:"hostSelector,omitempty"`
	// JoinProfileRef names the SSHJoinProfile.
	JoinProfileRef ObjectReference `json:"joinProfileRef"`
	// Vars are non-secret inputs to the profile (KPSSH_VAR_<key>, kpssh_vars).
	// +optional
	Vars Vars `json:"vars,omitempty"`
	// JoinSecretRef names a Secret in the pool namespace whose keys become
	// KPSSH_SECRET_<KEY> / kpssh_secrets at join time.
	// +optional
	JoinSecretRef *LocalObjectReference `json:"joinSecretRef,omitempty"`
	// ProviderIDSource is Static (the provider sets it) or Adopt (the join mechanism does).
	// +kubebuilder:default=Static
	// +optional
	ProviderIDSource ProviderIDSource `json:"providerIDSource,omitempty"`
	// PricePerCPUHour prices offerings as pricePerCPUHour × vCPU.
	// +kubebuilder:default="0.02"
	// +kubebuilder:validation:Pattern=`^[0-9]+(\.[0-9]+)?$`
	// +kubebuilder:validation:MaxLength=32
	// +optional
	PricePerCPUHour string `json:"pricePerCPUHour,omitempty"`
	// KubeReserved is subtracted from capacity for allocatable (cpu, memory, ephemeral-storage only).
	// +kubebuilder:default={cpu:"80m",memory:"300Mi"}
	// +kubebuilder:validation:XValidation:rule="self.all(k, k in ['cpu', 'memory', 'ephemeral-storage'])",message="kubeReserved may only hold cpu, memory and ephemeral-storage"
	// +optional
	KubeReserved corev1.ResourceList `json:"kubeReserved,omitempty"`
	// MaxPods, when set, is the pods capacity of every node of the class,
	// overriding the hosts' capacity.pods. Unset: the hosts' capacity.pods
	// (their minimum), else 110. No default, so "unset" stays visible; no
	// maximum, like upstream's kubelet maxPods (its minimum is 0, but a node
	// that fits no pod is a mistake worth an error).
	// +kubebuilder:validation:Minimum=1
	// +optional
	MaxPods *int32 `json:"maxPods,omitempty"`
	// Cluster overrides the endpoint and CA discovered from kube-public/cluster-info.
	// +optional
	Cluster *ClusterEndpoint `json:"cluster,omitempty"`
	// StartupTaintGates remove a startup taint once a condition holds.
	// +kubebuilder:validation:MaxItems=16
	// +listType=atomic
	// +optional
	StartupTaintGates []StartupTaintGate `json:"startupTaintGates,omitempty"`
	// HostDrift, when set, checks joined (InUse) hosts every interval for
	// drift from what the profile would do: role and task profiles run
	// install and join in Ansible check mode (--check --diff), script
	// profiles their scripts.check. A host that would change reports
	// HostDrift and Karpenter replaces its node. Unset: no checks. Not a
	// join input: editing it rolls no node.
	// +optional
	HostDrift *HostDriftSpec `json:"hostDrift,omitempty"`
}

// HostDriftSpec configures the periodic drift check of joined hosts.
type HostDriftSpec struct {
	// Interval between two checks of a host (at least 10s; each check
	// runs install and join in check mode on the host).
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('10s')",message="hostDrift.interval must be at least 10s"
	Interval Duration `json:"interval"`
}

// ObjectReference names a cluster-scoped object.
type ObjectReference struct {
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
}

// ClusterEndpoint is where joining kubelets find the API server.
type ClusterEndpoint struct {
	// +kubebuilder:validation:Pattern=`^https://[^\s]+$`
	// +kubebuilder:validation:MaxLength=2048
	Endpoint string `json:"endpoint"`
	// CABundle is the PEM CA bundle of the API server (base64 in YAML).
	// +optional
	CABundle []byte `json:"caBundle,omitempty"`
}

// StartupTaintGate removes TaintKey from a node when RemoveWhen holds.
type StartupTaintGate struct {
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=316
	TaintKey   string     `json:"taintKey"`
	RemoveWhen RemoveWhen `json:"removeWhen"`
}

// RemoveWhen holds exactly one condition.
// +kubebuilder:validation:XValidation:rule="has(self.podsReady) != has(self.nodeCondition)",message="removeWhen needs exactly one of podsReady or nodeCondition"
type RemoveWhen struct {
	// +optional
	PodsReady *PodsReadyGate `json:"podsReady,omitempty"`
	// +optional
	NodeCondition *NodeConditionGate `json:"nodeCondition,omitempty"`
}

// PodsReadyGate holds once minReady pods matching selector in namespace on the node are Ready.
type PodsReadyGate struct {
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Namespace string                `json:"namespace"`
	Selector  *metav1.LabelSelector `json:"selector"`
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +optional
	MinReady int32 `json:"minReady,omitempty"`
}

// NodeConditionGate holds once the node has condition Type with Status.
type NodeConditionGate struct {
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=316
	Type string `json:"type"`
	// +kubebuilder:validation:Enum=True;False;Unknown
	Status corev1.ConditionStatus `json:"status"`
}

// SSHNodeClassStatus reports whether Karpenter may launch against the class.
type SSHNodeClassStatus struct {
	// Conditions: Ready (reasons ProfileNotFound, ProfileInvalid,
	// TimeoutsExceedRegistration, SelectorError, NoHosts).
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []status.Condition `json:"conditions,omitempty"`
}

// Reasons of the SSHNodeClass Ready condition.
const (
	ReasonProfileNotFound = "ProfileNotFound"
	ReasonProfileInvalid  = "ProfileInvalid"
	ReasonSelectorError   = "SelectorError"
	ReasonNoHosts         = "NoHosts"
	// ReasonTimeoutsExceedRegistration: the profile's install + join
	// timeouts exceed Karpenter's 15-minute registration window.
	ReasonTimeoutsExceedRegistration = "TimeoutsExceedRegistration"
)

// SSHNodeClass is the provider-specific half of a NodePool.
// +kubebuilder:object:root=true
// +kubebuilder:resource:path=sshnodeclasses,scope=Cluster,categories=karpenter,shortName=snc
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Profile",type=string,JSONPath=`.spec.joinProfileRef.name`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type SSHNodeClass struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   SSHNodeClassSpec   `json:"spec"`
	Status SSHNodeClassStatus `json:"status,omitempty"`
}

// SSHNodeClassList is a list of SSHNodeClasses.
// +kubebuilder:object:root=true
type SSHNodeClassList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []SSHNodeClass `json:"items"`
}

func (in *SSHNodeClass) StatusConditions(opts ...status.ForOption) status.ConditionSet {
	return status.NewReadyConditions().For(in, opts...)
}
func (in *SSHNodeClass) GetConditions() []status.Condition  { return in.Status.Conditions }
func (in *SSHNodeClass) SetConditions(c []status.Condition) { in.Status.Conditions = c }

// ConditionSignaturesExpiring is True on a node class whose profile has a
// signed v2 manifest that expires within two weeks (reason Expiring) or
// has expired (Expired); the message names each phase and its not-after.
// It does not change Ready. Absent when none does.
const ConditionSignaturesExpiring = "SignaturesExpiring"
