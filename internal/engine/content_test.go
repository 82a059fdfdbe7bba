package engine

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// writeTree writes files (path relative to root → content) under root.
func writeTree(t testing.TB, root string, files map[string]string) {
	t.Helper()
	for p, c := range files {
		f := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// contentRole is a small operator role: every phase writes a marker file.
func contentRole(mark string) map[string]string {
	m := map[string]string{"defaults/main.yml": "---\ncontent_mark: " + mark + "\n"}
	for _, ph := range []string{"install", "join", "leave"} {
		m["tasks/"+ph+".yml"] = `---
- name: ` + ph + ` writes its marker
  ansible.builtin.copy:
    dest: /var/lib/kpssh-content-` + ph + `
    content: "{{ content_mark }} {{ kpssh_phase }}\n"
    mode: "0644"
`
	}
	return m
}

// contentEngine: the shipped collection and testdata/roles, then one
// operator roles directory and two operator collections directories.
func contentEngine(t *testing.T) (e *Local, roles, coll1, coll2 string) {
	t.Helper()
	base := t.TempDir()
	roles, coll1, coll2 = filepath.Join(base, "roles"), filepath.Join(base, "coll1"), filepath.Join(base, "coll2")
	for _, d := range []string{roles, coll1, coll2} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	e = testEngine(t, func(o *Options) {
		o.RolesPath = append(o.RolesPath, roles)
		o.ExtraCollectionsPaths = []string{coll1, coll2}
	})
	return e, roles, coll1, coll2
}

func mustErr(t *testing.T, err error, want ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want one containing %q", want)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not contain %q", err, w)
		}
	}
}

