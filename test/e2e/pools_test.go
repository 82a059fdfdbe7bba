//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/dklesev/kpssh/apis/v1beta1"
)

// fullPool: every host InUse — one pause pod per host (they repel each
// other), so no pod fits elsewhere and no host is free — then the
// profile's spec.version bumped: every NodeClaim is Drifted and none can be
// replaced first. Karpenter terminates first (TerminateFirstDrift: the
// nodes hold slots of the hosts' reservation, capacity type reserved):
// within the NodePool's budget of one node, each old node is drained and
// leaves, its pod pends, a new claim takes the freed host, installs the new
// version and joins, the pod runs again. Never more than one old node
// disrupted at once (Karpenter's count: draining or leaving), one new
// NodeClaim per node (none launched without a host to take); at the end
// only new claims, every host InUse with the new version, none Claimed.
// The hosts are of two classes (two small, one large): each claim holds a
// slot of its class's reservation, and terminate-first works per
// reservation.
func fullPool(w *world, _ *state) {
	ctx := context.Background()
	n := len(w.hosts.Hosts())
	budget := func(nodes string) {
		w.mustKubectl("patch", "nodepool", "ssh", "--type=merge", "-p", `{"spec":{"disruption":{"budgets":[{"nodes":"`+nodes+`"}]}}}`)
	}
	budget("1")
	defer budget("100%") // the world's, also when the scenario fails
	start := time.Now()
	w.scale(n)
	w.eventually(fmt.Sprintf("all %d hosts joined, a pause pod on each", n), 10*time.Minute, func() (bool, string) { return w.allJoined(n, w.profile+"@") })
	w.t.Logf("pool full %v after scale %d", time.Since(start).Round(100*time.Millisecond), n)
	old := map[string]string{} // NodeClaim → its host (the Node's name)
	classes := map[string]int{}
	for _, c := range w.nodeClaims() {
		// Each holds a slot of its own class's reservation.
		class := c.Labels[corev1.LabelInstanceTypeStable]
		classes[class]++
		if want := v1beta1.ReservationID("pool", class); c.Labels[karpv1.CapacityTypeLabelKey] != karpv1.CapacityTypeReserved || c.Labels[v1beta1.LabelReservationID] != want {
			w.t.Errorf("NodeClaim %s (%s) launched as %q, reservation %q: want reserved, %s (terminate-first needs a slot of the reservation)",
				c.Name, class, c.Labels[karpv1.CapacityTypeLabelKey], c.Labels[v1beta1.LabelReservationID], want)
		}
		old[c.Name] = c.Status.NodeName
	}
	if classes["small"] != n-1 || classes["large"] != 1 {
		w.t.Errorf("NodeClaims per class %v, want every host's: %d small, 1 large", classes, n-1)
	}
	terminateFirst := func() float64 {
		return w.metricSum("karpenter_voluntary_disruption_terminate_first_decisions_total",
			`nodepool="ssh"`, `reason="drifted"`, `terminate_first_reason="no-reserved-capacity"`)
	}
	decisionsBefore := terminateFirst()

	w.bumpProfile()
	marker := w.profile + "@" + w.mustKubectl("get", "sshjoinprofile", w.profile, "-o", "jsonpath={.spec.version}")
	start = time.Now()
	gone := map[string]time.Duration{}
	// Every NodeClaim seen that is not an old one: true once Launched (it
	// took a host). Karpenter may also launch one against a reservation
	// slot its instance-type cache still counts after the host was taken:
	// Create finds no free host, the claim fails InsufficientCapacity
	// without touching a host and is retried — a wasted attempt, logged.
	fresh := map[string]bool{}
	maxDisrupted, maxDown := 0, 0
	w.eventually(fmt.Sprintf("every node replaced, hosts joined with %s", marker), 20*time.Minute, func() (bool, string) {
		live := map[string]bool{}
		disrupted := 0
		for _, c := range w.nodeClaims() {
			live[c.Name] = true
			host, isOld := old[c.Name]
			if !isOld {
				fresh[c.Name] = fresh[c.Name] || c.StatusConditions().Get(karpv1.ConditionTypeLaunched).IsTrue()
				continue
			}
			// Disrupted as Karpenter's budget counts it: marked (the
			// disrupted taint, or deleting) until its instance is gone
			// (InstanceTerminating: leave has run, the host is back).
			node := &corev1.Node{}
			tainted := w.kube.Get(ctx, client.ObjectKey{Name: host}, node) == nil && hasTaint(node, karpv1.DisruptedTaintKey)
			if (c.DeletionTimestamp != nil || tainted) && !c.StatusConditions().Get(karpv1.ConditionTypeInstanceTerminating).IsTrue() {
				disrupted++
			}
		}
		for name, host := range old {
			if _, seen := gone[name]; !seen && !live[name] {
				gone[name] = time.Since(start)
				w.t.Logf("old claim %s (%s) gone %v after the bump", name, host, gone[name].Round(100*time.Millisecond))
			}
		}
		ready := 0
		for _, nd := range w.nodes() {
			if nodeReady(&nd) {
				ready++
			}
		}
		maxDisrupted, maxDown = max(maxDisrupted, disrupted), max(maxDown, n-ready)
		if len(gone) < n {
			return false, fmt.Sprintf("%d of %d old claims gone, %d disrupted now, %d Nodes Ready", len(gone), n, disrupted, ready)
		}
		return w.allJoined(n, marker)
	})
	took := time.Since(start)
	if maxDisrupted > 1 {
		w.t.Errorf("up to %d old nodes disrupted at once; the NodePool's budget is 1", maxDisrupted)
	}
	var launched, failed []string
	for c, ok := range fresh {
		if ok {
			launched = append(launched, c)
		} else {
			failed = append(failed, c)
		}
	}
	sort.Strings(launched)
	sort.Strings(failed)
	if len(launched) != n {
		w.t.Errorf("%d NodeClaims launched for %d nodes (%v): one host taken twice, or a node not replaced", len(launched), n, launched)
	}
	if len(failed) > 0 {
		w.t.Logf("%d NodeClaims never launched (no free host when Create ran; retried): %v", len(failed), failed)
	}
	if d := terminateFirst() - decisionsBefore; d < float64(n) {
		w.t.Errorf("%v terminate-first drift decisions (no-reserved-capacity), want %d: one per node of the full pool", d, n)
	}
	for _, c := range w.nodeClaims() {
		if _, isOld := old[c.Name]; isOld {
			w.t.Errorf("old claim %s still there", c.Name)
		}
	}
	for i, h := range w.hosts.Hosts() {
		if u := w.units(i); u != unitsJoined {
			w.t.Errorf("%s: units %q, want %q", h.Name, u, unitsJoined)
		}
	}
	var ds []time.Duration
	for _, d := range gone {
		ds = append(ds, d)
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	var times []string
	for _, d := range ds {
		times = append(times, d.Round(time.Second).String())
	}
	w.t.Logf("full pool of %d: every node replaced with %s in %v (old claims gone at %s); at most %d old node disrupted (drain, leave) and %d Nodes not Ready at once",
		n, marker, took.Round(100*time.Millisecond), strings.Join(times, ", "), maxDisrupted, maxDown)
	budget("100%") // the empty nodes go at once
	w.scale(0)
	w.allLeft("full pool: claims, nodes gone; hosts Available")
}

// allJoined: n hosts InUse whose install marker is installed (or, ending
// in "@", starts with it), none Claimed, n Ready Nodes, n pause pods
// Running on n different nodes.
func (w *world) allJoined(n int, installed string) (bool, string) {
	inUse, claimed := 0, 0
	for _, h := range w.sshHosts() {
		p := h.Status.InstalledProfile
		if h.Status.State == v1beta1.HostInUse && (p == installed || strings.HasSuffix(installed, "@") && strings.HasPrefix(p, installed)) {
			inUse++
		}
		if h.Status.State == v1beta1.HostClaimed {
			claimed++
		}
	}
	ready := 0
	for _, nd := range w.nodes() {
		if nodeReady(&nd) {
			ready++
		}
	}
	pods := &corev1.PodList{}
	if err := w.kube.List(context.Background(), pods, client.InNamespace("default"), client.MatchingLabels{"app": "pause"}); err != nil {
		return false, err.Error()
	}
	on := map[string]bool{}
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
			on[p.Spec.NodeName] = true
		}
	}
	return inUse == n && claimed == 0 && ready == n && len(on) == n,
		fmt.Sprintf("%d hosts InUse with %s, %d Claimed, %d Nodes Ready, pause pods Running on %d nodes", inUse, installed, claimed, ready, len(on))
}

