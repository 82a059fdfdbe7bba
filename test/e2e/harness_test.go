//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1" // registers NodePool/NodeClaim in client-go's scheme
	"sigs.k8s.io/yaml"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/test/hostenv"
	"github.com/dklesev/kpssh/test/testenv"
	"github.com/dklesev/kpssh/test/testexec"
)

const poolNS = "kpssh-system"

// world is one control plane + hosts + controller shared by the scenarios.
type world struct {
	t          testing.TB
	repo       string
	hosts      *hostenv.World
	plane      string // hack/controlplane.sh plane name
	kubeconfig string
	kube       client.Client
	ctrl       *controller
	logDir     string
	profile    string      // the SSHJoinProfile the node class uses
	prom       *promServer // scrapes the controller (metrics_test.go)
}

// script runs a hack/ script, bounded, returning stdout; stderr goes into
// the error.
func script(ctx context.Context, repo string, env []string, timeout time.Duration, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c := testexec.Command(ctx, "bash", append([]string{filepath.Join(repo, "hack", name)}, args...)...)
	c.Dir = repo
	c.Env = append(os.Environ(), env...)
	c.Env = append(c.Env, "PATH="+os.Getenv("PATH")+":/usr/local/sbin:/usr/sbin:/sbin")
	o, e, err := testexec.Output(ctx, c)
	if err != nil {
		return o, fmt.Errorf("hack/%s %s: %w\n%s", name, strings.Join(args, " "), err, tail(e, 4000))
	}
	return strings.TrimSpace(o), nil
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// newWorld brings up everything; all of it is torn down by t.Cleanup.
func newWorld(t testing.TB) *world {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: the end-to-end world needs root, nspawn hosts, the Kubernetes binaries and ansible-playbook (make test runs it)")
	}
	ctx := context.Background()
	repo, err := hostenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	w := &world{t: t, repo: repo, logDir: t.TempDir()}
	if d := os.Getenv("KPSSH_E2E_LOGS"); d != "" { // keep logs after the run, a dir per world
		w.logDir = filepath.Join(d, t.Name())
		if err := os.MkdirAll(w.logDir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	mirror, err := script(ctx, repo, nil, 40*time.Minute, "node-assets.sh")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("node assets: %s (%v)", mirror, time.Since(start).Round(time.Millisecond))

	// The controller binary, built from this checkout.
	bin := filepath.Join(t.TempDir(), "controller")
	bctx, cancel := context.WithTimeout(ctx, 20*time.Minute)
	defer cancel()
	b := exec.CommandContext(bctx, "go", "build", "-o", bin, "./cmd/controller")
	b.Dir = repo
	b.Env = append(os.Environ(), "GOTOOLCHAIN=go1.27.3")
	if out, err := b.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/controller: %v\n%s", err, out)
	}

	// Planes of killed earlier runs first: their apiserver would keep this
	// world's bridge address:6443 once the world is given the same subnet.
	if out, err := script(ctx, repo, nil, 2*time.Minute, "controlplane.sh", "gc"); err != nil {
		t.Logf("controlplane.sh gc: %v\n%s", err, out)
	}
	// Both Debian releases: h2 is Debian 13 (scenario Releases joins all three).
	w.hosts = hostenv.UpWith(t, 3, hostenv.Options{Mirror: mirror, Releases: []string{hostenv.Bookworm, hostenv.Trixie, hostenv.Bookworm}})
	w.plane = w.hosts.Name()
	env := []string{"KPSSH_CP=" + w.plane, "KPSSH_OWNER_PID=" + strconv.Itoa(os.Getpid())}
	// A plane of an earlier, killed run of this test has the same name.
	if _, err := script(ctx, repo, env, 2*time.Minute, "controlplane.sh", "down"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := script(context.Background(), repo, env, 2*time.Minute, "controlplane.sh", "down"); err != nil {
			t.Errorf("control plane down: %v", err)
		}
	})
	cpStart := time.Now()
	if _, err := script(ctx, repo, env, 40*time.Minute, "controlplane.sh", "up", w.hosts.Inventory().BridgeAddress); err != nil {
		t.Fatal(err)
	}
	t.Logf("control plane up in %v", time.Since(cpStart).Round(time.Millisecond))
	if w.kubeconfig, err = script(ctx, repo, env, time.Minute, "controlplane.sh", "kubeconfig"); err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", w.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	if w.kube, err = client.New(cfg, client.Options{Scheme: clientgoscheme.Scheme}); err != nil {
		t.Fatal(err)
	}

	// The seed's script profile by default; KPSSH_E2E_PROFILE=role runs the
	// role-based twin (roles/tls_bootstrap) with the same vars.
	w.profile = "tls-bootstrap-script"
	w.apply(filepath.Join(repo, "examples/scripts/profile-tls-bootstrap.yaml"))
	for _, f := range []string{"cni.yaml", "nodeclass.yaml", "nodepool.yaml", "workload.yaml"} {
		w.apply(filepath.Join(repo, "test/e2e/testdata", f))
	}
	if os.Getenv("KPSSH_E2E_PROFILE") == "role" {
		w.profile = "tls-bootstrap"
		w.apply(filepath.Join(repo, "examples/profile-tls-bootstrap.yaml"))
		w.mustKubectl("patch", "sshnodeclass", "pool", "--type=merge", "-p", `{"spec":{"joinProfileRef":{"name":"tls-bootstrap"}}}`)
	}
	t.Logf("profile: %s", w.profile)
	w.createHosts()

	gates, err := chartFeatureGates(repo)
	if err != nil {
		t.Fatal(err)
	}
	// One metrics port for the world: Prometheus keeps one scrape target
	// across controller restarts.
	w.ctrl = &controller{t: t, bin: bin, dir: repo, logDir: w.logDir, metricsPort: testenv.MustFreePort(t), hostsFile: w.etcHosts(), env: []string{
		"FEATURE_GATES=" + gates,
		"KUBECONFIG=" + w.kubeconfig,
		"DISABLE_LEADER_ELECTION=true",
		"POOL_NAMESPACE=" + poolNS,
		"PROBE_INTERVAL=3s",
		"BATCH_IDLE_DURATION=1s",
		"BATCH_MAX_DURATION=3s",
		"LOG_LEVEL=debug",
	}}
	w.ctrl.start()
	t.Cleanup(w.ctrl.stop)
	w.prom = startPrometheus(t, w.logDir, "127.0.0.1:"+w.ctrl.metricsPort)
	w.eventually("3 hosts Available", 3*time.Minute, func() (bool, string) { return w.allHosts(v1beta1.HostAvailable) })
	t.Logf("world ready in %v", time.Since(start).Round(time.Millisecond))
	return w
}

