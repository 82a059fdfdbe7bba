// Package instancetype turns host classes into Karpenter instance types, by
// the seed's rules: one instance type per class; capacity is the
// per-resource minimum over the class (a resource some host lacks is
// dropped); one architecture per class or the class is skipped; classes with
// no probed host are not advertised; price = pricePerCPUHour × vCPU.
//
// A class is offered twice, at the same price: as a capacity reservation
// (capacity type reserved, its free hosts the reservation's capacity), and
// on-demand, available while a host is free, to NodePools that allow only
// on-demand (ForNodePool). Hosts you own are a reservation: a fixed number of exclusive
// slots, and Karpenter knows to terminate a drifted or unhealthy node first
// (TerminateFirstDrift, TerminateFirstRepair) only when it holds a slot of a
// full reservation. A full pool could never launch a replacement first.
package instancetype

import (
	"fmt"
	"sort"
	"strconv"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/sets"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"
	"sigs.k8s.io/karpenter/pkg/scheduling"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/providers/pool"
)

// Zone every offering carries: the pool is one place.
const Zone = "pool"

// CapacityTypes a class is offered as: the hosts are owned, never spot.
var CapacityTypes = []string{karpv1.CapacityTypeReserved, karpv1.CapacityTypeOnDemand}

// Karpenter core learns the reservation label from its provider through
// package variables (as every provider sets them). The managed label is
// not made well known: Karpenter names a node metric label after each
// well-known label's last segment, and "managed" is one of its own (the
// controller would panic at start).
func init() {
	karpv1.WellKnownLabels.Insert(v1beta1.LabelReservationID)
	cloudprovider.ReservationIDLabel = v1beta1.LabelReservationID
	cloudprovider.ReservedCapacityLabels.Insert(v1beta1.LabelReservationID)
}

// Class is the computed view of one host class.
type Class struct {
	Name     string
	Arch     string
	Capacity corev1.ResourceList
	Free     int
	Hosts    int
}

// Classes groups hosts (already filtered by the node class selector) into
// classes. Skipped classes are logged with the reason; they are never
// claimable because they are never advertised.
func Classes(log logr.Logger, hosts []v1beta1.SSHHost) []Class {
	byClass := map[string][]*v1beta1.SSHHost{}
	for i := range hosts {
		h := &hosts[i]
		byClass[h.Class()] = append(byClass[h.Class()], h)
	}
	names := make([]string, 0, len(byClass))
	for n := range byClass {
		names = append(names, n)
	}
	sort.Strings(names)
	var out []Class
	for _, name := range names {
		members := byClass[name]
		arches := map[string]bool{}
		for _, h := range members {
			if h.Status.ObservedArch != "" {
				arches[h.Status.ObservedArch] = true
			}
		}
		if len(arches) == 0 {
			continue // no probed host yet: not advertised
		}
		if len(arches) > 1 {
			log.Error(fmt.Errorf("host class %q mixes architectures %v", name, keys(arches)), "skipping host class: split it into one class per architecture", "class", name)
			continue
		}
		c := Class{Name: name, Arch: keys(arches)[0], Capacity: minCapacity(members), Hosts: len(members)}
		for _, h := range members {
			if pool.Free(h) {
				c.Free++
			}
		}
		out = append(out, c)
	}
	return out
}

// minCapacity is the per-resource minimum over spec.capacity; a resource
// missing on any host is dropped (Karpenter cannot know which host answers).
func minCapacity(hosts []*v1beta1.SSHHost) corev1.ResourceList {
	out := corev1.ResourceList{}
	for name, q := range hosts[0].Spec.Capacity {
		min := q.DeepCopy()
		present := true
		for _, h := range hosts[1:] {
			o, ok := h.Spec.Capacity[name]
			if !ok {
				present = false
				break
			}
			if o.Cmp(min) < 0 {
				min = o.DeepCopy()
			}
		}
		if present {
			out[name] = min
		}
	}
	return out
}

// New builds the instance type of one class under a node class.
func New(c Class, nc *v1beta1.SSHNodeClass) (*cloudprovider.InstanceType, error) {
	capacity := c.Capacity.DeepCopy()
	capacity[corev1.ResourcePods] = *resource.NewQuantity(Pods(capacity, nc.Spec.MaxPods), resource.DecimalSI)

	price, err := Price(nc.Spec.PricePerCPUHour, capacity.Cpu())
	if err != nil {
		return nil, err
	}
	reserved := nc.Spec.KubeReserved.DeepCopy()
	if len(reserved) == 0 {
		reserved = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("80m"), corev1.ResourceMemory: resource.MustParse("300Mi")}
	}
	return &cloudprovider.InstanceType{
		Name: c.Name,
		Requirements: scheduling.NewRequirements(
			scheduling.NewRequirement(corev1.LabelInstanceTypeStable, corev1.NodeSelectorOpIn, c.Name),
			scheduling.NewRequirement(corev1.LabelArchStable, corev1.NodeSelectorOpIn, c.Arch),
			scheduling.NewRequirement(corev1.LabelOSStable, corev1.NodeSelectorOpIn, string(corev1.Linux)),
			scheduling.NewRequirement(corev1.LabelTopologyZone, corev1.NodeSelectorOpIn, Zone),
			scheduling.NewRequirement(karpv1.CapacityTypeLabelKey, corev1.NodeSelectorOpIn, CapacityTypes...),
			// Every node kpssh launches carries it (the kubelet's labels):
			// Karpenter then never launches one for a pod that must not run
			// on a kpssh node (the chart's controller, affinity DoesNotExist).
			scheduling.NewRequirement(v1beta1.LabelManaged, corev1.NodeSelectorOpIn, "true"),
		),
		Offerings: cloudprovider.Offerings{{
			Requirements: scheduling.NewRequirements(
				scheduling.NewRequirement(corev1.LabelTopologyZone, corev1.NodeSelectorOpIn, Zone),
				scheduling.NewRequirement(karpv1.CapacityTypeLabelKey, corev1.NodeSelectorOpIn, karpv1.CapacityTypeReserved),
				scheduling.NewRequirement(v1beta1.LabelReservationID, corev1.NodeSelectorOpIn, v1beta1.ReservationID(nc.Name, c.Name)),
			),
			Price: price,
			// A full reservation stays available (Karpenter's sense: healthy)
			// with no capacity: a node holding a slot of it is what
			// terminate-first replaces.
			Available:           true,
			ReservationCapacity: c.Free,
		}, {
			Requirements: scheduling.NewRequirements(
				scheduling.NewRequirement(corev1.LabelTopologyZone, corev1.NodeSelectorOpIn, Zone),
				scheduling.NewRequirement(karpv1.CapacityTypeLabelKey, corev1.NodeSelectorOpIn, karpv1.CapacityTypeOnDemand),
				scheduling.NewRequirement(v1beta1.LabelReservationID, corev1.NodeSelectorOpDoesNotExist),
			),
			Price: price,
			// An exhausted class stays advertised, marked unavailable: dropping
			// an instance type confuses Karpenter's consolidation.
			Available: c.Free > 0,
		}},
		Capacity: capacity,
		Overhead: &cloudprovider.InstanceTypeOverhead{KubeReserved: reserved},
	}, nil
}