// staticPool: a NodePool with spec.replicas (Karpenter's StaticCapacity)
// keeps that many hosts joined whatever the pods. replicas 2, no workload →
// two claims of it, their hosts InUse, two Ready Nodes, and they stay (a
// static pool is never consolidated); replicas 1 → one claim is deleted,
// its host's leave runs and it is Available again, the other stays joined.
// Then replicas 0 and the NodePool deleted.
func staticPool(w *world, _ *state) {
	w.apply(filepath.Join(w.repo, "test/e2e/testdata/static-nodepool.yaml"))
	defer w.mustKubectl("delete", "nodepool", "static", "--ignore-not-found", "--timeout=5m")
	start := time.Now()
	var claims []karpv1.NodeClaim
	w.eventually("two static claims joined", 8*time.Minute, func() (bool, string) {
		claims = w.staticClaims()
		return w.staticJoined(claims, 2)
	})
	w.t.Logf("replicas 2: %s and %s joined %v after the NodePool", claims[0].Status.NodeName, claims[1].Status.NodeName, time.Since(start).Round(100*time.Millisecond))
	pods := &corev1.PodList{}
	if err := w.kube.List(context.Background(), pods, client.InNamespace("default")); err != nil {
		w.t.Fatal(err)
	}
	if len(pods.Items) != 0 {
		w.t.Fatalf("%d workload pods: the static nodes must be joined with none asking", len(pods.Items))
	}
	// Empty nodes of a dynamic pool go after consolidateAfter (5 s) and
	// Karpenter's check; a static pool's stay.
	time.Sleep(30 * time.Second)
	if ok, s := w.staticJoined(w.staticClaims(), 2); !ok {
		w.t.Fatalf("after 30 s with no pod: %s", s)
	}
	for _, c := range w.staticClaims() {
		if c.Name != claims[0].Name && c.Name != claims[1].Name {
			w.t.Fatalf("claim %s replaced the first two", c.Name)
		}
	}

	w.mustKubectl("patch", "nodepool", "static", "--type=merge", "-p", `{"spec":{"replicas":1}}`)
	start = time.Now()
	var kept, left string
	w.eventually("one static claim left, the other host left", 5*time.Minute, func() (bool, string) {
		now := w.staticClaims()
		if ok, s := w.staticJoined(now, 1); !ok {
			return false, s
		}
		kept = now[0].Status.NodeName
		for _, c := range claims {
			if c.Name == now[0].Name {
				continue
			}
			left = c.Status.NodeName
		}
		if kept == left || left == "" {
			return false, fmt.Sprintf("claim %s is not one of the first two", now[0].Name)
		}
		h := w.sshHost(left)
		return leftAvailable(h), fmt.Sprintf("%s: %s, last phase %+v", left, h.Status.State, h.Status.LastPhase)
	})
	w.t.Logf("replicas 1: %s left %v after the patch, %s stays joined", left, time.Since(start).Round(100*time.Millisecond), kept)
	if u := w.units(w.hostIndex(left)); u != unitsLeft {
		w.t.Errorf("%s after its leave: units %q, want %q", left, u, unitsLeft)
	}
	if u := w.units(w.hostIndex(kept)); u != unitsJoined {
		w.t.Errorf("%s kept: units %q, want %q", kept, u, unitsJoined)
	}

	w.mustKubectl("patch", "nodepool", "static", "--type=merge", "-p", `{"spec":{"replicas":0}}`)
	w.allLeft("static pool at 0: claims, nodes gone; hosts Available")
}

