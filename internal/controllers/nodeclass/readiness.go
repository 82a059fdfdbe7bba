package nodeclass

import (
	"context"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/awslabs/operatorpkg/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/karpenter/pkg/events"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/profile"
)

// Ready condition reasons (the API's constants; runbooks match on them).
const (
	ReasonReady           = status.ConditionReady
	ReasonProfileNotFound = v1beta1.ReasonProfileNotFound
	ReasonProfileInvalid  = v1beta1.ReasonProfileInvalid
	ReasonSelectorError   = v1beta1.ReasonSelectorError
	ReasonNoHosts         = v1beta1.ReasonNoHosts
	// ReasonTimeoutsExceedRegistration: the profile's install + join
	// timeouts are longer than Karpenter's registration window.
	ReasonTimeoutsExceedRegistration = v1beta1.ReasonTimeoutsExceedRegistration
)

// RegistrationWindow is Karpenter's registration window (profile's; a test
// here reads it from the module source).
const RegistrationWindow = profile.RegistrationWindow

// maxMessage bounds a condition message (the CRD allows 32768; a template
// error quoting a 256 KiB script must not come close).
const maxMessage = 1024

// verdict is what the checks concluded: Ready, or the first reason not to be.
type verdict struct {
	ready           bool
	reason, message string
	// content: the profile's role resolves from the content sources (files,
	// re-checked periodically).
	content bool
	// warning (Ready classes only) goes into the Ready condition's message
	// and a VerifiedScriptWarning event: a signed script without `set -euo
	// pipefail` is usable, but a failing command would not fail its phase.
	warning string
	// expiry: the profile's signed manifests expiring within
	// profile.ExpiryWarning (condition SignaturesExpiring).
	expiry profile.ExpiryStatus
}

// ReasonVerifiedScriptWarning is the node class event of a warning.
const ReasonVerifiedScriptWarning = "VerifiedScriptWarning"

func notReady(reason, format string, args ...any) verdict {
	msg := fmt.Sprintf(format, args...)
	if len(msg) > maxMessage {
		n := maxMessage - len("…")
		for n > 0 && !utf8.RuneStart(msg[n]) {
			n-- // never cut a rune in half
		}
		msg = msg[:n] + "…"
	}
	return verdict{reason: reason, message: msg}
}

// check evaluates the class in the order a user fixes things: the profile
// exists, then profile.CheckClass (the profile is valid, the role's argument
// specs are satisfied, the timeouts fit, the selector parses — the checks
// `kpssh validate` runs too), then some host matches. Errors are transient
// API errors only; every user mistake is a verdict.
func (c *Controller) check(ctx context.Context, nc *v1beta1.SSHNodeClass) (verdict, error) {
	p := &v1beta1.SSHJoinProfile{}
	ref := nc.Spec.JoinProfileRef.Name
	if err := c.Client.Get(ctx, client.ObjectKey{Name: ref}, p); err != nil {
		if apierrors.IsNotFound(err) {
			return notReady(ReasonProfileNotFound, "SSHJoinProfile %q not found", ref), nil
		}
		return verdict{}, err
	}
	// content: the verdict depends on role files (see ContentRecheck).
	content := p.Spec.Ansible != nil && strings.TrimSpace(p.Spec.Ansible.Role) != "" && c.Roles != nil
	expiry := profile.CheckExpiry(p, c.Clock.Now())
	res := profile.CheckClass(p, nc, c.Roles)
	if !res.OK() {
		v := notReady(res.Reason, "%s", res.Message)
		v.content, v.expiry = content, expiry
		return v, nil
	}
	sel := labels.Everything()
	if nc.Spec.HostSelector != nil {
		// CheckClass has parsed it already.
		if s, err := metav1.LabelSelectorAsSelector(nc.Spec.HostSelector); err == nil {
			sel = s
		}
	}
	// Whether any host matches, not which: one host, uncopied (this runs on
	// every host label change; a full copy of a 5,000-host pool each time
	// was a tenth of the controller's live heap).
	hosts := &v1beta1.SSHHostList{}
	if err := c.Client.List(ctx, hosts, client.InNamespace(c.Namespace), client.MatchingLabelsSelector{Selector: sel},
		client.Limit(1), client.UnsafeDisableDeepCopy); err != nil {
		return verdict{}, err
	}
	if len(hosts.Items) == 0 {
		return notReady(ReasonNoHosts, "no SSHHost in namespace %s matches the hostSelector", c.Namespace), nil
	}
	v := verdict{ready: true, content: content, expiry: expiry}
	if len(res.Warnings) > 0 {
		v.warning = notReady("", "%s", profile.WarningMessage(p, res.Warnings)).message
	}
	return v, nil
}

