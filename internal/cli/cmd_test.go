package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/dklesev/kpssh/apis/v1beta1"
)

// runFake runs kpssh with a fake cluster holding objs.
func runFake(t *testing.T, objs []client.Object, args ...string) (code int, stdout, stderr string, connects int) {
	t.Helper()
	c := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(objs...).Build()
	var out, errb bytes.Buffer
	d := fakeDeps(c, &connects, &out, &errb)
	code = d.run(context.Background(), args)
	return code, out.String(), errb.String(), connects
}

// The hosts printers on the fake cluster (the real apiserver's are in
// cmd/kpssh): json parses back to the hosts, an unknown -o is refused
// before connecting, an empty pool prints an empty list.
func TestHostsOutput(t *testing.T) {
	objs := []client.Object{testHost("h1"), testHost("h2", func(h *v1beta1.SSHHost) { h.Spec.ExecMode = v1beta1.ExecModeVerified })}
	code, out, stderr, _ := runFake(t, objs, "hosts", "-o", "json")
	var l v1beta1.SSHHostList
	if err := json.Unmarshal([]byte(out), &l); code != ExitOK || err != nil {
		t.Fatalf("exit %d, %v: %s%s", code, err, out, stderr)
	}
	if l.Kind != "SSHHostList" || len(l.Items) != 2 || l.Items[1].Kind != "SSHHost" || l.Items[1].APIVersion != "karpenter.dklesev.github.io/v1beta1" || l.Items[1].Spec.ExecMode != v1beta1.ExecModeVerified {
		t.Fatalf("list %+v", l)
	}
	code, out, _, _ = runFake(t, objs, "hosts", "-o", "wide")
	if first := strings.SplitN(out, "\n", 2)[0]; code != ExitOK || !strings.HasSuffix(first, "USER   NODE ADDRESS   ARCH    CPU   MEMORY   EXEC MODE   HOST KEY") || !strings.Contains(out, "Verified    SHA256:abc") {
		t.Fatalf("exit %d: %s", code, out)
	}
	code, _, stderr, connects := runFake(t, objs, "hosts", "-o", "bogus")
	if code != ExitUsage || connects != 0 || !strings.Contains(stderr, "kpssh hosts: -o bogus: want wide, json, yaml") {
		t.Fatalf("exit %d, %d connects: %s", code, connects, stderr)
	}
	code, out, stderr, _ = runFake(t, nil, "hosts", "-o", "json")
	if err := json.Unmarshal([]byte(out), &l); code != ExitOK || err != nil || len(l.Items) != 0 || stderr != "" {
		t.Fatalf("empty pool: exit %d, %v: %q %q", code, err, out, stderr)
	}
	code, out, stderr, _ = runFake(t, nil, "hosts")
	if code != ExitOK || out != "" || stderr != "kpssh hosts: no SSHHosts in namespace "+ns+"\n" {
		t.Fatalf("empty pool, table: exit %d: %q %q", code, out, stderr)
	}
}

// The completion scripts name the program and ask it (__complete); the
// dynamic completion offers the subcommands, their arguments (hosts from the
// cluster, phases) and flag values (output formats, kubeconfig contexts).
func TestCompletion(t *testing.T) {
	for _, sh := range []string{"bash", "zsh", "fish", "powershell"} {
		code, out, stderr, _ := runFake(t, nil, "completion", sh)
		if code != ExitOK || !strings.Contains(out, "kpssh") || !strings.Contains(out, "__complete") || stderr != "" {
			t.Errorf("completion %s: exit %d, %d bytes, stderr %q", sh, code, len(out), stderr)
		}
	}
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["c"] = &clientcmdapi.Cluster{Server: "https://127.0.0.1:1"}
	cfg.Contexts["prod"] = &clientcmdapi.Context{Cluster: "c"}
	cfg.Contexts["lab"] = &clientcmdapi.Context{Cluster: "c"}
	if err := clientcmd.WriteToFile(*cfg, kc); err != nil {
		t.Fatal(err)
	}
	hosts := []client.Object{testHost("h1"), testHost("h2")}
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{""}, []string{"completion", "hosts", "import-inventory", "maintenance", "new-role", "render", "sign", "validate", "version"}},
		{[]string{"maintenance", ""}, []string{"on", "off"}},
		{[]string{"maintenance", "on", ""}, []string{"h1", "h2"}},
		{[]string{"render", ""}, []string{"h1", "h2"}},
		{[]string{"render", "h1", ""}, []string{"install", "join", "leave", "uninstall", "reboot"}},
		{[]string{"hosts", "-o", ""}, []string{"wide", "json", "yaml", "name"}},
		{[]string{"hosts", "--kubeconfig", kc, "--context", ""}, []string{"lab", "prod"}},
		{[]string{"hosts", "--"}, []string{"--context", "--namespace", "--as", "--output", "--selector"}},
	} {
		code, out, stderr, _ := runFake(t, hosts, append([]string{"__complete"}, tc.args...)...)
		var got []string
		for _, l := range strings.Split(out, "\n") {
			if l != "" && !strings.HasPrefix(l, ":") {
				got = append(got, strings.SplitN(l, "\t", 2)[0])
			}
		}
		for _, w := range tc.want {
			if !slices.Contains(got, w) {
				t.Errorf("__complete %q: lacks %q: exit %d %q %s", tc.args, w, code, got, stderr)
			}
		}
	}
}

