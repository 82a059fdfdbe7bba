// Package verified_test shows Verified execution end to end on a real host:
// a systemd-nspawn host provisioned by playbooks/provision-verified.yml (the
// shim, allowed_signers, the kpssh login, sudoers, sshd Match + ForceCommand),
// real sshd, the real ssh-keygen on both sides, the engine with the real
// ansible-playbook. The host test is skipped under -short.
package verified_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/engine"
	"github.com/dklesev/kpssh/internal/envelope"
	"github.com/dklesev/kpssh/internal/probe"
	"github.com/dklesev/kpssh/internal/providers/hostkey"
	"github.com/dklesev/kpssh/internal/providers/phase"
	"github.com/dklesev/kpssh/internal/sshsig"
	"github.com/dklesev/kpssh/test/hostenv"
)

const (
	profileName = "vtest"
	marker      = "/var/tmp/kpssh-verified-ran"
)

// key is an ed25519 key made by the real ssh-keygen.
type key struct {
	priv []byte
	pub  string
	path string
}

func keygen(t *testing.T, dir, name string) key {
	t.Helper()
	p := filepath.Join(dir, name)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", p).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v: %s", err, out)
	}
	priv, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := os.ReadFile(p + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	return key{priv: priv, pub: strings.TrimSpace(string(pub)), path: p}
}

// manifestField signs a v2 manifest for script: the profile's
// signatures.<phase> value.
func manifestField(t *testing.T, k key, phase, profile, script string, issued time.Time) string {
	t.Helper()
	return policyField(t, k, phase, profile, script, issued, nil)
}

// policyField is manifestField with a param policy in the manifest.
func policyField(t *testing.T, k key, phase, profile, script string, issued time.Time, policy map[string]envelope.ParamRule) string {
	t.Helper()
	m, err := envelope.MarshalManifest(envelope.Manifest{
		Phase: phase, Profile: profile, ScriptSHA256: envelope.ScriptDigest([]byte(script)),
		IssuedAt: issued, NotAfter: issued.Add(48 * time.Hour), Params: policy,
	})
	if err != nil {
		t.Fatal(err)
	}
	sig, err := sshsig.Sign(k.priv, m, sshsig.Namespace)
	if err != nil {
		t.Fatal(err)
	}
	return envelope.FormatSignedField(envelope.SignedField{Manifest: m, Signature: sig})
}

type fixture struct {
	t      *testing.T
	w      *hostenv.World
	e      *engine.Local
	login  key
	signer key
	rogue  key
}

// verifiedRunner is what the cloud provider runs for host h: an SSHHost
// (Verified, trusting the fixture's signer, its key in a Secret) and the
// phase runner over the real engine and the real host-key dial.
func (f *fixture) verifiedRunner(h hostenv.Host) (*v1beta1.SSHHost, *phase.Runner) {
	host := &v1beta1.SSHHost{ObjectMeta: metav1.ObjectMeta{Name: "h1", Namespace: "pool"}, Spec: v1beta1.SSHHostSpec{
		Address: h.Address, Port: int32(h.Port), User: "kpssh", SSHKeySecretRef: v1beta1.LocalObjectReference{Name: "key"},
		ExecMode: v1beta1.ExecModeVerified, TrustedSigners: []v1beta1.TrustedSigner{v1beta1.TrustedSigner(f.signer.pub)}},
		Status: v1beta1.SSHHostStatus{HostKeyFingerprint: h.Fingerprint}}
	c := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(&corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: "pool", Name: "key"}, Data: map[string][]byte{"privateKey": f.login.priv}}).Build()
	return host, phase.New(f.e, hostkey.New(c), nil)
}

func (f *fixture) conn() engine.Connection {
	h := f.w.Host(0)
	return engine.Connection{Address: h.Address, Port: int32(h.Port), User: "kpssh", PrivateKey: f.login.priv, HostKey: h.HostKey}
}

func (f *fixture) run(phase engine.Phase, script string, v engine.Verified, c engine.Context) engine.Result {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	r := f.e.Run(ctx, engine.Request{Phase: phase, Conn: f.conn(), Source: engine.Source{Script: script, Verified: &v}, Context: c, Timeout: 2 * time.Minute})
	f.t.Logf("%s: %s rc=%d in %v: %s", phase, r.Outcome, r.RC, r.Duration.Round(time.Millisecond), r.Message)
	return r
}

