package host

import (
	"fmt"
	"io"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/probe"
	"github.com/dklesev/kpssh/internal/sshx/sshtest"
)

// A Verified host stored before the CRD validated spec.shimCommand (the fake
// client validates nothing, like such an object): the real probe.Run against
// a real SSH server refuses it before any command, and the controller parks
// the host Unhealthy with lastProbeError naming the field and its rule.
func TestInvalidShimCommandIsAProbeErrorAndRunsNothing(t *testing.T) {
	srv := sshtest.Start(t, func(cmd string, _ io.Reader, stdout, _ io.Writer) int {
		fmt.Fprint(stdout, "nproc=2\nmemtotal_kb=2048000\narch=x86_64\nkubelet=inactive\n")
		return 0
	})
	for _, tc := range []struct {
		shimCommand string
		want        v1beta1.HostState
	}{
		{"/usr/local/bin/kpssh-shim; touch /tmp/pwned", v1beta1.HostUnhealthy},
		{"$(touch /tmp/pwned) kpssh-shim", v1beta1.HostUnhealthy},
		{"sudo -n /usr/local/sbin/kpssh-shim", v1beta1.HostAvailable},
	} {
		t.Run(tc.shimCommand, func(t *testing.T) {
			before := len(srv.Executed())
			w := newWorld(t, nil,
				&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "srv-key", Namespace: ns}, Data: map[string][]byte{"privateKey": srv.ClientKey}},
				newHost("h1", func(h *v1beta1.SSHHost) {
					h.Spec.Address, h.Spec.Port, h.Spec.SSHKeySecretRef.Name = srv.Host, srv.Port, "srv-key"
					h.Spec.ExecMode, h.Spec.ShimCommand = v1beta1.ExecModeVerified, tc.shimCommand
				}))
			w.ctrl.Prober = probe.Run
			w.reconcile(t, "h1")
			h := w.host(t, "h1")
			ran := srv.Executed()[before:]
			if h.Status.State != tc.want {
				t.Fatalf("state %s (lastProbeError %q, ran %q), want %s", h.Status.State, h.Status.LastProbeError, ran, tc.want)
			}
			if tc.want == v1beta1.HostAvailable {
				if len(ran) != 1 || ran[0] != tc.shimCommand+" probe" {
					t.Fatalf("ran %q, want the shim's probe op", ran)
				}
				return
			}
			if len(ran) != 0 {
				t.Fatalf("ran %q on the host", ran)
			}
			if !strings.Contains(h.Status.LastProbeError, "spec.shimCommand") || !strings.Contains(h.Status.LastProbeError, probe.ShimCommandPattern) {
				t.Fatalf("lastProbeError %q does not name spec.shimCommand and its pattern", h.Status.LastProbeError)
			}
		})
	}
}
