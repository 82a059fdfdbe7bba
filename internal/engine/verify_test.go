package engine

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// A role without tasks/verify.yml verifies nothing: the run succeeds
// without touching the host. A role with it, a script, another phase or a
// Verified source run as they are.
func TestVerifySkipsRolesWithoutVerify(t *testing.T) {
	l := &Local{opts: Options{RolesPath: []string{taskFiles(t, map[string][]string{"plain": {"join.yml"}, "own": {"join.yml", "verify.yml"}})}}}
	for _, tc := range []struct {
		name string
		req  Request
		skip bool
	}{
		{"role without verify.yml", Request{Phase: PhaseVerify, Source: Source{Role: "plain"}}, true},
		{"role with verify.yml", Request{Phase: PhaseVerify, Source: Source{Role: "own"}}, false},
		{"unknown role stays an error for the run", Request{Phase: PhaseVerify, Source: Source{Role: "nowhere"}}, false},
		{"another phase", Request{Phase: PhaseJoin, Source: Source{Role: "plain"}}, false},
		{"a script", Request{Phase: PhaseVerify, Source: Source{Script: "true"}}, false},
		{"verified", Request{Phase: PhaseVerify, Source: Source{Role: "plain", Verified: &Verified{}}}, false},
	} {
		res, skip := l.noVerify(tc.req)
		if skip != tc.skip {
			t.Errorf("%s: skip %v, want %v", tc.name, skip, tc.skip)
			continue
		}
		if skip && (res.Outcome != Succeeded || res.Touched || !strings.Contains(res.Message, "nothing to verify: role plain")) {
			t.Errorf("%s: %+v", tc.name, res)
		}
	}
	// Through Run: no ansible-playbook is needed (nor started) for it.
	if res := l.Run(context.Background(), Request{Phase: PhaseVerify, Source: Source{Role: "plain"}}); res.Outcome != Succeeded || res.Touched {
		t.Errorf("Run: %+v", res)
	}
}

// verify gets install's context: vars, secrets and cluster data, never the
// bootstrap token.
func TestVerifyGetsInstallContext(t *testing.T) {
	full := Context{ClusterEndpoint: "https://x", BootstrapToken: "abcdef.0123456789abcdef", NodeName: "n",
		HostAddress: "192.0.2.1", NodeAddress: "192.0.2.2", Vars: map[string]string{"k": "v"}, Secrets: map[string]string{"s": "secretvalue"}}
	env := Env(PhaseVerify, full, true)
	for k, want := range map[string]string{EnvBootstrapToken: "", EnvClusterEndpoint: "https://x", EnvNodeName: "n",
		EnvVarPrefix + "k": "v", EnvSecretPrefix + "S": "secretvalue"} {
		if env[k] != want {
			t.Errorf("%s=%q, want %q", k, env[k], want)
		}
	}
	if err := Validate(PhaseVerify, Source{Script: "echo {{ .BootstrapToken }}"}); err == nil || !strings.Contains(err.Error(), "only the join phase") {
		t.Errorf("a verify script using the token: %v", err)
	}
	if err := Validate(PhaseVerify, Source{Script: "test -e {{ .Vars.dev }} && echo {{ .NodeName }}"}); err != nil {
		t.Errorf("a verify script using vars: %v", err)
	}
	if got := PhaseNames(); !strings.HasSuffix(got, ", reboot, verify or check") || !strings.HasPrefix(got, "install, join") {
		t.Errorf("PhaseNames() = %q", got)
	}
}

// exampleVerifyScript is scripts.verify of the shipped merge patch.
func exampleVerifyScript(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile("../../examples/scripts/verify-kubelet-healthz.patch.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var patch struct {
		Spec struct {
			Scripts struct{ Verify string }
		}
	}
	if err := yaml.Unmarshal(raw, &patch); err != nil || patch.Spec.Scripts.Verify == "" {
		t.Fatalf("examples/scripts/verify-kubelet-healthz.patch.yaml: %v (verify %q)", err, patch.Spec.Scripts.Verify)
	}
	return patch.Spec.Scripts.Verify
}

// TestVerifyOnHost runs the shipped verify examples — the task list
// (examples/verify/verify.yml) and the script (examples/scripts/
// verify-kubelet-healthz.patch.yaml) — on a real host, against a stand-in for the
// kubelet's healthz endpoint (127.0.0.1:10248 answering "ok"): both pass
// with the listed device present; a missing one fails the phase naming the
// failed task and the path; the script fails when nothing answers healthz.
func TestVerifyOnHost(t *testing.T) {
	if testing.Short() {
		t.Skip("real hosts: not in -short")
	}
	tasks, err := os.ReadFile("../../examples/verify/verify.yml")
	if err != nil {
		t.Fatal(err)
	}
	if err := Validate(PhaseVerify, Source{Tasks: string(tasks)}); err != nil {
		t.Fatalf("examples/verify/verify.yml: %v", err)
	}
	script := exampleVerifyScript(t)
	if err := Validate(PhaseVerify, Source{Script: script}); err != nil {
		t.Fatalf("the example verify script: %v", err)
	}
	w := upWorld(t, 1)
	e := testEngine(t, nil)
	ctx := context.Background()
	mustRun(t, w, 0, `mkdir -p /run/kpssh-healthz && printf ok > /run/kpssh-healthz/healthz && touch /run/kpssh-dev0 &&
systemd-run --unit kpssh-test-healthz python3 -m http.server 10248 --bind 127.0.0.1 --directory /run/kpssh-healthz >/dev/null 2>&1 &&
for i in $(seq 50); do python3 -c 'import urllib.request; urllib.request.urlopen("http://127.0.0.1:10248/healthz")' 2>/dev/null && exit 0; sleep 0.1; done; exit 1`)
	run := func(src Source, devices string, timeout time.Duration) Result {
		c := joinContext(w.Host(0))
		c.Vars = map[string]string{"verifyDevices": devices}
		return e.Run(ctx, Request{Phase: PhaseVerify, Conn: w.conn(0), Source: src, Context: c, Timeout: timeout})
	}
	for _, tc := range []struct {
		name       string
		src        Source
		failedTask string
	}{
		{"tasks", Source{Tasks: string(tasks)}, "no expected device is missing"},
		{"script", Source{Script: script}, "kpssh: verify script"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := run(tc.src, "/run/kpssh-dev0", time.Minute)
			mustOutcome(t, r, Succeeded)
			if !r.Touched {
				t.Fatalf("verify passed without touching the host: %+v", r)
			}
			r = run(tc.src, "/run/kpssh-dev0, /run/kpssh-missing0", time.Minute)
			mustOutcome(t, r, Failed)
			if r.FailedTask != tc.failedTask || !strings.Contains(r.Message, "expected devices missing: /run/kpssh-missing0") || strings.Contains(r.Message, "kpssh-dev0,") {
				t.Fatalf("missing device: failed task %q, message %q", r.FailedTask, r.Message)
			}
			noLeak(t, r, apiKey, token)
		})
	}
	// No kubelet answering: the script gives up after its 60 s; with a
	// shorter phase timeout the run is TimedOut inside the healthz wait.
	mustRun(t, w, 0, "systemctl stop kpssh-test-healthz")
	r := run(Source{Script: script}, "", 8*time.Second)
	mustOutcome(t, r, TimedOut)
	r = run(Source{Tasks: string(tasks)}, "", 8*time.Second)
	if r.Outcome != TimedOut || r.FailedTask != "kubelet healthz answers ok" {
		t.Fatalf("tasks without healthz: %+v", r)
	}
}
