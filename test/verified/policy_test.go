package verified_test

import (
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/engine"
	"github.com/dklesev/kpssh/internal/envelope"
	"github.com/dklesev/kpssh/test/hostenv"
)

const toolRan = "/var/tmp/kpssh-tool-ran"

// installScript has the shape of the example install before the fix: it
// downloads a binary from $KPSSH_VAR_binarySource, checks it against the
// .sha256 next to it (same server) and runs it as root.
const installScript = `#!/bin/bash
set -euo pipefail
src=${KPSSH_VAR_binarySource%/}
get() { python3 -c 'import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])' "$1" "$2"; }
get "$src/amd64/tool" /var/tmp/kpssh-tool
get "$src/amd64/tool.sha256" /var/tmp/kpssh-tool.sha256
read -r sum _ </var/tmp/kpssh-tool.sha256
echo "$sum  /var/tmp/kpssh-tool" | sha256sum -c --status -
chmod 755 /var/tmp/kpssh-tool
/var/tmp/kpssh-tool
rm -f /var/tmp/kpssh-tool /var/tmp/kpssh-tool.sha256
`

// joinEcho records the endpoint and CA the join was given.
const joinEcho = "#!/bin/bash\nset -euo pipefail\nprintf '%s %s\\n' \"$KPSSH_CLUSTER_ENDPOINT\" \"$KPSSH_CLUSTER_CA_B64\" > " + toolRan + "\n"

// mirror serves good/ (the operator's mirror) and evil/ (an attacker's
// server: another binary with a matching .sha256) on the world's bridge,
// the only address the host can reach.
func (f *fixture) mirror() string {
	f.t.Helper()
	dir := f.t.TempDir()
	for _, side := range []string{"good", "evil"} {
		tool := []byte("#!/bin/sh\necho " + side + " > " + toolRan + "\n")
		if err := os.MkdirAll(filepath.Join(dir, side, "amd64"), 0o755); err != nil {
			f.t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, side, "amd64", "tool"), tool, 0o644); err != nil {
			f.t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, side, "amd64", "tool.sha256"), []byte(envelope.ScriptDigest(tool)+"  tool\n"), 0o644); err != nil {
			f.t.Fatal(err)
		}
	}
	ln, err := net.Listen("tcp", f.w.Inventory().BridgeAddress+":0")
	if err != nil {
		f.t.Fatal(err)
	}
	srv := &http.Server{Handler: http.FileServer(http.Dir(dir)), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			f.t.Errorf("mirror: %v", err)
		}
	}()
	f.t.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String()
}

// toolResult reads and removes what the tool (or joinEcho) wrote ("" if
// nothing ran).
func (f *fixture) toolResult() string {
	f.t.Helper()
	return f.w.MustRun(0, "cat "+toolRan+" 2>/dev/null; rm -f "+toolRan)
}

