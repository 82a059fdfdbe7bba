//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/test/testenv"
)

// ownClaim: a NodeClaim of kpssh's (its nodeClassRef is an SSHNodeClass).
func ownClaim(c *karpv1.NodeClaim) bool {
	r := c.Spec.NodeClassRef
	return r != nil && r.Group == v1beta1.Group && r.Kind == "SSHNodeClass"
}

const (
	kwokNS    = "kwok-system"
	kwokLease = "kwok-leader-election"
	kwokPool  = "kwok"
)

// buildKwok builds Karpenter's kwok provider (the main of
// sigs.k8s.io/karpenter/kwok, the module version go.mod requires; the Go
// build cache keeps it) and returns the binary and its KWOKNodeClass CRD.
func (w *world) buildKwok() (bin, crd string) {
	w.t.Helper()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	bin = filepath.Join(w.t.TempDir(), "kwok")
	env := append(os.Environ(), "GOTOOLCHAIN=go1.27.3")
	b := exec.CommandContext(ctx, "go", "build", "-o", bin, "sigs.k8s.io/karpenter/kwok")
	b.Dir, b.Env = w.repo, env
	if out, err := b.CombinedOutput(); err != nil {
		w.t.Fatalf("go build sigs.k8s.io/karpenter/kwok: %v\n%s", err, out)
	}
	l := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/karpenter")
	l.Dir, l.Env = w.repo, env
	dir, err := l.Output()
	if err != nil {
		w.t.Fatalf("go list -m sigs.k8s.io/karpenter: %v", err)
	}
	crd = filepath.Join(strings.TrimSpace(string(dir)), "kwok/apis/crds/karpenter.kwok.sh_kwoknodeclasses.yaml")
	w.t.Logf("kwok provider built in %v", time.Since(start).Round(100*time.Millisecond))
	return bin, crd
}

