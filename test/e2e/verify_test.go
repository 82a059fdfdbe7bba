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

// verifyProfile is the script profile the Verify scenario gives a verify
// phase (the node class points at it meanwhile, whatever KPSSH_E2E_PROFILE).
const verifyProfile = "tls-bootstrap-script"

// verifyGate: the script profile gets the shipped verify phase
// (examples/scripts/verify-kubelet-healthz.patch.yaml: the kubelet answers
// healthz, the paths of var verifyDevices exist; install 8m so that
// install + join + verify fit the registration window) and the node class
// a device no host has. Then:
//   - scale 1 → hosts join, their real kubelets register Nodes, verify
//     fails on each: no NodeClaim ever turns Registered, no Node ever gets
//     karpenter.sh/registered (they carry karpenter.sh/unregistered while
//     verify runs), every claim is deleted (VerifyFailed), leave runs;
//     scale 0 → no claim, no Node, every host Available with its units
//     disabled, and the hosts' lastPhase names the failed verify;
//   - the device requirement dropped, scale 1 → verify passes, the claim
//     registers (after verify), status.verify Passed; scale 0.
func verifyGate(w *world, _ *state) {
	ctx := context.Background()
	w.mustKubectl("patch", "sshjoinprofile", verifyProfile, "--type=merge",
		"--patch-file", filepath.Join(w.repo, "examples/scripts/verify-kubelet-healthz.patch.yaml"))
	w.mustKubectl("patch", "sshnodeclass", "pool", "--type=merge", "-p",
		`{"spec":{"joinProfileRef":{"name":"`+verifyProfile+`"},"vars":{"verifyDevices":"/dev/kpssh-e2e-gpu0"}}}`)
	defer func() {
		w.mustKubectl("patch", "sshjoinprofile", verifyProfile, "--type=merge", "-p", `{"spec":{"scripts":{"verify":null},"timeouts":{"install":"10m"}}}`)
		w.mustKubectl("patch", "sshnodeclass", "pool", "--type=merge", "-p",
			`{"spec":{"joinProfileRef":{"name":"`+w.profile+`"},"vars":{"verifyDevices":null}}}`)
	}()
	w.classReady()

	// Failing: watch every claim and Node until a verify failure has ended
	// a claim, then scale down and let everything settle.
	start := time.Now()
	w.scale(1)
	seen := map[string]bool{} // NodeClaims
	held := false             // a claim's Node seen (its kubelet joined), unregistered
	pending := false          // Registered Unknown, RegistrationHookPending: kpssh-verify seen
	var failedAt time.Duration
	w.eventually("a NodeClaim ended by a failed verify", 8*time.Minute, func() (bool, string) {
		for _, c := range w.nodeClaims() {
			seen[c.Name] = true
			r := c.StatusConditions().Get(karpv1.ConditionTypeRegistered)
			if r != nil && r.IsTrue() {
				w.t.Fatalf("NodeClaim %s registered although verify fails: %+v", c.Name, r)
			}
			held = held || w.unregisteredNode(c)
			pending = pending || (r != nil && r.Reason == "RegistrationHookPending" && strings.Contains(r.Message, "kpssh-verify"))
		}
		w.noRegisteredNode()
		events := w.verifyFailedEvents()
		return len(events) > 0, fmt.Sprintf("%d NodeClaims seen, no VerifyFailed event yet; hosts %s", len(seen), hostsLastPhases(w.sshHosts()))
	})
	failedAt = time.Since(start)
	w.scale(0)
	settle := time.Now()
	w.eventually("failing verify: no claim, no Node, hosts Available", 6*time.Minute, func() (bool, string) {
		for _, c := range w.nodeClaims() {
			seen[c.Name] = true
			if r := c.StatusConditions().Get(karpv1.ConditionTypeRegistered); r != nil && r.IsTrue() {
				w.t.Fatalf("NodeClaim %s registered although verify fails", c.Name)
			}
		}
		w.noRegisteredNode()
		if n := len(w.nodeClaims()); n > 0 {
			return false, fmt.Sprintf("%d NodeClaims", n)
		}
		if n := len(w.nodes()); n > 0 {
			return false, fmt.Sprintf("%d Nodes", n)
		}
		return w.allHosts(v1beta1.HostAvailable)
	})
	w.allLeft("failing verify: everything left") // units disabled on every host, no token
	if !held {
		w.t.Errorf("no claim's Node was seen before its claim ended (the kubelet joins, the Node waits with %s while verify runs)", karpv1.UnregisteredTaintKey)
	}
	events := w.verifyFailedEvents()
	if len(events) == 0 {
		w.t.Fatal("no VerifyFailed event left")
	}
	var failedHosts []string
	for _, h := range w.sshHosts() {
		lp := h.Status.LastPhase
		if lp == nil || lp.Phase != v1beta1.PhaseVerify {
			continue
		}
		if lp.Result != v1beta1.PhaseFailed || lp.FailedTask != "kpssh: verify script" || !strings.Contains(lp.Message, "expected devices missing: /dev/kpssh-e2e-gpu0") {
			w.t.Errorf("host %s: last phase %+v, want the failed verify script naming the missing device", h.Name, lp)
		}
		failedHosts = append(failedHosts, h.Name)
	}
	if len(failedHosts) == 0 {
		w.t.Errorf("no host's last phase is the failed verify: %s", hostsLastPhases(w.sshHosts()))
	}
	w.t.Logf("failing verify: %d NodeClaims, none registered (RegistrationHookPending kpssh-verify seen: %v), %d VerifyFailed events (%s), the first %s after scale 1; settled %s after scale 0; hosts with the failed verify last: %s",
		len(seen), pending, len(events), events[0], failedAt.Round(100*time.Millisecond), time.Since(settle).Round(100*time.Millisecond), strings.Join(failedHosts, " "))

	// Passing.
	w.mustKubectl("patch", "sshnodeclass", "pool", "--type=merge", "-p", `{"spec":{"vars":{"verifyDevices":null}}}`)
	start = time.Now()
	w.scale(1)
	host, claim := w.joined("")
	joinedIn := time.Since(start)
	v := host.Status.Verify
	if v == nil || v.Result != v1beta1.VerifyPassed || v.ClaimUID != claim.UID {
		w.t.Fatalf("host %s: status.verify %+v, want Passed for claim %s", host.Name, v, claim.UID)
	}
	if lp := host.Status.LastPhase; lp == nil || lp.Phase != v1beta1.PhaseVerify || lp.Result != v1beta1.PhaseSucceeded {
		w.t.Errorf("host %s: last phase %+v, want the verify that passed", host.Name, lp)
	}
	reg := claim.StatusConditions().Get(karpv1.ConditionTypeRegistered)
	if reg == nil || !reg.IsTrue() || reg.LastTransitionTime.Time.Before(v.At.Time.Add(-time.Second)) {
		w.t.Errorf("Registered %+v, verify passed at %v: registration must follow verify", reg, v.At)
	}
	node := &corev1.Node{}
	if err := w.kube.Get(ctx, client.ObjectKey{Name: host.Name}, node); err != nil {
		w.t.Fatal(err)
	}
	if node.Labels[karpv1.NodeRegisteredLabelKey] != "true" || hasTaint(node, karpv1.UnregisteredTaintKey) {
		w.t.Errorf("Node %s after a passed verify: labels %v taints %v", node.Name, node.Labels, node.Spec.Taints)
	}
	w.t.Logf("passing verify: joined and registered %s after scale 1 (%s); verify %+v", joinedIn.Round(100*time.Millisecond), timeline(claim), v)
	w.scale(0)
	w.allLeft("passing verify: everything left")
}

