package pool_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/providers/pool"
)

// Issue 15 item 9 at the claim CAS, on the real apiserver: two SSHHosts of
// one machine (two spellings of one IPv6 address, port 22 both), both
// Available, status.machine written, no Duplicate condition (the host
// controller saw neither with the other), and two claimers whose candidate
// lists each hold one of them — a cache that has not seen the other host,
// or two replicas. The
// CAS is per host, so before the fix both win: the machine is claimed
// twice. After it, never both, and never the later host b.
func TestDuplicateHostsAreNeverBothClaimed(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: needs the real apiserver")
	}
	ctx := context.Background()
	ns := "dup-race"
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	for _, h := range []struct{ name, addr string }{{"a", "2001:db8::1"}, {"b", "2001:DB8:0::1"}} {
		o := &v1beta1.SSHHost{ObjectMeta: metav1.ObjectMeta{Name: h.name, Namespace: ns},
			Spec: v1beta1.SSHHostSpec{Address: h.addr, SSHKeySecretRef: v1beta1.LocalObjectReference{Name: "k"},
				Capacity: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("2Gi")}}}
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	get := func(name string) *v1beta1.SSHHost {
		h := &v1beta1.SSHHost{}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, h); err != nil {
			t.Fatal(err)
		}
		return h
	}
	wins := map[string]int{}
	for round := 0; round < 20; round++ {
		for _, n := range []string{"a", "b"} {
			h := get(n)
			id := pool.Identity(h) // what the host controller writes before a probe
			h.Status = v1beta1.SSHHostStatus{Machine: &id}
			h.SetState(v1beta1.HostAvailable, "probed", metav1.Now())
			if err := env.Client.Status().Update(ctx, h); err != nil {
				t.Fatal(err)
			}
		}
		a, b := get("a"), get("b")
		var wg sync.WaitGroup
		var mu sync.Mutex
		won := map[string]pool.Claim{}
		for i, cands := range [][]*v1beta1.SSHHost{{a}, {b}} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				p := pool.New(env.Client, env.Client, ns) // a pool per claimer: separate replicas
				c := pool.Claim{Name: fmt.Sprintf("c-%d-%d", round, i), UID: uuid.NewUUID()}
				h, err := p.ClaimOne(ctx, cands, c)
				if err == nil {
					mu.Lock()
					won[h.Name] = c
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		var held []string
		for _, n := range []string{"a", "b"} {
			if h := get(n); h.Status.ClaimRef != nil {
				held = append(held, n)
			}
		}
		if len(held) > 1 || len(won) > 1 {
			t.Fatalf("round %d: both hosts of one machine claimed (held %v, winners %v)", round, held, won)
		}
		if _, ok := won["b"]; ok || len(held) == 1 && held[0] == "b" {
			t.Fatalf("round %d: the later host b was claimed while a exists", round)
		}
		for n, c := range won {
			wins[n]++
			if _, err := pool.New(env.Client, env.Client, ns).Release(ctx, n, c, v1beta1.HostAvailable, "released"); err != nil {
				t.Fatal(err)
			}
		}
	}
	if wins["a"] == 0 {
		t.Fatalf("a was never claimed in 20 rounds: %v", wins)
	}
	t.Logf("wins over 20 rounds: %v", wins)
}
