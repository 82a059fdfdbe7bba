package nodeclass

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/dklesev/kpssh/internal/profile"
)

// TestRegistrationWindowIsKarpenters reads Karpenter core's (unexported)
// registration timeout from the module source this binary is built with, so
// bumping sigs.k8s.io/karpenter to a release that changes it fails here.
func TestRegistrationWindowIsKarpenters(t *testing.T) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/karpenter").Output()
	if err != nil {
		t.Fatalf("go list sigs.k8s.io/karpenter: %v", err)
	}
	src, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(out)), "pkg/controllers/nodeclaim/lifecycle/liveness.go"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`registrationTimeout\s*=\s*time\.Minute\s*\*\s*([0-9]+)`).FindSubmatch(src)
	if m == nil {
		t.Fatal("registrationTimeout = time.Minute * N not found in Karpenter's liveness.go: read how it is defined now")
	}
	mins, err := time.ParseDuration(string(m[1]) + "m")
	if err != nil || mins != RegistrationWindow {
		t.Fatalf("Karpenter's registrationTimeout is %s minutes, RegistrationWindow %s", m[1], RegistrationWindow)
	}
}

func TestShort(t *testing.T) {
	for d, want := range map[time.Duration]string{15 * time.Minute: "15m", time.Hour: "1h", 90 * time.Second: "1m30s",
		30 * time.Second: "30s", time.Hour + 30*time.Second: "1h0m30s", 2*time.Hour + 5*time.Minute: "2h5m"} {
		if got := profile.ShortDuration(d); got != want {
			t.Errorf("ShortDuration(%v) = %q, want %q", d, got, want)
		}
	}
}
