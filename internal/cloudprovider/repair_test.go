package cloudprovider

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"
)

func TestRepairPolicies(t *testing.T) {
	fallbacks := 0
	covered := map[corev1.ConditionStatus]bool{}
	for _, p := range RepairPolicies() {
		if p.ReasonRegex == "" {
			fallbacks++
			if p.Action != cloudprovider.ReplaceNode {
				t.Errorf("fallback action %s, Karpenter requires ReplaceNode", p.Action)
			}
		}
		if p.ConditionType != corev1.NodeReady || p.TolerationDuration != RepairTolerance {
			t.Errorf("policy %+v", p)
		}
		covered[p.ConditionStatus] = true
	}
	if fallbacks != 1 || !covered[corev1.ConditionFalse] || !covered[corev1.ConditionUnknown] {
		t.Fatalf("fallbacks %d, covered %v", fallbacks, covered)
	}
}
