package instancetype_test

import (
	"testing"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"
	pscheduling "sigs.k8s.io/karpenter/pkg/controllers/provisioning/scheduling"
	"sigs.k8s.io/karpenter/pkg/scheduling"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/providers/instancetype"
)

func poolClass() *v1beta1.SSHNodeClass {
	nc := &v1beta1.SSHNodeClass{Spec: v1beta1.SSHNodeClassSpec{PricePerCPUHour: "0.05"}}
	nc.Name = "pool"
	return nc
}

func newType(t *testing.T, hosts ...v1beta1.SSHHost) *cloudprovider.InstanceType {
	t.Helper()
	it, err := instancetype.New(instancetype.Classes(logr.Discard(), hosts)[0], poolClass())
	if err != nil {
		t.Fatal(err)
	}
	return it
}

func byCapacityType(t *testing.T, it *cloudprovider.InstanceType, ct string) *cloudprovider.Offering {
	t.Helper()
	for _, o := range it.Offerings {
		if o.CapacityType() == ct {
			return o
		}
	}
	t.Fatalf("no %s offering in %v", ct, it.Offerings)
	return nil
}

// Karpenter core reads the reservation from the label kpssh registers.
func TestReservationLabelRegistered(t *testing.T) {
	if cloudprovider.ReservationIDLabel != v1beta1.LabelReservationID || !karpv1.WellKnownLabels.Has(v1beta1.LabelReservationID) ||
		!cloudprovider.ReservedCapacityLabels.Has(v1beta1.LabelReservationID) {
		t.Fatalf("ReservationIDLabel %q, well-known %v, reserved-capacity labels %v", cloudprovider.ReservationIDLabel,
			karpv1.WellKnownLabels.Has(v1beta1.LabelReservationID), cloudprovider.ReservedCapacityLabels.UnsortedList())
	}
}

// A class is a reservation of its free hosts and an on-demand offering,
// at one price; a full class stays a healthy reservation with no capacity
// (what Karpenter's terminate-first looks for) and is not on-demand.
func TestOfferings(t *testing.T) {
	for _, tc := range []struct {
		name     string
		hosts    []v1beta1.SSHHost
		free     int
		onDemand bool
	}{
		{name: "two of three free", hosts: []v1beta1.SSHHost{host("a", "small", "amd64", "2", "2Gi"), host("b", "small", "amd64", "2", "2Gi"), host("c", "small", "amd64", "2", "2Gi", inUse)}, free: 2, onDemand: true},
		{name: "full: every host in use or parked", hosts: []v1beta1.SSHHost{host("a", "small", "amd64", "2", "2Gi", inUse), host("b", "small", "amd64", "2", "2Gi", maintenance)}, free: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			it := newType(t, tc.hosts...)
			if len(it.Offerings) != 2 {
				t.Fatalf("offerings %v, want a reserved and an on-demand one", it.Offerings)
			}
			res, od := byCapacityType(t, it, karpv1.CapacityTypeReserved), byCapacityType(t, it, karpv1.CapacityTypeOnDemand)
			if res.ReservationID() != "pool_small" || res.ReservationCapacity != tc.free || !res.Available || res.Launchable() != (tc.free > 0) {
				t.Errorf("reserved: id %q capacity %d available %v launchable %v, want pool_small %d true %v",
					res.ReservationID(), res.ReservationCapacity, res.Available, res.Launchable(), tc.free, tc.free > 0)
			}
			if od.Available != tc.onDemand || od.Requirements.Get(v1beta1.LabelReservationID).Operator() != corev1.NodeSelectorOpDoesNotExist {
				t.Errorf("on-demand: available %v (want %v), reservation-id %v", od.Available, tc.onDemand, od.Requirements.Get(v1beta1.LabelReservationID))
			}
			if res.Price != 0.1 || od.Price != res.Price {
				t.Errorf("prices reserved %v on-demand %v, want both 0.1 (consolidation never trades one for the other)", res.Price, od.Price)
			}
			if ct := it.Requirements.Get(karpv1.CapacityTypeLabelKey); !ct.Has(karpv1.CapacityTypeReserved) || !ct.Has(karpv1.CapacityTypeOnDemand) || ct.Has(karpv1.CapacityTypeSpot) {
				t.Errorf("capacity-type requirement %v", ct)
			}
		})
	}
}

