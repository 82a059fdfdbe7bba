package cloudprovider

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"
	"sigs.k8s.io/karpenter/pkg/scheduling"
	"sigs.k8s.io/karpenter/pkg/utils/resources"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/engine"
	"github.com/dklesev/kpssh/internal/providers/instancetype"
	"github.com/dklesev/kpssh/internal/providers/pool"
)

// UnregisteredTaint is the first taint every joining kubelet registers with:
// Karpenter removes it once it has synced the NodeClaim onto the Node.
const UnregisteredTaint = karpv1.UnregisteredTaintKey + ":NoExecute"

// Create implements cloudprovider.CloudProvider: claim a host (or resume the
// claim this NodeClaim already holds), then install (when the cache marker
// differs), mint a bootstrap token, record its id, join, adopt, record the
// providerID. Every failure releases the host and deletes the token.
func (c *CloudProvider) Create(ctx context.Context, nodeClaim *karpv1.NodeClaim) (*karpv1.NodeClaim, error) {
	if !ours(nodeClaim.Spec.NodeClassRef) {
		return nil, cloudprovider.NewInsufficientCapacityError(fmt.Errorf("node class reference %v is not an SSHNodeClass", nodeClaim.Spec.NodeClassRef))
	}
	nc, err := c.nodeClass(ctx, nodeClaim.Spec.NodeClassRef)
	if err != nil {
		return nil, err
	}
	if nc == nil {
		return nil, cloudprovider.NewInsufficientCapacityError(fmt.Errorf("SSHNodeClass %q not found", nodeClaim.Spec.NodeClassRef.Name))
	}
	if cond := nc.StatusConditions().Get(v1beta1.ConditionReady); cond != nil && cond.IsFalse() {
		return nil, cloudprovider.NewNodeClassNotReadyError(fmt.Errorf("SSHNodeClass %s is not ready: %s: %s", nc.Name, cond.Reason, cond.Message))
	}
	claim := pool.Claim{Name: nodeClaim.Name, UID: nodeClaim.UID}

	its, hosts, err := c.instanceTypes(ctx, nc)
	if err != nil {
		return nil, cloudprovider.NewCreateError(err, "InstanceTypesFailed", err.Error())
	}
	// Resume: a crash (or a failed status write) after the claim leaves the
	// host held by this NodeClaim; never claim a second one. Live read: the
	// cache may not have seen our own claim yet.
	h, err := c.heldBy(ctx, claim)
	if err != nil {
		return nil, err
	}
	var it *cloudprovider.InstanceType
	resumed := h != nil
	if resumed {
		it = launchedAs(nodeClaim, byName(its, h.Class()))
		if h.Status.State == v1beta1.HostInUse && h.Status.ProviderID != "" && it != nil {
			return c.hydrate(nodeClaim, h, it, nc), nil // already launched
		}
	} else {
		h, it, err = c.claim(ctx, nodeClaim, its, hosts, claim)
		if cloudprovider.IsInsufficientCapacityError(err) {
			// The cache may be behind (a host released a moment ago):
			// no capacity is an answer read from the API server.
			if its, hosts, err = c.instanceTypesFrom(ctx, nc, true); err != nil {
				return nil, cloudprovider.NewCreateError(err, "InstanceTypesFailed", err.Error())
			}
			h, it, err = c.claim(ctx, nodeClaim, its, hosts, claim)
		}
		if err != nil {
			return nil, err
		}
		it = launchedAs(nodeClaim, it)
	}
	unlock := c.lock(h.Name)
	defer unlock()
	ctx = withHost(ctx, h)
	if resumed {
		// A claim ClaimOne could not give back (its pool read or the
		// release failed) is not launched if another host of the machine
		// holds a claim or comes first.
		if err := c.refuseDuplicate(ctx, nodeClaim, h, claim); err != nil {
			return nil, err
		}
	}
	if it == nil {
		msg := fmt.Sprintf("host %s's class %q is no longer offered by node class %s", h.Name, h.Class(), nc.Name)
		return nil, c.fail(ctx, nodeClaim, h, claim, failure{event: ReasonCreateFailed, state: v1beta1.HostAvailable, msg: msg}.after(h.JoinRan()))
	}
	return c.launch(ctx, nodeClaim, nc, h, it, claim)
}

