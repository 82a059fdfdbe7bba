package engine

import (
	"crypto/ed25519"
	"crypto/rand"
	"os"
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
		// The host's provisioned fallback leave: nothing of the controller's
		// but the shim command, and only as leave.
		{"provisioned leave", PhaseLeave, Source{Verified: &Verified{ProvisionedLeave: true}}, ""},
		{"provisioned leave, no trusted signers needed", PhaseLeave, Source{Verified: &Verified{ProvisionedLeave: true, ShimCommand: "sudo -n /usr/local/sbin/kpssh-shim"}}, ""},
		{"provisioned leave as join", PhaseJoin, Source{Verified: &Verified{ProvisionedLeave: true}}, "only as leave"},
		{"provisioned leave as reboot", PhaseReboot, Source{Verified: &Verified{ProvisionedLeave: true}}, "only as leave"},
		{"provisioned leave with a script", PhaseLeave, Source{Script: script, Verified: &Verified{ProvisionedLeave: true}}, "takes no script"},
		{"provisioned leave with a signature", PhaseLeave, Source{Verified: &Verified{ProvisionedLeave: true, Signature: string(v1)}}, "takes no script"},
		{"provisioned leave, shim command", PhaseLeave, Source{Verified: &Verified{ProvisionedLeave: true, ShimCommand: "kpssh-shim; rm -rf /"}}, "shimCommand"},
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

// TestProvisionedLeaveRender: the host's fallback leave is one task that
// runs the shim's fallback-leave op with the phase timeout and nothing on
// stdin: no envelope, no script, no params, whatever the context holds.
func TestProvisionedLeaveRender(t *testing.T) {
	_, hostPub := verifiedSigner(t)
	req := Request{Phase: PhaseLeave, Conn: Connection{Address: "10.0.0.5", User: "kpssh", PrivateKey: testKeyPEM(t), HostKey: hostPub},
		Source:  Source{Verified: &Verified{ProvisionedLeave: true, ShimCommand: "sudo -n /opt/kpssh-shim"}},
		Context: Context{HostAddress: "10.0.0.5", NodeAddress: "10.0.0.6", NodeName: "n1", Vars: map[string]string{"x": "y"}},
		Timeout: 3 * time.Minute}
	out, err := Render(req, true)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"sudo -n /opt/kpssh-shim fallback-leave 180"`, `"sudo -n /opt/kpssh-shim ping"`, "provisioned fallback leave", "no envelope"} {
		if !strings.Contains(out, want) {
			t.Errorf("render lacks %q:\n%s", want, out)
		}
	}
	for _, never := range []string{"stdin_file", "kpssh-envelope", "KPSSH_", "10.0.0.6"} {
		if strings.Contains(out, never) {
			t.Errorf("render holds %q: the provisioned leave sends nothing but the op:\n%s", never, out)
		}
	}
	if err := VerifyParams(PhaseLeave, req.Source, req.Context); err != nil {
		t.Errorf("VerifyParams of the provisioned leave: %v", err)
	}
}

// TestFallbackLeaveScriptMatchesTheRole: a Verified host's provisioned
// fallback leave is the same body Raw hosts get.
func TestFallbackLeaveScriptMatchesTheRole(t *testing.T) {
	b, err := os.ReadFile("../../roles/verified_host/files/fallback-leave")
	if err != nil {
		t.Fatal(err)
	}
	_, body, ok := strings.Cut(string(b), "\nset -euo pipefail\n")
	if !ok || !strings.HasPrefix(string(b), "#!/bin/bash\n") {
		t.Fatalf("the role's fallback-leave does not start with #!/bin/bash and carry set -euo pipefail:\n%s", b)
	}
	if body != FallbackLeaveScript {
		t.Fatalf("the role's fallback-leave body differs from engine.FallbackLeaveScript:\n%s\nwant:\n%s", body, FallbackLeaveScript)
	}
}

// TestVerifyParamPolicy: the signed param policy decides which node-class
// vars, cluster endpoint and CA a Verified phase may get; the controller
// refuses anything else before rendering (nothing ships).
func TestVerifyParamPolicy(t *testing.T) {
	s, pub := verifiedSigner(t)
	script := "#!/bin/bash\nset -euo pipefail\necho ok\n"
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	ca := "Y2EtcGVt" // base64 of a CA bundle; pinned by the digest of these bytes
	rules := map[string]envelope.ParamRule{
		EnvClusterEndpoint:            {Kind: envelope.RuleValue, Arg: "https://10.0.0.1:6443"},
		EnvClusterCAB64:               {Kind: envelope.RuleSHA256, Arg: envelope.ScriptDigest([]byte(ca))},
		EnvVarPrefix + "binarySource": {Kind: envelope.RuleValue, Arg: "https://mirror.example/k8s"},
		EnvSecretPrefix + "CODE":      {Kind: envelope.RuleRE, Arg: "[a-z0-9-]+"},
	}
	src := func(phase Phase, policy map[string]envelope.ParamRule) Source {
		m, err := envelope.MarshalManifest(envelope.Manifest{Phase: string(phase), Profile: "p@1", ScriptSHA256: envelope.ScriptDigest([]byte(script)),
			IssuedAt: now, NotAfter: now.Add(time.Hour), Params: policy})
		if err != nil {
			t.Fatal(err)
		}
		sig, err := sshsig.SignWith(s, m, sshsig.Namespace)
		if err != nil {
			t.Fatal(err)
		}
		return Source{Script: script, Verified: &Verified{Signature: string(m) + string(sig), Profile: "p@1", TrustedSigners: []string{pub}, Now: func() time.Time { return now }}}
	}
	good := Context{ClusterEndpoint: "https://10.0.0.1:6443", ClusterCAB64: ca, BootstrapToken: "abcdef.0123456789abcdef", NodeName: "n1",
		ProviderID: "kpssh://pool/h1", HostAddress: "10.0.0.5", NodeAddress: "10.0.0.5", NodeLabels: "a=b,kpssh/x=y", Taints: "t=v:NoSchedule",
		Vars: map[string]string{"binarySource": "https://mirror.example/k8s"}, Secrets: map[string]string{"code": "s3cr3t-value"}}
	with := func(f func(*Context)) Context {
		c := good
		c.Vars = map[string]string{"binarySource": "https://mirror.example/k8s"}
		f(&c)
		return c
	}
	cases := []struct {
		name   string
		phase  Phase
		policy map[string]envelope.ParamRule
		ctx    Context
		want   string
	}{
		{"join within the policy", PhaseJoin, rules, good, ""},
		{"install within the policy", PhaseInstall, rules, good, ""},
		{"leave within the policy", PhaseLeave, rules, good, ""},
		{"no policy: old behaviour", PhaseJoin, nil, with(func(c *Context) { c.Vars["binarySource"] = "http://127.0.0.1:9/evil" }), ""},
		{"rogue binarySource", PhaseInstall, rules, with(func(c *Context) { c.Vars["binarySource"] = "http://127.0.0.1:9/evil" }),
			`param KPSSH_VAR_binarySource does not satisfy the signed param policy (value "https://mirror.example/k8s")`},
		{"binarySource emptied", PhaseInstall, rules, with(func(c *Context) { c.Vars["binarySource"] = "" }), "KPSSH_VAR_binarySource"},
		{"rogue endpoint", PhaseJoin, rules, with(func(c *Context) { c.ClusterEndpoint = "https://10.9.9.9:6443" }), "param KPSSH_CLUSTER_ENDPOINT does not satisfy"},
		{"rogue CA", PhaseJoin, rules, with(func(c *Context) { c.ClusterCAB64 = "cm9ndWU=" }), "param KPSSH_CLUSTER_CA_B64 does not satisfy the signed param policy (sha256 "},
		{"unknown var", PhaseJoin, rules, with(func(c *Context) { c.Vars["extra"] = "x" }), "param KPSSH_VAR_extra is not in the signed manifest's param policy"},
		{"secret off pattern", PhaseJoin, rules, with(func(c *Context) { c.Secrets = map[string]string{"code": "UPPER"} }), "param KPSSH_SECRET_CODE does not satisfy"},
		{"odd node name", PhaseJoin, rules, with(func(c *Context) { c.NodeName = "n1;x" }), "param KPSSH_NODE_NAME"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var policy map[string]envelope.ParamRule
			if c.policy != nil {
				policy = PhasePolicy(c.phase, c.policy)
			}
			sc := src(c.phase, policy)
			err := VerifyParams(c.phase, sc, c.ctx)
			if (c.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.want)) {
				t.Fatalf("VerifyParams: want %q, got %v", c.want, err)
			}
			// the render (what would ship) refuses the same
			_, hostPub := verifiedSigner(t)
			req := Request{Phase: c.phase, Conn: Connection{Address: "10.0.0.5", User: "kpssh", PrivateKey: testKeyPEM(t), HostKey: hostPub}, Source: sc, Context: c.ctx}
			for _, masked := range []bool{true, false} {
				_, rerr := Render(req, masked)
				if (err == nil) != (rerr == nil) {
					t.Fatalf("render (masked %v): %v, VerifyParams: %v", masked, rerr, err)
				}
				for _, e := range []error{err, rerr} {
					if e != nil && (strings.Contains(e.Error(), "s3cr3t") || strings.Contains(e.Error(), "evil") || strings.Contains(e.Error(), "UPPER")) {
						t.Fatalf("the error shows a value: %v", e)
					}
				}
			}
		})
	}
}

func TestPhasePolicy(t *testing.T) {
	rules := map[string]envelope.ParamRule{EnvClusterEndpoint: {Kind: envelope.RuleValue, Arg: "https://a"}, EnvVarPrefix + "x": {Kind: envelope.RuleValue, Arg: "1"}}
	join, install, leave := PhasePolicy(PhaseJoin, rules), PhasePolicy(PhaseInstall, rules), PhasePolicy(PhaseLeave, rules)
	empty := envelope.ParamRule{Kind: envelope.RuleValue}
	switch {
	case join[EnvClusterEndpoint] != rules[EnvClusterEndpoint] || join[EnvVarPrefix+"x"] != rules[EnvVarPrefix+"x"] || join[EnvBootstrapToken] != DefaultParamRules[EnvBootstrapToken]:
		t.Fatalf("join: %v", join)
	case install[EnvBootstrapToken] != empty || install[EnvClusterEndpoint] != rules[EnvClusterEndpoint]:
		t.Fatalf("install (no token): %v", install)
	case leave[EnvClusterEndpoint] != empty || leave[EnvNodeName] != empty || leave[EnvHostAddress] != DefaultParamRules[EnvHostAddress]:
		t.Fatalf("leave (addresses only): %v", leave)
	}
	if _, ok := leave[EnvVarPrefix+"x"]; ok {
		t.Fatal("leave gets no vars: their rules must go")
	}
	for ph, p := range map[Phase]map[string]envelope.ParamRule{PhaseJoin: join, PhaseInstall: install, PhaseLeave: leave} {
		if _, err := envelope.MarshalManifest(envelope.Manifest{Phase: string(ph), Profile: "p@1", ScriptSHA256: envelope.ScriptDigest(nil), IssuedAt: time.Unix(1, 0), NotAfter: time.Unix(2, 0), Params: p}); err != nil {
			t.Fatalf("%s: %v", ph, err)
		}
	}
}