// classReady waits for the pool's node class to be Ready (a profile change
// is checked by the node class controller first).
func (w *world) classReady() {
	w.t.Helper()
	w.eventually("node class pool Ready", time.Minute, func() (bool, string) {
		nc := &v1beta1.SSHNodeClass{}
		if err := w.kube.Get(context.Background(), client.ObjectKey{Name: "pool"}, nc); err != nil {
			return false, err.Error()
		}
		c := nc.StatusConditions().Get(v1beta1.ConditionReady)
		return c != nil && c.IsTrue() && c.ObservedGeneration == nc.Generation, fmt.Sprintf("%+v", c)
	})
}

// unregisteredNode reports whether claim c's Node exists and still carries
// Karpenter's unregistered taint (the kubelet joined; the hook holds it).
func (w *world) unregisteredNode(c karpv1.NodeClaim) bool {
	for _, n := range w.nodes() {
		if c.Status.ProviderID != "" && n.Spec.ProviderID == c.Status.ProviderID && hasTaint(&n, karpv1.UnregisteredTaintKey) {
			return true
		}
	}
	return false
}

// noRegisteredNode fails the test on a Node Karpenter marked registered.
func (w *world) noRegisteredNode() {
	w.t.Helper()
	for _, n := range w.nodes() {
		if n.Labels[karpv1.NodeRegisteredLabelKey] == "true" {
			w.t.Fatalf("Node %s is registered although verify fails: labels %v", n.Name, n.Labels)
		}
	}
}

// verifyFailedEvents lists the VerifyFailed events (NodeClaims are
// cluster-scoped: their events are in default) as "claim: message".
func (w *world) verifyFailedEvents() []string {
	w.t.Helper()
	l := &corev1.EventList{}
	if err := w.kube.List(context.Background(), l); err != nil {
		w.t.Fatal(err)
	}
	var out []string
	for _, e := range l.Items {
		if e.Reason == "VerifyFailed" && e.InvolvedObject.Kind == "NodeClaim" {
			out = append(out, e.InvolvedObject.Name+": "+e.Message)
		}
	}
	sort.Strings(out)
	return out
}

func hasTaint(n *corev1.Node, key string) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == key {
			return true
		}
	}
	return false
}

func hostsLastPhases(hs []v1beta1.SSHHost) string {
	var s []string
	for _, h := range hs {
		lp := "-"
		if h.Status.LastPhase != nil {
			lp = string(h.Status.LastPhase.Phase) + "/" + string(h.Status.LastPhase.Result)
		}
		s = append(s, fmt.Sprintf("%s=%s(%s)", h.Name, h.Status.State, lp))
	}
	return strings.Join(s, " ")
}
