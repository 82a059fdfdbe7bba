package cloudprovider

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"
)

// Repair is when Karpenter's node repair acts on a node whose kubelet is
// not Ready (False or Unknown). A pool of machines you own cannot launch a
// replacement host at will, and a sick node is often fixed by a reboot:
// so the reboot comes first and the replacement after.
type Repair struct {
	// RebootAfter: NotReady this long → RebootNode (Reboot runs the
	// profile's reboot phase; same host, Node and claim). 0: never reboot.
	RebootAfter time.Duration
	// ReplaceAfter: NotReady this long → ReplaceNode (leave, another host
	// joins). Karpenter measures it from the end of the last reboot, and
	// itself replaces once two reboots in 24 h did not help.
	ReplaceAfter time.Duration
}

// DefaultRepair: reboot after the seed's 10 minutes, replace after 30.
var DefaultRepair = Repair{RebootAfter: 10 * time.Minute, ReplaceAfter: 30 * time.Minute}

// Validate says why r cannot make a policy set Karpenter accepts.
func (r Repair) Validate() error {
	switch {
	case r.RebootAfter < 0:
		return fmt.Errorf("repair reboot-after %s is negative", r.RebootAfter)
	case r.ReplaceAfter <= 0:
		return fmt.Errorf("repair replace-after %s must be positive", r.ReplaceAfter)
	case r.RebootAfter > 0 && r.ReplaceAfter <= r.RebootAfter:
		return fmt.Errorf("repair replace-after %s must exceed reboot-after %s: a reboot gets its chance first", r.ReplaceAfter, r.RebootAfter)
	}
	return nil
}

// Policies is the set for Karpenter: for Ready False and Unknown (any
// reason) a reboot policy and a replace policy; of those eligible
// Karpenter takes the most disruptive, so the replacement wins once its
// longer toleration has passed. Karpenter also requires exactly one
// default fallback (empty reason regex) that replaces; with ".*" matching
// every reason it never applies, but it must be there.
func (r Repair) Policies() []cloudprovider.RepairPolicy {
	var out []cloudprovider.RepairPolicy
	for _, st := range []corev1.ConditionStatus{corev1.ConditionFalse, corev1.ConditionUnknown} {
		if r.RebootAfter > 0 {
			out = append(out, cloudprovider.RepairPolicy{ConditionType: corev1.NodeReady, ConditionStatus: st, ReasonRegex: ".*",
				TolerationDuration: r.RebootAfter, Action: cloudprovider.RebootNode})
		}
		out = append(out, cloudprovider.RepairPolicy{ConditionType: corev1.NodeReady, ConditionStatus: st, ReasonRegex: ".*",
			TolerationDuration: r.ReplaceAfter, Action: cloudprovider.ReplaceNode})
	}
	return append(out, cloudprovider.RepairPolicy{ConditionType: corev1.NodeReady, ConditionStatus: corev1.ConditionFalse,
		TolerationDuration: r.ReplaceAfter, Action: cloudprovider.ReplaceNode})
}
