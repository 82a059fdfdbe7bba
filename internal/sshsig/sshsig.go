// Package sshsig parses, verifies and makes OpenSSH SSHSIG signatures (the
// format of `ssh-keygen -Y sign`, PROTOCOL.sshsig) with nothing but
// golang.org/x/crypto/ssh. It is the controller's half of Verified execution:
// the host's shim checks the same signatures with the stock ssh-keygen, an
// independent implementation.
//
// Verification is strict by design: magic, version 1, the expected
// namespace, hash sha256 or sha512, a signature algorithm from a short
// allow-list (SHA-1 "ssh-rsa" never), and a signer that equals one of the
// trusted keys. A trust root that does not parse is an error, never a pass.
package sshsig

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	"golang.org/x/crypto/ssh"
)

// Namespace is the SSHSIG namespace of every kpssh signature (ssh-keygen -n).
const Namespace = "kpssh"

const (
	magic      = "SSHSIG"
	version    = 1
	armorBegin = "-----BEGIN SSH SIGNATURE-----"
	armorEnd   = "-----END SSH SIGNATURE-----"
	// MaxArmored bounds an armored signature (the CRD allows 16 KiB).
	MaxArmored = 16 * 1024
	// MaxTrusted bounds the number of trusted signers (the CRD allows 16).
	MaxTrusted = 16
)

// allowedSigAlgos maps each accepted signature format to the key type that
// must produce it. SHA-1 ssh-rsa is deliberately absent.
var allowedSigAlgos = map[string]string{
	ssh.KeyAlgoED25519:    ssh.KeyAlgoED25519,
	ssh.KeyAlgoRSASHA256:  ssh.KeyAlgoRSA,
	ssh.KeyAlgoRSASHA512:  ssh.KeyAlgoRSA,
	ssh.KeyAlgoECDSA256:   ssh.KeyAlgoECDSA256,
	ssh.KeyAlgoECDSA384:   ssh.KeyAlgoECDSA384,
	ssh.KeyAlgoECDSA521:   ssh.KeyAlgoECDSA521,
	ssh.KeyAlgoSKED25519:  ssh.KeyAlgoSKED25519,
	ssh.KeyAlgoSKECDSA256: ssh.KeyAlgoSKECDSA256,
}

// Signature is a parsed SSHSIG blob.
type Signature struct {
	PublicKey     ssh.PublicKey
	Namespace     string
	HashAlgorithm string // "sha256" or "sha512"
	Sig           *ssh.Signature
}

// Parse decodes an armored SSHSIG and checks its structure: magic, version,
// hash algorithm, a parseable public key of an allowed type and a signature
// format allowed for it. It does not check the namespace or the signature
// itself (Verify does).
func Parse(armored []byte) (*Signature, error) {
	if len(armored) > MaxArmored {
		return nil, fmt.Errorf("sshsig: signature is %d bytes, more than %d", len(armored), MaxArmored)
	}
	blob, err := unarmor(armored)
	if err != nil {
		return nil, err
	}
	return parseBlob(blob)
}

func unarmor(armored []byte) ([]byte, error) {
	text := strings.TrimSpace(strings.ReplaceAll(string(armored), "\r\n", "\n"))
	if !strings.HasPrefix(text, armorBegin) {
		return nil, errors.New("sshsig: not an armored SSH signature (missing " + armorBegin + ")")
	}
	text = strings.TrimPrefix(text, armorBegin)
	body, rest, ok := strings.Cut(text, armorEnd)
	if !ok {
		return nil, errors.New("sshsig: armor has no " + armorEnd + " line")
	}
	if strings.TrimSpace(rest) != "" {
		return nil, errors.New("sshsig: text after the " + armorEnd + " line")
	}
	b64 := strings.Join(strings.Fields(body), "")
	blob, err := base64.StdEncoding.Strict().DecodeString(b64)
	if err != nil {
		return nil, errors.New("sshsig: armor body is not base64")
	}
	return blob, nil
}

// reader reads SSH wire-format fields.
type reader struct{ b []byte }

func (r *reader) uint32() (uint32, bool) {
	if len(r.b) < 4 {
		return 0, false
	}
	v := binary.BigEndian.Uint32(r.b)
	r.b = r.b[4:]
	return v, true
}

func (r *reader) str() ([]byte, bool) {
	n, ok := r.uint32()
	if !ok || uint64(n) > uint64(len(r.b)) {
		return nil, false
	}
	s := r.b[:n]
	r.b = r.b[n:]
	return s, true
}

