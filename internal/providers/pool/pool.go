// Package pool is the host pool as Karpenter's provider sees it: finding
// free hosts, claiming one with a compare-and-swap on status.claimRef,
// resuming and releasing claims, and the narrow status setters used while a
// claim holds. Every write is optimistic-locked; a lost race is a 409 that
// the caller handles, never a silent overwrite.
package pool

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dklesev/kpssh/apis/v1beta1"
)

// ErrNoHost means no free host matched; the caller answers
// InsufficientCapacity.
var ErrNoHost = errors.New("no free host")

// ErrClaimLost means the host no longer holds the claim the caller acts
// under (released, re-claimed by a successor): the caller must stop.
var ErrClaimLost = errors.New("claim no longer held")

// Claim identifies one NodeClaim object.
type Claim struct {
	Name string
	UID  types.UID
}

func (c Claim) ref() *v1beta1.ClaimRef { return &v1beta1.ClaimRef{Name: c.Name, UID: c.UID} }

// Holds reports whether h is claimed by exactly this NodeClaim object.
func (c Claim) Holds(h *v1beta1.SSHHost) bool {
	r := h.Status.ClaimRef
	return r != nil && r.Name == c.Name && r.UID == c.UID
}

// Pool reads and writes hosts of one namespace.
type Pool struct {
	// Client writes, and reads through the informer cache where staleness is
	// harmless (candidate lists: a stale candidate only costs a 409).
	Client client.Client
	// Live reads the apiserver directly: decisions about a claim the caller
	// holds must not be taken on a cache that has not seen its own write.
	Live      client.Reader
	Namespace string
	Now       func() metav1.Time

	// reserved keeps this process's own claimers off each other's hosts:
	// host name → inFlight while a claim CAS is being attempted, then the
	// resourceVersion the host had before our winning write. A cached copy
	// still at that version has not seen our claim yet and is skipped
	// instead of costing a certain 409. Without it N concurrent Creates
	// reading the same cache all try the same oldest host first: O(N²)
	// conflicts (measured: 103 writes/claim, p99 5 min at N=200). The CAS
	// stays the only arbiter across processes.
	reserved sync.Map
}

const inFlight = "\x00in-flight"

// New returns a Pool over namespace; live may be nil when c is uncached.
func New(c client.Client, live client.Reader, namespace string) *Pool {
	if live == nil {
		live = c
	}
	return &Pool{Client: c, Live: live, Namespace: namespace, Now: metav1.Now}
}

// Hosts lists the pool (from the cache), optionally filtered by a selector.
func (p *Pool) Hosts(ctx context.Context, sel labels.Selector) ([]v1beta1.SSHHost, error) {
	return p.list(ctx, p.Client, sel)
}

// View is Hosts without the copy: the hosts share their maps, slices and
// pointers with the informer cache, so a caller may change only a host's
// own value fields (its Status.State) and must DeepCopy one before anything
// else. Reading the pool this way costs one slice, not a deep copy of every
// host per call: at 5,000 hosts the copies of Karpenter's per-NodeClaim
// drift checks and of concurrent Creates were most of the controller's
// garbage and CPU (docs/performance.md, "Memory").
func (p *Pool) View(ctx context.Context, sel labels.Selector) ([]v1beta1.SSHHost, error) {
	return p.list(ctx, p.Client, sel, client.UnsafeDisableDeepCopy)
}

// LiveHosts is Hosts read from the API server: for a decision the cache may
// be behind on (a host released a moment ago).
func (p *Pool) LiveHosts(ctx context.Context, sel labels.Selector) ([]v1beta1.SSHHost, error) {
	return p.list(ctx, p.Live, sel)
}

func (p *Pool) list(ctx context.Context, r client.Reader, sel labels.Selector, more ...client.ListOption) ([]v1beta1.SSHHost, error) {
	list := &v1beta1.SSHHostList{}
	opts := append([]client.ListOption{client.InNamespace(p.Namespace)}, more...)
	if sel != nil {
		opts = append(opts, client.MatchingLabelsSelector{Selector: sel})
	}
	if err := r.List(ctx, list, opts...); err != nil {
		return nil, err
	}
	return list.Items, nil
}

// Free reports whether a host can be claimed: Available, unclaimed, not
// annotated for maintenance (honoured from the moment it is set), not
// marked Duplicate. A duplicate the condition does not mark yet is the
// callers' to exclude (Duplicates) and ClaimOne's to catch.
func Free(h *v1beta1.SSHHost) bool {
	return h.DeletionTimestamp.IsZero() && h.Status.State == v1beta1.HostAvailable && h.Status.ClaimRef == nil && !h.InMaintenance() && !h.IsDuplicate()
}

