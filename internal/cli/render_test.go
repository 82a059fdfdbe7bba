package cli

import (
	"bytes"
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/profile"
	"github.com/dklesev/kpssh/internal/providers/clusterinfo"
)

const (
	ns = "pool-ns"
	// canary is a join secret value (≥ 8 bytes: the engine's redactor would
	// also scrub it from anywhere else); shortSecret is below that length,
	// so only Render's masking keeps it out. Neither may ever be printed.
	canary      = "CANARY-join-secret-4f1d9a"
	shortSecret = "p@ss!"
	// varValue is a node class var; leave must not see it.
	varValue = "var-1.36-canary"
	endpoint = "https://api.render.test:6443"
)

func testHost(name string, mut ...func(*v1beta1.SSHHost)) *v1beta1.SSHHost {
	h := &v1beta1.SSHHost{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{v1beta1.LabelHostClass: "small"}},
		Spec: v1beta1.SSHHostSpec{
			Address: "10.0.0.5", Port: 2222, User: "kube",
			SSHKeySecretRef: v1beta1.LocalObjectReference{Name: name + "-key"},
			Capacity:        corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("8Gi")},
		},
		Status: v1beta1.SSHHostStatus{State: v1beta1.HostAvailable, ObservedArch: "amd64", HostKeyFingerprint: "SHA256:abc"},
	}
	for _, m := range mut {
		m(h)
	}
	return h
}

func testClass(name string, mut ...func(*v1beta1.SSHNodeClass)) *v1beta1.SSHNodeClass {
	nc := &v1beta1.SSHNodeClass{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1beta1.SSHNodeClassSpec{
			HostSelector:   &metav1.LabelSelector{MatchLabels: map[string]string{v1beta1.LabelHostClass: "small"}},
			JoinProfileRef: v1beta1.ObjectReference{Name: "prof"},
			Vars:           v1beta1.Vars{"k8sMinor": varValue},
			JoinSecretRef:  &v1beta1.LocalObjectReference{Name: "join"},
		},
	}
	for _, m := range mut {
		m(nc)
	}
	return nc
}

func selecting(class string) func(*v1beta1.SSHNodeClass) {
	return func(nc *v1beta1.SSHNodeClass) {
		nc.Spec.HostSelector = &metav1.LabelSelector{MatchLabels: map[string]string{v1beta1.LabelHostClass: class}}
	}
}

func scriptProfile(name, version string) *v1beta1.SSHJoinProfile {
	return &v1beta1.SSHJoinProfile{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1beta1.SSHJoinProfileSpec{Version: version, Scripts: &v1beta1.ProfileScripts{
			Install: "echo install-" + v1beta1.Script(name) + " k8s {{ .Vars.k8sMinor }}\n",
			Join:    "kubeadm join {{ .ClusterEndpoint }} --token \"$KPSSH_BOOTSTRAP_TOKEN\" --code {{ .Secrets.activation }}\n",
			Leave:   "echo leave-" + v1beta1.Script(name) + "\nsystemctl disable --now kubelet\n",
			Verify:  "test -e /dev/kvm # {{ .Vars.k8sMinor }} {{ .Secrets.activation }}\n",
		}},
	}
}

// invalidProfile has a typo in its join template (an unknown field).
func invalidProfile(name string) *v1beta1.SSHJoinProfile {
	p := scriptProfile(name, "2")
	p.Spec.Scripts.Join = "kubeadm join {{ .ClusterEndpont }}\n"
	return p
}

func tasksProfile() *v1beta1.SSHJoinProfile {
	return &v1beta1.SSHJoinProfile{
		ObjectMeta: metav1.ObjectMeta{Name: "prof"},
		Spec: v1beta1.SSHJoinProfileSpec{Version: "3", Ansible: &v1beta1.AnsibleSource{
			Vars: v1beta1.Vars{"k8sMinor": "1.30-default", "cni": "flannel"},
			Tasks: &v1beta1.ProfileTasks{
				Install: "- ansible.builtin.command: echo install\n",
				Join:    "- ansible.builtin.command: kubeadm join\n  no_log: true\n",
				Leave:   "- ansible.builtin.command: echo leave\n",
			},
		}},
	}
}

