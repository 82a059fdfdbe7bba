// Package drift is the host drift controller: every spec.hostDrift.interval
// of its node class it checks each joined (InUse) host against what its
// profile's install and join would do — in Ansible check mode for role and
// task profiles, by scripts.check for script profiles — and records the
// verdict on the SSHHost (status.hostDrift, condition HostDrift), as an
// event and a metric. The cloud provider's IsDrifted reads the condition,
// so Karpenter replaces a drifted node through its drift budgets. A host
// that cannot be reached is Unreachable, never drifted.
package drift

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	controllerruntime "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/karpenter/pkg/events"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/cloudprovider"
	"github.com/dklesev/kpssh/internal/providers/phase"
	"github.com/dklesev/kpssh/internal/providers/pool"
)

// Defaults.
const (
	// DefaultConcurrency bounds simultaneous checks (each runs one or two
	// ansible-playbook processes on the controller).
	DefaultConcurrency = 4
	// DefaultBusyRetry: a host a phase holds is looked at again this soon.
	DefaultBusyRetry = 15 * time.Second
	// maxChangedTasks bounds status.hostDrift.changedTasks (the CRD's).
	maxChangedTasks = 16
	maxTaskName     = 256
)

// Checker runs one drift check of the host a NodeClaim holds
// (*cloudprovider.CloudProvider): cloudprovider.ErrHostBusy and
// cloudprovider.ErrNotCheckable are not failures.
type Checker interface {
	CheckHostDrift(ctx context.Context, nodeClaim *karpv1.NodeClaim) (phase.Drift, error)
}

// Controller checks joined hosts for drift.
type Controller struct {
	Client    client.Client
	Pool      *pool.Pool
	Checker   Checker
	Recorder  events.Recorder
	Clock     clock.Clock
	Namespace string
	// Concurrency bounds simultaneous checks; BusyRetry is when a host a
	// phase holds is tried again.
	Concurrency int
	BusyRetry   time.Duration
}

// New returns a Controller over the pool namespace.
func New(c client.Client, live client.Reader, checker Checker, rec events.Recorder, clk clock.Clock, namespace string) *Controller {
	return &Controller{Client: c, Pool: pool.New(c, live, namespace), Checker: checker, Recorder: rec, Clock: clk,
		Namespace: namespace, Concurrency: DefaultConcurrency, BusyRetry: DefaultBusyRetry}
}

// Register adds the controller to mgr. A node class change wakes every
// claimed host (hostDrift may have been turned on, off or changed).
func (c *Controller) Register(mgr manager.Manager) error {
	return controllerruntime.NewControllerManagedBy(mgr).
		Named("host.drift").
		For(&v1beta1.SSHHost{}).
		Watches(&v1beta1.SSHNodeClass{}, handler.EnqueueRequestsFromMapFunc(c.claimedHosts)).
		WithOptions(controller.Options{MaxConcurrentReconciles: max(1, c.Concurrency), SkipNameValidation: ptr.To(true)}).
		Complete(c)
}

func (c *Controller) claimedHosts(ctx context.Context, _ client.Object) []reconcile.Request {
	list := &v1beta1.SSHHostList{}
	if err := c.Client.List(ctx, list, client.InNamespace(c.Namespace)); err != nil {
		return nil
	}
	var out []reconcile.Request
	for i := range list.Items {
		if list.Items[i].Status.ClaimRef != nil {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
		}
	}
	return out
}

