// Package v1beta1 holds the kpssh API: SSHHost, SSHNodeClass and SSHJoinProfile.
// +kubebuilder:object:generate=true
// +groupName=karpenter.dklesev.github.io
package v1beta1
