// Package cloudprovider is kpssh's Karpenter CloudProvider (name "ssh"): it
// does not create machines, it claims hosts of the pool and runs the join
// profile's phases on them through the phase runner. It knows nothing of
// playbooks: phases are opaque runs that succeed, fail on the host, or are
// refused as configuration errors.
package cloudprovider

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/awslabs/operatorpkg/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"
	"sigs.k8s.io/karpenter/pkg/events"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/engine"
	"github.com/dklesev/kpssh/internal/providers/clusterinfo"
	"github.com/dklesev/kpssh/internal/providers/instancetype"
	"github.com/dklesev/kpssh/internal/providers/phase"
	"github.com/dklesev/kpssh/internal/providers/pool"
	"github.com/dklesev/kpssh/internal/providers/token"
)

// Name is the Karpenter CloudProvider name.
const Name = "ssh"

// DefaultAdoptTimeout bounds the wait for an Adopt-mode Node (seed: ≤ 4 min).
const DefaultAdoptTimeout = 4 * time.Minute

// Phases runs profile phases, and drift checks, on hosts (*phase.Runner).
type Phases interface {
	Run(ctx context.Context, h *v1beta1.SSHHost, p *v1beta1.SSHJoinProfile, ph engine.Phase, c engine.Context, redact []string) phase.Outcome
	RunFallbackLeave(ctx context.Context, h *v1beta1.SSHHost, c engine.Context) phase.Outcome
	Check(ctx context.Context, h *v1beta1.SSHHost, p *v1beta1.SSHJoinProfile, c engine.Context, redact []string) phase.Drift
}

// CloudProvider implements Karpenter's cloudprovider.CloudProvider.
type CloudProvider struct {
	Client   client.Client
	Live     client.Reader // uncached reads for decisions under a claim
	Pool     *pool.Pool
	Phases   Phases
	Tokens   token.Provider
	Cluster  clusterinfo.Provider
	Recorder events.Recorder
	Clock    clock.Clock
	// AdoptTimeout bounds the wait for the Node in Adopt mode.
	AdoptTimeout time.Duration
	// AdoptPoll is the Node poll interval in Adopt mode.
	AdoptPoll time.Duration
	// Repair: when node repair reboots and when it replaces.
	Repair Repair

	locks sync.Map // host name → *hostLock
	// claimed (benchmarks) is called when a claim CAS is won.
	claimed func(nodeClaim string)
}

var _ cloudprovider.CloudProvider = (*CloudProvider)(nil)

// New wires a CloudProvider over the pool namespace.
func New(c client.Client, live client.Reader, namespace string, phases Phases, tokens token.Provider, rec events.Recorder, clk clock.Clock) *CloudProvider {
	if live == nil {
		live = c
	}
	p := pool.New(c, live, namespace)
	return &CloudProvider{
		Client: c, Live: live, Pool: p, Phases: phases, Tokens: tokens,
		Cluster: clusterinfo.New(live), Recorder: rec, Clock: clk,
		AdoptTimeout: DefaultAdoptTimeout, AdoptPoll: 2 * time.Second, Repair: DefaultRepair,
	}
}

// Name implements cloudprovider.CloudProvider.
func (c *CloudProvider) Name() string { return Name }

// GetSupportedNodeClasses implements cloudprovider.CloudProvider.
func (c *CloudProvider) GetSupportedNodeClasses() []status.Object {
	return []status.Object{&v1beta1.SSHNodeClass{}}
}

// RepairPolicies implements cloudprovider.CloudProvider.
func (c *CloudProvider) RepairPolicies() []cloudprovider.RepairPolicy { return c.Repair.Policies() }

// nodeClassGK is the group/kind of our node class in nodeClassRefs.
var nodeClassGK = schema.GroupKind{Group: v1beta1.Group, Kind: "SSHNodeClass"}

func ours(ref *karpv1.NodeClassReference) bool {
	return ref != nil && ref.Group == nodeClassGK.Group && ref.Kind == nodeClassGK.Kind
}

// nodeClass resolves a reference; (nil, nil) when it does not exist.
func (c *CloudProvider) nodeClass(ctx context.Context, ref *karpv1.NodeClassReference) (*v1beta1.SSHNodeClass, error) {
	nc := &v1beta1.SSHNodeClass{}
	if err := c.Client.Get(ctx, client.ObjectKey{Name: ref.Name}, nc); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, err
	}
	return nc, nil
}