// etcHosts writes the controller's /etc/hosts: the machine's and the
// world's names.
func (w *world) etcHosts() string {
	w.t.Helper()
	var b []byte
	for _, f := range []string{"/etc/hosts", w.hosts.Inventory().HostsFile} {
		c, err := os.ReadFile(f)
		if err != nil {
			w.t.Fatal(err)
		}
		b = append(append(b, c...), '\n')
	}
	f := filepath.Join(w.t.TempDir(), "etc-hosts") // (not logDir: KPSSH_E2E_LOGS keeps it)
	if err := os.WriteFile(f, b, 0o644); err != nil {
		w.t.Fatal(err)
	}
	return f
}

// chartFeatureGates is FEATURE_GATES as the chart sets it by default
// (charts/kpssh/values.yaml settings.featureGates): the world runs the
// gates that ship.
func chartFeatureGates(repo string) (string, error) {
	b, err := os.ReadFile(filepath.Join(repo, "charts/kpssh/values.yaml"))
	if err != nil {
		return "", err
	}
	var v struct {
		Settings struct {
			FeatureGates map[string]bool `json:"featureGates"`
		} `json:"settings"`
	}
	if err := yaml.Unmarshal(b, &v); err != nil {
		return "", fmt.Errorf("charts/kpssh/values.yaml: %w", err)
	}
	var gates []string
	for g, on := range v.Settings.FeatureGates {
		gates = append(gates, fmt.Sprintf("%s=%t", g, on))
	}
	if len(gates) == 0 {
		return "", fmt.Errorf("charts/kpssh/values.yaml sets no settings.featureGates")
	}
	sort.Strings(gates)
	return strings.Join(gates, ","), nil
}

func (w *world) kubectl(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := exec.CommandContext(ctx, "kubectl", append([]string{"--kubeconfig=" + w.kubeconfig}, args...)...)
	var o, e bytes.Buffer
	c.Stdout, c.Stderr = &o, &e
	if err := c.Run(); err != nil {
		return o.String(), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, e.String())
	}
	return strings.TrimSpace(o.String()), nil
}

func (w *world) mustKubectl(args ...string) string {
	w.t.Helper()
	out, err := w.kubectl(args...)
	if err != nil {
		w.t.Fatal(err)
	}
	return out
}

