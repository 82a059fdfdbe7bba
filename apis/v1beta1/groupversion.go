package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/scheme"
)

// Group is the API group of every kpssh kind; users' manifests depend on it.
const Group = "karpenter.dklesev.github.io"

var (
	// SchemeGroupVersion is group version used to register these objects.
	SchemeGroupVersion = schema.GroupVersion{Group: Group, Version: "v1beta1"}
	// SchemeBuilder registers our types with a scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds the types in this group-version to the given scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(SchemeGroupVersion,
		&SSHHost{}, &SSHHostList{},
		&SSHNodeClass{}, &SSHNodeClassList{},
		&SSHJoinProfile{}, &SSHJoinProfileList{},
	)
	metav1.AddToGroupVersion(s, SchemeGroupVersion)
	return nil
}

func init() {
	// Karpenter core resolves NodeClasses through client-go's global scheme;
	// without this registration nothing provisions (TESTBED §1).
	if err := AddToScheme(scheme.Scheme); err != nil {
		panic(err)
	}
}
