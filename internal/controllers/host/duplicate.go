package host

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/providers/pool"
)

// duplicate writes status.machine from the spec (the identity the claim
// path finds a machine's hosts by) and keeps the Duplicate condition true
// to the pool: True, naming the other host and the field, while another
// host of the pool namespace is the same machine and comes first
// (pool.Duplicates), removed once not. An unclaimed duplicate is parked
// Unhealthy (Ready reason Duplicate) and the reconcile ends: it is not
// probed — its probe would reach the other host's machine, whose kubelet
// the zombie guard would take for its own — and never claimed. A claimed
// one (claimed before the other host came) keeps its claim; the rest of the
// reconcile looks after it as before. When it stops being a duplicate, a
// parked host goes Pending and is probed at once.
//
// The condition is read from the informer cache and may lag; the claim path
// does not rely on it (pool.ClaimOne re-reads the machine's hosts live
// after each claim).
func (c *Controller) duplicate(ctx context.Context, h *v1beta1.SSHHost) (reconcile.Result, bool, error) {
	d, dup, err := c.duplicateOf(ctx, h)
	if err != nil {
		return reconcile.Result{}, true, err
	}
	orig := h.DeepCopy()
	now := metav1.NewTime(c.Clock.Now())
	// The identity the claim path reads a machine's hosts by, current
	// before the host can be probed Available (the probe comes after).
	if id := pool.Identity(h); !pool.IdentityCurrent(h) {
		h.Status.Machine = &id
	}
	if !dup {
		h.SetDuplicate("", "", now)
		if !h.ParkedAsDuplicate() {
			return reconcile.Result{}, false, patchStatus(ctx, c.Client, orig, h)
		}
		setState(h, v1beta1.HostPending, "no longer a duplicate", now)
		return reconcile.Result{Requeue: true}, true, patchStatus(ctx, c.Client, orig, h)
	}
	reason := v1beta1.ReasonDuplicateAddress
	if d.Field == pool.FieldNodeAddress {
		reason = v1beta1.ReasonDuplicateNodeAddress
	}
	h.SetDuplicate(reason, d.Message(), now)
	park := h.Status.ClaimRef == nil && !h.InMaintenance()
	if park {
		h.ParkAsDuplicate("not probed, not claimed: "+d.Message(), now)
	}
	if err := patchStatus(ctx, c.Client, orig, h); err != nil {
		return reconcile.Result{}, true, err
	}
	if !orig.IsDuplicate() {
		c.Recorder.Publish(duplicateHost(h, d.Message()))
	}
	if !park {
		return reconcile.Result{}, false, nil
	}
	return reconcile.Result{RequeueAfter: c.Interval}, true, nil
}

// duplicateOf finds h's Duplicate among the hosts sharing an identity with
// it (the cache's machine index: no pool-wide list per reconcile).
func (c *Controller) duplicateOf(ctx context.Context, h *v1beta1.SSHHost) (pool.Duplicate, bool, error) {
	same, err := c.sameMachine(ctx, h)
	if err != nil {
		return pool.Duplicate{}, false, err
	}
	d, dup := pool.DuplicateOf(h, same)
	return d, dup, nil
}

// sameMachine lists the other hosts that share an identity with h.
func (c *Controller) sameMachine(ctx context.Context, h *v1beta1.SSHHost) ([]v1beta1.SSHHost, error) {
	seen := map[string]bool{h.Name: true}
	var out []v1beta1.SSHHost
	for _, k := range pool.MachineKeys(h) {
		list := &v1beta1.SSHHostList{}
		if err := c.Client.List(ctx, list, client.InNamespace(h.Namespace), client.MatchingFields{pool.IndexMachine: k}); err != nil {
			return nil, err
		}
		for _, o := range list.Items {
			if !seen[o.Name] {
				seen[o.Name] = true
				out = append(out, o)
			}
		}
	}
	return out, nil
}

// hostsOfMachine wakes the other hosts of o's machine (for an update, of
// the old and the new identities) so their Duplicate condition follows o's
// creation, deletion, nodeAddress edits and claims.
func (c *Controller) hostsOfMachine(ctx context.Context, o client.Object) []reconcile.Request {
	h, ok := o.(*v1beta1.SSHHost)
	if !ok || h.Namespace != c.Namespace {
		return nil
	}
	same, err := c.sameMachine(ctx, h)
	if err != nil {
		log.FromContext(ctx).Error(err, "listing the hosts of a machine", "SSHHost", klog.KObj(h))
		return nil
	}
	out := make([]reconcile.Request, 0, len(same))
	for i := range same {
		out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&same[i])})
	}
	return out
}

// machineChange passes the events that can change who is a machine's first
// host: creation, deletion, a spec edit, a claim taken or given back, the
// start of a deletion. Probe results do not.
func machineChange() predicate.Predicate {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		a, aok := e.ObjectOld.(*v1beta1.SSHHost)
		b, bok := e.ObjectNew.(*v1beta1.SSHHost)
		if !aok || !bok {
			return false
		}
		return a.Generation != b.Generation || (a.Status.ClaimRef == nil) != (b.Status.ClaimRef == nil) ||
			a.DeletionTimestamp.IsZero() != b.DeletionTimestamp.IsZero()
	}}
}
