package molecule_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/dklesev/kpssh/test/hostenv"
)

// violationRE is a line of ansible-lint's parseable output
// ("path:line: rule: message").
var violationRE = regexp.MustCompile(`^[^\s:][^:]*:\d+(:\d+)?: [\w\[\]-]+: `)

// TestAnsibleLint runs ansible-lint (production profile, .ansible-lint at
// the repo root) over everything under roles/ and playbooks/ and fails
// listing the violations. ansible-lint is a Debian package (hack/deps.sh):
// missing, it fails rather than skips.
func TestAnsibleLint(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: ansible-lint takes ~15 s (make test runs it)")
	}
	lint, err := exec.LookPath("ansible-lint")
	if err != nil {
		t.Fatal("ansible-lint not found: apt-get install ansible-lint (hack/deps.sh installs it)")
	}
	root, err := hostenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, ".ansible-lint")); err != nil {
		t.Fatalf(".ansible-lint: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	home := t.TempDir()
	c := exec.CommandContext(ctx, lint, "--nocolor", "-p", "roles", "playbooks")
	c.Dir = root
	// A private HOME: ansible-lint caches collections and roles under it;
	// nothing from this machine's ~/.ansible is read.
	c.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + home, "LANG=C.UTF-8", "ANSIBLE_HOME=" + filepath.Join(home, ".ansible"), "NO_COLOR=1"}
	var out, errb bytes.Buffer
	c.Stdout, c.Stderr = &out, &errb
	asGroup(c)
	start := time.Now()
	runErr := c.Run()
	var violations []string
	for _, l := range strings.Split(out.String(), "\n") {
		if violationRE.MatchString(l) {
			violations = append(violations, l)
		}
	}
	switch {
	case ctx.Err() != nil:
		t.Fatalf("ansible-lint timed out\n%s%s", out.String(), errb.String())
	case len(violations) > 0:
		t.Fatalf("ansible-lint (production profile) found %d violation(s) under roles/ and playbooks/:\n  %s", len(violations), strings.Join(violations, "\n  "))
	case runErr != nil:
		t.Fatalf("ansible-lint failed without listing violations: %v\n%s%s", runErr, out.String(), errb.String())
	}
	t.Logf("ansible-lint: roles/ and playbooks/ clean (production profile) in %v", time.Since(start).Round(time.Millisecond))
}