// staticClaims lists the live NodeClaims of NodePool static.
func (w *world) staticClaims() []karpv1.NodeClaim {
	w.t.Helper()
	l := &karpv1.NodeClaimList{}
	if err := w.kube.List(context.Background(), l, client.MatchingLabels{karpv1.NodePoolLabelKey: "static"}); err != nil {
		w.t.Fatal(err)
	}
	var out []karpv1.NodeClaim
	for _, c := range l.Items {
		if c.DeletionTimestamp == nil {
			out = append(out, c)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// staticJoined: exactly n claims, each on a host InUse under it with a
// Ready Node, and no other NodeClaim (the dynamic pool has no pods).
func (w *world) staticJoined(claims []karpv1.NodeClaim, n int) (bool, string) {
	if len(claims) != n {
		return false, fmt.Sprintf("%d live static NodeClaims", len(claims))
	}
	if all := len(w.nodeClaims()); all != n {
		return false, fmt.Sprintf("%d NodeClaims in all (static %d)", all, n)
	}
	for _, c := range claims {
		if c.Status.NodeName == "" {
			return false, "claim " + c.Name + " has no Node yet"
		}
		h := w.sshHost(c.Status.NodeName)
		if h.Status.State != v1beta1.HostInUse || h.Status.ClaimRef == nil || h.Status.ClaimRef.Name != c.Name {
			return false, fmt.Sprintf("host %s: %s, claim %+v", h.Name, h.Status.State, h.Status.ClaimRef)
		}
		node := &corev1.Node{}
		if err := w.kube.Get(context.Background(), client.ObjectKey{Name: c.Status.NodeName}, node); err != nil || !nodeReady(node) {
			return false, "Node " + c.Status.NodeName + " not Ready"
		}
	}
	return true, ""
}
