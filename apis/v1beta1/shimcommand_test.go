package v1beta1_test

import (
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"

	"github.com/dklesev/kpssh/apis/crds"
	"github.com/dklesev/kpssh/internal/probe"
)

// The CRD's rule for spec.shimCommand (the kubebuilder markers) and the
// probe's check of objects stored before it (probe.ValidateShimCommand) are
// one rule written twice: they must not drift apart.
func TestShimCommandRuleMatchesProbe(t *testing.T) {
	b, err := crds.FS.ReadFile("karpenter.dklesev.github.io_sshhosts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.Unmarshal(b, &crd); err != nil {
		t.Fatal(err)
	}
	for _, v := range crd.Spec.Versions {
		f := v.Schema.OpenAPIV3Schema.Properties["spec"].Properties["shimCommand"]
		if f.Pattern != probe.ShimCommandPattern {
			t.Errorf("%s: spec.shimCommand pattern %q, probe.ShimCommandPattern %q", v.Name, f.Pattern, probe.ShimCommandPattern)
		}
		if f.MaxLength == nil || *f.MaxLength != probe.MaxShimCommand {
			t.Errorf("%s: spec.shimCommand maxLength %v, probe.MaxShimCommand %d", v.Name, f.MaxLength, probe.MaxShimCommand)
		}
	}
}
