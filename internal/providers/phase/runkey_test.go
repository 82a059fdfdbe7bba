package phase

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/engine"
)

// The run key names a Job of executor job: the same host, phase and claim
// is the same run (a restarted controller re-attaches); anything else is not.
func TestRunKey(t *testing.T) {
	host := func(name, uid string) *v1beta1.SSHHost {
		h := &v1beta1.SSHHost{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kpssh-system"}}
		if uid != "" {
			h.Status.ClaimRef = &v1beta1.ClaimRef{Name: "claim", UID: types.UID("uid-" + uid)}
		}
		return h
	}
	k := RunKey(host("h1", "a"), engine.PhaseJoin)
	if k == "" || k != RunKey(host("h1", "a"), engine.PhaseJoin) {
		t.Fatalf("key %q not stable", k)
	}
	for _, other := range []string{RunKey(host("h2", "a"), engine.PhaseJoin), RunKey(host("h1", "b"), engine.PhaseJoin), RunKey(host("h1", "a"), engine.PhaseLeave)} {
		if other == k {
			t.Errorf("%q shared by another host, claim or phase", k)
		}
	}
	if k := RunKey(host("h1", ""), engine.PhaseLeave); k != "" {
		t.Errorf("unclaimed host (zombie leave) has key %q, want none", k)
	}
}
