//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	karpcp "sigs.k8s.io/karpenter/pkg/cloudprovider"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/cloudprovider"
	"github.com/dklesev/kpssh/test/hostenv"
)

const (
	unitsJoined = "kubelet=enabled/active containerd=enabled/active"
	unitsLeft   = "kubelet=disabled/inactive containerd=disabled/inactive"
)

// state carried from one scenario to the next (they share one world).
type state struct {
	host string    // the host ScaleUp joined
	jobs *jobWorld // JobExec's executor-job setup, kept for CrashResumeRoles
}

// scenario is one step of a world's sequence.
type scenario struct {
	name string
	run  func(*world, *state)
}

// TestE2E and TestE2ERoles each run their scenarios in order in a world of
// their own, side by side (t.Parallel: most of a scenario is waiting on
// Karpenter's and the kubelets' clocks, and one sequence of all of them
// outgrew the package's timeout). Within a world each scenario starts from
// the state the previous one left (all hosts Available, nothing joined), so
// a failure stops the rest of that world's sequence.
func TestE2E(t *testing.T) {
	t.Parallel()
	runWorld(t, []scenario{
		{"ScaleUp", scaleUp},
		{"RebootInPlace", rebootInPlace}, // rebootinplace_test.go
		{"Consolidation", consolidation},
		{"Reboot", reboot},
		{"ZombieGuard", zombieGuard},
		{"PowerOutage", powerOutage},
		{"Maintenance", maintenance},
		{"PriceConsolidation", priceConsolidation}, // classes_test.go
		{"Drift", drift},
		{"Adopt", adopt},           // adopt_test.go
		{"FullPool", fullPool},     // pools_test.go
		{"StaticPool", staticPool}, // pools_test.go
		{"Verify", verifyGate},     // verify_test.go
		{"CrashResume", crashResume},
		{"Metrics", metrics}, // last: reads what the others left in Prometheus
	})
}

// TestE2ERoles: the scenarios of the role path, the Job executor and
// content, in a second world.
func TestE2ERoles(t *testing.T) {
	t.Parallel()
	runWorld(t, []scenario{
		{"HostDrift", hostDrift}, // hostdrift_test.go
		{"RoleProfile", roleProfile},
		{"Releases", releases},
		{"Verified", verified},
		{"ContentRole", contentRole},           // content_test.go
		{"JobExec", jobExec},                   // jobexec_test.go
		{"CrashResumeRoles", crashResumeRoles}, // crashroles_test.go: on JobExec's setup when both run
		{"HA", highAvailability},               // ha_test.go
		{"Coexistence", coexistence},           // coexist_test.go
		{"ControllerPod", controllerPod},       // controllerpod_test.go
	})
}

// runWorld brings a world up (only when one of its scenarios is selected)
// and runs the scenarios in order.
func runWorld(t *testing.T, scenarios []scenario) {
	if !slices.ContainsFunc(scenarios, func(sc scenario) bool { return selected(sc.name) }) {
		t.Skip("no scenario of this world selected by KPSSH_E2E_ONLY")
	}
	w := newWorld(t)
	st := &state{}
	failed := ""
	for _, sc := range scenarios {
		if !selected(sc.name) {
			continue
		}
		if !runs(sc.name) {
			t.Run(sc.name, func(t *testing.T) {
				t.Skipf("known broken, run it with KPSSH_E2E_ONLY=%s: %s", sc.name, brokenScenarios[sc.name])
			})
			continue
		}
		t.Run(sc.name, func(t *testing.T) {
			if failed != "" {
				t.Fatalf("not run: scenario %s failed and the scenarios share state", failed)
			}
			start := time.Now()
			defer func() { t.Logf("scenario %s: %v", sc.name, time.Since(start).Round(100*time.Millisecond)) }()
			sc.run(w.withT(t), st)
		})
		if t.Failed() && failed == "" {
			failed = sc.name
		}
	}
}

// brokenScenarios are out of the default sequence, each with why (the
// issue tracker has it too): a listed scenario runs only when
// KPSSH_E2E_ONLY names it, or in sequence with KPSSH_E2E_BROKEN=1.
// None now: CrashResumeRoles joined the sequence once the chains started
// from allLeft and Create waited for a host's previous Node to be gone.
var brokenScenarios = map[string]string{}

