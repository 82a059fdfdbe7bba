package host

import (
	"context"
	"fmt"
	"io"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/probe"
	"github.com/dklesev/kpssh/internal/providers/hostkey"
	"github.com/dklesev/kpssh/internal/providers/token"
	"github.com/dklesev/kpssh/internal/sshx"
	"github.com/dklesev/kpssh/internal/sshx/sshtest"
)

const sweepHosts = 1000

func probeServer(b *testing.B) *sshtest.Server {
	return sshtest.Start(b, func(cmd string, _ io.Reader, stdout, _ io.Writer) int {
		fmt.Fprint(stdout, "nproc=4\nmemtotal_kb=8000000\narch=x86_64\nkubelet=inactive\n")
		return 0
	})
}

func cpuSeconds() float64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// parallel runs f(i) for i in [0,n) on `workers` goroutines, as
// controller-runtime does with MaxConcurrentReconciles.
func parallel(n, workers int, f func(i int)) {
	var wg sync.WaitGroup
	next := make(chan int)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				f(i)
			}
		}()
	}
	for i := 0; i < n; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
}

// BenchmarkProbeSweep1000 probes 1,000 SSHHosts (in-process SSH servers,
// real protocol, fake apiserver) through the controller at several
// concurrencies, against the raw x/crypto/ssh handshake+session rate in the
// same run. Targets: a sweep ≤ 5 s on 2 cores, ≥ 80 % of the raw rate.
func BenchmarkProbeSweep1000(b *testing.B) {
	srv := probeServer(b)
	tg := sshx.Target{Address: srv.Host, Port: srv.Port, PrivateKey: srv.ClientKey}

	for _, workers := range []int{8, 32, 64} {
		b.Run(fmt.Sprintf("concurrency=%d", workers), func(b *testing.B) {
			var rawWall, wall time.Duration
			var rawCPU, cpu float64
			for n := 0; n < b.N; n++ {
				// Raw baseline: dial + handshake + one session, no controller.
				c0, t0 := cpuSeconds(), time.Now()
				parallel(sweepHosts, workers, func(int) {
					if _, err := probe.Run(context.Background(), tg, false, "", 0); err != nil {
						b.Error(err)
					}
				})
				rawWall += time.Since(t0)
				rawCPU += cpuSeconds() - c0

				ctrl, names := sweepController(b, srv)
				c0, t0 = cpuSeconds(), time.Now()
				parallel(len(names), workers, func(i int) {
					if _, err := ctrl.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: names[i]}}); err != nil {
						b.Error(err)
					}
				})
				wall += time.Since(t0)
				cpu += cpuSeconds() - c0
				verifySwept(b, ctrl.Client, names)
			}
			n := float64(b.N)
			b.ReportMetric(wall.Seconds()/n, "s/sweep")
			b.ReportMetric(sweepHosts*n/wall.Seconds(), "probes/s")
			b.ReportMetric(cpu/n, "cpu-s/1000probes")
			b.ReportMetric(sweepHosts*n/rawWall.Seconds(), "raw-probes/s-baseline")
			b.ReportMetric(rawCPU/n, "raw-cpu-s/1000probes")
			b.ReportMetric(rawWall.Seconds()/wall.Seconds(), "ratio-to-raw")
		})
	}
}

func sweepController(b *testing.B, srv *sshtest.Server) (*Controller, []string) {
	objs := []client.Object{&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "key", Namespace: ns}, Data: map[string][]byte{"privateKey": srv.ClientKey}}}
	names := make([]string, sweepHosts)
	for i := range names {
		names[i] = fmt.Sprintf("h%04d", i)
		h := newHost(names[i])
		// A machine per host (hosts of one machine are duplicates, and not
		// probed); the prober below dials every one of them at srv.
		h.Spec.Address = fmt.Sprintf("10.%d.%d.%d", 100+i/65536, i/256%256, i%256)
		objs = append(objs, h)
	}
	// A scheme of just the kinds involved: the fake client walks every known
	// type per call, and the global scheme (client-go + Karpenter) would make
	// the fake apiserver, not the controller, the cost being measured.
	s := runtime.NewScheme()
	_ = corev1.AddToScheme(s)
	_ = v1beta1.AddToScheme(s)
	// Status writes are computed exactly as against a real apiserver (the
	// optimistic-lock merge patch body) and then kept in memory: the
	// apiserver's own cost runs on another machine and is not the
	// controller's. Reads go through the fake, like informer-cache reads.
	written := &sync.Map{}
	c := withPoolIndexes(fake.NewClientBuilder().WithScheme(s).WithStatusSubresource(&v1beta1.SSHHost{}).WithObjects(objs...)).
		WithInterceptorFuncs(interceptor.Funcs{SubResourcePatch: func(_ context.Context, _ client.Client, _ string, o client.Object, p client.Patch, _ ...client.SubResourcePatchOption) error {
			if _, err := p.Data(o); err != nil {
				return err
			}
			written.Store(o.GetName(), o.(*v1beta1.SSHHost).Status.State)
			return nil
		}}).Build()
	sweepWritten = written
	return &Controller{Client: c, Recorder: &recorder{}, Clock: clocktesting.NewFakeClock(time.Now()), Keys: hostkey.New(c),
		Leaver: &fakeLeaver{}, Tokens: token.New(c), Namespace: ns,
		Prober: func(ctx context.Context, t sshx.Target, verified bool, shim string, timeout time.Duration) (probe.Result, error) {
			t.Address, t.Port = srv.Host, srv.Port
			return probe.Run(ctx, t, verified, shim, timeout)
		},
		Interval: DefaultProbeInterval, Timeout: DefaultProbeTimeout}, names
}

var sweepWritten *sync.Map

func verifySwept(b *testing.B, _ client.Client, names []string) {
	avail := 0
	for _, n := range names {
		if st, ok := sweepWritten.Load(n); ok && st == v1beta1.HostAvailable {
			avail++
		}
	}
	if avail != len(names) {
		b.Fatalf("%d of %d hosts Available after the sweep", avail, len(names))
	}
}
