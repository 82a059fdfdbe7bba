package main

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/providers/token"
)

// The seed's kubectl commands (seeds/operations.md), byte for byte: the
// runbooks users already have must work against our CRDs.
const (
	seedAnnotate = `kubectl -n kpssh-system annotate sshhost host-a \
  karpenter.dklesev.github.io/maintenance=true`
	seedEvict = `claim=$(kubectl -n kpssh-system get sshhost host-a -o jsonpath='{.status.claimRef.name}')
[ -n "$claim" ] && kubectl delete nodeclaim "$claim"`
	seedGetHost    = `kubectl -n kpssh-system get sshhost host-a`
	seedUnannotate = `kubectl -n kpssh-system annotate sshhost host-a \
  karpenter.dklesev.github.io/maintenance-`
	seedStatusPatch = `kubectl -n kpssh-system patch sshhost host-a --subresource=status --type=merge \
  -p '{"status":{"installedProfile":"","hostKeyFingerprint":""}}'`
	seedTokensInFlight = `kubectl -n kpssh-system get sshhosts \
  -o custom-columns=NAME:.metadata.name,TOKEN:.status.bootstrapTokenID`
	seedTokenSecrets = `kubectl -n kube-system get secrets --field-selector type=bootstrap.kubernetes.io/token`
	seedClasses      = `kubectl -n kpssh-system get sshhosts \
  -o custom-columns=NAME:.metadata.name,\
CLASS:'.metadata.labels.karpenter\.dklesev\.github\.io/host-class',\
ARCH:.status.observedArch,STATE:.status.state,CPU:'.spec.capacity.cpu',MEM:'.spec.capacity.memory'`
	seedBumpProfile = `kubectl patch sshjoinprofile tls-bootstrap --type merge -p '{"spec":{"version":"2"}}'`
	seedWatchClaims = `kubectl get nodeclaims -o wide   # watch Drifted=true → replacement`
)