func parseBlob(blob []byte) (*Signature, error) {
	if !bytes.HasPrefix(blob, []byte(magic)) {
		return nil, errors.New("sshsig: bad magic (not an SSHSIG blob)")
	}
	r := &reader{b: blob[len(magic):]}
	v, ok := r.uint32()
	if !ok {
		return nil, errors.New("sshsig: truncated blob")
	}
	if v != version {
		return nil, fmt.Errorf("sshsig: unsupported version %d (want 1)", v)
	}
	pub, ok1 := r.str()
	ns, ok2 := r.str()
	_, ok3 := r.str() // reserved
	hash, ok4 := r.str()
	sig, ok5 := r.str()
	if !(ok1 && ok2 && ok3 && ok4 && ok5) {
		return nil, errors.New("sshsig: truncated blob")
	}
	if len(r.b) != 0 {
		return nil, errors.New("sshsig: trailing bytes after the signature")
	}
	h := string(hash)
	if h != "sha256" && h != "sha512" {
		return nil, fmt.Errorf("sshsig: hash algorithm %q not allowed (want sha256 or sha512)", truncate(h, 32))
	}
	pk, err := ssh.ParsePublicKey(pub)
	if err != nil {
		return nil, errors.New("sshsig: signer public key does not parse")
	}
	// ssh.Signature's Rest takes the flags and counter of sk signatures.
	s := new(ssh.Signature)
	if err := ssh.Unmarshal(sig, s); err != nil {
		return nil, errors.New("sshsig: signature field does not parse")
	}
	if err := checkAlgorithm(pk, s.Format); err != nil {
		return nil, err
	}
	return &Signature{PublicKey: pk, Namespace: string(ns), HashAlgorithm: h, Sig: s}, nil
}

func checkAlgorithm(pk ssh.PublicKey, format string) error {
	keyType, ok := allowedSigAlgos[format]
	if !ok {
		if format == ssh.KeyAlgoRSA {
			return errors.New("sshsig: SHA-1 ssh-rsa signatures are not allowed (sign with rsa-sha2-512)")
		}
		return fmt.Errorf("sshsig: signature algorithm %q not allowed", truncate(format, 64))
	}
	if pk.Type() != keyType {
		return fmt.Errorf("sshsig: signature algorithm %s does not match key type %s", format, truncate(pk.Type(), 64))
	}
	return nil
}

// signedData is what the signature covers (PROTOCOL.sshsig §"Signed Data").
func signedData(namespace, hash string, message []byte) ([]byte, error) {
	var digest []byte
	switch hash {
	case "sha256":
		d := sha256.Sum256(message)
		digest = d[:]
	case "sha512":
		d := sha512.Sum512(message)
		digest = d[:]
	default:
		return nil, fmt.Errorf("sshsig: hash algorithm %q not allowed", hash)
	}
	var b bytes.Buffer
	b.WriteString(magic)
	writeString(&b, []byte(namespace))
	writeString(&b, nil)
	writeString(&b, []byte(hash))
	writeString(&b, digest)
	return b.Bytes(), nil
}

func writeString(b *bytes.Buffer, s []byte) {
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(s)))
	b.Write(n[:])
	b.Write(s)
}

// TrustedKeys is a set of trusted signer keys.
type TrustedKeys []ssh.PublicKey

// ParseTrusted parses OpenSSH public-key lines ("ssh-ed25519 AAAA… comment",
// options allowed as in authorized_keys). Any line that does not parse, or a
// key of a type that cannot make an allowed signature, is an error naming
// the line: a broken trust root must never verify anything. Blank lines and
// # comments are skipped; no key at all is an error too.
func ParseTrusted(lines []string) (TrustedKeys, error) {
	if len(lines) > MaxTrusted {
		return nil, fmt.Errorf("sshsig: %d trusted signers, at most %d", len(lines), MaxTrusted)
	}
	var out TrustedKeys
	for i, l := range lines {
		t := strings.TrimSpace(l)
		if t == "" || strings.HasPrefix(t, "#") {
			continue
		}
		pk, _, _, rest, err := ssh.ParseAuthorizedKey([]byte(t))
		if err != nil || len(bytes.TrimSpace(rest)) != 0 {
			return nil, fmt.Errorf("sshsig: trusted signer %d is not a single OpenSSH public-key line", i+1)
		}
		if !allowedKeyType(pk.Type()) {
			return nil, fmt.Errorf("sshsig: trusted signer %d has key type %s, which kpssh does not accept", i+1, truncate(pk.Type(), 64))
		}
		out = append(out, pk)
	}
	if len(out) == 0 {
		return nil, errors.New("sshsig: no trusted signer")
	}
	return out, nil
}