func (c *CloudProvider) profile(ctx context.Context, name string) (*v1beta1.SSHJoinProfile, error) {
	p := &v1beta1.SSHJoinProfile{}
	if err := c.Client.Get(ctx, client.ObjectKey{Name: name}, p); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, err
	}
	return p, nil
}

// classHosts lists the pool hosts selected by the node class. A host whose
// shim refused this node class's profile as it still is (a sticky
// ShimRejection) is listed as not free — its class stays offered, the host
// is neither counted available nor claimed; only the copy is changed. So is
// a host that is not its machine's host in the whole pool (pool.Duplicates,
// whatever the node class selects: the other host may be another class's),
// whether or not the host controller has marked it Duplicate yet.
func (c *CloudProvider) classHosts(ctx context.Context, nc *v1beta1.SSHNodeClass, live bool) ([]v1beta1.SSHHost, error) {
	sel := labels.Everything()
	if nc.Spec.HostSelector != nil {
		s, err := metav1LabelSelector(nc)
		if err != nil {
			return nil, err
		}
		sel = s
	}
	// The cache's hosts uncopied: below only a host's own State changes
	// (ClaimOne copies a candidate before it writes).
	list := c.Pool.View
	if live {
		list = c.Pool.LiveHosts
	}
	all, err := list(ctx, nil)
	if err != nil {
		return nil, err
	}
	dups := pool.Duplicates(all)
	hosts := all[:0]
	for i := range all {
		h := &all[i]
		if !sel.Matches(labels.Set(h.Labels)) {
			continue
		}
		if _, dup := dups[h.Name]; dup && pool.Free(h) {
			h.Status.State = v1beta1.HostUnhealthy
		}
		hosts = append(hosts, *h)
	}
	var prof *v1beta1.SSHJoinProfile
	for i := range hosts {
		if hosts[i].Status.ShimRejection != nil {
			if prof, err = c.profile(ctx, nc.Spec.JoinProfileRef.Name); err != nil {
				return nil, err
			}
			break
		}
	}
	if prof == nil {
		return hosts, nil
	}
	for i := range hosts {
		if h := &hosts[i]; h.Status.ShimRejection.Blocks(h, nc, prof) && pool.Free(h) {
			h.Status.State = v1beta1.HostUnhealthy
		}
	}
	return hosts, nil
}

// instanceTypes builds the instance types of a node class, cheapest first,
// with the classes they came from.
func (c *CloudProvider) instanceTypes(ctx context.Context, nc *v1beta1.SSHNodeClass) ([]*cloudprovider.InstanceType, []v1beta1.SSHHost, error) {
	return c.instanceTypesFrom(ctx, nc, false)
}

// instanceTypesFrom is instanceTypes from the cache or (live) the API server.
func (c *CloudProvider) instanceTypesFrom(ctx context.Context, nc *v1beta1.SSHNodeClass, live bool) ([]*cloudprovider.InstanceType, []v1beta1.SSHHost, error) {
	hosts, err := c.classHosts(ctx, nc, live)
	if err != nil {
		return nil, nil, err
	}
	var out []*cloudprovider.InstanceType
	for _, cl := range instancetype.Classes(log.FromContext(ctx), hosts) {
		it, err := instancetype.New(cl, nc)
		if err != nil {
			return nil, nil, fmt.Errorf("node class %s: %w", nc.Name, err)
		}
		out = append(out, it)
	}
	sort.SliceStable(out, func(i, j int) bool { return price(out[i]) < price(out[j]) })
	return out, hosts, nil
}

func price(it *cloudprovider.InstanceType) float64 {
	if len(it.Offerings) == 0 {
		return 0
	}
	return it.Offerings[0].Price
}