// Launched pins the offering a NodeClaim takes: the reservation when
// Karpenter reserved it (the NodeClaim names it) or on-demand is not
// allowed, else on-demand; nothing when no offering fits.
func TestLaunched(t *testing.T) {
	it := newType(t, host("a", "small", "amd64", "2", "2Gi"))
	ct := func(v ...string) *scheduling.Requirement {
		return scheduling.NewRequirement(karpv1.CapacityTypeLabelKey, corev1.NodeSelectorOpIn, v...)
	}
	rid := func(v string) *scheduling.Requirement {
		return scheduling.NewRequirement(v1beta1.LabelReservationID, corev1.NodeSelectorOpIn, v)
	}
	for _, tc := range []struct {
		name        string
		reqs        scheduling.Requirements
		ct, reserve string // "" ct: no offering fits
	}{
		{name: "no capacity-type requirement", reqs: scheduling.NewRequirements(), ct: karpv1.CapacityTypeOnDemand},
		{name: "on-demand only (a NodePool of before)", reqs: scheduling.NewRequirements(ct(karpv1.CapacityTypeOnDemand)), ct: karpv1.CapacityTypeOnDemand},
		{name: "both allowed, nothing reserved (static template)", reqs: scheduling.NewRequirements(ct(karpv1.CapacityTypeOnDemand, karpv1.CapacityTypeReserved)), ct: karpv1.CapacityTypeOnDemand},
		{name: "reserved only", reqs: scheduling.NewRequirements(ct(karpv1.CapacityTypeReserved)), ct: karpv1.CapacityTypeReserved, reserve: "pool_small"},
		{name: "Karpenter reserved a slot", reqs: scheduling.NewRequirements(ct(karpv1.CapacityTypeReserved), rid("pool_small")), ct: karpv1.CapacityTypeReserved, reserve: "pool_small"},
		{name: "another class's reservation", reqs: scheduling.NewRequirements(ct(karpv1.CapacityTypeReserved), rid("pool_big"))},
		{name: "spot", reqs: scheduling.NewRequirements(ct(karpv1.CapacityTypeSpot))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := instancetype.Launched(it, tc.reqs)
			if tc.ct == "" {
				if got != nil {
					t.Fatalf("launched as %v, want no offering", got.Requirements)
				}
				return
			}
			if got == nil {
				t.Fatal("no offering")
			}
			labels := map[string]string{}
			for _, r := range got.Requirements.Values() {
				if r.Operator() == corev1.NodeSelectorOpIn && r.Len() == 1 {
					labels[r.Key] = r.Any()
				}
			}
			if labels[karpv1.CapacityTypeLabelKey] != tc.ct || labels[v1beta1.LabelReservationID] != tc.reserve || labels[corev1.LabelInstanceTypeStable] != "small" {
				t.Errorf("node labels %v, want capacity-type %q reservation-id %q", labels, tc.ct, tc.reserve)
			}
			if ct := it.Requirements.Get(karpv1.CapacityTypeLabelKey); ct.Len() != 2 {
				t.Errorf("the offered instance type changed: capacity-type %v", ct)
			}
		})
	}
}

// What Karpenter's terminate-first does with a full pool, on kpssh's own
// offerings: no slot to reserve a replacement in, until the slot of the
// node being replaced is credited back, keyed by the reservation-id label
// the node launched with.
func TestFullPoolFreesTheReplacedNodesSlot(t *testing.T) {
	it := newType(t, host("a", "small", "amd64", "2", "2Gi", inUse), host("b", "small", "amd64", "2", "2Gi", inUse))
	node := instancetype.Launched(it, scheduling.NewRequirements(
		scheduling.NewRequirement(karpv1.CapacityTypeLabelKey, corev1.NodeSelectorOpIn, karpv1.CapacityTypeReserved),
		scheduling.NewRequirement(v1beta1.LabelReservationID, corev1.NodeSelectorOpIn, "pool_small")))
	res := byCapacityType(t, it, karpv1.CapacityTypeReserved)
	rm := pscheduling.NewReservationManager(map[string][]*cloudprovider.InstanceType{"ssh": {it}})
	if rm.CanReserve("replacement", res) {
		t.Fatal("a full pool has a slot to launch a replacement in first")
	}
	rm.Credit(node.Requirements.Get(cloudprovider.ReservationIDLabel).Any(), 1)
	if !rm.CanReserve("replacement", res) {
		t.Fatal("the replaced node's slot, credited back by its reservation-id label, cannot be reserved")
	}
}

// A NodePool that may use the reservation gets no on-demand (Karpenter
// would count the free hosts twice); one that allows only on-demand keeps
// it. Either way both offerings stay listed.
func TestForNodePool(t *testing.T) {
	np := func(reqs ...karpv1.NodeSelectorRequirementWithMinValues) *karpv1.NodePool {
		p := &karpv1.NodePool{}
		p.Spec.Template.Spec.Requirements = reqs
		return p
	}
	ct := func(op corev1.NodeSelectorOperator, v ...string) karpv1.NodeSelectorRequirementWithMinValues {
		return karpv1.NodeSelectorRequirementWithMinValues{Key: karpv1.CapacityTypeLabelKey, Operator: op, Values: v}
	}
	for _, tc := range []struct {
		name     string
		np       *karpv1.NodePool
		onDemand bool
	}{
		{name: "no capacity-type requirement", np: np()},
		{name: "reserved and on-demand", np: np(ct(corev1.NodeSelectorOpIn, "reserved", "on-demand"))},
		{name: "reserved only", np: np(ct(corev1.NodeSelectorOpIn, "reserved"))},
		{name: "on-demand only", np: np(ct(corev1.NodeSelectorOpIn, "on-demand")), onDemand: true},
		{name: "not reserved", np: np(ct(corev1.NodeSelectorOpNotIn, "reserved")), onDemand: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			it := newType(t, host("a", "small", "amd64", "2", "2Gi"))
			instancetype.ForNodePool([]*cloudprovider.InstanceType{it}, tc.np)
			if len(it.Offerings) != 2 {
				t.Fatalf("offerings %v", it.Offerings)
			}
			if od := byCapacityType(t, it, karpv1.CapacityTypeOnDemand); od.Available != tc.onDemand {
				t.Errorf("on-demand available %v, want %v", od.Available, tc.onDemand)
			}
			if res := byCapacityType(t, it, karpv1.CapacityTypeReserved); !res.Available || res.ReservationCapacity != 1 {
				t.Errorf("reserved: available %v capacity %d", res.Available, res.ReservationCapacity)
			}
		})
	}
}
