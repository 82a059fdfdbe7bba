package inventory

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// ansibleInventory is the runner image's ansible-inventory, which `make
// test` puts first on PATH (hack/runner-image.sh --bin): its bin dir holds
// the sandbox wrapper. A missing one, or the machine's, fails the test.
// The test moves to a temporary directory: the sandbox sees /tmp, but not
// every other working directory.
func ansibleInventory(t *testing.T) string {
	t.Helper()
	t.Chdir(t.TempDir())
	p, err := exec.LookPath("ansible-inventory")
	if err != nil {
		t.Fatalf("ansible-inventory not on PATH: run the tests through make (it puts the runner image's first: hack/runner-image.sh --bin): %v", err)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(p), "sandbox")); err != nil {
		t.Fatalf("%s is not the runner image's ansible-inventory (no sandbox wrapper beside it)", p)
	}
	return p
}

// direct is a host's groups listing it, without Ansible's implicit ones.
func direct(h Host) string {
	var out []string
	for _, m := range h.Groups {
		if m.Direct && m.Group != "all" && m.Group != "ungrouped" {
			out = append(out, m.Group)
		}
	}
	sort.Strings(out)
	return strings.Join(out, ",")
}

// TestBuiltinMatchesAnsible: for every seed inventory Ansible reads, the
// built-in parser resolves the same hosts with the same variables and
// groups; for one it refuses, so does the built-in parser.
func TestBuiltinMatchesAnsible(t *testing.T) {
	abs, _ := filepath.Abs("testdata/fuzz-seeds") // before the test leaves the package directory
	seeds, _ := filepath.Glob(filepath.Join(abs, "*"))
	bin := ansibleInventory(t)
	agreed := 0
	for _, seed := range seeds {
		t.Run(filepath.Base(seed), func(t *testing.T) {
			// A copy in /tmp, which the sandbox sees.
			b, err := os.ReadFile(seed)
			if err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(t.TempDir(), filepath.Base(seed))
			if err := os.WriteFile(p, b, 0o644); err != nil {
				t.Fatal(err)
			}
			out, said, aerr := RunAnsible(t.Context(), bin, p, time.Minute)
			var ansible []Host
			if aerr == nil {
				inv, err := FromJSON(out)
				if err != nil {
					t.Fatal(err)
				}
				if ansible, aerr = inv.Hosts(); aerr != nil {
					t.Fatal(aerr)
				}
			}
			builtin, _, berr := ReadPath(p, "")
			var hosts []Host
			if berr == nil {
				hosts, berr = builtin.Hosts()
			}
			if aerr != nil {
				if berr == nil {
					t.Fatalf("Ansible refuses (%v), the built-in parser reads %d hosts", aerr, len(hosts))
				}
				t.Logf("both refuse; built-in: %v", berr)
				return
			}
			if berr != nil {
				// The built-in parser is stricter (a cycle, a var set twice).
				t.Logf("built-in refuses what Ansible reads: %v (Ansible: %s)", berr, said)
				return
			}
			want := map[string]Host{}
			for _, h := range ansible {
				want[h.Name] = h
			}
			if len(hosts) != len(want) {
				t.Fatalf("built-in: %d hosts, Ansible: %d", len(hosts), len(want))
			}
			for _, h := range hosts {
				a := want[h.Name]
				if fmt.Sprint(h.Vars) != fmt.Sprint(a.Vars) || direct(h) != direct(a) {
					t.Errorf("host %s:\n built-in %v %v\n Ansible  %v %v", h.Name, direct(h), h.Vars, direct(a), a.Vars)
				}
			}
			t.Logf("agree on %d hosts", len(hosts))
			agreed++
		})
	}
	if agreed < 3 {
		t.Fatalf("only %d seeds compared", agreed)
	}
}

// TestRunAnsibleDirectory: ansible-inventory reads group_vars/ and
// host_vars/ of a directory the built-in parser warns about.
func TestRunAnsibleDirectory(t *testing.T) {
	bin := ansibleInventory(t)
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"hosts":              "[web]\nw[1:2]\n",
		"group_vars/all.yml": "ansible_user: deploy\n",
		"host_vars/w2.yml":   "ansible_port: 2202\n",
	})
	out, _, err := RunAnsible(t.Context(), bin, dir, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	inv, err := FromJSON(out)
	checkHosts(t, inv, err, []string{"w1 @ [all/0 web*/1] ansible_user=deploy", "w2 @ [all/0 web*/1] ansible_port=2202 ansible_user=deploy"}, "")
}

// TestRunAnsibleRefuses: a source no plugin reads is an error with what
// Ansible said, not an empty inventory.
func TestRunAnsibleRefuses(t *testing.T) {
	bin := ansibleInventory(t)
	p := filepath.Join(t.TempDir(), "hosts.yml")
	writeFiles(t, filepath.Dir(p), map[string]string{"hosts.yml": "all:\n  hosts: [not, a, mapping]\n"})
	_, said, err := RunAnsible(t.Context(), bin, p, time.Minute)
	var ee *exec.ExitError
	if err == nil || !errors.As(err, &ee) || !strings.Contains(err.Error(), p) || said == "" {
		t.Fatalf("err %v, stderr %q", err, said)
	}
}

// fakeInventory writes an ansible-inventory that starts a grandchild (its
// pid in a file) and then hangs: what a stuck inventory script does.
func fakeInventory(t *testing.T, body string) (bin, pidFile string) {
	dir := t.TempDir()
	pidFile = filepath.Join(dir, "grandchild")
	bin = filepath.Join(dir, "ansible-inventory")
	script := fmt.Sprintf("#!/bin/sh\nsleep 300 &\necho $! >%s\n%s\n", pidFile, body)
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin, pidFile
}

// gone says whether pid has ended (no process, or a zombie its new parent
// has not reaped yet).
func gone(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(f) > 0 && f[0] == "Z"
}

// TestRunAnsibleBounded: a hanging ansible-inventory is stopped at the
// timeout or on cancellation, with its whole process group, and reaped;
// one that exits leaves no grandchild behind either.
func TestRunAnsibleBounded(t *testing.T) {
	cases := []struct {
		name    string
		body    string
		timeout time.Duration
		cancel  time.Duration
		err     string
	}{
		{name: "timeout", body: "sleep 300", timeout: 300 * time.Millisecond, err: "timed out after 300ms"},
		{name: "ignores SIGTERM", body: "trap '' TERM\nwhile :; do sleep 1; done", timeout: 300 * time.Millisecond, err: "timed out"},
		{name: "canceled", body: "sleep 300", timeout: time.Minute, cancel: 300 * time.Millisecond, err: "context canceled"},
		{name: "exits, grandchild left", body: "echo '{}'", timeout: time.Minute},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			bin, pidFile := fakeInventory(t, tc.body)
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			if tc.cancel > 0 {
				time.AfterFunc(tc.cancel, cancel)
			}
			start := time.Now()
			out, _, err := RunAnsible(ctx, bin, "/dev/null", tc.timeout)
			took := time.Since(start)
			if tc.err == "" && (err != nil || strings.TrimSpace(string(out)) != "{}") || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("out %q, err %v, want %q", out, err, tc.err)
			}
			if took > 10*time.Second {
				t.Errorf("took %s", took)
			}
			b, err := os.ReadFile(pidFile)
			if err != nil {
				t.Fatal(err)
			}
			pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
			deadline := time.Now().Add(5 * time.Second)
			for !gone(pid) && time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond)
			}
			if !gone(pid) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
				t.Fatalf("grandchild %d outlived ansible-inventory", pid)
			}
		})
	}
}
