package hostenv_test

import (
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/dklesev/kpssh/test/hostenv"
)

// BenchmarkHostsUp3 measures bringing 3 hosts up (to SSH-ready) and down,
// with bringing 1 host up in the same run as the baseline, for each Debian
// release a host can boot (sub-benchmarks bookworm and trixie). Run it with
// -benchtime=1x (or 3x): each iteration boots 4 hosts per release.
//
//	go test -run '^$' -bench HostsUp3 -benchtime=1x ./test/hostenv/
func BenchmarkHostsUp3(b *testing.B) {
	if err := hostenv.CheckPrerequisites(); err != nil {
		b.Fatalf("hostenv: %v", err)
	}
	root, err := hostenv.RepoRoot()
	if err != nil {
		b.Fatal(err)
	}
	for _, rel := range []string{hostenv.Bookworm, hostenv.Trixie} {
		b.Run(rel, func(b *testing.B) {
			// Build / verify the cached image outside the measurement.
			if out, err := exec.Command(filepath.Join(root, "hack", "rootfs.sh"), rel).CombinedOutput(); err != nil {
				b.Fatalf("rootfs.sh %s: %v\n%s", rel, err, out)
			}
			o := hostenv.Options{Releases: []string{rel}}
			var up1, down1, up3, down3 time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				w1 := hostenv.UpWith(b, 1, o)
				up1 += time.Since(t0)
				t0 = time.Now()
				if err := w1.Down(); err != nil {
					b.Fatal(err)
				}
				down1 += time.Since(t0)

				t0 = time.Now()
				w3 := hostenv.UpWith(b, 3, o)
				up3 += time.Since(t0)
				t0 = time.Now()
				if err := w3.Down(); err != nil {
					b.Fatal(err)
				}
				down3 += time.Since(t0)
			}
			n := float64(b.N)
			b.ReportMetric(up3.Seconds()/n, "s/3hosts")
			b.ReportMetric(up1.Seconds()/n, "s/1host-baseline")
			b.ReportMetric(up3.Seconds()/up1.Seconds(), "3hosts/1host")
			b.ReportMetric(down3.Seconds()/n, "s/down3")
			b.ReportMetric(down1.Seconds()/n, "s/down1")
		})
	}
}