func joinSecret() *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "join", Namespace: ns},
		Data:       map[string][]byte{"activation": []byte(canary), "short": []byte(shortSecret)},
	}
}

func clusterInfo() *corev1.ConfigMap {
	kc := "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: " + endpoint + "\n    certificate-authority-data: Q0EtREFUQQ==\n"
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: clusterinfo.Name, Namespace: clusterinfo.Namespace},
		Data:       map[string]string{clusterinfo.Key: kc},
	}
}

func testClaim(name string, uid types.UID, class string) *karpv1.NodeClaim {
	return &karpv1.NodeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: uid, Labels: map[string]string{karpv1.NodePoolLabelKey: "np1"}},
		Spec: karpv1.NodeClaimSpec{
			NodeClassRef: &karpv1.NodeClassReference{Group: v1beta1.Group, Kind: "SSHNodeClass", Name: class},
			Taints:       []corev1.Taint{{Key: "dedicated", Value: "ssh", Effect: corev1.TaintEffectNoSchedule}},
		},
	}
}

func claimedBy(name string, uid types.UID) func(*v1beta1.SSHHost) {
	return func(h *v1beta1.SSHHost) {
		h.Status.State = v1beta1.HostInUse
		h.Status.ClaimRef = &v1beta1.ClaimRef{Name: name, UID: uid}
	}
}

// world is the usual pool: host h1 of class small, node class "small"
// selecting it, "big" not, the script profile, the join secret, cluster-info.
// An extra object replaces the base object of the same type and key.
func world(extra ...client.Object) []client.Object {
	base := []client.Object{
		testHost("h1"), testClass("small"), testClass("big", selecting("big")),
		scriptProfile("prof", "2"), joinSecret(), clusterInfo(),
	}
	var out []client.Object
	for _, b := range base {
		replaced := false
		for _, e := range extra {
			if reflect.TypeOf(e) == reflect.TypeOf(b) && client.ObjectKeyFromObject(e) == client.ObjectKeyFromObject(b) {
				replaced = true
			}
		}
		if !replaced {
			out = append(out, b)
		}
	}
	return append(out, extra...)
}

type result struct {
	stdout, stderr string
	code           int
	connects       int
}

// fakeDeps are the process's deps with c as the cluster (counting the
// connects) and $POOL_NAMESPACE=ns.
func fakeDeps(c client.Client, connects *int, stdout, stderr *bytes.Buffer) deps {
	d := processDeps(stdout, stderr)
	d.connect = func(*clusterFlags) (client.Client, error) { *connects++; return c, nil }
	d.getenv = func(k string) string {
		if k == "POOL_NAMESPACE" {
			return ns
		}
		return ""
	}
	return d
}

func runRender(t *testing.T, objs []client.Object, funcs *interceptor.Funcs, args ...string) result {
	t.Helper()
	b := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(objs...)
	if funcs != nil {
		b = b.WithInterceptorFuncs(*funcs)
	}
	c := b.Build()
	var res result
	var out, errb bytes.Buffer
	d := fakeDeps(c, &res.connects, &out, &errb)
	res.code = d.run(context.Background(), append([]string{"render"}, args...))
	res.stdout, res.stderr = out.String(), errb.String()
	// Never, in any case: a secret value, key material.
	for _, s := range []string{canary, shortSecret, "PRIVATE KEY", "ssh-ed25519"} {
		if strings.Contains(res.stdout, s) || strings.Contains(res.stderr, s) {
			t.Errorf("output contains %q\nstdout:\n%s\nstderr:\n%s", s, res.stdout, res.stderr)
		}
	}
	if res.code != ExitOK && res.stdout != "" {
		t.Errorf("exit %d with output on stdout:\n%s", res.code, res.stdout)
	}
	return res
}

