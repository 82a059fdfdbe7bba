package operator

import (
	"context"

	opcontroller "github.com/awslabs/operatorpkg/controller"
	"github.com/awslabs/operatorpkg/reasonable"
	"github.com/awslabs/operatorpkg/status"
	controllerruntime "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"
	nodeclaimreboot "sigs.k8s.io/karpenter/pkg/controllers/nodeclaim/reboot"
	nodeclaimutils "sigs.k8s.io/karpenter/pkg/utils/nodeclaim"
)

// ownReboots is Karpenter core's reboot controller for kpssh's NodeClaims
// only. Core (v1.15) registers it for every NodeClaim with a Rebooting
// condition, whoever's: beside another Karpenter it fenced that one's Node,
// asked kpssh's provider to reboot a claim it does not know, and deleted the
// other provider's NodeClaim as a failed reboot.
type ownReboots struct {
	inner *nodeclaimreboot.Controller
	cp    cloudprovider.CloudProvider
}

// Register is core's registration (name, options) with our predicate.
func (o ownReboots) Register(_ context.Context, m manager.Manager) error {
	return registerNodeClaimController(m, o.inner.Name(), predicate.NewPredicateFuncs(ownRebooting(o.cp)), 10, o.inner)
}

// registerNodeClaimController registers r, one of Karpenter core's NodeClaim
// controllers, as core does (its name, the reasonable rate limiter) with
// the predicate and worker count given.
func registerNodeClaimController(m manager.Manager, name string, pred predicate.Predicate, workers int, r reconcile.ObjectReconciler[*karpv1.NodeClaim]) error {
	return controllerruntime.NewControllerManagedBy(m).
		Named(name).
		For(&karpv1.NodeClaim{}, builder.WithPredicates(pred)).
		WithOptions(controller.Options{RateLimiter: reasonable.RateLimiter(), MaxConcurrentReconciles: workers}).
		Complete(reconcile.AsReconciler(m.GetClient(), r))
}

// ownRebooting selects kpssh's NodeClaims that carry a Rebooting condition
// (core's own predicate, for its claims only).
func ownRebooting(cp cloudprovider.CloudProvider) func(client.Object) bool {
	return func(obj client.Object) bool {
		nc, ok := obj.(*karpv1.NodeClaim)
		// Predicates get the shared cached object: WithObservedOnly adds no conditions to it.
		return ok && nc.Spec.NodeClassRef != nil && nodeclaimutils.IsManaged(nc, cp) &&
			nc.StatusConditions(status.WithObservedOnly()).Get(karpv1.ConditionTypeRebooting) != nil
	}
}

// onlyOwnReboots replaces core's reboot controller in cs with ownReboots.
func onlyOwnReboots(cs []opcontroller.Controller, cp cloudprovider.CloudProvider) []opcontroller.Controller {
	for i, c := range cs {
		if r, ok := c.(*nodeclaimreboot.Controller); ok {
			cs[i] = ownReboots{inner: r, cp: cp}
		}
	}
	return cs
}