// ForNodePool adjusts its, fresh from New, to the NodePool they are offered
// to: a NodePool that may launch into the hosts' reservation gets no
// on-demand. Karpenter takes on-demand capacity as unlimited, so it would
// count the reservation's free hosts again: a batch, or a drift replacement
// beside pods still pending, would create more NodeClaims than there are
// free hosts (each failing InsufficientCapacity, a replace-first command
// aborted with it). The offering stays listed, unavailable, so that nodes
// the NodePool launched on-demand before are not drifted (Karpenter's
// InstanceTypeNotFound).
//
// A static NodePool (spec.replicas) schedules no pods, so its types drop
// the managed requirement: Karpenter's terminate-first for static drift
// checks a type against the NodePool's template allowing only well-known
// labels undefined, and the managed label is not one (AllowUndefined).
func ForNodePool(its []*cloudprovider.InstanceType, np *karpv1.NodePool) {
	if np.Spec.Replicas != nil {
		for _, it := range its {
			delete(it.Requirements, v1beta1.LabelManaged)
		}
	}
	reqs := scheduling.NewNodeSelectorRequirementsWithMinValues(np.Spec.Template.Spec.Requirements...)
	if !reqs.Get(karpv1.CapacityTypeLabelKey).Has(karpv1.CapacityTypeReserved) {
		return
	}
	for _, it := range its {
		for _, o := range it.Offerings {
			if o.CapacityType() == karpv1.CapacityTypeOnDemand {
				o.Available = false
			}
		}
	}
}

// AllowUndefined is Karpenter's scheduling.AllowUndefinedWellKnownLabels
// plus the managed label, for checking a type's requirements against a
// NodeClaim's: every type requires managed=true, a NodeClaim names the
// label only when a pod did.
func AllowUndefined(o *scheduling.CompatibilityOptions) {
	o.AllowUndefined = karpv1.WellKnownLabels.Union(sets.New(v1beta1.LabelManaged))
}

// Launched is it as a node of it launches for a NodeClaim of requirements
// reqs: a copy whose requirements pin the offering taken, so its
// single-valued ones are the node's labels. The reservation when reqs name
// it (Karpenter reserved a slot of it for the NodeClaim) or when on-demand
// is not allowed; else on-demand. It is nil when no offering fits reqs.
func Launched(it *cloudprovider.InstanceType, reqs scheduling.Requirements) *cloudprovider.InstanceType {
	var reserved, onDemand *cloudprovider.Offering
	for _, o := range it.Offerings.Compatible(reqs) {
		switch o.CapacityType() {
		case karpv1.CapacityTypeReserved:
			reserved = o
		case karpv1.CapacityTypeOnDemand:
			onDemand = o
		}
	}
	take := onDemand
	if reserved != nil && (onDemand == nil || reqs.Has(v1beta1.LabelReservationID)) {
		take = reserved
	}
	if take == nil {
		return nil
	}
	out := it.DeepCopy()
	out.Requirements.Add(take.Requirements.Values()...)
	return out
}

// DefaultPods is a node's pods capacity when neither the node class
// (maxPods) nor the hosts (capacity.pods) say: the kubelet's default.
const DefaultPods = 110

// Pods is a class's pods capacity (SPEC §1: capacity.pods is honoured unless
// the node class sets maxPods): maxPods when set, above or below the hosts'
// figure; else the hosts' capacity.pods; else DefaultPods.
func Pods(hostCapacity corev1.ResourceList, maxPods *int32) int64 {
	if maxPods != nil {
		return int64(*maxPods)
	}
	if declared, ok := hostCapacity[corev1.ResourcePods]; ok {
		return declared.Value()
	}
	return DefaultPods
}

// Price is pricePerCPUHour × vCPU.
func Price(perCPUHour string, cpu *resource.Quantity) (float64, error) {
	if perCPUHour == "" {
		perCPUHour = "0.02"
	}
	p, err := strconv.ParseFloat(perCPUHour, 64)
	if err != nil || p < 0 {
		return 0, fmt.Errorf("pricePerCPUHour %q is not a non-negative number", perCPUHour)
	}
	return p * float64(cpu.MilliValue()) / 1000, nil
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