// TestSeedKubectlCommands runs the seed's commands verbatim with the
// machine's kubectl (through bash, as a user pastes them) against the real
// apiserver and checks what they print and change.
func TestSeedKubectlCommands(t *testing.T) {
	if env == nil {
		t.Skip("-short: needs the envtest kube-apiserver")
	}
	ctx := context.Background()
	const pool = v1beta1.DefaultPoolNamespace
	mustCreate(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: pool}})
	claim := testClaim("seed-claim")
	mustCreate(t, claim,
		&v1beta1.SSHJoinProfile{ObjectMeta: metav1.ObjectMeta{Name: "tls-bootstrap"}, Spec: v1beta1.SSHJoinProfileSpec{
			Version: "1", Scripts: &v1beta1.ProfileScripts{Install: "true\n", Join: "true\n", Leave: "true\n"}}})
	host := func(name, addr, class, cpu, mem string) *v1beta1.SSHHost {
		return &v1beta1.SSHHost{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: pool, Labels: map[string]string{v1beta1.LabelHostClass: class}},
			Spec: v1beta1.SSHHostSpec{Address: addr, SSHKeySecretRef: v1beta1.LocalObjectReference{Name: "k"},
				Capacity: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(mem)}},
		}
	}
	a, b := host("host-a", "10.0.0.11", "big", "8", "32Gi"), host("host-b", "10.0.0.12", "small", "2", "4Gi")
	mustCreate(t, a, b)
	a.SetState(v1beta1.HostInUse, "joined", metav1.Now())
	a.Status.ClaimRef = &v1beta1.ClaimRef{Name: claim.Name, UID: claim.UID}
	a.Status.ObservedArch, a.Status.InstalledProfile, a.Status.HostKeyFingerprint = "amd64", "tls-bootstrap@1", "SHA256:pinned"
	b.SetState(v1beta1.HostClaimed, "claimed", metav1.Now())
	b.Status.ObservedArch, b.Status.BootstrapTokenID = "arm64", "abc123"
	for _, h := range []*v1beta1.SSHHost{a, b} {
		if err := env.Client.Status().Update(ctx, h); err != nil {
			t.Fatal(err)
		}
	}
	// One of the provider's token Secrets and an unrelated Secret.
	mustCreate(t, token.Secret(token.Token{ID: "abc123", Secret: "0123456789abcdef"}, "seed-claim-b", time.Now()),
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "not-a-token"}, StringData: map[string]string{"x": "y"}})

	environ := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "KUBECONFIG=" + env.Kubeconfig}
	run := func(t *testing.T, script string, wantCode int) string {
		t.Helper()
		stdout, stderr, code, err := execSplit(time.Minute, environ, "bash", "-c", script)
		if err != nil || code != wantCode {
			t.Fatalf("%s\nexit %d (want %d), %v\nstdout:\n%s\nstderr:\n%s", script, code, wantCode, err, stdout, stderr)
		}
		return stdout
	}
	get := func(name string) v1beta1.SSHHost {
		t.Helper()
		var h v1beta1.SSHHost
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: pool, Name: name}, &h); err != nil {
			t.Fatal(err)
		}
		return h
	}
	// lines splits a table into rows of fields.
	lines := func(out string) [][]string {
		var rows [][]string
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			rows = append(rows, strings.Fields(l))
		}
		return rows
	}
	wantTable := func(t *testing.T, out string, want ...string) {
		t.Helper()
		rows := lines(out)
		if len(rows) != len(want) {
			t.Fatalf("%d rows, want %d:\n%s", len(rows), len(want), out)
		}
		for i, r := range rows {
			if strings.Join(r, " ") != want[i] {
				t.Errorf("row %d: %q, want %q\n%s", i, strings.Join(r, " "), want[i], out)
			}
		}
	}

	// Tokens in flight, then the token Secrets (only the bootstrap type).
	wantTable(t, run(t, seedTokensInFlight, 0), "NAME TOKEN", "host-a <none>", "host-b abc123")
	out := run(t, seedTokenSecrets, 0)
	if rows := lines(out); len(rows) != 2 || rows[1][0] != "bootstrap-token-abc123" || rows[1][1] != "bootstrap.kubernetes.io/token" || strings.Contains(out, "not-a-token") {
		t.Errorf("token secrets:\n%s", out)
	}
	// What karpenter sees per class.
	wantTable(t, run(t, seedClasses, 0), "NAME CLASS ARCH STATE CPU MEM", "host-a big amd64 InUse 8 32Gi", "host-b small arm64 Claimed 2 4Gi")

	// Maintenance: park, evict through the NodeClaim, look, hand back.
	if out := run(t, seedAnnotate, 0); !strings.Contains(out, "sshhost.karpenter.dklesev.github.io/host-a annotated") {
		t.Errorf("annotate: %s", out)
	}
	if h := get("host-a"); h.Annotations[v1beta1.AnnotationMaintenance] != "true" {
		t.Errorf("annotation: %v", h.Annotations)
	}
	if out := run(t, seedEvict, 0); !strings.Contains(out, `nodeclaim.karpenter.sh "seed-claim" deleted`) {
		t.Errorf("evict: %s", out)
	}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: claim.Name}, &karpv1.NodeClaim{}); !apierrors.IsNotFound(err) {
		t.Errorf("NodeClaim after the seed's delete: %v", err)
	}
	// The probe moves a parked, unclaimed host to Maintenance; this test
	// has no controller, so it writes what the controller would.
	a = ptr(get("host-a"))
	a.Status.ClaimRef = nil
	a.SetState(v1beta1.HostMaintenance, "parked", metav1.Now())
	if err := env.Client.Status().Update(ctx, a); err != nil {
		t.Fatal(err)
	}
	out = run(t, seedGetHost, 0)
	rows := lines(out)
	// The seed's table: NAME ADDRESS CLASS STATE CLAIM INSTALLED (then the
	// CRD's READY and AGE), CLAIM empty.
	hdr, row, _ := strings.Cut(out, "\n")
	claimCol := strings.Index(hdr, "CLAIM")
	if len(rows) != 2 || !strings.HasPrefix(strings.Join(rows[0], " "), "NAME ADDRESS CLASS STATE CLAIM INSTALLED") ||
		strings.Join(rows[1][:5], " ") != "host-a 10.0.0.11 big Maintenance tls-bootstrap@1" ||
		claimCol < 0 || len(row) <= claimCol || row[claimCol] != ' ' {
		t.Errorf("get sshhost:\n%s", out)
	}
	// Nothing to evict any more: the seed's guard skips the delete (exit 1
	// of the test, as in a shell).
	run(t, seedEvict, 1)
	if out := run(t, seedUnannotate, 0); !strings.Contains(out, "host-a annotated") || ptr(get("host-a")).InMaintenance() {
		t.Errorf("un-annotate: %s", out)
	}
	// Rebuilt host: the status patch clears marker and fingerprint only.
	if out := run(t, seedStatusPatch, 0); !strings.Contains(out, "sshhost.karpenter.dklesev.github.io/host-a patched") {
		t.Errorf("status patch: %s", out)
	}
	if h := get("host-a"); h.Status.InstalledProfile != "" || h.Status.HostKeyFingerprint != "" || h.Status.ObservedArch != "amd64" || h.Status.State != v1beta1.HostMaintenance {
		t.Errorf("status after patch: %+v", h.Status)
	}

	// Drift: bump the profile version, list the claims.
	if out := run(t, seedBumpProfile, 0); !strings.Contains(out, "sshjoinprofile.karpenter.dklesev.github.io/tls-bootstrap patched") {
		t.Errorf("bump: %s", out)
	}
	var p v1beta1.SSHJoinProfile
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "tls-bootstrap"}, &p); err != nil || p.Spec.Version != "2" {
		t.Errorf("profile version %q, %v", p.Spec.Version, err)
	}
	mustCreate(t, testClaim("seed-claim-2"))
	if out := run(t, seedWatchClaims, 0); !strings.Contains(out, "seed-claim-2") || !strings.HasPrefix(out, "NAME ") {
		t.Errorf("get nodeclaims -o wide:\n%s", out)
	}
}

func ptr[T any](v T) *T { return &v }
