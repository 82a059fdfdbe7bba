// Package host is the host lifecycle controller: the pool's only source of
// truth about hosts. Per SSHHost it marks (and parks) duplicates of a
// machine, repairs stale claims, parks and unparks maintenance, probes
// unclaimed hosts over SSH and runs the zombie guard. Each concern lives in
// its own file; Reconcile only orders them.
package host

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	controllerruntime "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/karpenter/pkg/events"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/probe"
	"github.com/dklesev/kpssh/internal/providers/hostkey"
	"github.com/dklesev/kpssh/internal/providers/leave"
	"github.com/dklesev/kpssh/internal/providers/pool"
	"github.com/dklesev/kpssh/internal/providers/token"
	"github.com/dklesev/kpssh/internal/sshx"
)

// Defaults of the seed's probe behaviour.
const (
	DefaultProbeInterval = 2 * time.Minute
	DefaultProbeTimeout  = probe.DefaultTimeout
	// DefaultProbeConcurrency: probes are network-bound (a handshake waits on
	// the peer), so more workers than cores pays off. BenchmarkProbeSweep1000
	// on 2 cores: a 1,000-host sweep takes ~2.1 s at the seed's 8 workers and
	// ~1.0 s at 32, and 64 gains nothing more (CPU-bound on key exchange).
	DefaultProbeConcurrency = 32
)

// Prober probes one host; probe.Run is the default.
type Prober func(ctx context.Context, t sshx.Target, verified bool, shimCommand string, timeout time.Duration) (probe.Result, error)

// Controller reconciles SSHHosts.
type Controller struct {
	Client    client.Client
	Recorder  events.Recorder
	Clock     clock.Clock
	Keys      hostkey.Provider
	Leaver    leave.Provider
	Tokens    token.Provider
	Prober    Prober
	Namespace string
	Interval  time.Duration
	Timeout   time.Duration
	// Concurrency bounds simultaneous reconciles, hence probes.
	Concurrency int
	// RebootPoll and RebootTimeout drive the watch of a rebooting claimed
	// host (0: DefaultRebootPoll, DefaultRebootTimeout).
	RebootPoll, RebootTimeout time.Duration
}

// New returns a Controller with the default providers.
func New(c client.Client, rec events.Recorder, namespace string) *Controller {
	return &Controller{
		Client: c, Recorder: rec, Clock: clock.RealClock{},
		Keys: hostkey.New(c), Leaver: leave.NewScript(c), Tokens: token.New(c), Prober: probe.Run,
		Namespace: namespace, Interval: DefaultProbeInterval, Timeout: DefaultProbeTimeout,
		Concurrency: DefaultProbeConcurrency,
	}
}

// Register adds the controller to mgr, and the pool's host indexes
// (pool.Index) to its cache. NodeClaim deletions wake the host
// holding the claim so stale-claim repair does not wait for a probe interval;
// Node registrations wake the host whose bootstrap token they make
// collectable.
func (c *Controller) Register(mgr manager.Manager) error {
	if err := crmetrics.Registry.Register(NewPoolCollector(mgr.GetClient(), c.Namespace)); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			return err
		}
	}
	if err := pool.Index(context.Background(), mgr.GetFieldIndexer()); err != nil {
		return err
	}
	return controllerruntime.NewControllerManagedBy(mgr).
		Named("host").
		For(&v1beta1.SSHHost{}).
		// A host's Duplicate condition depends on the other hosts of its
		// machine: their creation, deletion, spec and claims wake it.
		Watches(&v1beta1.SSHHost{}, handler.EnqueueRequestsFromMapFunc(c.hostsOfMachine), builder.WithPredicates(machineChange())).
		Watches(&karpv1.NodeClaim{}, handler.EnqueueRequestsFromMapFunc(c.hostsOfClaim)).
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(c.hostsOfNode), builder.WithPredicates(nodeRegistration())).
		// One host controller per manager; tests start several managers in
		// one process, which the global name check would refuse.
		WithOptions(controller.Options{MaxConcurrentReconciles: c.Concurrency, SkipNameValidation: ptr.To(true)}).
		Complete(c)
}

func (c *Controller) hostsOfClaim(ctx context.Context, o client.Object) []reconcile.Request {
	list := &v1beta1.SSHHostList{}
	if err := c.Client.List(ctx, list, client.InNamespace(c.Namespace), client.MatchingFields{pool.IndexClaim: o.GetName()}); err != nil {
		return nil
	}
	var out []reconcile.Request
	for _, h := range list.Items {
		out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&h)})
	}
	return out
}

// step is one concern. It returns done=true when it decided this reconcile.
type step func(ctx context.Context, h *v1beta1.SSHHost) (res reconcile.Result, done bool, err error)

// Reconcile runs the concerns in order: token GC → duplicate → stale claim
// → maintenance → probe (which hands a running kubelet to the zombie guard).
func (c *Controller) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	if req.Namespace != c.Namespace {
		return reconcile.Result{}, nil // hosts outside the pool namespace are not ours
	}
	h := &v1beta1.SSHHost{}
	if err := c.Client.Get(ctx, req.NamespacedName, h); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !h.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, nil
	}
	for _, s := range []step{c.collectToken, c.duplicate, c.repairStaleClaim, c.maintenance, c.probe} {
		res, done, err := s(ctx, h)
		if apierrors.IsConflict(err) {
			// Someone else wrote first (a claim, another replica): start over.
			return reconcile.Result{Requeue: true}, nil
		}
		if err != nil || done {
			return res, err
		}
	}
	return reconcile.Result{RequeueAfter: c.Interval}, nil
}
