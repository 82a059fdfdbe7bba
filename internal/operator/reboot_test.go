package operator

import (
	"testing"

	opcontroller "github.com/awslabs/operatorpkg/controller"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	nodehydration "sigs.k8s.io/karpenter/pkg/controllers/node/hydration"
	nodeclaimhydration "sigs.k8s.io/karpenter/pkg/controllers/nodeclaim/hydration"
	nodeclaimreboot "sigs.k8s.io/karpenter/pkg/controllers/nodeclaim/reboot"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/cloudprovider"
)

// Core's reboot controller is swapped for one that sees kpssh's rebooting
// NodeClaims only (the envtest beside it: TestKarpenterDrivesHostsThroughEngine,
// "another provider's reboot").
func TestOnlyOwnReboots(t *testing.T) {
	cp := &cloudprovider.CloudProvider{}
	inner := nodeclaimreboot.NewController(nil, nil, cp, nil, nil)
	other := registerFunc(nil)
	cs := onlyOwnReboots([]opcontroller.Controller{other, inner}, cp)
	if _, ok := cs[1].(ownReboots); !ok || len(cs) != 2 {
		t.Fatalf("controllers after the swap: %T", cs)
	}

	claim := func(group, kind string, rebooting bool) *karpv1.NodeClaim {
		nc := &karpv1.NodeClaim{Spec: karpv1.NodeClaimSpec{NodeClassRef: &karpv1.NodeClassReference{Group: group, Kind: kind, Name: "x"}}}
		if rebooting {
			nc.StatusConditions().SetTrueWithReason(karpv1.ConditionTypeRebooting, karpv1.RebootReasonRequested, "")
		}
		return nc
	}
	for _, tc := range []struct {
		name string
		nc   *karpv1.NodeClaim
		want bool
	}{
		{"ours, rebooting", claim(v1beta1.Group, "SSHNodeClass", true), true},
		{"ours, not rebooting", claim(v1beta1.Group, "SSHNodeClass", false), false},
		{"another provider's, rebooting", claim("karpenter.kwok.sh", "KWOKNodeClass", true), false},
		{"our group, another kind", claim(v1beta1.Group, "Other", true), false},
		{"no nodeClassRef", &karpv1.NodeClaim{}, false},
	} {
		if got := ownRebooting(cp)(tc.nc); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// Core's hydration controllers are swapped for the same ones with
// hydrationWorkers; the rest stay as they are.
func TestFewerHydrationWorkers(t *testing.T) {
	cp := &cloudprovider.CloudProvider{}
	other := nodeclaimreboot.NewController(nil, nil, cp, nil, nil)
	cs := fewerHydrationWorkers([]opcontroller.Controller{
		nodeclaimhydration.NewController(nil, cp), other, nodehydration.NewController(nil, cp),
	}, cp)
	if len(cs) != 3 {
		t.Fatalf("controllers after the swap: %T", cs)
	}
	if h, ok := cs[0].(nodeClaimHydration); !ok || h.inner.Name() != "nodeclaim.hydration" || h.cp != cp {
		t.Errorf("first: %T %+v", cs[0], cs[0])
	}
	if cs[1] != opcontroller.Controller(other) {
		t.Errorf("second: %T, want core's reboot controller untouched", cs[1])
	}
	if h, ok := cs[2].(nodeHydration); !ok || h.inner.Name() != "node.hydration" {
		t.Errorf("third: %T", cs[2])
	}
}
