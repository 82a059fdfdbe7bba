package leave

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/dklesev/kpssh/apis/v1beta1"
)

var (
	claimed = time.Date(2026, 11, 29, 11, 0, 0, 0, time.UTC)
	before  = metav1.NewTime(claimed.Add(-time.Hour))
	after   = metav1.NewTime(claimed.Add(time.Minute))
)

func testHost(mut ...func(*v1beta1.SSHHost)) *v1beta1.SSHHost {
	h := &v1beta1.SSHHost{ObjectMeta: metav1.ObjectMeta{Name: "h1", Namespace: "pool"},
		Spec: v1beta1.SSHHostSpec{Address: "192.0.2.1", NodeAddress: "10.0.0.1"}}
	for _, m := range mut {
		m(h)
	}
	return h
}

func testNode(name string, mut ...func(*corev1.Node)) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: after},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.0.1"}}}}
	for _, m := range mut {
		m(n)
	}
	return n
}

func pid(id string) func(*corev1.Node) { return func(n *corev1.Node) { n.Spec.ProviderID = id } }

func hostLabel(ns, name string) func(*corev1.Node) {
	return func(n *corev1.Node) {
		n.Labels = map[string]string{v1beta1.LabelHost: v1beta1.HostLabelValue(ns, name)}
	}
}

func addr(typ corev1.NodeAddressType, ip string) func(*corev1.Node) {
	return func(n *corev1.Node) { n.Status.Addresses = []corev1.NodeAddress{{Type: typ, Address: ip}} }
}

func recorded(id string) func(*v1beta1.SSHHost) {
	return func(h *v1beta1.SSHHost) { h.Status.ProviderID = id }
}

// byName addresses the host by DNS name, without nodeAddress; observed is
// the IP its probe learnt.
func byName(observed string) func(*v1beta1.SSHHost) {
	return func(h *v1beta1.SSHHost) {
		h.Spec.Address, h.Spec.NodeAddress, h.Status.ObservedNodeAddress = "node-1.pool.example", "", observed
	}
}

