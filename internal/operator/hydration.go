package operator

import (
	"context"

	opcontroller "github.com/awslabs/operatorpkg/controller"
	"github.com/awslabs/operatorpkg/reasonable"
	corev1 "k8s.io/api/core/v1"
	controllerruntime "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"
	nodehydration "sigs.k8s.io/karpenter/pkg/controllers/node/hydration"
	nodeclaimhydration "sigs.k8s.io/karpenter/pkg/controllers/nodeclaim/hydration"
	nodeutils "sigs.k8s.io/karpenter/pkg/utils/node"
	nodeclaimutils "sigs.k8s.io/karpenter/pkg/utils/nodeclaim"
)

// hydrationWorkers replaces Karpenter core's (v1.15) 1,000 workers of each
// hydration controller (its minimum, at any CPU request). Hydration adds
// one label to a NodeClaim or Node (a cached read, at most one patch): ten
// workers label a 5,000-host pool in seconds, and the 1,980 idle goroutines
// they spare were ~8 MiB of stacks, half of all the process's.
const hydrationWorkers = 10

// nodeClaimHydration is core's nodeclaim.hydration (name, watch, predicate,
// rate limiter) with hydrationWorkers.
type nodeClaimHydration struct {
	inner *nodeclaimhydration.Controller
	cp    cloudprovider.CloudProvider
}

func (h nodeClaimHydration) Register(_ context.Context, m manager.Manager) error {
	return registerNodeClaimController(m, h.inner.Name(), nodeclaimutils.IsManagedPredicateFuncs(h.cp), hydrationWorkers, h.inner)
}

// nodeHydration is core's node.hydration (name, watches, rate limiter) with
// hydrationWorkers.
type nodeHydration struct {
	inner *nodehydration.Controller
}

func (h nodeHydration) Register(_ context.Context, m manager.Manager) error {
	return controllerruntime.NewControllerManagedBy(m).
		Named(h.inner.Name()).
		For(&corev1.Node{}).
		Watches(&karpv1.NodeClaim{}, nodeutils.NodeClaimEventHandler(m.GetClient())).
		WithOptions(controller.Options{RateLimiter: reasonable.RateLimiter(), MaxConcurrentReconciles: hydrationWorkers}).
		Complete(reconcile.AsReconciler(m.GetClient(), h.inner))
}

// fewerHydrationWorkers replaces core's two hydration controllers in cs.
func fewerHydrationWorkers(cs []opcontroller.Controller, cp cloudprovider.CloudProvider) []opcontroller.Controller {
	for i, c := range cs {
		switch h := c.(type) {
		case *nodeclaimhydration.Controller:
			cs[i] = nodeClaimHydration{inner: h, cp: cp}
		case *nodehydration.Controller:
			cs[i] = nodeHydration{inner: h}
		}
	}
	return cs
}
