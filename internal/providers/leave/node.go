package leave

import (
	"context"
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/karpenter/pkg/events"

	"github.com/dklesev/kpssh/apis/v1beta1"
)

// A host's Node is found by identity, never by address alone: whoever may
// edit an SSHHost chooses its spec.nodeAddress, and two sites may share an
// address plan, so an InternalIP names no particular Node. The zombie
// guard, Delete and Adopt act only on the one Node Tied to the host.

// ReasonNodeIdentityAmbiguous is the SSHHost event when several Nodes are
// tied to one host: kpssh deletes and adopts none of them.
const ReasonNodeIdentityAmbiguous = "NodeIdentityAmbiguous"

// StaticProviderID is the providerID kpssh gives host h's kubelet in Static
// mode (cloudprovider.ProviderID: kpssh://<namespace>/<host>). Only this
// host's join is passed it.
func StaticProviderID(h *v1beta1.SSHHost) string {
	return v1beta1.ProviderIDScheme + "://" + h.Namespace + "/" + h.Name
}

// NodeAddress is the IP the host's kubelet advertises: spec.nodeAddress,
// else spec.address when that is an IP, else the IP the probe learnt
// (status.observedNodeAddress). A DNS name is never one: it is no --node-ip
// and matches no InternalIP. "" when nothing is known yet.
func NodeAddress(h *v1beta1.SSHHost) string {
	if h.Spec.NodeAddress != "" {
		return h.Spec.NodeAddress
	}
	if _, err := netip.ParseAddr(h.Spec.Address); err == nil {
		return h.Spec.Address
	}
	return h.Status.ObservedNodeAddress
}

// Tied reports whether n is the Node of host h's kubelet:
//   - its providerID is the one recorded on the host (status.providerID) or
//     the host's Static one; or
//   - the host has no providerID recorded (an Adopt join before kpssh learnt
//     the id, or a released host) and n carries v1beta1.LabelHost for h
//     (kpssh passes it to the host's Adopt join), has an InternalIP equal
//     to the host's node address, was created no earlier than since (the
//     claim; for a host without one, the host itself) and names no other
//     kpssh host in its providerID.
//
// A Node with the host's InternalIP and nothing else is not tied.
func Tied(h *v1beta1.SSHHost, n *corev1.Node, since time.Time) bool {
	pid := n.Spec.ProviderID
	if pid != "" && (pid == h.Status.ProviderID || pid == StaticProviderID(h)) {
		return true
	}
	if h.Status.ProviderID != "" || strings.HasPrefix(pid, v1beta1.ProviderIDScheme+"://") {
		return false
	}
	if n.Labels[v1beta1.LabelHost] != v1beta1.HostLabelValue(h.Namespace, h.Name) || n.CreationTimestamp.Time.Before(since) {
		return false
	}
	want := NodeAddress(h)
	if want == "" {
		return false
	}
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP && sameIP(a.Address, want) {
			return true
		}
	}
	return false
}

// sameIP compares addresses as IPs (2001:db8::1 == 2001:DB8:0::1), and
// anything unparsable (a DNS name in spec.address) as text.
func sameIP(a, b string) bool {
	x, errA := netip.ParseAddr(a)
	y, errB := netip.ParseAddr(b)
	if errA != nil || errB != nil {
		return a == b
	}
	return x.Unmap() == y.Unmap()
}

// Match is what MatchingNode found.
type Match struct {
	// Node is the one Node tied to the host; nil when there is none, or
	// several.
	Node *corev1.Node
	// Several names (sorted) the Nodes tied to the host when more than one
	// is: none of them counts as the host's.
	Several []string
}

// Err describes an ambiguous match for an error or status message, nil
// otherwise.
func (m Match) Err(h *v1beta1.SSHHost) error {
	if len(m.Several) == 0 {
		return nil
	}
	return fmt.Errorf("%d Nodes (%s) carry host %s's identity (its providerID, or the %s label since the claim): none is taken as its Node",
		len(m.Several), strings.Join(m.Several, ", "), h.Name, v1beta1.LabelHost)
}

// MatchingNode finds the Node Tied to h (since as for Tied); several tied
// Nodes are no match. Nodes being deleted count.
func MatchingNode(ctx context.Context, c client.Reader, h *v1beta1.SSHHost, since time.Time) (Match, error) {
	nodes := &corev1.NodeList{}
	if err := c.List(ctx, nodes); err != nil {
		return Match{}, err
	}
	var tied []*corev1.Node
	for i := range nodes.Items {
		if n := &nodes.Items[i]; Tied(h, n, since) {
			tied = append(tied, n)
		}
	}
	switch len(tied) {
	case 0:
		return Match{}, nil
	case 1:
		return Match{Node: tied[0]}, nil
	}
	names := make([]string, len(tied))
	for i, n := range tied {
		names[i] = n.Name
	}
	sort.Strings(names)
	return Match{Several: names}, nil
}

// DeleteNode deletes the host's Node, if exactly one is tied to it, after a
// leave stopped its kubelet, and returns its name ("" when none was
// deleted) with the match. Looked up only now: a kubelet registering while
// leave ran (a host powered back on, or a claim deleted before Karpenter
// saw its Node register) leaves a Node no one else removes. One already
// terminating is left to Karpenter's termination.
func DeleteNode(ctx context.Context, c client.Client, h *v1beta1.SSHHost, since time.Time) (string, Match, error) {
	m, err := MatchingNode(ctx, c, h, since)
	node := m.Node
	if err != nil || node == nil || node.DeletionTimestamp != nil {
		return "", m, err
	}
	if err := c.Delete(ctx, node, client.Preconditions{UID: &node.UID}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return "", m, err
	}
	return node.Name, m, nil
}

// AmbiguousNodes is the SSHHost event for a match of several Nodes.
func AmbiguousNodes(h *v1beta1.SSHHost, m Match) events.Event {
	return events.Event{InvolvedObject: h, Type: corev1.EventTypeWarning, Reason: ReasonNodeIdentityAmbiguous,
		Message:      m.Err(h).Error() + ": delete the ones that are not this host's",
		DedupeValues: append([]string{string(h.UID)}, m.Several...)}
}