func TestNodeAddress(t *testing.T) {
	for _, tc := range []struct {
		name string
		mut  func(*v1beta1.SSHHost)
		want string
	}{
		{"nodeAddress wins", func(h *v1beta1.SSHHost) { h.Status.ObservedNodeAddress = "10.0.0.9" }, "10.0.0.1"},
		{"an IP address without nodeAddress", func(h *v1beta1.SSHHost) { h.Spec.NodeAddress, h.Status.ObservedNodeAddress = "", "10.0.0.9" }, "192.0.2.1"},
		{"a DNS name: the probe's IP", byName("10.0.0.9"), "10.0.0.9"},
		{"a DNS name never probed: none (a name is no --node-ip)", byName(""), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := testHost(tc.mut)
			if got := NodeAddress(h); got != tc.want {
				t.Fatalf("NodeAddress = %q, want %q", got, tc.want)
			}
			if got := EmptyContext(h).NodeAddress; got != tc.want {
				t.Fatalf("leave's KPSSH_NODE_ADDRESS = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestTied(t *testing.T) {
	for _, tc := range []struct {
		name string
		host *v1beta1.SSHHost
		node *corev1.Node
		want bool
	}{
		// The attack: the node address names someone else's Node.
		{"InternalIP alone", testHost(), testNode("victim"), false},
		{"InternalIP and a foreign providerID", testHost(), testNode("victim", pid("aws:///eu-west-1a/i-0123")), false},
		{"another site's host of the same name", testHost(), testNode("b", pid("kpssh://site-b/h1")), false},
		{"another kpssh host, with our host label", testHost(), testNode("h2", pid("kpssh://pool/h2"), hostLabel("pool", "h1")), false},

		{"recorded providerID", testHost(recorded("eks-hybrid:///eu/c/mi-1")), testNode("mi-1", pid("eks-hybrid:///eu/c/mi-1"), addr(corev1.NodeInternalIP, "10.9.9.9")), true},
		{"Static providerID, none recorded yet", testHost(), testNode("h1", pid("kpssh://pool/h1")), true},
		{"Static providerID, older than the claim (a re-used Node object)", testHost(), testNode("h1", pid("kpssh://pool/h1"), func(n *corev1.Node) { n.CreationTimestamp = before }), true},
		{"another identity than the recorded one, with our label", testHost(recorded("eks-hybrid:///eu/c/mi-1")), testNode("mi-2", pid("eks-hybrid:///eu/c/mi-2"), hostLabel("pool", "h1")), false},

		{"host label and InternalIP", testHost(), testNode("mi-1", pid("eks-hybrid:///eu/c/mi-1"), hostLabel("pool", "h1")), true},
		{"host label, no providerID yet", testHost(), testNode("mi-1", hostLabel("pool", "h1")), true},
		{"host label of the same name in another pool namespace", testHost(), testNode("mi-1", hostLabel("site-b", "h1")), false},
		{"host label, another InternalIP", testHost(), testNode("mi-1", hostLabel("pool", "h1"), addr(corev1.NodeInternalIP, "10.0.0.2")), false},
		{"host label, the address only as ExternalIP", testHost(), testNode("mi-1", hostLabel("pool", "h1"), addr(corev1.NodeExternalIP, "10.0.0.1")), false},
		{"host label, created before the claim", testHost(), testNode("mi-1", hostLabel("pool", "h1"), func(n *corev1.Node) { n.CreationTimestamp = before }), false},
		{"host label, IPv6 spelled differently", testHost(func(h *v1beta1.SSHHost) { h.Spec.NodeAddress = "2001:db8::7" }),
			testNode("mi-1", hostLabel("pool", "h1"), addr(corev1.NodeInternalIP, "2001:DB8:0:0::7")), true},
		{"host label, spec.address when no nodeAddress", testHost(func(h *v1beta1.SSHHost) { h.Spec.NodeAddress = "" }),
			testNode("mi-1", hostLabel("pool", "h1"), addr(corev1.NodeInternalIP, "192.0.2.1")), true},
		// issue 17 item 2: a DNS name is no InternalIP; the probe's is
		{"host label, DNS address: the IP the probe learnt", testHost(byName("10.0.0.9")),
			testNode("mi-1", hostLabel("pool", "h1"), addr(corev1.NodeInternalIP, "10.0.0.9")), true},
		{"host label, DNS address, another InternalIP", testHost(byName("10.0.0.9")),
			testNode("mi-1", hostLabel("pool", "h1"), addr(corev1.NodeInternalIP, "10.0.0.1")), false},
		{"host label, DNS address never probed", testHost(byName("")),
			testNode("mi-1", hostLabel("pool", "h1"), addr(corev1.NodeInternalIP, "10.0.0.1")), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Tied(tc.host, tc.node, claimed); got != tc.want {
				t.Fatalf("Tied = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestHostLabelValueFitsALabel(t *testing.T) {
	if got := v1beta1.HostLabelValue("pool", "h1"); got != "pool.h1" {
		t.Fatalf("short name: %q", got)
	}
	long := strings.Repeat("a", 60) + ".example"
	got := v1beta1.HostLabelValue("pool", long)
	if len(got) > 63 || !strings.HasPrefix(got, "sha256-") || strings.Contains(got, ".") {
		t.Fatalf("long name: %q (%d chars)", got, len(got))
	}
	if got == v1beta1.HostLabelValue("pool2", long) || got == v1beta1.HostLabelValue("pool", long+"x") {
		t.Fatal("two hosts share a label value")
	}
}

func TestMatchingAndDeleteNode(t *testing.T) {
	own := func() *corev1.Node { return testNode("h1", pid("kpssh://pool/h1")) }
	for _, tc := range []struct {
		name        string
		nodes       []client.Object
		wantDeleted string
		wantSeveral []string
		wantLeft    []string
	}{
		{"only a Node with the host's address: none", []client.Object{testNode("a-victim")}, "", nil, []string{"a-victim"}},
		{"overlapping addresses: the tied one", []client.Object{testNode("a-other", pid("kpssh://site-b/h1")), own()}, "h1", nil, []string{"a-other"}},
		{"two tied: none, both named", []client.Object{own(), testNode("mi-1", hostLabel("pool", "h1"))}, "", []string{"h1", "mi-1"}, []string{"h1", "mi-1"}},
		{"terminating: Karpenter's", []client.Object{testNode("h1", pid("kpssh://pool/h1"), func(n *corev1.Node) {
			n.DeletionTimestamp, n.Finalizers = &after, []string{"karpenter.sh/termination"}
		})}, "", nil, []string{"h1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(tc.nodes...).Build()
			h := testHost()
			deleted, m, err := DeleteNode(context.Background(), c, h, claimed)
			if err != nil {
				t.Fatal(err)
			}
			if deleted != tc.wantDeleted || strings.Join(m.Several, ",") != strings.Join(tc.wantSeveral, ",") {
				t.Fatalf("deleted %q several %v, want %q %v", deleted, m.Several, tc.wantDeleted, tc.wantSeveral)
			}
			if (m.Err(h) != nil) != (len(tc.wantSeveral) > 0) {
				t.Fatalf("Err %v", m.Err(h))
			}
			if len(tc.wantSeveral) > 0 {
				if ev := AmbiguousNodes(h, m); ev.Reason != ReasonNodeIdentityAmbiguous || !strings.Contains(ev.Message, "h1, mi-1") {
					t.Fatalf("event %+v", ev)
				}
			}
			list := &corev1.NodeList{}
			if err := c.List(context.Background(), list); err != nil {
				t.Fatal(err)
			}
			var left []string
			for _, n := range list.Items {
				left = append(left, n.Name)
			}
			if strings.Join(left, ",") != strings.Join(tc.wantLeft, ",") {
				t.Fatalf("Nodes left %v, want %v", left, tc.wantLeft)
			}
		})
	}
}