func (w *world) apply(file string) { w.t.Helper(); w.mustKubectl("apply", "-f", file) }

// yamlFile writes v as YAML to a file name in a temp dir of the test
// (0600) and returns its path.
func (w *world) yamlFile(name string, v any) string {
	w.t.Helper()
	b, err := yaml.Marshal(v)
	if err != nil {
		w.t.Fatal(err)
	}
	f := filepath.Join(w.t.TempDir(), name)
	if err := os.WriteFile(f, b, 0o600); err != nil {
		w.t.Fatal(err)
	}
	return f
}

// selected reports whether scenario name runs: KPSSH_E2E_ONLY=A,B runs only
// those, in TestE2E's order (each starts from all hosts Available, nothing
// joined; ones that read state an earlier one left need it selected too).
func selected(name string) bool {
	only := os.Getenv("KPSSH_E2E_ONLY")
	if only == "" {
		return true
	}
	for _, n := range strings.Split(only, ",") {
		if strings.TrimSpace(n) == name {
			return true
		}
	}
	return false
}

// createHosts registers the world's hosts (and their SSH key) as the pool,
// each reached the way a real fleet's hosts differ (hostLogin).
func (w *world) createHosts() {
	w.t.Helper()
	inv := w.hosts.Inventory()
	var b strings.Builder
	for i, h := range inv.Hosts {
		address, port, user, keySecret := hostLogin(i, h)
		class, cpu := worldClass(i, len(inv.Hosts))
		fmt.Fprintf(&b, `---
apiVersion: karpenter.dklesev.github.io/v1beta1
kind: SSHHost
metadata:
  name: %s
  namespace: %s
  labels: {karpenter.dklesev.github.io/host-class: `+class+`}
spec:
  address: %s
  port: %d
  user: %s
  sshKeySecretRef: {name: %s}
  capacity: {cpu: "`+cpu+`", memory: 2Gi}
`, h.Name, poolNS, address, port, user, keySecret)
	}
	f := filepath.Join(w.t.TempDir(), "hosts.yaml")
	if err := os.WriteFile(f, []byte(b.String()), 0o600); err != nil {
		w.t.Fatal(err)
	}
	// The key goes in from its file through the API (never through argv).
	key, err := os.ReadFile(inv.ClientKey)
	if err != nil {
		w.t.Fatal(err)
	}
	if err := w.kube.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: poolNS}}); err != nil {
		w.t.Fatal(err)
	}
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: poolNS, Name: "world-key"}, Data: map[string][]byte{"privateKey": key}}
	if err := w.kube.Create(context.Background(), sec); err != nil {
		w.t.Fatal(err)
	}
	// h1's pin: its ed25519 key line, on a host that also serves rsa and
	// ecdsa keys (Go's client would negotiate ecdsa unasked).
	pinned := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: poolNS, Name: pinnedKeySecret},
		Data: map[string][]byte{"privateKey": key, "knownHost": []byte(inv.Hosts[0].HostKey)}}
	if err := w.kube.Create(context.Background(), pinned); err != nil {
		w.t.Fatal(err)
	}
	w.apply(f)
}

// pinnedKeySecret is h1's key Secret: the world's key and a knownHost pin.
const pinnedKeySecret = "world-key-pinned"

// hostLogin is how the pool reaches host i (0-based), the ways real fleets
// differ: h1 root@IP:22 with its ed25519 key line as the knownHost pin; h2
// by DNS name (resolved through the world's hosts file, which the
// controller sees as its /etc/hosts, and every host too: a Job pod on the
// host network); h3 as a sudoer (AltUser) on sshd's second port; more
// hosts as the first.
func hostLogin(i int, h hostenv.Host) (address string, port int, user, keySecret string) {
	switch i {
	case 0:
		return h.Address, h.Port, h.User, pinnedKeySecret
	case 1:
		return h.DNSName, h.Port, h.User, "world-key"
	case 2:
		return h.Address, h.AltPort, h.AltUser, "world-key"
	}
	return h.Address, h.Port, h.User, "world-key"
}

// worldClass is the host class of host i of n and the vCPUs it declares:
// the last host is class large (4 vCPUs: twice a small host's price, which
// is pricePerCPUHour × vCPUs), the others small (2). Cheapest first: a
// single pod lands on a small host.
func worldClass(i, n int) (class, cpu string) {
	if i == n-1 {
		return "large", "4"
	}
	return "small", "2"
}

