package cli

import (
	"bytes"
	"context"
	"encoding/base64"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/engine"
	"github.com/dklesev/kpssh/internal/envelope"
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
// pasted under spec, verifies in the engine (v1 and v2) and in the real
// ssh-keygen -Y verify too.
func TestSign(t *testing.T) {
	dir := t.TempDir()
	keyPath, pub := signerKey(t, dir)
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
		checkSigned(t, dir, out, pub, manifest, engine.PhaseInstall, engine.PhaseJoin, engine.PhaseLeave)
	}
	for _, tc := range []struct {
		name string
		o    signOptions
		want string
	}{
		{"no key", signOptions{keyFile: filepath.Join(dir, "nope"), profileFile: prof, phases: "join"}, "read key"},
		{"bad phase", signOptions{keyFile: keyPath, profileFile: prof, phases: "bogus"}, "unknown phase"},
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

// checkSigned pastes kpssh sign's output under signProfile's spec and checks
// each phase's signature: the engine verifies it for a Verified host
// trusting pub (v1, or v2 with its manifest), and so does the real
// ssh-keygen -Y verify (over the script, or over the v2 manifest).
func checkSigned(t *testing.T, dir, out string, pub []byte, manifest bool, phases ...engine.Phase) {
	t.Helper()
	full := signProfile + "  " + strings.ReplaceAll(strings.TrimSuffix(out, "\n"), "\n", "\n  ") + "\n"
	p := &v1beta1.SSHJoinProfile{}
	if err := yaml.UnmarshalStrict([]byte(full), p); err != nil {
		t.Fatalf("signed profile does not parse: %v\n%s", err, full)
	}
	h := &v1beta1.SSHHost{Spec: v1beta1.SSHHostSpec{ExecMode: v1beta1.ExecModeVerified, TrustedSigners: []v1beta1.TrustedSigner{v1beta1.TrustedSigner(strings.TrimSpace(string(pub)))}}}
	for _, ph := range phases {
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
		f, err := envelope.ParseSignedField(src.Verified.Signature)
		if err != nil {
			t.Fatal(err)
		}
		msg := src.Script
		if manifest {
			msg = string(f.Manifest)
		}
		allowed := filepath.Join(dir, "allowed")
		_ = os.WriteFile(allowed, []byte("kpssh "+string(pub)), 0o600)
		sig := filepath.Join(dir, "s.sig")
		_ = os.WriteFile(sig, f.Signature, 0o600)
		c := exec.Command("ssh-keygen", "-Y", "verify", "-f", allowed, "-I", "kpssh", "-n", "kpssh", "-s", sig)
		c.Stdin = strings.NewReader(msg)
		if o, err := c.CombinedOutput(); err != nil {
			t.Fatalf("ssh-keygen rejects kpssh sign's %s signature (manifest=%v): %v: %s", ph, manifest, err, o)
		}
	}
}

// signerKey makes an ed25519 key with the real ssh-keygen: its path and
// public line.
func signerKey(t *testing.T, dir string) (string, []byte) {
	t.Helper()
	keyPath := filepath.Join(dir, "signer")
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "ops", "-f", keyPath).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v: %s", err, out)
	}
	pub, err := os.ReadFile(keyPath + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	return keyPath, pub
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

// TestSignParamPolicy: -param, -param-policy and -ca-file write a policy
// into every manifest (the contract applied per phase); the engine then
// accepts the signed params and refuses others.
func TestSignParamPolicy(t *testing.T) {
	dir := t.TempDir()
	keyPath, pub := signerKey(t, dir)
	prof := writeTemp(t, dir, signProfile)
	caPEM := "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
	caFile := writeTemp(t, dir, caPEM)
	policyFile := writeTemp(t, dir, "# mirror\nKPSSH_VAR_binarySource=https://mirror.example/k8s\n\nKPSSH_VAR_k8sMinor=re:1[.][0-9]+\n")
	var so, se bytes.Buffer
	args := []string{"-key", keyPath, "-manifest", "-param-policy", policyFile, "-param", "KPSSH_CLUSTER_ENDPOINT=https://10.0.0.1:6443", "-ca-file", caFile, prof}
	if rc := Sign(context.Background(), args, &so, &se); rc != ExitOK {
		t.Fatalf("kpssh sign: rc %d: %s", rc, se.String())
	}
	if strings.Contains(se.String(), "no param policy") {
		t.Fatalf("warned about a missing policy: %s", se.String())
	}
	full := signProfile + "  " + strings.ReplaceAll(strings.TrimSuffix(so.String(), "\n"), "\n", "\n  ") + "\n"
	p := &v1beta1.SSHJoinProfile{}
	if err := yaml.UnmarshalStrict([]byte(full), p); err != nil {
		t.Fatalf("signed profile does not parse: %v\n%s", err, full)
	}
	h := &v1beta1.SSHHost{Spec: v1beta1.SSHHostSpec{ExecMode: v1beta1.ExecModeVerified, TrustedSigners: []v1beta1.TrustedSigner{v1beta1.TrustedSigner(strings.TrimSpace(string(pub)))}}}
	good := engine.Context{ClusterEndpoint: "https://10.0.0.1:6443", ClusterCAB64: base64.StdEncoding.EncodeToString([]byte(caPEM)), NodeName: "n1",
		BootstrapToken: "abcdef.0123456789abcdef", HostAddress: "10.0.0.5", Vars: map[string]string{"binarySource": "https://mirror.example/k8s", "k8sMinor": "1.36"}}
	for _, tc := range []struct {
		name  string
		phase engine.Phase
		mod   func(*engine.Context)
		want  string
	}{
		{"join as signed", engine.PhaseJoin, func(*engine.Context) {}, ""},
		{"install as signed", engine.PhaseInstall, func(c *engine.Context) { c.BootstrapToken = "" }, ""},
		{"leave as signed", engine.PhaseLeave, func(*engine.Context) {}, ""},
		{"rogue mirror", engine.PhaseInstall, func(c *engine.Context) { c.Vars = map[string]string{"binarySource": "http://evil", "k8sMinor": "1.36"} }, "KPSSH_VAR_binarySource"},
		{"rogue minor", engine.PhaseInstall, func(c *engine.Context) {
			c.Vars = map[string]string{"binarySource": "https://mirror.example/k8s", "k8sMinor": "1.36; x"}
		}, "KPSSH_VAR_k8sMinor"},
		{"rogue CA", engine.PhaseJoin, func(c *engine.Context) { c.ClusterCAB64 = "cm9ndWU=" }, "KPSSH_CLUSTER_CA_B64"},
		{"rogue endpoint", engine.PhaseJoin, func(c *engine.Context) { c.ClusterEndpoint = "https://10.6.6.6:6443" }, "KPSSH_CLUSTER_ENDPOINT"},
		{"unknown var", engine.PhaseJoin, func(c *engine.Context) { c.Vars = map[string]string{"other": "x"} }, "KPSSH_VAR_other is not in"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := good
			tc.mod(&c)
			src, err := profile.VerifiedSource(p, tc.phase, h)
			if err != nil {
				t.Fatal(err)
			}
			err = engine.VerifyParams(tc.phase, src, c)
			if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("want %q, got %v", tc.want, err)
			}
		})
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no endpoint rule", []string{"-manifest", "-ca-file", caFile}, "KPSSH_CLUSTER_ENDPOINT needs a rule"},
		{"no CA rule", []string{"-manifest", "-param", "KPSSH_CLUSTER_ENDPOINT=https://a"}, "KPSSH_CLUSTER_CA_B64 needs a rule"},
		{"v1", []string{"-param", "KPSSH_CLUSTER_ENDPOINT=https://a", "-ca-file", caFile}, "needs --manifest"},
		{"bad name", []string{"-manifest", "-param", "PATH=/tmp"}, "PATH"},
		{"not NAME=RULE", []string{"-manifest", "-param", "KPSSH_X"}, "NAME=RULE"},
		{"bad pattern", []string{"-manifest", "-param", `KPSSH_VAR_x=re:\d+`}, "KPSSH_VAR_x"},
		{"secret by value", []string{"-manifest", "-param", "KPSSH_SECRET_CODE=s3cr3t"}, "pin it with sha256"},
		{"no policy file", []string{"-manifest", "-param-policy", filepath.Join(dir, "nope")}, "-param-policy"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var so, se bytes.Buffer
			if rc := Sign(context.Background(), append(append([]string{"-key", keyPath}, tc.args...), prof), &so, &se); rc != ExitUsage || !strings.Contains(se.String(), tc.want) {
				t.Fatalf("rc %d, want a usage error saying %q: %s", rc, tc.want, se.String())
			}
			if so.Len() != 0 || strings.Contains(se.String(), "s3cr3t") {
				t.Fatalf("stdout %q, stderr %q", so.String(), se.String())
			}
		})
	}
	// without a policy: signed, with a warning
	so.Reset()
	se.Reset()
	if rc := Sign(context.Background(), []string{"-key", keyPath, "-manifest", prof}, &so, &se); rc != ExitOK || !strings.Contains(se.String(), "no param policy") {
		t.Fatalf("rc %d, want a warning about the missing policy: %s", rc, se.String())
	}
}

