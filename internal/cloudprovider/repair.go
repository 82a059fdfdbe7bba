package cloudprovider

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"
)

// RepairTolerance is how long a node may be NotReady/Unknown before
// Karpenter replaces it (the seed's 10 minutes).
const RepairTolerance = 10 * time.Minute

// RepairPolicies: Ready False or Unknown for 10 minutes → replace. Karpenter
// requires exactly one default fallback (empty reason regex) and that it
// replaces; Unknown is covered by a match-all reason regex of its own.
func RepairPolicies() []cloudprovider.RepairPolicy {
	return []cloudprovider.RepairPolicy{
		{ConditionType: corev1.NodeReady, ConditionStatus: corev1.ConditionFalse, TolerationDuration: RepairTolerance, Action: cloudprovider.ReplaceNode},
		{ConditionType: corev1.NodeReady, ConditionStatus: corev1.ConditionUnknown, ReasonRegex: ".*", TolerationDuration: RepairTolerance, Action: cloudprovider.ReplaceNode},
	}
}
