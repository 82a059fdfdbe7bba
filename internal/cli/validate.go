package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/crypto/ssh"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/engine"
	"github.com/dklesev/kpssh/internal/envelope"
	"github.com/dklesev/kpssh/internal/profile"
	"github.com/dklesev/kpssh/internal/sshsig"
)

// ExitInvalid is `kpssh validate`'s status for a profile or class that the
// controller would refuse.
const ExitInvalid = 1

// ValidateUsage is the synopsis of `kpssh validate`.
const ValidateUsage = `usage: kpssh validate [--class CLASS.yaml] [--content DIR]... [--host HOST.yaml] PROFILE.yaml

Run the node class controller's checks on an SSHJoinProfile file, without a
cluster: one source, install/join/leave present, templates and task lists
parse, leave uses nothing but the host's addresses (the empty context), the
role is found with tasks/<phase>.yml (in the shipped roles, then each
--content DIR: a roles directory, a role directory, or a collections
directory holding ansible_collections/), the role's argument specs are
satisfied by the node class's vars (--class), the timeouts fit Karpenter's
registration window, the hostSelector parses. Signed scripts are verified:
against --host's spec.trustedSigners when given (an execMode Verified host),
else against their own signer (integrity only; a note says so). The
messages are the controller's (profile.CheckClass). A --class file may hold
several SSHNodeClasses: those whose joinProfileRef names the profile are
checked. CRD rules (CEL, defaults) are the apiserver's and are not run.

Exit status: 0 valid (warnings and notes on stderr), 1 invalid (the
messages on stderr), 2 usage error (unreadable file, bad flags).

flags:
`

// Validate is `kpssh validate` (args without the subcommand name).
func Validate(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return runSub(ctx, "validate", args, stdout, stderr)
}

func (d deps) validateCommand() *cobra.Command {
	var classFile, hostFile string
	var content multiFlag
	c := d.command("validate", "PROFILE.yaml: the node class controller's checks on a profile (and --class) file, offline", ValidateUsage,
		func(_ *cobra.Command, pos []string) error { return d.validate(pos, classFile, hostFile, content) })
	fs := c.Flags()
	fs.StringVar(&classFile, "class", "", "SSHNodeClass manifest `file` (its vars are checked against the role's argument specs)")
	fs.StringVar(&hostFile, "host", "", "SSHHost manifest `file`: signatures are checked against its spec.trustedSigners")
	fs.Var(&content, "content", "roles or collections `dir` searched after the shipped roles (repeatable)")
	_ = c.MarkFlagDirname("content")
	return c
}

func (d deps) validate(pos []string, classFile, hostFile string, content []string) error {
	if len(pos) != 1 {
		return withUsage("want PROFILE.yaml, got %d argument(s)", len(pos))
	}
	p, err := readObject[v1beta1.SSHJoinProfile](pos[0], "SSHJoinProfile")
	if err != nil {
		return err
	}
	var classes []*v1beta1.SSHNodeClass
	if classFile != "" {
		all, err := readObjects[v1beta1.SSHNodeClass](classFile, "SSHNodeClass")
		if err != nil {
			return err
		}
		var names []string
		for _, nc := range all {
			names = append(names, nc.Name+" → "+nc.Spec.JoinProfileRef.Name)
			if nc.Spec.JoinProfileRef.Name == p.Name {
				classes = append(classes, nc)
			}
		}
		if len(classes) == 0 {
			return &exitError{code: ExitInvalid, err: fmt.Errorf("no SSHNodeClass in %s references SSHJoinProfile %s (joinProfileRef: %s)", classFile, p.Name, strings.Join(names, ", "))}
		}
	}
	var host *v1beta1.SSHHost
	if hostFile != "" {
		if host, err = readObject[v1beta1.SSHHost](hostFile, "SSHHost"); err != nil {
			return err
		}
	}
	runBase, err := os.MkdirTemp("", "kpssh-validate-")
	if err != nil {
		return runtimeErr("%v", err)
	}
	defer os.RemoveAll(runBase)
	roles, err := newContentRoles(content, runBase)
	if err != nil {
		return err
	}
	res := ValidateFiles(p, classes, host, roles)
	if a := p.Spec.Ansible; roles.noAnsible && a != nil && strings.TrimSpace(a.Role) != "" {
		res.Lines = append(res.Lines, fmt.Sprintf("SSHJoinProfile %s: note: ansible's own load of role %s (ansible-playbook --syntax-check, which the controller runs on operator roles) not run: ansible-playbook is not on PATH", p.Name, a.Role))
	}
	for _, l := range res.Lines {
		fmt.Fprintf(d.stderr, "kpssh validate: %s\n", l)
	}
	if !res.OK {
		return exitSilently(ExitInvalid)
	}
	what := "SSHJoinProfile " + p.Name
	for _, nc := range classes {
		what += ", SSHNodeClass " + nc.Name
	}
	fmt.Fprintf(d.stdout, "%s: valid\n", what)
	return nil
}