// TestValidateRoleContentSources: roles resolve in operator content as
// ansible resolves them, and every mistake names the role and the searched
// paths or the offending file.
func TestValidateRoleContentSources(t *testing.T) {
	e, roles, coll1, coll2 := contentEngine(t)
	shipped := e.RolesPaths()[0]
	writeTree(t, roles, prefix("site_join/", contentRole("short")))
	writeTree(t, coll1, prefix("ansible_collections/acme/site/roles/site_join/", contentRole("fqcn")))

	for _, role := range []string{"site_join", "acme.site.site_join", "kpssh_test_role"} {
		for _, ph := range []Phase{PhaseInstall, PhaseJoin, PhaseLeave} {
			if err := e.ValidateRole(role, ph); err != nil {
				t.Errorf("%s %s: %v", role, ph, err)
			}
		}
	}

	t.Run("not found names every searched path", func(t *testing.T) {
		mustErr(t, e.ValidateRole("nowhere", PhaseJoin), "role nowhere not found in: "+shipped+", "+roles)
		mustErr(t, e.ValidateRole("acme.other.x", PhaseJoin),
			"role acme.other.x not found in: "+e.CollectionsPaths()[0]+", "+coll1+", "+coll2, "no collection acme.other")
	})
	t.Run("a role in a later copy of a collection is never loaded", func(t *testing.T) {
		writeTree(t, coll2, prefix("ansible_collections/acme/site/roles/only_here/", contentRole("late")))
		mustErr(t, e.ValidateRole("acme.site.only_here", PhaseJoin), "not found", "loaded from "+filepath.Join(coll1, "ansible_collections/acme/site"),
			filepath.Join(coll2, "ansible_collections/acme/site/roles/only_here")+" is never used")
	})
	t.Run("same FQCN in two sources", func(t *testing.T) {
		writeTree(t, coll2, prefix("ansible_collections/acme/site/roles/site_join/", contentRole("shadow")))
		defer os.RemoveAll(filepath.Join(coll2, "ansible_collections/acme/site/roles/site_join"))
		mustErr(t, e.ValidateRole("acme.site.site_join", PhaseJoin),
			"role acme.site.site_join in "+filepath.Join(coll2, "ansible_collections/acme/site/roles/site_join"),
			"which ansible loads instead")
	})
	t.Run("operator role shadowing a shipped one", func(t *testing.T) {
		writeTree(t, roles, prefix("kpssh_test_role/", contentRole("shadow")))
		defer os.RemoveAll(filepath.Join(roles, "kpssh_test_role"))
		mustErr(t, e.ValidateRole("kpssh_test_role", PhaseJoin),
			"role kpssh_test_role in "+filepath.Join(roles, "kpssh_test_role")+" has the name of the role in "+filepath.Join(shipped, "kpssh_test_role"))
	})
	t.Run("YAML syntax error names the file", func(t *testing.T) {
		writeTree(t, roles, prefix("broken/", contentRole("x")))
		writeTree(t, roles, map[string]string{"broken/handlers/main.yml": "- name: x\n  command: [unclosed\n"})
		mustErr(t, e.ValidateRole("broken", PhaseJoin), "role broken: "+filepath.Join(roles, "broken/handlers/main.yml")+" is not valid YAML", "line")
	})
	t.Run("missing phase file", func(t *testing.T) {
		writeTree(t, roles, map[string]string{"nojoin/tasks/install.yml": "- ansible.builtin.meta: noop\n"})
		mustErr(t, e.ValidateRole("nojoin", PhaseJoin), "role nojoin ("+filepath.Join(roles, "nojoin")+") has no tasks/join.yml")
	})
	t.Run("unreadable source", func(t *testing.T) {
		// a symlink loop: unreadable for root too (a chmod 000 is not)
		loop := filepath.Join(t.TempDir(), "loop")
		if err := os.Symlink(loop, loop); err != nil {
			t.Fatal(err)
		}
		e2 := testEngine(t, func(o *Options) {
			o.RolesPath = append(o.RolesPath, loop)
			o.ExtraCollectionsPaths = []string{loop}
		})
		mustErr(t, e2.ValidateRole("site_join", PhaseJoin), "content source "+loop+" is unreadable", "too many levels of symbolic links")
		mustErr(t, e2.ValidateRole("acme.site.site_join", PhaseJoin), "content source "+loop+" is unreadable")
		// roles found before the unreadable source are unaffected
		if err := e2.ValidateRole("kpssh_test_role", PhaseJoin); err != nil {
			t.Errorf("a shipped role fails beside an unreadable source: %v", err)
		}
	})
	t.Run("ConfigMap volume layout", func(t *testing.T) {
		// what the kubelet makes of a ConfigMap with items (key → path):
		// the visible entries are symlinks into ..data
		dir := filepath.Join(roles, "cm_role")
		data := filepath.Join(dir, "..2026_01_01")
		writeTree(t, data, contentRole("cm"))
		writeTree(t, data, map[string]string{"handlers/main.yml": "- name: x\n  command: [unclosed\n"})
		for _, l := range [][2]string{{"..2026_01_01", filepath.Join(dir, "..data")}, {"..data/tasks", filepath.Join(dir, "tasks")},
			{"..data/defaults", filepath.Join(dir, "defaults")}, {"..data/handlers", filepath.Join(dir, "handlers")}} {
			if err := os.Symlink(l[0], l[1]); err != nil {
				t.Fatal(err)
			}
		}
		mustErr(t, e.ValidateRole("cm_role", PhaseJoin), filepath.Join(dir, "handlers/main.yml")+" is not valid YAML")
		os.RemoveAll(filepath.Join(data, "handlers"))
		os.Remove(filepath.Join(dir, "handlers"))
		if err := e.ValidateRole("cm_role", PhaseJoin); err != nil {
			t.Error(err)
		}
	})
}

func prefix(p string, m map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range m {
		out[p+k] = v
	}
	return out
}

