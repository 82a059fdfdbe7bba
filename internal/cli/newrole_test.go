package cli

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dklesev/kpssh/internal/engine"
)

func newRoleCmd(ctx context.Context, args []string, o, e *bytes.Buffer) int {
	return NewRoleCmd(ctx, args, o, e)
}

// wantRoleFiles is the skeleton new-role must write.
var wantRoleFiles = []string{
	"README.md", "defaults/main.yml", "meta/argument_specs.yml", "meta/main.yml",
	"molecule/default/converge.yml", "molecule/default/inventory/hosts.yml", "molecule/default/molecule.yml", "molecule/default/verify.yml",
	"tasks/install.yml", "tasks/join.yml", "tasks/leave.yml", "tasks/uninstall.yml",
}

func TestNewRoleCommand(t *testing.T) {
	dir := t.TempDir()
	file := write(t, dir, "a-file", "x")
	if err := os.Mkdir(filepath.Join(dir, "taken"), 0o755); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name     string
		args     []string
		rc       int
		out, err string
	}{
		{"good", []string{"--dir", dir, "web_node"}, ExitOK, "role web_node written; next: kpssh validate", ""},
		{"flag after the name", []string{"edge2", "--dir", dir}, ExitOK, filepath.Join(dir, "edge2", "tasks", "leave.yml"), ""},
		{"exists", []string{"--dir", dir, "taken"}, ExitUsage, "", filepath.Join(dir, "taken") + " exists: new-role never writes into an existing directory"},
		{"written twice", []string{"--dir", dir, "web_node"}, ExitUsage, "", "exists"},
		{"FQCN", []string{"--dir", dir, "ns.coll.r"}, ExitUsage, "", "a dotted name is a collection's FQCN"},
		{"path", []string{"--dir", dir, "../escape"}, ExitUsage, "", `role name "../escape" is not a role name`},
		{"upper case", []string{"--dir", dir, "WebNode"}, ExitUsage, "", "ansible-lint's role-name rule"},
		{"leading digit", []string{"--dir", dir, "1role"}, ExitUsage, "", "ansible-lint's role-name rule"},
		{"empty", []string{"--dir", dir, ""}, ExitUsage, "", `role name "" is not a role name`},
		{"dir not a dir", []string{"--dir", file, "r"}, ExitUsage, "", "is not a directory"},
		{"no name", []string{"--dir", dir}, ExitUsage, "", "want NAME, got 0"},
		{"help", []string{"-h"}, ExitOK, "", "usage: kpssh new-role"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rc, out, errs := runCmd(newRoleCmd, tc.args...)
			if rc != tc.rc || !strings.Contains(out, tc.out) || !strings.Contains(errs, tc.err) {
				t.Fatalf("rc %d (want %d)\nstdout %q (want %q)\nstderr %q (want %q)", rc, tc.rc, out, tc.out, errs, tc.err)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(dir, "escape")); err == nil {
		t.Fatal("a bad name wrote outside --dir")
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, "taken")); len(ents) != 0 {
		t.Fatalf("new-role wrote into an existing directory: %v", ents)
	}
	var got []string
	root := filepath.Join(dir, "web_node")
	_ = filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			rel, _ := filepath.Rel(root, p)
			got = append(got, rel)
		}
		return nil
	})
	slices.Sort(got)
	if !slices.Equal(got, wantRoleFiles) {
		t.Fatalf("files %v, want %v", got, wantRoleFiles)
	}
	// No template action is left unexpanded; Jinja passes through.
	for _, f := range got {
		b, _ := os.ReadFile(filepath.Join(root, f))
		if bytes.Contains(b, []byte("[[")) || bytes.Contains(b, []byte("]]")) {
			t.Errorf("%s keeps a template action:\n%s", f, b)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(root, "defaults/main.yml")); !strings.Contains(string(b), `web_node_greeting: "{{ kpssh_vars.greeting | default('') }}"`) {
		t.Errorf("defaults/main.yml:\n%s", b)
	}
}