// A verify phase is signed by default, and kpssh validate refuses a signed
// profile whose verify is not: a Verified host would refuse it at every
// launch, and no NodeClaim would ever register.
func TestSignAndValidateVerify(t *testing.T) {
	dir := t.TempDir()
	keyPath, pub := signerKey(t, dir)
	// install 8m: install + join + verify fit the registration window.
	withVerify := signProfile + "    verify: |\n      set -euo pipefail\n      test -e /dev/kvm\n  timeouts: {install: 8m}\n"
	prof := write(t, dir, "verify.yaml", withVerify)
	rc, out, errs := runCmd(func(ctx context.Context, args []string, o, e *bytes.Buffer) int { return Sign(ctx, args, o, e) }, "-key", keyPath, "-manifest", prof)
	if rc != ExitOK || !strings.Contains(out, "\n  verify: |\n") {
		t.Fatalf("kpssh sign (default phases): rc %d, stderr %q, out:\n%s", rc, errs, out)
	}
	full := withVerify + "  " + strings.ReplaceAll(strings.TrimSuffix(out, "\n"), "\n", "\n  ") + "\n"
	p := &v1beta1.SSHJoinProfile{}
	if err := yaml.UnmarshalStrict([]byte(full), p); err != nil {
		t.Fatal(err)
	}
	h := &v1beta1.SSHHost{Spec: v1beta1.SSHHostSpec{ExecMode: v1beta1.ExecModeVerified, TrustedSigners: []v1beta1.TrustedSigner{v1beta1.TrustedSigner(strings.TrimSpace(string(pub)))}}}
	src, err := profile.VerifiedSource(p, engine.PhaseVerify, h)
	if err == nil {
		err = engine.VerifySignature(engine.PhaseVerify, src)
	}
	if err != nil || !strings.Contains(src.Script, "test -e /dev/kvm") {
		t.Fatalf("signed verify: %v", err)
	}
	signed := write(t, dir, "signed.yaml", full)
	if rc, _, errs := runCmd(validateCmd, signed); rc != ExitOK {
		t.Fatalf("validate signed: rc %d: %s", rc, errs)
	}
	partial, err := sign(signOptions{keyFile: keyPath, profileFile: prof, manifest: true, notAfter: "24h", phases: "install,join,leave", now: time.Now().UTC()}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	unsigned := write(t, dir, "unsigned-verify.yaml", withVerify+"  "+strings.ReplaceAll(strings.TrimSuffix(partial, "\n"), "\n", "\n  ")+"\n")
	if rc, _, errs := runCmd(validateCmd, unsigned); rc != ExitInvalid || !strings.Contains(errs, "has no signatures.verify") {
		t.Fatalf("validate with verify unsigned: rc %d, stderr %q", rc, errs)
	}
}