// paramPolicy: the attack is a node class (or a controller key holder)
// choosing params the signer never saw. With a policy in the signed
// manifest, the controller refuses before connecting and the host's shim
// refuses on its own (exit 3, naming the param and its rule).
func (f *fixture) paramPolicy(now time.Time) {
	t := f.t
	base := f.mirror()
	good, evil := base+"/good", base+"/evil"
	ca := "Y2EtYnVuZGxl"
	rules := map[string]envelope.ParamRule{
		engine.EnvVarPrefix + "binarySource": {Kind: envelope.RuleValue, Arg: good},
		engine.EnvClusterEndpoint:            {Kind: envelope.RuleValue, Arg: "https://10.0.0.1:6443"},
		engine.EnvClusterCAB64:               {Kind: envelope.RuleSHA256, Arg: envelope.ScriptDigest([]byte(ca))},
	}
	const prof = "ptest@1"
	issued := now.Add(-time.Hour)
	sign := func(phase engine.Phase, script string, policy map[string]envelope.ParamRule) engine.Verified {
		return engine.Verified{Signature: policyField(t, f.signer, string(phase), prof, script, issued, policy), Profile: prof, TrustedSigners: []string{f.signer.pub}}
	}
	envelopeFor := func(phase engine.Phase, script string, policy map[string]envelope.ParamRule, params map[string]string) []byte {
		sf, err := envelope.ParseSignedField(sign(phase, script, policy).Signature)
		if err != nil {
			t.Fatal(err)
		}
		e, err := envelope.Marshal(envelope.Envelope{Version: 2, Phase: string(phase), Profile: prof, Params: params, Manifest: sf.Manifest, Signature: sf.Signature, Script: []byte(script)})
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	install := engine.PhasePolicy(engine.PhaseInstall, rules)
	join := engine.PhasePolicy(engine.PhaseJoin, rules)

	// straight to the shim: what a controller key holder could send
	cases := []struct {
		name   string
		phase  engine.Phase
		script string
		policy map[string]envelope.ParamRule
		params map[string]string
		rc     int
		ran    string   // what the tool wrote
		msg    []string // in the shim's refusal
	}{
		{"within the policy", engine.PhaseInstall, installScript, install, map[string]string{"KPSSH_VAR_binarySource": good}, 0, "good", nil},
		{"rogue binarySource", engine.PhaseInstall, installScript, install, map[string]string{"KPSSH_VAR_binarySource": evil}, 3, "",
			[]string{"KPSSH_VAR_binarySource does not satisfy the signed param policy (value " + good}},
		{"binarySource emptied", engine.PhaseInstall, installScript, install, map[string]string{"KPSSH_VAR_binarySource": ""}, 3, "", []string{"KPSSH_VAR_binarySource"}},
		{"unknown name", engine.PhaseInstall, installScript, install, map[string]string{"KPSSH_VAR_binarySource": good, "KPSSH_VAR_extra": "x"}, 3, "",
			[]string{"KPSSH_VAR_extra is not in the signed manifest's param policy"}},
		{"join within the policy", engine.PhaseJoin, joinEcho, join, map[string]string{"KPSSH_CLUSTER_ENDPOINT": "https://10.0.0.1:6443", "KPSSH_CLUSTER_CA_B64": ca}, 0, "https://10.0.0.1:6443 " + ca, nil},
		{"rogue endpoint", engine.PhaseJoin, joinEcho, join, map[string]string{"KPSSH_CLUSTER_ENDPOINT": "https://10.6.6.6:6443", "KPSSH_CLUSTER_CA_B64": ca}, 3, "",
			[]string{"KPSSH_CLUSTER_ENDPOINT does not satisfy the signed param policy (value https://10.0.0.1:6443)"}},
		{"rogue CA", engine.PhaseJoin, joinEcho, join, map[string]string{"KPSSH_CLUSTER_ENDPOINT": "https://10.0.0.1:6443", "KPSSH_CLUSTER_CA_B64": "cm9ndWUtY2E="}, 3, "",
			[]string{"KPSSH_CLUSTER_CA_B64 does not satisfy the signed param policy (sha256 " + rules[engine.EnvClusterCAB64].Arg[:12]}},
		{"off-pattern node name", engine.PhaseJoin, joinEcho, join, map[string]string{"KPSSH_CLUSTER_ENDPOINT": "https://10.0.0.1:6443", "KPSSH_CLUSTER_CA_B64": ca, "KPSSH_NODE_NAME": "n;id"}, 3, "",
			[]string{"KPSSH_NODE_NAME does not satisfy the signed param policy (re "}},
		// The hole as it was for every manifest, and stays for one without
		// a policy (the node class warns): the attacker's binary runs.
		{"no policy: the old hole", engine.PhaseInstall, installScript, nil, map[string]string{"KPSSH_VAR_binarySource": evil}, 0, "evil", nil},
	}
	for _, c := range cases {
		rc, out := f.sshAsKpssh("kpssh-shim run", envelopeFor(c.phase, c.script, c.policy, c.params))
		got := f.toolResult()
		if rc != c.rc || got != c.ran {
			t.Errorf("%s: shim exited %d (want %d), the tool wrote %q (want %q): %s", c.name, rc, c.rc, got, c.ran, out)
		}
		for _, m := range c.msg {
			if !strings.Contains(out, m) {
				t.Errorf("%s: the refusal does not say %q: %s", c.name, m, out)
			}
		}
		if strings.Contains(out, "10.6.6.6") || strings.Contains(out, "cm9ndWUtY2E") || strings.Contains(out, evil) {
			t.Errorf("%s: the refusal shows the rejected value: %s", c.name, out)
		}
	}

	// through the engine: the controller's Go check refuses before it
	// connects (no sshd session), and lets the signed params through
	ctx := engine.Context{ClusterEndpoint: "https://10.0.0.1:6443", ClusterCAB64: ca, NodeName: "node-p1", HostAddress: f.w.Host(0).Address,
		Vars: map[string]string{"binarySource": good}}
	if r := f.run(engine.PhaseInstall, installScript, sign(engine.PhaseInstall, installScript, install), ctx); r.Outcome != engine.Succeeded || f.toolResult() != "good" {
		t.Fatalf("install within the policy through the engine: %s: %s", r.Outcome, r.Message)
	}
	before := f.syncSessions()
	rogue := []struct {
		name  string
		phase engine.Phase
		mod   func(*engine.Context)
		want  string
	}{
		{"binarySource", engine.PhaseInstall, func(c *engine.Context) { c.Vars = map[string]string{"binarySource": evil} }, "param KPSSH_VAR_binarySource does not satisfy"},
		{"unknown var", engine.PhaseInstall, func(c *engine.Context) { c.Vars = map[string]string{"binarySource": good, "extra": "x"} }, "param KPSSH_VAR_extra is not in"},
		{"endpoint", engine.PhaseJoin, func(c *engine.Context) { c.ClusterEndpoint = "https://10.6.6.6:6443" }, "param KPSSH_CLUSTER_ENDPOINT does not satisfy the signed param policy (value"},
		{"CA", engine.PhaseJoin, func(c *engine.Context) { c.ClusterCAB64 = "cm9ndWUtY2E=" }, "param KPSSH_CLUSTER_CA_B64 does not satisfy the signed param policy (sha256"},
	}
	for _, c := range rogue {
		cc := ctx
		c.mod(&cc)
		script, policy := installScript, install
		if c.phase == engine.PhaseJoin {
			script, policy = joinEcho, join
		}
		r := f.run(c.phase, script, sign(c.phase, script, policy), cc)
		if r.Outcome != engine.ConfigError || r.Touched || !strings.Contains(r.Message, c.want) {
			t.Errorf("rogue %s through the engine: want ConfigError untouched saying %q, got %s touched %v: %s", c.name, c.want, r.Outcome, r.Touched, r.Message)
		}
	}
	if after := f.syncSessions(); after != before+1 {
		t.Fatalf("sshd accepted %d kpssh sessions besides the ping while the controller should have refused", after-before-1)
	}
	if got := f.toolResult(); got != "" {
		t.Fatalf("something ran: %q", got)
	}
}

// pinnedFetch runs the shipped tls-bootstrap install's own fetch (the exact
// bytes of examples/scripts, PINNED_SHA256 filled in as an operator does
// before signing) on the host: the pinned checksum, inside the signed
// bytes, refuses the attacker's binary even though the attacker's server
// serves a matching .sha256 and the manifest has no param policy.
func (f *fixture) pinnedFetch(now time.Time) {
	t := f.t
	root, err := hostenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(root, "examples/scripts/profile-tls-bootstrap.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	p := &v1beta1.SSHJoinProfile{}
	if err := yaml.UnmarshalStrict(data, p); err != nil {
		t.Fatal(err)
	}
	install := string(p.Spec.Scripts.Install)
	i := strings.Index(install, "# Checksums signed with this script")
	j := strings.Index(install[max(i, 0):], "\n}\n")
	if i < 0 || j < 0 {
		t.Fatal("the example install has no PINNED_SHA256 block and fetch function")
	}
	block := install[i : i+j+3]
	base := f.mirror()
	tool := []byte("#!/bin/sh\necho good > " + toolRan + "\n")
	pinned := strings.Replace(block, "PINNED_SHA256='\n'", "PINNED_SHA256='\namd64/tool "+envelope.ScriptDigest(tool)+"\n'", 1)
	if pinned == block {
		t.Fatal("the example's PINNED_SHA256 is not the empty block an operator fills in")
	}
	// the host has no curl: a stand-in for the download only (-o OUT URL)
	script := `#!/bin/bash
set -euo pipefail
ARCH=amd64
die() { echo "install: $*" >&2; exit 1; }
curl() {
  local out="" url=""
  while [[ $# -gt 0 ]]; do
    case $1 in
      -o) out=$2; shift 2 ;;
      --retry | --connect-timeout) shift 2 ;;
      -*) shift ;;
      *) url=$1; shift ;;
    esac
  done
  python3 -c 'import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])' "$url" "$out"
}
` + pinned + `fetch "${KPSSH_VAR_binarySource%/}/amd64/tool" /var/tmp/kpssh-tool
chmod 755 /var/tmp/kpssh-tool
/var/tmp/kpssh-tool
rm -f /var/tmp/kpssh-tool
`
	sf, err := envelope.ParseSignedField(policyField(t, f.signer, "install", "pinned@1", script, now.Add(-time.Hour), nil))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		source, ran, msg string
		rc               int
	}{
		{base + "/good", "good", "", 0},
		{base + "/evil", "", "checksum mismatch for " + base + "/evil/amd64/tool (amd64/tool)", engine.ShimScriptFailed},
	} {
		env, err := envelope.Marshal(envelope.Envelope{Version: 2, Phase: "install", Profile: "pinned@1", Params: map[string]string{"KPSSH_VAR_binarySource": c.source},
			Manifest: sf.Manifest, Signature: sf.Signature, Script: []byte(script)})
		if err != nil {
			t.Fatal(err)
		}
		rc, out := f.sshAsKpssh("kpssh-shim run", env)
		if got := f.toolResult(); rc != c.rc || got != c.ran || !strings.Contains(out, c.msg) {
			t.Errorf("binarySource %s: exit %d (want %d), tool wrote %q (want %q), want %q in: %s", c.source, rc, c.rc, got, c.ran, c.msg, out)
		}
	}
}
