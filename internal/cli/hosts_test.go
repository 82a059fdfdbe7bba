package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/dklesev/kpssh/apis/v1beta1"
)

func TestHostTable(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	created := metav1.NewTime(now.Add(-3 * time.Hour))
	hosts := []v1beta1.SSHHost{
		*testHost("zeta", func(h *v1beta1.SSHHost) {
			h.CreationTimestamp = created
			h.Labels = nil
			h.Spec.Port = 22
			h.Status = v1beta1.SSHHostStatus{}
		}),
		*testHost("alpha", func(h *v1beta1.SSHHost) {
			h.CreationTimestamp = created
			h.Annotations = map[string]string{v1beta1.AnnotationMaintenance: ""}
			h.Status.State = v1beta1.HostInUse
			h.Status.ClaimRef = &v1beta1.ClaimRef{Name: "claim-1", UID: "u1"}
			h.Status.InstalledProfile = "tls@2"
			h.Status.LastPhase = &v1beta1.LastPhase{Phase: v1beta1.PhaseJoin, Result: v1beta1.PhaseSucceeded, StartedAt: metav1.NewTime(now.Add(-5 * time.Minute))}
		}),
		*testHost("mid", func(h *v1beta1.SSHHost) {
			h.CreationTimestamp = created
			h.Status.State = v1beta1.HostUnhealthy
			h.Status.LastPhase = &v1beta1.LastPhase{Phase: v1beta1.PhaseInstall, Result: v1beta1.PhaseFailed, FailedTask: "install kubelet"}
		}),
		*testHost("twin", func(h *v1beta1.SSHHost) {
			h.CreationTimestamp = created
			h.ParkAsDuplicate("not probed, not claimed: same machine as host mid", metav1.NewTime(now))
			h.SetDuplicate(v1beta1.ReasonDuplicateAddress, "same machine as host mid", metav1.NewTime(now))
		}),
		*testHost("parked", func(h *v1beta1.SSHHost) {
			h.CreationTimestamp = created
			h.Annotations = map[string]string{v1beta1.AnnotationMaintenance: "true"}
			h.Status.State = v1beta1.HostMaintenance
		}),
	}
	var buf bytes.Buffer
	if err := WriteHostTable(&buf, HostRows(hosts, now), false); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"NAME     ADDRESS         CLASS     STATE                   CLAIM     INSTALLED   LAST PHASE                                AGE",
		"alpha    10.0.0.5:2222   small     InUse (maintenance)     claim-1   tls@2       join Succeeded 5m ago                     3h",
		`mid      10.0.0.5:2222   small     Unhealthy               -         -           install Failed (task "install kubelet")   3h`,
		"parked   10.0.0.5:2222   small     Maintenance             -         -           -                                         3h",
		"twin     10.0.0.5:2222   small     Unhealthy (duplicate)   -         -           -                                         3h",
		"zeta     10.0.0.5        default   Pending                 -         -           -                                         3h",
		"",
		"5 host(s): 1 InUse, 1 Maintenance, 1 Pending, 2 Unhealthy",
	}
	if got := strings.TrimRight(buf.String(), "\n"); got != strings.Join(want, "\n") {
		t.Errorf("table:\n%s\nwant:\n%s", got, strings.Join(want, "\n"))
	}

	// -o wide: the same columns, then user, node address, arch, capacity,
	// exec mode, host key.
	hosts[1].Spec.NodeAddress = "192.0.2.7"
	hosts[1].Spec.ExecMode = v1beta1.ExecModeVerified
	buf.Reset()
	if err := WriteHostTable(&buf, HostRows(hosts, now), true); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(buf.String(), "\n")
	if !strings.HasPrefix(lines[0], "NAME     ADDRESS         CLASS     STATE                   CLAIM     INSTALLED   LAST PHASE                                AGE   USER   NODE ADDRESS   ARCH    CPU   MEMORY   EXEC MODE   HOST KEY") ||
		!strings.HasSuffix(lines[1], "3h    kube   192.0.2.7      amd64   4     8Gi      Verified    SHA256:abc") ||
		!strings.HasSuffix(lines[5], "3h    kube   10.0.0.5       -       4     8Gi      -           -") ||
		lines[7] != "5 host(s): 1 InUse, 1 Maintenance, 1 Pending, 2 Unhealthy" {
		t.Errorf("wide table:\n%s", buf.String())
	}
}

// A phase that is running shows the task it is at (lastPhase.currentTask).
func TestHostTableRunningPhase(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	h := testHost("h1", func(h *v1beta1.SSHHost) {
		h.CreationTimestamp = metav1.NewTime(now.Add(-time.Hour))
		h.Status.State = v1beta1.HostClaimed
		h.Status.ClaimRef = &v1beta1.ClaimRef{Name: "claim-1", UID: "u1"}
		h.Status.LastPhase = &v1beta1.LastPhase{Phase: v1beta1.PhaseInstall, Result: v1beta1.PhaseRunning,
			CurrentTask: "tls_bootstrap : Write the binaries", StartedAt: metav1.NewTime(now.Add(-40 * time.Second))}
	})
	rows := HostRows([]v1beta1.SSHHost{*h}, now)
	if want := `install Running (at task "tls_bootstrap : Write the binaries") 40s ago`; rows[0].LastPhase != want {
		t.Errorf("last phase %q, want %q", rows[0].LastPhase, want)
	}
}

