package profile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/engine"
	"github.com/dklesev/kpssh/internal/envelope"
)

func scripts(install, join, leave, uninstall string) *v1beta1.SSHJoinProfile {
	return &v1beta1.SSHJoinProfile{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: v1beta1.SSHJoinProfileSpec{
		Version: "1",
		Scripts: &v1beta1.ProfileScripts{Install: v1beta1.Script(install), Join: v1beta1.Script(join), Leave: v1beta1.Script(leave), Uninstall: v1beta1.Script(uninstall)},
	}}
}

func tasks(install, join, leave, uninstall string) *v1beta1.SSHJoinProfile {
	return &v1beta1.SSHJoinProfile{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: v1beta1.SSHJoinProfileSpec{
		Version: "1",
		Ansible: &v1beta1.AnsibleSource{Tasks: &v1beta1.ProfileTasks{Install: v1beta1.TaskList(install), Join: v1beta1.TaskList(join), Leave: v1beta1.TaskList(leave), Uninstall: v1beta1.TaskList(uninstall)}},
	}}
}

func role(name string) *v1beta1.SSHJoinProfile {
	return &v1beta1.SSHJoinProfile{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: v1beta1.SSHJoinProfileSpec{
		Version: "1", Ansible: &v1beta1.AnsibleSource{Role: name},
	}}
}

func with(p *v1beta1.SSHJoinProfile, mut func(*v1beta1.SSHJoinProfile)) *v1beta1.SSHJoinProfile {
	mut(p)
	return p
}

const task = "- name: t\n  ansible.builtin.command: /bin/true\n"