// claim picks the cheapest compatible class with a free host and claims the
// oldest free host of it; a lost race moves on to the next candidate.
func (c *CloudProvider) claim(ctx context.Context, nodeClaim *karpv1.NodeClaim, its []*cloudprovider.InstanceType, hosts []v1beta1.SSHHost, claim pool.Claim) (*v1beta1.SSHHost, *cloudprovider.InstanceType, error) {
	compatible := Compatible(nodeClaim, its)
	if len(compatible) == 0 {
		return nil, nil, cloudprovider.NewInsufficientCapacityError(fmt.Errorf("no host class of node class %s fits the NodeClaim's requirements and requests", nodeClaim.Spec.NodeClassRef.Name))
	}
	for _, it := range compatible {
		h, err := c.Pool.ClaimOne(ctx, pool.Candidates(hosts, it.Name), claim)
		if errors.Is(err, pool.ErrNoHost) {
			continue
		}
		if err != nil {
			return nil, nil, err
		}
		if c.claimed != nil {
			c.claimed(nodeClaim.Name)
		}
		log.FromContext(ctx).Info("claimed host", "SSHHost", klog.KObj(h), "class", it.Name)
		return h, it, nil
	}
	return nil, nil, cloudprovider.NewInsufficientCapacityError(fmt.Errorf("no free host in host classes %s", names(compatible)))
}

// previousNodeGone returns an error while the Node named as the host's
// kubelet registers is being deleted: the Node of its previous claim, which Karpenter
// removes only after Delete released the host, so a new claim can get the
// host first. A kubelet joining under that name now would register into
// the terminating object (and be reported as its Node, then lose it). The
// wait is a retry of Create, the host kept claimed. A Node of that name not
// being deleted is this claim's own (a resumed join) or the duplicate
// guard's business.
func (c *CloudProvider) previousNodeGone(ctx context.Context, h *v1beta1.SSHHost, name string) error {
	n := &corev1.Node{}
	if err := c.Live.Get(ctx, client.ObjectKey{Name: name}, n); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	}
	if n.DeletionTimestamp.IsZero() {
		return nil
	}
	return fmt.Errorf("host %s: Node %s of its previous claim is still being deleted (since %s, finalizers %v); the join waits for it",
		h.Name, name, n.DeletionTimestamp.UTC().Format(time.RFC3339), n.Finalizers)
}

// launchedAs is it (nil: nil) as the NodeClaim launches on it: reserved or
// on-demand, its labels pinned (instancetype.Launched).
func launchedAs(nodeClaim *karpv1.NodeClaim, it *cloudprovider.InstanceType) *cloudprovider.InstanceType {
	if it == nil {
		return nil
	}
	return instancetype.Launched(it, scheduling.NewNodeSelectorRequirementsWithMinValues(nodeClaim.Spec.Requirements...))
}

// refuseDuplicate releases the held host h (Available: the host controller
// marks it Duplicate) when, its claim aside, it is not its machine's host.
func (c *CloudProvider) refuseDuplicate(ctx context.Context, nodeClaim *karpv1.NodeClaim, h *v1beta1.SSHHost, claim pool.Claim) error {
	unclaimed := h.DeepCopy()
	unclaimed.Status.ClaimRef = nil
	d, dup, err := c.Pool.SameMachine(ctx, unclaimed)
	if err != nil || !dup {
		return err
	}
	return c.fail(ctx, nodeClaim, h, claim, failure{event: ReasonCreateFailed, state: v1beta1.HostAvailable, msg: d.Message()}.after(h.JoinRan()))
}

// Compatible filters instance types (cheapest first, as given) by the
// NodeClaim's requirements, offerings it can launch into (a free host) and resource requests.
func Compatible(nodeClaim *karpv1.NodeClaim, its []*cloudprovider.InstanceType) []*cloudprovider.InstanceType {
	reqs := scheduling.NewNodeSelectorRequirementsWithMinValues(nodeClaim.Spec.Requirements...)
	var out []*cloudprovider.InstanceType
	for _, it := range its {
		if reqs.Compatible(it.Requirements, instancetype.AllowUndefined) != nil {
			continue
		}
		if len(it.Offerings.Launchable().Compatible(reqs)) == 0 {
			continue
		}
		if !resources.Fits(nodeClaim.Spec.Resources.Requests, it.Allocatable()) {
			continue
		}
		out = append(out, it)
	}
	return out
}

