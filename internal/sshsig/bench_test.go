package sshsig

import (
	"bytes"
	"crypto/sha512"
	"testing"
)

// BenchmarkVerify is the controller's cost of checking one signed 256 KiB
// script (the largest a profile allows), per key type; BenchmarkSHA512 is the
// same-run baseline: hashing the script alone.
func BenchmarkVerify(b *testing.B) {
	msg := bytes.Repeat([]byte("echo kpssh\n"), 256*1024/11)
	for _, kind := range []string{"ed25519", "ecdsa256", "rsa"} {
		s := newSigner(b, kind)
		sig, err := SignWith(s, msg, Namespace)
		if err != nil {
			b.Fatal(err)
		}
		tk := trusted(b, s.PublicKey())
		b.Run(kind, func(b *testing.B) {
			b.SetBytes(int64(len(msg)))
			for i := 0; i < b.N; i++ {
				if _, err := Verify(sig, msg, Namespace, tk); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkSHA512(b *testing.B) {
	msg := bytes.Repeat([]byte("echo kpssh\n"), 256*1024/11)
	b.SetBytes(int64(len(msg)))
	for i := 0; i < b.N; i++ {
		_ = sha512.Sum512(msg)
	}
}