func TestSource(t *testing.T) {
	both := with(scripts("i", "j", "l", ""), func(p *v1beta1.SSHJoinProfile) { p.Spec.Ansible = &v1beta1.AnsibleSource{Role: "r"} })
	roleAndTasks := with(role("r"), func(p *v1beta1.SSHJoinProfile) { p.Spec.Ansible.Tasks = &v1beta1.ProfileTasks{Install: task} })
	cases := []struct {
		name  string
		p     *v1beta1.SSHJoinProfile
		phase engine.Phase
		want  engine.Source
		ok    bool
	}{
		{"script install", scripts("i", "j", "l", "u"), engine.PhaseInstall, engine.Source{Script: "i"}, true},
		{"script join", scripts("i", "j", "l", "u"), engine.PhaseJoin, engine.Source{Script: "j"}, true},
		{"script leave", scripts("i", "j", "l", "u"), engine.PhaseLeave, engine.Source{Script: "l"}, true},
		{"script uninstall", scripts("i", "j", "l", "u"), engine.PhaseUninstall, engine.Source{Script: "u"}, true},
		{"script no uninstall", scripts("i", "j", "l", ""), engine.PhaseUninstall, engine.Source{}, false},
		{"script blank uninstall", scripts("i", "j", "l", " \n"), engine.PhaseUninstall, engine.Source{Script: " \n"}, false},
		{"tasks join", tasks("ti", "tj", "tl", ""), engine.PhaseJoin, engine.Source{Tasks: "tj"}, true},
		{"tasks leave", tasks("ti", "tj", "tl", ""), engine.PhaseLeave, engine.Source{Tasks: "tl"}, true},
		{"tasks no uninstall", tasks("ti", "tj", "tl", ""), engine.PhaseUninstall, engine.Source{}, false},
		{"tasks uninstall", tasks("ti", "tj", "tl", "tu"), engine.PhaseUninstall, engine.Source{Tasks: "tu"}, true},
		{"role install", role("ns.coll.r"), engine.PhaseInstall, engine.Source{Role: "ns.coll.r"}, true},
		{"role uninstall", role("r"), engine.PhaseUninstall, engine.Source{Role: "r"}, true},
		{"unknown phase", scripts("i", "j", "l", ""), engine.Phase("bogus"), engine.Source{}, false},
		{"script no reboot: the default", scripts("i", "j", "l", ""), engine.PhaseReboot, engine.Source{Script: engine.DefaultRebootScript}, true},
		{"tasks no reboot: the default", tasks("ti", "tj", "tl", ""), engine.PhaseReboot, engine.Source{Script: engine.DefaultRebootScript}, true},
		{"script reboot", with(scripts("i", "j", "l", ""), func(p *v1beta1.SSHJoinProfile) { p.Spec.Scripts.Reboot = "r" }), engine.PhaseReboot, engine.Source{Script: "r"}, true},
		{"tasks reboot", with(tasks("ti", "tj", "tl", ""), func(p *v1beta1.SSHJoinProfile) { p.Spec.Ansible.Tasks.Reboot = "tr" }), engine.PhaseReboot, engine.Source{Tasks: "tr"}, true},
		{"role reboot (the engine falls back without tasks/reboot.yml)", role("r"), engine.PhaseReboot, engine.Source{Role: "r"}, true},
		{"no source, no default reboot", &v1beta1.SSHJoinProfile{}, engine.PhaseReboot, engine.Source{}, false},
		// verify is optional and has no default: absent means nothing runs.
		{"script no verify", scripts("i", "j", "l", ""), engine.PhaseVerify, engine.Source{}, false},
		{"tasks no verify", tasks("ti", "tj", "tl", ""), engine.PhaseVerify, engine.Source{}, false},
		{"script verify", with(scripts("i", "j", "l", ""), verifyScript("v")), engine.PhaseVerify, engine.Source{Script: "v"}, true},
		{"tasks verify", with(tasks("ti", "tj", "tl", ""), func(p *v1beta1.SSHJoinProfile) { p.Spec.Ansible.Tasks.Verify = "tv" }), engine.PhaseVerify, engine.Source{Tasks: "tv"}, true},
		{"role verify (the engine skips it without tasks/verify.yml)", role("r"), engine.PhaseVerify, engine.Source{Role: "r"}, true},
		{"script check", with(scripts("i", "j", "l", ""), checkScript("c")), engine.PhaseCheck, engine.Source{Script: "c"}, true},
		{"script no check: none (no default)", scripts("i", "j", "l", ""), engine.PhaseCheck, engine.Source{}, false},
		{"role: no check phase (check mode instead)", role("r"), engine.PhaseCheck, engine.Source{}, false},
		{"tasks: no check phase (check mode instead)", tasks("ti", "tj", "tl", ""), engine.PhaseCheck, engine.Source{}, false},
		{"nil profile", nil, engine.PhaseJoin, engine.Source{}, false},
		{"no source", &v1beta1.SSHJoinProfile{}, engine.PhaseJoin, engine.Source{}, false},
		{"both sources", both, engine.PhaseJoin, engine.Source{}, false},
		{"role and tasks", roleAndTasks, engine.PhaseInstall, engine.Source{}, false},
		{"ansible with neither", with(role(""), func(*v1beta1.SSHJoinProfile) {}), engine.PhaseJoin, engine.Source{}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := Source(tc.p, tc.phase)
			if ok != tc.ok || (ok && got != tc.want) {
				t.Fatalf("Source = %+v, %v; want %+v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestTimeout(t *testing.T) {
	tm := func(install, join, leave string) *v1beta1.SSHJoinProfile {
		return with(scripts("i", "j", "l", ""), func(p *v1beta1.SSHJoinProfile) {
			p.Spec.Timeouts = v1beta1.PhaseTimeouts{Install: v1beta1.Duration(install), Join: v1beta1.Duration(join), Leave: v1beta1.Duration(leave)}
		})
	}
	cases := []struct {
		name  string
		p     *v1beta1.SSHJoinProfile
		phase engine.Phase
		want  time.Duration
	}{
		{"install default", tm("", "", ""), engine.PhaseInstall, 10 * time.Minute},
		{"join default", tm("", "", ""), engine.PhaseJoin, 5 * time.Minute},
		{"leave default", tm("", "", ""), engine.PhaseLeave, 3 * time.Minute},
		{"uninstall default", tm("1m", "1m", "1m"), engine.PhaseUninstall, 10 * time.Minute},
		{"nil profile", nil, engine.PhaseJoin, 5 * time.Minute},
		{"install set", tm("20m", "", ""), engine.PhaseInstall, 20 * time.Minute},
		{"join set", tm("", "90s", ""), engine.PhaseJoin, 90 * time.Second},
		{"leave compound", tm("", "", "1h30m"), engine.PhaseLeave, 90 * time.Minute},
		{"fraction rejected", tm("1.5h", "", ""), engine.PhaseInstall, 10 * time.Minute},
		{"ms rejected", tm("", "500ms", ""), engine.PhaseJoin, 5 * time.Minute},
		{"garbage", tm("", "", "soon"), engine.PhaseLeave, 3 * time.Minute},
		{"zero", tm("", "0s", ""), engine.PhaseJoin, 5 * time.Minute},
		{"overflow", tm("99999999999999999999h", "", ""), engine.PhaseInstall, 10 * time.Minute},
		{"verify default", tm("", "", ""), engine.PhaseVerify, 2 * time.Minute},
		{"verify set", with(tm("", "", ""), func(p *v1beta1.SSHJoinProfile) { p.Spec.Timeouts.Verify = "45s" }), engine.PhaseVerify, 45 * time.Second},
		{"check default", tm("", "", ""), engine.PhaseCheck, 2 * time.Minute},
		{"check set", with(tm("", "", ""), func(p *v1beta1.SSHJoinProfile) { p.Spec.Timeouts.Check = "45s" }), engine.PhaseCheck, 45 * time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := Timeout(tc.p, tc.phase); got != tc.want {
				t.Fatalf("Timeout = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestVars(t *testing.T) {
	withVars := func(v v1beta1.Vars) *v1beta1.SSHJoinProfile {
		return with(role("r"), func(p *v1beta1.SSHJoinProfile) { p.Spec.Ansible.Vars = v })
	}
	nc := func(v v1beta1.Vars) *v1beta1.SSHNodeClass {
		return &v1beta1.SSHNodeClass{Spec: v1beta1.SSHNodeClassSpec{Vars: v}}
	}
	cases := []struct {
		name string
		p    *v1beta1.SSHJoinProfile
		nc   *v1beta1.SSHNodeClass
		want map[string]string
	}{
		{"both nil", nil, nil, map[string]string{}},
		{"scripts profile, no class vars", scripts("i", "j", "l", ""), nc(nil), map[string]string{}},
		{"profile defaults only", withVars(v1beta1.Vars{"a": "1", "b": "2"}), nil, map[string]string{"a": "1", "b": "2"}},
		{"class only", scripts("i", "j", "l", ""), nc(v1beta1.Vars{"k8sMinor": "1.34"}), map[string]string{"k8sMinor": "1.34"}},
		{"class wins", withVars(v1beta1.Vars{"a": "1", "b": "2"}), nc(v1beta1.Vars{"b": "X", "c": "3"}), map[string]string{"a": "1", "b": "X", "c": "3"}},
		{"class empty value wins", withVars(v1beta1.Vars{"a": "1"}), nc(v1beta1.Vars{"a": ""}), map[string]string{"a": ""}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := Vars(tc.p, tc.nc)
			if got == nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("Vars = %#v, want %#v", got, tc.want)
			}
		})
	}
	// the result is a copy: writing it must not change the objects
	p, c := withVars(v1beta1.Vars{"a": "1"}), nc(v1beta1.Vars{"b": "2"})
	m := Vars(p, c)
	m["a"], m["b"] = "x", "y"
	if p.Spec.Ansible.Vars["a"] != "1" || c.Spec.Vars["b"] != "2" {
		t.Fatal("Vars aliases the objects' maps")
	}
}

func TestParseMarker(t *testing.T) {
	cases := []struct {
		in            string
		name, version string
		ok            bool
	}{
		{"tls-bootstrap@1", "tls-bootstrap", "1", true},
		{"nodeadm-ssm@v2.0_rc-1", "nodeadm-ssm", "v2.0_rc-1", true},
		{"a.b.c@1.2.3", "a.b.c", "1.2.3", true},
		{"", "", "", false},
		{"tls-bootstrap", "", "", false},
		{"tls-bootstrap@", "", "", false},
		{"@1", "", "", false},
		{"a@b@c", "", "", false},
		{"Upper@1", "", "", false},
		{"p@ver sion", "", "", false},
		{"p@" + strings.Repeat("v", 64), "", "", false},
		{"p@" + strings.Repeat("v", 63), "p", strings.Repeat("v", 63), true},
	}
	for _, tc := range cases {
		t.Run(tc.in, func(t *testing.T) {
			n, v, ok := ParseMarker(tc.in)
			if n != tc.name || v != tc.version || ok != tc.ok {
				t.Fatalf("ParseMarker(%q) = %q, %q, %v; want %q, %q, %v", tc.in, n, v, ok, tc.name, tc.version, tc.ok)
			}
		})
	}
	// round trip with the API's own marker
	p := scripts("i", "j", "l", "")
	p.Name, p.Spec.Version = "tls-bootstrap", "7"
	if n, v, ok := ParseMarker(p.Marker()); !ok || n != p.Name || v != p.Spec.Version {
		t.Fatalf("round trip of %q: %q %q %v", p.Marker(), n, v, ok)
	}
}

func checkScript(c string) func(*v1beta1.SSHJoinProfile) {
	return func(p *v1beta1.SSHJoinProfile) { p.Spec.Scripts.Check = v1beta1.Script(c) }
}

func rebootScript(r string) func(*v1beta1.SSHJoinProfile) {
	return func(p *v1beta1.SSHJoinProfile) { p.Spec.Scripts.Reboot = v1beta1.Script(r) }
}

func verifyScript(v string) func(*v1beta1.SSHJoinProfile) {
	return func(p *v1beta1.SSHJoinProfile) { p.Spec.Scripts.Verify = v1beta1.Script(v) }
}

// noVerify is the answer for a role without tasks/verify.yml (the shipped
// roles have none).
func noVerify(role string) map[engine.Phase]error {
	return map[engine.Phase]error{engine.PhaseVerify: &engine.NoRolePhaseError{Role: role, Phase: engine.PhaseVerify}}
}

// fakeRoles answers ValidateRole from a table and records the calls.
type fakeRoles struct {
	errs  map[engine.Phase]error
	calls []string
}

func (f *fakeRoles) ValidateRole(role string, phase engine.Phase) error {
	f.calls = append(f.calls, role+"/"+string(phase))
	return f.errs[phase]
}

func TestValidate(t *testing.T) {
	sig := v1beta1.Signature("-----BEGIN SSH SIGNATURE-----\nx\n-----END SSH SIGNATURE-----\n")
	signed := func(p *v1beta1.SSHJoinProfile) *v1beta1.SSHJoinProfile {
		return with(p, func(p *v1beta1.SSHJoinProfile) { p.Spec.Signatures = &v1beta1.ProfileSignatures{Join: sig} })
	}
	cases := []struct {
		name  string
		p     *v1beta1.SSHJoinProfile
		roles *fakeRoles
		want  string // substring of the error; "" = valid
		// wantPrefix is the phase the message must start with ("" = no check)
		wantPrefix string
	}{
		{name: "seed scripts", p: scripts("echo {{ .Vars.k8sMinor }}", "echo {{ .BootstrapToken }} {{ .Secrets.x }}", "systemctl disable --now kubelet; echo {{ .HostAddress }}", "rm -rf /opt")},
		{name: "tasks", p: tasks(task, task, "- ansible.builtin.debug:\n    msg: \"{{ kpssh.host_address }}\"\n", "")},
		{name: "role", p: role("tls_bootstrap"), roles: &fakeRoles{}},
		{name: "role, no validator", p: role("tls_bootstrap")},
		{name: "nil", p: nil, want: "no profile"},
		{name: "no source", p: &v1beta1.SSHJoinProfile{}, want: "no source"},
		{name: "both sources", p: with(scripts("i", "j", "l", ""), func(p *v1beta1.SSHJoinProfile) { p.Spec.Ansible = &v1beta1.AnsibleSource{Role: "r"} }), want: "both scripts and ansible"},
		{name: "ansible neither", p: &v1beta1.SSHJoinProfile{Spec: v1beta1.SSHJoinProfileSpec{Ansible: &v1beta1.AnsibleSource{}}}, want: "exactly one of role or tasks"},
		{name: "ansible role and tasks", p: with(role("r"), func(p *v1beta1.SSHJoinProfile) { p.Spec.Ansible.Tasks = &v1beta1.ProfileTasks{} }), want: "exactly one of role or tasks"},
		{name: "install missing", p: scripts("", "j", "l", ""), want: "install: phase missing", wantPrefix: "install"},
		{name: "join blank", p: scripts("i", "  \n", "l", ""), want: "join: phase missing", wantPrefix: "join"},
		{name: "leave missing (tasks)", p: tasks(task, task, "", ""), want: "leave: phase missing", wantPrefix: "leave"},
		{name: "leave uses vars", p: scripts("i", "j", "echo {{ .Vars.x }}", ""), want: ".Vars", wantPrefix: "leave"},
		{name: "leave uses secrets", p: scripts("i", "j", "echo {{ .Secrets.k }}", ""), want: ".Secrets", wantPrefix: "leave"},
		{name: "leave uses vars via $", p: scripts("i", "j", "{{ with .HostAddress }}{{ $.Vars.x }}{{ end }}", ""), want: ".Vars", wantPrefix: "leave"},
		{name: "leave tasks use kpssh_vars", p: tasks(task, task, "- ansible.builtin.debug:\n    msg: \"{{ kpssh_vars.x }}\"\n", ""), want: "kpssh_vars", wantPrefix: "leave"},
		{name: "install bad template", p: scripts("echo {{ .Vars.x ", "j", "l", ""), want: "not a valid template", wantPrefix: "install"},
		// reboot is optional, and like leave gets only the addresses.
		{name: "reboot script", p: with(scripts("i", "j", "l", ""), rebootScript("systemctl reboot # {{ .HostAddress }}"))},
		{name: "reboot uses vars", p: with(scripts("i", "j", "l", ""), rebootScript("echo {{ .Vars.x }}")), want: ".Vars", wantPrefix: "reboot"},
		{name: "reboot uses the token", p: with(scripts("i", "j", "l", ""), rebootScript("echo {{ .BootstrapToken }}")), want: ".BootstrapToken", wantPrefix: "reboot"},
		{name: "reboot bad template", p: with(scripts("i", "j", "l", ""), rebootScript("echo {{ .HostAddress ")), want: "not a valid template", wantPrefix: "reboot"},
		{name: "reboot tasks not a list", p: with(tasks(task, task, task, ""), func(p *v1beta1.SSHJoinProfile) { p.Spec.Ansible.Tasks.Reboot = "reboot: now" }), want: "reboot tasks", wantPrefix: "reboot"},
		{name: "reboot tasks use kpssh_secrets", p: with(tasks(task, task, task, ""), func(p *v1beta1.SSHJoinProfile) {
			p.Spec.Ansible.Tasks.Reboot = "- ansible.builtin.debug:\n    msg: \"{{ kpssh_secrets.x }}\"\n"
		}), want: "kpssh_secrets", wantPrefix: "reboot"},
		{name: "role without reboot.yml: the default", p: role("tls_bootstrap"), roles: &fakeRoles{errs: map[engine.Phase]error{engine.PhaseReboot: &engine.NoRolePhaseError{Role: "tls_bootstrap", Phase: engine.PhaseReboot}}}},
		{name: "role with a bad reboot.yml", p: role("tls_bootstrap"), roles: &fakeRoles{errs: map[engine.Phase]error{engine.PhaseReboot: errors.New("role tls_bootstrap tasks/reboot.yml: not valid YAML")}}, want: "reboot.yml", wantPrefix: "reboot"},
		// verify is optional and gets install's context: vars, secrets, no token.
		{name: "verify script with vars and secrets", p: with(scripts("i", "j", "l", ""), verifyScript("test -e {{ .Vars.dev }} # {{ .Secrets.k }} {{ .NodeName }}"))},
		{name: "verify uses the token", p: with(scripts("i", "j", "l", ""), verifyScript("echo {{ .BootstrapToken }}")), want: "only the join phase", wantPrefix: "verify"},
		{name: "verify bad template", p: with(scripts("i", "j", "l", ""), verifyScript("echo {{ .Vars.x ")), want: "not a valid template", wantPrefix: "verify"},
		{name: "verify unknown field", p: with(scripts("i", "j", "l", ""), verifyScript("echo {{ .Nope }}")), want: "unknown field .Nope", wantPrefix: "verify"},
		{name: "verify tasks not a list", p: with(tasks(task, task, task, ""), func(p *v1beta1.SSHJoinProfile) { p.Spec.Ansible.Tasks.Verify = "uri: {url: x}" }), want: "verify tasks", wantPrefix: "verify"},
		{name: "verify tasks run on the controller", p: with(tasks(task, task, task, ""), func(p *v1beta1.SSHJoinProfile) {
			p.Spec.Ansible.Tasks.Verify = "- ansible.builtin.command: id\n  delegate_to: localhost\n"
		}), want: "delegate_to", wantPrefix: "verify"},
		{name: "role without verify.yml: nothing to verify", p: role("tls_bootstrap"), roles: &fakeRoles{errs: noVerify("tls_bootstrap")}},
		{name: "role with a bad verify.yml", p: role("tls_bootstrap"), roles: &fakeRoles{errs: map[engine.Phase]error{engine.PhaseVerify: errors.New("role tls_bootstrap: tasks/verify.yml: not valid YAML")}}, want: "verify.yml", wantPrefix: "verify"},
		{name: "signed verify template", p: signed(with(scripts("i", "j", "l", ""), verifyScript("test -e {{ .Vars.dev }}"))), want: "template-free", wantPrefix: "verify"},
		// check is optional and gets install's context: vars, secrets, no token.
		{name: "check script", p: with(scripts("i", "j", "l", ""), checkScript("grep -q {{ .Vars.k8sMinor }} /etc/x || exit 1"))},
		{name: "check uses the token", p: with(scripts("i", "j", "l", ""), checkScript("echo {{ .BootstrapToken }}")), want: "only the join phase", wantPrefix: "check"},
		{name: "check bad template", p: with(scripts("i", "j", "l", ""), checkScript("echo {{ .Vars.x ")), want: "not a valid template", wantPrefix: "check"},
		{name: "check unknown field", p: with(scripts("i", "j", "l", ""), checkScript("{{ .Nope }}")), want: "unknown field .Nope", wantPrefix: "check"},
		{name: "signed check with template", p: with(signed(scripts("i", "j", "l", "")), checkScript("{{ .NodeName }}")), want: "template-free", wantPrefix: "check"},
		{name: "install uses token", p: scripts("echo {{ .BootstrapToken }}", "j", "l", ""), want: "only the join phase", wantPrefix: "install"},
		{name: "join unknown field", p: scripts("i", "{{ .Nope }}", "l", ""), want: "unknown field .Nope", wantPrefix: "join"},
		{name: "uninstall checked too", p: scripts("i", "j", "l", "{{ .Broken"), want: "not a valid template", wantPrefix: "uninstall"},
		{name: "join tasks not a list", p: tasks(task, "name: x\n", task, ""), want: "a task list must be a YAML list", wantPrefix: "join"},
		{name: "install tasks a play", p: tasks("- hosts: all\n  tasks: []\n", task, task, ""), want: "play or playbook import", wantPrefix: "install"},
		{name: "bad role name", p: role("../etc"), roles: &fakeRoles{}, want: "role name", wantPrefix: "install"},
		{name: "role missing leave", p: role("r"), roles: &fakeRoles{errs: map[engine.Phase]error{engine.PhaseLeave: errors.New("role r has no tasks/leave.yml")}}, want: "no tasks/leave.yml", wantPrefix: "leave"},
		{name: "role not found", p: role("r"), roles: &fakeRoles{errs: map[engine.Phase]error{engine.PhaseInstall: errors.New("role r not found in the roles path")}}, want: "install: role r not found", wantPrefix: "install"},
		{name: "signed template-free", p: signed(scripts("set -euo pipefail\ni", "set -euo pipefail\nj", "set -euo pipefail\nl", ""))},
		{name: "signed with template", p: signed(scripts("i", "echo {{ .NodeName }}", "l", "")), want: "template-free", wantPrefix: "join"},
		{name: "signed uninstall template", p: signed(scripts("i", "j", "l", "{{ .Vars.x }}")), want: "template-free", wantPrefix: "uninstall"},
		{name: "empty signatures struct is unsigned", p: with(scripts("i", "{{ .NodeName }}", "l", ""), func(p *v1beta1.SSHJoinProfile) { p.Spec.Signatures = &v1beta1.ProfileSignatures{} })},
		{name: "signed ansible", p: with(tasks(task, task, task, ""), func(p *v1beta1.SSHJoinProfile) { p.Spec.Signatures = &v1beta1.ProfileSignatures{Install: sig} }), want: "must be scripts"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var rv RoleValidator
			if tc.roles != nil {
				rv = tc.roles
			}
			err := Validate(tc.p, rv)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate = %v, want an error containing %q", err, tc.want)
			}
			if tc.wantPrefix != "" && !strings.HasPrefix(err.Error(), tc.wantPrefix) {
				t.Fatalf("Validate = %q, want it to start with the phase %q", err, tc.wantPrefix)
			}
		})
	}
}

// TestValidateRoleCalls: roles are resolved for exactly install, join and
// leave (uninstall is never run, so a role without it is fine).
func TestValidateRoleCalls(t *testing.T) {
	f := &fakeRoles{}
	if err := Validate(role("tls_bootstrap"), f); err != nil {
		t.Fatal(err)
	}
	want := []string{"tls_bootstrap/install", "tls_bootstrap/join", "tls_bootstrap/leave", "tls_bootstrap/reboot", "tls_bootstrap/verify"}
	if !reflect.DeepEqual(f.calls, want) {
		t.Fatalf("ValidateRole calls = %v, want %v", f.calls, want)
	}
	// not called for scripts or inline tasks
	f.calls = nil
	if err := Validate(tasks(task, task, task, ""), f); err != nil || f.calls != nil {
		t.Fatalf("tasks profile: err=%v calls=%v", err, f.calls)
	}
}

// TestValidateRealRoles runs Validate against the real engine's role
// resolution (*engine.Local) over roles written to a temporary roles path.
func TestValidateRealRoles(t *testing.T) {
	coll, err := engine.FindCollectionsPath()
	if err != nil {
		t.Fatal(err)
	}
	roles := t.TempDir()
	write := func(role, phase, body string) {
		t.Helper()
		dir := filepath.Join(roles, role, "tasks")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, phase+".yml"), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, ph := range []string{"install", "join", "leave"} {
		write("good", ph, task)
	}
	write("noleave", "install", task)
	write("noleave", "join", task)
	write("varleave", "install", task)
	write("varleave", "join", task)
	write("varleave", "leave", "- ansible.builtin.debug:\n    msg: \"{{ kpssh_vars.cluster }}\"\n")
	write("notalist", "install", "not: a list\n")
	write("notalist", "join", task)
	write("notalist", "leave", task)

	e, err := engine.New(engine.Options{CollectionsPath: coll, RolesPath: []string{roles}, RunDirBase: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct{ role, want, prefix string }{
		{"good", "", ""},
		{"missing", "not found", "install"},
		{"noleave", "no tasks/leave.yml", "leave"},
		{"varleave", "kpssh_vars", "leave"},
		{"notalist", "YAML list", "install"},
	}
	for _, tc := range cases {
		t.Run(tc.role, func(t *testing.T) {
			err := Validate(role(tc.role), e)
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), tc.prefix) {
				t.Fatalf("Validate = %v, want %q starting with %q", err, tc.want, tc.prefix)
			}
		})
	}
}

// Example of the message a node class condition carries.
func ExampleValidate() {
	p := scripts("i", "j", "echo {{ .Vars.clusterName }}", "")
	fmt.Println(Validate(p, nil))
	// Output: leave script references .Vars: leave renders with the empty context (only .HostAddress and .NodeAddress) — it must work without a node class
}

func TestVerifiedWarnings(t *testing.T) {
	for _, tc := range []struct {
		name string
		join string
		sig  bool
		warn bool
	}{
		{"strict", "#!/bin/bash\nset -euo pipefail\n", true, false},
		{"split flags", "set -eu -o pipefail\n", true, false},
		{"long form", "  set -o errexit -o nounset -o pipefail\n", true, false},
		{"other order", "set -ueo pipefail\n", true, false},
		{"missing", "#!/bin/bash\necho hi\n", true, true},
		{"only -e", "set -e\n", true, true},
		{"no pipefail", "set -eu\n", true, true},
		{"in a comment", "# set -euo pipefail\n", true, true},
		{"unsigned phase: no warning", "echo hi\n", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &v1beta1.SSHJoinProfile{Spec: v1beta1.SSHJoinProfileSpec{
				Scripts:    &v1beta1.ProfileScripts{Install: "set -euo pipefail\n", Join: v1beta1.Script(tc.join), Leave: "set -euo pipefail\n"},
				Signatures: &v1beta1.ProfileSignatures{Install: "x", Leave: "x"}}}
			if tc.sig {
				p.Spec.Signatures.Join = "x"
			}
			w := VerifiedWarnings(p)
			if got := len(w) > 0; got != tc.warn || (got && !strings.Contains(w[0], "join")) {
				t.Fatalf("warnings %q, want warning %v", w, tc.warn)
			}
		})
	}
}

// TestVerifiedWarningsParamPolicy: a v2 manifest without a param policy
// is a warning (its params are unchecked); one with a policy is not.
func TestVerifiedWarningsParamPolicy(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	field := func(policy map[string]envelope.ParamRule) v1beta1.Signature {
		m, err := envelope.MarshalManifest(envelope.Manifest{Phase: "join", Profile: "p@1", ScriptSHA256: envelope.ScriptDigest(nil), IssuedAt: t0, NotAfter: t0.Add(time.Hour), Params: policy})
		if err != nil {
			t.Fatal(err)
		}
		return v1beta1.Signature(string(m) + "-----BEGIN SSH SIGNATURE-----\nAAAA\n-----END SSH SIGNATURE-----\n")
	}
	for _, tc := range []struct {
		name string
		sig  v1beta1.Signature
		warn bool
	}{
		{"v2 without a policy", field(nil), true},
		{"v2 with a policy", field(map[string]envelope.ParamRule{"KPSSH_NODE_NAME": {Kind: envelope.RuleRE, Arg: "[a-z0-9-]+"}}), false},
		{"v1", "-----BEGIN SSH SIGNATURE-----\nAAAA\n-----END SSH SIGNATURE-----\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &v1beta1.SSHJoinProfile{Spec: v1beta1.SSHJoinProfileSpec{
				Scripts: &v1beta1.ProfileScripts{Join: "set -euo pipefail\n"}, Signatures: &v1beta1.ProfileSignatures{Join: tc.sig}}}
			w := VerifiedWarnings(p)
			if got := len(w) > 0; got != tc.warn || (got && !strings.Contains(w[0], "join manifest has no param policy")) {
				t.Fatalf("warnings %q, want warning %v", w, tc.warn)
			}
		})
	}
}

