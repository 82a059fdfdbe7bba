//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/yaml"

	"github.com/dklesev/kpssh/apis/v1beta1"
)

// hostsOfClass names the SSHHosts of a host class.
func (w *world) hostsOfClass(class string) []string {
	w.t.Helper()
	var out []string
	for _, h := range w.sshHosts() {
		if h.Class() == class {
			out = append(out, h.Name)
		}
	}
	if len(out) == 0 {
		w.t.Fatalf("no host of class %s", class)
	}
	return out
}

// parkAll sets (on) or removes the maintenance annotation on hosts.
func (w *world) parkAll(hosts []string, on bool) {
	w.t.Helper()
	v := "-"
	if on {
		v = "=true"
	}
	for _, n := range hosts {
		w.mustKubectl("-n", poolNS, "annotate", "--overwrite", "sshhost", n, v1beta1.AnnotationMaintenance+v)
	}
}

// hostsIn waits for hosts to be in state.
func (w *world) hostsIn(hosts []string, state v1beta1.HostState) {
	w.t.Helper()
	w.eventually(strings.Join(hosts, ", ")+" "+string(state), 2*time.Minute, func() (bool, string) {
		var s []string
		ok := true
		for _, n := range hosts {
			h := w.sshHost(n)
			s = append(s, n+"="+string(h.Status.State))
			ok = ok && h.Status.State == state
		}
		return ok, strings.Join(s, " ")
	})
}

// consolidationPolicy sets the NodePool ssh's consolidation policy.
func (w *world) consolidationPolicy(p karpv1.ConsolidationPolicy) {
	w.t.Helper()
	w.mustKubectl("patch", "nodepool", "ssh", "--type=merge", "-p", `{"spec":{"disruption":{"consolidationPolicy":"`+string(p)+`"}}}`)
}

// priceConsolidation: the world's two host classes, small (2 vCPUs) and
// large (4: twice the price). The small hosts parked, the pod lands on the
// large host (reserved, its class's reservation). The small hosts handed
// back, the NodePool consolidates WhenEmptyOrUnderutilized (this scenario
// only): Karpenter's single-node consolidation replaces the large node by
// a cheaper small one (decision replace, reason underutilized), the pod
// runs there, the large host leaves and is Available. Then, with a kpssh
// node Ready and free hosts of both classes, the chart's controller
// Deployment: its pod is never scheduled onto a kpssh node and no
// NodeClaim is launched for it (controllerNeverOnKpssh).
func priceConsolidation(w *world, _ *state) {
	small, large := w.hostsOfClass("small"), w.hostsOfClass("large")
	w.parkAll(small, true)
	w.hostsIn(small, v1beta1.HostMaintenance)
	w.scale(1)
	host, claim := w.joined("")
	if host.Class() != "large" || claim.Labels[corev1.LabelInstanceTypeStable] != "large" ||
		claim.Labels[karpv1.CapacityTypeLabelKey] != karpv1.CapacityTypeReserved || claim.Labels[v1beta1.LabelReservationID] != v1beta1.ReservationID("pool", "large") {
		w.t.Fatalf("with the small hosts parked the pod landed on %s (class %s), claim %s labels %v: want the large host, reserved, %s",
			host.Name, host.Class(), claim.Name, claim.Labels, v1beta1.ReservationID("pool", "large"))
	}
	// The small hosts back first, then the policy: Karpenter dedupes a
	// node's Unconsolidatable events for 15 minutes, so the first verdict
	// it gives (shown while waiting) is one with the cheaper hosts free.
	// Their coming back is no cluster event to Karpenter, which looks at a
	// consolidated cluster again only on one or every 5 minutes, and a
	// policy change makes the NodePool briefly not Ready (a pass then finds
	// no NodePool and marks the cluster consolidated): the NodePool is
	// annotated (no spec change) every 15 s while the test waits.
	w.parkAll(small, false)
	w.hostsIn(small, v1beta1.HostAvailable)
	w.consolidationPolicy(karpv1.ConsolidationPolicyWhenEmptyOrUnderutilized)
	defer w.consolidationPolicy(karpv1.ConsolidationPolicyWhenEmpty) // the world's, also when the scenario fails
	replaced := func() float64 {
		return w.metricSum("karpenter_voluntary_disruption_decisions_total", `decision="replace"`, `reason="underutilized"`)
	}
	before := replaced()
	start := time.Now()
	var poked time.Time
	// 10 minutes: the replacement may be a cold install (4 min at load 38).
	w.eventually("the large node's claim "+claim.Name+" consolidated away", 10*time.Minute, func() (bool, string) {
		if time.Since(poked) > 15*time.Second {
			poked = time.Now()
			w.mustKubectl("annotate", "--overwrite", "nodepool", "ssh", "kpssh.test/consolidate="+poked.Format("150405"))
		}
		c := &karpv1.NodeClaim{}
		err := w.kube.Get(context.Background(), client.ObjectKeyFromObject(claim), c)
		if err == nil {
			evs, _ := w.kubectl("get", "events", "--field-selector", "involvedObject.name="+claim.Name+",reason=Unconsolidatable", "-o", "jsonpath={.items[*].message}")
			return false, fmt.Sprintf("still there (%d NodeClaims); Unconsolidatable: %s", len(w.nodeClaims()), evs)
		}
		return client.IgnoreNotFound(err) == nil, err.Error()
	})
	cheap, repl := w.joined(large[0])
	took := time.Since(start)
	if cheap.Class() != "small" || repl.Labels[corev1.LabelInstanceTypeStable] != "small" {
		w.t.Errorf("replacement %s on %s (class %s, instance type %s), want a small host", repl.Name, cheap.Name, cheap.Class(), repl.Labels[corev1.LabelInstanceTypeStable])
	}
	if d := replaced() - before; d < 1 {
		w.t.Errorf("karpenter_voluntary_disruption_decisions_total{decision=replace,reason=underutilized} +%v, want ≥ 1 (a price replacement)", d)
	}
	w.eventually(host.Name+" (large) left and Available", 2*time.Minute, func() (bool, string) {
		h := w.sshHost(host.Name)
		return leftAvailable(h), fmt.Sprintf("%s, last phase %+v", h.Status.State, h.Status.LastPhase)
	})
	if u := w.units(w.hostIndex(host.Name)); u != unitsLeft {
		w.t.Errorf("%s after consolidation: units %q, want %q", host.Name, u, unitsLeft)
	}
	w.t.Logf("price consolidation: %s on %s (large) replaced by %s on %s (small) %v after the small hosts were Available",
		claim.Name, host.Name, repl.Name, cheap.Name, took.Round(100*time.Millisecond))
	w.consolidationPolicy(karpv1.ConsolidationPolicyWhenEmpty)
	w.mustKubectl("annotate", "nodepool", "ssh", "kpssh.test/consolidate-")

	controllerNeverOnKpssh(w, cheap.Name)

	w.scale(0)
	w.allLeft("price consolidation: everything Available")
}

