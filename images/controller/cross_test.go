//go:build cross

package controller_test

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dklesev/kpssh/test/hostenv"
)

// TestImageCrossBuild: the controller Dockerfile's build stage
// cross-compiles for linux/arm64 (this machine runs no arm64 binary and has
// no arm64 runner image, so the arm64 binary is checked, not run). Its own
// target, make test-cross: a cold build cache compiles every package for
// arm64 (tens of minutes on 2 cores), more than make test can afford.
func TestImageCrossBuild(t *testing.T) {
	root, err := hostenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	toolchain := goModToolchain(t, root)
	script := filepath.Join(root, "hack", "runner-image.sh")
	start := time.Now()
	out, err := run(t, buildTimeout, nil, script, "--cross", "arm64")
	if err != nil {
		t.Fatalf("hack/runner-image.sh --cross arm64: %v\n%s", err, tail(out, 4000))
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	bin := lines[len(lines)-1]
	t.Logf("arm64 build stage in %v: %s", time.Since(start).Round(time.Millisecond), bin)
	checkBinary(t, bin, "arm64", toolchain)
}