func TestVerifiedSource(t *testing.T) {
	h := &v1beta1.SSHHost{Spec: v1beta1.SSHHostSpec{ExecMode: v1beta1.ExecModeVerified, TrustedSigners: []v1beta1.TrustedSigner{"ssh-ed25519 AAAA"}, ShimCommand: "sudo -n /usr/local/bin/kpssh-shim"}}
	p := &v1beta1.SSHJoinProfile{Spec: v1beta1.SSHJoinProfileSpec{
		Scripts:    &v1beta1.ProfileScripts{Install: "i", Join: "j", Leave: "l"},
		Signatures: &v1beta1.ProfileSignatures{Join: "SIG"}}}
	p.Name = "prof"
	src, err := VerifiedSource(p, engine.PhaseJoin, h)
	if err != nil || src.Script != "j" || src.Verified.Signature != "SIG" || src.Verified.Profile != "prof@1" || src.Verified.ShimCommand != h.Spec.ShimCommand || src.Verified.TrustedSigners[0] != "ssh-ed25519 AAAA" {
		t.Fatalf("%+v %+v %v", src, src.Verified, err)
	}
	if _, err := VerifiedSource(p, engine.PhaseLeave, h); err == nil || !strings.Contains(err.Error(), "signatures.leave") {
		t.Fatalf("unsigned leave: %v", err)
	}
	p.Spec.Scripts, p.Spec.Ansible = nil, &v1beta1.AnsibleSource{Role: "r"}
	if _, err := VerifiedSource(p, engine.PhaseJoin, h); err == nil {
		t.Fatal("ansible profile accepted")
	}
}
