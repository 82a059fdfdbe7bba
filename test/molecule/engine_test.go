package molecule_test

import (
	"context"
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

// testEngineRuns runs tls_bootstrap's install, join and leave through the
// phase engine itself (the play it renders, !unsafe variables, KPSSH_*
// environment, the kpssh_events callback), not through converge.yml: the
// scenarios' way of calling the role must be the engine's. tg's host has the
// stand-in mirror (prepared by the caller).
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

// testJoinChecks: the role's join refuses bad vars and a bad join context
// with the script twin's message (examples/scripts/profile-tls-bootstrap.yaml),
// before it touches the host. The role checks all of it in one task; the
// script check by check: the first failing check must win in both. Before
// install (installed false) the var and context checks, after it the CA's.
func testJoinChecks(t *testing.T, e *engine.Local, conn engine.Connection, good engine.Context, w *hostenv.World, i int, installed bool) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "examples", "scripts", "profile-tls-bootstrap.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var p v1beta1.SSHJoinProfile
	if err := sigsyaml.UnmarshalStrict(raw, &p); err != nil || p.Spec.Scripts == nil {
		t.Fatalf("script profile: %v", err)
	}
	withVars := func(kv ...string) engine.Context {
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
	with := func(f func(*engine.Context)) engine.Context { c := withVars(); f(&c); return c }
	// role, when set, is the role's message where it differs from the
	// script's: the choices are the role's argument specs, which Ansible
	// checks (in the entry point's validation task) before the role's own
	// checks, in its own words, naming the role var.
	type check struct {
		name string
		c    engine.Context
		want string
		role string
	}
	checks := []check{
		{"kubelet of another minor", withVars("k8sMinor", "1.35"), "var k8sMinor is 1.35: bump the profile's spec.version so install runs again", ""},
		{"CA not base64", with(func(c *engine.Context) { c.ClusterCAB64 = "not*base64" }), "KPSSH_CLUSTER_CA_B64 is not valid base64", ""},
		{"CA not PEM", with(func(c *engine.Context) { c.ClusterCAB64 = "aGVsbG8gd29ybGQ=" }), "KPSSH_CLUSTER_CA_B64 does not decode to a PEM certificate", ""},
	}
	if !installed {
		checks = []check{
			{"not installed", withVars(), "/usr/local/bin/kubelet is missing: the install phase has not run", ""},
			{"no k8sMinor", withVars("k8sMinor", ""), "var k8sMinor is required: the control plane's Kubernetes minor (e.g. 1.36), set in the SSHNodeClass vars", ""},
			{"bad k8sMinor", withVars("k8sMinor", "136"), "var k8sMinor must look like 1.36, got '136'", ""},
			{"bad serverTLSBootstrap", withVars("serverTLSBootstrap", "yes"), "var serverTLSBootstrap must be true or false, got 'yes'",
				"value of tls_bootstrap_server_tls_bootstrap must be one of: true, false, got: yes"},
			{"bad cgroupDriver", withVars("cgroupDriver", "docker"), "var cgroupDriver must be systemd or cgroupfs, got 'docker'",
				"value of tls_bootstrap_cgroup_driver must be one of: systemd, cgroupfs, got: docker"},
			{"bad clusterDNS", withVars("clusterDNS", "10.96.0.10,dns"), "var clusterDNS must be IP addresses separated by commas, got '10.96.0.10,dns'", ""},
			{"two bad vars: the first wins", withVars("k8sMinor", "x", "clusterDNS", "dns"), "var k8sMinor must look like 1.36, got 'x'", ""},
			{"a bad choice wins over a bad shape in the role", withVars("k8sMinor", "x", "cgroupDriver", "docker"), "var k8sMinor must look like 1.36, got 'x'",
				"value of tls_bootstrap_cgroup_driver must be one of: systemd, cgroupfs, got: docker"},
			{"bad token", with(func(c *engine.Context) { c.BootstrapToken = "abcdef.0123456789ABCDEF" }), "KPSSH_BOOTSTRAP_TOKEN is not a bootstrap token (<id>.<secret>, 6 and 16 of [a-z0-9]; value not shown)", ""},
			{"http endpoint", with(func(c *engine.Context) { c.ClusterEndpoint = "http://192.0.2.1:6443" }), "KPSSH_CLUSTER_ENDPOINT must be an https:// URL, got 'http://192.0.2.1:6443'", ""},
			{"space in labels", with(func(c *engine.Context) { c.NodeLabels = "a=b c=d" }), "KPSSH_NODE_LABELS has characters that cannot go on the kubelet command line: 'a=b c=d'", ""},
		}
	}
	for _, tc := range checks {
		for _, src := range []struct {
			kind string
			s    engine.Source
		}{{"role", engine.Source{Role: "tls_bootstrap"}}, {"script", engine.Source{Script: string(p.Spec.Scripts.Join)}}} {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			r := e.Run(ctx, engine.Request{Phase: engine.PhaseJoin, Conn: conn, Source: src.s, Context: tc.c, Timeout: 2 * time.Minute})
			cancel()
			want := tc.want
			if src.kind == "role" && tc.role != "" {
				want = tc.role
				// The argument spec's failure names the role's entry point.
				if !strings.Contains(r.FailedTask, "Validating arguments against arg spec 'join'") {
					t.Errorf("%s, role join: failed task %q, want the validation of entry point join", tc.name, r.FailedTask)
				}
			}
			if r.Outcome == engine.Succeeded || !strings.Contains(r.Message, want) {
				t.Errorf("%s, %s join: %s (task %q): %q, want the message %q", tc.name, src.kind, r.Outcome, r.FailedTask, r.Message, want)
			}
			if strings.Contains(r.Message, good.BootstrapToken) || strings.Contains(r.Message, tc.c.BootstrapToken) {
				t.Errorf("%s, %s join: the token is in the message", tc.name, src.kind)
			}
		}
	}
	if got := w.MustRun(i, "for f in /var/lib/kubelet/kpssh-node-name /etc/kubernetes/bootstrap-kubelet.conf /var/lib/kubelet/config.yaml; do [ ! -e $f ] || echo $f; done"); got != "" {
		t.Errorf("a refused join wrote the node's files: %s", got)
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
