package molecule_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/dklesev/kpssh/test/hostenv"
)

// TestCollection: the collection is the unit of distribution. The tarball
// hack/collection.sh builds (the runner image's ansible-galaxy) installs
// into an empty path; from there alone (no roles path, nothing of the
// checkout) ansible-doc documents every shipped role's entry points, a
// playbook outside the repository runs dklesev.kpssh.tls_bootstrap's leave
// on a real host, and bad vars fail the role's argument validation naming
// the var and the entry point.
func TestCollection(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds and installs the collection and boots a test host (make test runs it)")
	}
	root, err := hostenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	run := func(name string, env []string, args ...string) (string, error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		c := exec.CommandContext(ctx, name, args...)
		c.Dir = tmp // outside the repository
		c.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + tmp, "LANG=C.UTF-8", "ANSIBLE_NOCOLOR=1",
			"ANSIBLE_LOCAL_TEMP=" + filepath.Join(tmp, "ansible-tmp")}, env...)
		var out bytes.Buffer
		c.Stdout, c.Stderr = &out, &out
		asGroup(c)
		err := c.Run()
		return out.String(), err
	}

	out, err := run(filepath.Join(root, "hack", "collection.sh"), nil, filepath.Join(tmp, "dist"))
	if err != nil {
		t.Fatalf("hack/collection.sh: %v\n%s", err, out)
	}
	if strings.Contains(out, "Skipping") {
		t.Errorf("ansible-galaxy skipped content:\n%s", out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	tarball := lines[len(lines)-1]
	if !strings.HasSuffix(tarball, ".tar.gz") {
		t.Fatalf("hack/collection.sh printed no tarball:\n%s", out)
	}
	inst := filepath.Join(tmp, "installed")
	if out, err := run("ansible-galaxy", nil, "collection", "install", "-p", inst, tarball); err != nil {
		t.Fatalf("ansible-galaxy collection install: %v\n%s", err, out)
	}
	// Only the installed collection: a stray checkout path would hide a
	// tarball without roles.
	env := []string{"ANSIBLE_COLLECTIONS_PATH=" + inst, "ANSIBLE_ROLES_PATH=" + filepath.Join(tmp, "no-roles")}
	for role, entries := range map[string][]string{
		"tls_bootstrap": {"install", "join", "leave", "uninstall"},
		"sbc":           {"install", "join", "leave", "uninstall"},
		"nodeadm_ssm":   {"install", "join", "leave", "uninstall"},
		"verified_host": {"main"},
	} {
		out, err := run("ansible-doc", env, "-t", "role", "dklesev.kpssh."+role)
		if err != nil {
			t.Errorf("ansible-doc -t role dklesev.kpssh.%s: %v\n%s", role, err, out)
			continue
		}
		for _, e := range entries {
			// (ansible-doc marks the name up: *join* without a terminal)
			if !regexp.MustCompile(`ENTRY POINT: \W*` + e + `\W* - `).MatchString(out) {
				t.Errorf("ansible-doc -t role dklesev.kpssh.%s lists no entry point %s:\n%s", role, e, out)
			}
		}
		if strings.Count(out, "ENTRY POINT:") != len(entries) {
			t.Errorf("dklesev.kpssh.%s: want exactly the entry points %v:\n%s", role, entries, out)
		}
	}

	w := hostenv.Up(t, 1)
	inv := filepath.Join(tmp, "hosts.yml")
	if err := os.WriteFile(inv, []byte(w.AnsibleInventory(0)), 0o600); err != nil {
		t.Fatal(err)
	}
	play := filepath.Join(tmp, "play.yml")
	if err := os.WriteFile(play, []byte(`- name: A host leaves with the installed collection's role
  hosts: all
  gather_facts: false
  tasks:
    - name: Leave
      ansible.builtin.import_role:
        name: dklesev.kpssh.tls_bootstrap
        tasks_from: "{{ phase }}"
`), 0o600); err != nil {
		t.Fatal(err)
	}
	w.MustRun(0, "mkdir -p /var/lib/kubelet/pods/x")
	if out, err := run("ansible-playbook", env, "-i", inv, play, "-e", "phase=leave"); err != nil {
		t.Fatalf("leave with dklesev.kpssh.tls_bootstrap: %v\n%s", err, out)
	} else if !strings.Contains(out, "dklesev.kpssh.tls_bootstrap : Validating arguments against arg spec 'leave'") {
		t.Errorf("leave ran without validating its entry point:\n%s", out)
	}
	if got := w.MustRun(0, "test -e /var/lib/kubelet/pods && echo still there || echo wiped"); got != "wiped" {
		t.Errorf("leave did not wipe the pod state: %s", got)
	}

	// A node class var outside its choices: the role's join fails in the
	// validation of its entry point, naming the var, before any task runs
	// on the host.
	out, err = run("ansible-playbook", env, "-i", inv, play, "-e", "phase=join",
		"-e", `{"kpssh_vars": {"k8sMinor": "1.36", "cgroupDriver": "docker"}}`)
	if err == nil {
		t.Fatalf("join with cgroupDriver docker succeeded:\n%s", out)
	}
	for _, want := range []string{
		"TASK [dklesev.kpssh.tls_bootstrap : Validating arguments against arg spec 'join'",
		"value of tls_bootstrap_cgroup_driver must be one of: systemd, cgroupfs, got: docker",
		filepath.Join(inst, "ansible_collections/dklesev/kpssh/roles/tls_bootstrap"),
	} {
		if !strings.Contains(out, want) {
			t.Errorf("join with a bad choice: output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "Learn the host's state") {
		t.Errorf("join went past the validation:\n%s", out)
	}
	t.Logf("built %s, installed, documented and run from %s", filepath.Base(tarball), inst)
}
