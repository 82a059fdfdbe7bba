//go:build e2e

package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/dklesev/kpssh/apis/v1beta1"
)

// adoptProfile is the world's script profile as a join whose kubelet
// reports its own providerID, as nodeadm's does (eks-hybrid:///…): from
// the host's machine-id, not from KPSSH_PROVIDER_ID (empty under Adopt).
const adoptProfile = "tls-bootstrap-adopt"

// adoptProviderIDScheme is the scheme of the providerID the adopt profile's
// kubelets report.
const adoptProviderIDScheme = "e2e-adopt://"

// adopt: the node class switched to providerIDSource Adopt and the adopt
// profile (no --provider-id from kpssh: the kubelet reports
// e2e-adopt://<machine-id>). Scale 1 → the controller finds the one Node
// created since the claim carrying the host label kpssh gave the join
// (karpenter.dklesev.github.io/host=<ns>.<host>) and the host's InternalIP,
// and adopts it: the NodeClaim and the host get the kubelet's providerID,
// the host InUse, the Node Ready, the pod Running on it. Then scale 0: the
// adopted node leaves like any other. The node class is restored after.
func adopt(w *world, _ *state) {
	w.apply(w.adoptProfileFile())
	patch := func(profile, source string) {
		w.mustKubectl("patch", "sshnodeclass", "pool", "--type=merge", "-p",
			`{"spec":{"joinProfileRef":{"name":"`+profile+`"},"providerIDSource":"`+source+`"}}`)
		w.classReady()
	}
	patch(adoptProfile, string(v1beta1.ProviderIDAdopt))
	w.scale(1)
	ids := map[string]string{} // host → the providerID its kubelet reports
	selfReported := func(h *v1beta1.SSHHost) string {
		if id, ok := ids[h.Name]; ok {
			return id
		}
		out, _, err := w.hosts.Run(w.hostIndex(h.Name), "cat /etc/machine-id")
		if err != nil || strings.TrimSpace(out) == "" {
			w.t.Fatalf("machine-id of %s: %q %v", h.Name, out, err)
		}
		ids[h.Name] = adoptProviderIDScheme + strings.TrimSpace(out)
		return ids[h.Name]
	}
	start := time.Now()
	host, claim := w.joinedAs("", "", selfReported)
	w.t.Logf("adopted %s as %s %v after scale 1", host.Name, claim.Status.ProviderID, time.Since(start).Round(100*time.Millisecond))
	if host.Status.InstalledProfile != adoptProfile+"@1" {
		w.t.Errorf("installedProfile %q, want %s@1", host.Status.InstalledProfile, adoptProfile)
	}
	node := &corev1.Node{}
	if err := w.kube.Get(context.Background(), client.ObjectKey{Name: host.Name}, node); err != nil {
		w.t.Fatal(err)
	}
	if got, want := node.Labels[v1beta1.LabelHost], v1beta1.HostLabelValue(poolNS, host.Name); got != want {
		w.t.Errorf("Node %s label %s=%q, want %q (the identity Adopt ties it by)", node.Name, v1beta1.LabelHost, got, want)
	}
	out, _, err := w.hosts.Run(w.hostIndex(host.Name), `tr '\0' ' ' </proc/$(pidof kubelet)/cmdline`)
	if err != nil {
		w.t.Fatal(err)
	}
	if !strings.Contains(out, "--provider-id="+adoptProviderIDScheme) || strings.Contains(out, "kpssh://") {
		w.t.Errorf("kubelet on %s: %s, want its own --provider-id=%s… and no kpssh:// one", host.Name, out, adoptProviderIDScheme)
	}
	w.scale(0)
	w.allLeft("adopt: the adopted node left; hosts Available")
	patch(w.profile, string(v1beta1.ProviderIDStatic))
}

// adoptProfileFile writes the adopt profile: the world's example script
// profile renamed, its join passing the kubelet a providerID of the host's
// own making instead of KPSSH_PROVIDER_ID.
func (w *world) adoptProfileFile() string {
	w.t.Helper()
	b, err := os.ReadFile(filepath.Join(w.repo, "examples/scripts/profile-tls-bootstrap.yaml"))
	if err != nil {
		w.t.Fatal(err)
	}
	p := &v1beta1.SSHJoinProfile{}
	if err := yaml.Unmarshal(b, p); err != nil {
		w.t.Fatal(err)
	}
	const static = `[[ -z $KPSSH_PROVIDER_ID ]] || flags+=("--provider-id=$KPSSH_PROVIDER_ID")`
	const own = `[[ -s /etc/machine-id ]] || die "no /etc/machine-id to derive the providerID from"
flags+=("--provider-id=` + adoptProviderIDScheme + `$(cat /etc/machine-id)")`
	if p.Spec.Scripts == nil || !strings.Contains(string(p.Spec.Scripts.Join), static) {
		w.t.Fatalf("examples/scripts/profile-tls-bootstrap.yaml's join has no line %s to replace", static)
	}
	p.Name, p.ResourceVersion = adoptProfile, ""
	p.Spec.Version = "1"
	p.Spec.Scripts.Join = v1beta1.Script(strings.Replace(string(p.Spec.Scripts.Join), static, own, 1))
	return w.yamlFile("adopt-profile.yaml", p)
}
