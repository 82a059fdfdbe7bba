package sshx_test

import (
	"strings"
	"testing"

	"github.com/dklesev/kpssh/internal/sshx"
	"github.com/dklesev/kpssh/internal/sshx/sshtest"
)

func TestParseKnownHost(t *testing.T) {
	signer, _ := sshtest.NewKey(t)
	pub := sshx.PublicKeyLine(signer.PublicKey())
	fp := sshx.Fingerprint(signer.PublicKey())
	for _, tc := range []struct {
		name, in, want, wantErr string
	}{
		{"fingerprint", fp, fp, ""},
		{"fingerprint with padding", fp + "=", fp, ""},
		{"fingerprint with spaces", "  " + fp + "\t", fp, ""},
		{"public key line", pub, fp, ""},
		{"public key line with comment", pub + " root@h1", fp, ""},
		{"known_hosts line", "10.0.0.11 " + pub, fp, ""},
		{"known_hosts with port and aliases", "[10.0.0.11]:2222,h1 " + pub + " c", fp, ""},
		{"hashed known_hosts", "|1|abc=|def= " + pub, fp, ""},
		{"empty", "", "", "empty"},
		{"short fingerprint", "SHA256:abc", "", "not a SHA256 fingerprint"},
		{"md5 fingerprint", "MD5:aa:bb", "", "neither"},
		{"cert authority marker", "@cert-authority *.lab " + pub, "", "markers"},
		{"two lines", pub + "\n" + pub, "", "single line"},
		{"garbage", "hello world", "", "neither"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := sshx.ParseKnownHost(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func FuzzParseKnownHost(f *testing.F) {
	f.Add("SHA256:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU")
	f.Add("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKpX7kZ8Yz0WqkUoQk1M3nFJ0hQwH5t3f6zU3i6Rk9aB c")
	f.Add("h1,10.0.0.1 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKpX7kZ8Yz0WqkUoQk1M3nFJ0hQwH5t3f6zU3i6Rk9aB")
	f.Add("@revoked * ssh-rsa AAAA")
	f.Fuzz(func(t *testing.T, s string) {
		fp, err := sshx.ParseKnownHost(s)
		if err == nil && (!strings.HasPrefix(fp, "SHA256:") || len(fp) != len("SHA256:")+43) {
			t.Fatalf("accepted %q as %q", s, fp)
		}
	})
}

func TestTailBuffer(t *testing.T) {
	b := &sshx.TailBuffer{Max: 5}
	for _, w := range []string{"ab", "cd", "efg"} {
		_, _ = b.Write([]byte(w))
	}
	if b.String() != "cdefg" || !b.Truncated() {
		t.Fatalf("%q %v", b.String(), b.Truncated())
	}
	_, _ = b.Write([]byte("0123456789"))
	if b.String() != "56789" {
		t.Fatalf("%q", b.String())
	}
}
