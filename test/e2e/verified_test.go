//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/yaml"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/engine"
	"github.com/dklesev/kpssh/internal/envelope"
	"github.com/dklesev/kpssh/internal/sshsig"
	"github.com/dklesev/kpssh/test/testexec"
)

const (
	verifiedProfile = "tls-bootstrap-verified"
	verifiedLabel   = "pause-verified" // the workload's app label
	// The shim writes <dir>/<profile>.<phase> (the issued-at of the manifest
	// it accepted) only after ssh-keygen -Y verify and the manifest checks
	// passed, right before it runs the script: proof that a phase went
	// through the shim, and that a refused one did not get that far.
	shimStateDir = "/var/lib/kpssh-shim/"
	// sudo logs every command it runs; on a Verified host the only one the
	// kpssh login may run is the shim.
	shimSudoLine = "COMMAND=/usr/local/bin/kpssh-shim run"
	// the host's provisioned fallback leave, through the shim's op
	shimFallbackLine = "COMMAND=/usr/local/bin/kpssh-shim fallback-leave"
)

// sigKey is an ed25519 key made by the real ssh-keygen.
type sigKey struct {
	path, pub string
	priv      []byte
}

// verifiedRun is the state of the Verified scenario.
type verifiedRun struct {
	w                    *world
	i                    int    // hostenv index of the verified host
	name                 string // its SSHHost name
	class                string // its host class before it became class verified
	dir                  string
	kpssh                string // the kpssh CLI built from this checkout
	login, signer, rogue sigKey
	goodProfile          string            // file: the profile signed by signer
	rogueProfile         string            // file: the same profile signed by rogue
	issued               map[string]string // phase → issued-at of signer's manifests

	login0 v1beta1.SSHHostSpec // the host's spec before: restore puts its login back
}

// verified: one pool host is provisioned as a Verified host the shipped way
// (playbooks/provision-verified.yml: shim, allowed_signers = the signer,
// kpssh login forced to the shim), its SSHHost switched to execMode
// Verified, and a copy of the pool's tls-bootstrap script profile signed
// with `kpssh sign -manifest`. A separate node class (hostSelector
// host-class=verified) and NodePool (label kpssh.test/pool=verified, which
// only the pause-verified Deployment selects) keep the main pool's NodePool
// and node class untouched, so nothing has to be restored there. Then:
//   - scale 1 → install and join run through the shim, the real kubelet
//     registers, the pod runs; scale 0 → leave through the shim;
//   - the API is made to trust a rogue key (trustedSigners) and the profile
//     re-signed with it: the controller's Go check passes, the host's shim
//     refuses (Rejected, rc 2), nothing of join ran, no token is left, the
//     host never goes InUse; the signer's signatures restored → the retried
//     launch joins;
//   - the profile's leave manifest expires under the running node: the
//     node class says so (SignaturesExpiring), and scale 0 leaves through
//     the host's provisioned fallback leave (LeaveFallback), Available;
//   - the host goes back to Raw (its own login again) and is de-provisioned,
//     so later scenarios see the world's three hosts as they were.
func verified(w *world, _ *state) {
	v := &verifiedRun{w: w, dir: w.t.TempDir()}
	v.i = len(w.hosts.Hosts()) - 1
	v.name = w.hosts.Hosts()[v.i].Name
	v.login = sshKeygen(w, v.dir, "kpssh-login")
	v.signer = sshKeygen(w, v.dir, "ops-signer")
	v.rogue = sshKeygen(w, v.dir, "rogue-signer")
	v.build()
	v.provision()
	v.profiles()
	v.switchHost()
	v.joinAndLeave()
	v.rogueRefused()
	v.restore()
}

func sshKeygen(w *world, dir, name string) sigKey {
	w.t.Helper()
	p := filepath.Join(dir, name)
	if _, stderr, err := testexec.Run(time.Minute, nil, "ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", p); err != nil {
		w.t.Fatalf("ssh-keygen: %v: %s", err, stderr)
	}
	priv, err := os.ReadFile(p)
	if err != nil {
		w.t.Fatal(err)
	}
	pub, err := os.ReadFile(p + ".pub")
	if err != nil {
		w.t.Fatal(err)
	}
	return sigKey{path: p, pub: strings.TrimSpace(string(pub)), priv: priv}
}

