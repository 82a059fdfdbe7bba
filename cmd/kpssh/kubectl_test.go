package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/cli"
)

// twoContextKubeconfig is the envtest admin kubeconfig with its context
// renamed "envtest", plus a context "elsewhere" (a loopback port nobody
// listens on) that is the current one: only --context envtest reaches the
// apiserver.
func twoContextKubeconfig(t *testing.T) string {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(env.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	admin := cfg.Contexts[cfg.CurrentContext]
	if admin == nil {
		t.Fatalf("envtest kubeconfig has no current context %q", cfg.CurrentContext)
	}
	cfg.Contexts = map[string]*clientcmdapi.Context{"envtest": admin}
	addUnreachable(t, cfg, "elsewhere")
	cfg.CurrentContext = "elsewhere"
	return writeKubeconfig(t, cfg)
}

// TestKubectlFlagsBinary runs the built kpssh against the real apiserver
// with kubectl's flags: --context selects among two contexts, -n overrides
// $POOL_NAMESPACE, -o json|yaml|wide|name|jsonpath print the real objects,
// `kubectl kpssh hosts … -o json | jq` works, --as impersonates (RBAC
// allows the bound user and denies the others, reads and writes), and the
// shell completion — a bash script run by bash, and kubectl's plugin
// completion through kubectl_complete-kpssh — offers the subcommands and
// the pool's hosts.
func TestKubectlFlagsBinary(t *testing.T) {
	if env == nil {
		t.Skip("-short: needs the envtest kube-apiserver (and builds the binary)")
	}
	bin := buildBinary(t)
	ctx := context.Background()
	const nsA, nsB = "cli-a", "cli-b"
	mustCreate(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: nsA}}, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: nsB}})
	host := func(ns, name, addr string) *v1beta1.SSHHost {
		return &v1beta1.SSHHost{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{v1beta1.LabelHostClass: "edge"}},
			Spec: v1beta1.SSHHostSpec{Address: addr, User: "pi", SSHKeySecretRef: v1beta1.LocalObjectReference{Name: "key"},
				Capacity: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("8Gi")}},
		}
	}
	a1, a2, b1 := host(nsA, "a1", "192.0.2.21"), host(nsA, "a2", "192.0.2.22"), host(nsB, "b1", "192.0.2.31")
	mustCreate(t, a1, a2, b1)
	a1.Status.ObservedArch = "arm64"
	a1.Status.HostKeyFingerprint = "SHA256:a1-host-key"
	a1.SetState(v1beta1.HostAvailable, "probed", metav1.Now())
	if err := env.Client.Status().Update(ctx, a1); err != nil {
		t.Fatal(err)
	}

	kc := twoContextKubeconfig(t)
	plugDir := t.TempDir()
	for _, name := range []string{"kubectl-kpssh", "kubectl_complete-kpssh", "kpssh"} {
		if err := os.Symlink(bin, filepath.Join(plugDir, name)); err != nil {
			t.Fatal(err)
		}
	}
	environ := []string{"PATH=" + plugDir + ":" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "KUBECONFIG=" + kc, "POOL_NAMESPACE=" + nsB}
	run := func(t *testing.T, wantCode int, name string, args ...string) (string, string) {
		t.Helper()
		stdout, stderr, code, err := execSplit(time.Minute, environ, name, args...)
		if err != nil || code != wantCode {
			t.Fatalf("%s %q: exit %d (want %d), %v\nstdout:\n%s\nstderr:\n%s", name, args, code, wantCode, err, stdout, stderr)
		}
		return stdout, stderr
	}
	kpssh := func(t *testing.T, wantCode int, args ...string) (string, string) {
		t.Helper()
		return run(t, wantCode, bin, args...)
	}

	var fromJSON v1beta1.SSHHostList
	t.Run("--context selects, -o json is the SSHHostList", func(t *testing.T) {
		out, _ := kpssh(t, cli.ExitOK, "hosts", "--context", "envtest", "-n", nsA, "-o", "json")
		if err := json.Unmarshal([]byte(out), &fromJSON); err != nil {
			t.Fatalf("-o json does not parse: %v\n%s", err, out)
		}
		if fromJSON.APIVersion != "karpenter.dklesev.github.io/v1beta1" || fromJSON.Kind != "SSHHostList" || len(fromJSON.Items) != 2 {
			t.Fatalf("list %s/%s with %d items", fromJSON.APIVersion, fromJSON.Kind, len(fromJSON.Items))
		}
		got := fromJSON.Items[0]
		if got.Kind != "SSHHost" || got.Name != "a1" || got.UID != a1.UID || got.Spec.Address != "192.0.2.21" || got.Spec.Port != 22 ||
			got.Spec.ExecMode != v1beta1.ExecModeRaw || got.Status.HostKeyFingerprint != "SHA256:a1-host-key" || got.Status.State != v1beta1.HostAvailable {
			t.Fatalf("item 0: %+v", got)
		}
		if len(got.ManagedFields) != 0 {
			t.Error("managedFields printed without --show-managed-fields")
		}
		// without --context: the current context, which reaches nothing
		if _, stderr := kpssh(t, cli.ExitRuntime, "hosts", "-n", nsA, "-o", "json", "--timeout", "20s"); !strings.Contains(stderr, "connection refused") {
			t.Errorf("current context: %s", stderr)
		}
		if _, stderr := kpssh(t, cli.ExitUsage, "hosts", "--context", "nope"); !strings.Contains(stderr, `kpssh hosts: kubeconfig: context "nope" does not exist`) {
			t.Errorf("unknown context: %s", stderr)
		}
	})

	t.Run("-o yaml", func(t *testing.T) {
		out, _ := kpssh(t, cli.ExitOK, "hosts", "--context", "envtest", "-n", nsA, "-o", "yaml")
		var l v1beta1.SSHHostList
		if err := yaml.UnmarshalStrict([]byte(out), &l); err != nil {
			t.Fatalf("-o yaml does not parse: %v\n%s", err, out)
		}
		a, _ := json.Marshal(l.Items)
		b, _ := json.Marshal(fromJSON.Items)
		if l.Kind != "SSHHostList" || string(a) != string(b) {
			t.Fatalf("yaml and json differ:\n%s\n%s", a, b)
		}
	})

	t.Run("-o name, and -n over $POOL_NAMESPACE", func(t *testing.T) {
		if out, _ := kpssh(t, cli.ExitOK, "hosts", "--context", "envtest", "-n", nsA, "-o", "name"); out != "sshhost.karpenter.dklesev.github.io/a1\nsshhost.karpenter.dklesev.github.io/a2\n" {
			t.Errorf("-n %s -o name: %q", nsA, out)
		}
		if out, _ := kpssh(t, cli.ExitOK, "hosts", "--context", "envtest", "-o", "name"); out != "sshhost.karpenter.dklesev.github.io/b1\n" {
			t.Errorf("$POOL_NAMESPACE -o name: %q", out)
		}
		// the names are kubectl's
		names, _ := kpssh(t, cli.ExitOK, "hosts", "--context", "envtest", "-n", nsA, "-o", "name")
		out, err := env.Kubectl(ctx, append([]string{"-n", nsA, "get", "-o", "name"}, strings.Fields(names)...)...)
		if err != nil || out != names {
			t.Errorf("kubectl get %s: %v\n%s", names, err, out)
		}
	})

	t.Run("-o wide and the default table", func(t *testing.T) {
		out, _ := kpssh(t, cli.ExitOK, "hosts", "--context", "envtest", "-n", nsA, "-o", "wide")
		lines := strings.Split(out, "\n")
		if f := strings.Fields(lines[0]); strings.Join(f, " ") != "NAME ADDRESS CLASS STATE CLAIM INSTALLED LAST PHASE AGE USER NODE ADDRESS ARCH CPU MEMORY EXEC MODE HOST KEY" {
			t.Errorf("wide header %q", lines[0])
		}
		if f := fields(out, "a1"); len(f) != 15 || strings.Join(f[1:5], " ") != "192.0.2.21 edge Available -" || strings.Join(f[8:], " ") != "pi 192.0.2.21 arm64 4 8Gi Raw SHA256:a1-host-key" {
			t.Errorf("wide row of a1: %q\n%s", f, out)
		}
		if !strings.Contains(out, "\n2 host(s): 1 Available, 1 Pending\n") {
			t.Errorf("wide count:\n%s", out)
		}
		table, _ := kpssh(t, cli.ExitOK, "hosts", "--context", "envtest", "-n", nsA)
		if f := fields(table, "a1"); len(f) != 8 || !strings.HasPrefix(table, "NAME ") || strings.Contains(table, "HOST KEY") {
			t.Errorf("default table:\n%s", table)
		}
	})

	t.Run("-o jsonpath", func(t *testing.T) {
		if out, _ := kpssh(t, cli.ExitOK, "hosts", "--context", "envtest", "-n", nsA, "-o", "jsonpath={.items[*].spec.address}"); out != "192.0.2.21 192.0.2.22" {
			t.Errorf("jsonpath: %q", out)
		}
	})

	t.Run("kubectl kpssh hosts … -o json | jq", func(t *testing.T) {
		out, _ := run(t, cli.ExitOK, "bash", "-o", "pipefail", "-c", "kubectl kpssh hosts -n "+nsA+" --context envtest -o json | jq -r '.items[] | select(.kind == \"SSHHost\") | .metadata.name + \" \" + .spec.address'")
		if out != "a1 192.0.2.21\na2 192.0.2.22\n" {
			t.Errorf("jq: %q", out)
		}
	})

	t.Run("--as impersonates", func(t *testing.T) {
		mustCreate(t,
			&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: nsA, Name: "sshhost-reader"},
				Rules: []rbacv1.PolicyRule{{APIGroups: []string{v1beta1.Group}, Resources: []string{"sshhosts"}, Verbs: []string{"get", "list"}}}},
			&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: nsA, Name: "alice-reads"},
				RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "sshhost-reader"},
				Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "alice"}}},
		)
		// RBAC's cache: wait until alice may list (kubectl auth can-i asks a SubjectAccessReview).
		deadline := time.Now().Add(30 * time.Second)
		for {
			out, _ := env.Kubectl(ctx, "auth", "can-i", "list", "sshhosts."+v1beta1.Group, "-n", nsA, "--as", "alice")
			if strings.TrimSpace(out) == "yes" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("RBAC never allowed alice: %s", out)
			}
			time.Sleep(200 * time.Millisecond)
		}
		if out, _ := kpssh(t, cli.ExitOK, "hosts", "--context", "envtest", "-n", nsA, "--as", "alice", "-o", "name"); len(strings.Fields(out)) != 2 {
			t.Errorf("--as alice: %q", out)
		}
		for _, tc := range []struct {
			args []string
			want string
		}{
			{[]string{"hosts", "-n", nsA, "--as", "bob"}, `User "bob" cannot list resource "sshhosts"`},
			{[]string{"hosts", "-n", nsB, "--as", "alice"}, `User "alice" cannot list resource "sshhosts" in API group "karpenter.dklesev.github.io" in the namespace "cli-b"`},
			{[]string{"hosts", "-n", nsA, "--as", "carol", "--as-group", "kpssh-viewers"}, `User "carol" cannot list`},
			{[]string{"maintenance", "on", "a1", "-n", nsA, "--as", "alice"}, `User "alice" cannot patch resource "sshhosts"`},
		} {
			_, stderr := kpssh(t, cli.ExitRuntime, append([]string{"--context", "envtest"}, tc.args...)...)
			if !strings.Contains(stderr, tc.want) {
				t.Errorf("%q: stderr %q, want %q", tc.args, stderr, tc.want)
			}
		}
		var h v1beta1.SSHHost
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(a1), &h); err != nil || h.InMaintenance() {
			t.Fatalf("a1 after a denied maintenance on: %v, annotations %v", err, h.Annotations)
		}
	})

	t.Run("completion", func(t *testing.T) {
		script, _ := kpssh(t, cli.ExitOK, "completion", "bash")
		sf := filepath.Join(t.TempDir(), "kpssh.bash")
		if err := os.WriteFile(sf, []byte(script), 0o600); err != nil {
			t.Fatal(err)
		}
		// bash runs the script's completion function as it would on TAB,
		// with bash-completion loaded (cobra's script needs it, as kubectl's
		// does; hack/deps.sh installs it).
		const bashCompletion = "/usr/share/bash-completion/bash_completion"
		if _, err := os.Stat(bashCompletion); err != nil {
			t.Fatalf("bash-completion is not installed (make deps): %v", err)
		}
		complete := func(line string) []string {
			t.Helper()
			out, _ := run(t, cli.ExitOK, "bash", "-c", `source "$1"; source "$2"; read -ra COMP_WORDS <<< "$3"; [[ "$3" == *" " ]] && COMP_WORDS+=("")
COMP_CWORD=$((${#COMP_WORDS[@]}-1)); COMP_LINE="$3"; COMP_POINT=${#COMP_LINE}
__start_kpssh 2>/dev/null; printf '%s\n' "${COMPREPLY[@]}"`, "bash", bashCompletion, sf, line)
			return strings.Fields(out)
		}
		if got := complete("kpssh "); !slices.Contains(got, "hosts") || !slices.Contains(got, "maintenance") || !slices.Contains(got, "version") {
			t.Errorf("kpssh <TAB>: %q", got)
		}
		if got := complete("kpssh mai"); !slices.Equal(got, []string{"maintenance"}) {
			t.Errorf("kpssh mai<TAB>: %q", got)
		}
		if got := complete("kpssh maintenance on --context envtest -n " + nsA + " "); !slices.Equal(got, []string{"a1", "a2"}) {
			t.Errorf("maintenance on <TAB>: %q", got)
		}
		if got := complete("kpssh hosts --context "); !slices.Equal(got, []string{"elsewhere", "envtest"}) {
			t.Errorf("--context <TAB>: %q", got)
		}
		if got := complete("kpssh hosts --context envtest -n cli-"); !slices.Equal(got, []string{nsA, nsB}) {
			t.Errorf("-n cli-<TAB>: %q", got)
		}
		// kubectl's own completion of the plugin runs kubectl_complete-kpssh.
		out, _ := run(t, cli.ExitOK, "kubectl", "__complete", "kpssh", "")
		if !strings.Contains(out, "hosts\t") || !strings.Contains(out, "render\t") {
			t.Errorf("kubectl __complete kpssh: %s", out)
		}
		out, _ = run(t, cli.ExitOK, "kubectl", "__complete", "kpssh", "render", "--context", "envtest", "-n", nsA, "")
		if !strings.Contains(out, "a1\t192.0.2.21 Available") || !strings.Contains(out, "a2\t192.0.2.22") {
			t.Errorf("kubectl __complete kpssh render: %s", out)
		}
	})

	t.Run("version", func(t *testing.T) {
		out, _ := kpssh(t, cli.ExitOK, "version", "-o", "json")
		var v cli.VersionInfo
		if err := json.Unmarshal([]byte(out), &v); err != nil {
			t.Fatal(err)
		}
		karp, code, err := execBounded(t, time.Minute, os.Environ(), "go", "list", "-m", "-f", "{{.Version}}", "sigs.k8s.io/karpenter")
		if err != nil || code != 0 {
			t.Fatalf("go list: %v %s", err, karp)
		}
		if v.Version != testVersion || v.Commit != testCommit || v.Karpenter != strings.TrimSpace(karp) || !strings.HasPrefix(v.Go, "go1.") {
			t.Errorf("version %+v, karpenter module %s", v, karp)
		}
		if text, _ := run(t, cli.ExitOK, "kubectl", "kpssh", "version"); !strings.Contains(text, "kpssh:     "+testVersion+"\n") || !strings.Contains(text, "karpenter: "+v.Karpenter+"\n") {
			t.Errorf("kubectl kpssh version:\n%s", text)
		}
	})
}

// fields is the whitespace-split row of host in a table.
func fields(table, host string) []string {
	for _, l := range strings.Split(table, "\n") {
		if f := strings.Fields(l); len(f) > 0 && f[0] == host {
			return f
		}
	}
	return nil
}
