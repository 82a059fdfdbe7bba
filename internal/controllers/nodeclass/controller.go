// Package nodeclass is the SSHNodeClass controller: it decides whether
// Karpenter may launch against a class (the Ready condition: profile found,
// profile valid, selector valid, hosts present) and holds the class with the
// termination finalizer while NodeClaims still reference it. Each concern
// lives in its own file; Reconcile only orders them.
package nodeclass

import (
	"context"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/clock"
	controllerruntime "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/karpenter/pkg/events"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/profile"
)

// Kind is the kind NodeClaims name in spec.nodeClassRef to mean us.
const Kind = "SSHNodeClass"

// DefaultBlockedRequeue re-checks a class whose deletion waits on NodeClaims.
// NodeClaim deletions wake the class through the watch; this is the backstop.
const DefaultBlockedRequeue = time.Minute

// Controller reconciles SSHNodeClasses.
type Controller struct {
	Client client.Client
	// Recorder publishes events; Register sets one from the manager when nil,
	// and a nil Recorder publishes nothing.
	Recorder events.Recorder
	// Roles resolves role profiles (*engine.Local); nil skips role resolution.
	Roles     profile.RoleValidator
	Namespace string
	Clock     clock.Clock
	// BlockedRequeue is how soon a deletion blocked by NodeClaims is re-checked.
	BlockedRequeue time.Duration
	// ContentRecheck is how often a class of a role profile is re-checked:
	// roles are files of the content sources (a ConfigMap volume changes
	// under a running controller), which no watch reports.
	ContentRecheck time.Duration
}

// DefaultContentRecheck: a ConfigMap volume's update reaches the pod within
// about a minute; the class follows within another.
const DefaultContentRecheck = time.Minute

// New returns a Controller for the hosts of poolNamespace.
func New(c client.Client, validator profile.RoleValidator, poolNamespace string, clk clock.Clock) *Controller {
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &Controller{Client: c, Roles: validator, Namespace: poolNamespace, Clock: clk, BlockedRequeue: DefaultBlockedRequeue, ContentRecheck: DefaultContentRecheck}
}

// Register adds the controller to mgr. Profiles wake the classes that
// reference them, pool hosts wake every class (a selector match is cheaper to
// recompute than to index; only creations, deletions and label changes
// matter), and NodeClaims wake the class they reference when they are gone
// (the finalizer waits for that; their other events would re-run the whole
// check — hundreds a minute while Karpenter works on many claims).
func (c *Controller) Register(_ context.Context, mgr manager.Manager) error {
	if c.Recorder == nil {
		c.Recorder = events.NewRecorder(mgr.GetEventRecorderFor("kpssh")) //nolint:staticcheck // Karpenter's recorder takes the old events API
	}
	return controllerruntime.NewControllerManagedBy(mgr).
		Named("nodeclass").
		For(&v1beta1.SSHNodeClass{}).
		Watches(&v1beta1.SSHJoinProfile{}, handler.EnqueueRequestsFromMapFunc(c.classesOfProfile)).
		Watches(&v1beta1.SSHHost{}, handler.EnqueueRequestsFromMapFunc(c.classesOfHost),
			builder.WithPredicates(predicate.LabelChangedPredicate{})).
		Watches(&karpv1.NodeClaim{}, handler.EnqueueRequestsFromMapFunc(classOfClaim), builder.WithPredicates(claimGone())).
		Complete(c)
}

func (c *Controller) classesOfProfile(ctx context.Context, o client.Object) []reconcile.Request {
	return c.classes(ctx, func(nc *v1beta1.SSHNodeClass) bool { return nc.Spec.JoinProfileRef.Name == o.GetName() })
}

func (c *Controller) classesOfHost(ctx context.Context, o client.Object) []reconcile.Request {
	if o.GetNamespace() != c.Namespace {
		return nil
	}
	return c.classes(ctx, func(*v1beta1.SSHNodeClass) bool { return true })
}

func (c *Controller) classes(ctx context.Context, match func(*v1beta1.SSHNodeClass) bool) []reconcile.Request {
	list := &v1beta1.SSHNodeClassList{}
	if err := c.Client.List(ctx, list); err != nil {
		log.FromContext(ctx).Error(err, "listing node classes")
		return nil
	}
	var out []reconcile.Request
	for i := range list.Items {
		if match(&list.Items[i]) {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKey{Name: list.Items[i].Name}})
		}
	}
	return out
}

// claimGone passes NodeClaim deletions only.
func claimGone() predicate.Predicate {
	return predicate.Funcs{
		CreateFunc:  func(event.CreateEvent) bool { return false },
		UpdateFunc:  func(event.UpdateEvent) bool { return false },
		DeleteFunc:  func(event.DeleteEvent) bool { return true },
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

func classOfClaim(_ context.Context, o client.Object) []reconcile.Request {
	nc, ok := o.(*karpv1.NodeClaim)
	if !ok {
		return nil
	}
	if name, ok := referencedClass(nc); ok {
		return []reconcile.Request{{NamespacedName: client.ObjectKey{Name: name}}}
	}
	return nil
}

// Reconcile runs: deletion (finalizer) → finalizer added → readiness.
func (c *Controller) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	nc := &v1beta1.SSHNodeClass{}
	if err := c.Client.Get(ctx, req.NamespacedName, nc); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	res, err := c.reconcile(ctx, nc)
	if apierrors.IsConflict(err) {
		// Someone else wrote first: start over from a fresh read.
		return reconcile.Result{Requeue: true}, nil
	}
	return res, err
}

func (c *Controller) reconcile(ctx context.Context, nc *v1beta1.SSHNodeClass) (reconcile.Result, error) {
	if !nc.DeletionTimestamp.IsZero() {
		return c.finalize(ctx, nc)
	}
	if err := c.ensureFinalizer(ctx, nc); err != nil {
		return reconcile.Result{}, err
	}
	v, err := c.updateReadiness(ctx, nc)
	if err != nil {
		return reconcile.Result{}, err
	}
	var res reconcile.Result
	if v.content && c.ContentRecheck > 0 {
		res.RequeueAfter = c.ContentRecheck
	}
	// Time alone moves a manifest into the warning window, and past its
	// not-after: no watch reports that.
	if !v.expiry.Next.IsZero() {
		if d := v.expiry.Next.Sub(c.Clock.Now()) + time.Second; res.RequeueAfter == 0 || d < res.RequeueAfter {
			res.RequeueAfter = d
		}
	}
	return res, nil
}