// TestRenderedConfigCarriesContentPaths: ansible.cfg lists the same paths,
// in the same order, as ValidateRole searches; the sandbox may read them.
func TestRenderedConfigCarriesContentPaths(t *testing.T) {
	e, roles, coll1, coll2 := contentEngine(t)
	cfg := ansibleConfig(e.renderConfig("/dev/shm/kpssh-x", time.Minute))
	if want := "collections_path = " + strings.Join(e.CollectionsPaths(), ":") + "\n"; !strings.Contains(cfg, want) || !strings.Contains(want, coll1+":"+coll2) {
		t.Errorf("ansible.cfg lacks %q:\n%s", want, cfg)
	}
	if want := "roles_path = " + strings.Join(e.RolesPaths(), ":") + "\n"; !strings.Contains(cfg, want) || !strings.HasSuffix(strings.TrimSpace(want), roles) {
		t.Errorf("ansible.cfg lacks %q:\n%s", want, cfg)
	}
	if e.sandboxed() {
		env := strings.Join(e.sandboxEnv(), "\n")
		for _, p := range []string{roles, coll1, coll2} {
			if !strings.Contains(env, p) {
				t.Errorf("sandbox read list lacks %s: %s", p, env)
			}
		}
	}
	if _, err := New(Options{AnsiblePlaybook: playbookBin(t), CollectionsPath: e.CollectionsPaths()[0], ExtraCollectionsPaths: []string{"/a b"}}); err == nil ||
		!strings.Contains(err.Error(), `content path "/a b"`) {
		t.Errorf("a content path ansible.cfg cannot carry: %v", err)
	}
}

// TestContentRolesRun: roles from operator content (a roles directory and a
// collection, both outside the repo) run on a real host through
// ansible-playbook, sandboxed like every run.
func TestContentRolesRun(t *testing.T) {
	if testing.Short() {
		t.Skip("real hosts: not in -short")
	}
	e, roles, coll1, _ := contentEngine(t)
	writeTree(t, roles, prefix("site_join/", contentRole("short")))
	writeTree(t, coll1, prefix("ansible_collections/acme/site/roles/site_join/", contentRole("fqcn")))
	writeTree(t, coll1, map[string]string{"ansible_collections/acme/site/galaxy.yml": "namespace: acme\nname: site\nversion: 1.0.0\nreadme: README.md\nauthors: [x]\n"})
	w := upWorld(t, 1)
	for role, mark := range map[string]string{"site_join": "short", "acme.site.site_join": "fqcn"} {
		for _, ph := range []Phase{PhaseInstall, PhaseJoin, PhaseLeave} {
			if err := e.ValidateRole(role, ph); err != nil {
				t.Fatal(err)
			}
			c := joinContext(w.Host(0))
			if ph == PhaseLeave {
				c = Context{HostAddress: c.HostAddress, NodeAddress: c.NodeAddress}
			}
			r := e.Run(context.Background(), Request{Phase: ph, Conn: w.conn(0), Source: Source{Role: role}, Context: c, Timeout: 2 * time.Minute})
			mustOutcome(t, r, Succeeded)
			if got := mustRun(t, w, 0, "cat /var/lib/kpssh-content-"+string(ph)); got != mark+" "+string(ph) {
				t.Errorf("%s %s wrote %q", role, ph, got)
			}
		}
	}
}