func (v *verifiedRun) build() {
	v.w.t.Helper()
	v.kpssh = filepath.Join(v.dir, "kpssh")
	start := time.Now()
	_, stderr, err := testexec.Run(20*time.Minute, append(os.Environ(), "GOTOOLCHAIN=go1.27.3"), "go", "build", "-C", v.w.repo, "-o", v.kpssh, "./cmd/kpssh")
	if err != nil {
		v.w.t.Fatalf("go build ./cmd/kpssh: %v\n%s", err, stderr)
	}
	v.w.t.Logf("built kpssh in %v", time.Since(start).Round(time.Millisecond))
}

// provision runs the shipped playbook against the host as root (the world's
// login), trusting only signer on the host.
func (v *verifiedRun) provision() {
	w := v.w
	w.t.Helper()
	invFile := filepath.Join(v.dir, "inventory.yml")
	writeFile(w, invFile, w.hosts.AnsibleInventory(v.i))
	vars := filepath.Join(v.dir, "verified-vars.yml")
	writeFile(w, vars, fmt.Sprintf("verified_host_allowed_signers:\n  - key: %q\nverified_host_authorized_keys:\n  - %q\n", v.signer.pub, v.login.pub))
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + v.dir, "LANG=C.UTF-8",
		"ANSIBLE_ROLES_PATH=" + filepath.Join(w.repo, "roles"), "ANSIBLE_HOST_KEY_CHECKING=True", "ANSIBLE_NOCOLOR=1",
		"ANSIBLE_LOCAL_TEMP=" + filepath.Join(v.dir, "ansible-tmp"), "ANSIBLE_RETRY_FILES_ENABLED=False"}
	start := time.Now()
	out, stderr, err := testexec.Run(10*time.Minute, env, "ansible-playbook", "-i", invFile, "-e", "@"+vars, filepath.Join(w.repo, "playbooks/provision-verified.yml"))
	if err != nil {
		w.t.Fatalf("provision-verified.yml on %s: %v\n%s\n%s", v.name, err, tail(out, 6000), tail(stderr, 2000))
	}
	w.t.Logf("provisioned %s as a Verified host in %v", v.name, time.Since(start).Round(time.Millisecond))
	if got := w.hosts.MustRun(v.i, "cat /etc/kpssh/allowed_signers"); !strings.Contains(got, strings.Fields(v.signer.pub)[1]) || strings.Contains(got, strings.Fields(v.rogue.pub)[1]) {
		w.t.Fatalf("allowed_signers on %s: %q, want the signer only", v.name, got)
	}
}

func writeFile(w *world, path, content string) {
	w.t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		w.t.Fatal(err)
	}
}

var issuedAtRE = regexp.MustCompile(`(?m)^issued-at: (\S+)$`)

