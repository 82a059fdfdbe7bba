// Package chart tests charts/kpssh with a helm built from the Go module
// proxy (hack/helm.sh): lint and template for the defaults and with every
// optional object on, refusals of bad values, the CRDs equal to the
// generated ones, the Deployment's environment accepted by the controller's
// own option parsing, and a real `helm install` onto a kube-apiserver that
// starts without any CRD (so the chart installs them), with the installed
// RBAC checked by the apiserver's authorizer and the optional admission
// policy by requests as the controller's ServiceAccount.
package chart

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	bootstrapapi "k8s.io/cluster-bootstrap/token/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	karpapis "sigs.k8s.io/karpenter/pkg/apis"
	coreoptions "sigs.k8s.io/karpenter/pkg/operator/options"
	"sigs.k8s.io/yaml"

	"github.com/dklesev/kpssh/internal/cloudprovider"
	"github.com/dklesev/kpssh/internal/operator/options"
	"github.com/dklesev/kpssh/internal/providers/token"
	"github.com/dklesev/kpssh/test/testenv"
)

// allOn turns on every optional object of the chart.
var allOn = []string{"--set", "serviceMonitor.enabled=true,networkPolicy.enabled=true,podDisruptionBudget.enabled=true,dashboard.enabled=true,executor=job,tokenSecretPolicy.enabled=true," + egressOn}

// egressOn restricts the NetworkPolicy's egress (it needs networkPolicy.enabled).
const egressOn = "networkPolicy.egress.enabled=true,networkPolicy.egress.apiServerCIDRs={10.0.0.1/32,fd00::1/128},networkPolicy.egress.sshCIDRs={192.0.2.0/24}"

// kubeVersion is the apiserver version the tests run against (helm's
// template needs one; the chart requires ≥ 1.29).
const kubeVersion = "1.36.3"

type world struct {
	helm, chart, root string
	env               []string
}

func setup(t *testing.T) *world {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: builds helm (hack/helm.sh) and starts a kube-apiserver")
	}
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	helm := os.Getenv("HELM")
	if helm == "" {
		out, err := exec.Command(filepath.Join(root, "hack", "helm.sh")).Output()
		if err != nil {
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				t.Fatalf("hack/helm.sh: %v\n%s", err, ee.Stderr)
			}
			t.Fatal(err)
		}
		helm = strings.TrimSpace(string(out))
	}
	home := t.TempDir()
	return &world{helm: helm, chart: filepath.Join(root, "charts", "kpssh"), root: root, env: []string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + home,
		"HELM_CACHE_HOME=" + filepath.Join(home, "cache"), "HELM_CONFIG_HOME=" + filepath.Join(home, "config"), "HELM_DATA_HOME=" + filepath.Join(home, "data"),
	}}
}

// run runs helm in its own process group, bounded and reaped.
func (w *world) run(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, w.helm, args...)
	cmd.Env = w.env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee) && ctx.Err() == nil:
		return o.String(), e.String(), ee.ExitCode()
	case err != nil:
		t.Fatalf("helm %q: %v\n%s", args, err, e.String())
	}
	return o.String(), e.String(), 0
}

func (w *world) template(t *testing.T, extra ...string) []*unstructured.Unstructured {
	t.Helper()
	return w.templateOf(t, w.chart, extra...)
}

// templateOf renders chart (kpssh, or a parent of it) as release kpssh in namespace kpssh.
func (w *world) templateOf(t *testing.T, chart string, extra ...string) []*unstructured.Unstructured {
	t.Helper()
	args := append([]string{"template", "kpssh", chart, "--namespace", "kpssh", "--kube-version", kubeVersion}, extra...)
	out, stderr, code := w.run(t, args...)
	if code != 0 {
		t.Fatalf("helm template %q: exit %d\n%s", extra, code, stderr)
	}
	return decodeAll(t, out)
}

func decodeAll(t *testing.T, stream string) []*unstructured.Unstructured {
	t.Helper()
	var objs []*unstructured.Unstructured
	d := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(stream), 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := d.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return objs
			}
			t.Fatalf("decode: %v", err)
		}
		if len(u.Object) > 0 {
			objs = append(objs, u)
		}
	}
}

func find(objs []*unstructured.Unstructured, kind, ns, name string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == kind && (name == "" || o.GetName() == name) && (ns == "*" || o.GetNamespace() == ns) {
			return o
		}
	}
	return nil
}

func kinds(objs []*unstructured.Unstructured) map[string]int {
	m := map[string]int{}
	for _, o := range objs {
		m[o.GetKind()]++
	}
	return m
}

func convert[T any](t *testing.T, u *unstructured.Unstructured) *T {
	t.Helper()
	if u == nil {
		t.Fatalf("no %T rendered", *new(T))
	}
	var out T
	b, err := u.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(b, &out); err != nil {
		t.Fatalf("%s %s does not decode strictly as %T: %v", u.GetKind(), u.GetName(), out, err)
	}
	return &out
}

