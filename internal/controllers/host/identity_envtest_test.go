package host_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/controllers/host"
	"github.com/dklesev/kpssh/internal/probe"
	"github.com/dklesev/kpssh/internal/providers/hostkey"
	"github.com/dklesev/kpssh/internal/sshx"
	"github.com/dklesev/kpssh/internal/sshx/sshtest"
)

// kubelets plays the hosts for the zombie guard: a kubelet per address,
// active until leave stops it. No SSH: the probe and leave are the fakes.
type kubelets struct {
	mu     sync.Mutex
	active map[string]bool // by spec.address
	leaves map[string]int  // by host name
}

func (k *kubelets) probe(_ context.Context, t sshx.Target, _ bool, _ string, _ time.Duration) (probe.Result, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return probe.Result{Facts: probe.Facts{CPU: 2, MemoryKiB: 2 << 20, Arch: "amd64", KubeletActive: k.active[t.Address]},
		Fingerprint: "SHA256:" + strings.Repeat("Z", 43)}, nil
}

func (k *kubelets) Leave(_ context.Context, h *v1beta1.SSHHost, _ hostkey.Credentials) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.active[h.Spec.Address] = false
	k.leaves[h.Name]++
	return nil
}

func (k *kubelets) start(address string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.active[address] = true
}

func (k *kubelets) left(name string) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.leaves[name]
}