// heldBy finds the host claim holds with a live read selected by the claim
// UID (a selectable field of the CRD): consistent, and one object instead of
// the pool. Name and UID must both match (the fence).
func (c *CloudProvider) heldBy(ctx context.Context, claim pool.Claim) (*v1beta1.SSHHost, error) {
	list := &v1beta1.SSHHostList{}
	if err := c.Live.List(ctx, list, client.InNamespace(c.Pool.Namespace),
		client.MatchingFields{v1beta1.FieldClaimUID: string(claim.UID)}); err != nil {
		return nil, err
	}
	for i := range list.Items {
		if claim.Holds(&list.Items[i]) {
			return &list.Items[i], nil
		}
	}
	return nil, nil
}

// launch runs the phases on a held host.
func (c *CloudProvider) launch(ctx context.Context, nodeClaim *karpv1.NodeClaim, nc *v1beta1.SSHNodeClass, h *v1beta1.SSHHost, it *cloudprovider.InstanceType, claim pool.Claim) (*karpv1.NodeClaim, error) {
	joined := h.JoinRan() // a resumed claim whose join ran before
	fail := func(f failure) error { return c.fail(ctx, nodeClaim, h, claim, f.after(joined)) }
	// A resumed claim may carry the token of an interrupted join: it is
	// dead weight now (the join re-runs with a fresh one).
	if h.Status.BootstrapTokenID != "" {
		if err := c.Tokens.Delete(ctx, h.Status.BootstrapTokenID); err != nil {
			return nil, err
		}
	}
	prof, err := c.profile(ctx, nc.Spec.JoinProfileRef.Name)
	if err != nil {
		return nil, err
	}
	if prof == nil {
		return nil, fail(configFailure(fmt.Sprintf("SSHJoinProfile %q not found", nc.Spec.JoinProfileRef.Name)))
	}
	if NodeAddress(h) == "" {
		return nil, fail(configFailure(fmt.Sprintf("spec.address %q is a DNS name, spec.nodeAddress is unset and no probe has reported the host's IP (status.observedNodeAddress): set spec.nodeAddress", h.Spec.Address)))
	}
	secrets, err := JoinSecrets(ctx, c.Live, c.Pool.Namespace, nc)
	if err != nil {
		if !apierrors.IsNotFound(err) && !errors.Is(err, ErrSecretKey) {
			return nil, err // an API failure: retry, keep the claim
		}
		return nil, fail(configFailure(err.Error()))
	}
	info, err := c.Cluster.Get(ctx, nc)
	if err != nil {
		return nil, fail(configFailure(err.Error()))
	}
	redact := secretValues(secrets)
	pc := JoinContext(h, nc, prof, nodeClaim, it, info, secrets)
	static := nc.Spec.ProviderIDSource != v1beta1.ProviderIDAdopt

	if h.Status.InstalledProfile != prof.Marker() {
		out := c.Phases.Run(ctx, h, prof, engine.PhaseInstall, pc, redact)
		if !out.OK() {
			return nil, fail(phaseFailure(engine.PhaseInstall, out).refusedBy(out, engine.PhaseInstall, h, nc, prof, metav1.NewTime(c.Clock.Now())))
		}
		if h, err = c.Pool.Update(ctx, h.Name, claim, func(h *v1beta1.SSHHost) {
			h.Status.InstalledProfile = prof.Marker()
			h.Status.LastPhase = out.LastPhase
		}); err != nil {
			return nil, c.lost(ctx, nodeClaim, err)
		}
	}

	if err := c.previousNodeGone(ctx, h, pc.NodeName); err != nil {
		return nil, err // retry, keep the claim
	}
	tok, err := c.Tokens.Mint(ctx, nodeClaim.Name)
	if err != nil {
		return nil, fail(failure{event: ReasonCreateFailed, state: v1beta1.HostAvailable, msg: "mint bootstrap token: " + err.Error()})
	}
	// Record the id before the join: whatever happens next, the token is
	// findable (and deletable) from the host. The join marker goes with it:
	// the token GC clears the id once the Node registers, the marker stays.
	if h, err = c.Pool.Update(ctx, h.Name, claim, func(h *v1beta1.SSHHost) {
		h.Status.BootstrapTokenID, h.Status.JoinClaimUID = tok.ID, claim.UID
	}); err != nil {
		_ = c.Tokens.Delete(ctx, tok.ID)
		return nil, c.lost(ctx, nodeClaim, err)
	}
	pc.BootstrapToken = tok.String()
	redact = append(redact, tok.String(), tok.Secret)
	out := c.Phases.Run(ctx, h, prof, engine.PhaseJoin, pc, redact)
	if !out.OK() {
		return nil, fail(phaseFailure(engine.PhaseJoin, out).refusedBy(out, engine.PhaseJoin, h, nc, prof, metav1.NewTime(c.Clock.Now())))
	}

	providerID := pc.ProviderID
	if !static {
		providerID, err = c.adopt(ctx, h, nodeClaim)
		if err != nil {
			f := failure{event: ReasonAdoptFailed, state: v1beta1.HostUnhealthy, msg: err.Error(), lastPhase: out.LastPhase}
			return nil, fail(f)
		}
	}
	if h, err = c.Pool.Update(ctx, h.Name, claim, func(h *v1beta1.SSHHost) {
		h.Status.ProviderID = providerID
		h.Status.LastPhase = out.LastPhase
		h.SetState(v1beta1.HostInUse, "joined as NodeClaim "+nodeClaim.Name, metav1.NewTime(c.Clock.Now()))
		h.SetShimRejection(nil, metav1.NewTime(c.Clock.Now())) // what was refused has changed
	}); err != nil {
		return nil, c.lost(ctx, nodeClaim, err)
	}
	log.FromContext(ctx).Info("host joined", "providerID", providerID)
	return c.hydrate(nodeClaim, h, it, nc), nil
}

