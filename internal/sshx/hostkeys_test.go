package sshx_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"

	"github.com/dklesev/kpssh/internal/sshx"
	"github.com/dklesev/kpssh/internal/sshx/sshtest"
)

// A host with several host keys shows one per handshake; Dial accepts
// whichever of them the pin names (issue 17 defect 1: an ed25519 pin on a
// stock host used to be refused because Go's client negotiated ECDSA), and
// trust on first use takes the key OpenSSH's ssh(1) takes (ed25519 first).
func TestDialHostWithSeveralKeys(t *testing.T) {
	stock := []string{ssh.KeyAlgoRSA, ssh.KeyAlgoECDSA256, ssh.KeyAlgoED25519} // a fresh Debian install
	const other = "other"                                                      // a key the host does not have
	for _, tc := range []struct {
		name     string
		hostKeys []string
		pin      string // key type pinned; "" trust on first use
		want     string // key type accepted; "" a mismatch
		dials    int    // handshakes of the first Dial
	}{
		{"stock, TOFU takes ed25519", stock, "", ssh.KeyAlgoED25519, 1},
		{"stock, ed25519 pinned", stock, ssh.KeyAlgoED25519, ssh.KeyAlgoED25519, 1},
		{"stock, ecdsa pinned", stock, ssh.KeyAlgoECDSA256, ssh.KeyAlgoECDSA256, 2},
		{"stock, rsa pinned", stock, ssh.KeyAlgoRSA, ssh.KeyAlgoRSA, 3},
		{"stock, another key pinned", stock, other, "", 4},
		{"ecdsa only, TOFU", []string{ssh.KeyAlgoECDSA256}, "", ssh.KeyAlgoECDSA256, 1},
		{"ecdsa only, pinned", []string{ssh.KeyAlgoECDSA256}, ssh.KeyAlgoECDSA256, ssh.KeyAlgoECDSA256, 1},
		{"rsa only, TOFU (rsa-sha2)", []string{ssh.KeyAlgoRSA}, "", ssh.KeyAlgoRSA, 1},
		{"p384 and p521, p521 pinned", []string{ssh.KeyAlgoECDSA384, ssh.KeyAlgoECDSA521}, ssh.KeyAlgoECDSA521, ssh.KeyAlgoECDSA521, 2},
		{"ed25519 only, another key pinned", []string{ssh.KeyAlgoED25519}, other, "", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			byType := map[string]ssh.PublicKey{}
			var signers []ssh.Signer
			for _, kt := range tc.hostKeys {
				s := sshtest.NewHostKey(t, kt)
				signers = append(signers, s)
				byType[kt] = s.PublicKey()
			}
			srv := sshtest.StartWithHostKeys(t, echoHandler, signers...)
			tg := target(srv)
			switch tc.pin {
			case "":
			case other:
				tg.ExpectedFingerprint = sshx.Fingerprint(sshtest.NewHostKey(t, ssh.KeyAlgoED25519).PublicKey())
			default:
				tg.ExpectedFingerprint = sshx.Fingerprint(byType[tc.pin])
			}
			for round := 1; round <= 2; round++ {
				before := srv.Connections()
				c, err := sshx.Dial(context.Background(), tg)
				dials := srv.Connections() - before
				if tc.want == "" {
					var mm *sshx.HostKeyMismatchError
					if !errors.As(err, &mm) {
						t.Fatalf("round %d: want a host key mismatch, got %v", round, err)
					}
					msg := err.Error()
					if !strings.Contains(msg, tg.ExpectedFingerprint) {
						t.Errorf("%q does not name the pin", msg)
					}
					for kt, k := range byType {
						if !strings.Contains(msg, sshx.Fingerprint(k)) {
							t.Errorf("%q does not name the host's %s key", msg, kt)
						}
					}
					// Got is the key shown first: ed25519, first in HostKeyTypes.
					if len(mm.Offered) != len(tc.hostKeys) || mm.Got != sshx.Fingerprint(byType[ssh.KeyAlgoED25519]) {
						t.Errorf("mismatch %+v", mm)
					}
					if dials != tc.dials {
						t.Errorf("round %d: %d handshakes, want %d", round, dials, tc.dials)
					}
					if n := len(srv.Executed()); n != 0 {
						t.Fatalf("%d commands ran", n)
					}
					continue
				}
				if err != nil {
					t.Fatalf("round %d: %v", round, err)
				}
				res, rerr := c.Run(context.Background(), "hello", nil)
				_ = c.Close()
				if rerr != nil || res.Stdout != "ran hello" {
					t.Fatalf("run: %q %v", res.Stdout, rerr)
				}
				if want := byType[tc.want]; c.Fingerprint != sshx.Fingerprint(want) || c.HostKey != sshx.PublicKeyLine(want) {
					t.Fatalf("round %d: accepted %s %s, want the %s key", round, c.Fingerprint, c.HostKey, tc.want)
				}
				// The second dial asks for the type that matched first.
				want := tc.dials
				if round == 2 && tc.pin != "" {
					want = 1
				}
				if dials != want {
					t.Errorf("round %d: %d handshakes, want %d", round, dials, want)
				}
			}
		})
	}
}

func TestHostKeyAlgorithms(t *testing.T) {
	for kt, want := range map[string]string{
		ssh.KeyAlgoED25519:                 "ssh-ed25519",
		ssh.KeyAlgoECDSA256:                "ecdsa-sha2-nistp256",
		ssh.KeyAlgoECDSA521:                "ecdsa-sha2-nistp521",
		ssh.KeyAlgoRSA:                     "rsa-sha2-512,rsa-sha2-256",
		ssh.KeyAlgoDSA:                     "",
		"ssh-ed25519-cert-v01@openssh.com": "",
	} {
		if got := strings.Join(sshx.HostKeyAlgorithms(kt), ","); got != want {
			t.Errorf("HostKeyAlgorithms(%s) = %q, want %q", kt, got, want)
		}
	}
	for _, kt := range sshx.HostKeyTypes {
		if len(sshx.HostKeyAlgorithms(kt)) == 0 {
			t.Errorf("HostKeyTypes lists %s, which HostKeyAlgorithms does not negotiate", kt)
		}
	}
}
