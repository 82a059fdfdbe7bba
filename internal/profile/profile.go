// Package profile is the glue between an SSHJoinProfile (the API object) and
// the engine (plain values): which source a phase runs, how long it may take,
// which variables it gets, and whether the profile is usable at all. The node
// class controller, the provider and the leave paths all read profiles
// through here so they agree on every default.
package profile

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/engine"
	"github.com/dklesev/kpssh/internal/envelope"
)

// Phase timeouts when spec.timeouts leaves one unset (the CRD defaults
// install/join/leave too; uninstall has no field).
const (
	DefaultInstallTimeout   = 10 * time.Minute
	DefaultJoinTimeout      = 5 * time.Minute
	DefaultLeaveTimeout     = 3 * time.Minute
	DefaultUninstallTimeout = 10 * time.Minute
	DefaultRebootTimeout    = 2 * time.Minute
	DefaultVerifyTimeout    = 2 * time.Minute
	DefaultCheckTimeout     = 2 * time.Minute
)

// requiredPhases must be present in every profile; uninstall is optional
// (the controller never runs it).
var requiredPhases = []engine.Phase{engine.PhaseInstall, engine.PhaseJoin, engine.PhaseLeave}

// Source returns the engine source of one phase; ok=false when the profile
// has nothing for that phase (e.g. no uninstall), or when its source is
// ambiguous (the CRD rejects that; running one of two guesses would be worse).
// A role profile answers every phase with the role: whether the role has
// tasks/<phase>.yml is for the engine (RoleValidator) to decide. A profile
// without a reboot phase answers reboot with engine.DefaultRebootScript (the
// engine does the same for a role without tasks/reboot.yml).
func Source(p *v1beta1.SSHJoinProfile, phase engine.Phase) (engine.Source, bool) {
	src, ok := source(p, phase)
	if !ok && phase == engine.PhaseReboot && p != nil && checkOneSource(p) == nil {
		return engine.Source{Script: engine.DefaultRebootScript}, true
	}
	return src, ok
}

func source(p *v1beta1.SSHJoinProfile, phase engine.Phase) (engine.Source, bool) {
	if p == nil || !phase.Valid() {
		return engine.Source{}, false
	}
	s, a := p.Spec.Scripts, p.Spec.Ansible
	if phase == engine.PhaseCheck && s == nil {
		return engine.Source{}, false // role and task profiles check in check mode
	}
	switch {
	case s != nil && a == nil:
		body := string(pickScript(s, phase))
		return engine.Source{Script: body}, strings.TrimSpace(body) != ""
	case a != nil && s == nil:
		hasRole, hasTasks := strings.TrimSpace(a.Role) != "", a.Tasks != nil
		switch {
		case hasRole && !hasTasks:
			return engine.Source{Role: a.Role}, true
		case hasTasks && !hasRole:
			body := string(pickTasks(a.Tasks, phase))
			return engine.Source{Tasks: body}, strings.TrimSpace(body) != ""
		}
	}
	return engine.Source{}, false
}

// byPhase picks phase's field of a per-phase struct (the zero value for an
// unknown phase).
func byPhase[T any](phase engine.Phase, install, join, leave, uninstall, reboot T) (zero T) {
	switch phase {
	case engine.PhaseReboot:
		return reboot
	case engine.PhaseInstall:
		return install
	case engine.PhaseJoin:
		return join
	case engine.PhaseLeave:
		return leave
	case engine.PhaseUninstall:
		return uninstall
	}
	return zero
}

func pickScript(s *v1beta1.ProfileScripts, phase engine.Phase) v1beta1.Script {
	if phase == engine.PhaseVerify {
		return s.Verify
	}
	if phase == engine.PhaseCheck {
		return s.Check
	}
	return byPhase(phase, s.Install, s.Join, s.Leave, s.Uninstall, s.Reboot)
}

func pickTasks(t *v1beta1.ProfileTasks, phase engine.Phase) v1beta1.TaskList {
	if phase == engine.PhaseVerify {
		return t.Verify
	}
	return byPhase(phase, t.Install, t.Join, t.Leave, t.Uninstall, t.Reboot)
}

