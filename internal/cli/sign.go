package cli

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/crypto/ssh"
	"sigs.k8s.io/yaml"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/engine"
	"github.com/dklesev/kpssh/internal/envelope"
	"github.com/dklesev/kpssh/internal/profile"
	"github.com/dklesev/kpssh/internal/sshsig"
)

// SignUsage is the help text of `kpssh sign`.
const SignUsage = `usage: kpssh sign --key KEY [--manifest [--not-after 720h] [--param NAME=RULE]... [--param-policy FILE] [--ca-file CA.crt]] [--phases install,join,leave] PROFILE.yaml|-

Signs the profile's scripts offline (OpenSSH SSHSIG, namespace kpssh) and
prints the signatures: block to put under the profile's spec. With
--manifest each signature is a v2 manifest (phase, <profile>@<version>, the
script's SHA-256, issued-at now, not-after) plus its SSHSIG: Verified hosts
then refuse replayed, rolled-back or phase-swapped scripts. --param,
--param-policy and --ca-file write a param policy into each manifest: the
params (node-class vars, cluster endpoint and CA) a Verified host then
accepts. It needs no cluster.

KEY is an unencrypted private key file, or the key of the running ssh-agent
($SSH_AUTH_SOCK) named by its public key file (KEY.pub, as ssh-keygen -Y
sign -f KEY.pub) or by its fingerprint (SHA256:..., ssh-add -l): the private
key never leaves the agent.

Exit status: 0 signed, 2 anything else (unreadable key or profile, a key the
agent does not hold, bad flags).

flags:
`

// Sign is `kpssh sign` (args without the subcommand name).
func Sign(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return runSub(ctx, "sign", args, stdout, stderr)
}

func (d deps) signCommand() *cobra.Command {
	var o signOptions
	var params []string
	var policyFile, caFile string
	c := d.command("sign", "sign a profile's scripts (or v2 manifests) for Verified hosts; prints the signatures: block", SignUsage,
		func(_ *cobra.Command, pos []string) error {
			if len(pos) != 1 || o.keyFile == "" {
				return withUsage("want --key KEY and one PROFILE.yaml (or - for stdin), got %d argument(s)", len(pos))
			}
			o.profileFile, o.now, o.stdin, o.agentSock = pos[0], time.Now(), d.stdin, d.getenv("SSH_AUTH_SOCK")
			rules, err := policyRules(params, policyFile, caFile)
			if err != nil {
				return usageErr("%v", err)
			}
			o.policy = rules
			out, err := sign(o, d.stderr)
			if err != nil {
				return usageErr("%v", err)
			}
			if _, err := io.WriteString(d.stdout, out); err != nil {
				return runtimeErr("write output: %w", err)
			}
			return nil
		})
	fs := c.Flags()
	fs.StringVar(&o.keyFile, "key", "", "`KEY` to sign with: an unencrypted OpenSSH private key file (e.g. from ssh-keygen -t ed25519), or the ssh-agent's key by its public key file (KEY.pub) or fingerprint (SHA256:...)")
	fs.BoolVar(&o.manifest, "manifest", false, "sign v2 manifests (phase, profile@version, script SHA-256, not-after) instead of the bare scripts")
	fs.StringVar(&o.notAfter, "not-after", "720h", "with --manifest: validity, a duration from now (720h) or a time (2027-01-31T00:00:00Z)")
	fs.StringVar(&o.phases, "phases", strings.Join(phaseNames(), ","), "phases to sign (those the profile has; reboot: scripts.reboot or the default reboot)")
	fs.StringArrayVar(&params, "param", nil, "with --manifest: a param policy rule NAME=VALUE, NAME=sha256:HEX or NAME=re:PATTERN (repeatable)")
	fs.StringVar(&policyFile, "param-policy", "", "with --manifest: a `file` of NAME=RULE lines (as --param; # comments)")
	fs.StringVar(&caFile, "ca-file", "", "with --manifest: pin KPSSH_CLUSTER_CA_B64 to the digest of this CA bundle's base64 (the bytes the controller sends)")
	_ = c.RegisterFlagCompletionFunc("phases", cobra.FixedCompletions(phaseNames(), cobra.ShellCompDirectiveNoFileComp))
	return c
}