func secretValues(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

// NodeLabels is KPSSH_NODE_LABELS: the NodeClaim's labels plus the instance
// type's single-valued ones (it may be nil) and the host class, as `k=v,…`
// sorted, minus what a kubelet may not set on itself (kubernetes.io/k8s.io
// labels outside the kubelet's allowed set make kubelet refuse to start;
// Karpenter syncs those onto the Node) and minus v1beta1.LabelHost
// (JoinContext adds it in Adopt mode). The launched NodeClaim carries every
// label given here (hydrate), so the drift check, which computes them again
// from it, passes the kubelet what the join passed.
func NodeLabels(nodeClaim *karpv1.NodeClaim, it *cloudprovider.InstanceType, class string) string {
	labels := map[string]string{}
	for k, v := range singleValued(it) {
		labels[k] = v
	}
	for k, v := range nodeClaim.Labels {
		labels[k] = v
	}
	labels[v1beta1.LabelHostClass] = class // as hydrate sets it
	// From the kubelet's first registration on: the chart keeps the
	// controller off the nodes it manages (a leave would stop it).
	labels[v1beta1.LabelManaged] = "true"
	var out []string
	for k, v := range labels {
		// The host label is kpssh's to give (JoinContext, Adopt mode): a
		// NodePool's template must not hand a host's identity to a kubelet.
		if kubeletMaySet(k) && k != v1beta1.LabelHost {
			out = append(out, k+"="+v)
		}
	}
	sort.Strings(out)
	return strings.Join(out, ",")
}

// kubeletLabels are the kubernetes.io labels a kubelet may set on itself.
var kubeletLabels = map[string]bool{
	corev1.LabelHostname: true, corev1.LabelArchStable: true, corev1.LabelOSStable: true,
	corev1.LabelInstanceTypeStable: true, corev1.LabelInstanceType: true,
	corev1.LabelTopologyZone: true, corev1.LabelTopologyRegion: true,
	corev1.LabelFailureDomainBetaZone: true, corev1.LabelFailureDomainBetaRegion: true,
	"beta.kubernetes.io/arch": true, "beta.kubernetes.io/os": true,
}

func kubeletMaySet(key string) bool {
	domain, _, ok := strings.Cut(key, "/")
	if !ok {
		return true
	}
	if !(domain == "kubernetes.io" || strings.HasSuffix(domain, ".kubernetes.io") || domain == "k8s.io" || strings.HasSuffix(domain, ".k8s.io")) {
		return true
	}
	if kubeletLabels[key] {
		return true
	}
	// kubelet.kubernetes.io/ and node.kubernetes.io/ subdomains are allowed;
	// node-restriction.kubernetes.io/ is reserved for admins.
	return (domain == "kubelet.kubernetes.io" || domain == "node.kubernetes.io" ||
		strings.HasSuffix(domain, ".kubelet.kubernetes.io") || strings.HasSuffix(domain, ".node.kubernetes.io")) &&
		domain != "node-restriction.kubernetes.io"
}

// Taints is KPSSH_TAINTS: karpenter.sh/unregistered:NoExecute first, then
// the NodeClaim's taints and startup taints (`key[=value]:Effect`).
func Taints(nodeClaim *karpv1.NodeClaim) string {
	out := []string{UnregisteredTaint}
	for _, list := range [][]corev1.Taint{nodeClaim.Spec.Taints, nodeClaim.Spec.StartupTaints} {
		for _, t := range list {
			if t.Key == karpv1.UnregisteredTaintKey {
				continue
			}
			s := t.Key
			if t.Value != "" {
				s += "=" + t.Value
			}
			out = append(out, s+":"+string(t.Effect))
		}
	}
	return strings.Join(out, ",")
}

func byName(its []*cloudprovider.InstanceType, name string) *cloudprovider.InstanceType {
	for _, it := range its {
		if it.Name == name {
			return it
		}
	}
	return nil
}

func names(its []*cloudprovider.InstanceType) string {
	out := make([]string, len(its))
	for i, it := range its {
		out[i] = it.Name
	}
	return strings.Join(out, ", ")
}

// hydrate is the launched NodeClaim Karpenter gets back.
func (c *CloudProvider) hydrate(nodeClaim *karpv1.NodeClaim, h *v1beta1.SSHHost, it *cloudprovider.InstanceType, nc *v1beta1.SSHNodeClass) *karpv1.NodeClaim {
	out := nodeClaim.DeepCopy()
	out.Status.ProviderID = h.Status.ProviderID
	if out.Labels == nil {
		out.Labels = map[string]string{}
	}
	for k, v := range singleValued(it) {
		out.Labels[k] = v
	}
	out.Labels[v1beta1.LabelHostClass] = h.Class()
	out.Labels[v1beta1.LabelManaged] = "true" // Karpenter syncs it onto the Node
	if out.Annotations == nil {
		out.Annotations = map[string]string{}
	}
	out.Annotations[v1beta1.AnnotationNodeClassHash] = NodeClassHash(nc)
	out.Annotations[v1beta1.AnnotationNodeClassHashVersion] = NodeClassHashVersion
	out.Status.Capacity = it.Capacity.DeepCopy()
	out.Status.Allocatable = it.Allocatable()
	return out
}

// hostNodeClaim describes a claimed host for Get/List.
func (c *CloudProvider) hostNodeClaim(ctx context.Context, h *v1beta1.SSHHost) *karpv1.NodeClaim {
	nc := &karpv1.NodeClaim{}
	if r := h.Status.ClaimRef; r != nil {
		nc.Name, nc.UID = r.Name, r.UID
	}
	nc.CreationTimestamp = h.CreationTimestamp
	nc.Status.ProviderID = h.Status.ProviderID
	nc.Labels = map[string]string{
		corev1.LabelInstanceTypeStable: h.Class(),
		v1beta1.LabelHostClass:         h.Class(),
		corev1.LabelTopologyZone:       "pool",
		corev1.LabelOSStable:           string(corev1.Linux),
	}
	// No capacity type: what the claim launched as (reserved or on-demand)
	// is on its NodeClaim, not on the host.
	if h.Status.ObservedArch != "" {
		nc.Labels[corev1.LabelArchStable] = h.Status.ObservedArch
	}
	nc.Status.Capacity = h.Spec.Capacity.DeepCopy()
	return nc
}

// singleValued is the instance type's requirements that pin one value
// (instance-type, arch, os, zone; capacity-type and reservation-id once
// launchedAs pinned them): the labels a Node of it has.
func singleValued(it *cloudprovider.InstanceType) map[string]string {
	out := map[string]string{}
	if it == nil {
		return out
	}
	for _, r := range it.Requirements.Values() {
		if r.Operator() == corev1.NodeSelectorOpIn && r.Len() == 1 {
			out[r.Key] = r.Values()[0]
		}
	}
	return out
}