func TestRender(t *testing.T) {
	invalid := invalidProfile("prof")
	invalidErr := profile.Validate(invalid, nil)
	if invalidErr == nil {
		t.Fatal("the invalid profile validates")
	}
	adopt := testClass("adopt", func(nc *v1beta1.SSHNodeClass) { nc.Spec.ProviderIDSource = v1beta1.ProviderIDAdopt })
	override := testClass("small", func(nc *v1beta1.SSHNodeClass) {
		nc.Spec.Cluster = &v1beta1.ClusterEndpoint{Endpoint: "https://override.test:443", CABundle: []byte("PEM")}
	})
	badKey := joinSecret()
	badKey.Data["not-an-identifier"] = []byte("x")
	apiDown := &interceptor.Funcs{Get: func(context.Context, client.WithWatch, client.ObjectKey, client.Object, ...client.GetOption) error {
		return errors.New("dial tcp 127.0.0.1:6443: connect: connection refused")
	}}
	secretForbidden := &interceptor.Funcs{Get: func(ctx context.Context, c client.WithWatch, k client.ObjectKey, o client.Object, opts ...client.GetOption) error {
		if _, ok := o.(*corev1.Secret); ok {
			return apierrors.NewForbidden(corev1.Resource("secrets"), k.Name, errors.New("RBAC"))
		}
		return c.Get(ctx, k, o, opts...)
	}}
	unsigned := scriptProfile("prof", "2") // no uninstall phase

	cases := []struct {
		name     string
		objs     []client.Object
		funcs    *interceptor.Funcs
		args     []string
		code     int
		out      []string // substrings of stdout
		notOut   []string
		stderr   []string // substrings of stderr
		noStderr bool
	}{
		{
			name: "join, unclaimed: the only selecting class, placeholder token, masked secrets",
			args: []string{"h1", "join"},
			out: []string{
				"# kpssh render h1 join\n",
				"# host:       pool-ns/h1 (address 10.0.0.5, class small, state Available)",
				"# profile:    prof@2 (joinProfileRef of SSHNodeClass small)",
				"# node class: small (the only SSHNodeClass whose hostSelector selects the host)",
				"bootstrap token: placeholder <bootstrap-token-id>.***",
				"2 secret(s) from Secret pool-ns/join: activation, short (values masked)",
				"# kpssh render: phase join for kube@10.0.0.5:2222 (secrets masked)",
				"export KPSSH_BOOTSTRAP_TOKEN='<bootstrap-token-id>.***'",
				"export KPSSH_SECRET_ACTIVATION='***'",
				"export KPSSH_SECRET_SHORT='***'",
				"--code ***",
				"export KPSSH_VAR_k8sMinor='" + varValue + "'",
				"export KPSSH_CLUSTER_ENDPOINT='" + endpoint + "'",
				"export KPSSH_CLUSTER_CA_B64='Q0EtREFUQQ=='",
				"export KPSSH_PROVIDER_ID='kpssh://pool-ns/h1'",
				"export KPSSH_NODE_NAME='h1'",
				"export KPSSH_TAINTS='karpenter.sh/unregistered:NoExecute'",
				"node.kubernetes.io/instance-type=small",
				"kubernetes.io/arch=amd64",
				"sudo -n flock -w 300 /run/kpssh-phase.lock timeout -k 5 300 bash -s", // user kube, join timeout 5m
			},
			notOut:   []string{"karpenter.sh/nodepool"},
			noStderr: true,
		},
		{
			name:     "flags after the positional arguments",
			objs:     world(adopt),
			args:     []string{"h1", "join", "--nodeclass", "adopt"},
			out:      []string{"# node class: adopt (--nodeclass)", "export KPSSH_PROVIDER_ID=''"},
			noStderr: true,
		},
		{
			name: "--nodeclass wins over several selecting classes; Adopt → no provider ID",
			objs: world(adopt, testClass("also")),
			args: []string{"--nodeclass", "adopt", "h1", "join"},
			out:  []string{"# node class: adopt (--nodeclass)", "export KPSSH_PROVIDER_ID=''"},
		},
		{
			name:   "--nodeclass that does not select the host: rendered, with a warning",
			args:   []string{"--nodeclass=big", "h1", "install"},
			out:    []string{"# node class: big (--nodeclass)"},
			stderr: []string{"warning: SSHNodeClass big does not select host h1"},
		},
		{
			name: "claimed host: the NodeClaim's class, labels and taints",
			objs: world(testClass("also"), testClass("claimed", selecting("nothing")),
				testHost("h2", claimedBy("claim-a", "uid-a")), testClaim("claim-a", "uid-a", "claimed")),
			args: []string{"h2", "join"},
			out: []string{
				"# host:       pool-ns/h2 (address 10.0.0.5, class small, state InUse)",
				"# node class: claimed (of NodeClaim claim-a)",
				"node labels and taints: NodeClaim claim-a",
				"export KPSSH_TAINTS='karpenter.sh/unregistered:NoExecute,dedicated=ssh:NoSchedule'",
				"karpenter.sh/nodepool=np1",
				"node.kubernetes.io/instance-type=small",
				"export KPSSH_PROVIDER_ID='kpssh://pool-ns/h2'",
			},
			noStderr: true,
		},
		{
			name:   "claimRef naming a deleted NodeClaim: unclaimed, by selector, warned",
			objs:   world(testHost("h2", claimedBy("gone", "uid-g"))),
			args:   []string{"h2", "join"},
			out:    []string{"# node class: small (the only SSHNodeClass", "export KPSSH_TAINTS='karpenter.sh/unregistered:NoExecute'"},
			stderr: []string{"warning: host h2 is claimed by NodeClaim gone, which does not exist"},
		},
		{
			name:   "claimRef UID mismatch: unclaimed, warned",
			objs:   world(testHost("h2", claimedBy("claim-a", "uid-old")), testClaim("claim-a", "uid-new", "big")),
			args:   []string{"h2", "join"},
			out:    []string{"# node class: small (the only SSHNodeClass", "export KPSSH_TAINTS='karpenter.sh/unregistered:NoExecute'"},
			notOut: []string{"np1"},
			stderr: []string{"but that NodeClaim has uid uid-new"},
		},
		{
			name:   "unprobed host: the instance-type label, no arch label",
			objs:   world(testHost("h2", func(h *v1beta1.SSHHost) { h.Status.ObservedArch = "" })),
			args:   []string{"h2", "join"},
			out:    []string{"export KPSSH_NODE_LABELS='karpenter.dklesev.github.io/host-class=small,karpenter.dklesev.github.io/managed=true,node.kubernetes.io/instance-type=small'"},
			notOut: []string{"kubernetes.io/arch"},
		},
		{
			// render shows what runs: a Verified host runs only signed
			// scripts, so an unsigned profile is refused as by the controller
			name: "Verified host, unsigned profile: refused like the controller refuses it",
			objs: world(testHost("h2", func(h *v1beta1.SSHHost) {
				h.Spec.ExecMode = v1beta1.ExecModeVerified
				h.Spec.TrustedSigners = []v1beta1.TrustedSigner{"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDXJ6bbHRNl6kSGYuU1aVvDSDXYqLk0rFfbvwgR3UuE8"}
			})),
			args:   []string{"h2", "join"},
			code:   ExitUsage,
			stderr: []string{"execMode Verified: ", "signatures.join"},
		},
		{
			name:   "ambiguous: two classes select the host",
			objs:   world(testClass("also")),
			args:   []string{"h1", "join"},
			code:   ExitUsage,
			stderr: []string{"host h1 is selected by 2 SSHNodeClasses (also, small); pass --nodeclass NAME"},
		},
		{
			name:   "no class selects the host",
			objs:   []client.Object{testHost("h1"), testClass("big", selecting("big")), testClass("gpu", selecting("gpu")), scriptProfile("prof", "2")},
			args:   []string{"h1", "join"},
			code:   ExitUsage,
			stderr: []string{"no SSHNodeClass selects host h1 (SSHNodeClasses: big, gpu); pass --nodeclass NAME"},
		},
		{
			name:   "no class at all",
			objs:   []client.Object{testHost("h1"), scriptProfile("prof", "2")},
			args:   []string{"h1", "install"},
			code:   ExitUsage,
			stderr: []string{"no SSHNodeClass exists"},
		},
		{
			name:   "--nodeclass unknown",
			args:   []string{"--nodeclass", "nope", "h1", "join"},
			code:   ExitUsage,
			stderr: []string{`SSHNodeClass "nope" not found`},
		},
		{
			name:   "unknown host",
			args:   []string{"nope", "join"},
			code:   ExitUsage,
			stderr: []string{"SSHHost pool-ns/nope not found"},
		},
		{
			name:   "--namespace overrides $POOL_NAMESPACE",
			args:   []string{"--namespace", "elsewhere", "h1", "join"},
			code:   ExitUsage,
			stderr: []string{"SSHHost elsewhere/h1 not found"},
		},
		{
			name:   "profile invalid: the profile.Validate error",
			objs:   []client.Object{testHost("h1"), testClass("small"), invalid, joinSecret(), clusterInfo()},
			args:   []string{"h1", "install"},
			code:   ExitUsage,
			stderr: []string{"SSHJoinProfile prof is invalid: " + invalidErr.Error()},
		},
		{
			name:   "profile not found",
			objs:   []client.Object{testHost("h1"), testClass("small"), joinSecret(), clusterInfo()},
			args:   []string{"h1", "join"},
			code:   ExitUsage,
			stderr: []string{`SSHJoinProfile "prof" (joinProfileRef of SSHNodeClass small) not found`},
		},
		{
			name:   "phase the profile lacks",
			objs:   []client.Object{testHost("h1"), testClass("small"), unsigned, joinSecret(), clusterInfo()},
			args:   []string{"h1", "uninstall"},
			code:   ExitUsage,
			stderr: []string{`join profile "prof" has no uninstall phase`},
		},
		{
			name:   "join secret missing",
			objs:   []client.Object{testHost("h1"), testClass("small"), scriptProfile("prof", "2"), clusterInfo()},
			args:   []string{"h1", "join"},
			code:   ExitUsage,
			stderr: []string{"join secret pool-ns/join of SSHNodeClass small not found"},
		},
		{
			name:   "join secret key not exportable",
			objs:   []client.Object{testHost("h1"), testClass("small"), scriptProfile("prof", "2"), badKey, clusterInfo()},
			args:   []string{"h1", "join"},
			code:   ExitUsage,
			stderr: []string{`"not-an-identifier": key is not a shell identifier`},
		},
		{
			name:   "join secret forbidden: runtime error",
			funcs:  secretForbidden,
			args:   []string{"h1", "join"},
			code:   ExitRuntime,
			stderr: []string{"forbidden"},
		},
		{
			name:   "API unreachable: runtime error",
			funcs:  apiDown,
			args:   []string{"h1", "join"},
			code:   ExitRuntime,
			stderr: []string{"read SSHHost pool-ns/h1: dial tcp"},
		},
		{
			name: "no cluster-info: placeholders and a warning",
			objs: []client.Object{testHost("h1"), testClass("small"), scriptProfile("prof", "2"), joinSecret()},
			args: []string{"h1", "join"},
			out: []string{"export KPSSH_CLUSTER_ENDPOINT='<cluster-endpoint>'", "export KPSSH_CLUSTER_CA_B64='<cluster-ca-b64>'",
				"cluster endpoint and CA: placeholders"},
			stderr: []string{"warning: cluster info: configmap kube-public/cluster-info not found"},
		},
		{
			name:     "cluster override of the node class",
			objs:     []client.Object{testHost("h1"), override, scriptProfile("prof", "2"), joinSecret()},
			args:     []string{"h1", "join"},
			out:      []string{"export KPSSH_CLUSTER_ENDPOINT='https://override.test:443'", "export KPSSH_CLUSTER_CA_B64='UEVN'", "spec.cluster of SSHNodeClass small"},
			noStderr: true,
		},
		{
			name:     "install: no token, secrets masked, install timeout",
			args:     []string{"h1", "install"},
			out:      []string{"export KPSSH_BOOTSTRAP_TOKEN=''", "export KPSSH_SECRET_ACTIVATION='***'", "echo install-prof k8s " + varValue, "timeout -k 5 600 bash -s"},
			notOut:   []string{"<bootstrap-token"},
			noStderr: true,
		},
		{
			name:   "install marker of another profile is noted",
			objs:   world(testHost("h2", func(h *v1beta1.SSHHost) { h.Status.InstalledProfile = "prof@1" })),
			args:   []string{"h2", "install"},
			out:    []string{"# input:      the host's install marker is prof@1, not prof@2"},
			notOut: []string{"<bootstrap-token"},
		},
		{
			name: "tasks profile: vars file with masked secrets and class vars over profile defaults",
			objs: []client.Object{testHost("h1"), testClass("small"), tasksProfile(), joinSecret(), clusterInfo()},
			args: []string{"h1", "join"},
			out: []string{"# profile:    prof@3", "-e @vars.yml", "kpssh_secrets: !unsafe", `activation: "***"`, `short: "***"`,
				`k8sMinor: "` + varValue + `"`, `cni: "flannel"`, `bootstrap_token: "<bootstrap-token-id>.***"`,
				"- ansible.builtin.command: kubeadm join"},
			noStderr: true,
		},
		{
			name: "leave: the install marker's profile, the empty context",
			objs: world(testHost("h2", func(h *v1beta1.SSHHost) { h.Status.InstalledProfile = "old@1" }), scriptProfile("old", "1")),
			args: []string{"h2", "leave"},
			out: []string{"# profile:    old@1 (the host's install marker)", "# node class: none (leave runs the install marker's profile",
				"echo leave-old", "export KPSSH_HOST_ADDRESS='10.0.0.5'", "export KPSSH_CLUSTER_ENDPOINT=''", "export KPSSH_BOOTSTRAP_TOKEN=''",
				"timeout -k 5 180 bash -s"},
			notOut:   []string{"KPSSH_VAR_", "KPSSH_SECRET_", varValue, endpoint, "<bootstrap-token", "leave-prof", "kpssh://"},
			noStderr: true,
		},
		{
			name:   "leave: no marker → the fallback leave; --nodeclass ignored with a warning",
			args:   []string{"h1", "leave", "--nodeclass", "small"},
			out:    []string{"# profile:    kpssh-fallback-leave@1 (the host has no install marker: the fallback leave)", "for unit in kubelet.service containerd.service"},
			notOut: []string{"KPSSH_VAR_", "KPSSH_SECRET_", varValue, endpoint},
			stderr: []string{"warning: --nodeclass small is ignored for leave"},
		},
		{
			name: "leave of a tasks profile: empty kpssh_vars and kpssh_secrets",
			objs: []client.Object{testHost("h2", func(h *v1beta1.SSHHost) { h.Status.InstalledProfile = "prof@3" }), tasksProfile(), joinSecret(), clusterInfo()},
			args: []string{"h2", "leave"},
			out:  []string{"kpssh_vars: {}", "kpssh_secrets: {}", "kpssh: !unsafe", `host_address: "10.0.0.5"`},
			// "KPSSH_" names of the play environment are the fixed ones only.
			notOut:   []string{"KPSSH_VAR_", "KPSSH_SECRET_", "flannel", varValue, endpoint},
			noStderr: true,
		},
		{
			name:   "leave of a marker profile invalid elsewhere: rendered, warned",
			objs:   world(testHost("h2", func(h *v1beta1.SSHHost) { h.Status.InstalledProfile = "prof@2" }), invalidProfile("prof")),
			args:   []string{"h2", "leave"},
			out:    []string{"echo leave-prof"},
			stderr: []string{"warning: SSHJoinProfile prof is invalid (" + invalidErr.Error() + ")"},
		},
		{
			name: "leave invalid itself: the engine's error",
			objs: world(testHost("h2", func(h *v1beta1.SSHHost) { h.Status.InstalledProfile = "prof@2" }), func() client.Object {
				p := scriptProfile("prof", "2")
				p.Spec.Scripts.Leave = "kubeadm reset --token {{ .BootstrapToken }}\n"
				return p
			}()),
			args:   []string{"h2", "leave"},
			code:   ExitUsage,
			stderr: []string{"render leave of SSHJoinProfile prof: leave"},
		},
		{
			// A Verified host's fallback leave is the one its provisioning
			// installed: the shim's op, no script, no envelope.
			name: "Verified host, no marker: the shim's fallback-leave op",
			objs: world(testHost("h2", func(h *v1beta1.SSHHost) {
				h.Spec.ExecMode, h.Spec.User = v1beta1.ExecModeVerified, "kpssh"
			})),
			args:     []string{"h2", "leave"},
			out:      []string{"the host has no install marker: the fallback leave", `"kpssh-shim fallback-leave 180"`, "no envelope"},
			notOut:   []string{"kpssh-envelope", "stdin_file", "systemctl"},
			noStderr: true,
		},
		{
			name: "Verified host, the profile's leave unsigned: refused, so the fallback",
			objs: world(testHost("h2", func(h *v1beta1.SSHHost) {
				h.Spec.ExecMode, h.Spec.User, h.Status.InstalledProfile = v1beta1.ExecModeVerified, "kpssh", "old@1"
			}), scriptProfile("old", "1")),
			args:   []string{"h2", "leave"},
			out:    []string{"# profile:    old@1", "no signatures.leave", "the controller runs the fallback leave", `"kpssh-shim fallback-leave 180"`},
			notOut: []string{"echo leave-old", "kpssh-envelope"},
		},
		{
			name:   "marker naming a deleted profile: fallback, said so",
			objs:   world(testHost("h2", func(h *v1beta1.SSHHost) { h.Status.InstalledProfile = "gone@4" })),
			args:   []string{"h2", "leave"},
			out:    []string{"install marker gone@4 names no existing profile: the fallback leave"},
			notOut: []string{"KPSSH_VAR_", "KPSSH_SECRET_"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			objs := tc.objs
			if objs == nil {
				objs = world()
			}
			r := runRender(t, objs, tc.funcs, tc.args...)
			if r.code != tc.code {
				t.Fatalf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", r.code, tc.code, r.stdout, r.stderr)
			}
			for _, s := range tc.out {
				if !strings.Contains(r.stdout, s) {
					t.Errorf("stdout lacks %q", s)
				}
			}
			for _, s := range tc.notOut {
				if strings.Contains(r.stdout, s) {
					t.Errorf("stdout contains %q", s)
				}
			}
			for _, s := range tc.stderr {
				if !strings.Contains(r.stderr, s) {
					t.Errorf("stderr lacks %q", s)
				}
			}
			if tc.noStderr && r.stderr != "" {
				t.Errorf("unexpected stderr: %s", r.stderr)
			}
			if t.Failed() {
				t.Logf("stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
			}
		})
	}
}

// Bad arguments are refused before any API server is contacted.
func TestRenderUsage(t *testing.T) {
	cases := []struct {
		name   string
		args   []string
		code   int
		stderr string
	}{
		{"bad phase", []string{"h1", "bogus"}, ExitUsage, `unknown phase "bogus"`},
		{"missing phase", []string{"h1"}, ExitUsage, "want HOST PHASE, got 1 argument(s)"},
		{"too many", []string{"h1", "join", "extra"}, ExitUsage, "want HOST PHASE, got 3 argument(s)"},
		{"unknown flag (no --show-secrets)", []string{"--show-secrets", "h1", "join"}, ExitUsage, "kpssh render: unknown flag: --show-secrets"},
		{"bad timeout", []string{"--timeout", "0s", "h1", "join"}, ExitUsage, "--timeout must be positive"},
		{"help", []string{"-h"}, ExitOK, "usage: kpssh render"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := runRender(t, world(), nil, tc.args...)
			if r.code != tc.code || !strings.Contains(r.stderr, tc.stderr) {
				t.Fatalf("exit %d (want %d), stderr:\n%s", r.code, tc.code, r.stderr)
			}
			if r.connects != 0 {
				t.Fatalf("connected to the API server %d time(s) for bad arguments", r.connects)
			}
		})
	}
}