// profiles writes two signed copies of the pool's script profile
// (examples/scripts/profile-tls-bootstrap.yaml): signed by signer and by
// rogue, both with kpssh sign -manifest. Every script gets the strict line
// raw mode prepends (a Verified host runs the signed bytes as they are).
func (v *verifiedRun) profiles() {
	w := v.w
	w.t.Helper()
	raw, err := os.ReadFile(filepath.Join(w.repo, "examples/scripts/profile-tls-bootstrap.yaml"))
	if err != nil {
		w.t.Fatal(err)
	}
	p := &v1beta1.SSHJoinProfile{}
	if err := yaml.UnmarshalStrict(raw, p); err != nil {
		w.t.Fatal(err)
	}
	p.Name = verifiedProfile
	s := p.Spec.Scripts
	for _, sc := range []*v1beta1.Script{&s.Install, &s.Join, &s.Leave, &s.Uninstall} {
		if *sc != "" {
			*sc = "set -euo pipefail\n" + *sc
		}
	}
	unsigned, err := yaml.Marshal(p)
	if err != nil {
		w.t.Fatal(err)
	}
	in := filepath.Join(v.dir, "profile-unsigned.yaml")
	writeFile(w, in, string(unsigned))
	sign := func(k sigKey, file string) map[string]string {
		out, stderr, err := testexec.Run(2*time.Minute, nil, v.kpssh, "sign", "-key", k.path, "-manifest", "-not-after", "24h", in)
		// this scenario signs without a param policy (docs/verified.md):
		// that warning per phase is expected, any other is not
		if err != nil || strings.TrimSpace(withoutPolicyWarnings(stderr)) != "" {
			w.t.Fatalf("kpssh sign -key %s: %v: %s", filepath.Base(k.path), err, stderr)
		}
		var block struct {
			Signatures v1beta1.ProfileSignatures `json:"signatures"`
		}
		if err := yaml.UnmarshalStrict([]byte(out), &block); err != nil {
			w.t.Fatalf("kpssh sign output: %v\n%s", err, out)
		}
		signed := p.DeepCopy()
		signed.Spec.Signatures = &block.Signatures
		b, err := yaml.Marshal(signed)
		if err != nil {
			w.t.Fatal(err)
		}
		writeFile(w, file, string(b))
		issued := map[string]string{}
		for ph, sig := range map[string]v1beta1.Signature{"install": block.Signatures.Install, "join": block.Signatures.Join, "leave": block.Signatures.Leave} {
			sf, err := envelope.ParseSignedField(string(sig))
			if err != nil {
				w.t.Fatalf("signatures.%s: %v", ph, err)
			}
			m := issuedAtRE.FindSubmatch(sf.Manifest)
			if m == nil {
				w.t.Fatalf("signatures.%s is not a v2 manifest: %q", ph, sf.Manifest)
			}
			issued[ph] = string(m[1])
		}
		return issued
	}
	v.goodProfile = filepath.Join(v.dir, "profile-signed.yaml")
	v.issued = sign(v.signer, v.goodProfile)
	v.rogueProfile = filepath.Join(v.dir, "profile-rogue.yaml")
	sign(v.rogue, v.rogueProfile)
	w.apply(v.goodProfile)
}

// patchHost merge-patches the verified host's SSHHost.
func (v *verifiedRun) patchHost(patch map[string]any) {
	v.w.t.Helper()
	b, err := json.Marshal(patch)
	if err != nil {
		v.w.t.Fatal(err)
	}
	h := &v1beta1.SSHHost{ObjectMeta: metav1.ObjectMeta{Namespace: poolNS, Name: v.name}}
	if err := v.w.kube.Patch(context.Background(), h, client.RawPatch(types.MergePatchType, b)); err != nil {
		v.w.t.Fatalf("patch SSHHost %s: %v", v.name, err)
	}
}

func (v *verifiedRun) trust(keys ...sigKey) {
	var pubs []string
	for _, k := range keys {
		pubs = append(pubs, k.pub)
	}
	v.patchHost(map[string]any{"spec": map[string]any{"trustedSigners": pubs}})
}

// probedAvailable waits until the host is Available as probed at its
// current spec generation.
func (v *verifiedRun) probedAvailable(what string) {
	v.w.eventually(what, 3*time.Minute, func() (bool, string) {
		h := v.w.sshHost(v.name)
		return h.Status.ObservedGeneration == h.Generation && h.Status.State == v1beta1.HostAvailable,
			fmt.Sprintf("%s gen %d observed %d%s", h.Status.State, h.Generation, h.Status.ObservedGeneration, errSuffix(h.Status.LastProbeError))
	})
}

// switchHost makes the SSHHost Verified: the kpssh login (its key in its
// own Secret), trustedSigners = signer, host class verified. The probe then
// runs the shim's unsigned probe op as kpssh.
func (v *verifiedRun) switchHost() {
	w := v.w
	w.t.Helper()
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: poolNS, Name: "verified-login"}, Data: map[string][]byte{"privateKey": v.login.priv}}
	if err := w.kube.Create(context.Background(), sec); err != nil {
		w.t.Fatal(err)
	}
	before := v.kpsshLogins()
	v.login0 = w.sshHost(v.name).Spec
	v.class = w.sshHost(v.name).Labels[v1beta1.LabelHostClass]
	v.patchHost(map[string]any{
		"metadata": map[string]any{"labels": map[string]string{"karpenter.dklesev.github.io/host-class": "verified"}},
		"spec": map[string]any{"user": "kpssh", "sshKeySecretRef": map[string]string{"name": "verified-login"},
			"execMode": "Verified", "trustedSigners": []string{v.signer.pub}},
	})
	v.probedAvailable(v.name + " probed Available as a Verified host")
	w.eventually("the probe logged in as kpssh (the shim's probe op)", time.Minute, func() (bool, string) {
		n := v.kpsshLogins()
		return n > before, fmt.Sprintf("%d kpssh logins in sshd's journal", n)
	})
	for _, f := range []string{"nodeclass.yaml", "nodepool.yaml", "workload.yaml"} {
		w.apply(filepath.Join(w.repo, "test/e2e/testdata/verified", f))
	}
	w.eventually("node class verified Ready", 2*time.Minute, func() (bool, string) {
		nc := &v1beta1.SSHNodeClass{}
		if err := w.kube.Get(context.Background(), client.ObjectKey{Name: "verified"}, nc); err != nil {
			return false, err.Error()
		}
		c := nc.StatusConditions().Get(v1beta1.ConditionReady)
		return c != nil && c.IsTrue(), fmt.Sprintf("%+v", c)
	})
}