// coexistence: Karpenter's kwok provider runs beside kpssh in the same
// cluster (its own namespace, Lease and ports), each with a NodePool and a
// workload. Neither touches the other's NodeClaims, Nodes or NodeClasses,
// and each scale down removes only its own.
//
// What kwok's provider (v1.15) does without the kwok tool: Create writes a
// Node object itself (providerID kwok://<node>) and nothing ever heartbeats
// it, so its NodeClaims get Launched and Registered, never Initialized, and
// Karpenter does not consolidate them (only initialized nodes are
// candidates): its scale down here is deleting its NodeClaims.
func coexistence(w *world, st *state) {
	w.allLeft("Coexistence starts with nothing joined (what the previous scenario left, its leave given time)")
	kwokBin, crd := w.buildKwok()
	w.apply(crd)
	if _, err := w.kubectl("create", "namespace", kwokNS); err != nil && !strings.Contains(err.Error(), "AlreadyExists") {
		w.t.Fatal(err)
	}
	w.apply(filepath.Join(w.repo, "test/e2e/testdata/kwok.yaml"))

	// kpssh as the chart runs it: leader election on, its own Lease.
	env := w.ctrl.env
	w.ctrl.stop()
	w.ctrl.env = append(append([]string(nil), env...), leaderElectionEnv(leaseName, leaseNS)...)
	w.ctrl.start()
	kwok := &controller{t: w.t, bin: kwokBin, dir: w.repo, logDir: filepath.Join(w.logDir, "kwok"), metricsPort: testenv.MustFreePort(w.t), env: append([]string{
		"KUBECONFIG=" + w.kubeconfig, "BATCH_IDLE_DURATION=1s", "BATCH_MAX_DURATION=3s", "LOG_LEVEL=debug",
	}, leaderElectionEnv(kwokLease, kwokNS)...)}
	if err := os.MkdirAll(kwok.logDir, 0o755); err != nil {
		w.t.Fatal(err)
	}
	kwok.start()
	defer func() {
		kwok.stop()
		w.ctrl.stop()
		w.ctrl.env = env
		w.ctrl.start()
		for _, o := range [][]string{{"-n", "default", "deployment", "kwok-pause"}, {"nodepool", kwokPool}, {"kwoknodeclass", "kwok"}} {
			w.kubectl(append([]string{"delete", "--ignore-not-found", "--wait=false"}, o...)...)
		}
	}()

	// Two Leases, two holders; two metrics endpoints, each its own.
	w.eventually("both Leases held", 2*time.Minute, func() (bool, string) {
		if why, gone := kwok.exitedOnItsOwn(); gone {
			w.t.Fatalf("the kwok provider exited: %s", why)
		}
		a, b := w.leaseHolder(leaseNS, leaseName), w.leaseHolder(kwokNS, kwokLease)
		return a != "" && b != "", fmt.Sprintf("kpssh %q kwok %q", a, b)
	})
	if m := scrape(w, kwok.metricsPort); strings.Contains(m, "kpssh_") || !strings.Contains(m, "karpenter_") {
		w.t.Errorf("kwok's metrics endpoint (port %s) serves kpssh's metrics or no Karpenter metrics", kwok.metricsPort)
	}
	if m := scrape(w, w.ctrl.metricsPort); !strings.Contains(m, "kpssh_pool_hosts") {
		w.t.Errorf("kpssh's metrics endpoint (port %s) has no kpssh_pool_hosts", w.ctrl.metricsPort)
	}

	start := time.Now()
	w.scale(1)
	w.mustKubectl("-n", "default", "scale", "deployment/kwok-pause", "--replicas=2")
	host, claim := w.joined("")
	w.t.Logf("Coexistence: kpssh joined %s %v after scale up: %s", host.Name, time.Since(start).Round(100*time.Millisecond), timeline(claim))
	var kwokClaims []karpv1.NodeClaim
	w.eventually("two kwok NodeClaims registered with their Nodes", 3*time.Minute, func() (bool, string) {
		kwokClaims = w.poolClaims(kwokPool)
		var s []string
		ok := len(kwokClaims) == 2
		for _, c := range kwokClaims {
			reg := c.StatusConditions().Get(karpv1.ConditionTypeRegistered)
			node := &corev1.Node{}
			nerr := w.kube.Get(context.Background(), types.NamespacedName{Name: c.Status.NodeName}, node)
			ok = ok && reg != nil && reg.IsTrue() && strings.HasPrefix(c.Status.ProviderID, "kwok://") && nerr == nil && node.Spec.ProviderID == c.Status.ProviderID
			s = append(s, fmt.Sprintf("%s providerID=%q node=%q registered=%v", c.Name, c.Status.ProviderID, c.Status.NodeName, reg != nil && reg.IsTrue()))
		}
		return ok, strings.Join(s, "; ")
	})
	w.t.Logf("Coexistence: kwok's two claims registered %v after scale up", time.Since(start).Round(100*time.Millisecond))
	w.apart(claim, kwokClaims)

	// kpssh's scale down removes kpssh's claim and Node only.
	w.scale(0)
	w.eventually("kpssh's claim and Node gone, every host Available", 5*time.Minute, func() (bool, string) {
		var s []string
		for _, c := range w.nodeClaims() {
			if ownClaim(&c) {
				s = append(s, "claim "+w.describeClaim(&c))
			}
		}
		for _, n := range w.nodes() {
			if strings.HasPrefix(n.Spec.ProviderID, "kpssh://") {
				s = append(s, "node "+n.Name)
			}
		}
		ok, hs := w.allHosts(v1beta1.HostAvailable)
		return len(s) == 0 && ok, strings.Join(append(s, hs), " ")
	})
	w.t.Logf("Coexistence: kpssh scaled down %v after scale up", time.Since(start).Round(100*time.Millisecond))
	w.sameClaims("after kpssh's scale down", kwokClaims)

	// kwok's scale down: its pods (bound to Nodes without a kubelet) go by
	// force, its claims by delete; kpssh's pool stays as it is.
	w.mustKubectl("-n", "default", "scale", "deployment/kwok-pause", "--replicas=0")
	w.kubectl("-n", "default", "delete", "pod", "-l", "app=kwok-pause", "--force", "--grace-period=0", "--wait=false")
	w.mustKubectl("delete", "nodeclaim", "-l", karpv1.NodePoolLabelKey+"="+kwokPool, "--wait=false")
	w.eventually("kwok's claims and Nodes gone", 3*time.Minute, func() (bool, string) {
		var s []string
		for _, c := range w.nodeClaims() {
			s = append(s, "claim "+c.Name)
		}
		for _, n := range w.nodes() {
			s = append(s, "node "+n.Name)
		}
		return len(s) == 0, strings.Join(s, " ")
	})
	for _, h := range w.sshHosts() {
		if h.Status.ClaimRef != nil {
			w.t.Errorf("host %s claimed by %s during kwok's scale down", h.Name, h.Status.ClaimRef.Name)
		}
	}
	w.t.Logf("Coexistence: kwok scaled down %v after scale up", time.Since(start).Round(100*time.Millisecond))
	w.neitherLogged(kwok, claim, kwokClaims)
	if why, gone := kwok.exitedOnItsOwn(); gone {
		w.t.Errorf("the kwok provider exited: %s", why)
	}
}