// updateReadiness sets the Ready and SignaturesExpiring conditions from
// check and writes the status only when it changed; a change to not-ready
// is also an event, and so is an expiry message. It returns the verdict
// (content: it depends on role files, see ContentRecheck; expiry.Next:
// when the expiry condition changes next).
func (c *Controller) updateReadiness(ctx context.Context, nc *v1beta1.SSHNodeClass) (verdict, error) {
	v, err := c.check(ctx, nc)
	if err != nil {
		return v, err
	}
	orig := nc.DeepCopy()
	before := readyCondition(orig)
	cs := nc.StatusConditions(status.WithClock(c.Clock))
	if v.ready {
		cs.SetTrueWithReason(v1beta1.ConditionReady, ReasonReady, v.warning)
	} else {
		cs.SetFalse(v1beta1.ConditionReady, v.reason, v.message)
	}
	expiring := setExpiry(nc, v.expiry, metav1.NewTime(c.Clock.Now()))
	if err := patchStatus(ctx, c.Client, orig, nc); err != nil {
		return v, err
	}
	if expiring {
		c.publish(events.Event{InvolvedObject: nc, Type: corev1.EventTypeWarning, Reason: ReasonSignaturesExpiring,
			Message: v.expiry.Message, DedupeValues: []string{string(nc.UID), v.expiry.Message}})
	}
	after := readyCondition(nc)
	if !v.ready && (before == nil || before.Status != after.Status || before.Reason != after.Reason || before.Message != after.Message) {
		c.publish(notReadyEvent(nc, v.reason, v.message))
	}
	if v.ready && v.warning != "" && (before == nil || before.Message != v.warning) {
		c.publish(events.Event{InvolvedObject: nc, Type: corev1.EventTypeWarning, Reason: ReasonVerifiedScriptWarning,
			Message: v.warning, DedupeValues: []string{string(nc.UID), v.warning}})
	}
	return v, nil
}

// ReasonSignaturesExpiring is the node class event when the
// SignaturesExpiring condition's message changes to a new one.
const ReasonSignaturesExpiring = "SignaturesExpiring"

// setExpiry sets (or removes) the SignaturesExpiring condition and reports
// whether its message is new. Written directly, not through the
// ConditionSet: that would recompute Ready, which is not its concern.
func setExpiry(nc *v1beta1.SSHNodeClass, e profile.ExpiryStatus, now metav1.Time) bool {
	conds := nc.Status.Conditions[:0:0]
	var old *status.Condition
	for i := range nc.Status.Conditions {
		if c := nc.Status.Conditions[i]; c.Type == v1beta1.ConditionSignaturesExpiring {
			old = &c
		} else {
			conds = append(conds, c)
		}
	}
	if e.Reason != "" {
		cond := status.Condition{Type: v1beta1.ConditionSignaturesExpiring, Status: metav1.ConditionTrue, Reason: e.Reason,
			Message: e.Message, ObservedGeneration: nc.Generation, LastTransitionTime: now}
		if old != nil && old.Status == cond.Status {
			cond.LastTransitionTime = old.LastTransitionTime
		}
		conds = append(conds, cond)
	}
	nc.Status.Conditions = conds
	return e.Reason != "" && (old == nil || old.Message != e.Message)
}

func readyCondition(nc *v1beta1.SSHNodeClass) *status.Condition {
	for i := range nc.Status.Conditions {
		if nc.Status.Conditions[i].Type == v1beta1.ConditionReady {
			return &nc.Status.Conditions[i]
		}
	}
	return nil
}

// patchStatus writes the status of nc as a compare-and-swap against orig's
// resourceVersion (merge patch with optimistic lock). An unchanged status is
// not written. A conflict comes back as an error the caller requeues on.
func patchStatus(ctx context.Context, c client.Client, orig, nc *v1beta1.SSHNodeClass) error {
	if equality.Semantic.DeepEqual(orig.Status, nc.Status) {
		return nil
	}
	return c.Status().Patch(ctx, nc, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{}))
}
