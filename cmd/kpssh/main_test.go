package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/cli"
	"github.com/dklesev/kpssh/test/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	code := testenv.RunMain(m, &env)
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

func TestDispatch(t *testing.T) {
	cases := []struct {
		args         []string
		code         int
		stdout, errs string
	}{
		{nil, cli.ExitUsage, "", "usage: kpssh COMMAND"},
		{[]string{"frobnicate"}, cli.ExitUsage, "", `unknown command "frobnicate"`},
		{[]string{"help"}, cli.ExitOK, "render ", ""},
		{[]string{"--help"}, cli.ExitOK, "render ", ""},
		{[]string{"help"}, cli.ExitOK, "  new-role          NAME: write a role skeleton", ""},
		{[]string{"help"}, cli.ExitOK, "  validate          PROFILE.yaml: the node class controller's checks", ""},
		{[]string{"new-role", "a.b.c"}, cli.ExitUsage, "", "kpssh new-role: role name \"a.b.c\": a dotted name is a collection's FQCN"},
		{[]string{"validate"}, cli.ExitUsage, "", "kpssh validate: want PROFILE.yaml, got 0 argument(s)"},
		{[]string{"render", "--profile", "p.yaml", "join"}, cli.ExitUsage, "", "kpssh render: offline render needs both --profile and --host"},
		// Reaches render's own argument checks (no API server needed).
		{[]string{"render", "h1", "bogus"}, cli.ExitUsage, "", `kpssh render: unknown phase "bogus"`},
	}
	for _, tc := range cases {
		var out, errb bytes.Buffer
		code := run(context.Background(), tc.args, &out, &errb)
		if code != tc.code || !strings.Contains(out.String(), tc.stdout) || !strings.Contains(errb.String(), tc.errs) {
			t.Errorf("%q: exit %d (want %d)\nstdout: %s\nstderr: %s", tc.args, code, tc.code, out.String(), errb.String())
		}
	}
}

// The version and commit buildBinary links in, as make bin does.
const (
	testVersion = "v0.0.0-kpssh-test"
	testCommit  = "0123456789abcdef0123456789abcdef01234567"
)

var (
	binOnce sync.Once
	binDir  string
	binErr  error
)

// buildBinary builds this command once per test run (the tests share it),
// with the version and commit set at link time.
func buildBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		if binDir, binErr = os.MkdirTemp("", "kpssh-bin-"); binErr != nil {
			return
		}
		ldflags := "-X github.com/dklesev/kpssh/internal/cli.version=" + testVersion + " -X github.com/dklesev/kpssh/internal/cli.commit=" + testCommit
		out, code, err := execBounded(t, 10*time.Minute, os.Environ(), "go", "build", "-ldflags", ldflags, "-o", filepath.Join(binDir, "kpssh"), ".")
		if err != nil || code != 0 {
			binErr = fmt.Errorf("go build: exit %d, %v\n%s", code, err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return filepath.Join(binDir, "kpssh")
}

// execBounded runs a command in its own process group, killed as a group
// when the timeout passes, and reaped.
func execBounded(t *testing.T, timeout time.Duration, environ []string, name string, args ...string) (combined string, code int, err error) {
	t.Helper()
	stdout, stderr, code, err := execSplit(timeout, environ, name, args...)
	return stdout + stderr, code, err
}

func execSplit(timeout time.Duration, environ []string, name string, args ...string) (stdout, stderr string, code int, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = environ
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) && ctx.Err() == nil {
		return o.String(), e.String(), ee.ExitCode(), nil
	}
	if err != nil {
		return o.String(), e.String(), -1, fmt.Errorf("%s: %w", name, err)
	}
	return o.String(), e.String(), 0, nil
}

const (
	ns     = "render-e2e"
	canary = "CANARY-e2e-join-secret-77c1"
)

func mustCreate(t *testing.T, objs ...client.Object) {
	t.Helper()
	for _, o := range objs {
		if err := env.Client.Create(context.Background(), o); err != nil {
			t.Fatalf("create %T %s: %v", o, o.GetName(), err)
		}
	}
}