// Signature is p's signature of phase ph ("" when p carries none).
func Signature(p *v1beta1.SSHJoinProfile, ph engine.Phase) v1beta1.Signature {
	s := p.Spec.Signatures
	if s == nil {
		return ""
	}
	if ph == engine.PhaseVerify {
		return s.Verify
	}
	if ph == engine.PhaseCheck {
		return s.Check
	}
	return byPhase(ph, s.Install, s.Join, s.Leave, s.Uninstall, s.Reboot)
}

// Verifies reports whether p has a verify phase: scripts.verify or
// ansible.tasks.verify, or a role with tasks/verify.yml (a role is taken to
// have one when roles is nil: nothing can tell).
func Verifies(p *v1beta1.SSHJoinProfile, roles RoleValidator) bool {
	src, ok := Source(p, engine.PhaseVerify)
	if !ok || src.Role == "" || roles == nil {
		return ok
	}
	var np *engine.NoRolePhaseError
	return !errors.As(roles.ValidateRole(src.Role, engine.PhaseVerify), &np)
}

// durationRE is the CRD's pattern; ParseDuration alone would also take
// "1.5h" or "500ms", which the seed rules out.
var durationRE = regexp.MustCompile(`^([0-9]+(s|m|h))+$`)

// Timeout returns the phase timeout from spec.timeouts (defaults install
// 10m, join 5m, leave 3m, uninstall 10m, reboot 2m, verify 2m). A malformed
// or zero value yields the default: the CRD pattern already rejects
// malformed ones, and a zero timeout would mean "no bound" to nobody's
// benefit.
func Timeout(p *v1beta1.SSHJoinProfile, phase engine.Phase) time.Duration {
	var raw v1beta1.Duration
	var def time.Duration
	switch phase {
	case engine.PhaseInstall:
		def = DefaultInstallTimeout
		if p != nil {
			raw = p.Spec.Timeouts.Install
		}
	case engine.PhaseJoin:
		def = DefaultJoinTimeout
		if p != nil {
			raw = p.Spec.Timeouts.Join
		}
	case engine.PhaseLeave:
		def = DefaultLeaveTimeout
		if p != nil {
			raw = p.Spec.Timeouts.Leave
		}
	case engine.PhaseReboot:
		def = DefaultRebootTimeout
		if p != nil {
			raw = p.Spec.Timeouts.Reboot
		}
	case engine.PhaseVerify:
		def = DefaultVerifyTimeout
		if p != nil {
			raw = p.Spec.Timeouts.Verify
		}
	case engine.PhaseCheck:
		def = DefaultCheckTimeout
		if p != nil {
			raw = p.Spec.Timeouts.Check
		}
	default: // uninstall has no field; an unknown phase gets the longest bound
		def = DefaultUninstallTimeout
	}
	if !durationRE.MatchString(string(raw)) {
		return def
	}
	d, err := time.ParseDuration(string(raw))
	if err != nil || d <= 0 {
		return def
	}
	return d
}

// Vars returns the profile's ansible.vars defaults overlaid by the node class
// vars (node class wins); never nil. Either argument may be nil (leave paths
// have no node class, and leave gets no vars anyway — the engine enforces it).
func Vars(p *v1beta1.SSHJoinProfile, nc *v1beta1.SSHNodeClass) map[string]string {
	out := map[string]string{}
	if p != nil && p.Spec.Ansible != nil {
		for k, v := range p.Spec.Ansible.Vars {
			out[k] = string(v)
		}
	}
	if nc != nil {
		for k, v := range nc.Spec.Vars {
			out[k] = string(v)
		}
	}
	return out
}

