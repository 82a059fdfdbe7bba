package testenv

import (
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// BenchmarkEnvtestStart measures a full control-plane start (etcd +
// kube-apiserver + our and Karpenter's CRDs established) against a same-run
// baseline: etcd alone becoming healthy.
func BenchmarkEnvtestStart(b *testing.B) {
	assets, err := Assets()
	if err != nil {
		b.Fatal(err)
	}
	var full, base time.Duration
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		etcd := &envtest.Etcd{}
		etcd.Path = assets + "/etcd"
		etcd.StartTimeout = time.Minute
		if err := etcd.Start(); err != nil {
			b.Fatal(err)
		}
		base += time.Since(t0)
		if err := etcd.Stop(); err != nil {
			b.Fatal(err)
		}

		t0 = time.Now()
		e, err := Start()
		if err != nil {
			b.Fatal(err)
		}
		full += time.Since(t0)
		if err := e.Stop(); err != nil {
			b.Fatal(err)
		}
	}
	n := float64(b.N)
	b.ReportMetric(full.Seconds()/n, "s/envtest-start")
	b.ReportMetric(base.Seconds()/n, "s/etcd-only-baseline")
	b.ReportMetric(full.Seconds()/base.Seconds(), "x-baseline")
}