// runs: scenario name runs in this test run (selected, and not skipped as
// known broken). A scenario that hands its state to the next asks this, not
// selected: JobExec once kept its Job executor and its joined host for a
// CrashResumeRoles that was skipped, and HA and Coexistence after it found
// a host already joined and a leave Job that could not run (three CI runs).
func runs(name string) bool {
	_, broken := brokenScenarios[name]
	return selected(name) && (!broken || os.Getenv("KPSSH_E2E_ONLY") != "" || os.Getenv("KPSSH_E2E_BROKEN") != "")
}

func (w *world) withT(t *testing.T) *world {
	c := *w
	c.t = t
	c.hosts = w.hosts.WithT(t)
	return &c
}

// joined waits for one NodeClaim whose host is InUse with a Ready Node
// carrying the host's providerID and the workload pod Running on it; it
// returns the host and logs the claim's timeline.
func (w *world) joined(exclude string) (*v1beta1.SSHHost, *karpv1.NodeClaim) {
	w.t.Helper()
	return w.joinedAs(exclude, "", staticProviderID)
}

// nodePressure names the node's pressure conditions that are True
// (DiskPressure: its host's disk is short of the kubelet's eviction
// thresholds), or "".
func nodePressure(n *corev1.Node) string {
	var out []string
	for _, c := range n.Status.Conditions {
		switch c.Type {
		case corev1.NodeDiskPressure, corev1.NodeMemoryPressure, corev1.NodePIDPressure:
			if c.Status == corev1.ConditionTrue {
				out = append(out, string(c.Type)+" ("+c.Message+")")
			}
		}
	}
	return strings.Join(out, ", ")
}

// staticProviderID is the providerID a host's Node has under
// providerIDSource Static.
func staticProviderID(h *v1beta1.SSHHost) string { return "kpssh://" + poolNS + "/" + h.Name }

// joinedExcept is joined, the claim of host keep (joined throughout) aside.
func (w *world) joinedExcept(exclude, keep string) (*v1beta1.SSHHost, *karpv1.NodeClaim) {
	w.t.Helper()
	return w.joinedAs(exclude, keep, staticProviderID)
}

// joinedAs is joined with the claim of host keep aside and the providerID
// the host's Node must have (providerIDSource Adopt: the one its kubelet
// reports).
func (w *world) joinedAs(exclude, keep string, providerID func(*v1beta1.SSHHost) string) (*v1beta1.SSHHost, *karpv1.NodeClaim) {
	w.t.Helper()
	ctx := context.Background()
	var host *v1beta1.SSHHost
	var claim *karpv1.NodeClaim
	w.eventually("a host joined as a Ready node running the pod", 6*time.Minute, func() (bool, string) {
		keepClaim := ""
		if keep != "" {
			if h := w.sshHost(keep); h.Status.ClaimRef != nil {
				keepClaim = h.Status.ClaimRef.Name
			}
		}
		claims := w.nodeClaims()
		var live []karpv1.NodeClaim
		for _, c := range claims {
			// another provider's claims coexist (Coexistence)
			if c.DeletionTimestamp == nil && ownClaim(&c) && c.Name != keepClaim {
				live = append(live, c)
			}
		}
		if len(live) != 1 {
			return false, fmt.Sprintf("%d live NodeClaims", len(live))
		}
		claim = &live[0]
		var inUse []v1beta1.SSHHost
		var s []string
		for _, h := range w.sshHosts() {
			s = append(s, h.Name+"="+string(h.Status.State))
			if h.Status.ClaimRef != nil && h.Status.ClaimRef.Name == claim.Name {
				inUse = append(inUse, h)
			}
		}
		if len(inUse) != 1 {
			return false, fmt.Sprintf("claim %s held by %d hosts (%s)", claim.Name, len(inUse), strings.Join(s, " "))
		}
		host = &inUse[0]
		if host.Name == exclude {
			return false, "claim landed on excluded host " + exclude
		}
		if host.Status.State != v1beta1.HostInUse {
			return false, fmt.Sprintf("host %s is %s (last phase %+v)", host.Name, host.Status.State, host.Status.LastPhase)
		}
		want := providerID(host)
		if claim.Status.ProviderID != want || host.Status.ProviderID != want {
			return false, fmt.Sprintf("providerID claim=%q host=%q, want %q", claim.Status.ProviderID, host.Status.ProviderID, want)
		}
		node := &corev1.Node{}
		if err := w.kube.Get(ctx, client.ObjectKey{Name: host.Name}, node); err != nil {
			return false, "node: " + err.Error()
		}
		if node.Spec.ProviderID != want || !nodeReady(node) {
			return false, fmt.Sprintf("node %s providerID=%q ready=%v", node.Name, node.Spec.ProviderID, nodeReady(node))
		}
		if p := nodePressure(node); p != "" {
			// its kubelet evicts the pod: say so rather than "no Running pod"
			return false, fmt.Sprintf("node %s reports %s", node.Name, p)
		}
		pods := &corev1.PodList{}
		if err := w.kube.List(ctx, pods, client.InNamespace("default"), client.MatchingLabels{"app": "pause"}); err != nil {
			return false, err.Error()
		}
		for _, p := range pods.Items {
			if p.Spec.NodeName == host.Name && p.Status.Phase == corev1.PodRunning {
				return true, ""
			}
		}
		return false, fmt.Sprintf("no Running pause pod on %s yet (%d pods)", host.Name, len(pods.Items))
	})
	w.t.Logf("joined %s: %s", host.Name, timeline(claim))
	w.checkNodeAddress(host.Name)
	return host, claim
}

