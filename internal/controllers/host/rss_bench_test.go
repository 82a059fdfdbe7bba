package host_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/sshx/sshtest"
)

func rssMiB(b *testing.B) float64 {
	runtime.GC()
	raw, err := os.ReadFile("/proc/self/status")
	if err != nil {
		b.Fatal(err)
	}
	for _, l := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(l, "VmRSS:") {
			kb, _ := strconv.Atoi(strings.Fields(l)[1])
			return float64(kb) / 1024
		}
	}
	b.Fatal("no VmRSS")
	return 0
}

// BenchmarkControllerRSS5000Hosts: the host controller (manager, informer
// cache, probes) with 5,000 SSHHosts on the real apiserver. Target ≤ 200 MiB.
// Baseline: the same process with the controller running and no hosts.
// Hosts point at a closed port of loopback addresses (one each: hosts of
// one machine are duplicates, not probed), so every probe fails fast and
// writes status (the worst case for cached object size).
func BenchmarkControllerRSS5000Hosts(b *testing.B) {
	if env == nil {
		b.Fatal("needs the real apiserver (not -short)")
	}
	const n = 5000
	ctx := context.Background()
	for i := 0; i < b.N; i++ {
		ns := fmt.Sprintf("rss-%d-%d", time.Now().Unix(), i)
		if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			b.Fatal(err)
		}
		_, keyPEM := sshtest.NewKey(b)
		if err := env.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "key", Namespace: ns}, Data: map[string][]byte{"privateKey": keyPEM}}); err != nil {
			b.Fatal(err)
		}
		stop := startControllerB(b, ns, 2*time.Minute)
		time.Sleep(2 * time.Second)
		base := rssMiB(b)
		for j := 0; j < n; j++ {
			h := &v1beta1.SSHHost{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("h%05d", j), Namespace: ns,
				Labels: map[string]string{v1beta1.LabelHostClass: fmt.Sprintf("class-%d", j%10)}},
				Spec: v1beta1.SSHHostSpec{Address: fmt.Sprintf("127.1.%d.%d", j/250, j%250+1), Port: 1, SSHKeySecretRef: v1beta1.LocalObjectReference{Name: "key"},
					Capacity: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("8Gi")}}}
			if err := env.Client.Create(ctx, h); err != nil {
				b.Fatal(err)
			}
		}
		deadline := time.Now().Add(5 * time.Minute)
		for {
			list := &v1beta1.SSHHostList{}
			if err := env.Client.List(ctx, list, client.InNamespace(ns)); err != nil {
				b.Fatal(err)
			}
			probed := 0
			for _, h := range list.Items {
				if h.Status.State == v1beta1.HostUnhealthy {
					probed++
				}
			}
			if probed == n {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("only %d of %d hosts probed", probed, n)
			}
			time.Sleep(2 * time.Second)
		}
		full := rssMiB(b)
		stop()
		b.ReportMetric(full, "MiB-rss-5000hosts")
		b.ReportMetric(base, "MiB-rss-0hosts-baseline")
		b.ReportMetric(full/base, "x-baseline")
	}
}
