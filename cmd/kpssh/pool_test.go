package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/cli"
)

// sshKeygen makes a real key pair with the machine's ssh-keygen; pass ""
// for an unencrypted key.
func sshKeygen(t *testing.T, passphrase string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "id_ed25519")
	out, code, err := execBounded(t, time.Minute, os.Environ(), "ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-C", "pool", "-f", p)
	if err != nil || code != 0 {
		t.Fatalf("ssh-keygen: exit %d, %v: %s", code, err, out)
	}
	return p
}

func testClaim(name string) *karpv1.NodeClaim {
	return &karpv1.NodeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: karpv1.NodeClaimSpec{
			NodeClassRef: &karpv1.NodeClassReference{Group: v1beta1.Group, Kind: "SSHNodeClass", Name: "pool"},
			Requirements: []karpv1.NodeSelectorRequirementWithMinValues{{Key: karpv1.CapacityTypeLabelKey, Operator: corev1.NodeSelectorOpIn, Values: []string{"on-demand"}}},
		},
	}
}

// TestPoolCommandsBinary runs the built kpssh against the real apiserver:
// import-inventory's manifests (with a real ssh-keygen key) pass the CRD
// validation through kubectl apply; hosts shows the pool; maintenance parks,
// evicts (fenced by UID), hands back and clears a rebuilt host's status;
// `kubectl kpssh` finds the binary as a kubectl plugin.
func TestPoolCommandsBinary(t *testing.T) {
	if env == nil {
		t.Skip("-short: needs the envtest kube-apiserver (and builds the binary)")
	}
	const pool = "pool-e2e"
	bin := buildBinary(t)
	ctx := context.Background()
	mustCreate(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: pool}})
	home := t.TempDir()
	environ := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + home, "POOL_NAMESPACE=" + pool, "KUBECONFIG=" + env.Kubeconfig}
	kpssh := func(t *testing.T, wantCode int, args ...string) (string, string) {
		t.Helper()
		stdout, stderr, code, err := execSplit(time.Minute, environ, bin, args...)
		if err != nil || code != wantCode {
			t.Fatalf("kpssh %q: exit %d (want %d), %v\nstdout:\n%s\nstderr:\n%s", args, code, wantCode, err, stdout, stderr)
		}
		return stdout, stderr
	}

	// import-inventory | kubectl apply: the apiserver accepts every manifest.
	inv := filepath.Join(t.TempDir(), "pool.ini")
	text := "[all:vars]\nkpssh_capacity_cpu=2\nkpssh_capacity_memory=4Gi\n\n[big]\nbig[01:03] ansible_port=2222\n\n[big:vars]\nkpssh_capacity_cpu=8\n\n[sbc]\npi-a ansible_host=192.0.2.50 ansible_user=pi kpssh_capacity_nvidia_com_gpu=1\n"
	if err := os.WriteFile(inv, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	manifests, _ := kpssh(t, cli.ExitOK, "import-inventory", "--key-file", sshKeygen(t, ""), inv)
	mf := filepath.Join(t.TempDir(), "pool.yaml")
	if err := os.WriteFile(mf, []byte(manifests), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := env.Kubectl(ctx, "apply", "-f", mf); err != nil {
		t.Fatalf("kubectl apply: %v", err)
	} else if !strings.Contains(out, "secret/kpssh-ssh-key created") || !strings.Contains(out, "sshhost.karpenter.dklesev.github.io/big02 created") {
		t.Fatalf("kubectl apply: %s", out)
	}
	var hosts v1beta1.SSHHostList
	if err := env.Client.List(ctx, &hosts, client.InNamespace(pool)); err != nil {
		t.Fatal(err)
	}
	if len(hosts.Items) != 4 {
		t.Fatalf("%d hosts after apply", len(hosts.Items))
	}
	for _, h := range hosts.Items {
		if h.Spec.SSHKeySecretRef.Name != "kpssh-ssh-key" {
			t.Errorf("%s: key ref %q", h.Name, h.Spec.SSHKeySecretRef.Name)
		}
	}
	var sec corev1.Secret
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: pool, Name: "kpssh-ssh-key"}, &sec); err != nil || !strings.Contains(string(sec.Data["privateKey"]), "OPENSSH PRIVATE KEY") {
		t.Fatalf("key Secret: %v", err)
	}
	// An encrypted key is refused (the controller has no passphrase).
	if _, stderr := kpssh(t, cli.ExitUsage, "import-inventory", "--key-file", sshKeygen(t, "secret-passphrase"), inv); !strings.Contains(stderr, "passphrase-protected") {
		t.Errorf("encrypted key: %s", stderr)
	}

	// Statuses as the controller would write them.
	claim := testClaim("pool-claim")
	mustCreate(t, claim)
	setStatus := func(name string, mut func(*v1beta1.SSHHost)) {
		t.Helper()
		var h v1beta1.SSHHost
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: pool, Name: name}, &h); err != nil {
			t.Fatal(err)
		}
		mut(&h)
		if err := env.Client.Status().Update(ctx, &h); err != nil {
			t.Fatal(err)
		}
	}
	setStatus("big01", func(h *v1beta1.SSHHost) {
		h.SetState(v1beta1.HostAvailable, "probed", metav1.Now())
		h.Status.InstalledProfile = "tls@3"
		h.Status.HostKeyFingerprint = "SHA256:abc"
	})
	setStatus("big02", func(h *v1beta1.SSHHost) {
		h.SetState(v1beta1.HostInUse, "joined", metav1.Now())
		h.Status.ClaimRef = &v1beta1.ClaimRef{Name: claim.Name, UID: claim.UID}
		h.Status.InstalledProfile = "tls@3"
		h.Status.LastPhase = &v1beta1.LastPhase{Phase: v1beta1.PhaseJoin, Result: v1beta1.PhaseSucceeded, StartedAt: metav1.Now()}
	})
	setStatus("big03", func(h *v1beta1.SSHHost) {
		h.SetState(v1beta1.HostUnhealthy, "failed", metav1.Now())
		h.Status.LastPhase = &v1beta1.LastPhase{Phase: v1beta1.PhaseInstall, Result: v1beta1.PhaseFailed, FailedTask: "fetch kubelet", StartedAt: metav1.Now()}
	})

	out, _ := kpssh(t, cli.ExitOK, "hosts")
	checks := []struct {
		host string
		want []string // ADDRESS CLASS STATE… prefix after the name
	}{
		{"big01", []string{"big01:2222", "big", "Available", "-", "tls@3", "-"}},
		{"big02", []string{"big02:2222", "big", "InUse", "pool-claim", "tls@3", "join", "Succeeded"}},
		{"big03", []string{"big03:2222", "big", "Unhealthy", "-", "-", "install", "Failed", "(task", `"fetch`, `kubelet")`}},
		{"pi-a", []string{"192.0.2.50", "sbc", "Pending", "-", "-", "-"}},
	}
	for _, c := range checks {
		f := fields(out, c.host)
		if len(f) < len(c.want)+1 || strings.Join(f[1:len(c.want)+1], " ") != strings.Join(c.want, " ") {
			t.Errorf("hosts row of %s: %q, want %q…\n%s", c.host, f, c.want, out)
		}
	}
	if !strings.HasPrefix(out, "NAME ") || !strings.Contains(out, "4 host(s): 1 Available, 1 InUse, 1 Pending, 1 Unhealthy") {
		t.Errorf("hosts:\n%s", out)
	}
	if out, _ := kpssh(t, cli.ExitOK, "hosts", "-l", v1beta1.LabelHostClass+"=sbc"); fields(out, "pi-a") == nil || fields(out, "big01") != nil {
		t.Errorf("hosts -l:\n%s", out)
	}

	// kubectl finds kubectl-kpssh on PATH as a plugin.
	plugDir := t.TempDir()
	if err := os.Symlink(bin, filepath.Join(plugDir, "kubectl-kpssh")); err != nil {
		t.Fatal(err)
	}
	plugEnv := append([]string{"PATH=" + plugDir + ":" + os.Getenv("PATH")}, environ[1:]...)
	if stdout, stderr, code, err := execSplit(time.Minute, plugEnv, "kubectl", "kpssh", "hosts"); err != nil || code != 0 || fields(stdout, "big02") == nil {
		t.Errorf("kubectl kpssh hosts: exit %d, %v\n%s%s", code, err, stdout, stderr)
	}

	annotated := func(name string) (bool, v1beta1.SSHHost) {
		t.Helper()
		var h v1beta1.SSHHost
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: pool, Name: name}, &h); err != nil {
			t.Fatal(err)
		}
		return h.InMaintenance(), h
	}
	claimExists := func() bool {
		err := env.Client.Get(ctx, client.ObjectKey{Name: claim.Name}, &karpv1.NodeClaim{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		return err == nil
	}

	// on without --evict parks but keeps the claim.
	out, _ = kpssh(t, cli.ExitOK, "maintenance", "on", "big02")
	if on, _ := annotated("big02"); !on || !claimExists() || !strings.Contains(out, "still claimed by NodeClaim pool-claim") {
		t.Fatalf("maintenance on: annotated %v, claim exists %v\n%s", on, claimExists(), out)
	}
	if out, _ := kpssh(t, cli.ExitOK, "hosts"); !strings.Contains(strings.Join(fields(out, "big02"), " "), "InUse (maintenance)") {
		t.Errorf("hosts after on:\n%s", out)
	}
	// --evict deletes the NodeClaim.
	out, _ = kpssh(t, cli.ExitOK, "maintenance", "on", "--evict", "big02")
	if claimExists() || !strings.Contains(out, "NodeClaim pool-claim deleted") {
		t.Fatalf("evict: claim exists %v\n%s", claimExists(), out)
	}
	// A NodeClaim of the same name but another UID is not the host's.
	mustCreate(t, testClaim("pool-claim"))
	out, _ = kpssh(t, cli.ExitOK, "maintenance", "on", "--evict", "big02")
	if !claimExists() || !strings.Contains(out, "is another object") {
		t.Fatalf("fenced evict: claim exists %v\n%s", claimExists(), out)
	}
	// off --rebuilt hands a rebuilt host back with the seed's status patch.
	kpssh(t, cli.ExitOK, "maintenance", "on", "big01")
	out, _ = kpssh(t, cli.ExitOK, "maintenance", "off", "--rebuilt", "big01")
	if on, h := annotated("big01"); on || h.Status.InstalledProfile != "" || h.Status.HostKeyFingerprint != "" || h.Status.State != v1beta1.HostAvailable {
		t.Fatalf("off --rebuilt: annotated %v, status %+v\n%s", on, h.Status, out)
	}

	// Errors: unknown host (2), bad usage (2), unreachable API (1).
	for _, tc := range []struct {
		code   int
		args   []string
		stderr string
	}{
		{cli.ExitUsage, []string{"maintenance", "on", "nope"}, "no SSHHost nope in namespace pool-e2e"},
		{cli.ExitUsage, []string{"maintenance", "sideways", "big01"}, "want on|off HOST"},
		{cli.ExitUsage, []string{"maintenance", "on", "--rebuilt", "big01"}, "--rebuilt goes with off"},
		{cli.ExitUsage, []string{"hosts", "-l", "a in (("}, "-l:"},
		{cli.ExitRuntime, []string{"hosts", "--kubeconfig", unreachableKubeconfig(t), "--timeout", "20s"}, "connection refused"},
		{cli.ExitRuntime, []string{"maintenance", "on", "--kubeconfig", unreachableKubeconfig(t), "--timeout", "20s", "big01"}, "connection refused"},
	} {
		_, stderr := kpssh(t, tc.code, tc.args...)
		if !strings.Contains(stderr, tc.stderr) {
			t.Errorf("%q: stderr %q, want %q", tc.args, stderr, tc.stderr)
		}
	}
}