// Reconcile checks the host when its check is due: it is InUse and joined
// under a live NodeClaim whose node class sets hostDrift, and the last
// check of this claim is an interval old (or there is none).
func (c *Controller) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	if req.Namespace != c.Namespace {
		return reconcile.Result{}, nil
	}
	h := &v1beta1.SSHHost{}
	if err := c.Client.Get(ctx, req.NamespacedName, h); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	ref := h.Status.ClaimRef
	if !h.DeletionTimestamp.IsZero() || ref == nil || h.Status.State != v1beta1.HostInUse || h.Status.ProviderID == "" {
		return reconcile.Result{}, nil // a release clears the record (pool.Released)
	}
	nodeClaim := &karpv1.NodeClaim{}
	if err := c.Client.Get(ctx, client.ObjectKey{Name: ref.Name}, nodeClaim); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if nodeClaim.UID != ref.UID || nodeClaim.Spec.NodeClassRef == nil || nodeClaim.Spec.NodeClassRef.Kind != "SSHNodeClass" {
		return reconcile.Result{}, nil // stale claim: the host controller repairs it
	}
	claim := pool.Claim{Name: ref.Name, UID: ref.UID}
	ctx = log.IntoContext(ctx, log.FromContext(ctx).WithValues("sshhost", h.Name, "NodeClaim", ref.Name))
	nc := &v1beta1.SSHNodeClass{}
	if err := c.Client.Get(ctx, client.ObjectKey{Name: nodeClaim.Spec.NodeClassRef.Name}, nc); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	interval, on := Interval(nc)
	if !on {
		if h.Status.HostDrift != nil {
			// turned off: the record and its condition go, and with them
			// a HostDrift verdict
			return reconcile.Result{}, c.record(ctx, h.Name, claim, nil, "")
		}
		return reconcile.Result{}, nil
	}
	now := c.Clock.Now()
	if d := h.Status.HostDrift; d != nil && d.ClaimUID == ref.UID {
		if wait := d.LastCheckTime.Add(interval).Sub(now); wait > 0 {
			return reconcile.Result{RequeueAfter: wait}, nil
		}
	}
	if h.Status.Reboot.Active() {
		return reconcile.Result{RequeueAfter: interval}, nil
	}
	res, err := c.Checker.CheckHostDrift(ctx, nodeClaim)
	switch {
	case errors.Is(err, cloudprovider.ErrHostBusy):
		return reconcile.Result{RequeueAfter: c.busyRetry()}, nil
	case errors.Is(err, cloudprovider.ErrNotCheckable):
		log.FromContext(ctx).V(1).Info("host not checked for drift", "reason", err.Error())
		return reconcile.Result{RequeueAfter: interval}, nil
	case err != nil:
		return reconcile.Result{}, err
	}
	log.FromContext(ctx).V(1).Info("drift check", "result", res.Result, "duration", res.Duration.Round(time.Millisecond), "changes", len(res.Changes))
	countCheck(h.Class(), outcome(res.Result))
	checkSeconds.WithLabelValues(outcome(res.Result)).Observe(res.Duration.Seconds())
	wasDrifted, last := h.HostDrifted(), h.Status.HostDrift
	st := &v1beta1.HostDriftStatus{ClaimUID: ref.UID, LastCheckTime: metav1.NewTime(c.Clock.Now()), LastResult: res.Result,
		ChangedTasks: changedTasks(res), Message: phase.Truncate(res.Message, 1024)}
	if d := h.Status.HostDrift; d != nil && d.ClaimUID == ref.UID {
		st.Checks = d.Checks
	}
	st.Checks++
	if err := c.record(ctx, h.Name, claim, st, ConditionMessage(res)); err != nil {
		if errors.Is(err, pool.ErrClaimLost) {
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, err
	}
	if err := c.nudge(ctx, nodeClaim, res.Result); err != nil {
		return reconcile.Result{}, err
	}
	// Events on news only: a host stays drifted or unreachable for many
	// intervals.
	repeated := last != nil && last.ClaimUID == ref.UID && last.LastResult == res.Result && last.Message == st.Message
	switch {
	case res.Result == v1beta1.DriftDrifted && !wasDrifted:
		log.FromContext(ctx).Info("host drifted", "changedTasks", st.ChangedTasks)
		c.Recorder.Publish(hostDrift(h, ref, st.ChangedTasks))
	case !res.Result.Conclusive() && !repeated:
		log.FromContext(ctx).Info("drift check could not decide", "result", res.Result, "message", res.Message)
		c.Recorder.Publish(checkInconclusive(h, res))
	}
	return reconcile.Result{RequeueAfter: interval}, nil
}

// nudge marks a conclusive verdict that differs from the one on the
// NodeClaim (AnnotationHostDrift): the write wakes Karpenter's drift check
// of the NodeClaim now rather than at its next 5-minute look.
func (c *Controller) nudge(ctx context.Context, nodeClaim *karpv1.NodeClaim, r v1beta1.HostDriftResult) error {
	if !r.Conclusive() {
		return nil
	}
	v := strconv.FormatBool(r == v1beta1.DriftDrifted)
	cur, ok := nodeClaim.Annotations[v1beta1.AnnotationHostDrift]
	if cur == v || (!ok && v == "false") {
		return nil
	}
	orig := nodeClaim.DeepCopy()
	if nodeClaim.Annotations == nil {
		nodeClaim.Annotations = map[string]string{}
	}
	nodeClaim.Annotations[v1beta1.AnnotationHostDrift] = v
	return client.IgnoreNotFound(c.Client.Patch(ctx, nodeClaim, client.MergeFrom(orig)))
}

func (c *Controller) busyRetry() time.Duration {
	if c.BusyRetry > 0 {
		return c.BusyRetry
	}
	return DefaultBusyRetry
}

// record writes the check (nil: clears it) while the claim still holds.
func (c *Controller) record(ctx context.Context, name string, claim pool.Claim, st *v1beta1.HostDriftStatus, msg string) error {
	_, err := c.Pool.Update(ctx, name, claim, func(h *v1beta1.SSHHost) {
		h.SetHostDrift(st.DeepCopy(), msg, metav1.NewTime(c.Clock.Now()))
	})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// Interval is the node class's check interval; on=false when it checks no
// host (no hostDrift, or an interval that does not parse: the CRD rejects
// those).
func Interval(nc *v1beta1.SSHNodeClass) (time.Duration, bool) {
	if nc == nil || nc.Spec.HostDrift == nil {
		return 0, false
	}
	d, err := time.ParseDuration(string(nc.Spec.HostDrift.Interval))
	if err != nil || d <= 0 {
		return 0, false
	}
	return d, true
}

// changedTasks is status.hostDrift.changedTasks: the changed tasks' names,
// bounded by the CRD.
func changedTasks(res phase.Drift) []string {
	var out []string
	for _, ch := range res.Changes {
		if len(out) == maxChangedTasks {
			break
		}
		out = append(out, phase.Truncate(ch.Task, maxTaskName))
	}
	return out
}

// ConditionMessage is the HostDrift condition's text of a Drifted check:
// each changed task with its redacted diff (SetHostDrift bounds the whole).
func ConditionMessage(res phase.Drift) string {
	if res.Result != v1beta1.DriftDrifted {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d task(s) would change the host:", len(res.Changes))
	for _, ch := range res.Changes {
		fmt.Fprintf(&b, "\n- %s", ch.Task)
		switch {
		case ch.Censored:
			b.WriteString(" (no_log: diff hidden)")
		case ch.Diff != "":
			b.WriteString("\n  " + strings.ReplaceAll(strings.TrimRight(ch.Diff, "\n"), "\n", "\n  "))
		}
	}
	return b.String()
}
