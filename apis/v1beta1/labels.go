package v1beta1

import (
	"crypto/sha256"
	"encoding/hex"
)

// Well-known names shared by the API, the controllers and users' runbooks.
const (
	// LabelHostClass assigns a host to a class (one Karpenter instance type).
	LabelHostClass = Group + "/host-class"
	// DefaultHostClass is the class of an unlabelled host.
	DefaultHostClass = "default"
	// AnnotationMaintenance parks a host; its presence is the switch, the value is ignored.
	AnnotationMaintenance = Group + "/maintenance"
	// LabelManaged marks nodes this provider manages (controller anti-affinity).
	LabelManaged = Group + "/managed"
	// LabelHost is on the Node of a providerIDSource Adopt join (passed in
	// KPSSH_NODE_LABELS): the host it joined from, as HostLabelValue. It is
	// the Node's identity until kpssh has learnt its providerID.
	LabelHost = Group + "/host"
	// AnnotationNodeClassHash and AnnotationNodeClassHashVersion are stamped on NodeClaims for drift.
	AnnotationNodeClassHash        = Group + "/nodeclass-hash"
	AnnotationNodeClassHashVersion = Group + "/nodeclass-hash-version"
	// AnnotationHostDrift is set on a NodeClaim when its host's drift
	// verdict changes ("true": drifted, "false": in sync): the change wakes
	// Karpenter's drift check of the NodeClaim, which else looks every 5
	// minutes.
	AnnotationHostDrift = Group + "/host-drift"
	// TerminationFinalizer holds an SSHNodeClass while NodeClaims reference it.
	TerminationFinalizer = Group + "/termination"
	// DefaultPoolNamespace is where SSHHosts and their key Secrets live.
	DefaultPoolNamespace = "kpssh-system"
	// ProviderIDScheme prefixes provider IDs: kpssh://<namespace>/<host>.
	ProviderIDScheme = "kpssh"
)

// HostClass returns the class of a host from its labels; unlabelled hosts are "default".
func HostClass(labels map[string]string) string {
	if c := labels[LabelHostClass]; c != "" {
		return c
	}
	return DefaultHostClass
}

// HostLabelValue is LabelHost's value for host name in namespace:
// "<namespace>.<name>" (a namespace has no dot), or, when that is longer
// than a label value may be, "sha256-" and 56 hex digits of the digest of
// "<namespace>/<name>" (no dot: never equal to a readable value).
func HostLabelValue(namespace, name string) string {
	if v := namespace + "." + name; len(v) <= 63 {
		return v
	}
	sum := sha256.Sum256([]byte(namespace + "/" + name))
	return "sha256-" + hex.EncodeToString(sum[:])[:56]
}