// TestValidateRoleAnsibleSyntax: a role whose files are valid YAML but which
// ansible cannot load — two actions in one task, a module that exists
// nowhere, a dependency on a role that does not, an import of a missing
// file, a broken handler — is refused by ValidateRole with ansible's own
// message naming the file and line (ansible-playbook --syntax-check of the
// play a run renders), before any host: the node class condition. The
// verdict is cached until a file of the role changes.
func TestValidateRoleAnsibleSyntax(t *testing.T) {
	e, roles, _, _ := contentEngine(t)
	cases := []struct {
		role  string
		files map[string]string
		phase Phase
		want  []string
	}{
		{"two_actions", map[string]string{"tasks/join.yml": "- name: two\n  ansible.builtin.command: /bin/true\n  ansible.builtin.shell: /bin/true\n"},
			PhaseJoin, []string{"conflicting action statements: ansible.builtin.command, ansible.builtin.shell", "two_actions/tasks/join.yml:1:3"}},
		{"no_module", map[string]string{"tasks/install.yml": "- name: nowhere\n  acme.nothing.frobnicate:\n    x: 1\n"},
			PhaseInstall, []string{"couldn't resolve module/action 'acme.nothing.frobnicate'", "no_module/tasks/install.yml:1:3"}},
		{"missing_dep", map[string]string{"meta/main.yml": "dependencies:\n  - role: not_there\n"},
			PhaseJoin, []string{"the role 'not_there' was not found", "missing_dep/meta/main.yml:2"}},
		{"bad_import", map[string]string{"tasks/join.yml": "- name: steps\n  ansible.builtin.import_tasks: steps.yml\n"},
			PhaseJoin, []string{"steps.yml", "(while loading " + filepath.Join(roles, "bad_import") + ")"}},
		{"bad_handler", map[string]string{"handlers/main.yml": "- name: restart\n  ansible.builtin.command: /bin/true\n  ansible.builtin.shell: /bin/true\n"},
			PhaseLeave, []string{"conflicting action statements", "bad_handler/handlers/main.yml:1:3"}},
	}
	for _, c := range cases {
		t.Run(c.role, func(t *testing.T) {
			writeTree(t, roles, prefix(c.role+"/", contentRole(c.role)))
			writeTree(t, roles, prefix(c.role+"/", c.files))
			err := e.ValidateRole(c.role, c.phase)
			mustErr(t, err, append([]string{"role " + c.role + ": ansible cannot load it: "}, c.want...)...)
			t.Logf("%v", err)
			if err != nil && strings.Contains(err.Error(), "kpssh-") {
				t.Errorf("the message names the check's run directory: %v", err)
			}
		})
	}

	t.Run("cached until the role changes", func(t *testing.T) {
		writeTree(t, roles, prefix("cached/", contentRole("cached")))
		n := e.syntax.runs.Load()
		for i := 0; i < 3; i++ {
			if err := e.ValidateRole("cached", PhaseJoin); err != nil {
				t.Fatal(err)
			}
		}
		for _, ph := range []Phase{PhaseInstall, PhaseLeave} {
			if err := e.ValidateRole("cached", ph); err != nil {
				t.Fatal(err)
			}
		}
		if got := e.syntax.runs.Load() - n; got != 1 {
			t.Errorf("5 validations of an unchanged role ran ansible %d times, want 1 (all phases at once)", got)
		}
		writeTree(t, roles, map[string]string{"cached/tasks/join.yml": "- name: two\n  ansible.builtin.command: /bin/true\n  ansible.builtin.shell: /bin/true\n"})
		mustErr(t, e.ValidateRole("cached", PhaseJoin), "conflicting action statements")
		writeTree(t, roles, prefix("cached/", contentRole("fixed")))
		if err := e.ValidateRole("cached", PhaseJoin); err != nil {
			t.Errorf("fixed role still refused: %v", err)
		}
		if got := e.syntax.runs.Load() - n; got != 3 {
			t.Errorf("ansible ran %d times for 3 versions of the role, want 3", got)
		}
	})
	t.Run("the shipped roles are not checked again", func(t *testing.T) {
		n := e.syntax.runs.Load()
		for _, r := range []string{"dklesev.kpssh.tls_bootstrap", "dklesev.kpssh.sbc"} {
			if err := e.ValidateRole(r, PhaseJoin); err != nil {
				t.Fatal(err)
			}
		}
		if got := e.syntax.runs.Load() - n; got != 0 {
			t.Errorf("ansible ran %d times for the shipped role", got)
		}
	})
}