func TestMaintain(t *testing.T) {
	claim := &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: "claim-1", UID: "uid-1"}}
	successor := &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: "claim-2", UID: "uid-new"}}
	claimed := func(name string, uid types.UID) func(*v1beta1.SSHHost) {
		return func(h *v1beta1.SSHHost) {
			h.Status.State = v1beta1.HostInUse
			h.Status.ClaimRef = &v1beta1.ClaimRef{Name: name, UID: uid}
		}
	}
	parked := func(h *v1beta1.SSHHost) { h.Annotations = map[string]string{v1beta1.AnnotationMaintenance: "yes"} }
	cases := []struct {
		name       string
		host       *v1beta1.SSHHost
		o          MaintenanceOptions
		out        []string
		annotated  bool
		claimsLeft []string
		err        string
	}{
		{name: "on, free host", host: testHost("h"), o: MaintenanceOptions{On: true},
			out: []string{"maintenance annotation set", "not claimed"}, annotated: true, claimsLeft: []string{"claim-1", "claim-2"}},
		{name: "on, claimed, no evict", host: testHost("h", claimed("claim-1", "uid-1")), o: MaintenanceOptions{On: true},
			out: []string{"maintenance annotation set", "still claimed by NodeClaim claim-1"}, annotated: true, claimsLeft: []string{"claim-1", "claim-2"}},
		{name: "on, claimed, evict", host: testHost("h", claimed("claim-1", "uid-1")), o: MaintenanceOptions{On: true, Evict: true},
			out: []string{"maintenance annotation set", "NodeClaim claim-1 deleted"}, annotated: true, claimsLeft: []string{"claim-2"}},
		{name: "evict fenced by uid", host: testHost("h", claimed("claim-2", "uid-old")), o: MaintenanceOptions{On: true, Evict: true},
			out: []string{"maintenance annotation set", "is another object"}, annotated: true, claimsLeft: []string{"claim-1", "claim-2"}},
		{name: "evict, claim gone", host: testHost("h", claimed("claim-9", "uid-9")), o: MaintenanceOptions{On: true, Evict: true},
			out: []string{"maintenance annotation set", "already gone"}, annotated: true, claimsLeft: []string{"claim-1", "claim-2"}},
		{name: "on twice keeps the value", host: testHost("h", parked), o: MaintenanceOptions{On: true},
			out: []string{"already annotated", "not claimed"}, annotated: true, claimsLeft: []string{"claim-1", "claim-2"}},
		{name: "off", host: testHost("h", parked), o: MaintenanceOptions{},
			out: []string{"maintenance annotation removed"}, claimsLeft: []string{"claim-1", "claim-2"}},
		{name: "off, not parked", host: testHost("h"), o: MaintenanceOptions{},
			out: []string{"not in maintenance"}, claimsLeft: []string{"claim-1", "claim-2"}},
		{name: "off rebuilt", host: testHost("h", parked, func(h *v1beta1.SSHHost) { h.Status.InstalledProfile = "p@1" }), o: MaintenanceOptions{Rebuilt: true},
			out: []string{"maintenance annotation removed", "install marker and pinned host key cleared"}, claimsLeft: []string{"claim-1", "claim-2"}},
		{name: "unknown host", host: testHost("other"), o: MaintenanceOptions{On: true}, err: "no SSHHost h in namespace pool-ns"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithStatusSubresource(&v1beta1.SSHHost{}).
				WithObjects(tc.host, claim.DeepCopy(), successor.DeepCopy()).Build()
			tc.o.Namespace, tc.o.Host = ns, "h"
			lines, err := Maintain(context.Background(), c, tc.o)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || ExitCode(err) != ExitUsage {
					t.Fatalf("err %v (exit %d), want %q", err, ExitCode(err), tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(lines) != len(tc.out) {
				t.Fatalf("lines %q, want %q", lines, tc.out)
			}
			for i, l := range lines {
				if !strings.Contains(l, tc.out[i]) {
					t.Errorf("line %d %q, want %q", i, l, tc.out[i])
				}
			}
			var h v1beta1.SSHHost
			if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "h"}, &h); err != nil {
				t.Fatal(err)
			}
			if h.InMaintenance() != tc.annotated {
				t.Errorf("annotated %v, want %v", h.InMaintenance(), tc.annotated)
			}
			if tc.name == "on twice keeps the value" && h.Annotations[v1beta1.AnnotationMaintenance] != "yes" {
				t.Errorf("annotation value overwritten: %q", h.Annotations[v1beta1.AnnotationMaintenance])
			}
			if tc.o.Rebuilt && (h.Status.InstalledProfile != "" || h.Status.HostKeyFingerprint != "") {
				t.Errorf("status not cleared: %+v", h.Status)
			}
			var list karpv1.NodeClaimList
			if err := c.List(context.Background(), &list); err != nil {
				t.Fatal(err)
			}
			var left []string
			for _, nc := range list.Items {
				left = append(left, nc.Name)
			}
			if strings.Join(left, ",") != strings.Join(tc.claimsLeft, ",") {
				t.Errorf("NodeClaims left %v, want %v", left, tc.claimsLeft)
			}
		})
	}
}
