// Package startuptaint removes a Node's startup taints once the gates of its
// SSHNodeClass hold (spec.startupTaintGates): a taint stays until, say, the
// CNI's pods on that node are Ready or the node reports a condition. Nodes of
// other providers, and taints no gate names, are never touched.
package startuptaint

import (
	"context"
	"errors"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	controllerruntime "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/karpenter/pkg/events"

	"github.com/dklesev/kpssh/apis/v1beta1"
)

// Field indexes this controller registers. The names are its own: Karpenter's
// operator registers "status.providerID" and "spec.nodeName" on the same
// informers, and a second indexer under an existing name is an error.
const (
	// claimIndex maps our NodeClaims (nodeClassRef → SSHNodeClass) to
	// "pid/<providerID>", "node/<nodeName>" and "class/<class>".
	claimIndex = v1beta1.Group + "/startuptaint-claim"
	// podNodeIndex maps Pods to spec.nodeName.
	podNodeIndex = v1beta1.Group + "/startuptaint-pod-node"
	// nodePIDIndex maps Nodes to spec.providerID.
	nodePIDIndex = v1beta1.Group + "/startuptaint-node-pid"
)

// nodeClassKind is the kind a NodeClaim's nodeClassRef names for our classes.
const nodeClassKind = "SSHNodeClass"

// Controller reconciles Nodes.
type Controller struct {
	Client   client.Client
	Recorder events.Recorder
	Clock    clock.Clock
}

// New returns a Controller on the real clock.
func New(c client.Client, rec events.Recorder) *Controller {
	return &Controller{Client: c, Recorder: rec, Clock: clock.RealClock{}}
}

// Register adds the indexes and the controller to mgr. Pods wake their Node
// (podsReady gates), NodeClaims wake theirs once linked (a Node may appear
// before Karpenter links it), and SSHNodeClasses wake their Nodes (a gate
// added or fixed on a live class applies at once).
func (c *Controller) Register(mgr manager.Manager) error {
	ctx := context.Background()
	idx := mgr.GetFieldIndexer()
	if err := idx.IndexField(ctx, &karpv1.NodeClaim{}, claimIndex, claimKeys); err != nil {
		return err
	}
	if err := idx.IndexField(ctx, &corev1.Pod{}, podNodeIndex, podNode); err != nil {
		return err
	}
	if err := idx.IndexField(ctx, &corev1.Node{}, nodePIDIndex, nodePID); err != nil {
		return err
	}
	return controllerruntime.NewControllerManagedBy(mgr).
		Named("node.startuptaint").
		// Heartbeats of untainted nodes and nodes outside Karpenter are noise.
		For(&corev1.Node{}, builder.WithPredicates(predicate.NewPredicateFuncs(candidate))).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(podToNode)).
		Watches(&karpv1.NodeClaim{}, handler.EnqueueRequestsFromMapFunc(claimToNode)).
		Watches(&v1beta1.SSHNodeClass{}, handler.EnqueueRequestsFromMapFunc(c.classToNodes)).
		Complete(c)
}

func candidate(o client.Object) bool {
	n, ok := o.(*corev1.Node)
	return ok && n.Labels[karpv1.NodePoolLabelKey] != "" && len(n.Spec.Taints) > 0
}

func ours(nc *karpv1.NodeClaim) bool {
	r := nc.Spec.NodeClassRef
	return r != nil && r.Group == v1beta1.Group && r.Kind == nodeClassKind && r.Name != ""
}

func claimKeys(o client.Object) []string {
	nc, ok := o.(*karpv1.NodeClaim)
	if !ok || !ours(nc) {
		return nil
	}
	keys := []string{"class/" + nc.Spec.NodeClassRef.Name}
	if nc.Status.ProviderID != "" {
		keys = append(keys, "pid/"+nc.Status.ProviderID)
	}
	if nc.Status.NodeName != "" {
		keys = append(keys, "node/"+nc.Status.NodeName)
	}
	return keys
}

func podNode(o client.Object) []string {
	if p, ok := o.(*corev1.Pod); ok && p.Spec.NodeName != "" {
		return []string{p.Spec.NodeName}
	}
	return nil
}

func nodePID(o client.Object) []string {
	if n, ok := o.(*corev1.Node); ok && n.Spec.ProviderID != "" {
		return []string{n.Spec.ProviderID}
	}
	return nil
}

func nodeRequest(name string) []reconcile.Request {
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: name}}}
}

func podToNode(_ context.Context, o client.Object) []reconcile.Request {
	if p, ok := o.(*corev1.Pod); ok && p.Spec.NodeName != "" {
		return nodeRequest(p.Spec.NodeName)
	}
	return nil
}

func claimToNode(_ context.Context, o client.Object) []reconcile.Request {
	if nc, ok := o.(*karpv1.NodeClaim); ok && ours(nc) && nc.Status.NodeName != "" {
		return nodeRequest(nc.Status.NodeName)
	}
	return nil
}