func TestLintAndTemplate(t *testing.T) {
	w := setup(t)
	for _, extra := range [][]string{nil, allOn} {
		args := append([]string{"lint", "--strict", w.chart, "--kube-version", kubeVersion}, extra...)
		out, stderr, code := w.run(t, args...)
		if code != 0 || !strings.Contains(out, "1 chart(s) linted, 0 chart(s) failed") {
			t.Errorf("helm lint %q: exit %d\n%s%s", extra, code, out, stderr)
		}
	}
	def := kinds(w.template(t))
	for k, n := range map[string]int{"Deployment": 1, "ServiceAccount": 1, "ClusterRole": 1, "ClusterRoleBinding": 1, "Role": 5, "RoleBinding": 5, "Service": 1, "CustomResourceDefinition": 4} {
		if def[k] != n {
			t.Errorf("defaults: %d %s, want %d (all: %v)", def[k], k, n, def)
		}
	}
	for _, k := range []string{"ServiceMonitor", "NetworkPolicy", "PodDisruptionBudget", "ConfigMap", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} {
		if def[k] != 0 {
			t.Errorf("defaults render an optional %s", k)
		}
	}
	all := w.template(t, allOn...)
	on := kinds(all)
	for k, n := range map[string]int{"ServiceMonitor": 1, "NetworkPolicy": 1, "PodDisruptionBudget": 1, "ConfigMap": 1, "Role": 6, "RoleBinding": 6, "ValidatingAdmissionPolicy": 1, "ValidatingAdmissionPolicyBinding": 1} {
		if on[k] != n {
			t.Errorf("all on: %d %s, want %d (all: %v)", on[k], k, n, on)
		}
	}
	if r := find(all, "Role", "kpssh", "kpssh-job-executor"); r == nil {
		t.Error("executor job: no Job executor Role")
	}
	pdb := convert[policyv1.PodDisruptionBudget](t, find(all, "PodDisruptionBudget", "kpssh", ""))
	if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 || pdb.Spec.MinAvailable != nil {
		t.Errorf("PDB spec %+v", pdb.Spec)
	}

	// The dashboard holds the seed's four PromQL queries, each narrowed by
	// the dashboard's variables (a Prometheus shared by several installs),
	// and offers those variables.
	cm := convert[corev1.ConfigMap](t, find(all, "ConfigMap", "kpssh", "kpssh-dashboard"))
	dash := cm.Data["kpssh.json"]
	var doc struct {
		Templating struct {
			List []struct {
				Name     string `json:"name"`
				AllValue string `json:"allValue"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := yaml.Unmarshal([]byte(dash), &doc); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	var vars []string
	for _, v := range doc.Templating.List {
		vars = append(vars, v.Name+"="+v.AllValue)
	}
	if got := strings.Join(vars, " "); got != "datasource= namespace=.* job=.* class=.*" {
		t.Errorf("dashboard variables %s", got)
	}
	const sel = `namespace=~"$namespace",job=~"$job"`
	for _, q := range []string{
		`sum by (class) (kpssh_pool_hosts{` + sel + `,class=~"$class",state="Available"})`,
		`histogram_quantile(0.95, sum by (le) (rate(kpssh_instance_phase_duration_seconds_bucket{` + sel + `,phase="join"}[15m])))`,
		`sum(kpssh_pool_hosts{` + sel + `,class=~"$class",state="Unhealthy"})`,
		`increase(kpssh_host_zombie_actions_total{` + sel + `}[1h])`,
		`kpssh_instance_phase_duration_seconds_count{` + sel + `}`, // phase outcomes
		`kpssh_host_probe_duration_seconds_count{` + sel + `,outcome="error"}`,
		`time() - kpssh_host_last_probe_timestamp_seconds{` + sel + `,class=~"$class"}`,
	} {
		if !strings.Contains(dash, strings.ReplaceAll(q, `"`, `\"`)) {
			t.Errorf("dashboard lacks %s", q)
		}
	}
	if cm.Labels["grafana_dashboard"] != "1" {
		t.Errorf("dashboard labels %v", cm.Labels)
	}
}

// TestDeployment checks the controller Deployment and that the controller's
// own option parsing (Karpenter core's and kpssh's) accepts its environment.
func TestDeployment(t *testing.T) {
	w := setup(t)
	objs := w.template(t)
	d := convert[appsv1.Deployment](t, find(objs, "Deployment", "kpssh", "kpssh"))
	spec := d.Spec.Template.Spec
	if d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
		t.Errorf("strategy %q", d.Spec.Strategy.Type)
	}
	psc := spec.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod securityContext %+v", psc)
	}
	if len(spec.Containers) != 1 {
		t.Fatalf("%d containers", len(spec.Containers))
	}
	c := spec.Containers[0]
	sc := c.SecurityContext
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
		t.Errorf("container securityContext %+v", sc)
	}
	mounts := map[string]bool{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = true
	}
	for _, p := range []string{"/dev/shm", "/tmp", "/home/kpssh"} {
		if !mounts[p] {
			t.Errorf("no writable mount at %s (read-only root): %v", p, c.VolumeMounts)
		}
	}
	for _, v := range spec.Volumes {
		if v.EmptyDir == nil {
			t.Errorf("volume %s is not an emptyDir", v.Name)
		}
	}
	terms := spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if len(terms) != 1 || len(terms[0].MatchExpressions) != 1 || terms[0].MatchExpressions[0].Key != "karpenter.dklesev.github.io/managed" ||
		terms[0].MatchExpressions[0].Operator != corev1.NodeSelectorOpDoesNotExist {
		t.Errorf("anti-affinity %+v", terms)
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("resources %+v", c.Resources)
	}
	if len(c.Args) != 0 || len(c.Command) != 0 {
		t.Errorf("args/command %q %q: unknown flags panic inside Karpenter's operator; the chart configures through the environment", c.Command, c.Args)
	}
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	if env["LEADER_ELECTION_NAME"] != "kpssh-leader-election" || env["DISABLE_LEADER_ELECTION"] != "false" || env["METRICS_PORT"] != "8080" || env["POOL_NAMESPACE"] != "kpssh-system" {
		t.Errorf("env %v", env)
	}

	// Every variable is one the controller reads: it names a flag of the
	// controller's flag set (flag foo-bar ↔ FOO_BAR), and parsing with the
	// environment set succeeds.
	parse := func(t *testing.T, vars []corev1.EnvVar) (*options.Options, *coreoptions.Options, error) {
		for _, e := range vars {
			v := e.Value
			if r := e.ValueFrom; r != nil {
				// A resourceFieldRef resolves to a number: MEMORY_LIMIT
				// (Go's soft limit at 90 %) to the memory request.
				if r.ResourceFieldRef == nil || r.ResourceFieldRef.Resource != "requests.memory" || e.Name != "MEMORY_LIMIT" {
					return nil, nil, fmt.Errorf("env %s from %+v", e.Name, r)
				}
				v = strconv.FormatInt(c.Resources.Requests.Memory().Value(), 10)
			}
			t.Setenv(e.Name, v)
		}
		fs := &coreoptions.FlagSet{FlagSet: flag.NewFlagSet("controller", flag.ContinueOnError)}
		fs.SetOutput(io.Discard)
		core := &coreoptions.Options{}
		core.AddFlags(fs)
		ours := &options.Options{}
		ours.AddFlags(fs)
		for _, e := range vars {
			name := strings.ToLower(strings.ReplaceAll(e.Name, "_", "-"))
			if fs.Lookup(name) == nil {
				return nil, nil, fmt.Errorf("env %s: the controller has no flag %s, so it never reads it", e.Name, name)
			}
		}
		if err := core.Parse(fs); err != nil {
			return nil, nil, err
		}
		if err := ours.Parse(fs); err != nil {
			return nil, nil, err
		}
		if ours.PoolNamespace != env["POOL_NAMESPACE"] || core.LeaderElectionName != "kpssh-leader-election" || core.MemoryLimit != c.Resources.Requests.Memory().Value() {
			return nil, nil, fmt.Errorf("parsed %+v / leader %q memory %d", ours, core.LeaderElectionName, core.MemoryLimit)
		}
		return ours, core, nil
	}
	t.Run("defaults", func(t *testing.T) {
		o, core, err := parse(t, c.Env)
		if err != nil {
			t.Fatal(err)
		}
		if o.Executor != options.ExecutorLocal || o.JobImage != "" {
			t.Errorf("defaults: executor %q job image %q", o.Executor, o.JobImage)
		}
		// A fixed pool: repair acts (reboot first), repair and drift
		// terminate before they replace (nodes of the hosts' reservation),
		// static NodePools are served.
		gates := coreoptions.DefaultFeatureGates()
		gates.NodeRepair, gates.TerminateFirstRepair, gates.TerminateFirstDrift = true, true, true
		gates.ReservedCapacity, gates.StaticCapacity = true, true
		if core.FeatureGates != gates || core.BatchMaxDuration != 10*time.Second || core.BatchIdleDuration != time.Second {
			t.Errorf("defaults: Karpenter core settings %+v", core)
		}
		if o.Repair != cloudprovider.DefaultRepair {
			t.Errorf("defaults: repair %+v, want %+v", o.Repair, cloudprovider.DefaultRepair)
		}
	})
	// MEMORY_LIMIT follows the memory request whenever the chart sets
	// resources (Kubernetes makes a request of a lone limit); none, no soft
	// limit. The default keeps Go's soft limit (90 %) where the controller
	// measured under 200 MiB RSS with 5,000 hosts (docs/performance.md).
	t.Run("memory limit", func(t *testing.T) {
		if req := c.Resources.Requests.Memory().Value(); req*9/10 > 150<<20 || c.Resources.Limits.Memory().Cmp(*c.Resources.Requests.Memory()) <= 0 {
			t.Errorf("default resources %+v: the soft limit (90 %% of the request) above the measured 150 MiB, or no limit above the request", c.Resources)
		}
		for _, tc := range []struct {
			name string
			args []string
			want bool
		}{
			{"a limit only", []string{"--set", "resources.requests=null"}, true},
			{"a request only", []string{"--set", "resources.limits=null"}, true},
			{"no resources", []string{"--set", "resources=null"}, false},
		} {
			objs := w.template(t, tc.args...)
			env := convert[appsv1.Deployment](t, find(objs, "Deployment", "kpssh", "kpssh")).Spec.Template.Spec.Containers[0].Env
			got := false
			for _, e := range env {
				if e.Name == "MEMORY_LIMIT" {
					got = e.ValueFrom != nil && e.ValueFrom.ResourceFieldRef != nil && e.ValueFrom.ResourceFieldRef.Resource == "requests.memory"
				}
			}
			if got != tc.want {
				t.Errorf("%s: MEMORY_LIMIT from requests.memory %v, want %v (%+v)", tc.name, got, tc.want, env)
			}
		}
	})
	// settings: Karpenter core's options as the controller parses them.
	t.Run("settings", func(t *testing.T) {
		objs := w.template(t, "--set", "settings.batchMaxDuration=1m,settings.batchIdleDuration=5s,settings.preferencePolicy=Ignore,settings.minValuesPolicy=BestEffort,"+
			"settings.featureGates.TerminateFirstDrift=false,settings.featureGates.NodeOverlay=false,settings.featureGates.CapacityBuffer=true,"+
			"repair.rebootAfter=0s,repair.replaceAfter=5m",
			"--set-json", `extraEnv=[{"name":"KUBE_CLIENT_QPS","value":"50"}]`)
		dj := convert[appsv1.Deployment](t, find(objs, "Deployment", "kpssh", "kpssh"))
		o, core, err := parse(t, dj.Spec.Template.Spec.Containers[0].Env)
		if err != nil {
			t.Fatal(err)
		}
		if want := (cloudprovider.Repair{ReplaceAfter: 5 * time.Minute}); o.Repair != want {
			t.Errorf("repair %+v, want %+v", o.Repair, want)
		}
		want := coreoptions.DefaultFeatureGates()
		want.NodeRepair, want.TerminateFirstRepair, want.StaticCapacity = true, true, true // the chart's, kept
		want.TerminateFirstDrift, want.NodeOverlay, want.CapacityBuffer = false, false, true
		if core.FeatureGates != want || core.BatchMaxDuration != time.Minute || core.BatchIdleDuration != 5*time.Second ||
			core.PreferencePolicy != coreoptions.PreferencePolicyIgnore || core.MinValuesPolicy != coreoptions.MinValuesPolicyBestEffort || core.KubeClientQPS != 50 {
			t.Errorf("settings parsed as %+v", core)
		}
	})
	// Executor job: the controller accepts the chart's Job settings; the
	// phase image defaults to the controller's own (it holds phase-run).
	t.Run("executor job", func(t *testing.T) {
		for _, tc := range []struct {
			set            []string
			ns, image, ttl string
			hostNet        bool
			memory         string
		}{
			{[]string{"executor=job"}, "kpssh", "", "15m0s", false, "512Mi"}, // image "": the controller's
			{[]string{"executor=job", "jobExecutor.namespace=phases", "jobExecutor.image=reg.example/kpssh-controller:1", "jobExecutor.ttl=1h", "jobExecutor.hostNetwork=true", "jobExecutor.memoryLimit=1Gi",
				"jobExecutor.nodeSelector.pool=ops", "jobExecutor.nodeSelector.zone=a", "jobExecutor.allowManagedNodes=true"},
				"phases", "reg.example/kpssh-controller:1", "1h0m0s", true, "1Gi"},
		} {
			objs := w.template(t, "--set", strings.Join(tc.set, ","))
			dj := convert[appsv1.Deployment](t, find(objs, "Deployment", "kpssh", "kpssh"))
			o, _, err := parse(t, dj.Spec.Template.Spec.Containers[0].Env)
			if err != nil {
				t.Fatalf("%v: %v", tc.set, err)
			}
			if tc.image == "" {
				tc.image = dj.Spec.Template.Spec.Containers[0].Image
			}
			if o.Executor != options.ExecutorJob || o.JobNamespace != tc.ns || o.JobImage != tc.image || o.JobTTL.String() != tc.ttl || o.JobHostNetwork != tc.hostNet || o.JobMemoryLimit != tc.memory || o.JobImagePullPolicy != "IfNotPresent" {
				t.Errorf("%v: parsed %+v", tc.set, o)
			}
			if sel, err := o.NodeSelector(); err != nil || (tc.hostNet && (len(sel) != 2 || sel["pool"] != "ops" || sel["zone"] != "a" || !o.JobAllowManagedNodes)) || (!tc.hostNet && (sel != nil || o.JobAllowManagedNodes)) {
				t.Errorf("%v: placement %v %v, allow managed %v", tc.set, sel, err, o.JobAllowManagedNodes)
			}
			if find(objs, "Role", tc.ns, "kpssh-job-executor") == nil || find(objs, "RoleBinding", tc.ns, "kpssh-job-executor") == nil {
				t.Errorf("%v: no Job executor Role/RoleBinding in %s", tc.set, tc.ns)
			}
		}
	})
}

