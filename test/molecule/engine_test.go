package molecule_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/engine"
	"github.com/dklesev/kpssh/test/hostenv"
)

// testEngineRuns runs tls_bootstrap's install, join and leave, and their
// refusals beside the script twin's, through the phase engine itself (the
// play it renders, !unsafe variables, KPSSH_* environment, the kpssh_events
// callback), not through converge.yml: the scenarios' way of calling the
// role must be the engine's. tg's host has the stand-in mirror (prepared by
// the caller).
func testEngineRuns(t *testing.T, w *hostenv.World, i int) {
	e, conn, shared := roleEngine(t, w, i)
	h := w.Host(i)
	c := engine.Context{
		ClusterEndpoint: shared["cluster_endpoint"], ClusterCAB64: shared["cluster_ca_b64"],
		BootstrapToken: shared["bootstrap_token"], NodeName: "kpssh-engine-" + h.Name,
		ProviderID: "kpssh://kpssh-system/" + h.Name, HostAddress: h.Address, NodeAddress: "192.0.2.77",
		NodeLabels: "kpssh.example/pool=engine", Taints: "karpenter.sh/unregistered:NoExecute",
		// A var value that would break naive templating: the engine passes it !unsafe.
		Vars: map[string]string{"k8sMinor": "1.36", "binarySource": "/srv/kpssh-mirror", "note": `{{ lookup('env', 'HOME') }} $(id)`},
	}
	run := func(p engine.Phase) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		r := e.Run(ctx, engine.Request{Phase: p, Conn: conn, Source: engine.Source{Role: "tls_bootstrap"}, Context: c, Timeout: 8 * time.Minute})
		if strings.Contains(r.Message, "0123456789abcdef") || strings.Contains(r.FailedTask, "0123456789abcdef") {
			t.Errorf("%s: the token is in the result", p)
		}
		if r.Outcome != engine.Succeeded {
			t.Fatalf("%s through the engine: %s (task %q): %s", p, r.Outcome, r.FailedTask, r.Message)
		}
		t.Logf("%s through the engine: %s in %v", p, r.Outcome, r.Duration.Round(time.Millisecond))
	}
	units := func() string {
		return w.MustRun(i, "for u in kubelet containerd; do echo $(systemctl is-active $u) $(systemctl is-enabled $u); done | tr '\\n' ' '")
	}
	testJoinChecks(t, e, conn, c, w, i, false)
	coll, err := engine.FindCollectionsPath()
	if err != nil {
		t.Fatal(err)
	}
	testCollectionRole(t, coll, conn, c)
	testInstallChecks(t, e, conn, c, w, i)
	run(engine.PhaseInstall)
	// After the write, a kubelet of another minor than k8sMinor fails both
	// (the role in its one check after the write).
	checkTwins(t, e, conn, engine.PhaseInstall, c, "Check the installed kubelet is a release of k8sMinor", []twinCheck{
		{"installed kubelet of another minor", withVars(c, "k8sMinor", "1.35"), "installed kubelet reports minor '1.36', var k8sMinor is 1.35: fix the binary source or the var", ""},
	})
	t.Logf("install again (the script wrote its own containerd unit):")
	run(engine.PhaseInstall)
	testJoinChecks(t, e, conn, c, w, i, true)
	run(engine.PhaseJoin)
	if got := units(); got != "active enabled active enabled" {
		t.Errorf("after join through the engine: kubelet, containerd are %q", got)
	}
	argv := strings.Split(w.MustRun(i, "cat /run/kpssh-stub/kubelet.argv"), "\n")
	for _, want := range []string{"--provider-id=" + c.ProviderID, "--register-with-taints=" + c.Taints, "--node-ip=" + c.NodeAddress, "--hostname-override=" + c.NodeName} {
		if !contains(argv, want) {
			t.Errorf("kubelet started without %s:\n%s", want, argv)
		}
	}
	run(engine.PhaseLeave)
	if got := units(); got != "inactive disabled inactive disabled" {
		t.Errorf("after leave through the engine: kubelet, containerd are %q", got)
	}
}

