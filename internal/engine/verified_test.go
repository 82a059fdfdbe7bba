package engine

import (
	"crypto/ed25519"
	"crypto/rand"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/dklesev/kpssh/internal/envelope"
	"github.com/dklesev/kpssh/internal/sshsig"
)

func verifiedSigner(t *testing.T) (ssh.Signer, string) {
	t.Helper()
	_, k, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ssh.NewSignerFromKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return s, strings.TrimSpace(string(ssh.MarshalAuthorizedKey(s.PublicKey())))
}

func TestVerifySignature(t *testing.T) {
	s, pub := verifiedSigner(t)
	_, otherPub := verifiedSigner(t)
	script := "#!/bin/bash\nset -euo pipefail\necho ok\n"
	v1, err := sshsig.SignWith(s, []byte(script), sshsig.Namespace)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	v2 := func(phase, profile, body string, issued time.Time) string {
		m, err := envelope.MarshalManifest(envelope.Manifest{Phase: phase, Profile: profile, ScriptSHA256: envelope.ScriptDigest([]byte(body)), IssuedAt: issued, NotAfter: issued.Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		sig, err := sshsig.SignWith(s, m, sshsig.Namespace)
		if err != nil {
			t.Fatal(err)
		}
		return string(m) + string(sig)
	}
	clock := func() time.Time { return now.Add(time.Minute) }
	cases := []struct {
		name  string
		phase Phase
		src   Source
		want  string
	}{
		{"v1 ok", PhaseJoin, Source{Script: script, Verified: &Verified{Signature: string(v1), TrustedSigners: []string{pub}}}, ""},
		{"v2 ok", PhaseJoin, Source{Script: script, Verified: &Verified{Signature: v2("join", "p@1", script, now), Profile: "p@1", TrustedSigners: []string{pub}, Now: clock}}, ""},
		{"no signature", PhaseJoin, Source{Script: script, Verified: &Verified{TrustedSigners: []string{pub}}}, "no signature"},
		{"untrusted", PhaseJoin, Source{Script: script, Verified: &Verified{Signature: string(v1), TrustedSigners: []string{otherPub}}}, "not a trusted signer"},
		{"no trust", PhaseJoin, Source{Script: script, Verified: &Verified{Signature: string(v1)}}, "trustedSigners"},
		{"bad trust line", PhaseJoin, Source{Script: script, Verified: &Verified{Signature: string(v1), TrustedSigners: []string{pub, "ssh-rsa AAAA"}}}, "trusted signer 2"},
		{"tampered", PhaseJoin, Source{Script: script + "id\n", Verified: &Verified{Signature: string(v1), TrustedSigners: []string{pub}}}, "does not verify"},
		{"template", PhaseJoin, Source{Script: "echo {{ .NodeName }}\n", Verified: &Verified{Signature: string(v1), TrustedSigners: []string{pub}}}, "template-free"},
		{"tasks", PhaseJoin, Source{Tasks: "- ping:\n", Verified: &Verified{Signature: string(v1), TrustedSigners: []string{pub}}}, "signed scripts only"},
		{"phase swap", PhaseLeave, Source{Script: script, Verified: &Verified{Signature: v2("join", "p@1", script, now), Profile: "p@1", TrustedSigners: []string{pub}, Now: clock}}, "phase join"},
		{"rollback", PhaseJoin, Source{Script: script, Verified: &Verified{Signature: v2("join", "p@1", script, now), Profile: "p@2", TrustedSigners: []string{pub}, Now: clock}}, "not p@2"},
		{"expired", PhaseJoin, Source{Script: script, Verified: &Verified{Signature: v2("join", "p@1", script, now.Add(-2*time.Hour)), Profile: "p@1", TrustedSigners: []string{pub}, Now: clock}}, "expired"},
		{"shim command", PhaseJoin, Source{Script: script, Verified: &Verified{Signature: string(v1), TrustedSigners: []string{pub}, ShimCommand: "kpssh-shim; rm -rf /"}}, "shimCommand"},
		// Safe characters, but a newline: the remote shell would run a second command.
		{"shim command, newline", PhaseJoin, Source{Script: script, Verified: &Verified{Signature: string(v1), TrustedSigners: []string{pub}, ShimCommand: "kpssh-shim\nrm -rf /tmp/x"}}, "shimCommand"},
		{"shim command, tab", PhaseJoin, Source{Script: script, Verified: &Verified{Signature: string(v1), TrustedSigners: []string{pub}, ShimCommand: "sudo\t-n kpssh-shim"}}, "shimCommand"},
		{"shim command, sudo", PhaseJoin, Source{Script: script, Verified: &Verified{Signature: string(v1), TrustedSigners: []string{pub}, ShimCommand: "sudo -n /usr/local/sbin/kpssh-shim"}}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := Validate(c.phase, c.src)
			if (c.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.want)) {
				t.Fatalf("want %q, got %v", c.want, err)
			}
		})
	}
}

func TestVerifiedRenderAndOutcome(t *testing.T) {
	s, pub := verifiedSigner(t)
	script := "#!/bin/bash\nset -euo pipefail\necho ok\n"
	sig, _ := sshsig.SignWith(s, []byte(script), sshsig.Namespace)
	_, hostPub := verifiedSigner(t)
	key := testKeyPEM(t)
	req := Request{Phase: PhaseJoin, Conn: Connection{Address: "10.0.0.5", User: "kpssh", PrivateKey: key, HostKey: hostPub},
		Source:  Source{Script: script, Verified: &Verified{Signature: string(sig), TrustedSigners: []string{pub}}},
		Context: Context{BootstrapToken: "abcdef.0123456789abcdef", NodeName: "n1", Secrets: map[string]string{"code": "s3cr3t-value"}}}
	out, err := Render(req, true)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"dklesev.kpssh.stdin_exec", `"kpssh-shim run 600"`, `"kpssh-shim ping"`, "kpssh-envelope: 1", "no_log: true"} {
		if !strings.Contains(out, want) {
			t.Errorf("render lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "s3cr3t-value") || strings.Contains(out, "0123456789abcdef") {
		t.Fatal("render shows a secret")
	}
	for _, c := range []struct {
		rc   int
		want Outcome
	}{{2, Rejected}, {3, Rejected}, {4, Rejected}, {5, Rejected}, {10, Failed}, {1, Failed}, {7, Failed}} {
		got := verifiedOutcome(Result{Outcome: Failed, Touched: true, RC: c.rc, FailedTask: "kpssh: join verified script"})
		if got.Outcome != c.want {
			t.Errorf("shim exit %d: %s, want %s", c.rc, got.Outcome, c.want)
		}
	}
	if got := verifiedOutcome(Result{Outcome: Failed, Touched: false, RC: 2}); got.Outcome != Failed {
		t.Error("an untouched failure became Rejected")
	}
}