func TestBadValuesRefused(t *testing.T) {
	w := setup(t)
	cases := []struct {
		set, want string
	}{
		{"foo=1", "additional properties 'foo' not allowed"},
		{"image.typo=x", "additional properties 'typo' not allowed"},
		{"executor=ssh", "/executor"},
		{"replicas=0", "/replicas"},
		{"probe.interval=soon", "/probe/interval"},
		{"podDisruptionBudget.enabled=true,podDisruptionBudget.minAvailable=1", "set maxUnavailable or minAvailable, not both"},
		{"podDisruptionBudget.enabled=true,podDisruptionBudget.maxUnavailable=0", "maxUnavailable 0 would block every node drain forever"},
		{"podDisruptionBudget.enabled=true,podDisruptionBudget.maxUnavailable=null,podDisruptionBudget.minAvailable=1", "minAvailable 1 with 1 replica(s) would block every node drain forever"},
		{"podDisruptionBudget.enabled=true,podDisruptionBudget.maxUnavailable=null,podDisruptionBudget.minAvailable=100%", "minAvailable 100% would block"},
		{"podDisruptionBudget.enabled=true,podDisruptionBudget.maxUnavailable=null", "set maxUnavailable or minAvailable"},
		{"podDisruptionBudget.maxUnavailable=-1", "/podDisruptionBudget/maxUnavailable"},
		{"affinity.nodeAffinity.x=1", "affinity.nodeAffinity is the chart's own"},
		{"serviceAccount.create=false", "serviceAccount.name is required"},
		{"replicas=2,leaderElection.enabled=false", "replicas > 1 needs leaderElection.enabled"},
		{"poolNamespace=Bad_NS", "/poolNamespace"},
		// Restricted egress: every list it opens is given, every CIDR is one.
		{"networkPolicy.enabled=true,networkPolicy.egress.enabled=true", "networkPolicy.egress.apiServerCIDRs is empty"},
		{"networkPolicy.enabled=true,networkPolicy.egress.enabled=true,networkPolicy.egress.apiServerCIDRs={10.0.0.1/32}", "networkPolicy.egress.sshCIDRs is empty"},
		{"networkPolicy.enabled=true," + egressOn + ",networkPolicy.egress.sshCIDRs=null", "networkPolicy.egress.sshCIDRs is empty"},
		{egressOn, "networkPolicy.egress.enabled needs networkPolicy.enabled"},
		{"networkPolicy.enabled=true," + egressOn + ",networkPolicy.egress.apiServerCIDRs={kubernetes.default.svc}", `networkPolicy.egress.apiServerCIDRs: "kubernetes.default.svc" is not a CIDR`},
		{"networkPolicy.enabled=true," + egressOn + ",networkPolicy.egress.sshCIDRs={192.0.2.0/24,10.0.0.1}", `networkPolicy.egress.sshCIDRs: "10.0.0.1" is not a CIDR`},
		{"networkPolicy.enabled=true," + egressOn + ",networkPolicy.egress.sshCIDRs={10.0.0.0/33}", `networkPolicy.egress.sshCIDRs: "10.0.0.0/33" is not a CIDR`},
		{"networkPolicy.enabled=true," + egressOn + ",networkPolicy.egress.sshCIDRs={2001:db8:::/48}", `networkPolicy.egress.sshCIDRs: "2001:db8:::/48" is not a CIDR`},
		{"networkPolicy.enabled=true," + egressOn + ",networkPolicy.egress.sshCIDRs={10}", "/networkPolicy/egress/sshCIDRs/0"},
		{"networkPolicy.enabled=true," + egressOn + ",networkPolicy.egress.sshPorts={0}", "/networkPolicy/egress/sshPorts/0"},
		{"networkPolicy.enabled=true," + egressOn + ",networkPolicy.egress.sshPorts=null", "networkPolicy.egress.sshPorts is empty"},
		{"networkPolicy.enabled=true," + egressOn + ",networkPolicy.egress.apiServerPorts=null", "networkPolicy.egress.apiServerPorts is empty"},
		{"networkPolicy.egress.typo=1", "additional properties 'typo' not allowed"},
		{"tokenSecretPolicy.typo=1", "additional properties 'typo' not allowed"},
		{"global=1", "/global"},
		{"karpenterCRDs.install=maybe", "/karpenterCRDs/install"},
		{"karpenterCRDs.typo=1", "additional properties 'typo' not allowed"},
		{"nameOverride=Bad_Name", "/nameOverride"},
		{"additionalLabels.a=1", "/additionalLabels/a"},
		{"settings.featureGates.Typo=true", "additional properties 'Typo' not allowed"},
		{"settings.featureGates.NodeRepair=yes", "/settings/featureGates/NodeRepair"},
		{"settings.batchMaxDuration=soon", "/settings/batchMaxDuration"},
		{"repair.rebootAfter=10", "/repair/rebootAfter"},
		{"settings.preferencePolicy=Maybe", "/settings/preferencePolicy"},
		{"strategy.type=BlueGreen", "/strategy/type"},
		{"dnsPolicy=ClusterLast", "/dnsPolicy"},
		{"topologySpreadConstraints[0].maxSkew=1", "missing properties 'topologyKey'"},
		{"extraVolumeMounts[0].name=roles,extraVolumeMounts[0].mountPath=roles", "/extraVolumeMounts/0/mountPath"},
		{"extraVolumes[0].name=tmp,extraVolumes[0].emptyDir.medium=Memory", `extraVolumes: "tmp" is the name of one of the chart's own volumes`},
		{"extraEnv[0].name=LOG_LEVEL,extraEnv[0].value=debug", "extraEnv: LOG_LEVEL is set by the chart"},
		{"extraEnv[0].name=FEATURE_GATES,extraEnv[0].value=x,settings.featureGates.NodeRepair=true", "extraEnv: FEATURE_GATES is set by the chart"},
	}
	for _, tc := range cases {
		_, stderr, code := w.run(t, "template", "kpssh", w.chart, "--kube-version", kubeVersion, "--set", tc.set)
		if code == 0 || !strings.Contains(stderr, tc.want) {
			t.Errorf("--set %s: exit %d, stderr %q, want it to contain %q", tc.set, code, stderr, tc.want)
		}
	}
	// The admission policy's API is GA from Kubernetes 1.30.
	want := "tokenSecretPolicy.enabled needs Kubernetes ≥ 1.30"
	if _, stderr, code := w.run(t, "template", "kpssh", w.chart, "--kube-version", "1.29.9", "--set", "tokenSecretPolicy.enabled=true"); code == 0 || !strings.Contains(stderr, want) {
		t.Errorf("tokenSecretPolicy on 1.29: exit %d, stderr %q, want it to contain %q", code, stderr, want)
	}
	// A sensible budget with replicas passes.
	if _, stderr, code := w.run(t, "template", "kpssh", w.chart, "--kube-version", kubeVersion, "--set",
		"replicas=3,podDisruptionBudget.enabled=true,podDisruptionBudget.maxUnavailable=null,podDisruptionBudget.minAvailable=2"); code != 0 {
		t.Errorf("minAvailable 2 of 3: %s", stderr)
	}
}

