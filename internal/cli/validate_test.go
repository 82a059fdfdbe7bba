package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/profile"
)

const roleProfileYAML = `apiVersion: karpenter.dklesev.github.io/v1beta1
kind: SSHJoinProfile
metadata:
  name: my-role
spec:
  version: "1"
  ansible:
    role: my_role
`

const classYAML = `apiVersion: karpenter.dklesev.github.io/v1beta1
kind: SSHNodeClass
metadata:
  name: other
spec:
  joinProfileRef:
    name: tls-bootstrap
---
apiVersion: karpenter.dklesev.github.io/v1beta1
kind: SSHNodeClass
metadata:
  name: mine
spec:
  joinProfileRef:
    name: my-role
  vars:
    greeting: hello
`

func write(t *testing.T, dir, name, body string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func runCmd(f func(context.Context, []string, *bytes.Buffer, *bytes.Buffer) int, args ...string) (int, string, string) {
	var o, e bytes.Buffer
	rc := f(context.Background(), args, &o, &e)
	return rc, o.String(), e.String()
}

func validateCmd(ctx context.Context, args []string, o, e *bytes.Buffer) int {
	return Validate(ctx, args, o, e)
}

// TestValidateCommand runs `kpssh validate` on files: a role made by
// new-role (found through --content), the shipped roles, classes with and
// without the role's required var, and bad input of every kind.
func TestValidateCommand(t *testing.T) {
	dir := t.TempDir()
	content := filepath.Join(dir, "content")
	if err := os.Mkdir(content, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := NewRole(content, "my_role"); err != nil {
		t.Fatal(err)
	}
	// a role whose leave reads a node-class var
	write(t, content, "bad_leave/tasks/install.yml", "- ansible.builtin.meta: noop\n")
	write(t, content, "bad_leave/tasks/join.yml", "- ansible.builtin.meta: noop\n")
	write(t, content, "bad_leave/tasks/leave.yml", "- ansible.builtin.debug:\n    msg: \"{{ kpssh_vars.x }}\"\n")
	// a role that is valid YAML but which ansible cannot load
	write(t, content, "two_actions/tasks/install.yml", "- name: two\n  ansible.builtin.command: /bin/true\n  ansible.builtin.shell: /bin/true\n")
	write(t, content, "two_actions/tasks/join.yml", "- ansible.builtin.meta: noop\n")
	write(t, content, "two_actions/tasks/leave.yml", "- ansible.builtin.meta: noop\n")
	prof := write(t, dir, "profile.yaml", roleProfileYAML)
	class := write(t, dir, "class.yaml", classYAML)
	twoActions := write(t, dir, "two-actions.yaml", strings.Replace(roleProfileYAML, "role: my_role", "role: two_actions", 1))
	missing := write(t, dir, "missing.yaml", strings.Replace(classYAML, "greeting: hello", "other: x", 1))
	badLeave := write(t, dir, "bad-leave.yaml", strings.Replace(roleProfileYAML, "role: my_role", "role: bad_leave", 1))
	nowhere := write(t, dir, "nowhere.yaml", strings.Replace(roleProfileYAML, "role: my_role", "role: not_anywhere", 1))
	slow := write(t, dir, "slow.yaml", strings.Replace(roleProfileYAML, "spec:\n", "spec:\n  timeouts:\n    install: 12m\n", 1))
	unknown := write(t, dir, "unknown.yaml", strings.Replace(roleProfileYAML, "version:", "verison:", 1))
	wrongAPI := write(t, dir, "api.yaml", strings.Replace(roleProfileYAML, "v1beta1", "v1alpha1", 1))
	noRef := write(t, dir, "noref.yaml", strings.Replace(classYAML, "name: my-role", "name: someone-else", 1))
	colls := filepath.Join(dir, "colls")
	if err := os.MkdirAll(filepath.Join(colls, "ansible_collections"), 0o755); err != nil {
		t.Fatal(err)
	}
	shipped, err := filepath.Abs("../../examples/profile-tls-bootstrap.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name       string
		args       []string
		rc         int
		out, err   string // substrings
		errMissing string // must not be on stderr
	}{
		{name: "new role and a class giving its var", args: []string{prof, "--class", class, "--content", content}, rc: 0, out: "SSHJoinProfile my-role, SSHNodeClass mine: valid"},
		{name: "role directory itself as content", args: []string{prof, "--class", class, "--content", filepath.Join(content, "my_role")}, rc: 0, out: "valid"},
		{name: "profile alone", args: []string{prof, "--content", content}, rc: 0, out: "SSHJoinProfile my-role: valid", err: "note: argument specs: not checked against node-class vars (no node class given)"},
		{name: "shipped role profile", args: []string{shipped, "--class", "../../examples/nodeclass.yaml"}, rc: 0, out: "SSHNodeClass default: valid"},
		{name: "required var missing", args: []string{prof, "--class", missing, "--content", content}, rc: ExitInvalid,
			err: "kpssh validate: SSHNodeClass mine: ProfileInvalid: join: role my_role, entry point join (meta/argument_specs.yml): required option my_role_greeting needs var greeting"},
		{name: "role in no content source", args: []string{nowhere, "--content", content}, rc: ExitInvalid, err: "ProfileInvalid: install: role not_anywhere not found"},
		{name: "ansible cannot load the role", args: []string{twoActions, "--content", content}, rc: ExitInvalid,
			err: "ProfileInvalid: install: role two_actions: ansible cannot load it: conflicting action statements: ansible.builtin.command, ansible.builtin.shell (" + filepath.Join(content, "two_actions/tasks/install.yml") + ":1:3)"},
		{name: "leave reads a var", args: []string{badLeave, "--content", content}, rc: ExitInvalid, err: "leave: role bad_leave tasks/leave.yml reference kpssh_vars"},
		{name: "timeouts", args: []string{slow, "--content", content}, rc: ExitInvalid, err: "TimeoutsExceedRegistration: profile my-role: timeouts install 12m + join 5m = 17m"},
		{name: "no class references the profile", args: []string{prof, "--class", noRef, "--content", content}, rc: ExitInvalid, err: "no SSHNodeClass in " + noRef + " references SSHJoinProfile my-role"},
		{name: "unknown field", args: []string{unknown}, rc: ExitUsage, err: `unknown field "verison"`},
		{name: "wrong apiVersion", args: []string{wrongAPI}, rc: ExitUsage, err: `apiVersion "karpenter.dklesev.github.io/v1alpha1"`},
		{name: "no such file", args: []string{filepath.Join(dir, "nope.yaml")}, rc: ExitUsage, err: "no such file"},
		{name: "not a profile", args: []string{class}, rc: ExitUsage, err: "holds no SSHJoinProfile"},
		{name: "content missing", args: []string{prof, "--content", filepath.Join(dir, "nope")}, rc: ExitUsage, err: "--content " + filepath.Join(dir, "nope")},
		{name: "collections content", args: []string{prof, "--content", colls}, rc: ExitUsage, err: "is a collections path"},
		{name: "no profile", args: nil, rc: ExitUsage, err: "want PROFILE.yaml, got 0"},
		{name: "two profiles", args: []string{prof, prof}, rc: ExitUsage, err: "want PROFILE.yaml, got 2"},
		{name: "help", args: []string{"-h"}, rc: ExitOK, err: "usage: kpssh validate"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rc, out, errs := runCmd(validateCmd, tc.args...)
			if rc != tc.rc || !strings.Contains(out, tc.out) || !strings.Contains(errs, tc.err) {
				t.Fatalf("rc %d (want %d)\nstdout %q (want %q)\nstderr %q (want %q)", rc, tc.rc, out, tc.out, errs, tc.err)
			}
		})
	}
}

// TestValidateWithoutAnsible: where ansible-playbook is not installed the
// checks that need no ansible still run, and a note says which one did not.
func TestValidateWithoutAnsible(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "two_actions/tasks/install.yml", "- name: two\n  ansible.builtin.command: /bin/true\n  ansible.builtin.shell: /bin/true\n")
	write(t, dir, "two_actions/tasks/join.yml", "- ansible.builtin.meta: noop\n")
	write(t, dir, "two_actions/tasks/leave.yml", "- ansible.builtin.meta: noop\n")
	prof := write(t, dir, "p.yaml", strings.Replace(roleProfileYAML, "role: my_role", "role: two_actions", 1))
	t.Setenv("PATH", t.TempDir())
	rc, out, errs := runCmd(validateCmd, prof, "--content", dir)
	if rc != ExitOK || !strings.Contains(out, "SSHJoinProfile my-role: valid") ||
		!strings.Contains(errs, "SSHJoinProfile my-role: note: ansible's own load of role two_actions (ansible-playbook --syntax-check, which the controller runs on operator roles) not run: ansible-playbook is not on PATH") {
		t.Fatalf("rc %d\nstdout %s\nstderr %s", rc, out, errs)
	}
}