func allowedKeyType(t string) bool {
	for _, kt := range allowedSigAlgos {
		if kt == t {
			return true
		}
	}
	return false
}

// Contains reports whether pk is one of the trusted keys (byte-equal wire
// encoding).
func (t TrustedKeys) Contains(pk ssh.PublicKey) bool {
	w := pk.Marshal()
	for _, k := range t {
		if bytes.Equal(k.Marshal(), w) {
			return true
		}
	}
	return false
}

// Verify checks an armored signature over message: structure (Parse), the
// namespace, a signer among trusted, and the signature itself. It returns the
// signer's key.
func Verify(armored, message []byte, namespace string, trusted TrustedKeys) (ssh.PublicKey, error) {
	if len(trusted) == 0 {
		return nil, errors.New("sshsig: no trusted signer")
	}
	s, err := Parse(armored)
	if err != nil {
		return nil, err
	}
	if s.Namespace != namespace {
		return nil, fmt.Errorf("sshsig: namespace %q, want %q", truncate(s.Namespace, 64), namespace)
	}
	if !trusted.Contains(s.PublicKey) {
		return nil, fmt.Errorf("sshsig: signer %s is not a trusted signer", ssh.FingerprintSHA256(s.PublicKey))
	}
	data, err := signedData(s.Namespace, s.HashAlgorithm, message)
	if err != nil {
		return nil, err
	}
	if err := s.PublicKey.Verify(data, s.Sig); err != nil {
		return nil, errors.New("sshsig: signature does not verify (the signed bytes differ, or it was made by another key)")
	}
	return s.PublicKey, nil
}

// Sign makes an armored SSHSIG (sha512, like ssh-keygen) over message with
// an unencrypted OpenSSH/PEM private key. RSA keys sign with rsa-sha2-512.
func Sign(privateKey, message []byte, namespace string) ([]byte, error) {
	signer, err := ParseSigner(privateKey)
	if err != nil {
		return nil, err
	}
	return SignWith(signer, message, namespace)
}

// ParseSigner parses an unencrypted OpenSSH/PEM private key. Its errors
// never quote the key.
func ParseSigner(privateKey []byte) (ssh.Signer, error) {
	signer, err := ssh.ParsePrivateKey(privateKey)
	if err != nil {
		var pp *ssh.PassphraseMissingError
		if errors.As(err, &pp) {
			return nil, ErrPassphrase
		}
		return nil, errors.New("sshsig: private key does not parse")
	}
	return signer, nil
}

// ErrPassphrase: the private key is encrypted.
var ErrPassphrase = errors.New("sshsig: the private key is passphrase-protected; load it into ssh-agent (ssh-add) and sign with its public key, or decrypt a copy (ssh-keygen -p)")

// SignWith is Sign with a ready signer.
func SignWith(signer ssh.Signer, message []byte, namespace string) ([]byte, error) {
	if namespace == "" {
		return nil, errors.New("sshsig: empty namespace")
	}
	const hash = "sha512"
	data, err := signedData(namespace, hash, message)
	if err != nil {
		return nil, err
	}
	pk := signer.PublicKey()
	var sig *ssh.Signature
	if pk.Type() == ssh.KeyAlgoRSA {
		as, ok := signer.(ssh.AlgorithmSigner)
		if !ok {
			return nil, errors.New("sshsig: RSA signer cannot make rsa-sha2-512 signatures")
		}
		sig, err = as.SignWithAlgorithm(rand.Reader, data, ssh.KeyAlgoRSASHA512)
	} else {
		sig, err = signer.Sign(rand.Reader, data)
	}
	if err != nil {
		return nil, fmt.Errorf("sshsig: sign: %w", err)
	}
	if err := checkAlgorithm(pk, sig.Format); err != nil {
		return nil, err
	}
	var b bytes.Buffer
	b.WriteString(magic)
	var v [4]byte
	binary.BigEndian.PutUint32(v[:], version)
	b.Write(v[:])
	writeString(&b, pk.Marshal())
	writeString(&b, []byte(namespace))
	writeString(&b, nil)
	writeString(&b, []byte(hash))
	writeString(&b, ssh.Marshal(sig))
	return Armor(b.Bytes()), nil
}

// Armor wraps an SSHSIG blob as ssh-keygen does (76-column base64 lines).
func Armor(blob []byte) []byte {
	enc := base64.StdEncoding.EncodeToString(blob)
	var out bytes.Buffer
	out.WriteString(armorBegin + "\n")
	for len(enc) > 76 {
		out.WriteString(enc[:76] + "\n")
		enc = enc[76:]
	}
	out.WriteString(enc + "\n" + armorEnd + "\n")
	return out.Bytes()
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