// TestNetworkPolicy: ingress only by default; with networkPolicy.egress
// the controller may reach exactly the API server, cluster DNS and the
// pool's SSH ports, nothing else.
func TestNetworkPolicy(t *testing.T) {
	w := setup(t)
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	port := func(p int32, proto corev1.Protocol) networkingv1.NetworkPolicyPort {
		v := intstr.FromInt32(p)
		return networkingv1.NetworkPolicyPort{Protocol: &proto, Port: &v}
	}
	cidrs := func(cs ...string) []networkingv1.NetworkPolicyPeer {
		var out []networkingv1.NetworkPolicyPeer
		for _, c := range cs {
			out = append(out, networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: c}})
		}
		return out
	}
	kubeDNS := []networkingv1.NetworkPolicyPeer{{
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "kube-system"}},
		PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"k8s-app": "kube-dns"}},
	}}
	base := networkingv1.NetworkPolicySpec{
		PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": "kpssh", "app.kubernetes.io/instance": "kpssh"}},
		PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
		Ingress: []networkingv1.NetworkPolicyIngressRule{
			{Ports: []networkingv1.NetworkPolicyPort{port(8080, tcp)}},
			{Ports: []networkingv1.NetworkPolicyPort{port(8081, tcp)}},
		},
	}
	restricted := func(egress ...networkingv1.NetworkPolicyEgressRule) networkingv1.NetworkPolicySpec {
		s := *base.DeepCopy()
		s.PolicyTypes = append(s.PolicyTypes, networkingv1.PolicyTypeEgress)
		s.Egress = egress
		return s
	}
	for _, tc := range []struct {
		name string
		args []string
		want networkingv1.NetworkPolicySpec
	}{
		{"ingress only", []string{"--set", "networkPolicy.enabled=true"}, base},
		{"egress restricted", []string{"--set", "networkPolicy.enabled=true," + egressOn}, restricted(
			networkingv1.NetworkPolicyEgressRule{To: cidrs("10.0.0.1/32", "fd00::1/128"), Ports: []networkingv1.NetworkPolicyPort{port(443, tcp), port(6443, tcp)}},
			networkingv1.NetworkPolicyEgressRule{To: cidrs("192.0.2.0/24"), Ports: []networkingv1.NetworkPolicyPort{port(22, tcp)}},
			networkingv1.NetworkPolicyEgressRule{To: kubeDNS, Ports: []networkingv1.NetworkPolicyPort{port(53, udp), port(53, tcp)}},
		)},
		// Other ports, every CIDR form, DNS peers emptied: port 53 to anywhere.
		{"egress ports and DNS", []string{"--set", "networkPolicy.enabled=true," + egressOn +
			",networkPolicy.egress.apiServerPorts={6443},networkPolicy.egress.sshPorts={22,2222}" +
			",networkPolicy.egress.sshCIDRs={0.0.0.0/0,::/0,2001:db8::/32,fe80::1:2:3:4/64,1:2:3:4:5:6:7:8/128}",
			"--set-json", "networkPolicy.egress.dnsTo=[]"}, restricted(
			networkingv1.NetworkPolicyEgressRule{To: cidrs("10.0.0.1/32", "fd00::1/128"), Ports: []networkingv1.NetworkPolicyPort{port(6443, tcp)}},
			networkingv1.NetworkPolicyEgressRule{To: cidrs("0.0.0.0/0", "::/0", "2001:db8::/32", "fe80::1:2:3:4/64", "1:2:3:4:5:6:7:8/128"), Ports: []networkingv1.NetworkPolicyPort{port(22, tcp), port(2222, tcp)}},
			networkingv1.NetworkPolicyEgressRule{Ports: []networkingv1.NetworkPolicyPort{port(53, udp), port(53, tcp)}},
		)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			np := convert[networkingv1.NetworkPolicy](t, find(w.template(t, tc.args...), "NetworkPolicy", "kpssh", "kpssh"))
			if !equality.Semantic.DeepEqual(np.Spec, tc.want) {
				got, _ := yaml.Marshal(np.Spec)
				want, _ := yaml.Marshal(tc.want)
				t.Errorf("NetworkPolicy spec\n%s\nwant\n%s", got, want)
			}
		})
	}
}

