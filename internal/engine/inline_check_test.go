package engine

import (
	"strings"
	"testing"
)

// CheckInlineTasks: what it lets through (ordinary host-side tasks) and
// what it refuses, naming the task and the rule. The attacks themselves run
// in attack_test.go.
func TestCheckInlineTasks(t *testing.T) {
	ok := map[string]string{
		"command and copy content": `- name: write it
  ansible.builtin.copy:
    content: "{{ kpssh_vars.x }}"
    dest: /etc/x
- ansible.builtin.command: /bin/true
  when: kpssh_phase == 'join'`,
		"copy remote_src":     "- ansible.builtin.copy:\n    src: /etc/a\n    dest: /etc/b\n    remote_src: true\n",
		"unarchive remote":    "- ansible.builtin.unarchive: src=/tmp/a.tgz dest=/opt remote_src=yes\n",
		"with_items":          "- ansible.builtin.command: echo {{ item }}\n  with_items: [a, b]\n",
		"plain word lookup":   "- name: lookup the DNS name in plain text\n  ansible.builtin.command: host lookup.example\n",
		"quoted word":         "- ansible.builtin.debug:\n    msg: \"{{ d['lookup'] }}\"\n",
		"block of host work":  "- block:\n    - ansible.builtin.command: /bin/true\n  rescue:\n    - ansible.builtin.command: /bin/false\n",
		"stdin_exec cmd only": "- dklesev.kpssh.stdin_exec: {cmd: 'true'}\n",
		"vars not ansible_":   "- ansible.builtin.command: echo {{ x }}\n  vars:\n    x: 1\n",
	}
	for name, tasks := range ok {
		if err := Validate(PhaseJoin, Source{Tasks: tasks}); err != nil {
			t.Errorf("%s: refused: %v", name, err)
		}
	}
	bad := map[string]struct{ tasks, want string }{
		"delegate_to":         {"- name: read it\n  ansible.builtin.command: cat /x\n  delegate_to: localhost\n", `task 1 ("read it") (line 3): delegate_to is not allowed in inline tasks: it runs the task on another host (localhost: the controller)`},
		"third task":          {"- ansible.builtin.command: a\n- ansible.builtin.command: b\n- name: read it\n  ansible.builtin.command: c\n  delegate_to: 127.0.0.1\n", `task 3 ("read it")`},
		"in rescue":           {"- block:\n    - ansible.builtin.command: a\n  rescue:\n    - ansible.builtin.command: b\n      delegate_to: localhost\n", "task 1 rescue task 1 (line 5): delegate_to"},
		"ansible_host var":    {"- ansible.builtin.command: a\n  vars:\n    ansible_host: 127.0.0.1\n", "vars ansible_host is not allowed"},
		"set_fact k=v":        {"- ansible.builtin.set_fact: ansible_connection=local\n", "set_fact ansible_connection is not allowed"},
		"loop_var":            {"- ansible.builtin.command: a\n  loop: [local]\n  loop_control:\n    loop_var: ansible_connection\n", "loop_var: ansible_connection is not allowed"},
		"register":            {"- ansible.builtin.command: a\n  register: ansible_host\n", "register: ansible_host is not allowed"},
		"lookup with spaces":  {"- ansible.builtin.debug:\n    msg: \"{{ lookup ('env', 'HOME') }}\"\n", "Jinja lookup() is not allowed"},
		"aliased lookup":      {"- ansible.builtin.debug:\n    msg: \"{% set l = lookup %}{{ l('pipe', 'id') }}\"\n", "Jinja lookup() is not allowed"},
		"lookup in name":      {"- name: \"{{ lookup('pipe', 'id') }}\"\n  ansible.builtin.command: a\n", "Jinja lookup() is not allowed"},
		"query in assert":     {"- ansible.builtin.assert:\n    that:\n      - query('file', '/x')\n", "Jinja query() is not allowed"},
		"include statement":   {"- ansible.builtin.debug:\n    msg: \"{% include '/var/run/secrets/x' %}\"\n", "Jinja {% include %} is not allowed"},
		"with_pipe":           {"- ansible.builtin.debug: msg={{ item }}\n  with_pipe: [id]\n", "with_pipe is not allowed"},
		"include_tasks":       {"- ansible.builtin.include_tasks: /x.yml\n", "ansible.builtin.include_tasks is not allowed"},
		"import_role":         {"- ansible.builtin.import_role:\n    name: tls_bootstrap\n", "import_role is not allowed"},
		"template":            {"- template: src=/x dest=/y\n", "template is not allowed"},
		"copy src args":       {"- ansible.builtin.copy:\n  args:\n    src: /x\n    dest: /y\n", "copy with src is not allowed"},
		"fetch":               {"- ansible.builtin.fetch: src=/etc/x dest=/tmp/\n", "fetch is not allowed"},
		"script":              {"- ansible.builtin.script: /x\n", "script is not allowed"},
		"add_host":            {"- ansible.builtin.add_host: name=c ansible_connection=local\n", "add_host is not allowed"},
		"stdin_exec":          {"- dklesev.kpssh.stdin_exec:\n    cmd: cat\n    stdin_file: /x\n", "dklesev.kpssh.stdin_exec with a file is not allowed"},
		"action local module": {"- action: ansible.builtin.include_vars file=/x\n", "action: ansible.builtin.include_vars is not allowed"},
		"local_action":        {"- local_action: command id\n", "local_action is not allowed"},
		"connection":          {"- ansible.builtin.command: id\n  connection: local\n", "connection is not allowed"},
		"merge key":           {"- ansible.builtin.command: id\n  vars: &v {x: 1}\n- <<: *v\n  ansible.builtin.command: id\n", "is not allowed in inline tasks: aliases and merge keys"},
	}
	for name, c := range bad {
		err := Validate(PhaseJoin, Source{Tasks: c.tasks})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want %q", name, err, c.want)
		}
	}
}
