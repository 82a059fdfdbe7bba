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
	// LabelReservationID names the reservation a node holds: kpssh offers
	// each host class of a node class as a capacity reservation (its free
	// hosts are its capacity), value ReservationID.
	LabelReservationID = Group + "/reservation-id"
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
	return labelValue(namespace+"."+name, namespace+"/"+name)
}

// ReservationID is the reservation of host class class under node class
// nodeClass: "<nodeClass>_<class>" (a node class name has no underscore, so
// the first one splits it), or, when longer than a label value may be,
// "sha256-" and 56 hex digits of the digest of "<nodeClass>/<class>" (no
// underscore: never equal to a readable value). NodePools
// of one node class share it; node classes never do, even over the same hosts.
func ReservationID(nodeClass, class string) string {
	return labelValue(nodeClass+"_"+class, nodeClass+"/"+class)
}

// labelValue is readable when it fits a label value, else "sha256-" and 56
// hex digits of the digest of digested.
func labelValue(readable, digested string) string {
	if len(readable) <= 63 {
		return readable
	}
	sum := sha256.Sum256([]byte(digested))
	return "sha256-" + hex.EncodeToString(sum[:])[:56]
}