// journalCount counts journal lines of comm on the host containing s.
func (v *verifiedRun) journalCount(comm, s string) int {
	v.w.t.Helper()
	out := v.w.hosts.MustRun(v.i, fmt.Sprintf("journalctl --no-pager -o cat _COMM=%s | grep -cF %s || true", comm, engine.ShellQuote(s)))
	n, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		v.w.t.Fatalf("journal count %q: %v", out, err)
	}
	return n
}

func (v *verifiedRun) kpsshLogins() int {
	return v.journalCount("sshd", "Accepted publickey for kpssh ")
}
func (v *verifiedRun) shimRuns() int { return v.journalCount("sudo", shimSudoLine) }

// shimState is the issued-at the shim recorded for a phase of the verified
// profile ("" when no script of it succeeded yet); the record's second
// field, <name>@<version>, is left out.
func (v *verifiedRun) shimState(phase string) string {
	v.w.t.Helper()
	rec := strings.Fields(v.w.hosts.MustRun(v.i, "cat "+shimStateDir+verifiedProfile+"."+phase+" 2>/dev/null || true"))
	if len(rec) == 0 {
		return ""
	}
	return rec[0]
}

func (v *verifiedRun) scale(n int) {
	v.w.t.Helper()
	v.w.mustKubectl("-n", "default", "scale", "deployment/"+verifiedLabel, fmt.Sprintf("--replicas=%d", n))
}

// joined waits until the verified host is InUse for the verified pool's one
// live NodeClaim, its Node registered with the host's providerID and Ready,
// the pod Running on it, and the main pool's hosts untouched.
func (v *verifiedRun) joined(what string) (*v1beta1.SSHHost, *karpv1.NodeClaim) {
	w := v.w
	w.t.Helper()
	ctx := context.Background()
	var host *v1beta1.SSHHost
	var claim *karpv1.NodeClaim
	want := "kpssh://" + poolNS + "/" + v.name
	w.eventually(what, 8*time.Minute, func() (bool, string) {
		var live []karpv1.NodeClaim
		for _, c := range w.nodeClaims() {
			if c.Labels[karpv1.NodePoolLabelKey] != "verified" {
				return false, "a NodeClaim of NodePool " + c.Labels[karpv1.NodePoolLabelKey]
			}
			if c.DeletionTimestamp == nil {
				live = append(live, c)
			}
		}
		if len(live) != 1 {
			return false, fmt.Sprintf("%d live NodeClaims", len(live))
		}
		claim = &live[0]
		for _, h := range w.sshHosts() {
			if h.Name != v.name && h.Status.ClaimRef != nil {
				return false, fmt.Sprintf("main-pool host %s claimed by %s", h.Name, h.Status.ClaimRef.Name)
			}
		}
		host = w.sshHost(v.name)
		if host.Status.ClaimRef == nil || host.Status.ClaimRef.Name != claim.Name || host.Status.State != v1beta1.HostInUse {
			return false, fmt.Sprintf("%s %s claim %+v (last phase %+v)", v.name, host.Status.State, host.Status.ClaimRef, host.Status.LastPhase)
		}
		if claim.Status.ProviderID != want || host.Status.ProviderID != want {
			return false, fmt.Sprintf("providerID claim=%q host=%q, want %q", claim.Status.ProviderID, host.Status.ProviderID, want)
		}
		node := &corev1.Node{}
		if err := w.kube.Get(ctx, client.ObjectKey{Name: v.name}, node); err != nil {
			return false, "node: " + err.Error()
		}
		if node.Spec.ProviderID != want || !nodeReady(node) {
			return false, fmt.Sprintf("node providerID=%q ready=%v", node.Spec.ProviderID, nodeReady(node))
		}
		pods := &corev1.PodList{}
		if err := w.kube.List(ctx, pods, client.InNamespace("default"), client.MatchingLabels{"app": verifiedLabel}); err != nil {
			return false, err.Error()
		}
		for _, p := range pods.Items {
			if p.Spec.NodeName == v.name && p.Status.Phase == corev1.PodRunning {
				return true, ""
			}
		}
		return false, "no Running " + verifiedLabel + " pod yet"
	})
	w.t.Logf("joined %s through the shim: %s", v.name, timeline(claim))
	return host, claim
}