// GetInstanceTypes implements cloudprovider.CloudProvider. NodePools of
// other providers get nothing (coexistence with another provider's pools).
func (c *CloudProvider) GetInstanceTypes(ctx context.Context, np *karpv1.NodePool) ([]*cloudprovider.InstanceType, error) {
	if np == nil || !ours(np.Spec.Template.Spec.NodeClassRef) {
		return nil, nil
	}
	nc, err := c.nodeClass(ctx, np.Spec.Template.Spec.NodeClassRef)
	if err != nil || nc == nil {
		return nil, err
	}
	its, _, err := c.instanceTypes(ctx, nc)
	if err != nil {
		// A bad selector is reported on the node class (SelectorError); to
		// Karpenter the pool simply has no types.
		log.FromContext(ctx).Error(err, "building instance types", "SSHNodeClass", klog.KObj(nc))
		return nil, nil
	}
	instancetype.ForNodePool(its, np)
	return its, nil
}

// Get implements cloudprovider.CloudProvider.
func (c *CloudProvider) Get(ctx context.Context, providerID string) (*karpv1.NodeClaim, error) {
	h, err := c.hostByProviderID(ctx, providerID)
	if err != nil {
		return nil, err
	}
	if h == nil {
		return nil, cloudprovider.NewNodeClaimNotFoundError(fmt.Errorf("no claimed host has providerID %q", providerID))
	}
	return c.hostNodeClaim(ctx, h), nil
}

// List implements cloudprovider.CloudProvider: one NodeClaim per joined
// host (providerID recorded). Hosts still mid-create have no providerID and
// no registered NodeClaim for garbage collection to compare against.
func (c *CloudProvider) List(ctx context.Context) ([]*karpv1.NodeClaim, error) {
	hosts, err := c.Pool.Hosts(ctx, nil)
	if err != nil {
		return nil, err
	}
	var out []*karpv1.NodeClaim
	for i := range hosts {
		h := &hosts[i]
		if h.Status.ClaimRef != nil && h.Status.ProviderID != "" {
			out = append(out, c.hostNodeClaim(ctx, h))
		}
	}
	return out, nil
}

// hostByProviderID finds the claimed host that recorded providerID. A
// Static providerID names its host: one cached read, as Karpenter asks per
// NodeClaim (drift, registration). Any other (Adopt: the kubelet's own) or
// a named host that does not hold it: the pool is searched, uncopied.
func (c *CloudProvider) hostByProviderID(ctx context.Context, providerID string) (*v1beta1.SSHHost, error) {
	if providerID == "" {
		return nil, nil
	}
	holds := func(h *v1beta1.SSHHost) bool { return h.Status.ClaimRef != nil && h.Status.ProviderID == providerID }
	if ns, name, err := ParseProviderID(providerID); err == nil && ns == c.Pool.Namespace {
		h := &v1beta1.SSHHost{}
		err := c.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, h)
		if err == nil && holds(h) {
			return h, nil
		}
		if client.IgnoreNotFound(err) != nil {
			return nil, err
		}
	}
	hosts, err := c.Pool.View(ctx, nil)
	if err != nil {
		return nil, err
	}
	for i := range hosts {
		if h := &hosts[i]; holds(h) {
			return h.DeepCopy(), nil
		}
	}
	return nil, nil
}

// IsDrifted implements cloudprovider.CloudProvider.
func (c *CloudProvider) IsDrifted(ctx context.Context, nodeClaim *karpv1.NodeClaim) (cloudprovider.DriftReason, error) {
	if !ours(nodeClaim.Spec.NodeClassRef) {
		return "", nil
	}
	h, err := c.hostByProviderID(ctx, nodeClaim.Status.ProviderID)
	if err != nil || h == nil {
		return "", err
	}
	nc, err := c.nodeClass(ctx, nodeClaim.Spec.NodeClassRef)
	if err != nil || nc == nil {
		return "", err
	}
	p, err := c.profile(ctx, nc.Spec.JoinProfileRef.Name)
	if err != nil {
		return "", err
	}
	return Drifted(h, p, nc, nodeClaim.Annotations), nil
}

// withHost puts the host a NodeClaim holds on ctx's logger, as Karpenter
// puts its objects there ("SSHHost": {name, namespace}). The NodeClaim is
// there already: Karpenter's controller that calls the provider put it.
func withHost(ctx context.Context, h *v1beta1.SSHHost) context.Context {
	return log.IntoContext(ctx, log.FromContext(ctx).WithValues("SSHHost", klog.KObj(h)))
}
