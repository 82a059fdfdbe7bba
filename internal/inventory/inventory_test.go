package inventory

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// summary is "name pos groups(by precedence) k=v…" for comparing hosts.
func summary(h Host) string {
	var groups []string
	for _, m := range h.Groups {
		d := ""
		if m.Direct {
			d = "*"
		}
		groups = append(groups, fmt.Sprintf("%s%s/%d", m.Group, d, m.Depth))
	}
	var vars []string
	for k, v := range h.Vars {
		vars = append(vars, k+"="+v)
	}
	sort.Strings(vars)
	return fmt.Sprintf("%s @%s [%s] %s", h.Name, h.Pos, strings.Join(groups, " "), strings.Join(vars, " "))
}

// checkHosts compares the resolved hosts' summaries with want, or the
// error (of reading or resolving) with wantErr.
func checkHosts(t *testing.T, inv *Inventory, err error, want []string, wantErr string) {
	t.Helper()
	var hosts []Host
	if err == nil {
		hosts, err = inv.Hosts()
	}
	if wantErr != "" {
		if err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Fatalf("error %v, want one containing %q", err, wantErr)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, h := range hosts {
		got = append(got, summary(h))
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestHosts(t *testing.T) {
	cases := []struct {
		name, format, text string
		want               []string
		err                string
	}{
		{name: "ungrouped", text: "h1 a=1\n", want: []string{"h1 @line 1 [ungrouped*/0] a=1"}},
		{name: "precedence all, parents, child, host", text: "[all:vars]\nv=all\nw=all\n[p:vars]\nv=p\nw=p\n[p:children]\nc\n[c:vars]\nv=c\n[c]\nh1 x=own\n",
			want: []string{"h1 @line 12 [all/0 p/0 c*/1] v=c w=p x=own"}},
		{name: "depth before name", text: "[a:children]\nz\n[z]\nh1\n[b]\nh1\n[a:vars]\nk=a\n[z:vars]\nk=z\n[b:vars]\nk=b\n",
			want: []string{"h1 @line 4 [a/0 b*/0 z*/1] k=z"}},
		{name: "first position over groups", text: "[b]\nh1\n[a]\nh1\n", want: []string{"h1 @line 2 [a*/0 b*/0] "}},
		{name: "ranges and host:port", text: "[g]\nn[1:2]:2200\n", want: []string{"n1 @line 2 [g*/0] ansible_port=2200", "n2 @line 2 [g*/0] ansible_port=2200"}},
		{name: "yaml nesting", format: "yaml", text: "all:\n  vars: {u: a}\n  children:\n    p:\n      vars: {u: p}\n      children:\n        c:\n          hosts:\n            h1: {port: 2}\n",
			want: []string{"h1 @line 9 [all/0 p/1 c*/2] port=2 u=p"}},
		{name: "yaml structured var left out", format: "yaml", text: "all:\n  hosts:\n    h1: {list: [1, 2], k: v}\n", want: []string{"h1 @line 3 [all*/0] k=v"}},
		{name: "children cycle", text: "[a:children]\nb\n[b:children]\na\n", err: "children cycle"},
		{name: "two values, not quoted", text: "[a]\nh1 pw=one\n[b]\nh1 pw=two\n", err: "line 4: host h1: pw has another value here than on line 2"},
		{name: "yaml structured ansible_port", format: "yaml", text: "all:\n  hosts:\n    h1: {ansible_port: [1]}\n", err: "line 3: host h1: ansible_port must be a plain value"},
		{name: "listed twice", text: "[a]\nh[1:2]\nh2\n", err: `line 3: host "h2" listed twice in group [a] (first on line 2)`},
		{name: "unknown format", format: "toml", err: `unknown inventory format "toml"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			inv, err := Parse([]byte(tc.text), tc.format)
			checkHosts(t, inv, err, tc.want, tc.err)
		})
	}
}

func TestContains(t *testing.T) {
	inv, err := Parse([]byte("[a:children]\nb\n[b:children]\nc\n[c]\nh1\n[d]\nh1\n"), "ini")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := inv.Hosts(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		parent, child string
		want          bool
	}{{"a", "b", true}, {"a", "c", true}, {"b", "c", true}, {"c", "a", false}, {"a", "d", false}, {"c", "c", false}} {
		if got := inv.Contains(tc.parent, tc.child); got != tc.want {
			t.Errorf("Contains(%s, %s) = %v", tc.parent, tc.child, got)
		}
	}
}

// TestFromJSON reads ansible-inventory --list output as Ansible 2.x writes
// it: "all" with children, "ungrouped", resolved hostvars with numbers.
func TestFromJSON(t *testing.T) {
	cases := []struct {
		name, text string
		want       []string
		err        string
	}{
		{name: "list output", text: `{"_meta": {"hostvars": {"h1": {"ansible_port": 2222, "ansible_user": "kube", "on": true, "vault": {"__ansible_vault": "$ANSIBLE_VAULT;1.1;AES256\n3132"}}, "h2": {}}},
 "all": {"children": ["ungrouped", "big"]}, "big": {"hosts": ["h1"], "children": ["gpu"]}, "gpu": {"hosts": ["h1"]}, "ungrouped": {"hosts": ["h2"]}}`,
			// Hosts come in the order their groups are first named.
			want: []string{"h2 @ [all/0 ungrouped*/1] ", "h1 @ [all/0 big*/1 gpu*/2] ansible_port=2222 ansible_user=kube on=true"}},
		{name: "a bracket is a name, not a range", text: `{"all": {"hosts": ["n[1:2]"]}}`, want: []string{"n[1:2] @ [all*/0] "}},
		{name: "export vars", text: `{"all": {"children": ["g"], "vars": {"u": "a"}}, "g": {"hosts": ["h1"], "vars": {"u": "g"}}}`,
			want: []string{"h1 @ [all/0 g*/1] u=g"}},
		{name: "empty", text: `{}`},
		{name: "structured ansible_host", text: `{"_meta": {"hostvars": {"h1": {"ansible_host": ["a"]}}}, "all": {"hosts": ["h1"]}}`, err: "host h1: ansible_host must be a plain value"},
		{name: "hosts not a list", text: `{"all": {"hosts": {"h1": {}}}}`, err: "group all: hosts is not a list"},
		{name: "bad group name", text: `{"a b": {}}`, err: `group name "a b"`},
		{name: "not json", text: `[`, err: "ansible-inventory output"},
		{name: "not a mapping", text: `[1]`, err: "not a mapping of groups"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			inv, err := FromJSON([]byte(tc.text))
			checkHosts(t, inv, err, tc.want, tc.err)
		})
	}
}

func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, text := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		mode := os.FileMode(0o644)
		if strings.HasSuffix(name, ".sh") {
			mode = 0o755
		}
		if err := os.WriteFile(p, []byte(text), mode); err != nil {
			t.Fatal(err)
		}
	}
}

// TestReadPath: a directory's files merge (ignored names skipped, scripts
// not run), positions name the file, and group_vars/ and host_vars/ beside
// the inventory are warned about.
func TestReadPath(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"01-hosts":             "[web]\nw1\n",
		"02-more.yml":          "all:\n  children:\n    web:\n      hosts:\n        w2:\n",
		"ignored.retry":        "[nope]\nx1\n",
		"README.md":            "not an inventory\n",
		".hidden":              "[nope]\nx2\n",
		"dyn.sh":               "#!/bin/sh\necho '{}'\n",
		"group_vars/all.yml":   "ansible_user: kube\n",
		"host_vars/w1.yml":     "ansible_port: 2\n",
		"sub/ignored-too.yaml": "all:\n  hosts:\n    x3:\n",
	})
	inv, warnings, err := ReadPath(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	// The second file makes web a child of all, for w1 too.
	checkHosts(t, inv, nil, []string{"w1 @01-hosts line 2 [all/0 web*/1] ", "w2 @02-more.yml line 5 [all/0 web*/1] "}, "")
	w := strings.Join(warnings, "\n")
	for _, s := range []string{filepath.Join(dir, "group_vars") + "/ is not read", filepath.Join(dir, "host_vars") + "/ is not read", "dyn.sh is executable"} {
		if !strings.Contains(w, s) {
			t.Errorf("warnings %q lack %q", w, s)
		}
	}

	// A single file: group_vars/ beside it is warned about too, and an
	// error names its line without the file (the caller names the file).
	file := filepath.Join(dir, "01-hosts")
	if _, warnings, err = ReadPath(file, ""); err != nil || len(warnings) != 2 {
		t.Errorf("file: %v, warnings %q", err, warnings)
	}
	writeFiles(t, dir, map[string]string{"bad": "[a:hosts]\n"})
	if _, _, err := ReadPath(filepath.Join(dir, "bad"), ""); err == nil || err.Error() != `line 1: section [a:hosts]: unknown suffix "hosts" (want :vars or :children)` {
		t.Errorf("bad file: %v", err)
	}
	if _, _, err := ReadPath(dir, ""); err == nil || !strings.HasPrefix(err.Error(), "bad line 1: section [a:hosts]") {
		t.Errorf("bad file in a directory: %v", err)
	}
	if _, _, err := ReadPath(filepath.Join(dir, "missing"), ""); err == nil {
		t.Error("missing path read")
	}
}

func TestExpandRange(t *testing.T) {
	cases := []struct {
		in   string
		want string
		err  bool
	}{
		{"h", "h", false},
		{"node[01:03]", "node01 node02 node03", false},
		{"node[8:10]", "node8 node9 node10", false},
		{"node[001:002].x", "node001.x node002.x", false},
		{"r[a:c]", "ra rb rc", false},
		{"r[a:e:2]", "ra rc re", false},
		{"x]", "", true},
		{"x[1]", "", true},
		{"x[1:2:3:4]", "", true},
		{"x[-1:2]", "", true},
		{"x[A:C]", "", true},
		{"x[1:2", "", true},
	}
	for _, tc := range cases {
		got, err := expandRange(tc.in)
		if (err != nil) != tc.err || strings.Join(got, " ") != tc.want {
			t.Errorf("expandRange(%q) = %q, %v", tc.in, got, err)
		}
	}
}

// FuzzParse: any input, in either format, gives hosts or an error — never a
// panic or a hang — and what resolves is consistent: every host has a
// position, groups in precedence order, and its direct groups among them.
func FuzzParse(f *testing.F) {
	seeds, err := filepath.Glob("testdata/fuzz-seeds/*")
	if err != nil || len(seeds) == 0 {
		f.Fatalf("no seed corpus in testdata/fuzz-seeds: %v", err)
	}
	for _, p := range seeds {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		for _, format := range []string{"", "ini", "yaml"} {
			f.Add(b, format)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte, format string) {
		inv, err := Parse(data, format)
		if err != nil {
			return
		}
		hosts, err := inv.Hosts()
		if err != nil {
			return
		}
		for _, h := range hosts {
			if h.Pos.Line < 1 || len(h.Groups) == 0 {
				t.Fatalf("host %q: position %v, groups %v", h.Name, h.Pos, h.Groups)
			}
			direct := false
			for i, m := range h.Groups {
				direct = direct || m.Direct
				if i > 0 && h.Groups[i-1].Group != "all" && m.Group != "all" && h.Groups[i-1].Depth > m.Depth {
					t.Fatalf("host %q: groups out of depth order: %v", h.Name, h.Groups)
				}
			}
			if !direct {
				t.Fatalf("host %q listed by no group: %v", h.Name, h.Groups)
			}
		}
	})
}

// FuzzFromJSON: ansible-inventory output (or anything) never panics.
func FuzzFromJSON(f *testing.F) {
	f.Add([]byte(`{"_meta": {"hostvars": {"h1": {"ansible_port": 22}}}, "all": {"children": ["g"]}, "g": {"hosts": ["h1"], "children": ["all"]}}`))
	f.Add([]byte(`{"all": {"hosts": ["h1"], "vars": {"a": [1]}}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		if inv, err := FromJSON(data); err == nil {
			_, _ = inv.Hosts()
		}
	})
}
