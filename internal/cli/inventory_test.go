package cli

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	sigyaml "sigs.k8s.io/yaml"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/providers/pool"
	"github.com/dklesev/kpssh/internal/sshx/sshtest"
)

// pool50 is a realistic 50-host INI inventory: a range group, a letter
// range with host vars, explicit hosts with addresses and ports, group vars,
// a parent group with vars, all:vars, comments and quoting.
func pool50INI() string {
	var b strings.Builder
	b.WriteString(`# lab pool, dc1
[all:vars]
ansible_user=kube
kpssh_capacity_pods=110

[big]
node01.dc1.example.com kpssh_node_address=10.0.1.1  # advertises its storage NIC
node[02:20].dc1.example.com

[big:vars]
kpssh_capacity_cpu=16
kpssh_capacity_memory=64Gi

[sbc]
pi-[a:j]   kpssh_capacity_cpu=4   kpssh_capacity_memory='8Gi'

[sbc:vars]
ansible_user=pi

[edge]
`)
	for i := 1; i <= 20; i++ {
		extra := ""
		if i == 7 {
			extra = ` kpssh_capacity_cpu=4 ansible_user="ops"`
		}
		fmt.Fprintf(&b, "edge%02d ansible_host=10.20.0.%d ansible_port=%d%s\n", i, i, 2200+i, extra)
	}
	b.WriteString(`
[edge:vars]
kpssh_capacity_cpu=2
kpssh_capacity_memory="4Gi"
kpssh_capacity_ephemeral_storage=20Gi

[dc1:children]
big
sbc

[dc1:vars]
ansible_port=2222
`)
	return b.String()
}

// pool50YAML is the same pool as a YAML inventory.
func pool50YAML() string {
	var b strings.Builder
	b.WriteString(`all:
  vars:
    ansible_user: kube
    kpssh_capacity_pods: 110
  children:
    dc1:
      vars:
        ansible_port: 2222
      children:
        big:
          vars: {kpssh_capacity_cpu: 16, kpssh_capacity_memory: 64Gi}
          hosts:
            node[02:20].dc1.example.com:
        sbc:
          vars:
            ansible_user: pi
          hosts:
            pi-[a:j]: {kpssh_capacity_cpu: 4, kpssh_capacity_memory: 8Gi}
    big:
      hosts:
        node01.dc1.example.com: {kpssh_node_address: 10.0.1.1}
    edge:
      vars:
        kpssh_capacity_cpu: 2
        kpssh_capacity_memory: "4Gi"
        kpssh_capacity_ephemeral_storage: 20Gi
      hosts:
`)
	for i := 1; i <= 20; i++ {
		fmt.Fprintf(&b, "        edge%02d:\n          ansible_host: 10.20.0.%d\n          ansible_port: %d\n", i, i, 2200+i)
		if i == 7 {
			b.WriteString("          kpssh_capacity_cpu: 4\n          ansible_user: ops\n")
		}
	}
	return b.String()
}

// want50 is what the pool must resolve to, built independently of the parser.
func want50() map[string]InventoryHost {
	q := resource.MustParse
	out := map[string]InventoryHost{}
	for i := 1; i <= 20; i++ {
		n := fmt.Sprintf("node%02d.dc1.example.com", i)
		h := InventoryHost{Name: n, Class: "big", Address: n, Port: 2222, User: "kube",
			Capacity: corev1.ResourceList{"cpu": q("16"), "memory": q("64Gi"), "pods": q("110")}}
		if i == 1 {
			h.NodeAddress = "10.0.1.1"
		}
		out[n] = h
	}
	for c := 'a'; c <= 'j'; c++ {
		n := "pi-" + string(c)
		out[n] = InventoryHost{Name: n, Class: "sbc", Address: n, Port: 2222, User: "pi",
			Capacity: corev1.ResourceList{"cpu": q("4"), "memory": q("8Gi"), "pods": q("110")}}
	}
	for i := 1; i <= 20; i++ {
		n := fmt.Sprintf("edge%02d", i)
		h := InventoryHost{Name: n, Class: "edge", Address: fmt.Sprintf("10.20.0.%d", i), Port: int32(2200 + i), User: "kube",
			Capacity: corev1.ResourceList{"cpu": q("2"), "memory": q("4Gi"), "pods": q("110"), "ephemeral-storage": q("20Gi")}}
		if i == 7 {
			h.Capacity["cpu"], h.User = q("4"), "ops"
		}
		out[n] = h
	}
	return out
}