// sshAsKpssh sends stdin to the host as the kpssh login (ForceCommand: the
// shim runs whatever cmd says) and returns the exit status.
func (f *fixture) sshAsKpssh(cmd string, stdin []byte) (int, string) {
	f.t.Helper()
	h := f.w.Host(0)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := exec.CommandContext(ctx, "ssh", "-F", "/dev/null", "-i", f.login.path, "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
		"-o", "StrictHostKeyChecking=yes", "-o", "UserKnownHostsFile="+f.w.Inventory().KnownHosts, "-o", "GlobalKnownHostsFile=/dev/null",
		"-o", "LogLevel=ERROR", "-p", strconv.Itoa(h.Port), "kpssh@"+h.Address, cmd)
	c.Stdin = bytes.NewReader(stdin)
	var out bytes.Buffer
	c.Stdout, c.Stderr = &out, &out
	c.WaitDelay = 5 * time.Second
	err := c.Run()
	if ctx.Err() != nil {
		f.t.Fatalf("ssh as kpssh timed out: %s", out.String())
	}
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode(), out.String()
		}
		f.t.Fatalf("ssh: %v", err)
	}
	return 0, out.String()
}

func (f *fixture) markerGone(what string) {
	f.t.Helper()
	if out := f.w.MustRun(0, "test -e "+marker+" && echo present || echo absent"); out != "absent" {
		f.t.Errorf("%s: the script ran (marker %s exists)", what, marker)
		f.w.MustRun(0, "rm -f "+marker)
	}
}

// sessions counts the kpssh logins sshd accepted so far.
func (f *fixture) sessions() int {
	f.t.Helper()
	out := f.w.MustRun(0, `journalctl --no-pager -o cat _COMM=sshd | grep -c "Accepted publickey for kpssh " || true`)
	n, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		f.t.Fatalf("journal count %q: %v", out, err)
	}
	return n
}