// VerifiedSource is the engine source of phase ph on an execMode Verified
// host: the phase's script, unrendered, with its signatures.<phase> and the
// host's trust (spec.trustedSigners, spec.shimCommand). A profile that is not
// template-free scripts, or has no signature for the phase, is an error (a
// config error for the caller); the signature itself is checked by
// engine.VerifySignature.
func VerifiedSource(p *v1beta1.SSHJoinProfile, ph engine.Phase, h *v1beta1.SSHHost) (engine.Source, error) {
	if p == nil || h == nil {
		return engine.Source{}, errors.New("no profile or host")
	}
	if p.Spec.Scripts == nil {
		return engine.Source{}, fmt.Errorf("join profile %s is not a scripts profile: Verified hosts run signed scripts only", p.Name)
	}
	body := string(pickScript(p.Spec.Scripts, ph))
	sig := Signature(p, ph)
	if strings.TrimSpace(body) == "" && ph == engine.PhaseReboot {
		// kpssh sign signs the default when scripts.reboot is absent.
		if strings.TrimSpace(string(sig)) == "" {
			return engine.Source{}, fmt.Errorf("join profile %s has no signatures.reboot: the shim runs signed scripts only, and the default reboot is signed like any other (kpssh sign --phases ...,reboot signs scripts.reboot, or the default when there is none)", p.Name)
		}
		body = engine.DefaultRebootScript
	}
	if strings.TrimSpace(body) == "" {
		return engine.Source{}, fmt.Errorf("join profile %s has no %s script", p.Name, ph)
	}
	if strings.TrimSpace(string(sig)) == "" {
		return engine.Source{}, fmt.Errorf("join profile %s has no signatures.%s (sign it with kpssh sign)", p.Name, ph)
	}
	trusted := make([]string, 0, len(h.Spec.TrustedSigners))
	for _, t := range h.Spec.TrustedSigners {
		trusted = append(trusted, string(t))
	}
	version := p.Spec.Version
	if version == "" {
		version = "1"
	}
	return engine.Source{Script: body, Verified: &engine.Verified{
		Signature: string(sig), Profile: p.Name + "@" + version, TrustedSigners: trusted, ShimCommand: h.Spec.ShimCommand,
	}}, nil
}

// VerifiedWarnings lists the signed scripts of p that lack `set -euo
// pipefail` (in Verified mode nothing is prepended: without it a failing
// command does not fail the phase). Not an error: the node class shows it as
// a warning.
func VerifiedWarnings(p *v1beta1.SSHJoinProfile) []string {
	if p == nil || p.Spec.Scripts == nil || !Signed(p) {
		return nil
	}
	var out []string
	for _, ph := range engine.Phases {
		body, sig := string(pickScript(p.Spec.Scripts, ph)), string(Signature(p, ph))
		if strings.TrimSpace(body) == "" || sig == "" {
			continue
		}
		if !hasStrictMode(body) {
			out = append(out, fmt.Sprintf("%s script has no `set -euo pipefail`: on a Verified host nothing is prepended, so a failing command would not fail the phase", ph))
		}
		if noParamPolicy(sig) {
			out = append(out, fmt.Sprintf("%s manifest has no param policy: node-class vars and the cluster endpoint and CA reach the signed script unchecked (re-sign with kpssh sign --param/--param-policy/--ca-file)", ph))
		}
	}
	return out
}

// noParamPolicy reports whether sig is a v2 manifest that declares no param
// policy (v1 signatures carry none by design; unparsable ones are errors
// elsewhere).
func noParamPolicy(sig string) bool {
	f, err := envelope.ParseSignedField(sig)
	if err != nil || f.Manifest == nil {
		return false
	}
	m, err := envelope.ParseManifest(f.Manifest)
	return err == nil && len(m.Params) == 0
}

// hasStrictMode reports whether a line of the script (before any other
// command could fail unnoticed, we do not check where) sets errexit, nounset
// and pipefail: `set -euo pipefail`, `set -eu -o pipefail`, `set -o errexit
// -o nounset -o pipefail`, in any order and combination.
func hasStrictMode(body string) bool {
	for _, l := range strings.Split(body, "\n") {
		f := strings.Fields(l)
		if len(f) < 2 || f[0] != "set" {
			continue
		}
		var e, u, pf bool
		for i := 1; i < len(f); i++ {
			w := f[i]
			if w == "-o" && i+1 < len(f) {
				i++
				switch f[i] {
				case "errexit":
					e = true
				case "nounset":
					u = true
				case "pipefail":
					pf = true
				}
				continue
			}
			if strings.HasPrefix(w, "-") && !strings.HasPrefix(w, "--") {
				flags := w[1:]
				e = e || strings.Contains(flags, "e")
				u = u || strings.Contains(flags, "u")
				if strings.HasSuffix(flags, "o") && i+1 < len(f) && f[i+1] == "pipefail" {
					pf = true
					i++
				}
			}
		}
		if e && u && pf {
			return true
		}
	}
	return false
}

