// Package operator wires kpssh into Karpenter's operator: our cloud
// provider (decorated like every provider, with node overlays), Karpenter
// core's controllers, and kpssh's own controllers (hosts, node classes,
// startup taint gates). cmd/controller is this plus operator.NewOperator;
// tests start the same wiring against envtest.
package operator

import (
	"context"
	"fmt"

	opcontroller "github.com/awslabs/operatorpkg/controller"
	"github.com/samber/lo"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/karpenter/pkg/cloudprovider/overlay"
	corecontrollers "sigs.k8s.io/karpenter/pkg/controllers"
	"sigs.k8s.io/karpenter/pkg/controllers/node/health"
	"sigs.k8s.io/karpenter/pkg/controllers/state"
	coreoperator "sigs.k8s.io/karpenter/pkg/operator"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/cloudprovider"
	"github.com/dklesev/kpssh/internal/controllers/host"
	"github.com/dklesev/kpssh/internal/controllers/host/drift"
	"github.com/dklesev/kpssh/internal/controllers/node/startuptaint"
	"github.com/dklesev/kpssh/internal/controllers/nodeclass"
	"github.com/dklesev/kpssh/internal/engine"
	"github.com/dklesev/kpssh/internal/jobexec"
	"github.com/dklesev/kpssh/internal/operator/options"
	"github.com/dklesev/kpssh/internal/providers/hostkey"
	"github.com/dklesev/kpssh/internal/providers/leave"
	"github.com/dklesev/kpssh/internal/providers/phase"
	"github.com/dklesev/kpssh/internal/providers/token"
)

// Kpssh is the provider's half of the operator.
type Kpssh struct {
	Options       *options.Options
	Engine        *engine.Local
	Phases        *phase.Runner
	CloudProvider *cloudprovider.CloudProvider
	Controllers   []opcontroller.Controller
}

// New builds kpssh on op. engineOpts may adjust the engine (tests point it
// at the checkout's collection and roles).
func New(ctx context.Context, op *coreoperator.Operator, engineOpts ...func(*engine.Options)) (*Kpssh, error) {
	o := options.FromContext(ctx)
	if o == nil {
		return nil, fmt.Errorf("kpssh options missing from the context")
	}
	eo := engine.Options{AnsiblePlaybook: o.AnsiblePlaybook}
	if o.AnsibleMitogen {
		eo.MitogenStrategyPath = engine.DefaultMitogenStrategyPath
	}
	// The runner image ships the collection and roles under
	// /usr/share/kpssh; a checkout (development, the demo) has them in-tree.
	coll, err := engine.FindCollectionsPath()
	if err != nil {
		return nil, err
	}
	eo.CollectionsPath = coll
	if roles, err := engine.FindRolesPath(); err == nil {
		eo.RolesPath = []string{roles}
	}
	// Operator content after the shipped content: ansible loads the first
	// copy of a role or collection, and validation reports a later one.
	eo.RolesPath = append(eo.RolesPath, engine.SplitPaths(o.RolesPath)...)
	eo.ExtraCollectionsPaths = engine.SplitPaths(o.CollectionsPath)
	for _, f := range engineOpts {
		f(&eo)
	}
	eng, err := engine.New(eo)
	if err != nil {
		return nil, fmt.Errorf("phase engine: %w", err)
	}
	if err := StripManagedFields(ctx, op.GetCache()); err != nil {
		return nil, err
	}
	kube := op.GetClient()
	// Secrets and ConfigMaps are read live, never through the cache: a
	// cached read starts a cluster-wide informer, which needs list/watch on
	// every Secret in the cluster; the chart grants get in the pool
	// namespace only (and kube-public/cluster-info).
	live := op.GetAPIReader()
	keys := hostkey.New(live)
	phases, err := executor(o, op)
	if err != nil {
		return nil, err
	}
	if phases == nil {
		phases = eng
	}
	runner := phase.New(phases, keys, op.EventRecorder)
	tokens := token.New(kube)
	cp := cloudprovider.New(kube, live, o.PoolNamespace, runner, tokens, op.EventRecorder, op.Clock)
	// A running phase shows in its host's lastPhase through the pool's
	// narrow setter (a CAS under the claim, as every other status write).
	runner.Status = cp.Pool
	cp.Repair = o.Repair

	hc := host.New(kube, op.EventRecorder, o.PoolNamespace)
	hc.Keys = keys
	hc.Leaver = leave.NewEngine(kube, runner, op.EventRecorder)
	hc.Interval, hc.Timeout, hc.Concurrency = o.ProbeInterval, o.ProbeTimeout, o.ProbeConcurrency
	dc := drift.New(kube, live, cp, op.EventRecorder, op.Clock, o.PoolNamespace)

	return &Kpssh{
		Options: o, Engine: eng, Phases: runner, CloudProvider: cp,
		Controllers: []opcontroller.Controller{
			registerFunc(func(_ context.Context, m manager.Manager) error { return hc.Register(m) }),
			registerFunc(func(_ context.Context, m manager.Manager) error { return dc.Register(m) }),
			nodeclass.New(kube, eng, o.PoolNamespace, op.Clock),
			registerFunc(func(_ context.Context, m manager.Manager) error {
				return startuptaint.New(kube, op.EventRecorder).Register(m)
			}),
		},
	}, nil
}

