package pool

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dklesev/kpssh/apis/v1beta1"
)

// A release ends a phase still shown Running (its end is written under
// the claim only, so it never will be); a caller that knows the real end
// writes it after Released, in the same CAS.
func TestReleasedInterruptsRunningPhase(t *testing.T) {
	h := &v1beta1.SSHHost{}
	h.Status.ClaimRef = &v1beta1.ClaimRef{Name: "nc", UID: "u"}
	h.Status.LastPhase = &v1beta1.LastPhase{Phase: v1beta1.PhaseInstall, Result: v1beta1.PhaseRunning, CurrentTask: "unpack"}
	Released(h, v1beta1.HostAvailable, "released by NodeClaim nc", metav1.Now())
	if lp := h.Status.LastPhase; lp.Result != v1beta1.PhaseInterrupted || lp.CurrentTask != "" ||
		!strings.Contains(lp.Message, "released by NodeClaim nc") || !strings.Contains(lp.Message, `"unpack"`) {
		t.Fatalf("lastPhase after release %+v", lp)
	}
	done := &v1beta1.LastPhase{Phase: v1beta1.PhaseLeave, Result: v1beta1.PhaseSucceeded}
	h.Status.LastPhase = done.DeepCopy()
	Released(h, v1beta1.HostAvailable, "released", metav1.Now())
	if *h.Status.LastPhase != *done {
		t.Fatalf("a finished record was changed: %+v", h.Status.LastPhase)
	}
}