// TestHelmInstall installs the chart, every optional object on, onto a
// real kube-apiserver that has no CRDs yet; the apiserver accepts every
// object (the restricted-egress NetworkPolicy among them) and its
// authorizer grants the ServiceAccount exactly the scoped permissions; an
// upgrade with tokenSecretPolicy then holds the ServiceAccount, as its
// admission policy, to bootstrap token Secrets in kube-system.
func TestHelmInstall(t *testing.T) {
	w := setup(t)
	k := startCluster(t)
	cfg, cl, kubeconfig, scheme := k.cfg, k.cl, k.kubeconfig, k.scheme
	ctx := context.Background()
	// No Prometheus operator here: a stand-in ServiceMonitor CRD (any spec)
	// so the optional ServiceMonitor has a kind to be created as.
	if err := cl.Create(ctx, serviceMonitorCRD()); err != nil {
		t.Fatal(err)
	}
	waitEstablished(t, cl, "servicemonitors.monitoring.coreos.com")

	args := append([]string{"install", "kpssh", w.chart, "--kubeconfig", kubeconfig, "--namespace", "kpssh", "--timeout", "2m"},
		"--set", "serviceMonitor.enabled=true,networkPolicy.enabled=true,podDisruptionBudget.enabled=true,dashboard.enabled=true,"+egressOn)
	out, stderr, code := w.run(t, args...)
	if code != 0 {
		t.Fatalf("helm install: exit %d\n%s%s", code, out, stderr)
	}
	if !strings.Contains(out, "STATUS: deployed") || !strings.Contains(out, "kubectl kpssh hosts --namespace kpssh-system") || !strings.Contains(out, "Lease: kpssh/kpssh-leader-election") {
		t.Errorf("helm install output:\n%s", out)
	}

	// The CRDs were created by the install and are served.
	ours, err := testenv.OurCRDs()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range append(append([]*apiextensionsv1.CustomResourceDefinition{}, ours...), karpapis.CRDs...) {
		waitEstablished(t, cl, c.Name)
	}
	// Every object of the manifest exists in the apiserver.
	manifest, stderr, code := w.run(t, "get", "manifest", "kpssh", "--kubeconfig", kubeconfig, "--namespace", "kpssh")
	if code != 0 {
		t.Fatalf("helm get manifest: %s", stderr)
	}
	objs := decodeAll(t, manifest)
	// ServiceAccount, ClusterRole(Binding), 5 Roles + Bindings, Deployment,
	// Service, ServiceMonitor, NetworkPolicy, PDB, dashboard ConfigMap, and
	// Karpenter core's 4 CRDs (karpenterCRDs.install, the default).
	if len(objs) != 23 {
		t.Fatalf("%d objects in the release manifest, want 23: %v", len(objs), kinds(objs))
	}
	for _, o := range objs {
		got := &unstructured.Unstructured{}
		got.SetGroupVersionKind(o.GroupVersionKind())
		if err := cl.Get(ctx, client.ObjectKey{Namespace: o.GetNamespace(), Name: o.GetName()}, got); err != nil {
			t.Errorf("%s %s/%s not in the apiserver: %v", o.GetKind(), o.GetNamespace(), o.GetName(), err)
		}
	}
	// The restricted-egress NetworkPolicy passed the apiserver's validation
	// and is stored as rendered (no CNI here: nothing enforces it).
	np := convert[networkingv1.NetworkPolicy](t, find(objs, "NetworkPolicy", "kpssh", "kpssh"))
	var storedNP networkingv1.NetworkPolicy
	if err := cl.Get(ctx, client.ObjectKey{Namespace: "kpssh", Name: "kpssh"}, &storedNP); err != nil {
		t.Fatal(err)
	}
	if len(storedNP.Spec.Egress) != 3 || len(storedNP.Spec.PolicyTypes) != 2 || !equality.Semantic.DeepEqual(storedNP.Spec, np.Spec) {
		t.Errorf("NetworkPolicy as stored %+v, rendered %+v", storedNP.Spec, np.Spec)
	}
	var d appsv1.Deployment
	if err := cl.Get(ctx, client.ObjectKey{Namespace: "kpssh", Name: "kpssh"}, &d); err != nil {
		t.Fatal(err)
	}
	if d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType || d.Spec.Template.Spec.ServiceAccountName != "kpssh" {
		t.Errorf("Deployment as stored: %+v", d.Spec)
	}

	// RBAC as the apiserver's authorizer sees it.
	sa := "system:serviceaccount:kpssh:kpssh"
	checkAccess(t, cl, sa, "executor local", []access{
		{"get", "", "secrets", "", "kpssh-system", "host-key", true},
		{"list", "", "secrets", "", "kpssh-system", "", false},
		{"watch", "", "secrets", "", "kpssh-system", "", false},
		{"update", "", "secrets", "", "kpssh-system", "host-key", false},
		{"get", "", "secrets", "", "default", "x", false},
		{"get", "", "secrets", "", "kpssh", "x", false},
		{"create", "", "secrets", "", "kube-system", "", true},
		{"delete", "", "secrets", "", "kube-system", "bootstrap-token-abcdef", true},
		{"get", "", "secrets", "", "kube-system", "bootstrap-token-abcdef", false}, // tokens are minted and deleted, never read back
		{"list", "", "secrets", "", "kube-system", "", false},
		{"watch", "", "secrets", "", "kube-system", "", false},
		{"update", "", "secrets", "", "kube-system", "bootstrap-token-abcdef", false},
		{"get", "", "configmaps", "", "kube-public", "cluster-info", true},
		{"get", "", "configmaps", "", "kube-public", "other", false},
		{"get", "karpenter.dklesev.github.io", "sshhosts", "", "kpssh-system", "h1", true},
		{"list", "karpenter.dklesev.github.io", "sshhosts", "", "kpssh-system", "", true},
		{"update", "karpenter.dklesev.github.io", "sshhosts", "", "kpssh-system", "h1", false},
		{"patch", "karpenter.dklesev.github.io", "sshhosts", "", "kpssh-system", "h1", false},
		{"create", "karpenter.dklesev.github.io", "sshhosts", "", "kpssh-system", "", false},
		{"delete", "karpenter.dklesev.github.io", "sshhosts", "", "kpssh-system", "h1", false},
		{"patch", "karpenter.dklesev.github.io", "sshhosts", "status", "kpssh-system", "h1", true},
		{"get", "karpenter.dklesev.github.io", "sshjoinprofiles", "", "", "p", true},
		{"update", "karpenter.dklesev.github.io", "sshjoinprofiles", "", "", "p", false},
		{"patch", "karpenter.dklesev.github.io", "sshjoinprofiles", "", "", "p", false},
		{"patch", "karpenter.dklesev.github.io", "sshnodeclasses", "status", "", "c", true},
		{"create", "karpenter.sh", "nodeclaims", "", "", "", true},
		{"patch", "karpenter.sh", "nodepools", "status", "", "p", true},
		{"patch", "", "nodes", "", "", "n1", true},
		{"delete", "", "nodes", "", "", "n1", true},
		{"create", "", "nodes", "", "", "", false},
		{"create", "", "pods", "eviction", "default", "p", true},
		{"create", "", "events", "", "default", "", true},
		{"create", "coordination.k8s.io", "leases", "", "kpssh", "", true},
		{"update", "coordination.k8s.io", "leases", "", "kpssh", "kpssh-leader-election", true},
		{"update", "coordination.k8s.io", "leases", "", "kpssh", "karpenter-leader-election", false},
		{"delete", "coordination.k8s.io", "leases", "", "kube-node-lease", "n1", true},
		{"create", "batch", "jobs", "", "kpssh", "", false}, // executor local: no Job RBAC
	})

	// RBAC cannot scope a create by name: without tokenSecretPolicy the
	// ServiceAccount may create any Secret in kube-system.
	saCfg := rest.CopyConfig(cfg)
	saCfg.Impersonate = rest.ImpersonationConfig{UserName: sa, Groups: saGroups}
	asSA, err := client.New(saCfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	if err := asSA.Create(ctx, kubeSystemSecret("kpssh-attack", corev1.SecretTypeOpaque)); err != nil {
		t.Fatalf("without tokenSecretPolicy: the ServiceAccount's create of an Opaque Secret in kube-system: %v", err)
	}
	if err := cl.Delete(ctx, kubeSystemSecret("kpssh-attack", "")); err != nil {
		t.Fatal(err)
	}
	// With it, an admission policy holds the ServiceAccount to bootstrap
	// token Secrets there.
	if out, stderr, code := w.run(t, "upgrade", "kpssh", w.chart, "--kubeconfig", kubeconfig, "--namespace", "kpssh", "--timeout", "2m", "--reuse-values", "--set", "tokenSecretPolicy.enabled=true"); code != 0 {
		t.Fatalf("helm upgrade tokenSecretPolicy.enabled=true: exit %d\n%s%s", code, out, stderr)
	}
	checkTokenSecretPolicy(t, cl, asSA)

	// Executor job (an upgrade of the same release): the Job executor's Role
	// in the Job namespace, and nothing more than it needs there.
	if out, stderr, code := w.run(t, "upgrade", "kpssh", w.chart, "--kubeconfig", kubeconfig, "--namespace", "kpssh", "--timeout", "2m", "--reuse-values", "--set", "executor=job"); code != 0 {
		t.Fatalf("helm upgrade executor=job: exit %d\n%s%s", code, out, stderr)
	} else if !strings.Contains(out, `Executor "job": every phase runs as a Job in namespace kpssh`) {
		t.Errorf("NOTES of executor job:\n%s", out)
	}
	checkAccess(t, cl, sa, "executor job", []access{
		{"create", "batch", "jobs", "", "kpssh", "", true},
		{"get", "batch", "jobs", "", "kpssh", "kpssh-join-0123", true},
		{"list", "batch", "jobs", "", "kpssh", "", true},
		{"watch", "batch", "jobs", "", "kpssh", "", true},
		{"delete", "batch", "jobs", "", "kpssh", "kpssh-join-0123", true},
		{"update", "batch", "jobs", "", "kpssh", "kpssh-join-0123", false},
		{"create", "batch", "jobs", "", "default", "", false},
		{"create", "", "secrets", "", "kpssh", "", true},
		{"delete", "", "secrets", "", "kpssh", "kpssh-join-0123", true},
		{"get", "", "secrets", "", "kpssh", "kpssh-join-0123", true}, // the owner of a Secret under the inputs' name (metadata only, in the code)
		{"list", "", "secrets", "", "kpssh", "", false},
		{"get", "", "pods", "", "kpssh", "p", true},
		{"list", "", "pods", "", "kpssh", "", true},
		{"watch", "", "pods", "", "kpssh", "", true},
		{"create", "", "pods", "", "kpssh", "", false},
		{"get", "", "pods", "log", "kpssh", "p", false},
	})

	// Uninstall removes what install made (CRDs stay, as helm keeps them).
	if _, stderr, code := w.run(t, "uninstall", "kpssh", "--kubeconfig", kubeconfig, "--namespace", "kpssh", "--wait", "--timeout", "2m"); code != 0 {
		t.Fatalf("helm uninstall: %s", stderr)
	}
	if err := cl.Get(ctx, client.ObjectKey{Namespace: "kpssh", Name: "kpssh"}, &appsv1.Deployment{}); err == nil {
		t.Error("Deployment left after uninstall")
	}
}

// cluster is a real kube-apiserver (envtest) without any CRD, the
// namespaces kpssh and kpssh-system created, and an admin kubeconfig for helm.
type cluster struct {
	cfg        *rest.Config
	cl         client.Client
	kubeconfig string
	scheme     *runtime.Scheme
}

func startCluster(t *testing.T) *cluster {
	t.Helper()
	cfg, cl, kubeconfig := startAPIServer(t, nil)
	for _, ns := range []string{"kpssh", "kpssh-system"} {
		if err := cl.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	for _, ns := range []string{"kube-system", "kube-public", "kube-node-lease"} {
		waitNamespace(t, cl, ns)
	}
	return &cluster{cfg: cfg, cl: cl, kubeconfig: kubeconfig, scheme: cl.Scheme()}
}

// startAPIServer starts a kube-apiserver without CRDs for one test (stopped
// when it ends), with extra kube-apiserver flags, and returns its config, a
// client and an admin (system:masters) kubeconfig file.
func startAPIServer(t *testing.T, flags map[string]string) (*rest.Config, client.Client, string) {
	t.Helper()
	ctrllog.SetLogger(logr.Discard()) // envtest's own log lines
	assets, err := testenv.Assets()
	if err != nil {
		t.Fatal(err)
	}
	scheme := testenv.Scheme()
	te := &envtest.Environment{BinaryAssetsDirectory: assets, Scheme: scheme, ControlPlaneStartTimeout: 2 * time.Minute, ControlPlaneStopTimeout: time.Minute}
	for k, v := range flags {
		te.ControlPlane.GetAPIServer().Configure().Set(k, v)
	}
	cfg, err := te.Start()
	if err != nil {
		t.Fatalf("start kube-apiserver: %v", err)
	}
	t.Cleanup(func() {
		if err := te.Stop(); err != nil {
			t.Errorf("stop kube-apiserver: %v", err)
		}
	})
	user, err := te.ControlPlane.AddUser(envtest.User{Name: "chart-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := user.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, kc, 0o600); err != nil {
		t.Fatal(err)
	}
	cl, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return cfg, cl, kubeconfig
}

// checkTokenSecretPolicy: as the controller's ServiceAccount (asSA), the
// controller's own token code mints and deletes bootstrap tokens in
// kube-system; every other Secret there is refused, create and delete, with
// the policy's message.
func checkTokenSecretPolicy(t *testing.T, cl, asSA client.Client) {
	t.Helper()
	ctx := context.Background()
	refused := func(what, verb string, err error) {
		t.Helper()
		want := "may only " + verb + " Secrets named bootstrap-token-<id> of type bootstrap.kubernetes.io/token in kube-system"
		switch {
		case err == nil:
			t.Errorf("tokenSecretPolicy: %s: allowed", what)
		case !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), want):
			t.Errorf("tokenSecretPolicy: %s: %v, want Forbidden with %q", what, err, want)
		default:
			t.Logf("%s: refused: %v", what, err)
		}
	}
	// The apiserver loads a new policy a moment after it is created.
	eventually(t, "tokenSecretPolicy in force", func() (bool, error) {
		err := asSA.Create(ctx, kubeSystemSecret("kpssh-attack", corev1.SecretTypeOpaque))
		if err == nil {
			return false, errors.Join(errors.New("created"), cl.Delete(ctx, kubeSystemSecret("kpssh-attack", "")))
		}
		return strings.Contains(err.Error(), "bootstrap-token-<id>"), err
	})
	for _, tc := range []struct {
		what string
		s    *corev1.Secret
	}{
		{"an Opaque Secret", kubeSystemSecret("kpssh-attack", corev1.SecretTypeOpaque)},
		{"an Opaque Secret named like a token", kubeSystemSecret("bootstrap-token-abcdeg", corev1.SecretTypeOpaque)},
		{"a token Secret named otherwise", kubeSystemSecret("kpssh-attack", bootstrapapi.SecretTypeBootstrapToken)},
		{"a token Secret with a 7-character id", kubeSystemSecret("bootstrap-token-abcdefg", bootstrapapi.SecretTypeBootstrapToken)},
		{"a TLS Secret", kubeSystemSecret("bootstrap-token-abcdeh", corev1.SecretTypeTLS)},
	} {
		err := asSA.Create(ctx, tc.s)
		refused("create "+tc.what+" "+tc.s.Name, "create", err)
		if err == nil {
			_ = cl.Delete(ctx, tc.s)
		}
	}
	// The controller's token code works under the policy and without get.
	tokens := token.New(asSA)
	tok, err := tokens.Mint(ctx, "nc-1")
	if err != nil {
		t.Fatalf("tokenSecretPolicy: mint as the ServiceAccount: %v", err)
	}
	// Other Secrets in kube-system (the policy binds the ServiceAccount
	// only): the admin creates one, the ServiceAccount cannot delete it.
	victim := kubeSystemSecret("kpssh-victim", corev1.SecretTypeOpaque)
	if err := cl.Create(ctx, victim); err != nil {
		t.Fatalf("admin create in kube-system under the policy: %v", err)
	}
	refused("delete an Opaque Secret", "delete", asSA.Delete(ctx, kubeSystemSecret("kpssh-victim", "")))
	if err := cl.Get(ctx, client.ObjectKeyFromObject(victim), &corev1.Secret{}); err != nil {
		t.Errorf("tokenSecretPolicy: %s after a refused delete: %v", victim.Name, err)
	}
	if err := tokens.Delete(ctx, tok.ID); err != nil {
		t.Errorf("tokenSecretPolicy: delete token as the ServiceAccount: %v", err)
	}
	if err := cl.Get(ctx, client.ObjectKey{Namespace: token.Namespace, Name: token.SecretName(tok.ID)}, &corev1.Secret{}); !apierrors.IsNotFound(err) {
		t.Errorf("tokenSecretPolicy: token Secret after its delete: %v", err)
	}
	if err := cl.Delete(ctx, victim); err != nil {
		t.Error(err)
	}
}

// kubeSystemSecret is a Secret in kube-system (typ "": for a delete).
func kubeSystemSecret(name string, typ corev1.SecretType) *corev1.Secret {
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: name}, Type: typ}
	switch typ {
	case "":
	case corev1.SecretTypeTLS:
		s.Data = map[string][]byte{corev1.TLSCertKey: []byte("c"), corev1.TLSPrivateKeyKey: []byte("k")}
	default:
		s.Data = map[string][]byte{"k": []byte("v")}
	}
	return s
}