// The attack of issue 15 item 4 on the zombie guard, against the real
// apiserver: whoever may edit an SSHHost points spec.nodeAddress at the
// InternalIP of a Node that is not the host's (another cluster node, or a
// node of another site with overlapping addresses), and the host runs a
// kubelet. The guard must not delete that Node — it deletes only a Node
// tied to the host by identity — and a host tied to no Node and carrying
// no install marker stays a foreign kubelet, parked with nothing touched.
func TestZombieGuardDeletesOnlyTheHostsOwnNode(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: needs the real apiserver")
	}
	ctx := context.Background()
	ns := "pool-identity"
	createNS(t, ns)
	_, key := sshtest.NewKey(t)
	if err := env.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "world-key", Namespace: ns},
		Data: map[string][]byte{"privateKey": key}}); err != nil {
		t.Fatal(err)
	}
	k := &kubelets{active: map[string]bool{}, leaves: map[string]int{}}
	startController(t, ns, time.Second, func(c *host.Controller) { c.Prober, c.Leaver = k.probe, k })

	mkNode := func(t *testing.T, name, providerID, ip string, labels map[string]string) *corev1.Node {
		t.Helper()
		return env.CreateNode(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Spec: corev1.NodeSpec{ProviderID: providerID}}, ip)
	}
	// mkHost creates an Available host (its kubelet not started yet), so
	// every Node made after it is younger than the host: only identity can
	// tell the host's Node from another.
	mkHost := func(t *testing.T, name, address, nodeAddress, marker string) {
		t.Helper()
		h := &v1beta1.SSHHost{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: v1beta1.SSHHostSpec{
			Address: address, NodeAddress: nodeAddress, Port: 22, User: "root",
			SSHKeySecretRef: v1beta1.LocalObjectReference{Name: "world-key"},
			Capacity:        corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("256Mi")}}}
		if err := env.Client.Create(ctx, h); err != nil {
			t.Fatal(err)
		}
		h = waitState(t, ns, name, v1beta1.HostAvailable, 30*time.Second)
		if marker != "" {
			orig := h.DeepCopy()
			h.Status.InstalledProfile = marker
			if err := env.Client.Status().Patch(ctx, h, client.MergeFrom(orig)); err != nil {
				t.Fatal(err)
			}
		}
	}
	exists := func(t *testing.T, n *corev1.Node) bool {
		t.Helper()
		got := &corev1.Node{}
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(n), got)
		if err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		return err == nil && got.DeletionTimestamp.IsZero()
	}
	// leftAndBack waits for the guard to run leave on the host and return
	// it to the pool.
	leftAndBack := func(t *testing.T, name string) {
		t.Helper()
		eventually(t, name+" left and Available", 30*time.Second, func() (bool, string) {
			h := get(t, ns, name)
			return k.left(name) > 0 && h.Status.State == v1beta1.HostAvailable, fmt.Sprintf("leaves=%d state=%s error=%q", k.left(name), h.Status.State, h.Status.LastProbeError)
		})
	}

	t.Run("nodeAddress of an unrelated Node, no install marker: parked foreign, the Node untouched", func(t *testing.T) {
		mkHost(t, "zv-foreign", "10.66.0.1", "10.66.1.1", "")
		victim := mkNode(t, "zv-victim-foreign", "aws:///eu-west-1a/i-0aaaaaaaaaaaaaaa1", "10.66.1.1", nil)
		k.start("10.66.0.1")
		eventually(t, "zv-foreign decided", 30*time.Second, func() (bool, string) {
			h := get(t, ns, "zv-foreign")
			return k.left("zv-foreign") > 0 || strings.Contains(h.Status.LastProbeError, "foreign kubelet"), fmt.Sprintf("state=%s error=%q", h.Status.State, h.Status.LastProbeError)
		})
		time.Sleep(2 * time.Second) // a leave, had one started, has finished
		if !exists(t, victim) {
			t.Fatal("the zombie guard deleted an unrelated Node whose InternalIP the host's nodeAddress names")
		}
		if n := k.left("zv-foreign"); n != 0 {
			t.Fatalf("leave ran %d times on a host tied to no Node and without an install marker", n)
		}
		if h := get(t, ns, "zv-foreign"); h.Status.State != v1beta1.HostUnhealthy {
			t.Fatalf("state %s, want Unhealthy (foreign kubelet)", h.Status.State)
		}
	})

	t.Run("nodeAddress of an unrelated Node, install marker: leave runs, the Node survives", func(t *testing.T) {
		mkHost(t, "zv-marker", "10.66.0.2", "10.66.1.2", "p@1")
		victim := mkNode(t, "zv-victim-marker", "", "10.66.1.2", nil)
		k.start("10.66.0.2")
		leftAndBack(t, "zv-marker")
		if !exists(t, victim) {
			t.Fatal("the zombie guard deleted an unrelated Node whose InternalIP the host's nodeAddress names")
		}
	})

	t.Run("overlapping site addresses: two Nodes with the host's InternalIP, only its own is deleted", func(t *testing.T) {
		mkHost(t, "zv-ours", "10.66.0.3", "10.66.1.3", "p@1")
		// Another site's kpssh, same host name and address plan: a Node
		// with the same InternalIP (named to list first).
		other := mkNode(t, "zv-a-site-b", "kpssh://site-b/zv-ours", "10.66.1.3", nil)
		own := mkNode(t, "zv-ours", "kpssh://"+ns+"/zv-ours", "10.66.1.3", nil)
		k.start("10.66.0.3")
		leftAndBack(t, "zv-ours")
		eventually(t, "the host's own Node deleted", 10*time.Second, func() (bool, string) { return !exists(t, own), "" })
		if !exists(t, other) {
			t.Fatal("the zombie guard deleted another site's Node with the same InternalIP")
		}
	})

	label := func(name string) map[string]string {
		return map[string]string{v1beta1.LabelHost: v1beta1.HostLabelValue(ns, name)}
	}

	t.Run("released Adopt host: its Node is found by the host label, not the other with its InternalIP", func(t *testing.T) {
		mkHost(t, "zv-adopt", "10.66.0.4", "10.66.1.4", "p@1")
		other := mkNode(t, "zv-a-other-adopt", "eks-hybrid:///eu/c/mi-0other", "10.66.1.4", nil)
		own := mkNode(t, "zv-mi-own", "eks-hybrid:///eu/c/mi-0own", "10.66.1.4", label("zv-adopt"))
		k.start("10.66.0.4")
		leftAndBack(t, "zv-adopt")
		eventually(t, "the host's own Node deleted", 10*time.Second, func() (bool, string) { return !exists(t, own), "" })
		if !exists(t, other) {
			t.Fatal("the zombie guard deleted a Node with the host's InternalIP but not its label")
		}
	})

	t.Run("two Nodes tied to the host: neither deleted, an event names both", func(t *testing.T) {
		mkHost(t, "zv-twice", "10.66.0.5", "10.66.1.5", "p@1")
		one := mkNode(t, "zv-mi-one", "eks-hybrid:///eu/c/mi-0one", "10.66.1.5", label("zv-twice"))
		two := mkNode(t, "zv-mi-two", "eks-hybrid:///eu/c/mi-0two", "10.66.1.5", label("zv-twice"))
		k.start("10.66.0.5")
		leftAndBack(t, "zv-twice")
		if !exists(t, one) || !exists(t, two) {
			t.Fatal("a Node was deleted although two are tied to the host")
		}
		eventually(t, "NodeIdentityAmbiguous event", 10*time.Second, func() (bool, string) {
			ev := strings.Join(hostEvents(t, ns, "zv-twice"), ",")
			return strings.Contains(ev, "NodeIdentityAmbiguous"), ev
		})
	})

	t.Run("a Node with the host label older than the host object is not its", func(t *testing.T) {
		// An SSHHost deleted and created again under the same name (say,
		// for another machine) does not inherit its predecessor's Node.
		old := mkNode(t, "zv-mi-old", "eks-hybrid:///eu/c/mi-0old", "10.66.1.6", label("zv-reborn"))
		time.Sleep(1100 * time.Millisecond) // creationTimestamp has whole seconds
		mkHost(t, "zv-reborn", "10.66.0.6", "10.66.1.6", "")
		k.start("10.66.0.6")
		eventually(t, "zv-reborn parked foreign", 30*time.Second, func() (bool, string) {
			h := get(t, ns, "zv-reborn")
			return strings.Contains(h.Status.LastProbeError, "foreign kubelet"), h.Status.LastProbeError
		})
		if !exists(t, old) || k.left("zv-reborn") != 0 {
			t.Fatalf("the predecessor's Node was taken as the host's (exists=%v, leaves=%d)", exists(t, old), k.left("zv-reborn"))
		}
	})
}
