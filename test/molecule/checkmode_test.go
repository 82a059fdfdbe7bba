package molecule_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dklesev/kpssh/internal/engine"
	"github.com/dklesev/kpssh/test/hostenv"
)

// TestCheckModeTLSBootstrap: the drift check as the controller runs it —
// tls_bootstrap's install and join through the phase engine in check mode
// (--check --diff; join with the placeholder token, the real one long
// gone), with the runner image's ansible — against a real host the role
// installed and joined: untouched, nothing would change (run twice); with
// the kubelet configuration edited, join names the task that writes it and
// shows the edit in its diff, and the file is left as it is; a real join
// restores it, and the host is in sync again. Nothing returned carries the
// join's real token.
func TestCheckModeTLSBootstrap(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: boots a test host and runs the role through ansible-playbook")
	}
	start := time.Now()
	w := hostenv.UpWith(t, 1, hostenv.Options{Releases: []string{hostenv.Bookworm}})
	h := w.Host(0)
	dirs, err := findScenarios(".")
	if err != nil {
		t.Fatal(err)
	}
	var sc *scenario
	for _, d := range dirs {
		if s, err := loadScenario(d); err == nil && s.role == "tls_bootstrap" && s.name == "default" {
			sc = s
		}
	}
	if sc == nil {
		t.Fatal("no tls_bootstrap default scenario")
	}
	r, err := newRunner(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.close)
	inv := w.Inventory()
	tg := target{address: h.Address, port: h.Port, user: h.User, key: inv.ClientKey, knownHosts: inv.KnownHosts}
	if out, err := r.playbook(context.Background(), sc, tg, "prepare.yml"); err != nil {
		t.Fatal(playbookErr("prepare", out, err))
	}

	e, conn, shared := roleEngine(t, w, 0)
	const token = "qwerty.0123456789abcdef"
	join := engine.Context{
		ClusterEndpoint: shared["cluster_endpoint"], ClusterCAB64: shared["cluster_ca_b64"],
		BootstrapToken: token, NodeName: "kpssh-check-" + h.Name,
		ProviderID: "kpssh://kpssh-system/" + h.Name, HostAddress: h.Address, NodeAddress: "192.0.2.78",
		NodeLabels: "karpenter.dklesev.github.io/host-class=small,kpssh.example/pool=check", Taints: "karpenter.sh/unregistered:NoExecute",
		Vars: map[string]string{"k8sMinor": "1.36", "binarySource": "/srv/kpssh-mirror", "cgroupDriver": "cgroupfs",
			"failCgroupV1": "false", "restrictOOMScoreAdj": "true", "sandboxImage": "kpssh.local/pause:3.10"},
	}
	check := join
	check.BootstrapToken = "" // what the drift check has: no token
	run := func(ph engine.Phase, c engine.Context, checkMode bool) engine.Result {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		res := e.Run(ctx, engine.Request{Phase: ph, Conn: conn, Source: engine.Source{Role: "tls_bootstrap"}, Context: c, Timeout: 8 * time.Minute, Check: checkMode,
			Redact: []string{token}})
		for _, s := range []string{token, "0123456789abcdef"} {
			if strings.Contains(res.Message, s) || strings.Contains(res.FailedTask, s) || strings.Contains(changesText(res), s) {
				t.Errorf("%s (check %t): the token is in the result", ph, checkMode)
			}
		}
		if res.Outcome != engine.Succeeded {
			t.Fatalf("%s (check %t): %s (task %q): %s", ph, checkMode, res.Outcome, res.FailedTask, res.Message)
		}
		t.Logf("%s (check mode %t): %s in %v, %d change(s)", ph, checkMode, res.Outcome, res.Duration.Round(time.Millisecond), len(res.Changes))
		return res
	}
	inSync := func(when string) {
		t.Helper()
		for _, ph := range []engine.Phase{engine.PhaseInstall, engine.PhaseJoin} {
			if res := run(ph, check, true); len(res.Changes) != 0 {
				t.Errorf("%s: %s in check mode would change an untouched host (false drift):\n%s", when, ph, changesText(res))
			}
		}
	}
	const conf = "/var/lib/kubelet/config.yaml"
	run(engine.PhaseInstall, check, false)
	run(engine.PhaseJoin, join, false)
	pristine := w.MustRun(0, "cat "+conf)
	bootstrapConf := w.MustRun(0, "cat /etc/kubernetes/bootstrap-kubelet.conf")
	if !strings.Contains(bootstrapConf, token) {
		t.Fatalf("the join wrote no token:\n%s", bootstrapConf)
	}
	inSync("after install and join")
	inSync("again")

	// Someone edits a file join manages.
	w.MustRun(0, "sed -i 's/^clusterDomain: .*/clusterDomain: drifted.example/' "+conf)
	edited := w.MustRun(0, "cat "+conf)
	if edited == pristine || !strings.Contains(edited, "drifted.example") {
		t.Fatalf("the edit did not take:\n%s", edited)
	}
	if res := run(engine.PhaseInstall, check, true); len(res.Changes) != 0 {
		t.Errorf("install does not manage %s, yet would change:\n%s", conf, changesText(res))
	}
	res := run(engine.PhaseJoin, check, true)
	var write *engine.Change
	for i, c := range res.Changes {
		if c.Task == "tls_bootstrap : Write the node's credentials and kubelet configuration, and start the node" {
			write = &res.Changes[i]
		}
	}
	if write == nil {
		t.Fatalf("join in check mode does not name the task that writes %s:\n%s", conf, changesText(res))
	}
	for _, want := range []string{"--- " + conf, "+++ " + conf, "-clusterDomain: drifted.example", "+clusterDomain: cluster.local"} {
		if !strings.Contains(write.Diff, want) {
			t.Errorf("the diff lacks %q:\n%s", want, write.Diff)
		}
	}
	if write.Censored {
		t.Errorf("the kubelet configuration's diff is censored in check mode (nothing secret is compared there)")
	}
	if got := w.MustRun(0, "cat "+conf); got != edited {
		t.Errorf("check mode changed %s", conf)
	}
	if got := w.MustRun(0, "cat /etc/kubernetes/bootstrap-kubelet.conf"); got != bootstrapConf {
		t.Errorf("check mode changed the bootstrap kubeconfig (it must not even compare it)")
	}

	// A real join (a replacement's, with a token of its own) restores it.
	join.BootstrapToken = "zxcvbn.0123456789abcdef"
	run(engine.PhaseJoin, join, false)
	if got := w.MustRun(0, "cat "+conf); got != pristine {
		t.Errorf("join did not restore %s:\n%s", conf, got)
	}
	inSync("after the join restored it")
	t.Logf("check mode on a real host: %v", time.Since(start).Round(100*time.Millisecond))
}

func changesText(r engine.Result) string {
	var b strings.Builder
	for _, c := range r.Changes {
		b.WriteString("- " + c.Task + "\n" + c.Diff + "\n")
	}
	return b.String()
}
