package engine

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Issue 15 item 2: content of a profile (an inline task list from the API,
// or a role) must not read the controller's credentials or another run's
// files. Each attack below is a task list that, run on the controller as
// the controller's user, would carry a canary into the phase result (the
// failure message) or onto the host: the ServiceAccount token stands in as
// a canary file in a temp dir the test (the controller) can read, another
// run as a canary key in a live run directory of this process beside the
// attack's own.

// attack is a task list; TOKEN and SIBLING are replaced by the two canary
// paths. stolen: where the canary would land on the host ("" = only the
// result). keyword: what CheckInlineTasks must name.
type attack struct {
	name, tasks, onHost, keyword string
	// inert: why the attack does not work even unguarded (refused anyway)
	inert string
}

// the sink: the failure message carries whatever was read
const sink = `
- name: report it
  ansible.builtin.fail:
    msg: "STOLEN[{{ stolen.stdout | default(stolen) }}]"
`

var attacks = []attack{
	{name: "delegate_to localhost", keyword: "delegate_to", tasks: `
- name: read it
  ansible.builtin.command: cat TOKEN
  delegate_to: localhost
  register: stolen
` + sink},
	{name: "delegate_to localhost, remote tmp in the run directory", keyword: "delegate_to", tasks: `
- name: read it
  ansible.builtin.command: cat TOKEN
  delegate_to: localhost
  vars:
    ansible_remote_tmp: "{{ playbook_dir }}/tmp"
  register: stolen
` + sink},
	{name: "local_action", keyword: "local_action", tasks: `
- name: read it
  local_action: ansible.builtin.command cat TOKEN
  register: stolen
` + sink},
	{name: "connection local", keyword: "connection", inert: "the inventory's ansible_connection: ssh beats the keyword", tasks: `
- name: read it
  ansible.builtin.command: cat TOKEN
  connection: local
  register: stolen
` + sink},
	{name: "ansible_connection var", keyword: "vars ansible_connection", tasks: `
- name: read it
  ansible.builtin.command: cat TOKEN
  vars:
    ansible_connection: local
  register: stolen
` + sink},
	{name: "set_fact ansible_connection", keyword: "set_fact ansible_connection", tasks: `
- name: go local
  ansible.builtin.set_fact:
    ansible_connection: local
- name: read it
  ansible.builtin.command: cat TOKEN
  register: stolen
` + sink},
	{name: "lookup file", keyword: "Jinja lookup()", tasks: `
- name: read it
  ansible.builtin.set_fact:
    stolen: "{{ lookup('ansible.builtin.file', 'TOKEN') }}"
` + sink},
	{name: "lookup pipe", keyword: "Jinja lookup()", tasks: `
- name: read it
  ansible.builtin.set_fact:
    stolen: "{{ lookup('pipe', 'cat TOKEN') }}"
` + sink},
	{name: "query file in a block", keyword: "Jinja query()", tasks: `
- name: a block
  block:
    - name: read it
      ansible.builtin.set_fact:
        stolen: "{{ query('file', 'TOKEN') | first }}"
` + sink},
	{name: "q in when", keyword: "Jinja q()", tasks: `
- name: read it
  ansible.builtin.set_fact:
    stolen: "TOKEN"
- name: report it
  ansible.builtin.fail:
    msg: "STOLEN[{{ stolen }}]"
  when: q('file', stolen) | length > 0 and false
- name: report the content
  ansible.builtin.fail:
    msg: "STOLEN[{{ q('file', stolen) | first }}]"
`},
	{name: "with_file", keyword: "with_file", tasks: `
- name: read it
  ansible.builtin.fail:
    msg: "STOLEN[{{ item }}]"
  with_file: [TOKEN]
`},
	{name: "include_vars", keyword: "include_vars", tasks: `
- name: read it
  ansible.builtin.include_vars:
    file: TOKEN
    name: stolen
` + sink},
	{name: "template from the controller", keyword: "template", onHost: "/tmp/kpssh-stolen-template", tasks: `
- name: read it
  ansible.builtin.template:
    src: TOKEN
    dest: /tmp/kpssh-stolen-template
    mode: "0600"
`},
	{name: "copy src from the controller", keyword: "copy with src", onHost: "/tmp/kpssh-stolen-copy", tasks: `
- name: read it
  ansible.builtin.copy:
    src: TOKEN
    dest: /tmp/kpssh-stolen-copy
    mode: "0600"
`},
	{name: "slurp delegated", keyword: "delegate_to", tasks: `
- name: read it
  ansible.builtin.slurp:
    src: TOKEN
  delegate_to: localhost
  register: raw
- name: decode it
  ansible.builtin.set_fact:
    stolen: "{{ raw.content | b64decode }}"
` + sink},
	{name: "stdin_exec of a controller file", keyword: "dklesev.kpssh.stdin_exec with a file", onHost: "/tmp/kpssh-stolen-stdin", tasks: `
- name: read it
  dklesev.kpssh.stdin_exec:
    cmd: cat > /tmp/kpssh-stolen-stdin
    stdin_file: TOKEN
`},
	{name: "another run's key", keyword: "Jinja lookup()", tasks: `
- name: read it
  ansible.builtin.set_fact:
    stolen: "{{ lookup('file', 'SIBLING') }}"
` + sink},
	{name: "another run's key, delegated", keyword: "delegate_to", tasks: `
- name: read it
  ansible.builtin.command: cat SIBLING
  delegate_to: localhost
  register: stolen
` + sink},
}

// canaries plants the two canaries: a "ServiceAccount token" in a temp dir
// and a key in a live run directory of this process (what another run's
// directory is) in base. It returns their paths and contents.
func canaries(t *testing.T, base string) (tokenPath, tokenCanary, siblingPath, siblingCanary string) {
	t.Helper()
	stamp := time.Now().UnixNano()
	tokenCanary = fmt.Sprintf("CANARY-SA-TOKEN-%d", stamp)
	siblingCanary = fmt.Sprintf("CANARY-OTHER-RUN-KEY-%d", stamp)
	tokenPath = filepath.Join(t.TempDir(), "token")
	// YAML-shaped, so that include_vars could load it
	if err := os.WriteFile(tokenPath, []byte("canary_token: "+tokenCanary+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sib, err := newRunDir(base)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sib.remove() })
	if err := sib.write(fileKey, []byte(siblingCanary+"\n")); err != nil {
		t.Fatal(err)
	}
	return tokenPath, tokenCanary, sib.join(fileKey), siblingCanary
}

func TestInlineTasksCannotActOnTheController(t *testing.T) {
	if testing.Short() {
		t.Skip("real host: not in -short")
	}
	base := runDirBase(t)
	tokenPath, tokenCanary, siblingPath, siblingCanary := canaries(t, base)
	w := upWorld(t, 1)
	conn := w.conn(0)
	c := joinContext(w.Host(0))
	plant := func(a attack) string {
		return strings.NewReplacer("TOKEN", tokenPath, "SIBLING", siblingPath).Replace(a.tasks)
	}
	leaked := func(t *testing.T, a attack, r Result) []string {
		var where []string
		for _, cn := range []string{tokenCanary, siblingCanary} {
			if strings.Contains(r.Message, cn) || strings.Contains(r.FailedTask, cn) {
				where = append(where, "result")
			}
		}
		if a.onHost != "" {
			out, _, _ := w.Run(0, "cat "+a.onHost+" 2>/dev/null; rm -f "+a.onHost)
			if strings.Contains(out, tokenCanary) {
				where = append(where, "host "+a.onHost)
			}
		}
		return where
	}
	run := func(e *Local, a attack) Result {
		return e.Run(context.Background(), Request{Phase: PhaseJoin, Conn: conn, Source: Source{Tasks: plant(a)}, Context: c, Timeout: 2 * time.Minute})
	}

	// Red: neither guard. Every attack must really reach the canaries, or
	// the green runs below would prove nothing.
	t.Run("unguarded", func(t *testing.T) {
		e := testEngine(t, func(o *Options) { o.noSandbox, o.noTaskCheck, o.RunDirBase = true, true, base })
		for _, a := range attacks {
			r := run(e, a)
			if where := leaked(t, a, r); a.inert != "" {
				if len(where) > 0 {
					t.Errorf("%s: reached the canary (%v), though %s", a.name, where, a.inert)
				}
			} else if len(where) == 0 {
				t.Errorf("%s: the attack did not reach its canary without the guards (so the guarded runs prove nothing): %s %s", a.name, r.Outcome, r.Message)
			}
		}
	})
	// The engine's check refuses every attack before anything starts.
	t.Run("checked", func(t *testing.T) {
		e := testEngine(t, func(o *Options) { o.noSandbox, o.RunDirBase = true, base })
		for _, a := range attacks {
			r := run(e, a)
			if r.Outcome != ConfigError || r.Touched || r.ExitCode != -1 || !strings.Contains(r.Message, a.keyword+" is not allowed in inline tasks") {
				t.Errorf("%s: want a ConfigError naming %q before anything ran, got %s (exit %d): %s", a.name, a.keyword, r.Outcome, r.ExitCode, r.Message)
			}
			if where := leaked(t, a, r); len(where) > 0 {
				t.Errorf("%s: canary in %v", a.name, where)
			}
		}
	})
	// The sandbox alone (the check skipped): the run cannot read them.
	t.Run("sandboxed", func(t *testing.T) {
		e := testEngine(t, func(o *Options) { o.noTaskCheck, o.RunDirBase, o.Sandbox = true, base, SandboxRequired })
		if !e.sandboxed() || e.isolationErr != nil {
			t.Fatalf("no sandbox here: %v %v", e.sandboxErr, e.isolationErr)
		}
		for _, a := range attacks {
			r := run(e, a)
			t.Logf("%s: %s: %.300s", a.name, r.Outcome, r.Message)
			if where := leaked(t, a, r); len(where) > 0 {
				t.Errorf("%s: canary in %v: %s", a.name, where, r.Message)
			}
			if r.Outcome == Succeeded {
				t.Errorf("%s: succeeded", a.name)
			}
		}
	})
}

// Roles are not checked (shipped roles use template lookups of their own
// files): the sandbox is what keeps a role from the controller's files. The
// attack role reads the path it is given in kpssh_vars.
func TestRoleCannotReadControllerFiles(t *testing.T) {
	if testing.Short() {
		t.Skip("real host: not in -short")
	}
	base := runDirBase(t)
	tokenPath, tokenCanary, siblingPath, siblingCanary := canaries(t, base)
	w := upWorld(t, 1)
	for _, target := range []struct{ path, canary string }{{tokenPath, tokenCanary}, {siblingPath, siblingCanary}} {
		c := joinContext(w.Host(0))
		c.Vars = map[string]string{"target": target.path}
		req := Request{Phase: PhaseJoin, Conn: w.conn(0), Source: Source{Role: "kpssh_attack_role"}, Context: c, Timeout: 2 * time.Minute}
		red := testEngine(t, func(o *Options) { o.noSandbox, o.RunDirBase = true, base }).Run(context.Background(), req)
		if !strings.Contains(red.Message, target.canary) {
			t.Fatalf("unsandboxed, the role did not reach %s (the sandboxed run proves nothing): %s %s", target.path, red.Outcome, red.Message)
		}
		r := testEngine(t, func(o *Options) { o.RunDirBase, o.Sandbox = base, SandboxRequired }).Run(context.Background(), req)
		t.Logf("%s: %s: %.300s", target.path, r.Outcome, r.Message)
		if strings.Contains(r.Message, target.canary) || r.Outcome == Succeeded {
			t.Errorf("sandboxed role read %s: %s %s", target.path, r.Outcome, r.Message)
		}
	}
}

// runDirBase is a base for run directories outside /dev/shm (the chart's
// RunBaseOwn layout: a directory of their own; /dev/shm is every run's, for
// semaphores). /run is a tmpfs here too.
func runDirBase(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("/run", "kpssh-attack-")
	if err != nil {
		t.Skipf("no directory for run directories outside /dev/shm: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(d) })
	return d
}

// Run directories in /dev/shm are readable by every sandboxed run: with
// Sandbox required the engine refuses to run there, before anything starts.
func TestSandboxRequiredRefusesSharedRunBase(t *testing.T) {
	if testing.Short() {
		t.Skip("runs ansible-playbook")
	}
	e := testEngine(t, func(o *Options) { o.RunDirBase, o.Sandbox = "/dev/shm", SandboxRequired })
	r := e.Run(context.Background(), Request{Phase: PhaseJoin, Conn: testConn(t), Source: Source{Script: "true"}, Timeout: time.Minute})
	if r.Outcome != ConfigError || r.ExitCode != -1 || !strings.Contains(r.Message, "grants /dev/shm to every run") {
		t.Fatalf("want a ConfigError about /dev/shm: %+v", r)
	}
}
