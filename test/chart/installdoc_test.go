package chart

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpapis "sigs.k8s.io/karpenter/pkg/apis"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/test/testenv"
	"github.com/dklesev/kpssh/test/testexec"
)

// docBlock is one fenced code block of a doc page.
type docBlock struct {
	lang, heading, text string
	line                int
}

// notRunHere: the doc's sh blocks that do not run in TestInstallationDoc,
// by the start of their first line, and why. Each must match one block.
var notRunHere = map[string]string{
	"make images":                     "builds the images: images/runner's and images/controller's tests build them here",
	"docker buildx build":             "needs docker and a registry; images/controller's TestImageBuild builds the same Dockerfile here (TestImageCrossBuild its build stage for arm64)",
	"for c in nodepools.karpenter.sh": "hands CRDs made outside the release to it: TestHelmInstallKarpenterCRDs does that against a real apiserver",
}

// TestInstallationDoc runs docs/installation.md as a user installing into
// their own cluster would: every sh block, in the doc's order, in a shell
// with the doc's tools on PATH (the machine's kubectl, helm from
// hack/helm.sh, kpssh and kubectl-kpssh built from this checkout), against a
// real kube-apiserver that has what the doc's prerequisites ask for
// (bootstrap-token auth, kube-public/cluster-info, RBAC) and
// kube-controller-manager's namespace controller (the uninstall deletes
// namespaces). After each section the apiserver's state is
// checked; a section with commands and no check fails, as does a block
// that cannot run and is not listed in notRunHere.
func TestInstallationDoc(t *testing.T) {
	w := setup(t)
	if _, err := exec.LookPath("kubectl"); err != nil {
		t.Fatal("kubectl not found: the doc's commands need it")
	}
	blocks := readDocBlocks(t, filepath.Join(w.root, "docs", "installation.md"))

	tmp := t.TempDir()
	// The user's tools, home and working directory.
	bin := filepath.Join(tmp, "bin")
	home := filepath.Join(tmp, "home")
	work := filepath.Join(tmp, "work")
	for _, d := range []string{bin, filepath.Join(home, ".ssh"), work} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	// The test binary's own build settings: its packages are in the build cache.
	if _, stderr, err := testexec.Run(20*time.Minute, nil, "go", "build", "-C", w.root, "-o", filepath.Join(bin, "kpssh"), "./cmd/kpssh"); err != nil {
		t.Fatalf("go build ./cmd/kpssh: %v\n%s", err, stderr)
	}
	t.Logf("kpssh built in %v", time.Since(start).Round(time.Millisecond))
	for link, target := range map[string]string{filepath.Join(bin, "kubectl-kpssh"): "kpssh", filepath.Join(bin, "helm"): w.helm,
		filepath.Join(work, "charts"): filepath.Join(w.root, "charts"), filepath.Join(work, "examples"): filepath.Join(w.root, "examples")} {
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
	}
	// The apiserver, with bootstrap-token auth as the prerequisites ask.
	_, cl, kubeconfig := startAPIServer(t, map[string]string{"enable-bootstrap-token-auth": "true"})
	assets, err := testenv.Assets()
	if err != nil {
		t.Fatal(err)
	}
	stopKCM := startNamespaceController(t, filepath.Join(assets, "kube-controller-manager"), kubeconfig)
	t.Cleanup(stopKCM) // before the apiserver stops (cleanups run last-in first-out)
	ctx := context.Background()
	for _, ns := range []string{"kube-system", "kube-public"} {
		waitNamespace(t, cl, ns)
	}
	// What kubeadm leaves in a cluster: the discovery ConfigMap.
	if err := cl.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-public", Name: "cluster-info"},
		Data: map[string]string{"kubeconfig": "apiVersion: v1\nkind: Config\nclusters:\n- name: \"\"\n  cluster:\n    server: https://192.0.2.1:6443\n"}}); err != nil {
		t.Fatal(err)
	}

	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	pk, err := ssh.MarshalPrivateKey(key, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(home, ".ssh", "kpssh_ed25519"), pem.EncodeToMemory(pk), 0o600); err != nil {
		t.Fatal(err)
	}
	var ini []docBlock
	for _, b := range blocks {
		if b.lang == "ini" {
			ini = append(ini, b)
		}
	}
	if len(ini) != 1 {
		t.Fatalf("%d ini blocks in the doc, want one (the inventory.ini its commands read)", len(ini))
	}
	if err := os.WriteFile(filepath.Join(work, "inventory.ini"), []byte(ini[0].text), 0o600); err != nil {
		t.Fatal(err)
	}
	env := []string{"PATH=" + bin + ":" + os.Getenv("PATH"), "HOME=" + home, "KUBECONFIG=" + kubeconfig, "LANG=C.UTF-8",
		"HELM_CACHE_HOME=" + filepath.Join(home, ".cache", "helm"), "HELM_CONFIG_HOME=" + filepath.Join(home, ".config", "helm"), "HELM_DATA_HOME=" + filepath.Join(home, ".local", "share", "helm")}

	checks := map[string]func(t *testing.T, out string){
		"Install": func(t *testing.T, out string) {
			if !strings.Contains(out, "STATUS: deployed") {
				t.Errorf("helm install output:\n%s", out)
			}
			for _, c := range []string{"sshhosts", "sshjoinprofiles", "sshnodeclasses"} {
				waitEstablished(t, cl, c+".karpenter.dklesev.github.io")
			}
			checkKarpenterCRDs(t, cl)
			for _, n := range []string{"kpssh-bootstrappers-node-bootstrapper", "kpssh-bootstrappers-approve-nodeclient", "kpssh-nodes-renew-selfnodeclient"} {
				if err := cl.Get(ctx, client.ObjectKey{Name: n}, &rbacv1.ClusterRoleBinding{}); err != nil {
					t.Errorf("ClusterRoleBinding %s: %v", n, err)
				}
			}
			if img := deploymentImage(t, cl); img != "registry.example/kpssh/kpssh-controller:0.1.0" {
				t.Errorf("controller image %q", img)
			}
		},
		"Check the join path": func(t *testing.T, out string) {
			for _, want := range []string{"system:bootstrap:kpchk0", "system:bootstrappers:kpssh", "yes\nyes\n"} {
				if !strings.Contains(out, want) {
					t.Errorf("output lacks %q:\n%s", want, out)
				}
			}
			err := cl.Get(ctx, client.ObjectKey{Namespace: "kube-system", Name: "bootstrap-token-kpchk0"}, &corev1.Secret{})
			if !apierrors.IsNotFound(err) {
				t.Errorf("the check's token Secret: %v, want it deleted", err)
			}
			if kc, err := os.ReadFile(kubeconfig); err != nil || bytes.Contains(kc, []byte("kpssh-check")) || bytes.Contains(kc, []byte("kpchk0")) {
				t.Errorf("the check's user is left in the kubeconfig (%v):\n%s", err, kc)
			}
		},
		"Add hosts, a profile, a node class and a NodePool": func(t *testing.T, out string) {
			var hosts v1beta1.SSHHostList
			if err := cl.List(ctx, &hosts, client.InNamespace("kpssh-system")); err != nil {
				t.Fatal(err)
			}
			if len(hosts.Items) != 2 {
				t.Fatalf("%d SSHHosts in kpssh-system, want the inventory's 2", len(hosts.Items))
			}
			for _, h := range hosts.Items {
				if h.Labels["karpenter.dklesev.github.io/host-class"] != "default" || !strings.Contains(out, h.Name) {
					t.Errorf("host %s: labels %v; in kubectl kpssh hosts: %v", h.Name, h.Labels, strings.Contains(out, h.Name))
				}
			}
			if err := cl.Get(ctx, client.ObjectKey{Namespace: "kpssh-system", Name: "kpssh-ssh-key"}, &corev1.Secret{}); err != nil {
				t.Errorf("key Secret: %v", err)
			}
			for _, o := range []struct {
				obj  client.Object
				name string
			}{{&v1beta1.SSHJoinProfile{}, "tls-bootstrap"}, {&v1beta1.SSHNodeClass{}, "default"}, {&karpv1.NodePool{}, "ssh"}} {
				if err := cl.Get(ctx, client.ObjectKey{Name: o.name}, o.obj); err != nil {
					t.Errorf("%T %s: %v", o.obj, o.name, err)
				}
			}
		},
		"Upgrade": func(t *testing.T, out string) {
			if !strings.Contains(out, "has been upgraded") {
				t.Errorf("helm upgrade output:\n%s", out)
			}
			if img := deploymentImage(t, cl); img != "registry.example/kpssh/kpssh-controller:0.2.0" {
				t.Errorf("controller image after the upgrade %q (--reuse-values keeps the repository)", img)
			}
			checkKarpenterCRDs(t, cl)
		},
		"Uninstall": func(t *testing.T, out string) {
			for _, c := range []string{"sshhosts", "sshjoinprofiles", "sshnodeclasses"} {
				err := cl.Get(ctx, client.ObjectKey{Name: c + ".karpenter.dklesev.github.io"}, &apiextensionsv1.CustomResourceDefinition{})
				if !apierrors.IsNotFound(err) {
					t.Errorf("CRD %s after the uninstall: %v", c, err)
				}
			}
			for _, ns := range []string{"kpssh", "kpssh-system"} {
				if err := cl.Get(ctx, client.ObjectKey{Name: ns}, &corev1.Namespace{}); !apierrors.IsNotFound(err) {
					t.Errorf("namespace %s after the uninstall: %v", ns, err)
				}
			}
			if err := cl.Get(ctx, client.ObjectKey{Name: "kpssh-bootstrappers-node-bootstrapper"}, &rbacv1.ClusterRoleBinding{}); !apierrors.IsNotFound(err) {
				t.Errorf("bootstrap RBAC after the uninstall: %v", err)
			}
			var crbs rbacv1.ClusterRoleBindingList
			if err := cl.List(ctx, &crbs, client.MatchingLabels{"app.kubernetes.io/instance": "kpssh"}); err != nil || len(crbs.Items) != 0 {
				t.Errorf("the release's ClusterRoleBindings after the uninstall: %d, %v", len(crbs.Items), err)
			}
			checkKarpenterCRDs(t, cl) // Karpenter core's stay (resource-policy keep)
		},
	}

	// The sections in the doc's order, each run and then checked (a later
	// section changes what an earlier one made).
	type section struct {
		heading string
		blocks  []docBlock
	}
	var sections []section
	skipped := map[string]int{}
	for _, b := range blocks {
		if b.lang != "sh" {
			continue
		}
		first := strings.TrimSpace(strings.SplitN(b.text, "\n", 2)[0])
		if p, ok := skipPrefix(first); ok {
			skipped[p]++
			t.Logf("docs/installation.md:%d (%s): not run here: %s", b.line, b.heading, notRunHere[p])
			continue
		}
		if _, ok := checks[b.heading]; !ok {
			t.Fatalf("docs/installation.md:%d: a block under %q, which TestInstallationDoc has no check for: add one", b.line, b.heading)
		}
		if len(sections) == 0 || sections[len(sections)-1].heading != b.heading {
			sections = append(sections, section{heading: b.heading})
		}
		sections[len(sections)-1].blocks = append(sections[len(sections)-1].blocks, b)
	}
	for p := range notRunHere {
		if skipped[p] != 1 {
			t.Errorf("notRunHere %q matches %d blocks of the doc, want 1", p, skipped[p])
		}
	}
	seen := map[string]bool{}
	for _, sec := range sections {
		if seen[sec.heading] {
			t.Fatalf("section %q comes twice", sec.heading)
		}
		seen[sec.heading] = true
	}
	for h := range checks {
		if !seen[h] {
			t.Errorf("no block of the doc runs under %q: a stale check", h)
		}
	}
	for _, sec := range sections {
		ok := t.Run(sec.heading, func(t *testing.T) {
			var out strings.Builder
			for _, b := range sec.blocks {
				start := time.Now()
				stdout, stderr, err := runIn(work, env, 4*time.Minute, "sh", "-ex", "-c", b.text)
				t.Logf("docs/installation.md:%d in %v:\n%s%s", b.line, time.Since(start).Round(time.Millisecond), stderr, stdout)
				if err != nil {
					t.Fatalf("docs/installation.md:%d: %v", b.line, err)
				}
				out.WriteString(stdout)
			}
			checks[sec.heading](t, out.String())
		})
		if !ok {
			t.FailNow() // the later sections build on this one
		}
	}
}

