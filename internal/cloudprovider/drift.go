package cloudprovider

import (
	"fmt"

	"github.com/mitchellh/hashstructure/v2"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"

	"github.com/dklesev/kpssh/apis/v1beta1"
)

// NodeClassHashVersion is stamped beside the hash: bumping it when the hashed
// field set changes keeps old stamps from reading as drift.
const NodeClassHashVersion = "v1"

// Drift reasons reported to Karpenter.
const (
	ProfileDrift   cloudprovider.DriftReason = "ProfileDrift"
	NodeClassDrift cloudprovider.DriftReason = "NodeClassDrift"
	// HostDrift: the host's last conclusive drift check (node class
	// hostDrift) found that install or join would change it.
	HostDrift cloudprovider.DriftReason = "HostDrift"
)

// joinInputs are the SSHNodeClass fields that change what join does. The
// scheduling-model fields (hostSelector, price, kubeReserved, maxPods)
// are deliberately absent: editing them never rolls nodes.
type joinInputs struct {
	Vars             v1beta1.Vars
	JoinSecretRef    *v1beta1.LocalObjectReference
	ProviderIDSource v1beta1.ProviderIDSource
	Cluster          *v1beta1.ClusterEndpoint
}

// NodeClassHash hashes the join-affecting fields of a node class.
func NodeClassHash(nc *v1beta1.SSHNodeClass) string {
	src := nc.Spec.ProviderIDSource
	if src == "" {
		src = v1beta1.ProviderIDStatic // the CRD default; an unset field must not read as a change
	}
	h, err := hashstructure.Hash(joinInputs{Vars: nc.Spec.Vars, JoinSecretRef: nc.Spec.JoinSecretRef, ProviderIDSource: src, Cluster: nc.Spec.Cluster},
		hashstructure.FormatV2, &hashstructure.HashOptions{SlicesAsSets: true, IgnoreZeroValue: true, ZeroNil: true})
	if err != nil {
		// Only unsupported types fail; joinInputs has none.
		panic(err)
	}
	return fmt.Sprint(h)
}

// Drifted decides drift for a joined host: ProfileDrift when the host's
// install marker is not the profile's current <name>@<version>;
// NodeClassDrift when the NodeClaim's stamped hash (same hash version)
// differs from the node class's (unstamped claims abstain); HostDrift when
// the node class checks its hosts (spec.hostDrift) and the host's last
// conclusive check under its current claim found drift.
func Drifted(h *v1beta1.SSHHost, profile *v1beta1.SSHJoinProfile, nc *v1beta1.SSHNodeClass, claimAnnotations map[string]string) cloudprovider.DriftReason {
	if profile != nil && h.Status.InstalledProfile != "" && h.Status.InstalledProfile != profile.Marker() {
		return ProfileDrift
	}
	stamped, ok := claimAnnotations[v1beta1.AnnotationNodeClassHash]
	if ok && claimAnnotations[v1beta1.AnnotationNodeClassHashVersion] == NodeClassHashVersion && stamped != NodeClassHash(nc) {
		return NodeClassDrift
	}
	if nc.Spec.HostDrift != nil && h.HostDrifted() {
		return HostDrift
	}
	return ""
}