// saGroups are the groups of the controller's ServiceAccount (release namespace kpssh).
var saGroups = []string{"system:serviceaccounts", "system:serviceaccounts:kpssh", "system:authenticated"}

// access is one SubjectAccessReview and its expected answer.
type access struct {
	verb, group, resource, sub, ns, name string
	allowed                              bool
}

// checkAccess asks the apiserver's authorizer about each case for user.
func checkAccess(t *testing.T, cl client.Client, user, what string, cases []access) {
	t.Helper()
	for _, tc := range cases {
		var got *authzv1.SubjectAccessReview
		// The authorizer's RBAC informer may lag an install or upgrade a
		// moment: an expected allow is retried, a deny is taken as it is.
		eventually(t, what+" "+tc.verb+" "+tc.resource, func() (bool, error) {
			got = &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
				User:               user,
				Groups:             saGroups,
				ResourceAttributes: &authzv1.ResourceAttributes{Verb: tc.verb, Group: tc.group, Resource: tc.resource, Subresource: tc.sub, Namespace: tc.ns, Name: tc.name},
			}}
			if err := cl.Create(context.Background(), got); err != nil {
				return false, err
			}
			return got.Status.Allowed == tc.allowed || !tc.allowed, nil
		})
		if got.Status.Allowed != tc.allowed {
			t.Errorf("%s: %s %s/%s %s in %q name %q: allowed %v, want %v (%s)", what, tc.verb, tc.group, tc.resource, tc.sub, tc.ns, tc.name, got.Status.Allowed, tc.allowed, got.Status.Reason)
		}
	}
}

