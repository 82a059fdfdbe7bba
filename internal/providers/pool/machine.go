package pool

import (
	"fmt"
	"net"
	"net/netip"
	"sort"
	"strconv"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dklesev/kpssh/apis/v1beta1"
)

// One machine, one host. Two SSHHosts are the same machine when they dial
// the same address and port, or when their nodes would advertise the same
// node address; both are compared normalised, never as strings. Of such
// hosts only the first (before) may be claimed: the others carry the
// Duplicate condition and are not free.
//
// Not recognised: a DNS name and an IP of the same machine, or two names
// of it (nothing here resolves names), unless they share a node address;
// hosts in two pool namespaces.

// Fields a duplicate is found by.
const (
	FieldAddress     = "spec.address"
	FieldNodeAddress = "spec.nodeAddress"
)

// NormalAddress is the comparable form of an address: an IP in its
// canonical form (lowercase, zeros compressed, an IPv4-mapped IPv6 address
// as IPv4), a DNS name in lowercase without a trailing dot.
func NormalAddress(a string) string {
	if ip, err := netip.ParseAddr(a); err == nil {
		return ip.Unmap().String()
	}
	return strings.TrimSuffix(strings.ToLower(a), ".")
}

// AddressIdentity is what identifies the machine a host dials: the normal
// address and the port (0 reads as the default, 22). The same address on
// another port is another machine (port forwards of one IP).
func AddressIdentity(address string, port int32) string {
	if port == 0 {
		port = 22
	}
	return net.JoinHostPort(NormalAddress(address), strconv.Itoa(int(port)))
}

// NodeIdentity is the node address a host's kubelet advertises, normal:
// nodeAddress, else the address when it is an IP; "" when there is none
// (a DNS name without nodeAddress). The port plays no part.
func NodeIdentity(nodeAddress, address string) string {
	a := nodeAddress
	if a == "" {
		a = address
	}
	ip, err := netip.ParseAddr(a)
	if err != nil {
		return ""
	}
	return ip.Unmap().String()
}

// Identity is h's machine identity from its spec: what the host controller
// writes to status.machine.
func Identity(h *v1beta1.SSHHost) v1beta1.MachineIdentity {
	return v1beta1.MachineIdentity{Address: AddressIdentity(h.Spec.Address, h.Spec.Port), NodeAddress: NodeIdentity(h.Spec.NodeAddress, h.Spec.Address)}
}

// IdentityCurrent reports whether h's status.machine is its spec's. Only
// such a host is claimed: the claim path finds a machine's hosts by it.
func IdentityCurrent(h *v1beta1.SSHHost) bool {
	return h.Status.Machine != nil && *h.Status.Machine == Identity(h)
}

// IndexMachine is the field index (informer cache) of the identities of a
// host; MachineKeys computes its values.
const IndexMachine = "kpssh.machine"

// MachineKeys are the index values of h: "address/<ip-or-name>:<port>" and,
// when it has one, "node/<ip>".
func MachineKeys(h *v1beta1.SSHHost) []string {
	id := Identity(h)
	keys := []string{"address/" + id.Address}
	if id.NodeAddress != "" {
		keys = append(keys, "node/"+id.NodeAddress)
	}
	return keys
}

// IndexMachineKeys is MachineKeys as a client.IndexerFunc.
func IndexMachineKeys(o client.Object) []string {
	if h, ok := o.(*v1beta1.SSHHost); ok {
		return MachineKeys(h)
	}
	return nil
}

// Duplicate says why a host is not its machine's host in the pool: host Of
// is the same machine and comes first, by Field (Value is the identity
// they share, normalised).
type Duplicate struct {
	Of    string
	Field string
	Value string
	// Held: Of holds a claim. Younger: Of comes after the host by age and
	// name, first only by its claim.
	Held, Younger bool
}

// before orders the hosts of one machine: a host holding a claim first
// (the machine is in use through it), then the older (creationTimestamp),
// then the name. Only the first of a machine is ever claimed.
func before(a, b *v1beta1.SSHHost) bool {
	if ha, hb := a.Status.ClaimRef != nil, b.Status.ClaimRef != nil; ha != hb {
		return ha
	}
	return older(a, b)
}

// older: a was created before b, or in the same second with a smaller name.
func older(a, b *v1beta1.SSHHost) bool {
	if ta, tb := a.CreationTimestamp, b.CreationTimestamp; !ta.Equal(&tb) {
		return ta.Before(&tb)
	}
	return a.Name < b.Name
}

// counts reports whether h takes part: a host being deleted still counts
// while it holds a claim (its node is still there), not after.
func counts(h *v1beta1.SSHHost) bool {
	return h.DeletionTimestamp.IsZero() || h.Status.ClaimRef != nil
}

// Duplicates finds, among hosts (one pool namespace), each host that is
// not the first of its machine, with the first one it shares an identity
// with. Hosts not in the map are their machine's host.
func Duplicates(hosts []v1beta1.SSHHost) map[string]Duplicate {
	groups := map[string][]*v1beta1.SSHHost{}
	var keys []string
	for i := range hosts {
		h := &hosts[i]
		if !counts(h) {
			continue
		}
		for _, k := range MachineKeys(h) {
			if _, ok := groups[k]; !ok {
				keys = append(keys, k)
			}
			groups[k] = append(groups[k], h)
		}
	}
	// Address groups first: the message names the address when both match.
	sort.Strings(keys)
	out := map[string]Duplicate{}
	for _, k := range keys {
		g := groups[k]
		if len(g) < 2 {
			continue
		}
		first := g[0]
		for _, h := range g[1:] {
			if before(h, first) {
				first = h
			}
		}
		field, value := FieldAddress, strings.TrimPrefix(k, "address/")
		if strings.HasPrefix(k, "node/") {
			field, value = FieldNodeAddress, strings.TrimPrefix(k, "node/")
		}
		for _, h := range g {
			if _, done := out[h.Name]; done || h == first {
				continue
			}
			out[h.Name] = Duplicate{Of: first.Name, Field: field, Value: value, Held: first.Status.ClaimRef != nil, Younger: older(h, first)}
		}
	}
	return out
}

// DuplicateOf is h's Duplicate among others (which may hold h, or a host
// twice: each name counts once, h as given).
func DuplicateOf(h *v1beta1.SSHHost, others []v1beta1.SSHHost) (Duplicate, bool) {
	all := make([]v1beta1.SSHHost, 0, len(others)+1)
	all = append(all, *h)
	seen := map[string]bool{h.Name: true}
	for i := range others {
		if n := others[i].Name; !seen[n] {
			seen[n] = true
			all = append(all, others[i])
		}
	}
	d, ok := Duplicates(all)[h.Name]
	return d, ok
}

// Message says which host h duplicates, by which field, and what to do.
func (d Duplicate) Message() string {
	first := d.Of + " came first"
	if d.Held {
		first = d.Of + " holds a claim"
	}
	if d.Field == FieldNodeAddress {
		return fmt.Sprintf("same machine as host %s: node address %s on both (%s, or spec.address where it is unset; compared as IPs); %s, so this host is not claimed — delete one of the two or give it its own %s",
			d.Of, d.Value, FieldNodeAddress, first, FieldNodeAddress)
	}
	return fmt.Sprintf("same machine as host %s: %s and port %s on both (compared normalised); %s, so this host is not claimed — delete one of the two",
		d.Of, FieldAddress, d.Value, first)
}