// TestNewRolePassesTheEngineAndAnsible: the skeleton passes the engine's
// role checks for every phase (leave's empty-context scan included), and
// ansible-lint (production profile) and ansible-playbook --syntax-check of
// its molecule playbooks and of every phase, and ansible-doc lists its four
// entry points — all from the runner image (PATH from hack/runner-image.sh
// --bin). kpssh validate passing it is TestValidateCommand.
func TestNewRolePassesTheEngineAndAnsible(t *testing.T) {
	dir := t.TempDir()
	if _, err := NewRole(dir, "my_role"); err != nil {
		t.Fatal(err)
	}
	roles, err := newContentRoles([]string{dir}, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, ph := range []engine.Phase{engine.PhaseInstall, engine.PhaseJoin, engine.PhaseLeave, engine.PhaseUninstall} {
		if err := roles.ValidateRole("my_role", ph); err != nil {
			t.Errorf("engine.ValidateRole %s: %v", ph, err)
		}
	}
	if testing.Short() {
		t.Skip("-short: ansible-lint takes ~15 s")
	}
	home := t.TempDir()
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + home, "ANSIBLE_HOME=" + filepath.Join(home, ".ansible"), "LANG=C.UTF-8", "NO_COLOR=1", "ANSIBLE_NOCOLOR=1"}
	run := func(dir string, extraEnv []string, name string, args ...string) (string, error) {
		t.Helper()
		bin, err := exec.LookPath(name)
		if err != nil {
			t.Fatalf("%s not found: put the runner image's bin dir first on PATH (hack/runner-image.sh --bin)", name)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		c := exec.CommandContext(ctx, bin, args...)
		c.Dir, c.Env = dir, append(append([]string{}, env...), extraEnv...)
		var out bytes.Buffer
		c.Stdout, c.Stderr = &out, &out
		c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		c.Cancel = func() error { return syscall.Kill(-c.Process.Pid, syscall.SIGKILL) }
		c.WaitDelay = 10 * time.Second
		err = c.Run()
		return out.String(), err
	}
	write(t, dir, ".ansible-lint", "profile: production\noffline: true\n")
	out, err := run(dir, nil, "ansible-lint", "--nocolor", "-p", "my_role")
	violation := regexp.MustCompile(`(?m)^[^\s:][^:]*:\d+(:\d+)?: [\w\[\]/-]+: `)
	if err != nil || violation.MatchString(out) {
		t.Fatalf("ansible-lint (production) on the new role: %v\n%s", err, out)
	}
	if !strings.Contains(out, "production") {
		t.Fatalf("ansible-lint did not run the production profile:\n%s", out)
	}
	sc := filepath.Join(dir, "my_role", "molecule", "default")
	phases := write(t, dir, "phases.yml", `- name: Every phase, as the engine imports it
  hosts: all
  gather_facts: false
  tasks:
`+phaseImports("my_role"))
	rolesEnv := []string{"ANSIBLE_ROLES_PATH=" + dir}
	if out, err := run(sc, rolesEnv, "ansible-playbook", "-i", "inventory/hosts.yml", "--syntax-check", "converge.yml", "verify.yml", phases); err != nil {
		t.Fatalf("ansible-playbook --syntax-check: %v\n%s", err, out)
	}
	out, err = run(dir, nil, "ansible-doc", "-t", "role", "-r", dir, "my_role")
	if err != nil {
		t.Fatalf("ansible-doc: %v\n%s", err, out)
	}
	out = regexp.MustCompile(`\x1b\[[0-9;]*m`).ReplaceAllString(out, "") // bold on a terminal; *name* otherwise
	for _, ep := range []string{"install", "join", "leave", "uninstall"} {
		if !regexp.MustCompile(`ENTRY POINT: \*?` + ep + `\*? - `).MatchString(out) {
			t.Errorf("ansible-doc -t role does not list entry point %s:\n%s", ep, out)
		}
	}
	t.Logf("new role: ansible-lint production clean, syntax-check of converge/verify and all four phases, ansible-doc lists 4 entry points")
}

func phaseImports(role string) string {
	var b strings.Builder
	for _, ph := range []string{"install", "join", "leave", "uninstall"} {
		b.WriteString("    - name: " + strings.ToUpper(ph[:1]) + ph[1:] + "\n      ansible.builtin.import_role:\n        name: " + role + "\n        tasks_from: " + ph + "\n")
	}
	return b.String()
}