// checkNodeAddress: the Node of host name has the host's IP as its
// InternalIP, also when its SSHHost gives a DNS name (hostLogin's h2: the
// kubelet's --node-ip is the IP the probe learned, never the name).
func (w *world) checkNodeAddress(name string) {
	w.t.Helper()
	want := w.hosts.Host(w.hostIndex(name)).Address
	node := &corev1.Node{}
	if err := w.kube.Get(context.Background(), client.ObjectKey{Name: name}, node); err != nil {
		w.t.Errorf("node %s: %v", name, err)
		return
	}
	var ips []string
	for _, a := range node.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			ips = append(ips, a.Address)
		}
	}
	if len(ips) != 1 || ips[0] != want {
		w.t.Errorf("node %s (SSHHost address %s): InternalIP %v, want [%s]", name, w.sshHost(name).Spec.Address, ips, want)
	}
}

// checkLogins: the pool reached each host the way hostLogin says: h1 with
// its ed25519 key pinned (the fingerprint the controller pinned is that
// key's, though the host serves rsa and ecdsa keys too), h3 as AltUser
// becoming root through sudo (sshd and sudo log it on the host).
func (w *world) checkLogins() {
	w.t.Helper()
	h1 := w.hosts.Host(0)
	if got := w.sshHost(h1.Name).Status.HostKeyFingerprint; got != h1.Fingerprint {
		w.t.Errorf("%s pinned %q, want its ed25519 key's %s (knownHost)", h1.Name, got, h1.Fingerprint)
	}
	h3 := w.hosts.Host(2)
	out := w.hosts.MustRun(2, fmt.Sprintf(`echo "ssh=$(journalctl --no-pager -o cat _COMM=sshd | grep -c 'Accepted publickey for %[1]s ')"
echo "sudo=$(journalctl --no-pager -o cat _COMM=sudo | grep -c '^ *%[1]s : .*USER=root ')"`, h3.AltUser))
	if strings.Contains(out, "ssh=0") || strings.Contains(out, "sudo=0") {
		w.t.Errorf("%s: no login of %s or no sudo of it to root in the journal (%q): the phases did not run as %s@:%d through sudo",
			h3.Name, h3.AltUser, strings.ReplaceAll(out, "\n", " "), h3.AltUser, h3.AltPort)
	}
}

// timeline is a NodeClaim's lifecycle relative to its creation (API
// timestamps have one-second resolution).
func timeline(c *karpv1.NodeClaim) string {
	t0 := c.CreationTimestamp.Time
	var parts []string
	for _, ct := range []string{karpv1.ConditionTypeLaunched, karpv1.ConditionTypeRegistered, karpv1.ConditionTypeInitialized} {
		if cond := c.StatusConditions().Get(ct); cond != nil && cond.IsTrue() {
			parts = append(parts, fmt.Sprintf("%s +%v", ct, cond.LastTransitionTime.Sub(t0)))
		}
	}
	return "created → " + strings.Join(parts, ", ")
}

// leftAvailable: host h is back in the pool after a leave that succeeded
// (Available, no claim, last phase a succeeded leave).
func leftAvailable(h *v1beta1.SSHHost) bool {
	lp := h.Status.LastPhase
	return h.Status.State == v1beta1.HostAvailable && h.Status.ClaimRef == nil && lp != nil && lp.Phase == v1beta1.PhaseLeave && lp.Result == v1beta1.PhaseSucceeded
}

