package sshsig

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/binary"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"
)

func newSigner(t testing.TB, kind string) ssh.Signer {
	t.Helper()
	var key any
	var err error
	switch kind {
	case "ed25519":
		_, key, err = ed25519.GenerateKey(rand.Reader)
	case "ecdsa256":
		key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	case "ecdsa384":
		key, err = ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	case "ecdsa521":
		key, err = ecdsa.GenerateKey(elliptic.P521(), rand.Reader)
	case "rsa":
		key, err = rsa.GenerateKey(rand.Reader, 2048)
	default:
		t.Fatalf("unknown key kind %s", kind)
	}
	if err != nil {
		t.Fatal(err)
	}
	s, err := ssh.NewSignerFromKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func line(pk ssh.PublicKey) string { return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(pk))) }

func trusted(t testing.TB, pks ...ssh.PublicKey) TrustedKeys {
	t.Helper()
	var lines []string
	for _, pk := range pks {
		lines = append(lines, line(pk))
	}
	tk, err := ParseTrusted(lines)
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

// blob assembles an SSHSIG blob field by field, so tests can break any one.
type blobFields struct {
	magic     string
	version   uint32
	pub       []byte
	namespace string
	hash      string
	sig       []byte
	trailing  []byte
}

func (f blobFields) armor() []byte {
	var b bytes.Buffer
	b.WriteString(f.magic)
	var v [4]byte
	binary.BigEndian.PutUint32(v[:], f.version)
	b.Write(v[:])
	writeString(&b, f.pub)
	writeString(&b, []byte(f.namespace))
	writeString(&b, nil)
	writeString(&b, []byte(f.hash))
	writeString(&b, f.sig)
	b.Write(f.trailing)
	return Armor(b.Bytes())
}

// goodFields signs message like Sign does, with hash and sigAlgo chosen.
func goodFields(t testing.TB, s ssh.Signer, ns, hash, sigAlgo string, message []byte) blobFields {
	t.Helper()
	data, err := signedData(ns, hash, message)
	if err != nil {
		// an unsupported hash: sign the sha512 form, the verifier must
		// refuse the name before it gets there
		data, _ = signedData(ns, "sha512", message)
	}
	var sig *ssh.Signature
	if sigAlgo != "" {
		sig, err = s.(ssh.AlgorithmSigner).SignWithAlgorithm(rand.Reader, data, sigAlgo)
	} else {
		sig, err = s.Sign(rand.Reader, data)
	}
	if err != nil {
		t.Fatal(err)
	}
	return blobFields{magic: magic, version: 1, pub: s.PublicKey().Marshal(), namespace: ns, hash: hash, sig: ssh.Marshal(sig)}
}

func TestSignVerifyRoundTrip(t *testing.T) {
	msg := []byte("#!/bin/bash\nset -euo pipefail\necho join\n")
	for _, kind := range []string{"ed25519", "ecdsa256", "ecdsa384", "ecdsa521", "rsa"} {
		t.Run(kind, func(t *testing.T) {
			s := newSigner(t, kind)
			armored, err := SignWith(s, msg, Namespace)
			if err != nil {
				t.Fatal(err)
			}
			pk, err := Verify(armored, msg, Namespace, trusted(t, s.PublicKey()))
			if err != nil {
				t.Fatalf("verify: %v", err)
			}
			if !bytes.Equal(pk.Marshal(), s.PublicKey().Marshal()) {
				t.Fatal("verify returned another key")
			}
			if _, err := Verify(armored, append(msg, ' '), Namespace, trusted(t, s.PublicKey())); err == nil {
				t.Fatal("changed message verified")
			}
		})
	}
}

func TestVerifyRejects(t *testing.T) {
	msg := []byte("echo hi\n")
	ed := newSigner(t, "ed25519")
	rsaS := newSigner(t, "rsa")
	other := newSigner(t, "ed25519")
	good := goodFields(t, ed, Namespace, "sha512", "", msg)

	mod := func(f func(*blobFields)) []byte { c := good; f(&c); return c.armor() }
	cases := []struct {
		name    string
		armored []byte
		trust   TrustedKeys
		msg     []byte
		want    string
	}{
		{"ok", good.armor(), trusted(t, ed.PublicKey()), msg, ""},
		{"sha256 ok", goodFields(t, ed, Namespace, "sha256", "", msg).armor(), trusted(t, ed.PublicKey()), msg, ""},
		{"rsa-sha2-256 ok", goodFields(t, rsaS, Namespace, "sha512", ssh.KeyAlgoRSASHA256, msg).armor(), trusted(t, rsaS.PublicKey()), msg, ""},
		{"rsa sha1 refused", goodFields(t, rsaS, Namespace, "sha512", ssh.KeyAlgoRSA, msg).armor(), trusted(t, rsaS.PublicKey()), msg, "SHA-1"},
		{"sha1 hash refused", mod(func(f *blobFields) { f.hash = "sha1" }), trusted(t, ed.PublicKey()), msg, "hash algorithm"},
		{"bad magic", mod(func(f *blobFields) { f.magic = "SSHSIX" }), trusted(t, ed.PublicKey()), msg, "magic"},
		{"version 2", mod(func(f *blobFields) { f.version = 2 }), trusted(t, ed.PublicKey()), msg, "version"},
		{"namespace", goodFields(t, ed, "git", "sha512", "", msg).armor(), trusted(t, ed.PublicKey()), msg, "namespace"},
		{"namespace field swapped", mod(func(f *blobFields) { f.namespace = "kpssx" }), trusted(t, ed.PublicKey()), msg, "namespace"},
		{"untrusted signer", good.armor(), trusted(t, other.PublicKey()), msg, "not a trusted signer"},
		{"signer swapped", mod(func(f *blobFields) { f.pub = other.PublicKey().Marshal() }), trusted(t, other.PublicKey()), msg, "does not verify"},
		{"trailing bytes", mod(func(f *blobFields) { f.trailing = []byte{0} }), trusted(t, ed.PublicKey()), msg, "trailing"},
		{"key/alg mismatch", mod(func(f *blobFields) { f.pub = rsaS.PublicKey().Marshal() }), trusted(t, rsaS.PublicKey()), msg, "does not match key type"},
		{"message", good.armor(), trusted(t, ed.PublicKey()), []byte("echo HI\n"), "does not verify"},
		{"no trust", good.armor(), nil, msg, "no trusted signer"},
		{"not armored", []byte("hello"), trusted(t, ed.PublicKey()), msg, "not an armored"},
		{"no end", []byte(armorBegin + "\nAAAA\n"), trusted(t, ed.PublicKey()), msg, "END"},
		{"bad base64", []byte(armorBegin + "\n!!!!\n" + armorEnd), trusted(t, ed.PublicKey()), msg, "base64"},
		{"truncated", Armor([]byte("SSHSIG\x00\x00\x00\x01\x00\x00\x00\xff")), trusted(t, ed.PublicKey()), msg, "truncated"},
		{"too big", bytes.Repeat([]byte("A"), MaxArmored+1), trusted(t, ed.PublicKey()), msg, "more than"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Verify(c.armored, c.msg, Namespace, c.trust)
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("want ok, got %v", err)
			case c.want != "" && err == nil:
				t.Fatalf("want error containing %q, got ok", c.want)
			case c.want != "" && !strings.Contains(err.Error(), c.want):
				t.Fatalf("want error containing %q, got %v", c.want, err)
			}
		})
	}
}

