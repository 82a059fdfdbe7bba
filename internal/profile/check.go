package profile

import (
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/engine"
)

// RegistrationWindow is how long Karpenter core waits for a NodeClaim's Node
// to register before deleting the NodeClaim: registrationTimeout in
// sigs.k8s.io/karpenter pkg/controllers/nodeclaim/lifecycle/liveness.go
// (unexported; a nodeclass test reads it from the module source). Create
// runs install and join inside that window.
const RegistrationWindow = 15 * time.Minute

// ClassCheck is what CheckClass concluded. Reason is "" when the class and
// its profile pass; else the Ready=False reason and its message.
type ClassCheck struct {
	Reason, Message string
	// Warnings: usable, but worth a look (a signed script without `set
	// -euo pipefail`). The controller puts them into the Ready message.
	Warnings []string
	// Notes say what could not be checked (argument specs the check cannot
	// evaluate); the CLI prints them, the controller has no use for them.
	Notes []string
}

// OK reports whether the checks passed.
func (c ClassCheck) OK() bool { return c.Reason == "" }

func invalid(reason, format string, a ...any) ClassCheck {
	return ClassCheck{Reason: reason, Message: fmt.Sprintf(format, a...)}
}

// CheckClass runs every check of a node class and its profile that needs no
// cluster, in the order a user fixes things: the profile is valid
// (Validate, roles resolved by roles), the role's argument specs are
// satisfied by the vars the class and profile give (when roles also says
// where it searches: RoleSearchPath), the install + join (+ verify) timeouts
// fit Karpenter's registration window, and the class's hostSelector parses.
// nc may be nil (a profile alone): the argument specs and the selector are
// then not checked (a note says so). The node class controller and `kpssh
// validate` both call this, so they agree on every message.
func CheckClass(p *v1beta1.SSHJoinProfile, nc *v1beta1.SSHNodeClass, roles RoleValidator) ClassCheck {
	if err := Validate(p, roles); err != nil {
		return invalid(v1beta1.ReasonProfileInvalid, "%v", err)
	}
	var notes []string
	if a := p.Spec.Ansible; a != nil && strings.TrimSpace(a.Role) != "" {
		sp, ok := roles.(RoleSearchPath)
		switch {
		case !ok:
			notes = append(notes, "argument specs: not checked (the role resolver does not say where it searches)")
		case nc == nil:
			notes = append(notes, "argument specs: not checked against node-class vars (no node class given)")
		default:
			n, err := CheckArgumentSpecs(p, nc, sp)
			if err != nil {
				return invalid(v1beta1.ReasonProfileInvalid, "%v", err)
			}
			notes = append(notes, n...)
		}
	}
	if msg, ok := timeoutsFit(p, roles); !ok {
		return invalid(v1beta1.ReasonTimeoutsExceedRegistration, "%s", msg)
	}
	if nc != nil && nc.Spec.HostSelector != nil {
		if _, err := metav1.LabelSelectorAsSelector(nc.Spec.HostSelector); err != nil {
			return invalid(v1beta1.ReasonSelectorError, "hostSelector: %v", err)
		}
	}
	return ClassCheck{Warnings: VerifiedWarnings(p), Notes: notes}
}

// WarningMessage is the one line a class's Ready condition carries for its
// profile's warnings (kpssh validate prints the same).
func WarningMessage(p *v1beta1.SSHJoinProfile, warnings []string) string {
	return fmt.Sprintf("warning: profile %s: %s", p.Name, strings.Join(warnings, "; "))
}

// timeoutsFit refuses a profile whose install + join (+ verify, when it
// has one) timeouts exceed the registration window: Karpenter would delete
// the NodeClaim while a slow phase still runs on the host. Equal fits (the
// defaults, 10m + 5m, do).
func timeoutsFit(p *v1beta1.SSHJoinProfile, roles RoleValidator) (string, bool) {
	install, join := Timeout(p, engine.PhaseInstall), Timeout(p, engine.PhaseJoin)
	sum, terms := install+join, fmt.Sprintf("install %s + join %s", ShortDuration(install), ShortDuration(join))
	fields := "spec.timeouts.install or spec.timeouts.join"
	if Verifies(p, roles) {
		verify := Timeout(p, engine.PhaseVerify)
		sum, terms = sum+verify, terms+" + verify "+ShortDuration(verify)
		fields = "spec.timeouts.install, spec.timeouts.join or spec.timeouts.verify"
	}
	if sum <= RegistrationWindow {
		return "", true
	}
	return fmt.Sprintf("profile %s: timeouts %s = %s exceeds Karpenter's registration window of %s; lower %s",
		p.Name, terms, ShortDuration(sum), ShortDuration(RegistrationWindow), fields), false
}

// ShortDuration prints a duration without zero tails: 15m, not 15m0s.
func ShortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