// gone waits until no NodeClaim and no Node is left and every host is
// Available with kubelet and containerd disabled and no token Secret left.
func (w *world) allLeft(what string) { w.t.Helper(); w.allLeftBut(what, "") }

// allLeftBut is allLeft with host keep (and its claim and Node) joined
// throughout.
func (w *world) allLeftBut(what, keep string) {
	w.t.Helper()
	w.eventually(what, 5*time.Minute, func() (bool, string) {
		keepClaim := ""
		var s []string
		ok := true
		for _, h := range w.sshHosts() {
			s = append(s, fmt.Sprintf("%s=%s%s", h.Name, h.Status.State, errSuffix(h.Status.LastProbeError)))
			if h.Name == keep {
				if h.Status.ClaimRef != nil {
					keepClaim = h.Status.ClaimRef.Name
				}
				continue
			}
			ok = ok && h.Status.State == v1beta1.HostAvailable
		}
		for _, c := range w.nodeClaims() {
			if c.Name != keepClaim {
				return false, "NodeClaim left: " + w.describeClaim(&c)
			}
		}
		for _, n := range w.nodes() {
			if n.Name != keep {
				return false, "Node " + n.Name + " left"
			}
		}
		return ok && len(s) == 3, strings.Join(s, " ")
	})
	for i, h := range w.hosts.Hosts() {
		if h.Name == keep {
			continue
		}
		// never installed: is-enabled prints nothing on bookworm, not-found on trixie
		if u := w.units(i); u != unitsLeft && u != "kubelet=/inactive containerd=/inactive" && u != "kubelet=not-found/inactive containerd=not-found/inactive" {
			diag, _, _ := w.hosts.Run(i, "ls -l /etc/systemd/system/multi-user.target.wants/; journalctl --no-pager -n 60 -u containerd -u kubelet -o short-precise; journalctl --no-pager -n 40 _COMM=systemctl -o short-precise")
			evs, _ := w.kubectl("-n", poolNS, "get", "events", "-o", "custom-columns=OBJ:.involvedObject.name,REASON:.reason,MSG:.message")
			w.t.Errorf("host %d: units %q, want %q (or never installed); last phase %+v\nevents:\n%s\n%s", i, u, unitsLeft, w.sshHost(h.Name).Status.LastPhase, evs, diag)
		}
	}
	w.eventually("no bootstrap-token Secret left", time.Minute, func() (bool, string) {
		tk := w.tokens()
		return len(tk) == 0, strings.Join(tk, " ")
	})
}

// describeClaim says why a NodeClaim may still be there: deleting or not,
// its disruption conditions, its Node's taints and the pods on it.
func (w *world) describeClaim(c *karpv1.NodeClaim) string {
	w.t.Helper()
	s := c.Name
	if c.DeletionTimestamp != nil {
		s += fmt.Sprintf(" deleting since %s (finalizers %v)", c.DeletionTimestamp.Format(time.TimeOnly), c.Finalizers)
	}
	for _, t := range []string{karpv1.ConditionTypeInitialized, karpv1.ConditionTypeConsolidatable, karpv1.ConditionTypeDrifted, karpv1.ConditionTypeDisruptionReason} {
		if cond := c.StatusConditions().Get(t); cond != nil {
			s += fmt.Sprintf(" %s=%s", t, cond.Status)
			if cond.Reason != "" && cond.Reason != t {
				s += "(" + cond.Reason + ")"
			}
		}
	}
	if c.Status.NodeName == "" {
		return s + " (no node)"
	}
	node := &corev1.Node{}
	if err := w.kube.Get(context.Background(), types.NamespacedName{Name: c.Status.NodeName}, node); err != nil {
		return s + fmt.Sprintf(" node %s: %v", c.Status.NodeName, err)
	}
	var taints []string
	for _, t := range node.Spec.Taints {
		taints = append(taints, t.Key+":"+string(t.Effect))
	}
	s += fmt.Sprintf(" node %s ready=%v deleting=%v taints=%v", node.Name, nodeReady(node), node.DeletionTimestamp != nil, taints)
	pods := &corev1.PodList{}
	if err := w.kube.List(context.Background(), pods, client.MatchingFields{"spec.nodeName": node.Name}); err != nil {
		return s + fmt.Sprintf(" pods: %v", err)
	}
	for _, p := range pods.Items {
		s += fmt.Sprintf(" pod %s/%s %s", p.Namespace, p.Name, p.Status.Phase)
		if p.DeletionTimestamp != nil {
			s += " deleting"
		}
	}
	return s
}

