package phase

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/engine"
	"github.com/dklesev/kpssh/internal/sshsig"
)

// TestVerifiedHostGetsVerifiedSource: a Verified host runs the signed script
// through the shim source; every signature problem is a config error found
// before anything connects (the host-key fetch dials; it must not be called).
func TestVerifiedHostGetsVerifiedSource(t *testing.T) {
	_, k, _ := ed25519.GenerateKey(rand.Reader)
	s, _ := ssh.NewSignerFromKey(k)
	pub := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(s.PublicKey())))
	_, k2, _ := ed25519.GenerateKey(rand.Reader)
	s2, _ := ssh.NewSignerFromKey(k2)
	rogue := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(s2.PublicKey())))
	join := "#!/bin/bash\nset -euo pipefail\necho join\n"
	sig, err := sshsig.SignWith(s, []byte(join), sshsig.Namespace)
	if err != nil {
		t.Fatal(err)
	}
	prof := func(sig string) *v1beta1.SSHJoinProfile {
		p := testProfile()
		p.Spec.Scripts.Join = v1beta1.Script(join)
		p.Spec.Signatures = &v1beta1.ProfileSignatures{Join: v1beta1.Signature(sig)}
		return p
	}
	for _, tc := range []struct {
		name    string
		p       *v1beta1.SSHJoinProfile
		trusted []string
		want    engine.Outcome
		msg     string
	}{
		{"signed", prof(string(sig)), []string{pub}, engine.Succeeded, ""},
		{"unsigned", prof(""), []string{pub}, engine.ConfigError, "no signatures.join"},
		{"rogue signer", prof(string(sig)), []string{rogue}, engine.ConfigError, "not a trusted signer"},
		{"broken trust root", prof(string(sig)), []string{pub, "ssh-ed25519 garbage"}, engine.ConfigError, "trusted signer 2"},
		{"ansible profile", &v1beta1.SSHJoinProfile{Spec: v1beta1.SSHJoinProfileSpec{Ansible: &v1beta1.AnsibleSource{Role: "r"}}}, []string{pub}, engine.ConfigError, "signed scripts only"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := &fakeEngine{res: engine.Result{Outcome: engine.Succeeded}}
			r, _ := runner(t, e, nil)
			dialed := false
			fetch := r.HostKey
			r.HostKey = func(ctx context.Context, c engine.Connection, fp string) (string, error) {
				dialed = true
				return fetch(ctx, c, fp)
			}
			h := host("SHA256:x")
			h.Spec.ExecMode = v1beta1.ExecModeVerified
			for _, l := range tc.trusted {
				h.Spec.TrustedSigners = append(h.Spec.TrustedSigners, v1beta1.TrustedSigner(l))
			}
			if tc.p.Name == "" {
				tc.p.Name = "p"
			}
			out := r.Run(context.Background(), h, tc.p, engine.PhaseJoin, engine.Context{}, nil)
			if out.Outcome != tc.want || !strings.Contains(out.Message, tc.msg) {
				t.Fatalf("outcome %s %q, want %s %q", out.Outcome, out.Message, tc.want, tc.msg)
			}
			if tc.want == engine.ConfigError {
				if dialed || e.n != 0 {
					t.Fatalf("a config error connected (dialed %v, engine runs %d)", dialed, e.n)
				}
				return
			}
			v := e.req.Source.Verified
			if v == nil || e.req.Source.Script != join || v.Profile != "p@1" || v.Signature != string(sig) || len(v.TrustedSigners) != 1 {
				t.Fatalf("engine got source %+v", e.req.Source)
			}
		})
	}
	if got := Record(engine.PhaseJoin, engine.Result{Outcome: engine.Rejected}, time.Now()); got.Result != v1beta1.PhaseRejected {
		t.Fatalf("Rejected recorded as %s", got.Result)
	}
	if !(Outcome{Result: engine.Result{Outcome: engine.Rejected}}).HostSide() {
		t.Fatal("a host's refusal is not host side")
	}
}

// TestRunFallbackLeave: a host with no profile leave to run gets
// engine.FallbackLeaveScript on Raw, and on Verified the host's provisioned
// leave through the shim — no script, no signature, only the host's shim
// command — with the default leave timeout and a run key like any phase.
func TestRunFallbackLeave(t *testing.T) {
	for _, verified := range []bool{false, true} {
		e := &fakeEngine{res: engine.Result{Outcome: engine.Succeeded}}
		r, _ := runner(t, e, nil)
		h := host("SHA256:x")
		if verified {
			h.Spec.ExecMode, h.Spec.ShimCommand = v1beta1.ExecModeVerified, "sudo -n /opt/kpssh-shim"
		}
		out := r.RunFallbackLeave(context.Background(), h, engine.Context{HostAddress: "10.0.0.1"})
		if !out.OK() || e.n != 1 || out.LastPhase.Phase != v1beta1.PhaseLeave {
			t.Fatalf("verified %v: %s, engine runs %d, last phase %+v", verified, out.Outcome, e.n, out.LastPhase)
		}
		src := e.req.Source
		switch {
		case e.req.Phase != engine.PhaseLeave || e.req.Timeout != 3*time.Minute || e.req.Context.HostAddress != "10.0.0.1":
			t.Fatalf("verified %v: request %+v", verified, e.req)
		case !verified && (src.Verified != nil || src.Script != engine.FallbackLeaveScript):
			t.Fatalf("Raw host: source %+v, want the fallback script", src)
		case verified && (src.Verified == nil || !src.Verified.ProvisionedLeave || src.Script != "" || src.Verified.Signature != "" ||
			src.Verified.ShimCommand != "sudo -n /opt/kpssh-shim"):
			t.Fatalf("Verified host: source %+v %+v, want the provisioned leave", src, src.Verified)
		}
	}
}