type signOptions struct {
	keyFile, profileFile string
	agentSock            string // $SSH_AUTH_SOCK
	manifest             bool
	notAfter, phases     string
	now                  time.Time
	stdin                io.Reader
	// policy: the operator's param rules (nil: the manifests carry none)
	policy map[string]envelope.ParamRule
}

func sign(o signOptions, warn io.Writer) (string, error) {
	if o.policy != nil && !o.manifest {
		return "", errors.New("a param policy needs --manifest (v1 signatures carry none)")
	}
	signer, done, err := o.signer()
	if err != nil {
		return "", err
	}
	defer done()
	var data []byte
	if o.profileFile == "-" {
		data, err = io.ReadAll(io.LimitReader(o.stdin, 8<<20))
	} else {
		data, err = os.ReadFile(o.profileFile)
	}
	if err != nil {
		return "", fmt.Errorf("read profile: %w", err)
	}
	p := &v1beta1.SSHJoinProfile{}
	if err := yaml.UnmarshalStrict(data, p); err != nil {
		return "", fmt.Errorf("profile %s is not an SSHJoinProfile: %w", o.profileFile, err)
	}
	if p.Kind != "" && p.Kind != "SSHJoinProfile" {
		return "", fmt.Errorf("%s is a %s, not an SSHJoinProfile", o.profileFile, p.Kind)
	}
	if p.Spec.Scripts == nil {
		return "", errors.New("only scripts profiles can be signed (Verified hosts run signed scripts only)")
	}
	if o.manifest && p.Name == "" {
		return "", errors.New("the profile has no metadata.name (a manifest names <profile>@<version>)")
	}
	version := p.Spec.Version
	if version == "" {
		version = "1"
	}
	var expiry time.Time
	if o.manifest {
		if expiry, err = parseNotAfter(o.notAfter, o.now); err != nil {
			return "", err
		}
	}
	want := map[string]bool{}
	for _, ph := range strings.Split(o.phases, ",") {
		if ph = strings.TrimSpace(ph); ph != "" {
			if !engine.Phase(ph).Valid() {
				return "", fmt.Errorf("--phases: unknown phase %q", ph)
			}
			want[ph] = true
		}
	}
	sigs := &v1beta1.ProfileSignatures{}
	p.Spec.Signatures = sigs
	var b strings.Builder
	b.WriteString("signatures:\n")
	n := 0
	for _, ph := range engine.Phases {
		src, ok := profile.Source(p, ph)
		if !ok || !want[string(ph)] {
			continue
		}
		if strings.Contains(src.Script, "{{") {
			return "", fmt.Errorf("%s: the script contains {{ … }}: Verified hosts run the signed bytes unrendered; use the KPSSH_* environment", ph)
		}
		msg := []byte(src.Script)
		var m []byte
		if o.manifest {
			var pol map[string]envelope.ParamRule
			if o.policy != nil {
				pol = engine.PhasePolicy(ph, o.policy)
			}
			if m, err = envelope.MarshalManifest(envelope.Manifest{Phase: string(ph), Profile: p.Name + "@" + version,
				ScriptSHA256: envelope.ScriptDigest(msg), IssuedAt: o.now, NotAfter: expiry, Params: pol}); err != nil {
				return "", err
			}
			msg = m
		}
		sig, err := sshsig.SignWith(signer, msg, sshsig.Namespace)
		if err != nil {
			return "", err
		}
		field := envelope.FormatSignedField(envelope.SignedField{Manifest: m, Signature: sig})
		setSignature(sigs, ph, field)
		fmt.Fprintf(&b, "  %s: |\n", ph)
		for _, l := range strings.Split(strings.TrimSuffix(field, "\n"), "\n") {
			fmt.Fprintf(&b, "    %s\n", l)
		}
		n++
	}
	if n == 0 {
		return "", errors.New("no script to sign")
	}
	for _, w := range profile.VerifiedWarnings(p) {
		fmt.Fprintf(warn, "kpssh sign: warning: %s\n", w)
	}
	return b.String(), nil
}