func scaleUp(w *world, st *state) {
	w.scale(1)
	host, claim := w.joined("")
	st.host = host.Name
	i := w.hostIndex(host.Name)
	if u := w.units(i); u != unitsJoined {
		w.t.Errorf("units on %s: %q, want %q", host.Name, u, unitsJoined)
	}
	if host.Status.InstalledProfile != w.profile+"@1" {
		w.t.Errorf("installedProfile %q", host.Status.InstalledProfile)
	}
	// The kubelet's client certificate came from the CSR the bootstrap token signed.
	if out := w.mustKubectl("get", "csr", "-o", "jsonpath={range .items[*]}{.spec.username} {.status.conditions[*].type}{\"\\n\"}{end}"); !strings.Contains(out, "system:bootstrap:") || !strings.Contains(out, "Approved") {
		w.t.Errorf("no approved bootstrap CSR: %q", out)
	}
	// Token collected once the Node registered.
	w.eventually("the join's bootstrap token deleted", time.Minute, func() (bool, string) {
		tk := w.tokens()
		return len(tk) == 0, strings.Join(tk, " ")
	})
	if c := claim.StatusConditions().Get(karpv1.ConditionTypeInitialized); c == nil || !c.IsTrue() {
		w.t.Logf("note: NodeClaim not Initialized yet: %+v", c)
	}
}

func consolidation(w *world, st *state) {
	w.scale(0)
	w.allLeft("consolidation: claim, node gone; hosts Available")
	h := w.sshHost(st.host)
	if h.Status.InstalledProfile != w.profile+"@1" {
		w.t.Errorf("warm pool: installedProfile %q after leave, want it kept", h.Status.InstalledProfile)
	}
	if h.Status.LastPhase == nil || h.Status.LastPhase.Phase != v1beta1.PhaseLeave || h.Status.LastPhase.Result != v1beta1.PhaseSucceeded {
		w.t.Errorf("last phase %+v, want a succeeded leave", h.Status.LastPhase)
	}
}

func reboot(w *world, st *state) {
	i := w.hostIndex(st.host)
	w.hosts.Reboot(i)
	// A rebooted host stays out: no Node shows up for 90 s.
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		if n := w.nodes(); len(n) > 0 {
			w.t.Fatalf("a Node appeared after the reboot: %s", n[0].Name)
		}
		time.Sleep(time.Second)
	}
	if u := w.units(i); u != unitsLeft {
		w.t.Errorf("units after reboot: %q, want %q", u, unitsLeft)
	}
	w.eventually(st.host+" Available after the reboot", 2*time.Minute, func() (bool, string) {
		h := w.sshHost(st.host)
		return h.Status.State == v1beta1.HostAvailable, string(h.Status.State) + errSuffix(h.Status.LastProbeError)
	})
}

// zombieGuard: a NodeClaim vanishes without Delete (finalizers stripped
// while the controller is down, so nothing re-adds them): the host's claim
// is stale, the probe finds a kubelet running on an unclaimed host of ours,
// runs leave and deletes the Node.
func zombieGuard(w *world, st *state) {
	ctx := context.Background()
	w.scale(1)
	host, claim := w.joined("")
	// Warm rejoin: the install cache hit, no install phase ran.
	if host.Status.LastPhase == nil || host.Status.LastPhase.Phase != v1beta1.PhaseJoin {
		w.t.Errorf("rejoin of %s: last phase %+v, want join", host.Name, host.Status.LastPhase)
	}
	w.scale(0)
	w.ctrl.stop()
	patch := client.RawPatch("application/merge-patch+json", []byte(`{"metadata":{"finalizers":null}}`))
	if err := w.kube.Patch(ctx, claim, patch); err != nil {
		w.t.Fatal(err)
	}
	if err := w.kube.Delete(ctx, claim); client.IgnoreNotFound(err) != nil {
		w.t.Fatal(err)
	}
	if u := w.units(w.hostIndex(host.Name)); u != unitsJoined {
		w.t.Fatalf("zombie setup: units %q, want the kubelet still running", u)
	}
	w.ctrl.start()
	w.allLeft("zombie guard: node deleted, host Available")
	evs := w.mustKubectl("-n", poolNS, "get", "events", "--field-selector", "involvedObject.name="+host.Name, "-o", "jsonpath={.items[*].reason}")
	if !strings.Contains(evs, "ZombieKubelet") || !strings.Contains(evs, "ZombieLeft") {
		all, _ := w.kubectl("-n", poolNS, "get", "events", "-o", "custom-columns=OBJ:.involvedObject.name,REASON:.reason,MSG:.message")
		w.t.Errorf("events of %s: %q, want ZombieKubelet and ZombieLeft\n%s", host.Name, evs, all)
	}
}