// provision runs playbooks/provision-verified.yml against the world's host
// (as root) with the given keys and extra variables (YAML lines).
// syncSessions makes one real kpssh session (the shim's ping) and waits
// until the journal shows it: every earlier session is then counted too
// (journald keeps order), so two syncs bracket exactly what happened between
// them plus one ping.
func (f *fixture) syncSessions() int {
	f.t.Helper()
	n0 := f.sessions()
	if rc, out := f.sshAsKpssh("kpssh-shim ping", nil); rc != 0 {
		f.t.Fatalf("ping exited %d: %s", rc, out)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		if n := f.sessions(); n > n0 {
			// and settled: a late line of an earlier session would
			// otherwise be taken for the ping
			time.Sleep(time.Second)
			if m := f.sessions(); m == n {
				return n
			}
			continue
		}
		if time.Now().After(deadline) {
			f.t.Fatal("a real kpssh session did not show in the sshd journal: counting sessions proves nothing")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func provision(t *testing.T, w *hostenv.World, dir string, login, signer key, extra string) (string, error) {
	t.Helper()
	root, err := hostenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	invFile := filepath.Join(dir, "inventory.yml")
	// The kpssh.sh world logs in as root with its own key; that is the
	// provisioning login (the playbook then locks kpssh to the shim).
	if err := os.WriteFile(invFile, []byte(w.AnsibleInventory(0)), 0o600); err != nil {
		t.Fatal(err)
	}
	vars := filepath.Join(dir, "vars.yml")
	if err := os.WriteFile(vars, []byte(fmt.Sprintf("verified_host_allowed_signers:\n  - key: %q\n    valid_before: \"29991231\"\nverified_host_authorized_keys:\n  - %q\n", signer.pub, login.pub)+extra), 0o600); err != nil {
		t.Fatal(err)
	}
	playbook := func() (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		c := exec.CommandContext(ctx, "ansible-playbook", "-i", invFile, "-e", "@"+vars, filepath.Join(root, "playbooks/provision-verified.yml"))
		c.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + dir, "LANG=C.UTF-8",
			"ANSIBLE_ROLES_PATH=" + filepath.Join(root, "roles"), "ANSIBLE_HOST_KEY_CHECKING=True", "ANSIBLE_NOCOLOR=1",
			"ANSIBLE_LOCAL_TEMP=" + filepath.Join(dir, "tmp"), "ANSIBLE_RETRY_FILES_ENABLED=False"}
		c.WaitDelay = 5 * time.Second
		out, err := c.CombinedOutput()
		return string(out), err
	}
	start := time.Now()
	out, err := playbook()
	t.Logf("provision-verified.yml in %v (err %v)", time.Since(start).Round(time.Millisecond), err)
	return out, err
}

func TestVerifiedHost(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: needs systemd-nspawn test hosts, sshd and ansible-playbook")
	}
	w := hostenv.Up(t, 1)
	dir := t.TempDir()
	f := &fixture{t: t, w: w, login: keygen(t, dir, "login"), signer: keygen(t, dir, "signer"), rogue: keygen(t, dir, "rogue")}
	if out, err := provision(t, w, dir, f.login, f.signer, ""); err != nil {
		t.Fatalf("provision-verified.yml: %v\n%s", err, out)
	}
	// idempotent: a second run changes nothing
	if out, err := provision(t, w, dir, f.login, f.signer, ""); err != nil || !strings.Contains(out, "changed=0") {
		t.Fatalf("second provision run not idempotent: %v\n%s", err, out)
	}

	coll, err := engine.FindCollectionsPath()
	if err != nil {
		t.Fatal(err)
	}
	if f.e, err = engine.New(engine.Options{CollectionsPath: coll}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.e.Close() })

	profile := profileName + "@3"
	joinScript := "#!/bin/bash\nset -euo pipefail\n" +
		`printf 'uid=%s node=%s token=%s bashenv=%s\n' "$(id -u)" "$KPSSH_NODE_NAME" "${#KPSSH_BOOTSTRAP_TOKEN}" "${BASH_ENV-unset}" > ` + marker + "\n"
	ctx := engine.Context{NodeName: "node-v1", BootstrapToken: "abcdef.0123456789abcdef", HostAddress: w.Host(0).Address}
	now := time.Now().UTC().Truncate(time.Second)
	signed := func(issued time.Time, phase, script string) engine.Verified {
		return engine.Verified{Signature: manifestField(t, f.signer, phase, profile, script, issued), Profile: profile, TrustedSigners: []string{f.signer.pub}}
	}

	t.Run("probe op through ForceCommand", func(t *testing.T) {
		cmd, err := probe.Command(true, "")
		if err != nil {
			t.Fatal(err)
		}
		rc, out := f.sshAsKpssh(cmd, nil)
		if rc != 0 {
			t.Fatalf("probe op exited %d: %s", rc, out)
		}
		if _, err := probe.Parse(out); err != nil {
			t.Fatalf("probe output: %v\n%s", err, out)
		}
	})

	t.Run("signed join runs", func(t *testing.T) {
		r := f.run(engine.PhaseJoin, joinScript, signed(now.Add(-2*time.Hour), "join", joinScript), ctx)
		if r.Outcome != engine.Succeeded {
			t.Fatalf("signed join: %s: %s", r.Outcome, r.Message)
		}
		got := f.w.MustRun(0, "cat "+marker+" && rm -f "+marker)
		// root through the shim's sudo re-exec, the params as environment,
		// the shim's unset list applied
		if want := "uid=0 node=node-v1 token=23 bashenv=unset"; got != want {
			t.Fatalf("join wrote %q, want %q", got, want)
		}
	})

	t.Run("without ForceCommand: root login runs the shim by name", func(t *testing.T) {
		rootKey, err := os.ReadFile(w.Inventory().ClientKey)
		if err != nil {
			t.Fatal(err)
		}
		h := w.Host(0)
		v := signed(now.Add(-2*time.Hour), "join", joinScript)
		req := engine.Request{Phase: engine.PhaseJoin, Conn: engine.Connection{Address: h.Address, Port: int32(h.Port), User: "root", PrivateKey: rootKey, HostKey: h.HostKey},
			Source: engine.Source{Script: joinScript, Verified: &v}, Context: ctx, Timeout: 2 * time.Minute}
		cctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if r := f.e.Run(cctx, req); r.Outcome != engine.Succeeded {
			t.Fatalf("root + kpssh-shim run: %s: %s", r.Outcome, r.Message)
		}
		if got := f.w.MustRun(0, "cat "+marker+" && rm -f "+marker); !strings.HasPrefix(got, "uid=0 node=node-v1") {
			t.Fatalf("marker %q", got)
		}
	})

	t.Run("through the phase runner, from API objects", func(t *testing.T) {
		// What the cloud provider runs: an SSHHost (Verified, trustedSigners)
		// and a signed SSHJoinProfile become the verified source; the real
		// engine and the real host-key dial.
		h := w.Host(0)
		host, r := f.verifiedRunner(h)
		prof := &v1beta1.SSHJoinProfile{ObjectMeta: metav1.ObjectMeta{Name: profileName}, Spec: v1beta1.SSHJoinProfileSpec{Version: "3",
			Scripts:    &v1beta1.ProfileScripts{Install: "set -euo pipefail\n", Join: v1beta1.Script(joinScript), Leave: "set -euo pipefail\n"},
			Signatures: &v1beta1.ProfileSignatures{Join: v1beta1.Signature(signed(now.Add(-2*time.Hour), "join", joinScript).Signature)}}}
		cctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if out := r.Run(cctx, host, prof, engine.PhaseJoin, ctx, nil); !out.OK() {
			t.Fatalf("signed join through the runner: %s: %s", out.Outcome, out.Message)
		}
		f.w.MustRun(0, "test -e "+marker+" && rm -f "+marker)
		// leave is unsigned: a config error before any dial (the runner's
		// host-key fetch would be a session in the journal)
		before := f.syncSessions()
		out := r.Run(cctx, host, prof, engine.PhaseLeave, ctx, nil)
		if out.Outcome != engine.ConfigError || out.HostSide() || out.LastPhase.Result != v1beta1.PhaseRejected || !strings.Contains(out.Message, "signatures.leave") {
			t.Fatalf("unsigned leave: %s hostSide %v: %s", out.Outcome, out.HostSide(), out.Message)
		}
		if after := f.syncSessions(); after != before+1 {
			t.Fatalf("the unsigned leave opened %d sessions", after-before-1)
		}
	})

	t.Run("rogue signer trusted by the CR but not the host", func(t *testing.T) {
		v := engine.Verified{Signature: manifestField(t, f.rogue, "join", profile, joinScript, now), Profile: profile, TrustedSigners: []string{f.rogue.pub}}
		r := f.run(engine.PhaseJoin, joinScript, v, ctx)
		if r.Outcome != engine.Rejected || r.RC != engine.ShimBadSignature || !r.Touched {
			t.Fatalf("want Rejected rc 2 (touched), got %s rc %d touched %v: %s", r.Outcome, r.RC, r.Touched, r.Message)
		}
		f.markerGone("rogue signer")
	})

	t.Run("unsigned script: the controller refuses before connecting", func(t *testing.T) {
		before := f.syncSessions()
		for name, v := range map[string]engine.Verified{
			"no signature":       {Profile: profile, TrustedSigners: []string{f.signer.pub}},
			"untrusted signer":   signed(now, "join", joinScript),
			"broken trust root":  {Signature: signed(now, "join", joinScript).Signature, Profile: profile, TrustedSigners: []string{f.signer.pub, "ssh-ed25519 AAAAgarbage"}},
			"tampered script":    signed(now, "join", joinScript+"# tampered\n"),
			"join sent as leave": signed(now, "join", joinScript),
		} {
			phase := engine.PhaseJoin
			switch name {
			case "untrusted signer":
				v.TrustedSigners = []string{f.rogue.pub}
			case "join sent as leave":
				phase = engine.PhaseLeave
			}
			r := f.run(phase, joinScript, v, ctx)
			if r.Outcome != engine.ConfigError || r.Touched {
				t.Errorf("%s: want ConfigError untouched, got %s touched %v: %s", name, r.Outcome, r.Touched, r.Message)
			}
		}
		if after := f.syncSessions(); after != before+1 {
			t.Fatalf("sshd accepted %d kpssh sessions besides the ping while the controller should have refused", after-before-1)
		}
	})

	// Envelopes that only an attacker (or a broken controller) would send,
	// straight to the ForceCommand login: the host refuses on its own.
	valid := func(t *testing.T, phase, script string, issued time.Time, params map[string]string) []byte {
		sf, err := envelope.ParseSignedField(signed(issued, phase, script).Signature)
		if err != nil {
			t.Fatal(err)
		}
		e, err := envelope.Marshal(envelope.Envelope{Version: 2, Phase: phase, Profile: profile, Params: params, Manifest: sf.Manifest, Signature: sf.Signature, Script: []byte(script)})
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	replaceLine := func(env []byte, key, value string) []byte {
		lines := strings.Split(string(env), "\n")
		for i, l := range lines {
			if strings.HasPrefix(l, key+": ") {
				lines[i] = key + ": " + value
			}
		}
		return []byte(strings.Join(lines, "\n"))
	}
	b64 := base64.StdEncoding.EncodeToString
	markScript := "#!/bin/bash\nset -euo pipefail\ntouch " + marker + "\n"

	t.Run("host refuses", func(t *testing.T) {
		good := valid(t, "join", markScript, now.Add(-time.Hour), map[string]string{"KPSSH_NODE_NAME": "n"})
		bashEnv := "/var/tmp/kpssh-bashenv"
		f.w.MustRun(0, "printf 'touch "+marker+"\\n' > "+bashEnv)
		otherManifest := valid(t, "join", joinScript, now.Add(-time.Hour), nil)
		cases := []struct {
			name string
			cmd  string
			in   []byte
			want int
		}{
			{"tampered script", "kpssh-shim run", replaceLine(good, "script-b64", b64([]byte(markScript+"id\n"))), 2},
			{"manifest of another script", "kpssh-shim run", replaceLine(otherManifest, "script-b64", b64([]byte(markScript))), 2},
			{"join manifest sent as leave", "kpssh-shim run", replaceLine(good, "phase", "leave"), 2},
			{"other profile version", "kpssh-shim run", replaceLine(good, "profile", profileName+"@2"), 2},
			{"v1 not enabled", "kpssh-shim run", []byte("kpssh-envelope: 1\nphase: join\nparams-b64: \nsig-b64: " + b64(mustSign(t, f.signer, markScript)) + "\nscript-b64: " + b64([]byte(markScript)) + "\n"), 2},
			{"param BASH_ENV", "kpssh-shim run", replaceLine(good, "params-b64", b64([]byte("BASH_ENV="+bashEnv+"\n"))), 3},
			{"param LD_PRELOAD", "kpssh-shim run", replaceLine(good, "params-b64", b64([]byte("LD_PRELOAD=/tmp/x.so\n"))), 3},
			{"param PATH", "kpssh-shim run", replaceLine(good, "params-b64", b64([]byte("PATH=/tmp\n"))), 3},
			{"param IFS", "kpssh-shim run", replaceLine(good, "params-b64", b64([]byte("IFS=/\n"))), 3},
			{"param unprefixed", "kpssh-shim run", replaceLine(good, "params-b64", b64([]byte("NODE_NAME=x\n"))), 3},
			{"param KPSSH_ dash", "kpssh-shim run", replaceLine(good, "params-b64", b64([]byte("KPSSH_A-B=x\n"))), 3},
			{"raw script", "bash -s", []byte(markScript), 4},
			{"raw script, shim command", "kpssh-shim run", []byte(markScript), 4},
			{"truncated envelope", "kpssh-shim run", good[:len(good)/2], 4},
			{"unknown phase", "kpssh-shim run", replaceLine(good, "phase", "bogus"), 5},
		}
		for _, c := range cases {
			rc, out := f.sshAsKpssh(c.cmd, c.in)
			if rc != c.want {
				t.Errorf("%s: shim exited %d, want %d: %s", c.name, rc, c.want, out)
			}
			f.markerGone(c.name)
		}
		// and the intact envelope does run (the cases above can pass only
		// because of what they changed)
		if rc, out := f.sshAsKpssh("kpssh-shim run", good); rc != 0 {
			t.Fatalf("intact envelope: exit %d: %s", rc, out)
		}
		f.w.MustRun(0, "test -e "+marker+" && rm -f "+marker)
	})

	t.Run("param policy: rogue binarySource, endpoint, CA, unknown names", func(t *testing.T) {
		parent := f.t
		f.t = t // the fixture's helpers fail this subtest
		defer func() { f.t = parent }()
		f.paramPolicy(now)
	})

	t.Run("the shipped install's pinned checksums refuse another binary", func(t *testing.T) {
		parent := f.t
		f.t = t
		defer func() { f.t = parent }()
		f.pinnedFetch(now)
	})

	t.Run("replayed older manifest", func(t *testing.T) {
		old := signed(now.Add(-30*time.Minute), "join", joinScript)
		newer := signed(now.Add(-10*time.Minute), "join", joinScript)
		if r := f.run(engine.PhaseJoin, joinScript, newer, ctx); r.Outcome != engine.Succeeded {
			t.Fatalf("newer manifest: %s: %s", r.Outcome, r.Message)
		}
		f.w.MustRun(0, "rm -f "+marker)
		r := f.run(engine.PhaseJoin, joinScript, old, ctx)
		if r.Outcome != engine.Rejected || r.RC != 2 {
			t.Fatalf("replay of the older manifest: want Rejected rc 2, got %s rc %d: %s", r.Outcome, r.RC, r.Message)
		}
		f.markerGone("replayed manifest")
		// re-running the current manifest (phases are re-run) still works
		if r := f.run(engine.PhaseJoin, joinScript, newer, ctx); r.Outcome != engine.Succeeded {
			t.Fatalf("re-run of the current manifest: %s: %s", r.Outcome, r.Message)
		}
		f.w.MustRun(0, "rm -f "+marker)
	})

	// The replay record moves only when a script succeeded: a newer
	// manifest — the next version staged, and failing — does not lock the
	// current one out; a newer one that succeeded still does (rollback).
	t.Run("a newer manifest that failed blocks nothing", func(t *testing.T) {
		next := profileName + "@4"
		failing := "#!/bin/bash\nset -euo pipefail\necho next-version-broken >&2\nexit 1\n"
		current := signed(now.Add(-2*time.Minute), "join", joinScript)
		staged := engine.Verified{Signature: manifestField(t, f.signer, "join", next, failing, now.Add(-time.Minute)), Profile: next, TrustedSigners: []string{f.signer.pub}}
		if r := f.run(engine.PhaseJoin, joinScript, current, ctx); r.Outcome != engine.Succeeded {
			t.Fatalf("current manifest: %s: %s", r.Outcome, r.Message)
		}
		f.w.MustRun(0, "rm -f "+marker)
		if r := f.run(engine.PhaseJoin, failing, staged, ctx); r.Outcome != engine.Failed || r.RC != engine.ShimScriptFailed {
			t.Fatalf("newer, failing manifest of %s: want Failed rc 10, got %s rc %d: %s", next, r.Outcome, r.RC, r.Message)
		}
		if r := f.run(engine.PhaseJoin, joinScript, current, ctx); r.Outcome != engine.Succeeded {
			t.Fatalf("current manifest after a newer one failed: want Succeeded, got %s rc %d: %s", r.Outcome, r.RC, r.Message)
		}
		f.w.MustRun(0, "rm -f "+marker)
		if got := f.w.MustRun(0, "cat /var/lib/kpssh-shim/"+profileName+".join"); got != now.Add(-2*time.Minute).UTC().Format(envelope.TimeLayout)+" "+profile {
			t.Fatalf("replay record %q, want the current manifest's issued-at and %s", got, profile)
		}
		// the next version, fixed and succeeding, moves the record: the
		// current one is then a rollback
		fixed := engine.Verified{Signature: manifestField(t, f.signer, "join", next, joinScript, now.Add(-30*time.Second)), Profile: next, TrustedSigners: []string{f.signer.pub}}
		if r := f.run(engine.PhaseJoin, joinScript, fixed, ctx); r.Outcome != engine.Succeeded {
			t.Fatalf("next version: %s: %s", r.Outcome, r.Message)
		}
		f.w.MustRun(0, "rm -f "+marker)
		if r := f.run(engine.PhaseJoin, joinScript, current, ctx); r.Outcome != engine.Rejected || r.RC != engine.ShimBadSignature {
			t.Fatalf("rollback to %s after %s succeeded: want Rejected rc 2, got %s rc %d: %s", profile, next, r.Outcome, r.RC, r.Message)
		}
		f.markerGone("rollback after the next version")
	})

	t.Run("failing signed script is Failed (10)", func(t *testing.T) {
		bad := "#!/bin/bash\nset -euo pipefail\necho boom >&2\nfalse\ntouch " + marker + "\n"
		r := f.run(engine.PhaseJoin, bad, signed(now, "join", bad), ctx)
		if r.Outcome != engine.Failed || r.RC != engine.ShimScriptFailed || !strings.Contains(r.Message, "boom") {
			t.Fatalf("want Failed rc 10 with the stderr tail, got %s rc %d: %s", r.Outcome, r.RC, r.Message)
		}
		f.markerGone("failing script")
	})

	t.Run("v1 only when configured", func(t *testing.T) {
		v1 := engine.Verified{Signature: string(mustSign(t, f.signer, joinScript)), TrustedSigners: []string{f.signer.pub}}
		if r := f.run(engine.PhaseJoin, joinScript, v1, ctx); r.Outcome != engine.Rejected || r.RC != 2 {
			t.Fatalf("v1 before allow-v1: want Rejected rc 2, got %s rc %d", r.Outcome, r.RC)
		}
		f.markerGone("v1 refused")
		if out, err := provision(t, w, dir, f.login, f.signer, "verified_host_allow_v1: true\n"); err != nil {
			t.Fatalf("provision with allow_v1: %v\n%s", err, out)
		}
		if r := f.run(engine.PhaseJoin, joinScript, v1, ctx); r.Outcome != engine.Succeeded {
			t.Fatalf("v1 with allow-v1: %s: %s", r.Outcome, r.Message)
		}
		f.w.MustRun(0, "rm -f "+marker)
	})

	t.Run("a broken sshd configuration is rolled back", func(t *testing.T) {
		const dropin = "/etc/ssh/sshd_config.d/60-kpssh-verified.conf"
		before := f.w.MustRun(0, "cat "+dropin)
		out, err := provision(t, w, dir, f.login, f.signer, "verified_host_allow_v1: true\nverified_host_sshd_extra_options: [\"NoSuchSshdOption yes\"]\n")
		if err == nil || !strings.Contains(out, "previous configuration is back") {
			t.Fatalf("provisioning with a broken sshd option did not fail as it should: %v\n%s", err, out)
		}
		if after := f.w.MustRun(0, "cat "+dropin); after != before {
			t.Fatalf("drop-in not restored:\n%s\nwas:\n%s", after, before)
		}
		if st := f.w.MustRun(0, "systemctl is-active ssh; /usr/sbin/sshd -t && echo valid"); st != "active\nvalid" {
			t.Fatalf("sshd after rollback: %q", st)
		}
		if rc, out := f.sshAsKpssh("kpssh-shim ping", nil); rc != 0 {
			t.Fatalf("kpssh login after rollback: exit %d: %s", rc, out)
		}
	})

	t.Run("the phase timeout bounds the script on the host", func(t *testing.T) {
		hang := "#!/bin/bash\nset -euo pipefail\nsleep 3001\n"
		v := signed(now, "join", hang)
		cctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		r := f.e.Run(cctx, engine.Request{Phase: engine.PhaseJoin, Conn: f.conn(), Source: engine.Source{Script: hang, Verified: &v}, Context: ctx, Timeout: 5 * time.Second})
		// the engine's timer starts before ansible-playbook, the shim's
		// after it: normally TimedOut; the shim's bound firing first is a
		// failed script (10). Either way the phase did not pass, and the
		// script must not outlive the bound on the host.
		if r.Outcome != engine.TimedOut && !(r.Outcome == engine.Failed && r.RC == engine.ShimScriptFailed) {
			t.Fatalf("hanging script: %s rc %d: %s", r.Outcome, r.RC, r.Message)
		}
		deadline := time.Now().Add(60 * time.Second)
		for {
			n := f.w.MustRun(0, "pgrep -fc 'sleep 300[1]' || true")
			if n == "0" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the script still runs on the host 60 s after a 5 s phase timeout (%s processes)", n)
			}
			time.Sleep(500 * time.Millisecond)
		}
	})

	t.Run("no temp files left", func(t *testing.T) {
		if out := f.w.MustRun(0, "ls -d /run/kpssh-shim.* /tmp/kpssh-shim.* 2>/dev/null | wc -l"); out != "0" {
			t.Fatalf("shim temp dirs left: %s", out)
		}
	})

	// verify is signed like the other phases: unsigned, it is refused before
	// any connection (the launch fails; Karpenter never registers the
	// claim); signed, the shim runs it with install's params (no token), and
	// a failing one is a failed phase (rc 10).
	t.Run("signed verify through the phase runner", func(t *testing.T) {
		h := w.Host(0)
		host, r := f.verifiedRunner(h)
		verify := "#!/bin/bash\nset -euo pipefail\n" +
			`test -e /etc/kpssh-expected || { echo "expected /etc/kpssh-expected" >&2; exit 1; }` + "\n" +
			`printf 'uid=%s node=%s token=%s\n' "$(id -u)" "$KPSSH_NODE_NAME" "${#KPSSH_BOOTSTRAP_TOKEN}" > ` + marker + "\n"
		prof := &v1beta1.SSHJoinProfile{ObjectMeta: metav1.ObjectMeta{Name: profileName}, Spec: v1beta1.SSHJoinProfileSpec{Version: "3",
			Scripts: &v1beta1.ProfileScripts{Install: "set -euo pipefail\n", Join: v1beta1.Script(joinScript), Leave: "set -euo pipefail\n", Verify: v1beta1.Script(verify)}}}
		cctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		out := r.Run(cctx, host, prof, engine.PhaseVerify, ctx, nil)
		if out.Outcome != engine.ConfigError || out.HostSide() || !strings.Contains(out.Message, "signatures.verify") {
			t.Fatalf("unsigned verify on a Verified host: %s: %s", out.Outcome, out.Message)
		}
		prof.Spec.Signatures = &v1beta1.ProfileSignatures{Verify: v1beta1.Signature(signed(now.Add(-2*time.Hour), "verify", verify).Signature)}
		if out := r.Run(cctx, host, prof, engine.PhaseVerify, ctx, nil); out.Outcome != engine.Failed || out.RC != engine.ShimScriptFailed ||
			!strings.Contains(out.Message, "expected /etc/kpssh-expected") || out.LastPhase.Result != v1beta1.PhaseFailed {
			t.Fatalf("signed verify, expectation unmet: %s rc %d: %s", out.Outcome, out.RC, out.Message)
		}
		f.markerGone("failed verify")
		f.w.MustRun(0, "touch /etc/kpssh-expected")
		if out := r.Run(cctx, host, prof, engine.PhaseVerify, ctx, nil); !out.OK() {
			t.Fatalf("signed verify: %s: %s", out.Outcome, out.Message)
		}
		if got := f.w.MustRun(0, "cat "+marker+" && rm -f "+marker+" /etc/kpssh-expected"); got != "uid=0 node=node-v1 token=0" {
			t.Fatalf("verify wrote %q, want root, the node name and no token", got)
		}
	})

	t.Run("leave with no signed leave to send: the host's own fallback", func(t *testing.T) {
		parent := f.t
		f.t = t
		defer func() { f.t = parent }()
		f.leaveWithoutSignedLeave()
	})

	t.Run("the shim's fallback-leave op runs only the provisioned file", func(t *testing.T) {
		parent := f.t
		f.t = t
		defer func() { f.t = parent }()
		f.fallbackLeaveOp()
	})

	// Last: it reboots the host. A profile without scripts.reboot whose
	// signatures.reboot signs kpssh's default reboot: the shim runs the
	// default as signed, and the host comes back with a new boot id. Without
	// the signature: refused before any connection, naming it.
	t.Run("signed default reboot", func(t *testing.T) {
		h := w.Host(0)
		host, r := f.verifiedRunner(h)
		prof := &v1beta1.SSHJoinProfile{ObjectMeta: metav1.ObjectMeta{Name: profileName}, Spec: v1beta1.SSHJoinProfileSpec{Version: "3",
			Scripts: &v1beta1.ProfileScripts{Install: "set -euo pipefail\n", Join: v1beta1.Script(joinScript), Leave: "set -euo pipefail\n"}}}
		rctx := engine.Context{HostAddress: h.Address, NodeAddress: h.Address}
		cctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		out := r.Run(cctx, host, prof, engine.PhaseReboot, rctx, nil)
		if out.Outcome != engine.ConfigError || !strings.Contains(out.Message, "signatures.reboot") {
			t.Fatalf("unsigned reboot on a Verified host: %s: %s", out.Outcome, out.Message)
		}
		bootID := func() string {
			o, _, err := f.w.Run(0, "cat /proc/sys/kernel/random/boot_id")
			if err != nil {
				return ""
			}
			return strings.TrimSpace(o)
		}
		before := bootID()
		prof.Spec.Signatures = &v1beta1.ProfileSignatures{Reboot: v1beta1.Signature(signed(now.Add(-2*time.Hour), "reboot", engine.DefaultRebootScript).Signature)}
		if out := r.Run(cctx, host, prof, engine.PhaseReboot, rctx, nil); !out.OK() {
			t.Fatalf("signed default reboot: %s: %s", out.Outcome, out.Message)
		}
		deadline := time.Now().Add(2 * time.Minute)
		for after := bootID(); after == "" || after == before; after = bootID() {
			if time.Now().After(deadline) {
				t.Fatalf("the host did not reboot (boot id %q)", before)
			}
			time.Sleep(500 * time.Millisecond)
		}
		// The shim's probe op reports the new boot id.
		cmd, _ := probe.Command(true, "")
		rc, pout := f.sshAsKpssh(cmd, nil)
		facts, err := probe.Parse(pout)
		if rc != 0 || err != nil || facts.BootID == "" || facts.BootID == before {
			t.Fatalf("probe op after the reboot: rc %d, %v, boot id %q (before %q)", rc, err, facts.BootID, before)
		}
	})
}

func mustSign(t *testing.T, k key, script string) []byte {
	t.Helper()
	s, err := sshsig.Sign(k.priv, []byte(script), sshsig.Namespace)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