func TestSyntaxMessage(t *testing.T) {
	const loading = "/r/x"
	for _, c := range []struct{ stderr, want string }{
		{"[WARNING]: noise\n[ERROR]: conflicting action statements: a, b\nOrigin: /r/x/tasks/join.yml:1:3\n\n1 - name: two\n    ^ column 3\n",
			"conflicting action statements: a, b (/r/x/tasks/join.yml:1:3)"},
		{"[ERROR]: Unable to retrieve file contents.\nCould not find 'steps.yml'\n", "Unable to retrieve file contents. Could not find 'steps.yml' (while loading " + loading + ")"},
		{"ERROR! conflicting action statements\n\nThe error appears to be in '/r/x/tasks/join.yml': line 1, column 3\n",
			"conflicting action statements The error appears to be in '/r/x/tasks/join.yml': line 1, column 3"},
		{"kpssh sandbox: landlock refused\n", ""},
		{"", ""},
	} {
		if got := syntaxMessage(c.stderr, loading); got != c.want {
			t.Errorf("syntaxMessage(%q) = %q, want %q", c.stderr, got, c.want)
		}
	}
	if got := syntaxMessage("[ERROR]: "+strings.Repeat("é", 1000), loading); len(got) > maxSyntaxMessage+len("…") || !utf8.ValidString(got) {
		t.Errorf("long message: %d bytes, valid UTF-8 %v", len(got), utf8.ValidString(got))
	}
}

func FuzzSyntaxMessage(f *testing.F) {
	f.Add("[ERROR]: x\nOrigin: /a:1:2\n")
	f.Add("ERROR! y")
	f.Fuzz(func(t *testing.T, s string) {
		got := syntaxMessage(s, "/r/tasks/join.yml")
		if len(got) > maxSyntaxMessage+len("…") {
			t.Fatalf("%d bytes", len(got))
		}
		if strings.ContainsAny(got, "\n\r") {
			t.Fatalf("more than one line: %q", got)
		}
	})
}

// TestBrokenContentOtherRolesRun: content that is broken in every way the
// node class reports — an unreadable source (a symlink loop as a roles
// directory, as a collections directory and inside ansible_collections),
// a role with a YAML syntax error, a role ansible cannot load, a collection
// whose meta/runtime.yml and galaxy.yml are not YAML, a second copy of the
// project's collection — sits in the search paths while other profiles'
// phases run on a real host: a good operator role's join (short name and
// FQCN) and a script succeed. Only the broken roles' own runs fail.
func TestBrokenContentOtherRolesRun(t *testing.T) {
	if testing.Short() {
		t.Skip("real hosts: not in -short")
	}
	base := t.TempDir()
	roles, coll := filepath.Join(base, "roles"), filepath.Join(base, "coll")
	loop := filepath.Join(base, "loop")
	if err := os.Symlink(loop, loop); err != nil {
		t.Fatal(err)
	}
	writeTree(t, roles, prefix("site_join/", contentRole("short")))
	writeTree(t, roles, prefix("yaml_broken/", contentRole("x")))
	writeTree(t, roles, map[string]string{"yaml_broken/defaults/main.yml": "a: [unclosed\n"})
	writeTree(t, roles, prefix("ansible_broken/", contentRole("x")))
	writeTree(t, roles, map[string]string{"ansible_broken/tasks/join.yml": "- name: two\n  ansible.builtin.command: /bin/true\n  ansible.builtin.shell: /bin/true\n"})
	if err := os.Symlink(filepath.Join(roles, "loop_role"), filepath.Join(roles, "loop_role")); err != nil {
		t.Fatal(err)
	}
	writeTree(t, coll, prefix("ansible_collections/acme/site/roles/site_join/", contentRole("fqcn")))
	writeTree(t, coll, map[string]string{
		"ansible_collections/acme/bad/meta/runtime.yml": "requires_ansible: [unclosed\n",
		"ansible_collections/acme/bad/galaxy.yml":       "namespace: [unclosed\n",
		// a second copy of the project's collection: never loaded
		"ansible_collections/dklesev/kpssh/meta/runtime.yml": "requires_ansible: [unclosed\n",
	})
	if err := os.Symlink(filepath.Join(coll, "ansible_collections", "loop"), filepath.Join(coll, "ansible_collections", "loop")); err != nil {
		t.Fatal(err)
	}
	e := testEngine(t, func(o *Options) {
		o.RolesPath = append(o.RolesPath, loop, roles)
		o.ExtraCollectionsPaths = []string{loop, coll}
	})
	// what the node class would say of each broken one
	mustErr(t, e.ValidateRole("yaml_broken", PhaseJoin), "content source "+loop+" is unreadable")
	mustErr(t, e.ValidateRole("acme.bad.x", PhaseJoin), "content source "+loop+" is unreadable")

	w := upWorld(t, 1)
	for _, role := range []string{"site_join", "acme.site.site_join"} {
		r := e.Run(context.Background(), Request{Phase: PhaseJoin, Conn: w.conn(0), Source: Source{Role: role}, Context: joinContext(w.Host(0)), Timeout: 2 * time.Minute})
		mustOutcome(t, r, Succeeded)
	}
	r := e.Run(context.Background(), Request{Phase: PhaseJoin, Conn: w.conn(0), Source: Source{Script: "echo script > /var/lib/kpssh-content-script"},
		Context: joinContext(w.Host(0)), Timeout: time.Minute})
	mustOutcome(t, r, Succeeded)
	if got := mustRun(t, w, 0, "cat /var/lib/kpssh-content-join /var/lib/kpssh-content-script"); got != "fqcn join\nscript" {
		t.Errorf("markers %q", got)
	}
	// the broken roles' own runs fail before the host is touched
	r = e.Run(context.Background(), Request{Phase: PhaseJoin, Conn: w.conn(0), Source: Source{Role: "ansible_broken"}, Context: joinContext(w.Host(0)), Timeout: time.Minute})
	mustOutcome(t, r, ConfigError)
}