// versionRE is the CRD pattern of spec.version.
var versionRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,63}$`)

// ParseMarker splits "<profile>@<version>" (the status.installedProfile
// marker). Profile names are DNS-1123 subdomains and versions match
// ^[A-Za-z0-9._-]{1,63}$, so neither contains '@'; anything else is not a
// marker this project wrote and yields ok=false.
func ParseMarker(m string) (name, version string, ok bool) {
	name, version, found := strings.Cut(m, "@")
	if !found || len(validation.IsDNS1123Subdomain(name)) > 0 || !versionRE.MatchString(version) {
		return "", "", false
	}
	return name, version, true
}

// RoleValidator resolves roles (implemented by *engine.Local).
type RoleValidator interface {
	ValidateRole(role string, phase engine.Phase) error
}

// Validate runs every check the node class controller runs before it lets
// Karpenter launch against a profile (a failure is Ready=False/ProfileInvalid):
// exactly one source; install, join and leave present; engine.Validate per
// present phase (templates parse, task lists are task lists, leave renders
// with the empty context); role profiles resolve install/join/leave through
// roles (skipped when roles is nil); and a profile carrying signatures (for
// Verified hosts, which run the signed bytes as they are) is template-free
// scripts. The error names the phase and the problem; a profile holds no
// secrets, so the message is safe for a condition.
func Validate(p *v1beta1.SSHJoinProfile, roles RoleValidator) error {
	if p == nil {
		return errors.New("no profile")
	}
	if err := checkOneSource(p); err != nil {
		return err
	}
	for _, ph := range requiredPhases {
		if _, ok := Source(p, ph); !ok {
			return fmt.Errorf("%s: phase missing: install, join and leave are required", ph)
		}
	}
	for _, ph := range engine.Phases {
		src, ok := Source(p, ph)
		if !ok {
			continue
		}
		if err := engine.Validate(ph, src); err != nil {
			return phaseErr(ph, err)
		}
	}
	if a := p.Spec.Ansible; a != nil && strings.TrimSpace(a.Role) != "" && roles != nil {
		for _, ph := range requiredPhases {
			if err := roles.ValidateRole(a.Role, ph); err != nil {
				return phaseErr(ph, err)
			}
		}
		// reboot is optional: a role without tasks/reboot.yml gets the default.
		var np *engine.NoRolePhaseError
		if err := roles.ValidateRole(a.Role, engine.PhaseReboot); err != nil && !errors.As(err, &np) {
			return phaseErr(engine.PhaseReboot, err)
		}
		// verify is optional: a role without tasks/verify.yml verifies nothing.
		if err := roles.ValidateRole(a.Role, engine.PhaseVerify); err != nil && !errors.As(err, &np) {
			return phaseErr(engine.PhaseVerify, err)
		}
	}
	if Signed(p) {
		if p.Spec.Scripts == nil {
			return errors.New("signatures: a signed profile (for Verified hosts) must be scripts, not ansible")
		}
		for _, ph := range engine.Phases {
			if strings.Contains(string(pickScript(p.Spec.Scripts, ph)), "{{") {
				return fmt.Errorf("%s: the script contains {{ … }} but the profile is signed: Verified hosts run the signed bytes unrendered, so signed scripts must be template-free (use the KPSSH_* environment instead)", ph)
			}
		}
	}
	return nil
}

func checkOneSource(p *v1beta1.SSHJoinProfile) error {
	s, a := p.Spec.Scripts, p.Spec.Ansible
	switch {
	case s == nil && a == nil:
		return errors.New("no source: set exactly one of scripts or ansible")
	case s != nil && a != nil:
		return errors.New("both scripts and ansible are set: set exactly one")
	case a != nil:
		hasRole, hasTasks := strings.TrimSpace(a.Role) != "", a.Tasks != nil
		if hasRole == hasTasks {
			return errors.New("ansible: set exactly one of role or tasks")
		}
	}
	return nil
}

// Signed says whether p signs any phase.
func Signed(p *v1beta1.SSHJoinProfile) bool {
	for _, ph := range engine.Phases {
		if Signature(p, ph) != "" {
			return true
		}
	}
	return false
}

// phaseErr makes sure the message starts with the phase name (the engine's
// own messages mostly do already; "role x not found" does not).
func phaseErr(ph engine.Phase, err error) error {
	if strings.HasPrefix(err.Error(), string(ph)) {
		return err
	}
	return fmt.Errorf("%s: %w", ph, err)
}
