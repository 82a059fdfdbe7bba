package cli

import (
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/dklesev/kpssh/apis/v1beta1"
)

// manifest writes objects as a multi-document manifest file (as kubectl
// get -o yaml would give them, apiVersion and kind set).
func manifest(t *testing.T, dir, name string, objs ...client.Object) string {
	t.Helper()
	var docs []string
	for _, o := range objs {
		o = o.DeepCopyObject().(client.Object)
		o.SetResourceVersion("")
		gvk := v1beta1.SchemeGroupVersion.WithKind(typeName(o))
		if _, core := o.(*corev1.Secret); core {
			gvk = corev1.SchemeGroupVersion.WithKind("Secret")
		}
		o.GetObjectKind().SetGroupVersionKind(gvk)
		b, err := yaml.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, string(b))
	}
	return write(t, dir, name, strings.Join(docs, "---\n"))
}

func typeName(o runtime.Object) string {
	switch o.(type) {
	case *v1beta1.SSHHost:
		return "SSHHost"
	case *v1beta1.SSHNodeClass:
		return "SSHNodeClass"
	case *v1beta1.SSHJoinProfile:
		return "SSHJoinProfile"
	}
	return ""
}

// body is a rendering without its header (which says where things came
// from: the cluster or the files).
func body(s string) string {
	_, b, _ := strings.Cut(s, "\n\n")
	return b
}

// TestRenderOffline: `kpssh render --profile --host --class --secret PHASE`
// prints what `kpssh render HOST PHASE` prints from a cluster holding the
// same objects (the header aside), connects to nothing, masks the secrets,
// and refuses incomplete input clearly.
func TestRenderOffline(t *testing.T) {
	dir := t.TempDir()
	withCluster := func(nc *v1beta1.SSHNodeClass) {
		nc.Spec.Cluster = &v1beta1.ClusterEndpoint{Endpoint: endpoint, CABundle: []byte("CA-DATA")}
	}
	installed := func(h *v1beta1.SSHHost) { h.Status.InstalledProfile = "prof@2" }
	host := testHost("h1", installed)
	class := testClass("small", withCluster)
	prof := scriptProfile("prof", "2")
	hostF := manifest(t, dir, "host.yaml", host)
	classF := manifest(t, dir, "class.yaml", testClass("other", func(nc *v1beta1.SSHNodeClass) { nc.Spec.JoinProfileRef.Name = "elsewhere" }), class)
	profF := manifest(t, dir, "profile.yaml", prof)
	secretF := manifest(t, dir, "secret.yaml", joinSecret())
	otherSecretF := manifest(t, dir, "other-secret.yaml", func() *corev1.Secret { s := joinSecret(); s.Name = "nope"; return s }())
	noRefF := manifest(t, dir, "noref.yaml", testClass("other", func(nc *v1beta1.SSHNodeClass) { nc.Spec.JoinProfileRef.Name = "elsewhere" }))
	tasksF := manifest(t, dir, "tasks.yaml", tasksProfile())

	cluster := world(host, class)
	for _, ph := range []string{"install", "join", "leave", "verify"} {
		t.Run("same as the cluster's/"+ph, func(t *testing.T) {
			want := runRender(t, cluster, nil, "h1", ph, "--nodeclass", "small")
			if want.code != ExitOK {
				t.Fatalf("cluster render: %d %s", want.code, want.stderr)
			}
			got := runRender(t, nil, nil, "--profile", profF, "--host", hostF, "--class", classF, "--secret", secretF, ph)
			if got.code != ExitOK || got.connects != 0 {
				t.Fatalf("offline render: exit %d, %d connects: %s", got.code, got.connects, got.stderr)
			}
			if body(got.stdout) != body(want.stdout) {
				t.Fatalf("offline render differs from the cluster's:\n--- offline\n%s\n--- cluster\n%s", got.stdout, want.stdout)
			}
			if !strings.Contains(got.stdout, "# input:      offline: from files, no cluster read\n") {
				t.Fatalf("header:\n%s", got.stdout)
			}
			if ph != "leave" && !strings.Contains(got.stdout, "# node class: small (--class)\n") {
				t.Fatalf("header:\n%s", got.stdout)
			}
		})
	}
	t.Run("join shows the secret's keys, not its values", func(t *testing.T) {
		got := runRender(t, nil, nil, "--profile", profF, "--host", hostF, "--class", classF, "--secret", secretF, "join")
		if got.code != ExitOK || !strings.Contains(got.stdout, "2 secret(s) from Secret "+ns+"/join: activation, short (values masked)") {
			t.Fatalf("exit %d\n%s%s", got.code, got.stdout, got.stderr)
		}
	})
	t.Run("no class", func(t *testing.T) {
		got := runRender(t, nil, nil, "--profile", tasksF, "--host", hostF, "install")
		if got.code != ExitOK || !strings.Contains(got.stdout, "# node class: none (no --class: no vars, no secrets, cluster placeholders)") ||
			!strings.Contains(got.stderr, "rendering with placeholders") {
			t.Fatalf("exit %d\n%s%s", got.code, got.stdout, got.stderr)
		}
	})
	t.Run("leave of a host without a marker is --profile's", func(t *testing.T) {
		bare := manifest(t, dir, "bare.yaml", testHost("h1"))
		got := runRender(t, nil, nil, "--profile", profF, "--host", bare, "leave")
		if got.code != ExitOK || !strings.Contains(got.stdout, "# profile:    prof@2 (--profile; the host file has no install marker)") || !strings.Contains(got.stdout, "echo leave-prof") {
			t.Fatalf("exit %d\n%s%s", got.code, got.stdout, got.stderr)
		}
	})
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"secret missing", []string{"--profile", profF, "--host", hostF, "--class", classF, "join"}, "SSHNodeClass small has joinSecretRef join: pass its Secret with --secret SECRET.yaml"},
		{"other secret", []string{"--profile", profF, "--host", hostF, "--class", classF, "--secret", otherSecretF, "join"}, "--secret is Secret nope, but SSHNodeClass small's joinSecretRef names join"},
		{"class of another profile", []string{"--profile", profF, "--host", hostF, "--class", noRefF, "join"}, "no SSHNodeClass in --class references SSHJoinProfile prof (joinProfileRef: other → elsewhere)"},
		{"no host", []string{"--profile", profF, "join"}, "offline render needs both --profile and --host"},
		{"host and HOST", []string{"--profile", profF, "--host", hostF, "h1", "join"}, "with --profile and --host, want PHASE, got 2 argument(s)"},
		{"bad phase", []string{"--profile", profF, "--host", hostF, "bogus"}, `unknown phase "bogus"`},
		{"host file is a class", []string{"--profile", profF, "--host", classF, "join"}, "holds no SSHHost"},
		{"missing file", []string{"--profile", filepath.Join(dir, "nope.yaml"), "--host", hostF, "join"}, "no such file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := runRender(t, nil, nil, tc.args...)
			if got.code != ExitUsage || got.connects != 0 || !strings.Contains(got.stderr, tc.want) {
				t.Fatalf("exit %d, %d connects, stderr %q; want %d and %q", got.code, got.connects, got.stderr, ExitUsage, tc.want)
			}
		})
	}
}