func serviceMonitorCRD() *apiextensionsv1.CustomResourceDefinition {
	preserve := true
	return &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "servicemonitors.monitoring.coreos.com"},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: "monitoring.coreos.com",
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "servicemonitors", Singular: "servicemonitor", Kind: "ServiceMonitor", ListKind: "ServiceMonitorList"},
			Scope: apiextensionsv1.NamespaceScoped,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1", Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{Type: "object", XPreserveUnknownFields: &preserve}}}},
		},
	}
}

// eventually polls cond with a generous bound (loaded CI machines).
func eventually(t *testing.T, what string, cond func() (bool, error)) {
	t.Helper()
	eventuallyWithin(t, what, 2*time.Minute, cond)
}

// eventuallyWithin: cond's error says why it is not true yet.
func eventuallyWithin(t *testing.T, what string, d time.Duration, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ok, err := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v (last: %v)", what, d, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func waitEstablished(t *testing.T, cl client.Client, name string) {
	t.Helper()
	eventually(t, "CRD "+name+" established", func() (bool, error) {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := cl.Get(context.Background(), client.ObjectKey{Name: name}, crd); err != nil {
			return false, err
		}
		for _, c := range crd.Status.Conditions {
			if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	})
}

// waitNamespace: the apiserver creates its system namespaces shortly after start.
func waitNamespace(t *testing.T, cl client.Client, name string) {
	t.Helper()
	eventually(t, "namespace "+name, func() (bool, error) {
		err := cl.Get(context.Background(), client.ObjectKey{Name: name}, &corev1.Namespace{})
		return err == nil, err
	})
}