// kpssh version: text and -o json carry the Go release; a bad -o is a usage
// error. (The linked version and the Karpenter module: cmd/kpssh.)
func TestVersionCommand(t *testing.T) {
	code, out, _, _ := runFake(t, nil, "version")
	if code != ExitOK || !strings.Contains(out, "go:        "+runtime.Version()+" "+runtime.GOOS+"/"+runtime.GOARCH) || !strings.HasPrefix(out, "kpssh:     ") {
		t.Fatalf("exit %d: %s", code, out)
	}
	code, out, _, _ = runFake(t, nil, "version", "-o", "json")
	var v VersionInfo
	if err := json.Unmarshal([]byte(out), &v); code != ExitOK || err != nil || v.Go != runtime.Version() || v.Version == "" || v.Karpenter == "" {
		t.Fatalf("exit %d, %v: %s", code, err, out)
	}
	if code, _, stderr, _ := runFake(t, nil, "version", "-o", "xml"); code != ExitUsage || !strings.Contains(stderr, "want json or yaml") {
		t.Fatalf("exit %d: %s", code, stderr)
	}
}

// The root: usage on stderr with exit 2 without a command, the list on
// stdout for help; Go flag spellings reach the flags; -n overrides
// $POOL_NAMESPACE.
func TestRoot(t *testing.T) {
	for _, tc := range []struct {
		args           []string
		code           int
		stdout, stderr string
	}{
		{nil, ExitUsage, "", "usage: kpssh COMMAND"},
		{[]string{"-help"}, ExitOK, "  version           print the version", ""},
		{[]string{"help"}, ExitOK, "  completion        bash|zsh|fish|powershell", ""},
		{[]string{"hosts", "-h"}, ExitOK, "", "cluster flags (kubectl's):"},
		{[]string{"hosts", "-help"}, ExitOK, "", "-o, --output format"},
		{[]string{"hosts", "-namespace="}, ExitUsage, "", "kpssh hosts: --namespace must not be empty"},
		{[]string{"maintenance", "on"}, ExitUsage, "", "kpssh maintenance: want on|off HOST, got [\"on\"]\nusage: kpssh maintenance"},
		{[]string{"sign", "--bogus"}, ExitUsage, "", "kpssh sign: unknown flag: --bogus\nusage: kpssh sign"},
	} {
		code, out, stderr, _ := runFake(t, nil, tc.args...)
		if code != tc.code || !strings.Contains(out, tc.stdout) || !strings.Contains(stderr, tc.stderr) {
			t.Errorf("%q: exit %d (want %d)\nstdout: %s\nstderr: %s", tc.args, code, tc.code, out, stderr)
		}
	}
	other := testHost("elsewhere", func(h *v1beta1.SSHHost) { h.Namespace = "other" })
	if code, out, _, _ := runFake(t, []client.Object{testHost("h1"), other}, "hosts", "-o", "name", "-n", "other"); code != ExitOK || out != "sshhost.karpenter.dklesev.github.io/elsewhere\n" {
		t.Fatalf("-n other: exit %d: %q", code, out)
	}
	if code, out, _, _ := runFake(t, []client.Object{testHost("h1"), other}, "hosts", "-o", "name"); code != ExitOK || out != "sshhost.karpenter.dklesev.github.io/h1\n" {
		t.Fatalf("$POOL_NAMESPACE: exit %d: %q", code, out)
	}
}