// roleEngine is a phase engine with the checkout's roles, the connection
// to host i, and the shared kpssh context's values
// (shared/kpssh-context.yml's kpssh map).
func roleEngine(t *testing.T, w *hostenv.World, i int) (*engine.Local, engine.Connection, map[string]string) {
	t.Helper()
	ctxFile, err := os.ReadFile(filepath.Join("shared", "kpssh-context.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var shared struct {
		Kpssh map[string]string `yaml:"kpssh"`
	}
	if err := yaml.Unmarshal(ctxFile, &shared); err != nil {
		t.Fatal(err)
	}
	roles, err := filepath.Abs("../../roles")
	if err != nil {
		t.Fatal(err)
	}
	coll, err := engine.FindCollectionsPath()
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(engine.Options{CollectionsPath: coll, RolesPath: []string{roles}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	key, err := os.ReadFile(w.Inventory().ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	h := w.Host(i)
	return e, engine.Connection{Address: h.Address, Port: int32(h.Port), User: h.User, PrivateKey: key, HostKey: h.HostKey}, shared.Kpssh
}

// twinCheck is one refusal the role and its script twin
// (examples/scripts/profile-tls-bootstrap.yaml) share: the phase run with
// context c fails with message want. role, when set, is the role's message
// where it differs from the script's: the choices are the role's argument
// specs, which Ansible checks (in the entry point's validation task) before
// the role's own checks, in its own words, naming the role var.
type twinCheck struct {
	name string
	c    engine.Context
	want string
	role string
}

// withVars and with derive contexts from good: with the vars given as
// key, value pairs set, or changed by f.
func withVars(good engine.Context, kv ...string) engine.Context {
	c := good
	c.Vars = map[string]string{}
	for k, v := range good.Vars {
		c.Vars[k] = v
	}
	for j := 0; j < len(kv); j += 2 {
		c.Vars[kv[j]] = kv[j+1]
	}
	return c
}

func with(good engine.Context, f func(*engine.Context)) engine.Context {
	c := withVars(good)
	f(&c)
	return c
}

// checkTwins runs phase p for each check with the role and with the script
// twin: both must fail with the check's message, the role in roleTask (its
// own checks) or, for a choice, in the entry point's argument validation.
// The role checks all in one task, the script check by check: the first
// failing check must win in both. No message may show the token.
func checkTwins(t *testing.T, e *engine.Local, conn engine.Connection, p engine.Phase, good engine.Context, roleTask string, checks []twinCheck) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "examples", "scripts", "profile-tls-bootstrap.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var prof v1beta1.SSHJoinProfile
	if err := sigsyaml.UnmarshalStrict(raw, &prof); err != nil || prof.Spec.Scripts == nil {
		t.Fatalf("script profile: %v", err)
	}
	script := map[engine.Phase]v1beta1.Script{engine.PhaseInstall: prof.Spec.Scripts.Install, engine.PhaseJoin: prof.Spec.Scripts.Join}[p]
	if script == "" {
		t.Fatalf("the script profile has no %s script", p)
	}
	for _, tc := range checks {
		for _, src := range []struct {
			kind string
			s    engine.Source
		}{{"role", engine.Source{Role: "tls_bootstrap"}}, {"script", engine.Source{Script: string(script)}}} {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			r := e.Run(ctx, engine.Request{Phase: p, Conn: conn, Source: src.s, Context: tc.c, Timeout: 2 * time.Minute})
			cancel()
			want := tc.want
			if src.kind == "role" {
				task := roleTask
				if tc.role != "" {
					want = tc.role
					// The argument spec's failure names the role's entry point.
					task = fmt.Sprintf("Validating arguments against arg spec '%s'", p)
				}
				if !strings.Contains(r.FailedTask, task) {
					t.Errorf("%s, role %s: failed task %q, want %q", tc.name, p, r.FailedTask, task)
				}
			}
			if r.Outcome == engine.Succeeded || !strings.Contains(r.Message, want) {
				t.Errorf("%s, %s %s: %s (task %q): %q, want the message %q", tc.name, src.kind, p, r.Outcome, r.FailedTask, r.Message, want)
			}
			if strings.Contains(r.Message, good.BootstrapToken) || strings.Contains(r.Message, tc.c.BootstrapToken) {
				t.Errorf("%s, %s %s: the token is in the message", tc.name, src.kind, p)
			}
		}
	}
}

// testJoinChecks: the role's join refuses bad vars and a bad join context
// with the script twin's message, before it touches the host. Before
// install (installed false) the var and context checks, after it the CA's.
func testJoinChecks(t *testing.T, e *engine.Local, conn engine.Connection, good engine.Context, w *hostenv.World, i int, installed bool) {
	t.Helper()
	checks := []twinCheck{
		{"kubelet of another minor", withVars(good, "k8sMinor", "1.35"), "var k8sMinor is 1.35: bump the profile's spec.version so install runs again", ""},
		{"CA not base64", with(good, func(c *engine.Context) { c.ClusterCAB64 = "not*base64" }), "KPSSH_CLUSTER_CA_B64 is not valid base64", ""},
		{"CA not PEM", with(good, func(c *engine.Context) { c.ClusterCAB64 = "aGVsbG8gd29ybGQ=" }), "KPSSH_CLUSTER_CA_B64 does not decode to a PEM certificate", ""},
	}
	if !installed {
		checks = []twinCheck{
			{"not installed", withVars(good), "/usr/local/bin/kubelet is missing: the install phase has not run", ""},
			{"no k8sMinor", withVars(good, "k8sMinor", ""), "var k8sMinor is required: the control plane's Kubernetes minor (e.g. 1.36), set in the SSHNodeClass vars", ""},
			{"bad k8sMinor", withVars(good, "k8sMinor", "136"), "var k8sMinor must look like 1.36, got '136'", ""},
			{"bad serverTLSBootstrap", withVars(good, "serverTLSBootstrap", "yes"), "var serverTLSBootstrap must be true or false, got 'yes'",
				"value of tls_bootstrap_server_tls_bootstrap must be one of: true, false, got: yes"},
			{"bad cgroupDriver", withVars(good, "cgroupDriver", "docker"), "var cgroupDriver must be systemd or cgroupfs, got 'docker'",
				"value of tls_bootstrap_cgroup_driver must be one of: systemd, cgroupfs, got: docker"},
			{"bad clusterDNS", withVars(good, "clusterDNS", "10.96.0.10,dns"), "var clusterDNS must be IP addresses separated by commas, got '10.96.0.10,dns'", ""},
			{"two bad vars: the first wins", withVars(good, "k8sMinor", "x", "clusterDNS", "dns"), "var k8sMinor must look like 1.36, got 'x'", ""},
			{"a bad choice wins over a bad shape in the role", withVars(good, "k8sMinor", "x", "cgroupDriver", "docker"), "var k8sMinor must look like 1.36, got 'x'",
				"value of tls_bootstrap_cgroup_driver must be one of: systemd, cgroupfs, got: docker"},
			{"bad token", with(good, func(c *engine.Context) { c.BootstrapToken = "abcdef.0123456789ABCDEF" }), "KPSSH_BOOTSTRAP_TOKEN is not a bootstrap token (<id>.<secret>, 6 and 16 of [a-z0-9]; value not shown)", ""},
			{"http endpoint", with(good, func(c *engine.Context) { c.ClusterEndpoint = "http://192.0.2.1:6443" }), "KPSSH_CLUSTER_ENDPOINT must be an https:// URL, got 'http://192.0.2.1:6443'", ""},
			{"space in labels", with(good, func(c *engine.Context) { c.NodeLabels = "a=b c=d" }), "KPSSH_NODE_LABELS has characters that cannot go on the kubelet command line: 'a=b c=d'", ""},
		}
	}
	checkTwins(t, e, conn, engine.PhaseJoin, good, "Check the join vars, the context and the installed kubelet", checks)
	if got := w.MustRun(i, "for f in /var/lib/kubelet/kpssh-node-name /etc/kubernetes/bootstrap-kubelet.conf /var/lib/kubelet/config.yaml; do [ ! -e $f ] || echo $f; done"); got != "" {
		t.Errorf("a refused join wrote the node's files: %s", got)
	}
}

// testInstallChecks: the role's install refuses bad vars with the script
// twin's message (the first failing check wins in both) before it writes
// anything, on a host install has not touched yet. The architecture check
// (between sandboxImage and binarySource, as in the script) cannot fail on
// these hosts.
func testInstallChecks(t *testing.T, e *engine.Local, conn engine.Connection, good engine.Context, w *hostenv.World, i int) {
	t.Helper()
	checkTwins(t, e, conn, engine.PhaseInstall, good, "Check the install vars and the architecture", []twinCheck{
		{"no k8sMinor", withVars(good, "k8sMinor", ""), "var k8sMinor is required: the control plane's Kubernetes minor (e.g. 1.36), set in the SSHNodeClass vars", ""},
		{"bad k8sMinor", withVars(good, "k8sMinor", "136"), "var k8sMinor must look like 1.36, got '136'", ""},
		{"bad kubeletVersion", withVars(good, "kubeletVersion", "1.36"), "var kubeletVersion must look like 1.36.1, got '1.36'", ""},
		{"kubeletVersion of another minor", withVars(good, "kubeletVersion", "v1.35.2"), "var kubeletVersion 1.35.2 is not a 1.36 release (var k8sMinor)", ""},
		{"bad cgroupDriver", withVars(good, "cgroupDriver", "docker"), "var cgroupDriver must be systemd or cgroupfs, got 'docker'",
			"value of tls_bootstrap_cgroup_driver must be one of: systemd, cgroupfs, got: docker"},
		{"bad sandboxImage", withVars(good, "sandboxImage", "pause 3.10"), "var sandboxImage is not an image reference: 'pause 3.10'", ""},
		{"bad restrictOOMScoreAdj", withVars(good, "restrictOOMScoreAdj", "yes"), "var restrictOOMScoreAdj must be true or false, got 'yes'",
			"value of tls_bootstrap_restrict_oom_score_adj must be one of: true, false, got: yes"},
		{"relative binarySource", withVars(good, "binarySource", "srv/kpssh-mirror"), "var binarySource must be an absolute directory on the host or an http(s) URL, got 'srv/kpssh-mirror'", ""},
		{"two bad vars: the first wins", withVars(good, "kubeletVersion", "x", "binarySource", "srv"), "var kubeletVersion must look like 1.36.1, got 'x'", ""},
		{"a bad choice wins over a bad shape in the role", withVars(good, "k8sMinor", "x", "restrictOOMScoreAdj", "yes"), "var k8sMinor must look like 1.36, got 'x'",
			"value of tls_bootstrap_restrict_oom_score_adj must be one of: true, false, got: yes"},
	})
	if got := w.MustRun(i, "for f in /usr/local/bin/kubelet /usr/local/bin/containerd /opt/cni/bin /etc/containerd /var/lib/kpssh/tls-bootstrap.files; do [ ! -e $f ] || echo $f; done"); got != "" {
		t.Errorf("a refused install wrote files: %s", got)
	}
}

// testCollectionRole: an engine with the collection alone (no roles path)
// resolves the shipped role by FQCN for every phase, and a node class var
// outside its choices fails the role's argument validation through the
// engine, naming the var and the entry point, before the host is touched.
func testCollectionRole(t *testing.T, coll string, conn engine.Connection, good engine.Context) {
	t.Helper()
	e, err := engine.New(engine.Options{CollectionsPath: coll})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = e.Close() }()
	const fqcn = "dklesev.kpssh.tls_bootstrap"
	for _, p := range []engine.Phase{engine.PhaseInstall, engine.PhaseJoin, engine.PhaseLeave, engine.PhaseUninstall} {
		if err := e.ValidateRole(fqcn, p); err != nil {
			t.Errorf("ValidateRole(%s, %s) with the collection alone: %v", fqcn, p, err)
		}
	}
	c := good
	c.Vars = map[string]string{"k8sMinor": "1.36", "cgroupDriver": "docker"}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	r := e.Run(ctx, engine.Request{Phase: engine.PhaseJoin, Conn: conn, Source: engine.Source{Role: fqcn}, Context: c, Timeout: 2 * time.Minute})
	if r.Outcome == engine.Succeeded ||
		!strings.Contains(r.FailedTask, "Validating arguments against arg spec 'join'") ||
		!strings.Contains(r.Message, "value of tls_bootstrap_cgroup_driver must be one of: systemd, cgroupfs, got: docker") {
		t.Errorf("%s join with cgroupDriver docker: %s (task %q): %q; want the argument validation of entry point join naming the var", fqcn, r.Outcome, r.FailedTask, r.Message)
	} else {
		t.Logf("%s join with cgroupDriver docker through the engine: task %q: %s", fqcn, r.FailedTask, r.Message)
	}
}