// eventually polls cond every 500 ms until it holds or timeout passes.
func (w *world) eventually(what string, timeout time.Duration, cond func() (bool, string)) {
	w.t.Helper()
	deadline := time.Now().Add(timeout)
	var last string
	for {
		ok, s := cond()
		if ok {
			return
		}
		if s != last && s != "" {
			w.t.Logf("waiting for %s: %s", what, s)
		}
		// A controller that exited by itself (a refused setting, a crash)
		// fails the wait now, with its log, not at the timeout.
		if why, gone := w.ctrl.exitedOnItsOwn(); gone {
			w.t.Fatalf("waiting for %s: the controller exited on its own: %s", what, why)
		}
		last = s
		if time.Now().After(deadline) {
			w.t.Fatalf("timed out after %v waiting for %s; last: %s (controller log: %s)\n%s", timeout, what, last, w.ctrl.logPath(), w.ctrl.logExcerpt(40))
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func (w *world) sshHosts() []v1beta1.SSHHost {
	w.t.Helper()
	l := &v1beta1.SSHHostList{}
	if err := w.kube.List(context.Background(), l, client.InNamespace(poolNS)); err != nil {
		w.t.Fatal(err)
	}
	return l.Items
}

func (w *world) sshHost(name string) *v1beta1.SSHHost {
	w.t.Helper()
	h := &v1beta1.SSHHost{}
	if err := w.kube.Get(context.Background(), client.ObjectKey{Namespace: poolNS, Name: name}, h); err != nil {
		w.t.Fatal(err)
	}
	return h
}

func (w *world) allHosts(state v1beta1.HostState) (bool, string) {
	var s []string
	ok := true
	hs := w.sshHosts()
	for _, h := range hs {
		s = append(s, fmt.Sprintf("%s=%s%s", h.Name, h.Status.State, errSuffix(h.Status.LastProbeError)))
		ok = ok && h.Status.State == state
	}
	return ok && len(hs) == 3, strings.Join(s, " ")
}

func errSuffix(e string) string {
	if e == "" {
		return ""
	}
	return "(" + e + ")"
}

func (w *world) nodeClaims() []karpv1.NodeClaim {
	w.t.Helper()
	l := &karpv1.NodeClaimList{}
	if err := w.kube.List(context.Background(), l); err != nil {
		w.t.Fatal(err)
	}
	return l.Items
}

func (w *world) nodes() []corev1.Node {
	w.t.Helper()
	l := &corev1.NodeList{}
	if err := w.kube.List(context.Background(), l); err != nil {
		w.t.Fatal(err)
	}
	return l.Items
}

// tokens lists bootstrap-token Secrets (kube-system, type bootstrap.kubernetes.io/token).
func (w *world) tokens() []string {
	w.t.Helper()
	l := &corev1.SecretList{}
	if err := w.kube.List(context.Background(), l, client.InNamespace("kube-system")); err != nil {
		w.t.Fatal(err)
	}
	var out []string
	for _, s := range l.Items {
		if s.Type == corev1.SecretTypeBootstrapToken {
			out = append(out, s.Name)
		}
	}
	return out
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// hostIndex maps a host name ("h2") to its hostenv index.
func (w *world) hostIndex(name string) int {
	w.t.Helper()
	for i, h := range w.hosts.Hosts() {
		if h.Name == name {
			return i
		}
	}
	w.t.Fatalf("no host %q in the world", name)
	return -1
}

// units reports `systemctl is-enabled` and `is-active` of kubelet and
// containerd on host i, e.g. "kubelet=enabled/active containerd=enabled/active".
func (w *world) units(i int) string {
	w.t.Helper()
	out, _, err := w.hosts.Run(i, `for u in kubelet containerd; do printf '%s=%s/%s ' $u "$(systemctl is-enabled $u 2>/dev/null)" "$(systemctl is-active $u 2>/dev/null)"; done`)
	if err != nil {
		w.t.Fatalf("units on host %d: %v", i, err)
	}
	return strings.TrimSpace(out)
}

// scale sets the workload's replicas.
func (w *world) scale(n int) {
	w.t.Helper()
	w.mustKubectl("-n", "default", "scale", "deployment/pause", fmt.Sprintf("--replicas=%d", n))
}

// controller is cmd/controller running as a child process (own process
// group, killed and reaped by stop).
type controller struct {
	t           testing.TB
	bin         string
	dir         string
	env         []string
	logDir      string
	metricsPort string // the same at every (re)start
	// hostsFile is bound over /etc/hosts in the controller's own mount
	// namespace: the machine's names plus the world's (hostLogin's DNS
	// name resolves for the controller and the ssh it runs, nowhere else).
	hostsFile string
	cmd       *exec.Cmd
	done      chan struct{}
	runs      int
	// hostname, if set: the controller runs in its own UTS namespace with
	// this host name, as in a pod (leader election's identity starts with it).
	hostname string
}

func (c *controller) logPath() string {
	if c == nil {
		return "(not started)"
	}
	return filepath.Join(c.logDir, "controller.log")
}

// logExcerpt: the controller log's last n lines that say what Karpenter
// and kpssh decided (errors, disruption, phases, NodeClaim life cycle), for
// a failure's output: CI keeps only what the test prints, not the temp dir.
func (c *controller) logExcerpt(n int) string {
	if c == nil {
		return ""
	}
	b, err := os.ReadFile(c.logPath())
	if err != nil {
		return fmt.Sprintf("controller log: %v", err)
	}
	interesting := regexp.MustCompile(`"level":"(ERROR|WARN)"|(?i)disrupt|consolidat|"phase|leave|terminat|launched|registered|initialized|deleting|"message":"(created|deleted)`)
	var keep []string
	for _, l := range strings.Split(string(b), "\n") {
		if interesting.MatchString(l) {
			keep = append(keep, tail(l, 400))
		}
	}
	if len(keep) > n {
		keep = keep[len(keep)-n:]
	}
	return "controller log, last interesting lines:\n  " + strings.Join(keep, "\n  ")
}

func (c *controller) start() {
	c.t.Helper()
	if c.cmd != nil {
		// A second process would act beside the first and outlive the test.
		c.t.Errorf("controller started while pid %d still runs (stop it first)", c.cmd.Process.Pid)
		return
	}
	f, err := os.OpenFile(c.logPath(), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		c.t.Fatal(err)
	}
	c.runs++
	fmt.Fprintf(f, "=== controller start %d at %s\n", c.runs, time.Now().UTC().Format(time.RFC3339Nano))
	cmd := exec.Command(c.bin)
	if c.hostsFile != "" || c.hostname != "" {
		// unshare and sh exec: the controller keeps this pid and process group.
		args := []string{}
		if c.hostsFile != "" {
			args = append(args, "--mount", "--propagation", "private")
		}
		if c.hostname != "" {
			args = append(args, "--uts")
		}
		args = append(args, "--", "/bin/sh", "-c",
			`f=$0 n=$1; shift; { [ -z "$f" ] || mount --bind -o ro "$f" /etc/hosts; } && { [ -z "$n" ] || hostname "$n"; } && exec "$@"`,
			c.hostsFile, c.hostname, c.bin)
		cmd = exec.Command("unshare", args...)
	}
	cmd.Dir = c.dir // finds playbooks/collections and roles/ from the checkout
	cmd.Env = append(os.Environ(), c.env...)
	cmd.Env = append(cmd.Env, "METRICS_PORT="+c.metricsPort, "HEALTH_PROBE_PORT="+testenv.MustFreePort(c.t))
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		c.t.Fatal(err)
	}
	f.Close()
	c.cmd, c.done = cmd, make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { _ = cmd.Wait(); close(done) }(cmd, c.done)
}

// exitedOnItsOwn reports a controller that ended without kill or stop,
// with its exit status and the tail of its log (the log's directory is
// removed after the run unless KPSSH_E2E_LOGS keeps it).
func (c *controller) exitedOnItsOwn() (string, bool) {
	if c == nil || c.cmd == nil {
		return "", false
	}
	select {
	case <-c.done:
	default:
		return "", false
	}
	b, err := os.ReadFile(c.logPath())
	if err != nil {
		return fmt.Sprintf("%v (log: %v)", c.cmd.ProcessState, err), true
	}
	return fmt.Sprintf("%v; log tail:\n%s", c.cmd.ProcessState, tail(string(b), 3000)), true
}

// kill sends sig to the controller's process group and waits for it to exit.
func (c *controller) kill(sig syscall.Signal) {
	if c.cmd == nil {
		return
	}
	_ = syscall.Kill(-c.cmd.Process.Pid, sig)
	select {
	case <-c.done:
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
		<-c.done
	}
	// Children (ansible-playbook runs) are in the same group; make sure none
	// is left.
	_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
	c.cmd = nil
}

func (c *controller) stop() { c.kill(syscall.SIGTERM) }
