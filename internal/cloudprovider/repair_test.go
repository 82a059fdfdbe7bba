package cloudprovider

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"
	"sigs.k8s.io/karpenter/pkg/controllers/node/health"
	coreoptions "sigs.k8s.io/karpenter/pkg/operator/options"
)

// TestRepairPolicies runs the policy set through Karpenter's own matcher
// (what its node repair compiles at start and resolves every pass): it
// must accept the set, and a node NotReady for a while must get the
// action the policy table in docs/provider.md promises.
func TestRepairPolicies(t *testing.T) {
	ctx := coreoptions.ToContext(context.Background(), &coreoptions.Options{FeatureGates: coreoptions.FeatureGates{NodeRepair: true}})
	since := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	node := func(st corev1.ConditionStatus, reason string) *corev1.Node {
		return &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{CreationTimestamp: metav1.NewTime(since.Add(-time.Hour))},
			Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{
				{Type: corev1.NodeReady, Status: st, Reason: reason, LastTransitionTime: metav1.NewTime(since)}}},
		}
	}
	for _, tc := range []struct {
		name     string
		repair   Repair
		node     *corev1.Node
		after    time.Duration // since the condition's transition
		rebooted time.Duration // reboot finished this long after the transition (0: never)
		want     cloudprovider.RepairAction
	}{
		{"Ready: nothing", DefaultRepair, node(corev1.ConditionTrue, "KubeletReady"), time.Hour, 0, ""},
		{"NotReady 9m: within toleration", DefaultRepair, node(corev1.ConditionFalse, "KubeletNotReady"), 9 * time.Minute, 0, ""},
		{"NotReady 10m: reboot", DefaultRepair, node(corev1.ConditionFalse, "KubeletNotReady"), 10 * time.Minute, 0, cloudprovider.RebootNode},
		{"Unknown 10m (no heartbeat): reboot", DefaultRepair, node(corev1.ConditionUnknown, "NodeStatusUnknown"), 10 * time.Minute, 0, cloudprovider.RebootNode},
		{"NotReady, no reason: reboot", DefaultRepair, node(corev1.ConditionFalse, ""), 11 * time.Minute, 0, cloudprovider.RebootNode},
		{"NotReady 30m: replace", DefaultRepair, node(corev1.ConditionFalse, "KubeletNotReady"), 30 * time.Minute, 0, cloudprovider.ReplaceNode},
		{"Unknown 30m: replace", DefaultRepair, node(corev1.ConditionUnknown, "NodeStatusUnknown"), 30 * time.Minute, 0, cloudprovider.ReplaceNode},
		{"still NotReady 9m after the reboot: nothing yet", DefaultRepair, node(corev1.ConditionFalse, "KubeletNotReady"), 20 * time.Minute, 11 * time.Minute, ""},
		// Karpenter's own history turns a third reboot within 24 h into a replacement.
		{"still NotReady 10m after the reboot: reboot again", DefaultRepair, node(corev1.ConditionFalse, "KubeletNotReady"), 21 * time.Minute, 11 * time.Minute, cloudprovider.RebootNode},
		{"still NotReady 30m after the reboot: replace", DefaultRepair, node(corev1.ConditionFalse, "KubeletNotReady"), 41 * time.Minute, 11 * time.Minute, cloudprovider.ReplaceNode},
		{"reboot off: replace at replace-after", Repair{ReplaceAfter: 10 * time.Minute}, node(corev1.ConditionFalse, "KubeletNotReady"), 10 * time.Minute, 0, cloudprovider.ReplaceNode},
		{"reboot off: nothing before", Repair{ReplaceAfter: 10 * time.Minute}, node(corev1.ConditionUnknown, "NodeStatusUnknown"), 9 * time.Minute, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.repair.Validate(); err != nil {
				t.Fatal(err)
			}
			cp := &CloudProvider{Repair: tc.repair}
			m, err := health.NewRepairPolicyMatcher(ctx, cp)
			if err != nil || m == nil {
				t.Fatalf("Karpenter refuses the policy set: %v", err)
			}
			var notBefore time.Time
			if tc.rebooted > 0 {
				notBefore = since.Add(tc.rebooted)
			}
			got := health.Resolve(m.Match(tc.node), since.Add(tc.after), notBefore)
			if got.Action != tc.want {
				t.Errorf("action %q, want %q (%v)", got.Action, tc.want, got.LogValues())
			}
		})
	}
}

func TestRepairValidate(t *testing.T) {
	for _, tc := range []struct {
		r  Repair
		ok bool
	}{
		{DefaultRepair, true},
		{Repair{ReplaceAfter: time.Minute}, true},
		{Repair{RebootAfter: time.Minute}, false},
		{Repair{RebootAfter: 10 * time.Minute, ReplaceAfter: 10 * time.Minute}, false},
		{Repair{RebootAfter: -time.Minute, ReplaceAfter: time.Hour}, false},
	} {
		if err := tc.r.Validate(); (err == nil) != tc.ok {
			t.Errorf("%+v: %v", tc.r, err)
		}
	}
}