func skipPrefix(line string) (string, bool) {
	for p := range notRunHere {
		if strings.HasPrefix(line, p) {
			return p, true
		}
	}
	return "", false
}

// readDocBlocks returns the fenced code blocks of a Markdown page with the
// ## heading each is under.
func readDocBlocks(t *testing.T, path string) []docBlock {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []docBlock
	var heading string
	var cur *docBlock
	s := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; s.Scan(); n++ {
		l := s.Text()
		switch {
		case cur != nil && l == "```":
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.text += l + "\n"
		case strings.HasPrefix(l, "```"):
			cur = &docBlock{lang: strings.TrimPrefix(l, "```"), heading: heading, line: n}
		case strings.HasPrefix(l, "## "):
			heading = strings.TrimPrefix(l, "## ")
		}
	}
	if cur != nil {
		t.Fatalf("%s:%d: unclosed code block", path, cur.line)
	}
	return out
}

// checkKarpenterCRDs: Karpenter core's CRDs are there as the release made
// them (karpenterCRDs.install on, the default on a cluster without its own
// Karpenter): Established, owned by release kpssh/kpssh, and kept by Helm
// (helm.sh/resource-policy keep) so an uninstall never deletes every
// NodePool and NodeClaim with them. TestHelmInstallKarpenterCRDs covers a
// cluster with its own.
func checkKarpenterCRDs(t *testing.T, cl client.Client) {
	t.Helper()
	for _, c := range karpapis.CRDs {
		waitEstablished(t, cl, c.Name)
		var got apiextensionsv1.CustomResourceDefinition
		if err := cl.Get(context.Background(), client.ObjectKey{Name: c.Name}, &got); err != nil {
			t.Errorf("CRD %s: %v", c.Name, err)
		} else if a := got.Annotations; a["helm.sh/resource-policy"] != "keep" || a["meta.helm.sh/release-name"] != "kpssh" || a["meta.helm.sh/release-namespace"] != "kpssh" {
			t.Errorf("CRD %s: annotations %v, want the release kpssh/kpssh's with resource-policy keep", c.Name, a)
		}
	}
}

