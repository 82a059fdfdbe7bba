package engine

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/dklesev/kpssh/internal/envelope"
	"github.com/dklesev/kpssh/internal/probe"
	"github.com/dklesev/kpssh/internal/sshsig"
)

// DefaultShimCommand is how the shim is invoked when the host names none
// (the provisioning role installs it on PATH; under ForceCommand the command
// line only selects the op).
const DefaultShimCommand = "kpssh-shim"

// fileEnvelope is the shim's stdin (unlinked by the plugin once read).
const fileEnvelope = "envelope"

// Verified makes a script phase a Verified-mode phase: the exact script bytes
// (Source.Script, never rendered) go to the host's shim in an envelope, after
// the controller has checked the signature in Go. Nothing here is secret.
type Verified struct {
	// Signature is the profile's signatures.<phase>: an armored SSHSIG over
	// the script (envelope v1), or a kpssh manifest followed by an armored
	// SSHSIG over it (envelope v2).
	Signature string
	// Profile is "<name>@<version>" of the profile; a v2 manifest must name it.
	Profile string
	// TrustedSigners are the host's spec.trustedSigners (OpenSSH public-key
	// lines); the signer must be one of them.
	TrustedSigners []string
	// ShimCommand is the host's spec.shimCommand ("" → DefaultShimCommand).
	ShimCommand string
	// Now is the clock for manifest expiry (nil → time.Now).
	Now func() time.Time
	// ProvisionedLeave runs, instead of a signed script, the leave the
	// host's provisioning installed (/etc/kpssh/fallback-leave), through
	// the shim's fallback-leave op: for a host with no signed leave to send
	// (no install marker, the profile deleted, its leave refused). Only
	// the op's name and time bound reach the host — no script, signature
	// or params (Script and Signature must be empty) — so it gives the
	// controller no code of its choosing to run. Phase leave only.
	ProvisionedLeave bool
}

func (v *Verified) shim() string {
	if strings.TrimSpace(v.ShimCommand) == "" {
		return DefaultShimCommand
	}
	return strings.Join(strings.Fields(v.ShimCommand), " ")
}

// verifiedScript is what the controller checked: the envelope minus params.
type verifiedScript struct {
	version   int
	manifest  []byte
	signature []byte
	// policy is the manifest's param policy (empty: none declared)
	policy map[string]envelope.ParamRule
}

// VerifySignature checks a Verified phase in pure Go, before anything
// connects: the script is template-free and within limits, a signature is
// present, it parses (SSHSIG magic, version, namespace kpssh, sha256/sha512,
// allowed algorithm), its signer is one of the trusted signers (a trusted
// line that does not parse is an error) and it verifies; for a v2 manifest
// also phase, profile@version, the script digest and the validity window.
func VerifySignature(phase Phase, src Source) error {
	_, err := verifySource(phase, src)
	return err
}

func verifySource(phase Phase, src Source) (verifiedScript, error) {
	v := src.Verified
	var out verifiedScript
	if v == nil {
		return out, errors.New("not a verified source")
	}
	if v.ProvisionedLeave {
		return out, checkProvisionedLeave(phase, src)
	}
	if strings.TrimSpace(src.Tasks) != "" || strings.TrimSpace(src.Role) != "" {
		return out, fmt.Errorf("%s: Verified hosts run signed scripts only, not ansible tasks or roles", phase)
	}
	if strings.TrimSpace(src.Script) == "" {
		return out, fmt.Errorf("%s: no script", phase)
	}
	if len(src.Script) > envelope.MaxScript {
		return out, fmt.Errorf("%s script is %d bytes, more than %d", phase, len(src.Script), envelope.MaxScript)
	}
	if strings.Contains(src.Script, "{{") {
		return out, fmt.Errorf("%s: the script contains {{ … }}: Verified hosts run the signed bytes unrendered, so signed scripts must be template-free (use the KPSSH_* environment)", phase)
	}
	if err := probe.ValidateShimCommand(v.ShimCommand); err != nil {
		return out, err
	}
	trusted, err := sshsig.ParseTrusted(v.TrustedSigners)
	if err != nil {
		return out, fmt.Errorf("trustedSigners: %w", err)
	}
	f, err := envelope.ParseSignedField(v.Signature)
	if err != nil {
		return out, fmt.Errorf("%s: %w: a Verified host runs only signed scripts (kpssh sign)", phase, err)
	}
	now := time.Now
	if v.Now != nil {
		now = v.Now
	}
	if f.Manifest == nil {
		if _, err := sshsig.Verify(f.Signature, []byte(src.Script), sshsig.Namespace, trusted); err != nil {
			return out, fmt.Errorf("%s signature: %w", phase, err)
		}
		return verifiedScript{version: 1, signature: f.Signature}, nil
	}
	if _, err := sshsig.Verify(f.Signature, f.Manifest, sshsig.Namespace, trusted); err != nil {
		return out, fmt.Errorf("%s manifest signature: %w", phase, err)
	}
	m, err := envelope.ParseManifest(f.Manifest)
	if err != nil {
		return out, fmt.Errorf("%s: %w", phase, err)
	}
	if err := envelope.CheckManifest(m, string(phase), v.Profile, []byte(src.Script), now()); err != nil {
		return out, fmt.Errorf("%s: %w", phase, err)
	}
	return verifiedScript{version: 2, manifest: f.Manifest, signature: f.Signature, policy: m.Params}, nil
}