func TestParseTrusted(t *testing.T) {
	ed := newSigner(t, "ed25519")
	cases := []struct {
		name  string
		lines []string
		want  string
	}{
		{"one", []string{line(ed.PublicKey()) + " ops@example"}, ""},
		{"comments and blanks", []string{"# ops", "", line(ed.PublicKey())}, ""},
		{"options", []string{`restrict ` + line(ed.PublicKey())}, ""},
		{"garbage", []string{line(ed.PublicKey()), "ssh-ed25519 AAAAnotbase64"}, "trusted signer 2"},
		{"empty", []string{"", "# nothing"}, "no trusted signer"},
		{"nil", nil, "no trusted signer"},
		{"two keys on a line", []string{line(ed.PublicKey()) + "\n" + line(ed.PublicKey())}, "single"},
		{"too many", make([]string, MaxTrusted+1), "at most"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseTrusted(c.lines)
			if (c.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.want)) {
				t.Fatalf("want %q, got %v", c.want, err)
			}
		})
	}
}

func TestSignRefusesBadKeys(t *testing.T) {
	if _, err := Sign([]byte("not a key"), []byte("x"), Namespace); err == nil {
		t.Fatal("garbage key signed")
	}
	if _, err := SignWith(newSigner(t, "ed25519"), []byte("x"), ""); err == nil {
		t.Fatal("empty namespace accepted")
	}
}

func FuzzParse(f *testing.F) {
	s := newSigner(f, "ed25519")
	good, _ := SignWith(s, []byte("m"), Namespace)
	f.Add(good)
	f.Add([]byte(armorBegin + "\n" + armorEnd))
	f.Add([]byte("SSHSIG"))
	f.Fuzz(func(t *testing.T, in []byte) {
		sig, err := Parse(in)
		if err == nil && (sig.PublicKey == nil || sig.Sig == nil) {
			t.Fatal("parsed without key or signature")
		}
	})
}

// FuzzVerify flips bytes of a valid signature's blob: whatever comes out,
// Verify must not panic, and only an intact blob (or one differing in bytes
// the signature does not cover and the parser ignores) may verify.
func FuzzVerify(f *testing.F) {
	s := newSigner(f, "ed25519")
	msg := []byte("#!/bin/bash\nset -euo pipefail\ntrue\n")
	good, _ := SignWith(s, msg, Namespace)
	blob, _ := unarmor(good)
	tk := trusted(f, s.PublicKey())
	f.Add(0, byte(1), false)
	f.Add(len(blob)-1, byte(0x80), false)
	f.Add(10, byte(0xff), true)
	f.Fuzz(func(t *testing.T, pos int, x byte, flipMsg bool) {
		b := append([]byte(nil), blob...)
		m := append([]byte(nil), msg...)
		if pos < 0 {
			pos = -pos
		}
		if flipMsg {
			m[pos%len(m)] ^= x
		} else {
			b[pos%len(b)] ^= x
		}
		_, err := Verify(Armor(b), m, Namespace, tk)
		if x != 0 && err == nil {
			t.Fatalf("a flip (pos %d, xor %#x, msg %v) still verified", pos, x, flipMsg)
		}
		if x == 0 && err != nil {
			t.Fatalf("intact signature failed: %v", err)
		}
	})
}