// maintenance: the seed's four steps, verbatim, with kubectl.
func maintenance(w *world, st *state) {
	w.scale(1)
	host, _ := w.joined("")
	name := host.Name
	// 1. park the host
	w.mustKubectl("-n", poolNS, "annotate", "sshhost", name, "karpenter.dklesev.github.io/maintenance=true")
	// 2. evict it through karpenter (drain + leave)
	claim := w.mustKubectl("-n", poolNS, "get", "sshhost", name, "-o", "jsonpath={.status.claimRef.name}")
	if claim == "" {
		w.t.Fatalf("%s has no claimRef while joined", name)
	}
	w.mustKubectl("delete", "nodeclaim", claim, "--timeout=5m")
	// 3. the host lands in Maintenance and stays there; the workload moves
	// to another host.
	w.eventually(name+" in Maintenance", 3*time.Minute, func() (bool, string) {
		h := w.sshHost(name)
		return h.Status.State == v1beta1.HostMaintenance, string(h.Status.State)
	})
	other, _ := w.joined(name)
	if u := w.units(w.hostIndex(name)); u != unitsLeft {
		w.t.Errorf("units on the parked host: %q, want %q", u, unitsLeft)
	}
	probed := w.sshHost(name).Status.LastProbeTime
	time.Sleep(10 * time.Second) // > 3 probe intervals: a parked host is not probed
	h := w.sshHost(name)
	if h.Status.State != v1beta1.HostMaintenance || (probed != nil && h.Status.LastProbeTime != nil && !h.Status.LastProbeTime.Equal(probed)) {
		w.t.Errorf("parked host: state %s, lastProbeTime %v → %v", h.Status.State, probed, h.Status.LastProbeTime)
	}
	w.t.Logf("workload moved from %s to %s", name, other.Name)
	// 4. hand it back
	w.mustKubectl("-n", poolNS, "annotate", "sshhost", name, "karpenter.dklesev.github.io/maintenance-")
	w.scale(0)
	w.allLeft("maintenance over: everything Available")
}

// drift: bumping the profile's version drifts the node (ProfileDrift);
// Karpenter replaces it: a new claim runs install again (new version), the
// old node leaves. Then a var of the node class is edited: the replacement,
// stamped with the node class's hash, drifts (NodeClassDrift) and is
// replaced in turn by a claim stamped with the new hash.
func drift(w *world, st *state) {
	w.scale(1)
	old, oldClaim := w.joined("")
	w.mustKubectl("patch", "sshjoinprofile", w.profile, "--type=merge", "-p", `{"spec":{"version":"2"}}`)
	w.replacedForDrift(oldClaim, cloudprovider.ProfileDrift)
	host, claim := w.joined("")
	if host.Status.InstalledProfile != w.profile+"@2" {
		w.t.Errorf("replacement %s: installedProfile %q, want %s@2 (install ran again)", host.Name, host.Status.InstalledProfile, w.profile)
	}
	if host.Name != old.Name {
		if u := w.units(w.hostIndex(old.Name)); u != unitsLeft {
			w.t.Errorf("drifted host %s: units %q, want %q", old.Name, u, unitsLeft)
		}
	}
	w.t.Logf("drifted %s replaced by %s", old.Name, host.Name)
	nodeClassDrift(w, claim)
	w.scale(0)
	w.allLeft("drift done: everything Available")
	w.mustKubectl("patch", "sshnodeclass", "pool", "--type=merge", "-p", `{"spec":{"vars":{"e2eDrift":null}}}`)
}