func (v *verifiedRun) joinAndLeave() {
	w := v.w
	w.t.Helper()
	runs, logins := v.shimRuns(), v.kpsshLogins()
	v.scale(1)
	host, _ := v.joined("the verified host joined as a Ready node running the pod")
	if host.Status.InstalledProfile != verifiedProfile+"@1" {
		w.t.Errorf("installedProfile %q, want %s@1 (install through the shim)", host.Status.InstalledProfile, verifiedProfile)
	}
	if lp := host.Status.LastPhase; lp == nil || lp.Phase != v1beta1.PhaseJoin || lp.Result != v1beta1.PhaseSucceeded {
		w.t.Errorf("last phase %+v, want a succeeded join", lp)
	}
	if u := w.units(v.i); u != unitsJoined {
		w.t.Errorf("units on %s: %q, want %q", v.name, u, unitsJoined)
	}
	// Both phases passed the shim's signature and manifest checks: it
	// recorded the signer's manifests.
	for _, ph := range []string{"install", "join"} {
		if got := v.shimState(ph); got != v.issued[ph] {
			w.t.Errorf("shim state of %s: %q, want the signed manifest's issued-at %q", ph, got, v.issued[ph])
		}
	}
	// Through the kpssh login, sudo → the shim (install + join at least).
	w.eventually("sudo logged the shim's runs", time.Minute, func() (bool, string) {
		n := v.shimRuns()
		return n >= runs+2, fmt.Sprintf("%d shim runs in the journal (%d before)", n, runs)
	})
	if n := v.kpsshLogins(); n <= logins {
		w.t.Errorf("no kpssh login in sshd's journal during the join (%d → %d)", logins, n)
	}
	out, _, err := w.hosts.Run(v.i, `tr '\0' ' ' </proc/$(pidof kubelet)/cmdline`)
	if err != nil || !strings.Contains(out, "--provider-id=kpssh://"+poolNS+"/"+v.name) {
		w.t.Errorf("kubelet command line on %s: %v %s", v.name, err, out)
	}
	w.eventually("the join's bootstrap token deleted", time.Minute, func() (bool, string) {
		tk := w.tokens()
		return len(tk) == 0, strings.Join(tk, " ")
	})

	v.scale(0)
	w.allLeft("verified leave: claim, node gone; hosts Available")
	h := w.sshHost(v.name)
	if lp := h.Status.LastPhase; lp == nil || lp.Phase != v1beta1.PhaseLeave || lp.Result != v1beta1.PhaseSucceeded {
		w.t.Errorf("last phase %+v, want a succeeded leave", lp)
	} else {
		w.t.Logf("leave through the shim: %v", lp.Duration.Duration)
	}
	if got := v.shimState("leave"); got != v.issued["leave"] {
		w.t.Errorf("shim state of leave: %q, want %q", got, v.issued["leave"])
	}
	if out := w.hosts.MustRun(v.i, "ls -d /run/kpssh-shim.* /tmp/kpssh-shim.* 2>/dev/null | wc -l"); out != "0" {
		w.t.Errorf("shim temp dirs left on %s: %s", v.name, out)
	}
}