// Candidates returns the free hosts of class among hosts, oldest first.
func Candidates(hosts []v1beta1.SSHHost, class string) []*v1beta1.SSHHost {
	var out []*v1beta1.SSHHost
	for i := range hosts {
		h := &hosts[i]
		if Free(h) && h.Class() == class {
			out = append(out, h)
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i].CreationTimestamp, out[j].CreationTimestamp
		if !a.Equal(&b) {
			return a.Before(&b)
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// ClaimOne claims the first candidate it wins. A 409 (someone else changed
// the host since it was read) moves on to the next candidate; the same
// host is never retried, so two claimers never both believe they won.
//
// Only a host whose status.machine is its spec's is claimed. A won host is
// then checked against the hosts of its machine, read live (SameMachine):
// if another one holds a claim or comes first (Duplicates), the claim is
// given back and the next candidate tried. The CAS is per host, so
// two claimers of two hosts of one machine both win theirs; each reads the
// pool after its own write, so at least one sees the other's claim and
// gives way — never both keep one (both may give way: Karpenter retries).
func (p *Pool) ClaimOne(ctx context.Context, candidates []*v1beta1.SSHHost, c Claim) (*v1beta1.SSHHost, error) {
	for _, cand := range candidates {
		h := cand.DeepCopy()
		if !Free(h) || !IdentityCurrent(h) || !p.reserve(h) {
			continue
		}
		orig := h.DeepCopy()
		h.Status.ClaimRef = c.ref()
		h.SetState(v1beta1.HostClaimed, "claimed by NodeClaim "+c.Name, p.Now())
		h.Status.LastPhase = nil
		if err := p.patch(ctx, orig, h); err != nil {
			p.reserved.Delete(h.Name)
			if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
				continue
			}
			return nil, err
		}
		d, dup, err := p.firstOfMachine(ctx, orig)
		if err != nil || dup {
			p.reserved.Delete(h.Name)
			msg := "not claimed: the pool could not be read to rule out a duplicate"
			if dup {
				msg = "not claimed: " + d.Message()
			}
			if _, uerr := p.Update(ctx, h.Name, c, func(x *v1beta1.SSHHost) { unclaim(x, orig, msg, p.Now()) }); uerr != nil && !errors.Is(uerr, ErrClaimLost) {
				return nil, fmt.Errorf("give back host %s (a duplicate): %w", h.Name, uerr)
			}
			if err != nil {
				return nil, err
			}
			continue
		}
		p.reserved.Store(h.Name, orig.ResourceVersion)
		return h, nil
	}
	return nil, ErrNoHost
}

// firstOfMachine is SameMachine for a host just claimed (orig: as it was
// before). A younger host of the machine holding a claim is not yet a
// reason to give way: its claimer gives way to this older host once it
// reads the pool — unless it read before this host existed (a host created
// in the same second with a smaller name), so the claim is kept only once a
// read shows it gone, and given back after a few reads that do not.
func (p *Pool) firstOfMachine(ctx context.Context, orig *v1beta1.SSHHost) (Duplicate, bool, error) {
	for wait := yieldPoll; ; wait *= 2 {
		d, dup, err := p.SameMachine(ctx, orig)
		if err != nil || !dup || !d.Held || !d.Younger || wait > yieldWait {
			return d, dup, err
		}
		select {
		case <-ctx.Done():
			return d, dup, ctx.Err()
		case <-time.After(wait):
		}
	}
}

// A younger claimer gives way within one pool read and one status write.
const (
	yieldPoll = 20 * time.Millisecond
	yieldWait = time.Second
)

// SameMachine reads h's machine live and reports h's Duplicate in it, as h
// is (an unclaimed copy: whether another host holds a claim or comes first;
// a claimed one: whether another claimed host comes first). The read
// selects on status.machine, so it returns the machine's hosts, not the
// pool: every host that can hold a claim is among them (ClaimOne claims
// only hosts whose status.machine is current), and one whose controller
// has not written it yet is Pending, never claimed.
func (p *Pool) SameMachine(ctx context.Context, h *v1beta1.SSHHost) (Duplicate, bool, error) {
	id := Identity(h)
	var same []v1beta1.SSHHost
	for _, f := range []struct{ field, value string }{{v1beta1.FieldMachineAddress, id.Address}, {v1beta1.FieldMachineNodeAddress, id.NodeAddress}} {
		if f.value == "" {
			continue
		}
		list := &v1beta1.SSHHostList{}
		if err := p.Live.List(ctx, list, client.InNamespace(p.Namespace), client.MatchingFields{f.field: f.value}); err != nil {
			return Duplicate{}, false, err
		}
		same = append(same, list.Items...)
	}
	d, dup := DuplicateOf(h, same)
	return d, dup, nil
}

// unclaim undoes ClaimOne's write on x (read again since): no claim, and
// the state, Ready condition and lastPhase it had before, unless someone
// else changed the state meanwhile.
func unclaim(x, before *v1beta1.SSHHost, msg string, now metav1.Time) {
	x.Status.ClaimRef = nil
	x.Status.LastPhase = before.Status.LastPhase
	if x.Status.State == v1beta1.HostClaimed {
		x.SetState(before.Status.State, msg, now)
	}
}

// reserve takes h for one claim attempt by this process. It refuses a host
// another claimer of this process is attempting, or one this process won
// whose cached copy predates the win.
func (p *Pool) reserve(h *v1beta1.SSHHost) bool {
	for {
		prev, loaded := p.reserved.LoadOrStore(h.Name, inFlight)
		if !loaded {
			return true
		}
		if prev == inFlight || prev == h.ResourceVersion {
			return false
		}
		// The copy moved past our winning write (released since): the
		// reservation is spent; drop it unless someone replaced it meanwhile.
		p.reserved.CompareAndDelete(h.Name, prev)
	}
}

// Update applies mutate to the host while c still holds it, retrying on
// conflict with a fresh read. It returns ErrClaimLost once the claim is gone.
// Setters (providerID, install marker, token id, lastPhase) go through here.
func (p *Pool) Update(ctx context.Context, name string, c Claim, mutate func(h *v1beta1.SSHHost)) (*v1beta1.SSHHost, error) {
	for attempt := 0; attempt < 10; attempt++ {
		h := &v1beta1.SSHHost{}
		if err := p.Live.Get(ctx, client.ObjectKey{Namespace: p.Namespace, Name: name}, h); err != nil {
			if apierrors.IsNotFound(err) {
				return nil, ErrClaimLost
			}
			return nil, err
		}
		if !c.Holds(h) {
			return nil, ErrClaimLost
		}
		orig := h.DeepCopy()
		mutate(h)
		err := p.patch(ctx, orig, h)
		if err == nil {
			return h, nil
		}
		if !apierrors.IsConflict(err) {
			return nil, err
		}
	}
	return nil, fmt.Errorf("update host %s: too many conflicts", name)
}

// Release ends c's claim on the host, landing it in state (Available after a
// clean leave or a config error, Unhealthy after a host-side failure).
// Releasing a host c does not hold is ErrClaimLost and changes nothing.
func (p *Pool) Release(ctx context.Context, name string, c Claim, state v1beta1.HostState, msg string) (*v1beta1.SSHHost, error) {
	return p.Update(ctx, name, c, func(h *v1beta1.SSHHost) { Released(h, state, msg, p.Now()) })
}

// Released applies a release to h's status: no claim, no token id, no
// providerID, the new state (and, for Unhealthy, the reason as
// lastProbeError so the probe's view and the operator's agree).
func Released(h *v1beta1.SSHHost, state v1beta1.HostState, msg string, now metav1.Time) {
	h.Status.ClaimRef = nil
	h.Status.BootstrapTokenID = ""
	h.Status.JoinClaimUID = ""
	h.Status.ProviderID = ""
	h.SetReboot(nil, now) // a reboot belongs to the claim
	h.Status.Verify = nil // so does its verify
	// and so do its drift checks
	h.SetHostDrift(nil, "", now)
	// A phase of the claim still shown Running ends here (the caller may
	// write its real end after this).
	h.InterruptPhase("interrupted: the host was released (" + msg + ") before the phase's end was recorded")
	h.SetState(state, msg, now)
	if state == v1beta1.HostUnhealthy && msg != "" {
		h.Status.LastProbeError = msg
	}
}

func (p *Pool) patch(ctx context.Context, orig, h *v1beta1.SSHHost) error {
	if equality.Semantic.DeepEqual(orig.Status, h.Status) {
		return nil
	}
	return p.Client.Status().Patch(ctx, h, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{}))
}