// checkProvisionedLeave: the host's fallback leave takes nothing from the
// controller but the shim command.
func checkProvisionedLeave(phase Phase, src Source) error {
	if phase != PhaseLeave {
		return fmt.Errorf("%s: the host's provisioned fallback leave runs only as leave", phase)
	}
	if src.Script != "" || src.Tasks != "" || src.Role != "" || src.Verified.Signature != "" {
		return fmt.Errorf("%s: the host's provisioned fallback leave takes no script, tasks, role or signature", phase)
	}
	return probe.ValidateShimCommand(src.Verified.ShimCommand)
}

// VerifyParams is VerifySignature plus the manifest's param policy applied
// to the params the phase would get from c (contract applied): a node-class
// var, cluster endpoint or CA the signer did not allow is refused before
// anything connects. A manifest without a policy checks names only.
func VerifyParams(phase Phase, src Source, c Context) error {
	vs, err := verifySource(phase, src)
	if err != nil || src.Verified.ProvisionedLeave {
		return err
	}
	return checkPolicy(phase, vs, Env(phase, c, true))
}

func checkPolicy(phase Phase, vs verifiedScript, params map[string]string) error {
	if err := envelope.CheckParamPolicy(vs.policy, params); err != nil {
		return fmt.Errorf("%s: %w", phase, err)
	}
	return nil
}

// buildVerified renders the envelope (params = the phase's KPSSH_*
// environment, contract applied) and the one-task playbook.
func buildVerified(b *bundle, req Request, ctx Context, rc renderConfig) error {
	vs, err := verifySource(req.Phase, req.Source)
	if err != nil {
		return err
	}
	if req.Source.Verified.ProvisionedLeave {
		b.playbook = verifiedPlaybook(req, rc)
		return nil
	}
	params := Env(req.Phase, ctx, true)
	if rc.policyChecked {
		vs.policy = nil
	} else if err := checkPolicy(req.Phase, vs, params); err != nil {
		return err
	}
	env := envelope.Envelope{
		Version: vs.version, Phase: string(req.Phase), Params: params,
		Manifest: vs.manifest, Signature: vs.signature, Script: []byte(req.Source.Script),
	}
	if vs.version == 2 {
		env.Profile = req.Source.Verified.Profile
	}
	data, err := envelope.Marshal(env)
	if err != nil {
		return err
	}
	b.scriptLen = len(req.Source.Script)
	b.add(fileEnvelope, data)
	b.playbook = verifiedPlaybook(req, rc)
	return nil
}

// verifiedPlaybook is one task of the plugin: the connect check runs the
// shim's unsigned `ping` op, then the envelope goes to `<shim> run` on the
// channel's stdin — or, for the host's provisioned leave, `<shim>
// fallback-leave` runs with nothing on stdin. Under sshd's ForceCommand the
// command lines only select the op. The host needs no Python.
func verifiedPlaybook(req Request, rc renderConfig) string {
	var b strings.Builder
	b.WriteString(playHeader(req, "verified"))
	v := req.Source.Verified
	shim := v.shim()
	op, name, stdin := "run", "verified script", "\n        stdin_file: "+yq(rc.path(fileEnvelope))+"\n        remove_stdin_file: true"
	comment := `      # The envelope (signed script, signature, KPSSH_* params) goes to the
      # shim's stdin; the shim verifies it with ssh-keygen before it runs.`
	if v.ProvisionedLeave {
		op, name, stdin = "fallback-leave", "the host's provisioned fallback leave", ""
		comment = `      # The shim runs the leave the host's provisioning installed
      # (/etc/kpssh/fallback-leave): nothing but this op name is sent.`
	}
	run := shim + " " + op
	if rc.remoteTimeout && rc.timeout > 0 {
		// the host-side bound of the script (as timeout(1) in raw mode): the
		// shim takes the smaller of this and its own max-seconds
		run += " " + strconv.Itoa(int(math.Ceil(rc.timeout.Seconds())))
	}
	fmt.Fprintf(&b, `  tasks:
    - name: %s
%s
      # The connect check (%s) is the shim's ping op, inside this task.
      no_log: true
      vars:
        kpssh_internal: script
      dklesev.kpssh.stdin_exec:
        cmd: %s%s
        result_file: %s
        connect_check: true
        connect_cmd: %s
`, yq("kpssh: "+string(req.Phase)+" "+name), comment, yq(connectTaskName), yq(run), stdin, yq(rc.path(fileResult)), yq(shim+" ping"))
	return b.String()
}