// controllerNeverOnKpssh applies the chart's controller Deployment (helm
// template, as installed, its ServiceAccount with it) while kpssh node node
// is Ready and hosts of both classes are free: the pod is never scheduled
// (the scheduler: node affinity; the chart keeps the controller off nodes
// whose leave would stop it, by karpenter.dklesev.github.io/managed), and
// Karpenter launches no NodeClaim for it (its instance types require the
// label, so its simulation knows a kpssh node would not do). The pod is
// watched for 30 s (Karpenter batches pending pods for 1–3 s here), then
// the Deployment is deleted.
func controllerNeverOnKpssh(w *world, node string) {
	ctx := context.Background()
	ns := promNamespace
	if err := w.kube.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); client.IgnoreAlreadyExists(err) != nil {
		w.t.Fatal(err)
	}
	dir := w.t.TempDir()
	for _, tpl := range []string{"templates/serviceaccount.yaml", "templates/deployment.yaml"} {
		f := filepath.Join(dir, filepath.Base(tpl))
		if err := os.WriteFile(f, helmTemplate(w, tpl, "replicas=1"), 0o600); err != nil {
			w.t.Fatal(err)
		}
		w.apply(f)
	}
	dep := &appsv1.Deployment{}
	if err := yaml.Unmarshal(helmTemplate(w, "templates/deployment.yaml", "replicas=1"), dep); err != nil {
		w.t.Fatal(err)
	}
	defer func() {
		w.mustKubectl("-n", ns, "delete", "deployment", dep.Name, "--wait=true", "--timeout=2m")
	}()
	claims := len(w.nodeClaims())
	sel := client.MatchingLabels(dep.Spec.Selector.MatchLabels)
	var pod corev1.Pod
	w.eventually("the controller pod created and found unschedulable", 2*time.Minute, func() (bool, string) {
		pods := &corev1.PodList{}
		if err := w.kube.List(ctx, pods, client.InNamespace(ns), sel); err != nil {
			return false, err.Error()
		}
		if len(pods.Items) != 1 {
			return false, fmt.Sprintf("%d controller pods", len(pods.Items))
		}
		pod = pods.Items[0]
		for _, c := range pod.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				return strings.Contains(c.Message, "affinity"), c.Message
			}
		}
		return false, fmt.Sprintf("pod %s on %q, conditions %v", pod.Name, pod.Spec.NodeName, pod.Status.Conditions)
	})
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		p := &corev1.Pod{}
		if err := w.kube.Get(ctx, client.ObjectKeyFromObject(&pod), p); err != nil {
			w.t.Fatal(err)
		}
		if p.Spec.NodeName != "" {
			w.t.Fatalf("the controller pod was scheduled onto %s (kpssh node %s is Ready)", p.Spec.NodeName, node)
		}
		if n := w.nodeClaims(); len(n) != claims {
			var names []string
			for _, c := range n {
				names = append(names, c.Name)
			}
			w.t.Fatalf("NodeClaims %v while the controller pod pends (was %d): Karpenter launched a node the pod cannot use", names, claims)
		}
		time.Sleep(time.Second)
	}
	evs, _ := w.kubectl("-n", ns, "get", "events", "--field-selector", "involvedObject.name="+pod.Name, "-o", "custom-columns=SOURCE:.source.component,REASON:.reason,MSG:.message")
	w.t.Logf("controller pod %s: Pending for 30 s with kpssh node %s Ready and free hosts, no NodeClaim launched; its events:\n%s", pod.Name, node, evs)
}
