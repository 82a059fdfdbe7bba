package sshx

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"golang.org/x/crypto/ssh"
)

// Fingerprint returns the OpenSSH SHA256 fingerprint, "SHA256:<base64 no pad>".
func Fingerprint(k ssh.PublicKey) string { return ssh.FingerprintSHA256(k) }

// ParseKnownHost reads the `knownHost` value of a host's key Secret and
// returns the fingerprint it pins. Accepted forms, as users paste them:
//   - a fingerprint: SHA256:<base64>
//   - a known_hosts line: [host[,host…]] <type> <base64> [comment]
//   - a public-key line: <type> <base64> [comment]
//
// Anything else is an error, never a silent pass: an unparseable pin must not
// degrade into trust-on-first-use.
func ParseKnownHost(s string) (string, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return "", errors.New("knownHost is empty")
	}
	if strings.ContainsAny(s, "\n\r") {
		return "", errors.New("knownHost must be a single line")
	}
	if strings.HasPrefix(s, "SHA256:") {
		raw := strings.TrimPrefix(s, "SHA256:")
		b, err := base64.RawStdEncoding.Strict().DecodeString(strings.TrimRight(raw, "="))
		if err != nil || len(b) != 32 {
			return "", fmt.Errorf("knownHost %q is not a SHA256 fingerprint (want SHA256: and 43 base64 characters)", truncate(s, 60))
		}
		return "SHA256:" + base64.RawStdEncoding.EncodeToString(b), nil
	}
	if strings.HasPrefix(s, "@") {
		return "", errors.New("knownHost markers (@cert-authority, @revoked) are not supported; give the host's own key")
	}
	if k, _, _, _, err := ssh.ParseAuthorizedKey([]byte(s)); err == nil {
		return Fingerprint(k), nil
	}
	if _, _, k, _, _, err := ssh.ParseKnownHosts([]byte(s)); err == nil {
		return Fingerprint(k), nil
	}
	return "", fmt.Errorf("knownHost is neither a SHA256: fingerprint, a known_hosts line nor a public-key line")
}

// HostKeyMismatchError aborts a handshake whose host key differs from the pin.
// Both fingerprints are public values and safe to report.
type HostKeyMismatchError struct {
	Expected, Got string
}

func (e *HostKeyMismatchError) Error() string {
	return fmt.Sprintf("host key mismatch: expected %s, got %s", e.Expected, e.Got)
}

// PublicKeyLine renders a key as an authorized_keys/known_hosts body.
func PublicKeyLine(k ssh.PublicKey) string {
	return string(bytes.TrimSpace(ssh.MarshalAuthorizedKey(k)))
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