func clusterInfoKubeconfig(t *testing.T, server string) string {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["c"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: env.Config.CAData}
	b, err := clientcmd.Write(*cfg)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// unreachableKubeconfig points at a loopback port nobody listens on.
func unreachableKubeconfig(t *testing.T) string {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	addUnreachable(t, cfg, "x")
	cfg.CurrentContext = "x"
	return writeKubeconfig(t, cfg)
}

// addUnreachable adds the context name to cfg: a loopback port nobody
// listens on, with a made-up token.
func addUnreachable(t *testing.T, cfg *clientcmdapi.Config, name string) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	cfg.Clusters[name] = &clientcmdapi.Cluster{Server: "https://" + addr, InsecureSkipTLSVerify: true}
	cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: "not-a-real-token"}
	cfg.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: name}
}

func writeKubeconfig(t *testing.T, cfg *clientcmdapi.Config) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestRenderBinary builds the real binary and runs `kpssh render` against
// objects in a real kube-apiserver (envtest).
func TestRenderBinary(t *testing.T) {
	if env == nil {
		t.Skip("-short: needs the envtest kube-apiserver (and builds the binary)")
	}
	bin := buildBinary(t)
	ctx := context.Background()

	mustCreate(t,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-public", Name: "cluster-info"},
			Data: map[string]string{"kubeconfig": clusterInfoKubeconfig(t, "https://api.e2e.test:6443")}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "join"},
			StringData: map[string]string{"activationCode": canary}},
		&v1beta1.SSHJoinProfile{ObjectMeta: metav1.ObjectMeta{Name: "e2e"}, Spec: v1beta1.SSHJoinProfileSpec{
			Version: "7",
			Scripts: &v1beta1.ProfileScripts{
				Install: "echo install {{ .Vars.k8sMinor }}\n",
				Join:    "register --endpoint \"$KPSSH_CLUSTER_ENDPOINT\" --code {{ .Secrets.activationCode }} --token \"$KPSSH_BOOTSTRAP_TOKEN\"\n",
				Leave:   "echo leave-e2e \"$KPSSH_HOST_ADDRESS\"\n",
			}}},
		&v1beta1.SSHNodeClass{ObjectMeta: metav1.ObjectMeta{Name: "e2e-small"}, Spec: v1beta1.SSHNodeClassSpec{
			HostSelector:   &metav1.LabelSelector{MatchLabels: map[string]string{v1beta1.LabelHostClass: "small"}},
			JoinProfileRef: v1beta1.ObjectReference{Name: "e2e"},
			Vars:           v1beta1.Vars{"k8sMinor": "1.36"},
			JoinSecretRef:  &v1beta1.LocalObjectReference{Name: "join"},
		}},
		// Selects nothing of this test: the resolution must pick e2e-small.
		&v1beta1.SSHNodeClass{ObjectMeta: metav1.ObjectMeta{Name: "e2e-big"}, Spec: v1beta1.SSHNodeClassSpec{
			HostSelector:   &metav1.LabelSelector{MatchLabels: map[string]string{v1beta1.LabelHostClass: "big"}},
			JoinProfileRef: v1beta1.ObjectReference{Name: "e2e-plain"},
		}},
		&v1beta1.SSHNodeClass{ObjectMeta: metav1.ObjectMeta{Name: "e2e-nosecret"}, Spec: v1beta1.SSHNodeClassSpec{
			HostSelector:   &metav1.LabelSelector{MatchLabels: map[string]string{v1beta1.LabelHostClass: "none"}},
			JoinProfileRef: v1beta1.ObjectReference{Name: "e2e"},
		}},
		&v1beta1.SSHJoinProfile{ObjectMeta: metav1.ObjectMeta{Name: "e2e-plain"}, Spec: v1beta1.SSHJoinProfileSpec{
			Version: "1",
			Scripts: &v1beta1.ProfileScripts{
				Install: "echo install\n",
				Join:    "echo join-plain \"$KPSSH_NODE_LABELS\"\n",
				Leave:   "echo leave\n",
			}}},
	)
	h := &v1beta1.SSHHost{
		ObjectMeta: metav1.ObjectMeta{Name: "h1", Namespace: ns, Labels: map[string]string{v1beta1.LabelHostClass: "small"}},
		Spec: v1beta1.SSHHostSpec{Address: "192.0.2.10", Port: 2222, SSHKeySecretRef: v1beta1.LocalObjectReference{Name: "h1-key"},
			Capacity: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("4Gi")}},
	}
	mustCreate(t, h)
	h.Status.ObservedArch = "arm64"
	h.Status.InstalledProfile = "e2e@7"
	h.SetState(v1beta1.HostAvailable, "probed", metav1.Now())
	if err := env.Client.Status().Update(ctx, h); err != nil {
		t.Fatal(err)
	}

	// A second host claimed by a NodeClaim of e2e-big (which does not
	// select it): the NodeClaim decides the class, labels and taints.
	claim := &karpv1.NodeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-claim", Labels: map[string]string{karpv1.NodePoolLabelKey: "e2e-pool"}},
		Spec: karpv1.NodeClaimSpec{
			NodeClassRef: &karpv1.NodeClassReference{Group: v1beta1.Group, Kind: "SSHNodeClass", Name: "e2e-big"},
			Requirements: []karpv1.NodeSelectorRequirementWithMinValues{{Key: karpv1.CapacityTypeLabelKey, Operator: corev1.NodeSelectorOpIn, Values: []string{"on-demand"}}},
			Taints:       []corev1.Taint{{Key: "e2e", Value: "yes", Effect: corev1.TaintEffectNoSchedule}},
		},
	}
	mustCreate(t, claim)
	h2 := &v1beta1.SSHHost{
		ObjectMeta: metav1.ObjectMeta{Name: "h2", Namespace: ns, Labels: map[string]string{v1beta1.LabelHostClass: "small"}},
		Spec:       h.Spec,
	}
	h2.Spec.Address = "192.0.2.11"
	mustCreate(t, h2)
	h2.Status.ObservedArch = "arm64"
	h2.Status.ClaimRef = &v1beta1.ClaimRef{Name: claim.Name, UID: claim.UID}
	h2.SetState(v1beta1.HostClaimed, "claimed", metav1.Now())
	if err := env.Client.Status().Update(ctx, h2); err != nil {
		t.Fatal(err)
	}

	home := t.TempDir()
	environ := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + home, "POOL_NAMESPACE=" + ns}
	cases := []struct {
		name   string
		args   []string
		code   int
		out    []string
		notOut []string
		stderr string
	}{
		{
			name: "join of h1",
			args: []string{"render", "--kubeconfig", env.Kubeconfig, "h1", "join"},
			out: []string{
				"# kpssh render h1 join\n",
				"# host:       render-e2e/h1 (address 192.0.2.10, class small, state Available)",
				"# profile:    e2e@7 (joinProfileRef of SSHNodeClass e2e-small)",
				"# node class: e2e-small (the only SSHNodeClass whose hostSelector selects the host)",
				"1 secret(s) from Secret render-e2e/join: activationCode (values masked)",
				"# kpssh render: phase join for root@192.0.2.10:2222 (secrets masked)",
				"cmd: \"flock -w 300 /run/kpssh-phase.lock timeout -k 5 300 bash -s kpssh-RUN\"",
				"export KPSSH_BOOTSTRAP_TOKEN='" + cli.BootstrapTokenShown + "'",
				"export KPSSH_SECRET_ACTIVATIONCODE='***'",
				"--code ***",
				"export KPSSH_VAR_k8sMinor='1.36'",
				"export KPSSH_CLUSTER_ENDPOINT='https://api.e2e.test:6443'",
				"export KPSSH_PROVIDER_ID='kpssh://render-e2e/h1'",
				"export KPSSH_TAINTS='karpenter.sh/unregistered:NoExecute'",
				"kubernetes.io/arch=arm64", "node.kubernetes.io/instance-type=small",
			},
		},
		{
			name: "join of the claimed h2, flags after the arguments",
			args: []string{"render", "h2", "join", "--kubeconfig", env.Kubeconfig},
			out: []string{
				"# profile:    e2e-plain@1 (joinProfileRef of SSHNodeClass e2e-big)",
				"# node class: e2e-big (of NodeClaim e2e-claim)",
				"echo join-plain",
				"export KPSSH_TAINTS='karpenter.sh/unregistered:NoExecute,e2e=yes:NoSchedule'",
				"karpenter.sh/nodepool=e2e-pool",
				"export KPSSH_PROVIDER_ID='kpssh://render-e2e/h2'",
			},
			notOut: []string{"KPSSH_SECRET_", "KPSSH_VAR_"}, // e2e-big has neither
		},
		{
			name:   "leave of h1: the marker's profile, the empty context",
			args:   []string{"render", "--kubeconfig", env.Kubeconfig, "--namespace", ns, "h1", "leave"},
			out:    []string{"# profile:    e2e@7 (the host's install marker)", "echo leave-e2e", "export KPSSH_HOST_ADDRESS='192.0.2.10'", "export KPSSH_CLUSTER_ENDPOINT=''"},
			notOut: []string{"KPSSH_VAR_", "KPSSH_SECRET_", "1.36", "api.e2e.test", "bootstrap-token"},
		},
		{
			// Profile e2e's join reads .Secrets.activationCode; e2e-nosecret
			// has no join secret: what the controller would refuse
			// (ConfigError) is a configuration error here.
			name:   "a template needing a secret the class lacks",
			args:   []string{"render", "--kubeconfig", env.Kubeconfig, "--nodeclass", "e2e-nosecret", "h1", "join"},
			code:   cli.ExitUsage,
			stderr: `map has no entry for key "activationCode"`,
		},
		{
			name:   "unknown host",
			args:   []string{"render", "--kubeconfig", env.Kubeconfig, "nope", "join"},
			code:   cli.ExitUsage,
			stderr: "kpssh render: SSHHost render-e2e/nope not found",
		},
		{
			name:   "bad phase",
			args:   []string{"render", "--kubeconfig", env.Kubeconfig, "h1", "bogus"},
			code:   cli.ExitUsage,
			stderr: `kpssh render: unknown phase "bogus"`,
		},
		{
			name:   "API unreachable",
			args:   []string{"render", "--kubeconfig", unreachableKubeconfig(t), "--timeout", "20s", "h1", "join"},
			code:   cli.ExitRuntime,
			stderr: "connection refused",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			stdout, stderr, code, err := execSplit(time.Minute, environ, bin, tc.args...)
			if err != nil {
				t.Fatal(err)
			}
			if code != tc.code {
				t.Fatalf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", code, tc.code, stdout, stderr)
			}
			if strings.Contains(stdout+stderr, canary) {
				t.Errorf("the join secret's value was printed:\n%s\n%s", stdout, stderr)
			}
			if strings.Contains(stdout+stderr, "PRIVATE KEY") {
				t.Error("key material printed")
			}
			for _, s := range tc.out {
				if !strings.Contains(stdout, s) {
					t.Errorf("stdout lacks %q", s)
				}
			}
			for _, s := range tc.notOut {
				if strings.Contains(stdout, s) {
					t.Errorf("stdout contains %q", s)
				}
			}
			if tc.code == cli.ExitOK && stderr != "" {
				t.Errorf("stderr: %s", stderr)
			}
			if tc.code != cli.ExitOK && stdout != "" {
				t.Errorf("stdout on failure: %s", stdout)
			}
			if !strings.Contains(stderr, tc.stderr) {
				t.Errorf("stderr lacks %q: %s", tc.stderr, stderr)
			}
			if t.Failed() {
				t.Logf("stdout:\n%s\nstderr:\n%s", stdout, stderr)
			}
		})
	}
}