func sameHost(a, b InventoryHost) bool {
	return a.Name == b.Name && a.Class == b.Class && a.Address == b.Address && a.Port == b.Port &&
		a.User == b.User && a.NodeAddress == b.NodeAddress && equality.Semantic.DeepEqual(a.Capacity, b.Capacity)
}

// TestInventoryRoundTrip50: both formats of the 50-host pool parse to the
// expected hosts, and the manifests decode back (strictly) to the same hosts.
func TestInventoryRoundTrip50(t *testing.T) {
	want := want50()
	if len(want) != 50 {
		t.Fatalf("fixture has %d hosts", len(want))
	}
	for _, tc := range []struct{ format, text string }{{"ini", pool50INI()}, {"yaml", pool50YAML()}, {"", pool50INI()}, {"", pool50YAML()}} {
		t.Run(tc.format+fmt.Sprint(len(tc.text)), func(t *testing.T) {
			hosts, err := ParseInventory([]byte(tc.text), tc.format, InventoryOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if len(hosts) != 50 {
				t.Fatalf("got %d hosts", len(hosts))
			}
			for _, h := range hosts {
				if !sameHost(h, want[h.Name]) {
					t.Errorf("host %s:\n got  %+v\n want %+v", h.Name, h, want[h.Name])
				}
			}
			var buf bytes.Buffer
			if err := writeManifests(&buf, anySlice(InventoryManifests(hosts, "pool-ns", "pool-key"))...); err != nil {
				t.Fatal(err)
			}
			docs := strings.Split(strings.TrimPrefix(buf.String(), "---\n"), "\n---\n")
			if len(docs) != 50 {
				t.Fatalf("%d documents", len(docs))
			}
			for _, d := range docs {
				var obj v1beta1.SSHHost
				if err := sigyaml.UnmarshalStrict([]byte(d), &obj); err != nil {
					t.Fatalf("decode %q: %v", d, err)
				}
				w := want[obj.Name]
				back := InventoryHost{Name: obj.Name, Class: obj.Labels[v1beta1.LabelHostClass], Address: obj.Spec.Address, Port: obj.Spec.Port,
					User: obj.Spec.User, NodeAddress: obj.Spec.NodeAddress, Capacity: obj.Spec.Capacity}
				if !sameHost(back, w) || obj.Namespace != "pool-ns" || obj.Spec.SSHKeySecretRef.Name != "pool-key" || obj.Kind != "SSHHost" || obj.APIVersion != "karpenter.dklesev.github.io/v1beta1" {
					t.Errorf("round trip of %s:\n got  %+v\n want %+v", obj.Name, obj, w)
				}
			}
		})
	}
}

func anySlice[T any](xs []T) []any {
	out := make([]any, len(xs))
	for i, x := range xs {
		out[i] = x
	}
	return out
}

// diamonds is an inventory whose group g0 has 2^n paths to the top.
func diamonds(n int) string {
	var b strings.Builder
	b.WriteString("[g0]\nh1 kpssh_capacity_cpu=1 kpssh_capacity_memory=1Gi\n")
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "[a%d:children]\ng%d\n[b%d:children]\ng%d\n[g%d:children]\na%d\nb%d\n", i, i, i, i, i+1, i, i)
	}
	return b.String()
}

