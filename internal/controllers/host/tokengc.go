package host

import (
	"context"
	"errors"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/providers/leave"
	"github.com/dklesev/kpssh/internal/providers/pool"
	"github.com/dklesev/kpssh/internal/providers/token"
)

// collectToken is the token GC (seed "Bootstrap tokens", SPEC §7): once
// the Node of a claimed host has registered, its kubelet holds a client
// certificate and the bootstrap token is dead weight, so its Secret is
// deleted and the id forgotten. Nothing else collects these Secrets
// (upstream's tokencleaner is off by default).
//
// Order: Secret first, then the id, with a compare-and-swap on the host as
// read — a crash in between re-deletes next time (NotFound is success), and
// a host re-claimed meanwhile (new claim, new token) makes the write a 409
// that leaves the successor's id alone.
//
// Stale claims are repairStaleClaim's (it deletes the token as it
// releases); release paths are the cloud provider's. collectToken never
// decides a reconcile: it only tidies and lets the next step run.
func (c *Controller) collectToken(ctx context.Context, h *v1beta1.SSHHost) (reconcile.Result, bool, error) {
	id := h.Status.BootstrapTokenID
	if id == "" {
		return reconcile.Result{}, false, nil
	}
	var why string
	if ref := h.Status.ClaimRef; ref == nil {
		// Every writer sets the id under a claim and clears both together,
		// so this is a hand edit or a bug: no join can be using it.
		why = "host holds no claim"
	} else {
		if st := h.CurrentState(); st != v1beta1.HostClaimed && st != v1beta1.HostInUse {
			return reconcile.Result{}, false, nil
		}
		nc := &karpv1.NodeClaim{}
		if err := c.Client.Get(ctx, client.ObjectKey{Name: ref.Name}, nc); err != nil {
			if apierrors.IsNotFound(err) {
				return reconcile.Result{}, false, nil // stale claim: repairStaleClaim's
			}
			return reconcile.Result{}, true, err
		}
		if nc.UID != ref.UID {
			return reconcile.Result{}, false, nil // stale claim: repairStaleClaim's
		}
		node, err := c.registeredNode(ctx, h, nc)
		if err != nil || node == nil {
			return reconcile.Result{}, err != nil, err
		}
		why = "node " + node.Name + " registered"
	}
	lg := log.FromContext(ctx)
	if err := c.Tokens.Delete(ctx, id); err != nil {
		if !errors.Is(err, token.ErrMalformedID) {
			return reconcile.Result{}, true, err
		}
		// It cannot name a token we minted: nothing to delete, and keeping
		// it would fail every reconcile. Forget it.
		lg.Error(err, "malformed bootstrapTokenID in status; clearing it without deleting anything")
	}
	orig := h.DeepCopy()
	h.Status.BootstrapTokenID = ""
	if err := patchStatus(ctx, c.Client, orig, h); err != nil {
		return reconcile.Result{}, true, err
	}
	if !token.ValidID(id) {
		id = "<malformed>" // it might be a whole "<id>.<secret>": never log it
	}
	lg.Info("bootstrap token collected", "tokenID", id, "reason", why)
	return reconcile.Result{}, false, nil
}

// registeredNode returns the Node the kubelet of h registered for the claim
// nc, or nil: one tied to h (leave.Tied: its providerID, or kpssh's host
// label — never its address alone) and active since the claim. It lists
// the informer cache: only hosts with a token in flight (a handful) get
// here.
func (c *Controller) registeredNode(ctx context.Context, h *v1beta1.SSHHost, nc *karpv1.NodeClaim) (*corev1.Node, error) {
	nodes := &corev1.NodeList{}
	if err := c.Client.List(ctx, nodes); err != nil {
		return nil, err
	}
	for i := range nodes.Items {
		if n := &nodes.Items[i]; leave.Tied(h, n, nc.CreationTimestamp.Time) && activeSince(n, nc.CreationTimestamp) {
			return n, nil
		}
	}
	return nil, nil
}

// activeSince reports whether a kubelet has been at n since the claim
// began: the Node was created no earlier than the NodeClaim, or its Ready
// heartbeat is that recent (a kubelet re-registering onto a Node object
// left over from an earlier claim — node names are host names). A Node
// being deleted, or one untouched since before the claim, belongs to an
// earlier life of the host: counting it would delete the token of a join
// still in progress.
func activeSince(n *corev1.Node, claimed metav1.Time) bool {
	if !n.DeletionTimestamp.IsZero() {
		return false
	}
	if !n.CreationTimestamp.Before(&claimed) {
		return true
	}
	for _, cond := range n.Status.Conditions {
		if cond.Type == corev1.NodeReady && !cond.LastHeartbeatTime.IsZero() && !cond.LastHeartbeatTime.Before(&claimed) {
			return true
		}
	}
	return false
}

// hostsOfNode maps a Node to the pool hosts with a token in flight that it
// may belong to (the Node watch: registration collects the token at once
// instead of at the next requeue).
func (c *Controller) hostsOfNode(ctx context.Context, o client.Object) []reconcile.Request {
	n, ok := o.(*corev1.Node)
	if !ok {
		return nil
	}
	list := &v1beta1.SSHHostList{}
	if err := c.Client.List(ctx, list, client.InNamespace(c.Namespace), client.MatchingFields{pool.IndexToken: "held"}); err != nil {
		log.FromContext(ctx).Error(err, "list hosts for a Node event", "Node", klog.KObj(n))
		return nil
	}
	var out []reconcile.Request
	for i := range list.Items {
		// Any claim time: the reconcile checks the one of the host's claim.
		if h := &list.Items[i]; leave.Tied(h, n, time.Time{}) {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(h)})
		}
	}
	return out
}

// nodeRegistration passes the Node events that can make a host's Node
// count as registered: creation and a change of identity (providerID,
// addresses). Heartbeats are left out on purpose: every Node posts one
// every few minutes, and the rare case they matter (a kubelet re-using a
// leftover Node object) is caught by the claimed host's periodic requeue.
func nodeRegistration() predicate.Predicate {
	return predicate.Funcs{
		CreateFunc:  func(event.CreateEvent) bool { return true },
		DeleteFunc:  func(event.DeleteEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
		UpdateFunc: func(e event.UpdateEvent) bool {
			a, okA := e.ObjectOld.(*corev1.Node)
			b, okB := e.ObjectNew.(*corev1.Node)
			return okA && okB && (a.Spec.ProviderID != b.Spec.ProviderID || !slices.Equal(a.Status.Addresses, b.Status.Addresses))
		},
	}
}