// rogueRefused: the API trusts a rogue key and the profile carries its
// signatures (a compromised control plane): the controller's own check
// passes, the host's allowed_signers does not have the key, so the shim
// refuses.
func (v *verifiedRun) rogueRefused() {
	w := v.w
	w.t.Helper()
	joinState := v.shimState("join")
	runs := v.shimRuns()
	v.trust(v.signer, v.rogue)
	w.apply(v.rogueProfile)
	v.probedAvailable(v.name + " Available with the rogue key trusted by the API")
	start := time.Now()
	v.scale(1)

	seen := map[v1beta1.HostState]int{}
	tokens := map[string]bool{} // bootstrap-token ids the launches minted
	var rejected *v1beta1.SSHHost
	deadline := time.Now().Add(5 * time.Minute)
	for rejected == nil {
		if time.Now().After(deadline) {
			w.t.Fatalf("no rejected join on %s within 5 min (states seen %v; controller log %s)", v.name, seen, w.ctrl.logPath())
		}
		h := w.sshHost(v.name)
		seen[h.Status.State]++
		if id := h.Status.BootstrapTokenID; id != "" {
			tokens[id] = true
		}
		if h.Status.State == v1beta1.HostInUse {
			w.t.Fatalf("%s went InUse with a rogue-signed profile (last phase %+v)", v.name, h.Status.LastPhase)
		}
		if n := w.nodes(); len(n) > 0 {
			w.t.Fatalf("a Node registered with a rogue-signed profile: %s", n[0].Name)
		}
		if lp := h.Status.LastPhase; lp != nil && lp.Phase == v1beta1.PhaseJoin && lp.Result == v1beta1.PhaseRejected && !lp.StartedAt.Time.Before(start.Truncate(time.Second)) {
			rejected = h
		}
		time.Sleep(200 * time.Millisecond)
	}
	lp := rejected.Status.LastPhase
	w.t.Logf("rogue join refused %v after scale 1 (states seen %v): %s", time.Since(start).Round(100*time.Millisecond), seen, lp.Message)
	if !strings.Contains(lp.Message, "signature rejected") {
		w.t.Errorf("last phase message %q, want the shim's signature rejected", lp.Message)
	}
	// PhaseFailed on the host says Rejected with the shim's rc 2 (a
	// ConfigError, the controller's own refusal, would say ConfigError).
	w.eventually("PhaseFailed event: join Rejected (rc 2)", time.Minute, func() (bool, string) {
		evs := v.events(poolNS, v.name, "PhaseFailed")
		return strings.Contains(evs, "join Rejected") && strings.Contains(evs, "(rc 2)"), evs
	})
	w.eventually("NodeClaim JoinFailed event naming the rejection", time.Minute, func() (bool, string) {
		evs := v.events("", "", "JoinFailed")
		return strings.Contains(evs, "host "+v.name+": join Rejected"), evs
	})
	// Nothing of join ran: the shim never accepted the manifest, the kubelet
	// was never enabled.
	if got := v.shimState("join"); got != joinState {
		w.t.Errorf("shim state of join changed %q → %q: it accepted a rogue manifest", joinState, got)
	}
	if u := w.units(v.i); u != unitsLeft {
		w.t.Errorf("units on %s after the rejected join: %q, want %q", v.name, u, unitsLeft)
	}
	// The shim was reached: the refusal is the host's, not the controller's.
	w.eventually("sudo logged the refused shim run", time.Minute, func() (bool, string) {
		n := v.shimRuns()
		return n > runs, fmt.Sprintf("%d shim runs in the journal (%d before the rogue profile)", n, runs)
	})
	// Each rejected launch deleted its token (the one of a launch running
	// right now may still exist).
	w.eventually("the rejected joins' bootstrap tokens deleted", time.Minute, func() (bool, string) {
		cur := w.sshHost(v.name).Status.BootstrapTokenID
		var left []string
		for _, s := range w.tokens() {
			id := strings.TrimPrefix(s, "bootstrap-token-")
			if tokens[id] && id != cur {
				left = append(left, s)
			}
		}
		return len(left) == 0, strings.Join(left, " ")
	})
	if len(tokens) == 0 {
		w.t.Logf("note: no bootstrap-token id seen on the host while polling (the mint → rejection window is short)")
	}

	// The refusal is sticky: the host stays out of this node class's pool
	// — no claim, no shim run, no token — while the node class, its
	// profile and the host's spec are unchanged, though Karpenter keeps
	// retrying the launch; condition ShimRejected says why. (Before, each
	// retry claimed the host again and shipped a fresh token to be refused.)
	w.eventually("ShimRejected condition on "+v.name, time.Minute, func() (bool, string) {
		h := w.sshHost(v.name)
		c := h.StatusConditions().Get(v1beta1.ConditionShimRejected)
		return c != nil && c.IsTrue() && c.Reason == "SignatureRejected" && h.Status.ShimRejection != nil &&
			h.Status.ShimRejection.Phase == v1beta1.PhaseJoin, fmt.Sprintf("%+v %+v", c, h.Status.ShimRejection)
	})
	refusedRuns := v.shimRuns()
	for end := time.Now().Add(40 * time.Second); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
		h := w.sshHost(v.name)
		if h.Status.ClaimRef != nil || h.Status.BootstrapTokenID != "" {
			w.t.Fatalf("%s claimed again (claim %+v, token %q) with its refusal unchanged", v.name, h.Status.ClaimRef, h.Status.BootstrapTokenID)
		}
	}
	if n := v.shimRuns(); n != refusedRuns {
		w.t.Errorf("%d more shim runs on %s within 40 s of a sticky refusal", n-refusedRuns, v.name)
	}

	// The signer's signatures back, the rogue key out of the API: the
	// launch that Karpenter retries joins.
	w.apply(v.goodProfile)
	v.trust(v.signer)
	v.joined("after restoring the signer's profile, the retried launch joined")
	v.expiredLeave()
}