// poolClaims lists the NodeClaims of NodePool pool.
func (w *world) poolClaims(pool string) []karpv1.NodeClaim {
	var out []karpv1.NodeClaim
	for _, c := range w.nodeClaims() {
		if c.Labels[karpv1.NodePoolLabelKey] == pool {
			out = append(out, c)
		}
	}
	return out
}

const kpsshPrefix = "karpenter.dklesev.github.io/"

func hasKeyPrefix(m map[string]string, p string) []string {
	var out []string
	for k := range m {
		if strings.HasPrefix(k, p) {
			out = append(out, k)
		}
	}
	return out
}

// apart checks that neither provider marked the other's objects.
func (w *world) apart(own *karpv1.NodeClaim, kwokClaims []karpv1.NodeClaim) {
	w.t.Helper()
	ctx := context.Background()
	for _, c := range kwokClaims {
		for _, f := range c.Finalizers {
			if strings.HasPrefix(f, kpsshPrefix) {
				w.t.Errorf("kwok's NodeClaim %s has kpssh's finalizer %s", c.Name, f)
			}
		}
		if k := append(hasKeyPrefix(c.Annotations, kpsshPrefix), hasKeyPrefix(c.Labels, kpsshPrefix)...); len(k) > 0 {
			w.t.Errorf("kwok's NodeClaim %s carries kpssh's keys %v", c.Name, k)
		}
		node := &corev1.Node{}
		if err := w.kube.Get(ctx, types.NamespacedName{Name: c.Status.NodeName}, node); err == nil {
			if k := append(hasKeyPrefix(node.Annotations, kpsshPrefix), hasKeyPrefix(node.Labels, kpsshPrefix)...); len(k) > 0 {
				w.t.Errorf("kwok's Node %s carries kpssh's keys %v", node.Name, k)
			}
			if nodeReady(node) {
				w.t.Logf("note: kwok's Node %s is Ready", node.Name) // not expected without the kwok tool
			}
		}
		if init := c.StatusConditions().Get(karpv1.ConditionTypeInitialized); init != nil && init.IsTrue() {
			w.t.Logf("note: kwok's NodeClaim %s is Initialized", c.Name)
		}
	}
	var claimed []string
	for _, h := range w.sshHosts() {
		if h.Status.ClaimRef != nil {
			claimed = append(claimed, h.Name+"→"+h.Status.ClaimRef.Name)
		}
	}
	if len(claimed) != 1 || !strings.HasSuffix(claimed[0], "→"+own.Name) {
		w.t.Errorf("claimed SSHHosts %v, want only kpssh's claim %s", claimed, own.Name)
	}
	if k := append(hasKeyPrefix(own.Annotations, "kwok.x-k8s.io/"), hasKeyPrefix(own.Labels, "kwok.x-k8s.io/")...); len(k) > 0 || !strings.HasPrefix(own.Status.ProviderID, "kpssh://") {
		w.t.Errorf("kpssh's NodeClaim %s: kwok keys %v, providerID %q", own.Name, k, own.Status.ProviderID)
	}
	node := &corev1.Node{}
	if err := w.kube.Get(ctx, types.NamespacedName{Name: own.Status.NodeName}, node); err != nil {
		w.t.Errorf("kpssh's Node: %v", err)
	} else if k := append(hasKeyPrefix(node.Annotations, "kwok.x-k8s.io/"), hasKeyPrefix(node.Labels, "kwok.x-k8s.io/")...); len(k) > 0 || node.Labels["kwok-partition"] != "" {
		w.t.Errorf("kpssh's Node %s carries kwok's keys %v", node.Name, k)
	}
	// NodeClasses: each has only its own provider's finalizers.
	if f := w.mustKubectl("get", "kwoknodeclass", "kwok", "-o", "jsonpath={.metadata.finalizers}"); strings.Contains(f, kpsshPrefix) {
		w.t.Errorf("KWOKNodeClass finalizers %s", f)
	}
	if f := w.mustKubectl("get", "sshnodeclass", "pool", "-o", "jsonpath={.metadata.finalizers} {.status.conditions[?(@.type==\"Ready\")].status}"); strings.Contains(f, "kwok") || !strings.HasSuffix(f, "True") {
		w.t.Errorf("SSHNodeClass pool finalizers/Ready: %s", f)
	}
	if r := w.mustKubectl("get", "kwoknodeclass", "kwok", "-o", "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}"); r != "True" {
		w.t.Errorf("KWOKNodeClass Ready %q", r)
	}
}

