package pool

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dklesev/kpssh/apis/v1beta1"
)

func TestNormalAddress(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"2001:db8::1", "2001:db8::1"},
		{"2001:DB8:0::1", "2001:db8::1"},
		{"2001:0db8:0000:0000:0000:0000:0000:0001", "2001:db8::1"},
		{"2001:db8:0:0:1:0:0:1", "2001:db8::1:0:0:1"},
		{"::ffff:192.0.2.1", "192.0.2.1"}, // IPv4-mapped: the IPv4 machine
		{"::FFFF:c000:0201", "192.0.2.1"},
		{"192.0.2.1", "192.0.2.1"},
		{"fe80::1%eth0", "fe80::1%eth0"},
		{"Node01.DC1.example.com", "node01.dc1.example.com"},
		{"node01.dc1.example.com.", "node01.dc1.example.com"},
		{"localhost", "localhost"},
		// Not an IP to netip (leading zeros): compared as the name it is.
		{"010.0.0.1", "010.0.0.1"},
	} {
		if got := NormalAddress(tc.in); got != tc.want {
			t.Errorf("NormalAddress(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestIdentities(t *testing.T) {
	for _, tc := range []struct {
		addr string
		port int32
		want string
	}{
		{"2001:DB8:0::1", 22, "[2001:db8::1]:22"},
		{"2001:db8::1", 0, "[2001:db8::1]:22"}, // 0: the CRD's default
		{"192.0.2.1", 2222, "192.0.2.1:2222"},
		{"Host.Example", 22, "host.example:22"},
	} {
		if got := AddressIdentity(tc.addr, tc.port); got != tc.want {
			t.Errorf("AddressIdentity(%q, %d) = %q, want %q", tc.addr, tc.port, got, tc.want)
		}
	}
	for _, tc := range []struct{ node, addr, want string }{
		{"", "192.0.2.1", "192.0.2.1"},               // defaults to the address
		{"", "2001:DB8::1", "2001:db8::1"},           // normalised
		{"10.0.0.5", "host.example", "10.0.0.5"},     // explicit
		{"", "host.example", ""},                     // a name: no node identity
		{"::ffff:10.0.0.5", "192.0.2.1", "10.0.0.5"}, // mapped
	} {
		if got := NodeIdentity(tc.node, tc.addr); got != tc.want {
			t.Errorf("NodeIdentity(%q, %q) = %q, want %q", tc.node, tc.addr, got, tc.want)
		}
	}
}

func TestDuplicates(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	mk := func(name string, age int, addr string, port int32, node string, mut ...func(*v1beta1.SSHHost)) v1beta1.SSHHost {
		h := v1beta1.SSHHost{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(t0.Add(time.Duration(age) * time.Second))},
			Spec: v1beta1.SSHHostSpec{Address: addr, Port: port, NodeAddress: node}}
		for _, m := range mut {
			m(&h)
		}
		return h
	}
	held := func(h *v1beta1.SSHHost) { h.Status.ClaimRef = &v1beta1.ClaimRef{Name: "nc", UID: "u"} }
	deleting := func(h *v1beta1.SSHHost) { now := metav1.NewTime(t0); h.DeletionTimestamp = &now }
	for _, tc := range []struct {
		name  string
		hosts []v1beta1.SSHHost
		want  map[string]Duplicate
	}{
		{"distinct machines", []v1beta1.SSHHost{mk("a", 0, "192.0.2.1", 22, ""), mk("b", 1, "192.0.2.2", 22, "")}, map[string]Duplicate{}},
		{"same IP, other port, own node addresses: two machines (port forwards)",
			[]v1beta1.SSHHost{mk("a", 0, "192.0.2.1", 2201, "10.0.0.1"), mk("b", 1, "192.0.2.1", 2202, "10.0.0.2")}, map[string]Duplicate{}},
		{"same IP, other port, no node address: one node address",
			[]v1beta1.SSHHost{mk("a", 0, "192.0.2.1", 2201, ""), mk("b", 1, "192.0.2.1", 2202, "")},
			map[string]Duplicate{"b": {Of: "a", Field: FieldNodeAddress, Value: "192.0.2.1"}}},
		{"IPv6 spellings, the later is the duplicate",
			[]v1beta1.SSHHost{mk("b", 1, "2001:DB8:0::1", 22, ""), mk("a", 0, "2001:db8::1", 0, "")},
			map[string]Duplicate{"b": {Of: "a", Field: FieldAddress, Value: "[2001:db8::1]:22"}}},
		{"same second: the name decides",
			[]v1beta1.SSHHost{mk("y", 0, "192.0.2.1", 22, ""), mk("x", 0, "192.0.2.1", 22, "")},
			map[string]Duplicate{"y": {Of: "x", Field: FieldAddress, Value: "192.0.2.1:22"}}},
		{"name case", []v1beta1.SSHHost{mk("a", 0, "Node1.Example", 22, ""), mk("b", 1, "node1.example", 22, "")},
			map[string]Duplicate{"b": {Of: "a", Field: FieldAddress, Value: "node1.example:22"}}},
		{"a name and its IP share a node address",
			[]v1beta1.SSHHost{mk("a", 0, "node1.example", 22, "10.0.0.5"), mk("b", 1, "10.0.0.5", 22, "")},
			map[string]Duplicate{"b": {Of: "a", Field: FieldNodeAddress, Value: "10.0.0.5"}}},
		{"a name and its IP without a node address: not seen (no resolution)",
			[]v1beta1.SSHHost{mk("a", 0, "node1.example", 22, ""), mk("b", 1, "10.0.0.5", 22, "")}, map[string]Duplicate{}},
		{"both fields: the address is named",
			[]v1beta1.SSHHost{mk("a", 0, "192.0.2.1", 22, "10.0.0.5"), mk("b", 1, "192.0.2.1", 22, "10.0.0.5")},
			map[string]Duplicate{"b": {Of: "a", Field: FieldAddress, Value: "192.0.2.1:22"}}},
		{"a claim comes first: the older unclaimed host is the duplicate",
			[]v1beta1.SSHHost{mk("a", 0, "192.0.2.1", 22, ""), mk("b", 1, "192.0.2.1", 22, "", held)},
			map[string]Duplicate{"a": {Of: "b", Field: FieldAddress, Value: "192.0.2.1:22", Held: true, Younger: true}}},
		{"a deleted host no longer counts, unless it holds a claim",
			[]v1beta1.SSHHost{mk("a", 0, "192.0.2.1", 22, "", deleting), mk("b", 1, "192.0.2.1", 22, ""),
				mk("c", 0, "192.0.2.9", 22, "", deleting, held), mk("d", 1, "192.0.2.9", 22, "")},
			map[string]Duplicate{"d": {Of: "c", Field: FieldAddress, Value: "192.0.2.9:22", Held: true}}},
		{"three hosts: both later ones name the first",
			[]v1beta1.SSHHost{mk("c", 2, "192.0.2.1", 22, ""), mk("b", 1, "192.0.2.1", 22, ""), mk("a", 0, "192.0.2.1", 22, "")},
			map[string]Duplicate{"b": {Of: "a", Field: FieldAddress, Value: "192.0.2.1:22"}, "c": {Of: "a", Field: FieldAddress, Value: "192.0.2.1:22"}}},
		{"a chain: each shares one identity with the one before",
			[]v1beta1.SSHHost{mk("a", 0, "192.0.2.1", 22, "10.0.0.1"), mk("b", 1, "192.0.2.1", 22, "10.0.0.2"), mk("c", 2, "192.0.2.3", 22, "10.0.0.2")},
			map[string]Duplicate{"b": {Of: "a", Field: FieldAddress, Value: "192.0.2.1:22"}, "c": {Of: "b", Field: FieldNodeAddress, Value: "10.0.0.2"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Duplicates(tc.hosts)
			if len(got) != len(tc.want) {
				t.Fatalf("duplicates %+v, want %+v", got, tc.want)
			}
			for n, w := range tc.want {
				if got[n] != w {
					t.Errorf("%s: %+v, want %+v", n, got[n], w)
				}
			}
		})
	}
}

func TestDuplicateMessageNamesHostAndField(t *testing.T) {
	for _, d := range []Duplicate{
		{Of: "a", Field: FieldAddress, Value: "[2001:db8::1]:22"},
		{Of: "a", Field: FieldNodeAddress, Value: "10.0.0.5", Held: true},
	} {
		m := d.Message()
		for _, want := range []string{"host a", d.Field, d.Value} {
			if !strings.Contains(m, want) {
				t.Errorf("message %q does not name %q", m, want)
			}
		}
	}
}