func (c *Controller) classToNodes(ctx context.Context, o client.Object) []reconcile.Request {
	list := &karpv1.NodeClaimList{}
	if err := c.Client.List(ctx, list, client.MatchingFields{claimIndex: "class/" + o.GetName()}); err != nil {
		log.FromContext(ctx).Error(err, "listing NodeClaims of SSHNodeClass", "SSHNodeClass", klog.KObj(o))
		return nil
	}
	var out []reconcile.Request
	for i := range list.Items {
		nc := &list.Items[i]
		if nc.Status.NodeName != "" {
			out = append(out, nodeRequest(nc.Status.NodeName)...)
			continue
		}
		if nc.Status.ProviderID == "" {
			continue
		}
		// Not linked by Karpenter yet: Reconcile finds the claim by providerID, so must we.
		nodes := &corev1.NodeList{}
		if err := c.Client.List(ctx, nodes, client.MatchingFields{nodePIDIndex: nc.Status.ProviderID}); err != nil {
			log.FromContext(ctx).Error(err, "listing Nodes by providerID", "SSHNodeClass", klog.KObj(o))
			continue
		}
		for j := range nodes.Items {
			out = append(out, nodeRequest(nodes.Items[j].Name)...)
		}
	}
	return out
}

// Reconcile evaluates the gates whose taint the Node still carries and
// removes the taints of those that hold, in one optimistic-locked patch.
func (c *Controller) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	node := &corev1.Node{}
	if err := c.Client.Get(ctx, req.NamespacedName, node); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !node.DeletionTimestamp.IsZero() || !candidate(node) {
		return reconcile.Result{}, nil
	}
	// Until registration Karpenter merges the NodeClaim's startup taints into
	// the Node, so a taint removed earlier would come straight back.
	if node.Labels[karpv1.NodeRegisteredLabelKey] != "true" {
		return reconcile.Result{}, nil
	}
	class, err := c.classOf(ctx, node)
	if err != nil || class == nil {
		return reconcile.Result{}, err
	}

	var removed []verdict
	done := map[string]bool{}
	for i := range class.Spec.StartupTaintGates {
		g := &class.Spec.StartupTaintGates[i]
		if done[g.TaintKey] || !hasTaint(node, g.TaintKey) {
			continue
		}
		v, err := c.evaluate(ctx, node, g)
		var bad *invalidGateError
		if errors.As(err, &bad) {
			// A fix to the class wakes the Node again (class watch); retrying
			// sooner cannot help.
			c.Recorder.Publish(gateInvalid(node, class.Name, g.TaintKey, bad))
			continue
		}
		if err != nil {
			return reconcile.Result{}, err
		}
		if v.holds {
			done[g.TaintKey] = true
			removed = append(removed, v)
		}
	}
	if len(removed) == 0 {
		return reconcile.Result{}, nil
	}

	patched := node.DeepCopy()
	patched.Spec.Taints = patched.Spec.Taints[:0:0]
	for _, t := range node.Spec.Taints {
		if !done[t.Key] {
			patched.Spec.Taints = append(patched.Spec.Taints, t)
		}
	}
	// The merge patch replaces the whole taint list, so it must not race
	// another writer (kubelet, Karpenter, an operator): resourceVersion precondition.
	if err := c.Client.Patch(ctx, patched, client.MergeFromWithOptions(node, client.MergeFromWithOptimisticLock{})); err != nil {
		if apierrors.IsConflict(err) {
			return reconcile.Result{Requeue: true}, nil // re-read and re-evaluate at once
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	age := c.Clock.Since(node.CreationTimestamp.Time)
	if age < 0 {
		age = 0 // clock skew between the apiserver and us
	}
	for _, v := range removed {
		gateSeconds.Observe(age.Seconds())
		c.Recorder.Publish(taintRemoved(node, class.Name, v))
		log.FromContext(ctx).Info("removed startup taint", "taint", v.key, "gate", v.gate, "afterSeconds", age.Round(time.Millisecond).Seconds())
	}
	return reconcile.Result{}, nil
}

// classOf returns the SSHNodeClass of the Node's NodeClaim, or nil when the
// Node is not ours (or not linked yet: the NodeClaim watch wakes it later).
// A providerID match wins over a nodeName match: hosts are reused, so a
// deleted claim of an earlier node may still carry the same node name.
func (c *Controller) classOf(ctx context.Context, node *corev1.Node) (*v1beta1.SSHNodeClass, error) {
	var keys []string
	if node.Spec.ProviderID != "" {
		keys = append(keys, "pid/"+node.Spec.ProviderID)
	}
	keys = append(keys, "node/"+node.Name)
	var claims []karpv1.NodeClaim
	for _, k := range keys {
		list := &karpv1.NodeClaimList{}
		if err := c.Client.List(ctx, list, client.MatchingFields{claimIndex: k}); err != nil {
			return nil, err
		}
		if claims = list.Items; len(claims) > 0 {
			break
		}
	}
	if len(claims) == 0 {
		return nil, nil
	}
	name := claims[0].Spec.NodeClassRef.Name
	for _, nc := range claims[1:] {
		if nc.Spec.NodeClassRef.Name != name {
			log.FromContext(ctx).Info("NodeClaims of different SSHNodeClasses match the node; leaving its taints alone", "classes", []string{name, nc.Spec.NodeClassRef.Name})
			return nil, nil
		}
	}
	class := &v1beta1.SSHNodeClass{}
	if err := c.Client.Get(ctx, types.NamespacedName{Name: name}, class); err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	return class, nil
}

func hasTaint(n *corev1.Node, key string) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == key {
			return true
		}
	}
	return false
}