// ValidateResult is what ValidateFiles found: OK, and the lines to print
// (errors, warnings and notes, each saying which).
type ValidateResult struct {
	OK    bool
	Lines []string
}

// ValidateFiles runs profile.CheckClass on the profile alone (no class) or
// with each class, and checks the signatures of a signed profile.
func ValidateFiles(p *v1beta1.SSHJoinProfile, classes []*v1beta1.SSHNodeClass, host *v1beta1.SSHHost, roles profile.RoleValidator) ValidateResult {
	res := ValidateResult{OK: true}
	report := func(subject string, c profile.ClassCheck) {
		if !c.OK() {
			res.OK = false
			res.Lines = append(res.Lines, fmt.Sprintf("%s: %s: %s", subject, c.Reason, c.Message))
		}
		if len(c.Warnings) > 0 {
			res.Lines = append(res.Lines, subject+": "+profile.WarningMessage(p, c.Warnings))
		}
		for _, n := range c.Notes {
			res.Lines = append(res.Lines, subject+": note: "+n)
		}
	}
	if len(classes) == 0 {
		report("SSHJoinProfile "+p.Name, profile.CheckClass(p, nil, roles))
	}
	for _, nc := range classes {
		report("SSHNodeClass "+nc.Name, profile.CheckClass(p, nc, roles))
	}
	if !res.OK {
		return res
	}
	lines, ok := checkSignatures(p, host)
	res.Lines = append(res.Lines, lines...)
	res.OK = ok
	return res
}

// checkSignatures verifies a signed profile's scripts the way a phase on an
// execMode Verified host does (profile.VerifiedSource, then
// engine.VerifySignature: the phase runner's checks). Without a host the
// trusted signer of each phase is its own signer: the signature and the
// manifest are checked, the trust is not (a note says so).
func checkSignatures(p *v1beta1.SSHJoinProfile, host *v1beta1.SSHHost) ([]string, bool) {
	if !profile.Signed(p) {
		if host != nil && host.Spec.ExecMode == v1beta1.ExecModeVerified {
			return []string{fmt.Sprintf("SSHHost %s: execMode Verified: SSHJoinProfile %s carries no signatures (sign it with kpssh sign)", host.Name, p.Name)}, false
		}
		return nil, true
	}
	var lines []string
	ok := true
	for _, ph := range engine.Phases {
		if _, present := profile.Source(p, ph); !present {
			continue
		}
		if ph == engine.PhaseReboot && strings.TrimSpace(string(profile.Signature(p, ph))) == "" {
			// Reboot is optional: unsigned, a Verified host refuses it and
			// Karpenter's repair replaces the node instead.
			lines = append(lines, fmt.Sprintf("SSHJoinProfile %s: warning: no signatures.reboot: a Verified host cannot reboot in place (sign it with kpssh sign -phases ...,reboot)", p.Name))
			continue
		}
		h := host
		if h == nil || h.Spec.ExecMode != v1beta1.ExecModeVerified {
			line, err := selfSigner(p, ph)
			if err != nil {
				lines, ok = append(lines, fmt.Sprintf("SSHJoinProfile %s: %v", p.Name, err)), false
				continue
			}
			h = &v1beta1.SSHHost{Spec: v1beta1.SSHHostSpec{ExecMode: v1beta1.ExecModeVerified, TrustedSigners: []v1beta1.TrustedSigner{v1beta1.TrustedSigner(line)}}}
			if host != nil {
				h.Spec.ShimCommand = host.Spec.ShimCommand
			}
		}
		src, err := profile.VerifiedSource(p, ph, h)
		if err == nil {
			err = engine.VerifySignature(ph, src)
		}
		if err != nil {
			lines, ok = append(lines, fmt.Sprintf("SSHJoinProfile %s: execMode Verified: %v", p.Name, err)), false
			continue
		}
		if h != host {
			fp := "?"
			if k, _, _, _, err := ssh.ParseAuthorizedKey([]byte(h.Spec.TrustedSigners[0])); err == nil {
				fp = ssh.FingerprintSHA256(k)
			}
			lines = append(lines, fmt.Sprintf("SSHJoinProfile %s: note: %s signature verifies, signer %s; whether a host trusts it is not checked (pass --host HOST.yaml of a Verified host)", p.Name, ph, fp))
		}
	}
	return lines, ok
}

// selfSigner is the public key line that made phase ph's signature.
func selfSigner(p *v1beta1.SSHJoinProfile, ph engine.Phase) (string, error) {
	raw := profile.Signature(p, ph)
	if strings.TrimSpace(string(raw)) == "" {
		return "", fmt.Errorf("execMode Verified: join profile %s has no signatures.%s (sign it with kpssh sign)", p.Name, ph)
	}
	f, err := envelope.ParseSignedField(string(raw))
	if err != nil {
		return "", fmt.Errorf("execMode Verified: %s: %w", ph, err)
	}
	s, err := sshsig.Parse(f.Signature)
	if err != nil {
		return "", fmt.Errorf("execMode Verified: %s signature: %w", ph, err)
	}
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(s.PublicKey))), nil
}