// WithControllers adds Karpenter core's controllers around our cloud
// provider (as karpenter's own providers wire it) and ours to op.
func (k *Kpssh) WithControllers(ctx context.Context, op *coreoperator.Operator) *coreoperator.Operator {
	decorated := overlay.Decorate(k.CloudProvider, op.GetClient(), op.InstanceTypeStore)
	matcher := lo.Must(health.NewRepairPolicyMatcher(ctx, decorated))
	cluster := state.NewCluster(op.Clock, op.GetClient(), decorated, state.WithRepairPolicyMatcher(matcher))
	core := corecontrollers.NewControllers(ctx, op.Manager, op.Clock, op.GetClient(), op.EventRecorder,
		decorated, k.CloudProvider, cluster, op.InstanceTypeStore, op.PredictionStore,
		// Registration waits for the profile's verify phase.
		corecontrollers.WithRegistrationHook(k.CloudProvider.VerifyHook()))
	return op.
		WithControllers(ctx, fewerHydrationWorkers(onlyOwnReboots(core, decorated), decorated)...).
		WithControllers(ctx, k.Controllers...)
}

// executor is the phase executor of o.Executor: nil for local (the engine
// itself), a jobexec.Executor for job. The Local engine stays in use for
// what never runs a phase (profile validation, rendering).
func executor(o *options.Options, op *coreoperator.Operator) (engine.Engine, error) {
	if o.Executor != options.ExecutorJob {
		return nil, nil
	}
	// A direct client: Jobs, pods and Secrets in the Job namespace are read
	// live; a cached read would start cluster-wide informers the chart's
	// RBAC (that namespace only) forbids.
	c, err := client.NewWithWatch(op.GetConfig(), client.Options{Scheme: op.GetScheme()})
	if err != nil {
		return nil, fmt.Errorf("executor job: %w", err)
	}
	sel, err := o.NodeSelector()
	if err != nil {
		return nil, err
	}
	content, err := jobexec.ParseContent(o.JobContent)
	if err != nil {
		return nil, err
	}
	return jobexec.New(c, jobexec.Options{
		Namespace: o.JobNamespace, Image: o.JobImage, ImagePullPolicy: corev1.PullPolicy(o.JobImagePullPolicy),
		TTL: o.JobTTL, HostNetwork: o.JobHostNetwork, MemoryLimit: o.JobMemoryLimit,
		NodeSelector: sel, AllowManagedNodes: o.JobAllowManagedNodes,
		Content: content, RolesPath: engine.SplitPaths(o.RolesPath), CollectionsPaths: engine.SplitPaths(o.CollectionsPath),
	})
}

type registerFunc func(context.Context, manager.Manager) error

func (f registerFunc) Register(ctx context.Context, m manager.Manager) error { return f(ctx, m) }

// cachedKinds are the kinds whose informers Karpenter core and kpssh start
// (each is watched by a controller of either).
var cachedKinds = []client.Object{
	&v1beta1.SSHHost{}, &v1beta1.SSHNodeClass{}, &v1beta1.SSHJoinProfile{},
	&karpv1.NodeClaim{}, &karpv1.NodePool{}, &corev1.Node{}, &corev1.Pod{}, &appsv1.DaemonSet{},
}

// StripManagedFields drops metadata.managedFields from every object the
// informer caches of cachedKinds keep. Nothing here or in Karpenter core
// reads them, writes are patches computed between two cached copies or
// updates (which keep the server's managedFields), and they are a large
// part of each cached object and of every copy out of the cache. Karpenter
// core builds the manager, so its cache options cannot carry a
// DefaultTransform; the informers take one before the manager starts them.
func StripManagedFields(ctx context.Context, c cache.Cache) error {
	for _, o := range cachedKinds {
		inf, err := c.GetInformer(ctx, o)
		if err != nil {
			return fmt.Errorf("informer of %T: %w", o, err)
		}
		t, ok := inf.(interface {
			SetTransform(toolscache.TransformFunc) error
		})
		if !ok {
			return fmt.Errorf("informer of %T (%T) takes no transform", o, inf)
		}
		if err := t.SetTransform(cache.TransformStripManagedFields()); err != nil {
			return fmt.Errorf("informer of %T: %w", o, err)
		}
	}
	return nil
}
