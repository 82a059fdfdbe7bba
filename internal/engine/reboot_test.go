package engine

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A role without tasks/reboot.yml gets the default reboot; one with it runs
// its own; a Verified source or another phase is never replaced.
func TestRebootSourceFallsBackForRolesWithoutReboot(t *testing.T) {
	l := &Local{opts: Options{RolesPath: []string{taskFiles(t, map[string][]string{"plain": {"join.yml"}, "own": {"join.yml", "reboot.yml"}})}}}
	for _, tc := range []struct {
		name string
		req  Request
		want Source
	}{
		{"role without reboot.yml", Request{Phase: PhaseReboot, Source: Source{Role: "plain"}}, Source{Script: DefaultRebootScript}},
		{"role with reboot.yml", Request{Phase: PhaseReboot, Source: Source{Role: "own"}}, Source{Role: "own"}},
		{"unknown role stays an error for the run", Request{Phase: PhaseReboot, Source: Source{Role: "nowhere"}}, Source{Role: "nowhere"}},
		{"another phase", Request{Phase: PhaseLeave, Source: Source{Role: "plain"}}, Source{Role: "plain"}},
		{"a script", Request{Phase: PhaseReboot, Source: Source{Script: "reboot"}}, Source{Script: "reboot"}},
	} {
		if got := l.rebootSource(tc.req); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
	if err := l.ValidateRole("plain", PhaseReboot); err == nil || !strings.Contains(err.Error(), "has no tasks/reboot.yml") {
		t.Errorf("ValidateRole: %v", err)
	}
}

// taskFiles makes a roles directory: role → the tasks/ files it has (each a
// one-task list).
func taskFiles(t *testing.T, roles map[string][]string) string {
	t.Helper()
	dir := t.TempDir()
	for role, files := range roles {
		for _, f := range files {
			p := filepath.Join(dir, role, "tasks", f)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte("- ansible.builtin.command: /bin/true\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	return dir
}

// reboot gets leave's empty context: no vars, secrets, token or cluster data.
func TestRebootGetsAddressesOnly(t *testing.T) {
	full := Context{ClusterEndpoint: "https://x", BootstrapToken: "abcdef.0123456789abcdef", NodeName: "n",
		HostAddress: "192.0.2.1", NodeAddress: "192.0.2.2", Vars: map[string]string{"k": "v"}, Secrets: map[string]string{"s": "secretvalue"}}
	env := Env(PhaseReboot, full, true)
	for k, v := range env {
		if v != "" && k != EnvHostAddress && k != EnvNodeAddress {
			t.Errorf("reboot env %s=%q", k, v)
		}
	}
	if env[EnvHostAddress] != "192.0.2.1" || env[EnvNodeAddress] != "192.0.2.2" {
		t.Errorf("addresses %v", env)
	}
	if err := Validate(PhaseReboot, Source{Script: DefaultRebootScript}); err != nil {
		t.Fatalf("the default reboot does not validate: %v", err)
	}
	if err := Validate(PhaseReboot, Source{Script: "echo {{ .Secrets.s }}"}); err == nil || !strings.HasPrefix(err.Error(), "reboot script references .Secrets") {
		t.Fatalf("reboot with secrets: %v", err)
	}
}
