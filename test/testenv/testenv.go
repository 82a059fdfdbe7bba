// Package testenv starts a real kube-apiserver and etcd (envtest, with the
// binaries hack/k8s-bins.sh builds from the module proxy) and installs
// Karpenter's CRDs and ours. Start one per package from TestMain and share it,
// as cluster-api does: a start costs seconds, a test should not.
package testenv

import (
	"context"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	karpapis "sigs.k8s.io/karpenter/pkg/apis"
	_ "sigs.k8s.io/karpenter/pkg/apis/v1" // registers NodePool/NodeClaim in the global scheme
	"sigs.k8s.io/yaml"

	"github.com/dklesev/kpssh/apis/crds"
	_ "github.com/dklesev/kpssh/apis/v1beta1" // registers our kinds in the global scheme
)

// Env is a running control plane.
type Env struct {
	Config     *rest.Config
	Client     client.Client
	Scheme     *runtime.Scheme
	Kubeconfig string // path to an admin kubeconfig (for kubectl)
	AssetsDir  string
	env        *envtest.Environment
	tmp        string
}

// RepoRoot walks up from the working directory to the directory holding go.mod.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && strings.Contains(string(b), "module github.com/dklesev/kpssh\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("go.mod of github.com/dklesev/kpssh not found above the working directory")
		}
		dir = parent
	}
}

// Assets returns the directory with kube-apiserver and etcd: $KUBEBUILDER_ASSETS,
// or what hack/k8s-bins.sh builds (instant when cached). A missing binary is an
// error, never a skip: in CI everything is installed.
func Assets() (string, error) {
	dir := os.Getenv("KUBEBUILDER_ASSETS")
	if dir == "" {
		root, err := RepoRoot()
		if err != nil {
			return "", err
		}
		out, err := exec.Command(filepath.Join(root, "hack", "k8s-bins.sh")).Output()
		if err != nil {
			var stderr string
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = string(ee.Stderr)
			}
			return "", fmt.Errorf("hack/k8s-bins.sh: %v: %s", err, strings.TrimSpace(stderr))
		}
		dir = strings.TrimSpace(string(out))
	}
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			return "", fmt.Errorf("envtest asset %s missing in %s (run hack/k8s-bins.sh): %w", b, dir, err)
		}
	}
	return dir, nil
}

// Scheme returns client-go's global scheme, which Karpenter core and our API
// register into at init (Karpenter resolves NodeClasses through it), plus
// apiextensions for CRD handling.
func Scheme() *runtime.Scheme {
	s := clientgoscheme.Scheme
	if err := apiextensionsv1.AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}

// OurCRDs decodes the checked-in CRDs (apis/crds).
func OurCRDs() ([]*apiextensionsv1.CustomResourceDefinition, error) {
	var out []*apiextensionsv1.CustomResourceDefinition
	err := fs.WalkDir(crds.FS, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".yaml") {
			return err
		}
		b, err := crds.FS.ReadFile(p)
		if err != nil {
			return err
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.UnmarshalStrict(b, crd); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		out = append(out, crd)
		return nil
	})
	return out, err
}

// Start brings up etcd + kube-apiserver with Karpenter's and our CRDs installed.
func Start() (*Env, error) {
	assets, err := Assets()
	if err != nil {
		return nil, err
	}
	ours, err := OurCRDs()
	if err != nil {
		return nil, err
	}
	all := append(append([]*apiextensionsv1.CustomResourceDefinition{}, karpapis.CRDs...), ours...)
	e := &Env{Scheme: Scheme(), AssetsDir: assets}
	e.env = &envtest.Environment{
		BinaryAssetsDirectory:    assets,
		CRDs:                     all,
		ErrorIfCRDPathMissing:    true,
		Scheme:                   e.Scheme,
		ControlPlaneStartTimeout: 2 * time.Minute,
		ControlPlaneStopTimeout:  time.Minute,
	}
	cfg, err := e.env.Start()
	if err != nil {
		return nil, fmt.Errorf("start envtest (assets %s): %w", assets, err)
	}
	e.Config = cfg
	if e.Client, err = client.New(cfg, client.Options{Scheme: e.Scheme}); err != nil {
		_ = e.env.Stop()
		return nil, err
	}
	if e.tmp, err = os.MkdirTemp("", "kpssh-testenv-"); err != nil {
		_ = e.env.Stop()
		return nil, err
	}
	user, err := e.env.ControlPlane.AddUser(envtest.User{Name: "kpssh-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		_ = e.Stop()
		return nil, err
	}
	kc, err := user.KubeConfig()
	if err != nil {
		_ = e.Stop()
		return nil, err
	}
	e.Kubeconfig = filepath.Join(e.tmp, "kubeconfig")
	if err := os.WriteFile(e.Kubeconfig, kc, 0o600); err != nil {
		_ = e.Stop()
		return nil, err
	}
	return e, nil
}

// Stop tears the control plane down and removes the kubeconfig.
func (e *Env) Stop() error {
	if e.tmp != "" {
		_ = os.RemoveAll(e.tmp)
	}
	return e.env.Stop()
}

// CreateNode creates n with the InternalIP ip (written through the status
// subresource, as a kubelet does) and deletes it when the test ends: Nodes
// are cluster-scoped, so tests sharing a control plane must not leave them.
func (e *Env) CreateNode(t testing.TB, n *corev1.Node, ip string) *corev1.Node {
	t.Helper()
	ctx := context.Background()
	if err := e.Client.Create(ctx, n); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Client.Delete(context.Background(), n) })
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}
	if err := e.Client.Status().Update(ctx, n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Kubectl runs the machine's kubectl against this control plane.
func (e *Env) Kubectl(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "kubectl", append([]string{"--kubeconfig", e.Kubeconfig}, args...)...)
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// RunMain is a package's TestMain body: it starts one control plane shared
// by the package's tests, runs setup on it, runs the tests and stops it.
// Under -short nothing starts and *env stays nil (the package's real tests
// skip themselves there, saying so). Controller-runtime logs are discarded.
func RunMain(m *testing.M, env **Env, setup ...func(*Env) error) int {
	flag.Parse()
	ctrllog.SetLogger(logr.Discard())
	if testing.Short() {
		return m.Run()
	}
	e, err := Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "start control plane:", err)
		return 1
	}
	defer func() {
		if err := e.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stop control plane:", err)
		}
	}()
	for _, s := range setup {
		if err := s(e); err != nil {
			fmt.Fprintln(os.Stderr, "control plane setup:", err)
			return 1
		}
	}
	*env = e
	return m.Run()
}
