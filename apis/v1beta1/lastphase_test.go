package v1beta1_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/dklesev/kpssh/apis/v1beta1"
)

// InterruptPhase ends only a Running record, keeps where it was in the
// message, and keeps the message within its MaxLength whatever the task.
func TestInterruptPhase(t *testing.T) {
	rec := func(r v1beta1.PhaseResult, task string) *v1beta1.SSHHost {
		h := &v1beta1.SSHHost{}
		h.Status.LastPhase = &v1beta1.LastPhase{Phase: v1beta1.PhaseJoin, Result: r, CurrentTask: task, Message: "as it was"}
		return h
	}
	h := rec(v1beta1.PhaseRunning, "start kubelet")
	h.InterruptPhase("interrupted: released")
	if lp := h.Status.LastPhase; lp.Result != v1beta1.PhaseInterrupted || lp.CurrentTask != "" || lp.Message != `interrupted: released (it was at task "start kubelet")` {
		t.Fatalf("running → %+v", lp)
	}
	for _, r := range []v1beta1.PhaseResult{v1beta1.PhaseSucceeded, v1beta1.PhaseFailed, v1beta1.PhaseTimedOut, v1beta1.PhaseRejected} {
		h := rec(r, "")
		h.InterruptPhase("interrupted: released")
		if lp := h.Status.LastPhase; lp.Result != r || lp.Message != "as it was" {
			t.Errorf("%s was changed: %+v", r, lp)
		}
	}
	(&v1beta1.SSHHost{}).InterruptPhase("no record: nothing to do")
	// 1024 bytes of a task that %q quadruples, ending in a multi-byte rune.
	h = rec(v1beta1.PhaseRunning, strings.Repeat("\x01", 1020)+"é")
	h.InterruptPhase(strings.Repeat("w", 200))
	if m := h.Status.LastPhase.Message; len(m) > 4096 || !utf8.ValidString(m) || !strings.HasPrefix(m, strings.Repeat("w", 200)) {
		t.Fatalf("message %d bytes, valid UTF-8 %v", len(m), utf8.ValidString(m))
	}
}
