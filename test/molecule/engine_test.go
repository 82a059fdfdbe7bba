package molecule_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/dklesev/kpssh/internal/engine"
	"github.com/dklesev/kpssh/test/hostenv"
)

// testEngineRuns runs tls_bootstrap's install, join and leave through the
// phase engine itself (the play it renders, !unsafe variables, KPSSH_*
// environment, the kpssh_events callback), not through converge.yml: the
// scenarios' way of calling the role must be the engine's. tg's host has the
// stand-in mirror (prepared by the caller).
func testEngineRuns(t *testing.T, w *hostenv.World, i int) {
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
	conn := engine.Connection{Address: h.Address, Port: int32(h.Port), User: h.User, PrivateKey: key, HostKey: h.HostKey}
	c := engine.Context{
		ClusterEndpoint: shared.Kpssh["cluster_endpoint"], ClusterCAB64: shared.Kpssh["cluster_ca_b64"],
		BootstrapToken: shared.Kpssh["bootstrap_token"], NodeName: "kpssh-engine-" + h.Name,
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
	run(engine.PhaseInstall)
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
