package instancetype_test

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"
	nodemetrics "sigs.k8s.io/karpenter/pkg/controllers/metrics/node"
	pscheduling "sigs.k8s.io/karpenter/pkg/controllers/provisioning/scheduling"
	"sigs.k8s.io/karpenter/pkg/scheduling"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/providers/instancetype"
)

// Every node kpssh launches carries LabelManaged=true (the kubelet's
// --node-labels, and the NodeClaim). Karpenter's scheduling must know it
// before the launch: else a pod that must not run on a kpssh node (the
// chart's controller: node affinity `managed DoesNotExist`) makes Karpenter
// launch a node that the pod can then never use, again and again. The
// checks are the two Karpenter's scheduler makes when it adds a pod to a
// NodeClaim of a NodePool (NodeClaim.CanAdd): the pod's requirements
// against the NodePool's (well-known labels may be undefined there, and any
// label a pod requires absent), then each instance type's requirements
// against both (compatible). (A pod that selects kpssh nodes by the label
// needs it in the NodePool's requirements: it is not well known, see
// TestWellKnownLabelsKeepKarpenterMetrics.)
func TestManagedLabelKnownToScheduling(t *testing.T) {
	it := newType(t, host("a", "small", "amd64", "2", "2Gi"))
	nodePool := scheduling.NewNodeSelectorRequirementsWithMinValues(karpv1.NodeSelectorRequirementWithMinValues{
		Key: karpv1.CapacityTypeLabelKey, Operator: corev1.NodeSelectorOpIn, Values: []string{karpv1.CapacityTypeReserved, karpv1.CapacityTypeOnDemand}})
	affinity := func(op corev1.NodeSelectorOperator, v ...string) *corev1.Pod {
		return &corev1.Pod{Spec: corev1.PodSpec{Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: v1beta1.LabelManaged, Operator: op, Values: v}}}}}}}}}
	}
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		fits bool
	}{
		{"the chart's controller (managed DoesNotExist)", affinity(corev1.NodeSelectorOpDoesNotExist), false},
		{"managed NotIn true", affinity(corev1.NodeSelectorOpNotIn, "true"), false},
		{"a pod that does not care", &corev1.Pod{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := scheduling.NewPodRequirements(tc.pod)
			reqs := scheduling.NewRequirements(nodePool.Values()...)
			err := reqs.Compatible(pod, scheduling.AllowUndefinedWellKnownLabels)
			if err == nil {
				reqs.Add(pod.Values()...)
				err = it.Requirements.Intersects(reqs)
			}
			if (err == nil) != tc.fits {
				t.Fatalf("a kpssh instance type fits the pod: %v (err %v), want %v; requirements %s", err == nil, err, tc.fits, it.Requirements)
			}
		})
	}
	if got := it.Requirements.Get(v1beta1.LabelManaged); got.Len() != 1 || !got.Has("true") {
		t.Fatalf("requirement %s = %s, want In [true] (NodeLabels and hydrate stamp it)", v1beta1.LabelManaged, got)
	}
}

// Karpenter names a node metric label after each well-known label's last
// segment, beside fixed ones of its own ("managed", "node_name", "phase"):
// a well-known label kpssh registers must not collide, or the controller
// panics registering the metrics at start. This registers them as the
// controller does.
func TestWellKnownLabelsKeepKarpenterMetrics(t *testing.T) {
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("Karpenter's node metrics with kpssh's well-known labels: %v", r)
		}
	}()
	nodemetrics.NewController(nil)
}

// A static NodePool (spec.replicas) schedules no pods: its types drop the
// managed requirement, so they pass the check Karpenter's terminate-first
// for static drift makes (the NodePool's template against each type, only
// well-known labels may be undefined: staticReservations). A dynamic
// NodePool's types keep it, and still fit its NodeClaims under
// AllowUndefined (what Create checks).
func TestManagedRequirementPerNodePool(t *testing.T) {
	np := &karpv1.NodePool{}
	np.Name = "static"
	np.Spec.Template.Spec.NodeClassRef = &karpv1.NodeClassReference{Group: v1beta1.Group, Kind: "SSHNodeClass", Name: "pool"}
	np.Spec.Template.Spec.Requirements = []karpv1.NodeSelectorRequirementWithMinValues{{
		Key: karpv1.CapacityTypeLabelKey, Operator: corev1.NodeSelectorOpIn, Values: []string{karpv1.CapacityTypeReserved, karpv1.CapacityTypeOnDemand}}}
	replicas := int64(2)
	for _, tc := range []struct {
		name     string
		replicas *int64
		managed  bool
	}{{"static", &replicas, false}, {"dynamic", nil, true}} {
		t.Run(tc.name, func(t *testing.T) {
			np.Spec.Replicas = tc.replicas
			its := []*cloudprovider.InstanceType{newType(t, host("a", "small", "amd64", "2", "2Gi"))}
			instancetype.ForNodePool(its, np)
			nct := pscheduling.NewNodeClaimTemplate(np)
			if got := its[0].Requirements.Has(v1beta1.LabelManaged); got != tc.managed {
				t.Fatalf("managed requirement %v, want %v", got, tc.managed)
			}
			if err := nct.Requirements.Compatible(its[0].Requirements, instancetype.AllowUndefined); err != nil {
				t.Fatalf("the NodePool's template does not fit its type (AllowUndefined): %v", err)
			}
			if !tc.managed {
				if err := nct.Requirements.Compatible(its[0].Requirements, scheduling.AllowUndefinedWellKnownLabels); err != nil {
					t.Fatalf("Karpenter's static terminate-first check: %v", err)
				}
			}
		})
	}
}
