package cli

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/engine"
	"github.com/dklesev/kpssh/internal/profile"
)

const signProfile = `apiVersion: karpenter.dklesev.github.io/v1beta1
kind: SSHJoinProfile
metadata:
  name: tls
spec:
  version: "7"
  scripts:
    install: |
      #!/bin/bash
      set -euo pipefail
      echo install
    join: |
      #!/bin/bash
      echo "join $KPSSH_NODE_NAME"
    leave: |
      set -euo pipefail
      systemctl disable --now kubelet containerd
`

// TestSign signs with a key made by the real ssh-keygen; the printed block,
// pasted under spec, verifies in the engine (v1 and v2) and — v1 — in the
// real ssh-keygen -Y verify too.
func TestSign(t *testing.T) {
	dir := t.TempDir()
	keyPath := filepath.Join(dir, "signer")
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "ops", "-f", keyPath).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v: %s", err, out)
	}
	pub, _ := os.ReadFile(keyPath + ".pub")
	prof := filepath.Join(dir, "profile.yaml")
	if err := os.WriteFile(prof, []byte(signProfile), 0o600); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	for _, manifest := range []bool{false, true} {
		var warn bytes.Buffer
		out, err := sign(signOptions{keyFile: keyPath, profileFile: prof, manifest: manifest, notAfter: "24h", phases: "install,join,leave,uninstall", now: now}, &warn)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(warn.String(), "join script has no `set -euo pipefail`") {
			t.Errorf("no warning for the lax join: %q", warn.String())
		}
		// paste the block under spec
		full := signProfile + "  " + strings.ReplaceAll(strings.TrimSuffix(out, "\n"), "\n", "\n  ") + "\n"
		p := &v1beta1.SSHJoinProfile{}
		if err := yaml.UnmarshalStrict([]byte(full), p); err != nil {
			t.Fatalf("signed profile does not parse: %v\n%s", err, full)
		}
		h := &v1beta1.SSHHost{Spec: v1beta1.SSHHostSpec{ExecMode: v1beta1.ExecModeVerified, TrustedSigners: []v1beta1.TrustedSigner{v1beta1.TrustedSigner(strings.TrimSpace(string(pub)))}}}
		for _, ph := range []engine.Phase{engine.PhaseInstall, engine.PhaseJoin, engine.PhaseLeave} {
			src, err := profile.VerifiedSource(p, ph, h)
			if err != nil {
				t.Fatal(err)
			}
			if err := engine.VerifySignature(ph, src); err != nil {
				t.Fatalf("manifest=%v %s: %v", manifest, ph, err)
			}
			if manifest != strings.HasPrefix(src.Verified.Signature, "kpssh-manifest: 2\nphase: "+string(ph)+"\nprofile: tls@7\n") {
				t.Fatalf("manifest=%v: signature field %q", manifest, src.Verified.Signature)
			}
			if !manifest {
				allowed := filepath.Join(dir, "allowed")
				_ = os.WriteFile(allowed, []byte("kpssh "+string(pub)), 0o600)
				sig := filepath.Join(dir, "s.sig")
				_ = os.WriteFile(sig, []byte(src.Verified.Signature), 0o600)
				c := exec.Command("ssh-keygen", "-Y", "verify", "-f", allowed, "-I", "kpssh", "-n", "kpssh", "-s", sig)
				c.Stdin = strings.NewReader(src.Script)
				if o, err := c.CombinedOutput(); err != nil {
					t.Fatalf("ssh-keygen rejects kpssh sign's %s signature: %v: %s", ph, err, o)
				}
			}
		}
	}
	for _, tc := range []struct {
		name string
		o    signOptions
		want string
	}{
		{"no key", signOptions{keyFile: filepath.Join(dir, "nope"), profileFile: prof, phases: "join"}, "read key"},
		{"bad phase", signOptions{keyFile: keyPath, profileFile: prof, phases: "reboot"}, "unknown phase"},
		{"past", signOptions{keyFile: keyPath, profileFile: prof, phases: "join", manifest: true, notAfter: "2001-01-01T00:00:00Z", now: now}, "past"},
		{"bad not-after", signOptions{keyFile: keyPath, profileFile: prof, phases: "join", manifest: true, notAfter: "soon", now: now}, "neither"},
		{"template", signOptions{keyFile: keyPath, profileFile: writeTemp(t, dir, strings.Replace(signProfile, "echo install", "echo {{ .Vars.x }}", 1)), phases: "install"}, "{{"},
		{"not a profile", signOptions{keyFile: keyPath, profileFile: writeTemp(t, dir, "kind: Pod\nspec: {}\n"), phases: "join"}, "not an SSHJoinProfile"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := sign(tc.o, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("want error with %q, got %v", tc.want, err)
			}
		})
	}
	var so, se bytes.Buffer
	if rc := Sign(context.Background(), []string{"-key", keyPath}, &so, &se); rc != ExitUsage {
		t.Fatalf("missing profile arg: rc %d", rc)
	}
}

func writeTemp(t *testing.T, dir, s string) string {
	t.Helper()
	f, err := os.CreateTemp(dir, "p*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = f.WriteString(s)
	_ = f.Close()
	return f.Name()
}