func deploymentImage(t *testing.T, cl client.Client) string {
	t.Helper()
	var d appsv1.Deployment
	if err := cl.Get(context.Background(), client.ObjectKey{Namespace: "kpssh", Name: "kpssh"}, &d); err != nil {
		t.Fatal(err)
	}
	return d.Spec.Template.Spec.Containers[0].Image
}

// runIn runs a command in dir with env, in its own process group, killed as a
// group at the timeout and reaped.
func runIn(dir string, env []string, d time.Duration, name string, args ...string) (stdout, stderr string, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	c := testexec.Command(ctx, name, args...)
	c.Dir, c.Env = dir, env
	return testexec.Output(ctx, c)
}

// startNamespaceController runs kube-controller-manager with the namespace
// controller only (namespaces are deleted with their content); the returned
// func kills it by its process group and reaps it.
func startNamespaceController(t *testing.T, bin, kubeconfig string) func() {
	t.Helper()
	logf, err := os.Create(filepath.Join(t.TempDir(), "kcm.log"))
	if err != nil {
		t.Fatal(err)
	}
	kcm := exec.Command(bin, "--kubeconfig="+kubeconfig, "--controllers=namespace", "--leader-elect=false",
		"--secure-port=0", "--use-service-account-credentials=false")
	kcm.Stdout, kcm.Stderr = logf, logf
	kcm.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := kcm.Start(); err != nil {
		t.Fatalf("kube-controller-manager (hack/k8s-bins.sh builds it): %v", err)
	}
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		_ = kcm.Wait()
		logf.Close()
	}()
	return func() {
		_ = syscall.Kill(-kcm.Process.Pid, syscall.SIGKILL)
		<-exited
	}
}
