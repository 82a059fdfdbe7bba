package engine

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os/exec"
	"syscall"
	"testing"

	"github.com/dklesev/kpssh/internal/sshx"
	"github.com/dklesev/kpssh/internal/sshx/sshtest"
)

func syscallUmask(m int) int { return syscall.Umask(m) }

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

func testKeyPEM(t testing.TB) []byte {
	t.Helper()
	_, pemBytes := sshtest.NewKey(t)
	return pemBytes
}

func testHostKeyLine(t testing.TB) string {
	t.Helper()
	signer, _ := sshtest.NewKey(t)
	return sshx.PublicKeyLine(signer.PublicKey())
}

func sha256hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// playbookBin is the ansible-playbook the tests run: the runner image's,
// which `make test` puts first on PATH (hack/runner-image.sh --bin). A
// machine-installed one would be found too: TestRunnerAnsibleVersion fails
// on it.
func playbookBin(t testing.TB) string {
	t.Helper()
	p, err := exec.LookPath("ansible-playbook")
	if err != nil {
		t.Fatalf("ansible-playbook not on PATH: run the tests through make (it puts the runner image's first on PATH: hack/runner-image.sh --bin): %v", err)
	}
	return p
}