// expiredLeave: the profile's leave manifest has expired while the node
// ran (signed for 30 days, the node older). Before, Delete's leave was
// refused forever (the controller's check: expired) and the host was
// released with its kubelet running. Now the node class says so first
// (SignaturesExpiring), and leave runs the host's own provisioned fallback
// leave through the shim: units disabled, the host Available, the event
// LeaveFallback naming the expiry.
func (v *verifiedRun) expiredLeave() {
	w := v.w
	w.t.Helper()
	p := &v1beta1.SSHJoinProfile{}
	raw, err := os.ReadFile(v.goodProfile)
	if err != nil {
		w.t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(raw, p); err != nil {
		w.t.Fatal(err)
	}
	now := time.Now().UTC().Truncate(time.Second)
	m, err := envelope.MarshalManifest(envelope.Manifest{Phase: "leave", Profile: p.Marker(), ScriptSHA256: envelope.ScriptDigest([]byte(p.Spec.Scripts.Leave)),
		IssuedAt: now.Add(-31 * 24 * time.Hour), NotAfter: now.Add(-time.Hour)})
	if err != nil {
		w.t.Fatal(err)
	}
	sig, err := sshsig.Sign(v.signer.priv, m, sshsig.Namespace)
	if err != nil {
		w.t.Fatal(err)
	}
	p.Spec.Signatures.Leave = v1beta1.Signature(envelope.FormatSignedField(envelope.SignedField{Manifest: m, Signature: sig}))
	b, err := yaml.Marshal(p)
	if err != nil {
		w.t.Fatal(err)
	}
	file := filepath.Join(v.dir, "profile-expired-leave.yaml")
	writeFile(w, file, string(b))
	w.apply(file)
	w.eventually("node class verified: SignaturesExpiring Expired, naming leave", time.Minute, func() (bool, string) {
		nc := &v1beta1.SSHNodeClass{}
		if err := w.kube.Get(context.Background(), client.ObjectKey{Name: "verified"}, nc); err != nil {
			return false, err.Error()
		}
		c := nc.StatusConditions().Get(v1beta1.ConditionSignaturesExpiring)
		return c != nil && c.IsTrue() && c.Reason == "Expired" && strings.Contains(c.Message, "leave manifest expired"), fmt.Sprintf("%+v", c)
	})
	leaveState, fallbacks := v.shimState("leave"), v.journalCount("sudo", shimFallbackLine)
	start := time.Now()
	v.scale(0)
	w.allLeft("verified leave with an expired manifest: the host's fallback leave; claim, node gone; hosts Available")
	w.t.Logf("left with the fallback leave %v after scaling to 0", time.Since(start).Round(100*time.Millisecond))
	h := w.sshHost(v.name)
	if lp := h.Status.LastPhase; lp == nil || lp.Phase != v1beta1.PhaseLeave || lp.Result != v1beta1.PhaseSucceeded {
		w.t.Errorf("last phase %+v, want a succeeded leave", lp)
	} else {
		w.t.Logf("fallback leave through the shim: %v", lp.Duration.Duration)
	}
	if h.LeaveOwed() {
		w.t.Errorf("condition LeaveFailed on %s after its fallback leave succeeded", v.name)
	}
	w.eventually("LeaveFallback event naming the expired manifest", time.Minute, func() (bool, string) {
		evs := v.events(poolNS, v.name, "LeaveFallback")
		return strings.Contains(evs, "manifest expired"), evs
	})
	// It went through the shim's op (sudo logs it), not the signed path:
	// the shim's leave record did not move.
	if n := v.journalCount("sudo", shimFallbackLine); n <= fallbacks {
		w.t.Errorf("sudo logged no %q (%d before, %d now)", shimFallbackLine, fallbacks, n)
	}
	if got := v.shimState("leave"); got != leaveState {
		w.t.Errorf("shim state of leave moved %q → %q: an expired manifest ran", leaveState, got)
	}
}

// events lists "reason: message" lines of events (namespace "" = all).
func (v *verifiedRun) events(ns, object, reason string) string {
	args := []string{"get", "events", "--field-selector", "reason=" + reason, "-o", `jsonpath={range .items[*]}{.involvedObject.kind}/{.involvedObject.name}: {.message}{"\n"}{end}`}
	if ns == "" {
		args = append(args, "-A")
	} else {
		args = append(args, "-n", ns)
	}
	if object != "" {
		args[3] += ",involvedObject.name=" + object
	}
	out, err := v.w.kubectl(args...)
	if err != nil {
		return err.Error()
	}
	return out
}

// restore removes the verified pool and makes the host a plain Raw pool
// host again (its login and class before), de-provisioned.
func (v *verifiedRun) restore() {
	w := v.w
	w.t.Helper()
	for _, f := range []string{"workload.yaml", "nodepool.yaml", "nodeclass.yaml"} {
		w.mustKubectl("delete", "--wait=true", "--timeout=3m", "-f", filepath.Join(w.repo, "test/e2e/testdata/verified", f))
	}
	w.mustKubectl("delete", "sshjoinprofile", verifiedProfile)
	v.patchHost(map[string]any{
		"metadata": map[string]any{"labels": map[string]string{"karpenter.dklesev.github.io/host-class": v.class}},
		"spec": map[string]any{"user": v.login0.User, "sshKeySecretRef": map[string]string{"name": v.login0.SSHKeySecretRef.Name},
			"execMode": "Raw", "trustedSigners": nil},
	})
	v.probedAvailable(v.name + " probed Available as a Raw host again")
	// De-provision (the role has no uninstall): the kpssh login and its
	// sshd drop-in, sudoers line, shim and state go.
	w.hosts.MustRun(v.i, `set -euo pipefail
rm -f /etc/ssh/sshd_config.d/60-kpssh-verified.conf /etc/sudoers.d/kpssh-shim /usr/local/bin/kpssh-shim
/usr/sbin/sshd -t
systemctl reload ssh
rm -rf /etc/kpssh /var/lib/kpssh-shim
if id kpssh >/dev/null 2>&1; then userdel -r kpssh 2>/dev/null || userdel kpssh; fi`)
	if err := w.kube.Delete(context.Background(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: poolNS, Name: "verified-login"}}); err != nil {
		w.t.Error(err)
	}
	probed := w.sshHost(v.name).Status.LastProbeTime
	w.eventually("all hosts Available, the de-provisioned one probed again", 3*time.Minute, func() (bool, string) {
		h := w.sshHost(v.name)
		if probed != nil && (h.Status.LastProbeTime == nil || !h.Status.LastProbeTime.After(probed.Time)) {
			return false, "not probed since the de-provisioning"
		}
		return w.allHosts(v1beta1.HostAvailable)
	})
}

// withoutPolicyWarnings drops kpssh sign's "<phase> manifest has no param
// policy" warning lines.
func withoutPolicyWarnings(stderr string) string {
	var keep []string
	for _, l := range strings.Split(stderr, "\n") {
		if !strings.Contains(l, " manifest has no param policy: ") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}
