package nodeclass

import (
	"context"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/dklesev/kpssh/apis/v1beta1"
)

// ensureFinalizer adds the termination finalizer (a CAS on resourceVersion,
// so a concurrent edit of the finalizer list is never overwritten).
func (c *Controller) ensureFinalizer(ctx context.Context, nc *v1beta1.SSHNodeClass) error {
	if controllerutil.ContainsFinalizer(nc, v1beta1.TerminationFinalizer) {
		return nil
	}
	orig := nc.DeepCopy()
	controllerutil.AddFinalizer(nc, v1beta1.TerminationFinalizer)
	return c.Client.Patch(ctx, nc, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{}))
}

// finalize keeps a deleted class while NodeClaims still reference it (their
// Delete needs the class's hosts to be released properly) and removes the
// finalizer once none does.
func (c *Controller) finalize(ctx context.Context, nc *v1beta1.SSHNodeClass) (reconcile.Result, error) {
	if !controllerutil.ContainsFinalizer(nc, v1beta1.TerminationFinalizer) {
		return reconcile.Result{}, nil
	}
	claims, err := c.claimsOf(ctx, nc.Name)
	if err != nil {
		return reconcile.Result{}, err
	}
	if len(claims) > 0 {
		log.FromContext(ctx).V(1).Info("deletion waits for NodeClaims", "nodeClaims", claims)
		c.publish(waitingOnNodeClaimsEvent(nc, claims))
		return reconcile.Result{RequeueAfter: c.BlockedRequeue}, nil
	}
	orig := nc.DeepCopy()
	controllerutil.RemoveFinalizer(nc, v1beta1.TerminationFinalizer)
	return reconcile.Result{}, client.IgnoreNotFound(c.Client.Patch(ctx, nc, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})))
}

// claimsOf names the NodeClaims whose nodeClassRef is this class. Terminating
// claims count: they are gone only when their finalizers are.
func (c *Controller) claimsOf(ctx context.Context, class string) ([]string, error) {
	list := &karpv1.NodeClaimList{}
	if err := c.Client.List(ctx, list); err != nil {
		return nil, err
	}
	var out []string
	for i := range list.Items {
		if name, ok := referencedClass(&list.Items[i]); ok && name == class {
			out = append(out, list.Items[i].Name)
		}
	}
	return out, nil
}

// referencedClass returns the SSHNodeClass a NodeClaim points at, if it
// points at one of ours (other providers' claims coexist in the cluster).
func referencedClass(nc *karpv1.NodeClaim) (string, bool) {
	ref := nc.Spec.NodeClassRef
	if ref == nil || ref.Group != v1beta1.Group || ref.Kind != Kind || ref.Name == "" {
		return "", false
	}
	return ref.Name, true
}