// Flags go before, between and after the arguments; "--" ends them; Go's
// flag package spellings (-nodeclass x, -timeout=20s) still work.
func TestFlagSpellings(t *testing.T) {
	cases := []struct {
		args []string
		pos  []string
		nc   string
	}{
		{[]string{"h1", "join"}, []string{"h1", "join"}, ""},
		{[]string{"--nodeclass", "x", "h1", "join"}, []string{"h1", "join"}, "x"},
		{[]string{"h1", "--nodeclass=x", "join"}, []string{"h1", "join"}, "x"},
		{[]string{"h1", "join", "-nodeclass", "x"}, []string{"h1", "join"}, "x"},
		{[]string{"-nodeclass=x", "-timeout=20s", "h1", "join"}, []string{"h1", "join"}, "x"},
		{[]string{"--", "-h1", "join"}, []string{"-h1", "join"}, ""},
		{[]string{"h1", "--", "--nodeclass", "x"}, []string{"h1", "--nodeclass", "x"}, ""},
	}
	for _, tc := range cases {
		var pos []string
		var nc string
		var out, errb bytes.Buffer
		d := processDeps(&out, &errb)
		root := d.root()
		render, _, err := root.Find([]string{"render"})
		if err != nil {
			t.Fatal(err)
		}
		render.RunE = func(c *cobra.Command, args []string) error {
			pos, nc = args, c.Flag("nodeclass").Value.String()
			return nil
		}
		root.SetArgs(goFlagSpellings(root, append([]string{"render"}, tc.args...)))
		if err := root.Execute(); err != nil || !reflect.DeepEqual(pos, tc.pos) || nc != tc.nc {
			t.Errorf("%q: pos %q nodeclass %q err %v; want %q %q\n%s", tc.args, pos, nc, err, tc.pos, tc.nc, errb.String())
		}
	}
}

// The placeholder connection carries the host's address, port and user and
// a key made up in memory — a fresh one each time, never the host's.
func TestPlaceholderConnection(t *testing.T) {
	h := testHost("h1")
	a, err := placeholderConnection(h)
	if err != nil {
		t.Fatal(err)
	}
	b, err := placeholderConnection(h)
	if err != nil {
		t.Fatal(err)
	}
	if a.Address != "10.0.0.5" || a.Port != 2222 || a.User != "kube" {
		t.Fatalf("connection %+v", a)
	}
	if bytes.Equal(a.PrivateKey, b.PrivateKey) || a.HostKey == b.HostKey {
		t.Fatal("placeholder keys are not fresh")
	}
}