// nodeClassDrift: the joined claim carries the node class's hash (stamped
// at launch, kept through every status write Karpenter made since:
// Launched, Registered, Initialized, …); a var added to the node class
// changes the hash → Drifted, reason NodeClassDrift, the stamp still the
// old one → replaced (a warm join where the host is installed) by a claim
// whose stamp is the new hash, still there once Karpenter has written its
// Consolidatable condition. The caller removes the var once nothing is
// joined (removing it sooner drifts the replacement).
func nodeClassDrift(w *world, claim *karpv1.NodeClaim) {
	ctx := context.Background()
	hash := func() string {
		nc := &v1beta1.SSHNodeClass{}
		if err := w.kube.Get(ctx, client.ObjectKey{Name: "pool"}, nc); err != nil {
			w.t.Fatal(err)
		}
		return cloudprovider.NodeClassHash(nc)
	}
	stamp := func(c *karpv1.NodeClaim) string {
		return c.Annotations[v1beta1.AnnotationNodeClassHash] + "/" + c.Annotations[v1beta1.AnnotationNodeClassHashVersion]
	}
	before := hash()
	if err := w.kube.Get(ctx, client.ObjectKeyFromObject(claim), claim); err != nil {
		w.t.Fatal(err)
	}
	if got, want := stamp(claim), before+"/"+cloudprovider.NodeClassHashVersion; got != want {
		w.t.Fatalf("claim %s stamped %q, want the node class's %q", claim.Name, got, want)
	}
	w.mustKubectl("patch", "sshnodeclass", "pool", "--type=merge", "-p", `{"spec":{"vars":{"e2eDrift":"1"}}}`)
	after := hash()
	if after == before {
		w.t.Fatalf("node class hash %s unchanged by a var", after)
	}
	drifted := w.replacedForDrift(claim, cloudprovider.NodeClassDrift)
	if drifted != nil && stamp(drifted) != before+"/"+cloudprovider.NodeClassHashVersion {
		w.t.Errorf("Drifted claim %s stamped %q, want the hash it launched with %s", drifted.Name, stamp(drifted), before)
	}
	host, repl := w.joined("")
	w.eventually("replacement "+repl.Name+" Initialized and Consolidatable (Karpenter's status writes)", 2*time.Minute, func() (bool, string) {
		if err := w.kube.Get(ctx, client.ObjectKeyFromObject(repl), repl); err != nil {
			return false, err.Error()
		}
		i, c := repl.StatusConditions().Get(karpv1.ConditionTypeInitialized), repl.StatusConditions().Get(karpv1.ConditionTypeConsolidatable)
		return i.IsTrue() && c.IsTrue(), fmt.Sprintf("Initialized %v, Consolidatable %v", i, c)
	})
	if got, want := stamp(repl), after+"/"+cloudprovider.NodeClassHashVersion; got != want {
		w.t.Errorf("replacement %s stamped %q after Karpenter's writes, want the node class's current %q", repl.Name, got, want)
	}
	if d := repl.StatusConditions().Get(karpv1.ConditionTypeDrifted); d.IsTrue() {
		w.t.Errorf("replacement %s Drifted: %s", repl.Name, d.Reason)
	}
	w.t.Logf("NodeClassDrift: %s replaced by %s on %s (hash %s → %s)", claim.Name, repl.Name, host.Name, before, after)
}

// replacedForDrift waits for claim to be Drifted with reason and then gone
// (Karpenter replaced it); it returns the claim as last seen Drifted (nil
// if it was gone before it was seen so).
func (w *world) replacedForDrift(claim *karpv1.NodeClaim, reason karpcp.DriftReason) *karpv1.NodeClaim {
	w.t.Helper()
	ctx := context.Background()
	var seen *karpv1.NodeClaim
	w.eventually("claim "+claim.Name+" Drifted ("+string(reason)+")", 3*time.Minute, func() (bool, string) {
		c := &karpv1.NodeClaim{}
		if err := w.kube.Get(ctx, client.ObjectKeyFromObject(claim), c); err != nil {
			return client.IgnoreNotFound(err) == nil, err.Error() // already replaced
		}
		d := c.StatusConditions().Get(karpv1.ConditionTypeDrifted)
		if d.IsTrue() && d.Reason != string(reason) {
			w.t.Fatalf("claim %s Drifted for %s, want %s", c.Name, d.Reason, reason)
		}
		if d.IsTrue() {
			seen = c
		}
		return d.IsTrue(), fmt.Sprintf("%+v", d)
	})
	w.eventually("replacement joined and claim "+claim.Name+" gone", 8*time.Minute, func() (bool, string) {
		c := &karpv1.NodeClaim{}
		err := w.kube.Get(ctx, client.ObjectKeyFromObject(claim), c)
		if err == nil {
			return false, "old claim still there"
		}
		return client.IgnoreNotFound(err) == nil, err.Error()
	})
	return seen
}