// TestValidateRoleNotFoundIsTheControllers: the message for a role in no
// content source is profile.CheckClass's — the function the node class
// controller sets Ready=False/ProfileInvalid from — with the same role
// resolution (the shipped content, then --content).
func TestValidateRoleNotFoundIsTheControllers(t *testing.T) {
	dir := t.TempDir()
	prof := write(t, dir, "p.yaml", strings.Replace(roleProfileYAML, "role: my_role", "role: not_anywhere", 1))
	class := write(t, dir, "c.yaml", classYAML)
	rc, _, errs := runCmd(validateCmd, prof, "--class", class, "--content", dir)
	if rc != ExitInvalid {
		t.Fatalf("rc %d, stderr %s", rc, errs)
	}
	p, err := readObject[v1beta1.SSHJoinProfile](prof, "SSHJoinProfile")
	if err != nil {
		t.Fatal(err)
	}
	ncs, err := readObjects[v1beta1.SSHNodeClass](class, "SSHNodeClass")
	if err != nil {
		t.Fatal(err)
	}
	roles, err := newContentRoles([]string{dir}, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	res := profile.CheckClass(p, ncs[1], roles)
	want := "kpssh validate: SSHNodeClass mine: " + res.Reason + ": " + res.Message + "\n"
	if res.Reason != v1beta1.ReasonProfileInvalid || !strings.Contains(res.Message, "role not_anywhere not found") || errs != want {
		t.Fatalf("stderr %q, want %q", errs, want)
	}
}

// TestValidateSignatures: a profile signed by kpssh sign verifies against
// the signer a Verified host trusts, fails against another, and without a
// host verifies against its own signer with a note; a changed script fails.
func TestValidateSignatures(t *testing.T) {
	dir := t.TempDir()
	keyPath, pub := signerKey(t, dir)
	otherDir := filepath.Join(dir, "other")
	_ = os.Mkdir(otherDir, 0o700)
	_, otherPub := signerKey(t, otherDir)
	prof := write(t, dir, "signme.yaml", signProfile)
	block, err := sign(signOptions{keyFile: keyPath, profileFile: prof, manifest: true, notAfter: "24h", phases: "install,join,leave", now: time.Now().UTC()}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	signed := write(t, dir, "signed.yaml", signProfile+"  "+strings.ReplaceAll(strings.TrimSuffix(block, "\n"), "\n", "\n  ")+"\n")
	tampered := write(t, dir, "tampered.yaml", strings.Replace(signProfile, "echo install", "echo pwned", 1)+"  "+strings.ReplaceAll(strings.TrimSuffix(block, "\n"), "\n", "\n  ")+"\n")
	host := func(name, signer string) string {
		return write(t, dir, name, `apiVersion: karpenter.dklesev.github.io/v1beta1
kind: SSHHost
metadata:
  name: v1
spec:
  address: 192.0.2.5
  sshKeySecretRef:
    name: k
  execMode: Verified
  trustedSigners:
    - `+strings.TrimSpace(signer)+"\n")
	}
	trusting, distrusting := host("h1.yaml", string(pub)), host("h2.yaml", string(otherPub))
	cases := []struct {
		name string
		args []string
		rc   int
		err  string
	}{
		{"trusted signer", []string{signed, "--host", trusting}, ExitOK, "join script has no `set -euo pipefail`"},
		{"untrusted signer", []string{signed, "--host", distrusting}, ExitInvalid, "SSHJoinProfile tls: execMode Verified: install manifest signature: "},
		{"no host: own signer, with a note", []string{signed}, ExitOK, "note: install signature verifies, signer SHA256:"},
		{"unsigned reboot: a warning, not a failure", []string{signed, "--host", trusting}, ExitOK, "warning: no signatures.reboot: a Verified host cannot reboot in place"},
		{"changed script", []string{tampered}, ExitInvalid, "execMode Verified: install: manifest's script-sha256 does not match the script"},
		{"unsigned profile on a Verified host", []string{prof, "--host", trusting}, ExitInvalid, "carries no signatures"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rc, _, errs := runCmd(validateCmd, tc.args...)
			if rc != tc.rc || !strings.Contains(errs, tc.err) {
				t.Fatalf("rc %d (want %d), stderr %q (want %q)", rc, tc.rc, errs, tc.err)
			}
		})
	}
}