// sameClaims: kwok's claims are still there, the same objects, not deleting.
func (w *world) sameClaims(when string, want []karpv1.NodeClaim) {
	w.t.Helper()
	got := map[string]karpv1.NodeClaim{}
	for _, c := range w.poolClaims(kwokPool) {
		got[c.Name] = c
	}
	for _, c := range want {
		g, ok := got[c.Name]
		switch {
		case !ok:
			w.t.Errorf("%s: kwok's NodeClaim %s is gone", when, c.Name)
		case g.UID != c.UID || g.DeletionTimestamp != nil:
			w.t.Errorf("%s: kwok's NodeClaim %s replaced or deleting", when, c.Name)
		}
		node := &corev1.Node{}
		if err := w.kube.Get(context.Background(), types.NamespacedName{Name: c.Status.NodeName}, node); err != nil || node.DeletionTimestamp != nil {
			w.t.Errorf("%s: kwok's Node %s gone or deleting (%v)", when, c.Status.NodeName, err)
		}
	}
}

// neitherLogged: no controller of either Karpenter reconciled a NodeClaim
// of the other's (Karpenter's controllers log the object they work on as
// "NodeClaim":{"name":…}).
func (w *world) neitherLogged(kwok *controller, own *karpv1.NodeClaim, kwokClaims []karpv1.NodeClaim) {
	w.t.Helper()
	check := func(who, path string, names []string) {
		b, err := os.ReadFile(path)
		if err != nil {
			w.t.Errorf("%s log: %v", who, err)
			return
		}
		for _, n := range names {
			re := regexp.MustCompile(`"NodeClaim":\{"name":"` + regexp.QuoteMeta(n) + `"`)
			var hits []string
			for _, l := range strings.Split(string(b), "\n") {
				if re.MatchString(l) {
					hits = append(hits, tail(l, 300))
				}
			}
			if len(hits) > 0 {
				w.t.Errorf("%s's controllers worked on the other's NodeClaim %s (%d lines), first: %s", who, n, len(hits), hits[0])
			}
		}
	}
	var kn []string
	for _, c := range kwokClaims {
		kn = append(kn, c.Name)
	}
	check("kpssh", w.ctrl.logPath(), kn)
	check("kwok", kwok.logPath(), []string{own.Name})
	if slices.Contains(kn, own.Name) {
		w.t.Errorf("name clash %s", own.Name)
	}
}

// scrape reads a controller's /metrics.
func scrape(w *world, port string) string {
	w.t.Helper()
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get("http://127.0.0.1:" + port + "/metrics")
	if err != nil {
		w.t.Errorf("metrics on %s: %v", port, err)
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}