// roleProfile: the node class switches to the shipped role-based profile
// (roles/tls_bootstrap, examples/profile-tls-bootstrap.yaml, same vars): its
// install and join run through the role, and the real kubelet registers with
// the providerID and the unregistered taint the role passed it; its leave
// disables the units.
func roleProfile(w *world, st *state) {
	w.apply(filepath.Join(w.ctrl.dir, "examples/profile-tls-bootstrap.yaml"))
	w.mustKubectl("patch", "sshnodeclass", "pool", "--type=merge", "-p", `{"spec":{"joinProfileRef":{"name":"tls-bootstrap"}}}`)
	w.scale(1)
	host, _ := w.joined("")
	if host.Status.InstalledProfile != "tls-bootstrap@1" {
		w.t.Errorf("installedProfile %q, want tls-bootstrap@1 (install through the role)", host.Status.InstalledProfile)
	}
	i := w.hostIndex(host.Name)
	if u := w.units(i); u != unitsJoined {
		w.t.Errorf("units on %s: %q, want %q", host.Name, u, unitsJoined)
	}
	out, _, err := w.hosts.Run(i, `tr '\0' ' ' </proc/$(pidof kubelet)/cmdline`)
	if err != nil {
		w.t.Fatalf("kubelet command line on %s: %v", host.Name, err)
	}
	for _, want := range []string{"--provider-id=kpssh://" + poolNS + "/" + host.Name, "--register-with-taints=karpenter.sh/unregistered:NoExecute", "--hostname-override=" + host.Name} {
		if !strings.Contains(out, want) {
			w.t.Errorf("kubelet on %s runs without %s: %s", host.Name, want, out)
		}
	}
	w.scale(0)
	w.allLeft("role profile: claim, node gone; hosts Available")
	if h := w.sshHost(host.Name); h.Status.LastPhase == nil || h.Status.LastPhase.Phase != v1beta1.PhaseLeave || h.Status.LastPhase.Result != v1beta1.PhaseSucceeded {
		w.t.Errorf("last phase %+v, want the role's leave succeeded", h.Status.LastPhase)
	}
	// Later scenarios start from the world's own profile.
	w.mustKubectl("patch", "sshnodeclass", "pool", "--type=merge", "-p", `{"spec":{"joinProfileRef":{"name":"`+w.profile+`"}}}`)
}

// releases joins every host of the world — Debian 12 and Debian 13 —
// with the script profile and then with the role profile (scale 3: one
// pause pod per node), checks each is a Ready node with its units up, and
// leaves them all.
func releases(w *world, st *state) {
	defer w.mustKubectl("patch", "sshnodeclass", "pool", "--type=merge", "-p", `{"spec":{"joinProfileRef":{"name":"`+w.profile+`"}}}`)
	w.apply(filepath.Join(w.ctrl.dir, "examples/profile-tls-bootstrap.yaml"))
	hosts := w.hosts.Hosts()
	for _, profile := range []string{w.profile, "tls-bootstrap"} {
		w.mustKubectl("patch", "sshnodeclass", "pool", "--type=merge", "-p", `{"spec":{"joinProfileRef":{"name":"`+profile+`"}}}`)
		start := time.Now()
		w.scale(len(hosts))
		w.eventually(fmt.Sprintf("all %d hosts joined with %s as Ready nodes", len(hosts), profile), 8*time.Minute, func() (bool, string) {
			return w.allJoined(len(hosts), profile+"@")
		})
		joined := map[string][]string{}
		for i, h := range hosts {
			if u := w.units(i); u != unitsJoined {
				w.t.Errorf("%s on %s (%s): units %q, want %q", profile, h.Name, h.Release, u, unitsJoined)
			}
			sh := w.sshHost(h.Name)
			lp := "none"
			if sh.Status.LastPhase != nil {
				lp = fmt.Sprintf("%s %s in %s", sh.Status.LastPhase.Phase, sh.Status.LastPhase.Result, sh.Status.LastPhase.Duration.Duration)
			}
			joined[h.Release] = append(joined[h.Release], h.Name+" ("+lp+")")
		}
		w.t.Logf("%s: all %d hosts Ready %v after the scale: %v", profile, len(hosts), time.Since(start).Round(100*time.Millisecond), joined)
		for _, h := range hosts {
			w.checkNodeAddress(h.Name)
		}
		w.checkLogins()
		for _, rel := range []string{hostenv.Bookworm, hostenv.Trixie} {
			if len(joined[rel]) == 0 {
				w.t.Errorf("%s: no %s host joined (the world must have both releases): %v", profile, rel, joined)
			}
		}
		w.scale(0)
		w.allLeft(profile + " on every release: claims, nodes gone; hosts Available")
	}
}