func TestParseInventory(t *testing.T) {
	cases := []struct {
		name, format, text string
		opts               InventoryOptions
		want               []string // "name class address:port user" per host
		err                string
		notIn              string // must not be in the error
	}{
		{name: "ungrouped host has no class", text: "h1 kpssh_capacity_cpu=1 kpssh_capacity_memory=1Gi\n",
			want: []string{"h1  h1:22 root"}},
		{name: "step range and two ranges", text: "[g]\nn[1:5:2]-[a:b] kpssh_capacity_cpu=1 kpssh_capacity_memory=1Gi\n",
			want: []string{"n1-a g n1-a:22 root", "n1-b g n1-b:22 root", "n3-a g n3-a:22 root", "n3-b g n3-b:22 root", "n5-a g n5-a:22 root", "n5-b g n5-b:22 root"}},
		{name: "class groups chosen: other groups are plain groups", opts: InventoryOptions{ClassGroups: []string{"big"}},
			text: "[big]\nh1\n[rack1]\nh1\n[all:vars]\nkpssh_capacity_cpu=1\nkpssh_capacity_memory=1Gi\n",
			want: []string{"h1 big h1:22 root"}},
		{name: "class through children", opts: InventoryOptions{ClassGroups: []string{"big"}},
			text: "[rack1]\nh1 ansible_host=192.0.2.1\n[big:children]\nrack1\n[big:vars]\nkpssh_capacity_cpu=1\nkpssh_capacity_memory=1Gi\n",
			want: []string{"h1 big 192.0.2.1:22 root"}},
		{name: "yaml null host and group", format: "yaml",
			text: "all:\n  vars: {kpssh_capacity_cpu: '2', kpssh_capacity_memory: 2Gi}\n  children:\n    empty:\n    g:\n      hosts:\n        h1:\n        h2: {ansible_port: 2022}\n",
			want: []string{"h1 g h1:22 root", "h2 g h2:2022 root"}},
		{name: "child group vars override the parent's", text: "[parent:vars]\nansible_port=1\n[parent:children]\nchild\n[child:vars]\nansible_port=2\n[child]\nh1 kpssh_capacity_cpu=1 kpssh_capacity_memory=1Gi\n",
			want: []string{"h1 child h1:2 root"}},
		// 40 levels of diamonds: 2^40 paths, one ancestor set per group.
		{name: "diamond-shaped children", text: diamonds(40), opts: InventoryOptions{ClassGroups: []string{"g0"}},
			want: []string{"h1 g0 h1:22 root"}},
		{name: "too many hosts", text: "[a]\nn[1:9999]\n[b]\nm[1:9999]\n[c]\no[1:9999]\n[d]\np[1:9999]\n[e]\nq[1:9999]\n[f]\nr[1:9999]\n", err: "line 12: the inventory lists more than 50000 hosts"},
		{name: "host:port after a range", text: "[g]\nn[1:2]:2200 kpssh_capacity_cpu=1 kpssh_capacity_memory=1Gi\n",
			want: []string{"n1 g n1:2200 root", "n2 g n2:2200 root"}},
		{name: "host:port and ansible_port", text: "h1:22 ansible_port=23\n", err: "line 1: host h1:22: port given twice"},
		{name: "host:bad port", text: "h1:x kpssh_capacity_cpu=1 kpssh_capacity_memory=1Gi\n", err: `line 1: host h1: ansible_port "x" is not a port`},
		{name: "ipv6 address", text: "h1 ansible_host=fd00::1 kpssh_capacity_cpu=1 kpssh_capacity_memory=1Gi\n",
			want: []string{"h1  fd00::1:22 root"}},
		{name: "port forwards of one IP, each with its node address", text: "[all:vars]\nkpssh_capacity_cpu=1\nkpssh_capacity_memory=1Gi\n[a]\nh1 ansible_host=192.0.2.1 ansible_port=2201 kpssh_node_address=10.0.0.1\nh2 ansible_host=192.0.2.1 ansible_port=2202 kpssh_node_address=10.0.0.2\n",
			want: []string{"h1 a 192.0.2.1:2201 root", "h2 a 192.0.2.1:2202 root"}},

		// Refusals, each with its line.
		{name: "host in two class groups", text: "[a]\nh1\n[b]\n\nh1\n", err: "line 5: host h1 is in two class groups, a (line 2) and b (line 5)"},
		{name: "host twice in a group", text: "[a]\nh[1:3]\nh2\n", err: `line 3: host "h2" listed twice in group [a] (first on line 2)`},
		{name: "reversed range", text: "[a]\nnode[20:01]\n", err: `line 2: host "node[20:01]": range [20:01]: want numbers start ≤ end`},
		{name: "mixed range", text: "[a]\nnode[a:1]\n", err: "line 2: host \"node[a:1]\": range [a:1]: want numbers or single lowercase letters"},
		{name: "unterminated range", text: "\n[a]\nnode[01:20\n", err: "line 3: host \"node[01:20\": unterminated range"},
		{name: "huge range", text: "[a]\nn[1:99999999]\n", err: "line 2: host \"n[1:99999999]\": range [1:99999999] expands to more than 10000 hosts"},
		{name: "zero step", text: "[a]\nn[1:3:0]\n", err: "step must be a positive integer"},
		{name: "missing capacity", text: "[a]\nh1 kpssh_capacity_cpu=2\n", err: "line 2: host h1: missing capacity memory"},
		{name: "bad quantity", text: "h1 kpssh_capacity_cpu=2 kpssh_capacity_memory=lots\n", err: `line 1: host h1: kpssh_capacity_memory "lots" is not a positive quantity`},
		{name: "bad port", text: "\n\nh1 ansible_port=70000\n", err: `line 3: host h1: ansible_port "70000" is not a port`},
		{name: "bad node address", text: "h1 kpssh_node_address=nope kpssh_capacity_cpu=1 kpssh_capacity_memory=1Gi\n", err: "is not an IP"},
		{name: "two hosts one address", text: "[all:vars]\nkpssh_capacity_cpu=1\nkpssh_capacity_memory=1Gi\n[a]\nh1 ansible_host=192.0.2.1\nh2 ansible_host=192.0.2.1\n",
			err: "line 6: host h2 has the address 192.0.2.1:22 of host h1 (line 5)"},
		{name: "two spellings of one IPv6 address", text: "[all:vars]\nkpssh_capacity_cpu=1\nkpssh_capacity_memory=1Gi\n[a]\nh1 ansible_host=2001:db8::1\nh2 ansible_host=2001:DB8:0::1\n",
			err: "line 6: host h2 has the address [2001:db8::1]:22 of host h1 (line 5)"},
		{name: "a name in two cases", text: "[all:vars]\nkpssh_capacity_cpu=1\nkpssh_capacity_memory=1Gi\n[a]\nh1 ansible_host=Node1.Example.com\nh2 ansible_host=node1.example.com ansible_port=22\n",
			err: "line 6: host h2 has the address node1.example.com:22 of host h1 (line 5)"},
		{name: "two hosts one node address", text: "[all:vars]\nkpssh_capacity_cpu=1\nkpssh_capacity_memory=1Gi\n[a]\nh1 ansible_host=192.0.2.1 kpssh_node_address=10.0.0.5\nh2 ansible_host=192.0.2.2 kpssh_node_address=10.0.0.5\n",
			err: "line 6: host h2 has the node address 10.0.0.5 of host h1 (line 5)"},
		{name: "a name's node address is another host's address", text: "[all:vars]\nkpssh_capacity_cpu=1\nkpssh_capacity_memory=1Gi\n[a]\nh1 ansible_host=10.0.0.5\nh2 ansible_host=h2.example.com kpssh_node_address=::ffff:10.0.0.5\n",
			err: "line 6: host h2 has the node address 10.0.0.5 of host h1 (line 5)"},
		{name: "port forwards of one IP without node addresses", text: "[all:vars]\nkpssh_capacity_cpu=1\nkpssh_capacity_memory=1Gi\n[a]\nh1 ansible_host=192.0.2.1 ansible_port=2201\nh2 ansible_host=192.0.2.1 ansible_port=2202\n",
			err: "line 6: host h2 has the node address 192.0.2.1 of host h1 (line 5) (kpssh_node_address, else the address when it is an IP"},
		{name: "every duplicate is named", text: "[all:vars]\nkpssh_capacity_cpu=1\nkpssh_capacity_memory=1Gi\n[a]\nh1 ansible_host=192.0.2.1\nh2 ansible_host=192.0.2.1\nh3 ansible_host=192.0.2.3 kpssh_node_address=192.0.2.1\n",
			err: "2 host(s) repeat a machine listed before; one machine is one SSHHost:\nline 6: host h2 has the address 192.0.2.1:22 of host h1 (line 5)\nline 7: host h3 has the node address 192.0.2.1 of host h1 (line 5)"},
		{name: "uppercase name", text: "Node1 kpssh_capacity_cpu=1 kpssh_capacity_memory=1Gi\n", err: `line 1: host "Node1" cannot be an SSHHost name`},
		{name: "unknown section suffix", text: "[a:hosts]\n", err: `line 1: section [a:hosts]: unknown suffix "hosts"`},
		{name: "vars without =", text: "[a:vars]\nfoo\n", err: "line 2: [a:vars]: want NAME=VALUE"},
		{name: "var set twice", text: "[a:vars]\nx=1\nx=2\n", err: "line 3: [a:vars]: x set twice (first on line 2)"},
		{name: "host var without =", text: "h1 foo\n", err: `line 1: host h1: want NAME=VALUE, got "foo"`},
		{name: "unterminated quote", text: "h1 x='a b\n", err: "line 1: unterminated ' quote"},
		{name: "conflicting host vars", text: "[a]\nh1 ansible_port=1\n[b]\nh1 ansible_port=2\n", opts: InventoryOptions{ClassGroups: []string{"a"}},
			err: "line 4: host h1: ansible_port has another value here than on line 2"},
		// The values may be passwords: the refusal names the variable only.
		{name: "conflicting secret host vars", text: "[a]\nh1 ansible_password=hunter2-first\n[b]\nh1 ansible_password=hunter2-second\n", opts: InventoryOptions{ClassGroups: []string{"a"}},
			err: "line 4: host h1: ansible_password has another value here than on line 2", notIn: "hunter2"},
		{name: "conflicting secret group vars", format: "yaml", text: "all:\n  children:\n    a:\n      vars: {ansible_become_password: s3cret-one}\n    b:\n      children:\n        a:\n          vars: {ansible_become_password: s3cret-two}\n",
			err: "line 8: group a: ansible_become_password has another value here than on line 4", notIn: "s3cret"},
		{name: "host in a group and its child group takes the child's class",
			text: "[all:vars]\nkpssh_capacity_cpu=1\nkpssh_capacity_memory=1Gi\n[gpu]\nh1\nh2\n[gpu-a100]\nh1\n[gpu:children]\ngpu-a100\n",
			want: []string{"h1 gpu-a100 h1:22 root", "h2 gpu h2:22 root"}},
		{name: "grandchild class wins over the grandparent's", format: "yaml",
			text: "all:\n  vars: {kpssh_capacity_cpu: 1, kpssh_capacity_memory: 1Gi}\n  children:\n    big:\n      hosts: {h1: }\n      children:\n        mid:\n          children:\n            small:\n              hosts: {h1: }\n",
			opts: InventoryOptions{ClassGroups: []string{"big", "small"}},
			want: []string{"h1 small h1:22 root"}},
		{name: "class groups on two branches under one parent", text: "[p:children]\na\nb\n[a]\nh1\n[b]\nh1\n",
			err: "line 7: host h1 is in two class groups, a (line 5) and b (line 7), neither inside the other"},
		{name: "children cycle", text: "[a:children]\nb\n[b:children]\na\n[a]\nh1\n", err: "children cycle"},
		{name: "unknown class group", text: "h1\n", opts: InventoryOptions{ClassGroups: []string{"nope"}}, err: `no group "nope"`},
		{name: "yaml duplicate host", format: "yaml", text: "all:\n  hosts:\n    h1:\n    h1:\n", err: "line 4"},
		{name: "yaml unknown key", format: "yaml", text: "all:\n  host:\n    h1:\n", err: `line 2: group all: unknown key "host"`},
		{name: "yaml structured ansible var", format: "yaml", text: "all:\n  hosts:\n    h1:\n      ansible_host: [a, b]\n", err: "line 4: host h1: ansible_host must be a plain value"},
		{name: "yaml not a mapping", format: "yaml", text: "- a\n", err: "line 1: inventory must be a mapping"},
		{name: "yaml bad range", format: "yaml", text: "all:\n  hosts:\n    n[3:1]:\n", err: "line 3: host \"n[3:1]\""},
		{name: "unknown format", format: "toml", text: "", err: `unknown inventory format "toml"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			hosts, err := ParseInventory([]byte(tc.text), tc.format, tc.opts)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				if tc.notIn != "" && strings.Contains(err.Error(), tc.notIn) {
					t.Fatalf("error %q quotes %q", err, tc.notIn)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, h := range hosts {
				got = append(got, fmt.Sprintf("%s %s %s:%d %s", h.Name, h.Class, h.Address, h.Port, h.User))
			}
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}

// TestImportInventoryCommand runs the subcommand: the key Secret comes
// first, from a real ssh-keygen key; bad keys and files are usage errors.
func TestImportInventoryCommand(t *testing.T) {
	t.Setenv("PATH", pathWithoutAnsible(t)) // the built-in parser: errors with lines
	dir := t.TempDir()
	inv := filepath.Join(dir, "hosts.ini")
	if err := os.WriteFile(inv, []byte(pool50INI()), 0o600); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.ini")
	if err := os.WriteFile(bad, []byte("[a]\nh1\n[b]\nh1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	key := filepath.Join(dir, "id")
	if err := os.WriteFile(key, keyPEM(t), 0o600); err != nil {
		t.Fatal(err)
	}
	notKey := filepath.Join(dir, "notkey")
	if err := os.WriteFile(notKey, []byte("hello\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		args     []string
		code     int
		out, err string
	}{
		{[]string{"--key-file", key, "--namespace", "pool", inv}, ExitOK, "kind: Secret", "50 SSHHost(s) in namespace pool"},
		{[]string{inv}, ExitOK, "name: kpssh-ssh-key", "50 SSHHost(s)"},
		{[]string{bad}, ExitUsage, "", "bad.ini: line 4: host h1 is in two class groups"},
		{[]string{"--key-file", notKey, inv}, ExitUsage, "", "not an SSH private key"},
		{[]string{"--key-file", filepath.Join(dir, "missing"), inv}, ExitUsage, "", "no such file"},
		{[]string{filepath.Join(dir, "missing.ini")}, ExitUsage, "", "no such file"},
		{[]string{}, ExitUsage, "", "want INVENTORY"},
		{[]string{"--namespace", "Bad_NS", inv}, ExitUsage, "", "--namespace"},
		{[]string{"--format", "toml", inv}, ExitUsage, "", "unknown inventory format"},
	}
	for _, tc := range cases {
		var out, errb bytes.Buffer
		code := ImportInventory(t.Context(), tc.args, &out, &errb)
		if code != tc.code || !strings.Contains(out.String(), tc.out) || !strings.Contains(errb.String(), tc.err) {
			t.Errorf("%q: exit %d (want %d)\nstdout: %.300s\nstderr: %s", tc.args, code, tc.code, out.String(), errb.String())
		}
		if code == ExitOK && strings.Contains(strings.Join(tc.args, " "), key) {
			if !strings.HasPrefix(out.String(), "---\napiVersion: v1\nkind: Secret\n") || !strings.Contains(out.String(), "privateKey: |") {
				t.Errorf("Secret not first or without privateKey:\n%.400s", out.String())
			}
		}
		if strings.Contains(errb.String(), "PRIVATE KEY") {
			t.Errorf("%q: key material on stderr", tc.args)
		}
	}
}

// FuzzParseInventory: any input gives hosts or an error, never a panic or
// a hang; whatever parses renders manifests that decode strictly.
func FuzzParseInventory(f *testing.F) {
	for _, s := range []string{pool50INI(), pool50YAML(), "[a]\nh[1:3]\n", "all:\n  hosts:\n    h1:\n", "h1 x='y z'\n[a:children]\nb\n", "[a:vars]\nx=1\n",
		"[all:vars]\nkpssh_capacity_cpu=1\nkpssh_capacity_memory=1Gi\n[a]\nh1 ansible_host=2001:db8::1\nh2 ansible_host=2001:DB8:0::1 kpssh_node_address=10.0.0.1\n"} {
		f.Add(s, "")
		f.Add(s, "ini")
		f.Add(s, "yaml")
	}
	f.Fuzz(func(t *testing.T, text, format string) {
		hosts, err := ParseInventory([]byte(text), format, InventoryOptions{})
		if err != nil {
			return
		}
		// What parses is one host per machine, as the controller sees it.
		addrs, nodes := map[string]string{}, map[string]string{}
		for _, h := range hosts {
			k, n := pool.AddressIdentity(h.Address, h.Port), pool.NodeIdentity(h.NodeAddress, h.Address)
			if prev, dup := addrs[k]; dup {
				t.Fatalf("hosts %s and %s share the address %s", prev, h.Name, k)
			}
			if prev, dup := nodes[n]; dup && n != "" {
				t.Fatalf("hosts %s and %s share the node address %s", prev, h.Name, n)
			}
			addrs[k], nodes[n] = h.Name, h.Name
		}
		// Ranges up to maxRangeHosts are valid; rendering thousands of
		// manifests per input would only slow the fuzzer down.
		if len(hosts) > 64 {
			hosts = hosts[:64]
		}
		var buf bytes.Buffer
		if err := writeManifests(&buf, anySlice(InventoryManifests(hosts, "ns", "key"))...); err != nil {
			t.Fatal(err)
		}
		if len(hosts) == 0 {
			return
		}
		for _, d := range strings.Split(strings.TrimPrefix(buf.String(), "---\n"), "\n---\n") {
			var obj v1beta1.SSHHost
			if err := sigyaml.UnmarshalStrict([]byte(d), &obj); err != nil {
				t.Fatalf("manifest does not decode: %v\n%s", err, d)
			}
			if obj.Spec.Capacity.Cpu().IsZero() || obj.Spec.Capacity.Memory().IsZero() {
				t.Fatalf("host %s without cpu/memory", obj.Name)
			}
		}
	})
}

// runnerAnsibleBin is the bin dir of the runner image's ansible-inventory,
// which `make test` puts first on PATH (hack/runner-image.sh --bin); the
// machine's, or none, fails the test. The test moves to /tmp, which the
// image's sandbox sees (not every working directory).
func runnerAnsibleBin(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("ansible-inventory")
	if err != nil {
		t.Fatalf("ansible-inventory not on PATH: run the tests through make (it puts the runner image's first: hack/runner-image.sh --bin): %v", err)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(p), "sandbox")); err != nil {
		t.Fatalf("%s is not the runner image's ansible-inventory", p)
	}
	t.Chdir(t.TempDir())
	return filepath.Dir(p)
}

// pathWithoutAnsible is $PATH without the directories holding an
// ansible-inventory.
func pathWithoutAnsible(t *testing.T) string {
	t.Helper()
	var keep []string
	for _, d := range filepath.SplitList(os.Getenv("PATH")) {
		if _, err := os.Stat(filepath.Join(d, "ansible-inventory")); err != nil {
			keep = append(keep, d)
		}
	}
	return strings.Join(keep, string(os.PathListSeparator))
}

// TestImportInventoryAnsible: an inventory directory whose group_vars/all.yml
// sets ansible_user gives that user on every host through the runner
// image's ansible-inventory — host_vars/ too, and nested class groups; with a
// PATH that lacks ansible-inventory the built-in parser reads the hosts file,
// warns that it does not read group_vars/ and host_vars/, and the hosts keep
// the default user.
func TestImportInventoryAnsible(t *testing.T) {
	bin := runnerAnsibleBin(t)
	dir := t.TempDir()
	files := map[string]string{
		"hosts":                 "[gpu]\ng[1:3] kpssh_capacity_cpu=8 kpssh_capacity_memory=32Gi\n[a100]\ng1\n[gpu:children]\na100\n[web]\nw1 kpssh_capacity_cpu=2 kpssh_capacity_memory=4Gi\n",
		"group_vars/all.yml":    "ansible_user: deploy\n",
		"group_vars/a100.yml":   "kpssh_capacity_nvidia_com_gpu: 8\n",
		"host_vars/w1.yml":      "ansible_port: 2201\n",
		"group_vars/README.txt": "not read\n",
	}
	for name, text := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	base := pathWithoutAnsible(t)
	cases := []struct {
		name, path string
		args       []string
		want       []string // "name class user port gpus"
		warn       string
		noWarn     string
	}{
		{name: "ansible-inventory on PATH", path: bin + string(os.PathListSeparator) + base,
			want:   []string{"g1 a100 deploy 22 8", "g2 gpu deploy 22 0", "g3 gpu deploy 22 0", "w1 web deploy 2201 0"},
			noWarn: "warning"},
		{name: "no ansible-inventory: built-in parser", path: base,
			want: []string{"g1 a100 root 22 0", "g2 gpu root 22 0", "g3 gpu root 22 0", "w1 web root 22 0"},
			warn: filepath.Join(dir, "group_vars") + "/ is not read by the built-in parser"},
		{name: "--parser builtin with ansible-inventory on PATH", path: bin + string(os.PathListSeparator) + base, args: []string{"--parser", "builtin"},
			want: []string{"g1 a100 root 22 0", "g2 gpu root 22 0", "g3 gpu root 22 0", "w1 web root 22 0"},
			warn: filepath.Join(dir, "host_vars") + "/ is not read by the built-in parser"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("PATH", tc.path)
			var out, errb bytes.Buffer
			if code := ImportInventory(t.Context(), append(tc.args, dir), &out, &errb); code != ExitOK {
				t.Fatalf("exit %d: %s", code, errb.String())
			}
			var got []string
			for _, d := range strings.Split(strings.TrimPrefix(out.String(), "---\n"), "\n---\n") {
				var h v1beta1.SSHHost
				if err := sigyaml.UnmarshalStrict([]byte(d), &h); err != nil {
					t.Fatalf("decode %q: %v", d, err)
				}
				gpus := h.Spec.Capacity[corev1.ResourceName("nvidia-com-gpu")]
				got = append(got, fmt.Sprintf("%s %s %s %d %s", h.Name, h.Labels[v1beta1.LabelHostClass], h.Spec.User, h.Spec.Port, gpus.String()))
			}
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
			if !strings.Contains(errb.String(), tc.warn) || tc.noWarn != "" && strings.Contains(errb.String(), tc.noWarn) {
				t.Errorf("stderr %q: want %q, not %q", errb.String(), tc.warn, tc.noWarn)
			}
		})
	}
}

// TestImportInventoryParserFlag: the refusals of --parser and
// --ansible-timeout, ansible-inventory's own refusal passed on, and a hung
// one stopped at the timeout.
func TestImportInventoryParserFlag(t *testing.T) {
	bin := runnerAnsibleBin(t)
	inv := filepath.Join(t.TempDir(), "hosts.yml")
	if err := os.WriteFile(inv, []byte("all:\n  hosts: [a, list]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A hung ansible-inventory (an inventory plugin waiting on a remote API).
	hung := t.TempDir()
	if err := os.WriteFile(filepath.Join(hung, "ansible-inventory"), []byte("#!/bin/sh\necho asking the cloud >&2\nexec sleep 300\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	withAnsible, without := bin+string(os.PathListSeparator)+pathWithoutAnsible(t), pathWithoutAnsible(t)
	cases := []struct {
		path string
		args []string
		code int
		err  string
	}{
		{without, []string{"--parser", "ansible", inv}, ExitUsage, `--parser ansible: exec: "ansible-inventory": executable file not found`},
		{withAnsible, []string{"--parser", "magic", inv}, ExitUsage, `--parser "magic": want auto, ansible or builtin`},
		{withAnsible, []string{"--ansible-timeout", "0s", inv}, ExitUsage, "--ansible-timeout must be positive"},
		{withAnsible, []string{inv}, ExitUsage, "Completely failed to parse inventory source " + inv},
		{without, []string{inv}, ExitUsage, "line 2: group all: hosts must be a mapping"},
		{hung + string(os.PathListSeparator) + without, []string{"--ansible-timeout", "300ms", inv}, ExitRuntime, "--list timed out after 300ms (it said: asking the cloud)"},
	}
	for _, tc := range cases {
		t.Setenv("PATH", tc.path)
		var out, errb bytes.Buffer
		if code := ImportInventory(t.Context(), tc.args, &out, &errb); code != tc.code || !strings.Contains(errb.String(), tc.err) || out.Len() > 0 {
			t.Errorf("%q: exit %d (want %d), stderr %q, want %q", tc.args, code, tc.code, errb.String(), tc.err)
		}
	}
}

func keyPEM(t *testing.T) []byte {
	_, pemBytes := sshtest.NewKey(t)
	return pemBytes
}

// BenchmarkParseInventory5000 parses a 5,000-host INI inventory (ranges,
// group vars, children) and renders the manifests; the same-run baseline
// is decoding an equivalent plain YAML document (what any YAML inventory
// costs before a single host is resolved).
func BenchmarkParseInventory5000(b *testing.B) {
	var ini strings.Builder
	ini.WriteString("[all:vars]\nkpssh_capacity_memory=8Gi\n")
	var plain strings.Builder
	plain.WriteString("all:\n  hosts:\n")
	for g := 0; g < 50; g++ {
		fmt.Fprintf(&ini, "[g%02d]\nnode%02d-[001:100] kpssh_capacity_cpu=4\n[g%02d:vars]\nansible_user=kube\n", g, g, g)
		for i := 1; i <= 100; i++ {
			fmt.Fprintf(&plain, "    node%02d-%03d: {kpssh_capacity_cpu: 4, kpssh_capacity_memory: 8Gi, ansible_user: kube}\n", g, i)
		}
	}
	ini.WriteString("[pool:children]\n")
	for g := 0; g < 50; g++ {
		fmt.Fprintf(&ini, "g%02d\n", g)
	}
	data, yamlData := []byte(ini.String()), []byte(plain.String())
	var parse, decode time.Duration
	for b.Loop() {
		t0 := time.Now()
		hosts, err := ParseInventory(data, "ini", InventoryOptions{})
		if err != nil || len(hosts) != 5000 {
			b.Fatalf("%d hosts, %v", len(hosts), err)
		}
		if err := writeManifests(io.Discard, anySlice(InventoryManifests(hosts, "ns", "key"))...); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		var doc map[string]any
		if err := yaml.Unmarshal(yamlData, &doc); err != nil {
			b.Fatal(err)
		}
		parse, decode = parse+t1.Sub(t0), decode+time.Since(t1)
	}
	n := float64(b.N)
	b.ReportMetric(parse.Seconds()*1000/n, "ms-import")
	b.ReportMetric(decode.Seconds()*1000/n, "ms-yaml-baseline")
	b.Logf("5000 hosts: import (parse + resolve + manifests) %.1f ms, plain YAML decode of the same hosts %.1f ms (same run)", parse.Seconds()*1000/n, decode.Seconds()*1000/n)
}
