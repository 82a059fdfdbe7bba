package sshx

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

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
	// Offered are all the keys the host showed ("<type> SHA256:…"), Got's
	// first; set by Dial, which asks for each of the host's key types.
	Offered []string
}

func (e *HostKeyMismatchError) Error() string {
	if len(e.Offered) > 1 {
		return fmt.Sprintf("host key mismatch: expected %s, got none of the host's keys: %s", e.Expected, strings.Join(e.Offered, ", "))
	}
	return fmt.Sprintf("host key mismatch: expected %s, got %s", e.Expected, e.Got)
}

func mismatch(expected string, shown []ssh.PublicKey) *HostKeyMismatchError {
	e := &HostKeyMismatchError{Expected: expected, Got: Fingerprint(shown[0])}
	for _, k := range shown {
		e.Offered = append(e.Offered, k.Type()+" "+Fingerprint(k))
	}
	return e
}

// HostKeyTypes are the host key types kpssh negotiates, in the order a
// client without a pin prefers them: OpenSSH's default order (ssh(1) shows
// an operator a stock host's ed25519 key, and trust on first use pins the
// same one). Plain keys only — a pin is a key, never a certificate — and
// neither DSA nor SHA-1 RSA signatures, which OpenSSH refuses too.
var HostKeyTypes = []string{ssh.KeyAlgoED25519, ssh.KeyAlgoECDSA256, ssh.KeyAlgoECDSA384, ssh.KeyAlgoECDSA521, ssh.KeyAlgoRSA}

// HostKeyAlgorithms are the SSH host-key algorithms that negotiate a key of
// keyType (a public-key line's first field): what ssh(1)'s HostKeyAlgorithms
// must list to be shown that key. Nil for a type kpssh does not negotiate.
func HostKeyAlgorithms(keyType string) []string {
	switch keyType {
	case ssh.KeyAlgoRSA:
		return []string{ssh.KeyAlgoRSASHA512, ssh.KeyAlgoRSASHA256}
	case ssh.KeyAlgoED25519, ssh.KeyAlgoECDSA256, ssh.KeyAlgoECDSA384, ssh.KeyAlgoECDSA521:
		return []string{keyType}
	}
	return nil
}

func algorithmsOf(types []string) []string {
	var algos []string
	for _, kt := range types {
		algos = append(algos, HostKeyAlgorithms(kt)...)
	}
	return algos
}

// pinTypes remembers which key type matched a pinned fingerprint, so the
// next dial asks for that type first and takes one handshake (a hint for
// the order only: a key is accepted by its fingerprint alone).
var pinTypes struct {
	sync.Mutex
	m map[string]string
}

const maxPinTypes = 1 << 14

// hostKeyOrder is HostKeyTypes with the type that last matched fingerprint
// first.
func hostKeyOrder(fingerprint string) []string {
	types := slices.Clone(HostKeyTypes)
	if fingerprint == "" {
		return types
	}
	pinTypes.Lock()
	kt, ok := pinTypes.m[fingerprint]
	pinTypes.Unlock()
	if i := slices.Index(types, kt); ok && i > 0 {
		types = append([]string{kt}, slices.Delete(types, i, i+1)...)
	}
	return types
}

func rememberKeyType(fingerprint, keyType string) {
	if fingerprint == "" {
		return
	}
	pinTypes.Lock()
	defer pinTypes.Unlock()
	if pinTypes.m == nil || len(pinTypes.m) >= maxPinTypes {
		pinTypes.m = map[string]string{}
	}
	pinTypes.m[fingerprint] = keyType
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