// Shim exit codes (SPEC §5).
const (
	ShimOK           = 0
	ShimInternal     = 1
	ShimBadSignature = 2
	ShimBadParam     = 3
	ShimMalformed    = 4
	ShimUnknownPhase = 5
	ShimScriptFailed = 10
)

var shimReasons = map[int]string{
	ShimInternal: "shim internal error", ShimBadSignature: "signature rejected", ShimBadParam: "bad param",
	ShimMalformed: "malformed envelope", ShimUnknownPhase: "unknown phase", ShimScriptFailed: "script failed",
}

// verifiedOutcome maps the shim's exit code: 2–5 → Rejected (the host
// refused to run anything), 10 → Failed (the signed script failed), 1 →
// Failed (the shim itself broke).
func verifiedOutcome(res Result) Result {
	if res.Outcome != Failed || !res.Touched || res.FailedTask == connectTaskName {
		return res
	}
	why, ok := shimReasons[res.RC]
	if !ok {
		return res
	}
	if res.RC >= ShimBadSignature && res.RC <= ShimUnknownPhase {
		res.Outcome = Rejected
		res.Message = fmt.Sprintf("the host's shim refused the phase (exit %d, %s); nothing ran: %s", res.RC, why, res.Message)
		return res
	}
	res.Message = fmt.Sprintf("shim exit %d (%s): %s", res.RC, why, res.Message)
	return res
}

// DefaultParamRules are the rules `kpssh sign` writes for the params the
// controller makes per launch (the operator cannot pin them: they differ on
// every claim), each also allowing the empty value phases get when the
// contract withholds it. Patterns are POSIX ERE without backslashes.
var DefaultParamRules = map[string]envelope.ParamRule{
	EnvBootstrapToken: {Kind: envelope.RuleRE, Arg: "([a-z0-9]{6}[.][a-z0-9]{16})?"},
	EnvNodeName:       {Kind: envelope.RuleRE, Arg: "([a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?)?"},
	EnvProviderID:     {Kind: envelope.RuleRE, Arg: "(kpssh://[a-z0-9.-]+/[a-z0-9.-]+)?"},
	EnvHostAddress:    {Kind: envelope.RuleRE, Arg: "[A-Za-z0-9.:%-]{0,253}"},
	EnvNodeAddress:    {Kind: envelope.RuleRE, Arg: "[A-Za-z0-9.:%-]{0,253}"},
	EnvNodeLabels:     {Kind: envelope.RuleRE, Arg: "[A-Za-z0-9._/=,-]*"},
	EnvTaints:         {Kind: envelope.RuleRE, Arg: "[A-Za-z0-9._/=,:-]*"},
}

// PinnedParams must have an operator's rule in any policy: the join trusts
// them (a rogue endpoint or CA joins the host to another apiserver).
var PinnedParams = []string{EnvClusterEndpoint, EnvClusterCAB64}

// PhasePolicy is the policy of phase p's manifest from the operator's rules
// (defaults for the per-launch names added): the environment contract
// applied, so that what a phase never gets must be empty there — leave gets
// only the addresses, only join the token.
func PhasePolicy(p Phase, rules map[string]envelope.ParamRule) map[string]envelope.ParamRule {
	out := map[string]envelope.ParamRule{}
	for k, r := range DefaultParamRules {
		out[k] = r
	}
	for k, r := range rules {
		out[k] = r
	}
	empty := envelope.ParamRule{Kind: envelope.RuleValue}
	for _, k := range []string{EnvClusterEndpoint, EnvClusterCAB64, EnvBootstrapToken, EnvNodeName, EnvProviderID, EnvNodeLabels, EnvTaints} {
		if p.AddressesOnly() || (k == EnvBootstrapToken && p != PhaseJoin) {
			out[k] = empty
		}
	}
	if p.AddressesOnly() {
		for k := range out {
			if strings.HasPrefix(k, EnvVarPrefix) || strings.HasPrefix(k, EnvSecretPrefix) {
				delete(out, k)
			}
		}
	}
	return out
}