// TestFindInstalledCollection: outside a checkout and the image (an author's
// machine), the project's collection is found where ansible-galaxy installed
// it — ansible's own collections path — and the shipped roles in it.
func TestFindInstalledCollection(t *testing.T) {
	if exists("/usr/share/kpssh/collections") {
		t.Skip("the runner image's collection is found first here")
	}
	t.Chdir(t.TempDir()) // not a checkout
	base := t.TempDir()
	a, b, home := filepath.Join(base, "a"), filepath.Join(base, "b"), filepath.Join(base, "home")
	coll := map[string]string{
		"ansible_collections/dklesev/kpssh/plugins/callback/kpssh_events.py":   "# stand-in\n",
		"ansible_collections/dklesev/kpssh/roles/tls_bootstrap/tasks/join.yml": "- ansible.builtin.meta: noop\n",
	}
	writeTree(t, b, coll)
	writeTree(t, filepath.Join(home, ".ansible", "collections"), coll)
	t.Setenv("HOME", home)

	t.Setenv("ANSIBLE_COLLECTIONS_PATH", a+":"+b)
	if p, err := FindCollectionsPath(); err != nil || p != b {
		t.Errorf("FindCollectionsPath = %q, %v; want %s", p, err, b)
	}
	if p, err := FindRolesPath(); err != nil || p != filepath.Join(b, collectionRolesDir) {
		t.Errorf("FindRolesPath = %q, %v; want the installed collection's roles", p, err)
	}
	t.Setenv("ANSIBLE_COLLECTIONS_PATH", "")
	if p, err := FindCollectionsPath(); err != nil || p != filepath.Join(home, ".ansible", "collections") {
		t.Errorf("ansible's default path: FindCollectionsPath = %q, %v", p, err)
	}
	t.Setenv("ANSIBLE_COLLECTIONS_PATH", a)
	if _, err := FindCollectionsPath(); err == nil || !strings.Contains(err.Error(), "ansible-galaxy collection install") || !strings.Contains(err.Error(), a) {
		t.Errorf("not installed: %v", err)
	}
}