// signer is the key that signs: --key's private key file, or the
// ssh-agent's key named by --key's public key file or SHA256 fingerprint.
// done ends the agent session.
func (o signOptions) signer() (s ssh.Signer, done func(), err error) {
	var k sshsig.AgentKey
	if strings.HasPrefix(o.keyFile, "SHA256:") && !fileExists(o.keyFile) {
		k.Fingerprint = o.keyFile
	} else {
		data, err := os.ReadFile(o.keyFile)
		if err != nil {
			return nil, nil, fmt.Errorf("read key: %w", err)
		}
		if k.Public, _, _, _, err = ssh.ParseAuthorizedKey(data); err != nil {
			s, err := sshsig.ParseSigner(data)
			return s, func() {}, err
		}
	}
	ag, err := sshsig.DialAgent(o.agentSock)
	if err != nil {
		return nil, nil, err
	}
	if s, err = ag.Signer(k); err != nil {
		_ = ag.Close()
		return nil, nil, err
	}
	return s, func() { _ = ag.Close() }, nil
}

func parseNotAfter(s string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil {
		if d <= 0 {
			return time.Time{}, errors.New("--not-after must be positive")
		}
		return now.Add(d).UTC().Truncate(time.Second), nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("--not-after %q is neither a duration (720h) nor a time (2027-01-31T00:00:00Z)", s)
	}
	if !t.After(now) {
		return time.Time{}, errors.New("--not-after is in the past")
	}
	return t.UTC().Truncate(time.Second), nil
}

func setSignature(s *v1beta1.ProfileSignatures, ph engine.Phase, v string) {
	switch ph {
	case engine.PhaseInstall:
		s.Install = v1beta1.Signature(v)
	case engine.PhaseJoin:
		s.Join = v1beta1.Signature(v)
	case engine.PhaseLeave:
		s.Leave = v1beta1.Signature(v)
	case engine.PhaseUninstall:
		s.Uninstall = v1beta1.Signature(v)
	case engine.PhaseReboot:
		s.Reboot = v1beta1.Signature(v)
	case engine.PhaseVerify:
		s.Verify = v1beta1.Signature(v)
	case engine.PhaseCheck:
		s.Check = v1beta1.Signature(v)
	}
}

// policyRules merges --param-policy FILE, --param and --ca-file (later ones win
// per name). nil: no policy asked for. A policy must pin the cluster
// endpoint and CA: the join trusts them.
func policyRules(flags []string, file, caFile string) (map[string]envelope.ParamRule, error) {
	var lines []string
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("--param-policy: %w", err)
		}
		for _, l := range strings.Split(string(b), "\n") {
			if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
				lines = append(lines, l)
			}
		}
	}
	lines = append(lines, flags...)
	if len(lines) == 0 && caFile == "" {
		return nil, nil
	}
	rules := map[string]envelope.ParamRule{}
	for _, l := range lines {
		name, rule, ok := strings.Cut(l, "=")
		if !ok {
			return nil, fmt.Errorf("param rule %q is not NAME=RULE", l)
		}
		r, err := envelope.ParseRule(rule)
		if err == nil {
			err = envelope.CheckRule(name, r)
		}
		if err != nil {
			return nil, fmt.Errorf("param rule for %s: %w", name, err)
		}
		rules[name] = r
	}
	if caFile != "" {
		ca, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("--ca-file: %w", err)
		}
		rules[engine.EnvClusterCAB64] = envelope.ParamRule{Kind: envelope.RuleSHA256, Arg: envelope.ScriptDigest([]byte(base64.StdEncoding.EncodeToString(ca)))}
	}
	for _, n := range engine.PinnedParams {
		if _, ok := rules[n]; !ok {
			return nil, fmt.Errorf("param policy: %s needs a rule (the join trusts it; --ca-file pins the CA)", n)
		}
	}
	return rules, nil
}
