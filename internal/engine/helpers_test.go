package engine

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
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
