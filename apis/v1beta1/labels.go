package v1beta1

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
	// AnnotationNodeClassHash and AnnotationNodeClassHashVersion are stamped on NodeClaims for drift.
	AnnotationNodeClassHash        = Group + "/nodeclass-hash"
	AnnotationNodeClassHashVersion = Group + "/nodeclass-hash-version"
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
