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
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/engine"
	"github.com/dklesev/kpssh/internal/profile"
	"github.com/dklesev/kpssh/internal/providers/clusterinfo"
	"github.com/dklesev/kpssh/internal/providers/token"
)

// Where ControllerPod installs the chart, and the mark of the node it
// joins by hand (its label and its NoSchedule taint).
const (
	chartNS   = "kpssh"
	plainMark = "kpssh.test/plain"
)

// controllerPod: the chart as a platform engineer installs it (helm
// install: its RBAC, ServiceAccount, Deployment, Service), its controller
// pod running on a real kubelet kpssh does not manage. That node is a host
// of the world parked and joined by hand (the node class's own profile run
// through the engine from here, with a token minted here): to kpssh it is a
// foreign node, tainted so only the controller (tolerating the taint) and
// no workload goes there. The in-process controller stopped, the pod's
// controller is the only one: it joins a host for the workload, the pod
// stays on the foreign node; with that node cordoned and the pod deleted,
// the new pod stays Pending (the chart's affinity refuses the Ready kpssh
// node: karpenter.dklesev.github.io/managed); uncordoned it runs there
// again and the restarted controller lets the host leave. The pod reaches
// the apiserver at the world's bridge address (host network, extraEnv
// KUBERNETES_SERVICE_HOST/PORT: no kube-proxy serves the kubernetes
// Service here) and the hosts over the bridge.
func controllerPod(w *world, _ *state) {
	ctx := context.Background()
	img := controllerImage(w)
	const pi = 2 // the foreign node's host
	ph := w.hosts.Host(pi)
	w.park(ph.Name, true)
	plain := w.joinByHand(pi)
	defer plain.leave()
	importImage(w, pi, img)
	plain.image = img

	w.ctrl.stop()
	defer func() {
		if w.ctrl.cmd == nil { // the scenario failed before starting it again
			w.ctrl.start()
		}
	}()
	rel := w.installChart(img)
	defer rel.uninstall()
	pod := rel.runningOn(plain.name, "the chart's controller pod Running and Ready on the foreign node "+plain.name)
	w.t.Logf("controller pod %s Running on %s (the only controller now)", pod.Name, pod.Spec.NodeName)

	// The pod's controller joins a host for the workload.
	w.scale(1)
	host, claim := w.joined(ph.Name)
	node := &corev1.Node{}
	if err := w.kube.Get(ctx, client.ObjectKey{Name: host.Name}, node); err != nil {
		w.t.Fatal(err)
	}
	if node.Labels[v1beta1.LabelManaged] == "" {
		w.t.Errorf("node %s joined by the pod's controller has no %s label: %v", node.Name, v1beta1.LabelManaged, node.Labels)
	}
	if logs := rel.logs(pod.Name); !strings.Contains(logs, claim.Name) {
		w.t.Errorf("the controller pod's log never names claim %s: the join was not its own\n%s", claim.Name, tail(logs, 3000))
	}
	if holder := w.leaseHolder(chartNS, "kpssh-leader-election"); holder == "" {
		w.t.Errorf("no holder of the chart's leader-election Lease while its controller joined %s", host.Name)
	}
	if p := rel.pod(); p == nil || p.Name != pod.Name || p.Spec.NodeName != plain.name {
		w.t.Errorf("controller pod after the join: %+v, want %s on %s", p, pod.Name, plain.name)
	}

	// Cordoned foreign node, pod deleted: the one Ready node left is kpssh's,
	// and the replacement pod must never go there.
	w.mustKubectl("cordon", plain.name)
	w.mustKubectl("-n", chartNS, "delete", "pod", pod.Name, "--wait=true", "--timeout=2m")
	var pending *corev1.Pod
	w.eventually("the replacement controller pod Pending, kpssh node "+host.Name+" refused by affinity", 2*time.Minute, func() (bool, string) {
		p := rel.pod()
		if p == nil || p.Name == pod.Name {
			return false, "no replacement pod yet"
		}
		pending = p
		if p.Spec.NodeName != "" {
			w.t.Fatalf("the controller pod %s was scheduled onto %s with the foreign node cordoned (kpssh node %s Ready)", p.Name, p.Spec.NodeName, host.Name)
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				// The foreign node's refusal reads "unschedulable" or, once the
				// node controller has tainted the cordoned node, "untolerated
				// taint": the message of the last attempt is kept.
				return strings.Contains(c.Message, "affinity"), c.Message
			}
		}
		return false, fmt.Sprintf("pod %s on %q, conditions %v", p.Name, p.Spec.NodeName, p.Status.Conditions)
	})
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(time.Second) {
		if p := rel.pod(); p != nil && p.Spec.NodeName != "" {
			w.t.Fatalf("the controller pod %s was scheduled onto %s with the foreign node cordoned (kpssh node %s Ready)", p.Name, p.Spec.NodeName, host.Name)
		}
	}
	w.t.Logf("controller pod %s Pending 20 s with kpssh node %s Ready and %s cordoned", pending.Name, host.Name, plain.name)
	w.mustKubectl("uncordon", plain.name)
	pod = rel.runningOn(plain.name, "the controller pod back on "+plain.name+" once uncordoned")

	// The restarted pod's controller lets the host leave.
	w.scale(0)
	w.eventually(host.Name+" left by the pod's controller", 5*time.Minute, func() (bool, string) {
		h := w.sshHost(host.Name)
		n := 0
		for _, c := range w.nodeClaims() {
			if ownClaim(&c) {
				n++
			}
		}
		return n == 0 && leftAvailable(h), fmt.Sprintf("%d NodeClaims; %s %s, last phase %+v", n, host.Name, h.Status.State, h.Status.LastPhase)
	})
	if u := w.units(w.hostIndex(host.Name)); u != unitsLeft {
		w.t.Errorf("%s after the leave: units %q, want %q", host.Name, u, unitsLeft)
	}
	if logs := rel.logs(pod.Name); !strings.Contains(logs, host.Name) {
		w.t.Errorf("the second controller pod's log never names %s: the leave was not its own\n%s", host.Name, tail(logs, 3000))
	}

	rel.uninstall()
	w.ctrl.start()
	plain.leave()
	w.park(ph.Name, false)
	w.allLeft("the chart uninstalled, the foreign node gone: every host Available")
}

// handJoined is a Node joined outside kpssh: the node class's profile run
// on host i through the engine, as its install and join, under a name no
// SSHHost ties to (no providerID, no host label).
type handJoined struct {
	w    *world
	i    int
	name string
	e    *engine.Local
	conn engine.Connection
	ctx  engine.Context
	prof *v1beta1.SSHJoinProfile
	// image, if set, was imported into the host's containerd: leave
	// removes it first (leave stops containerd).
	image string
	done  bool
}

// joinByHand joins parked host i as Node plain-<host>, labelled and
// tainted plainMark, and waits for it Ready.
func (w *world) joinByHand(i int) *handJoined {
	w.t.Helper()
	ctx := context.Background()
	h := w.hosts.Host(i)
	nc := &v1beta1.SSHNodeClass{}
	if err := w.kube.Get(ctx, client.ObjectKey{Name: "pool"}, nc); err != nil {
		w.t.Fatal(err)
	}
	prof := &v1beta1.SSHJoinProfile{}
	if err := w.kube.Get(ctx, client.ObjectKey{Name: nc.Spec.JoinProfileRef.Name}, prof); err != nil {
		w.t.Fatal(err)
	}
	info, err := clusterinfo.New(w.kube).Get(ctx, nc)
	if err != nil {
		w.t.Fatal(err)
	}
	coll, err := engine.FindCollectionsPath()
	if err != nil {
		w.t.Fatal(err)
	}
	e, err := engine.New(engine.Options{CollectionsPath: coll, RolesPath: []string{filepath.Join(w.repo, "roles")}})
	if err != nil {
		w.t.Fatal(err)
	}
	key, err := os.ReadFile(w.hosts.Inventory().ClientKey)
	if err != nil {
		w.t.Fatal(err)
	}
	n := &handJoined{w: w, i: i, name: "plain-" + h.Name, e: e, prof: prof,
		conn: engine.Connection{Address: h.Address, Port: int32(h.Port), User: h.User, PrivateKey: key, HostKey: h.HostKey},
		ctx: engine.Context{ClusterEndpoint: info.Endpoint, ClusterCAB64: info.CAB64, HostAddress: h.Address, NodeAddress: h.Address,
			NodeLabels: plainMark + "=true", Taints: plainMark + "=true:NoSchedule", Vars: profile.Vars(prof, nc)}}
	n.ctx.NodeName = n.name
	tokens := token.New(w.kube)
	tok, err := tokens.Mint(ctx, n.name)
	if err != nil {
		w.t.Fatal(err)
	}
	defer func() {
		if err := tokens.Delete(ctx, tok.ID); err != nil {
			w.t.Error(err)
		}
	}()
	n.ctx.BootstrapToken = tok.String()
	n.run(engine.PhaseInstall)
	n.run(engine.PhaseJoin)
	n.ctx.BootstrapToken = ""
	w.eventually("Node "+n.name+" Ready (joined by hand)", 3*time.Minute, func() (bool, string) {
		node := &corev1.Node{}
		if err := w.kube.Get(ctx, client.ObjectKey{Name: n.name}, node); err != nil {
			return false, err.Error()
		}
		return nodeReady(node), fmt.Sprintf("ready=%v", nodeReady(node))
	})
	return n
}

func (n *handJoined) run(p engine.Phase) {
	n.w.t.Helper()
	src, ok := profile.Source(n.prof, p)
	if !ok {
		n.w.t.Fatalf("profile %s has no %s phase", n.prof.Name, p)
	}
	timeout := profile.Timeout(n.prof, p)
	ctx, cancel := context.WithTimeout(context.Background(), timeout+time.Minute)
	defer cancel()
	r := n.e.Run(ctx, engine.Request{Phase: p, Conn: n.conn, Source: src, Context: n.ctx, Timeout: timeout})
	if r.Outcome != engine.Succeeded {
		n.w.t.Fatalf("%s of %s by hand: %s (task %q): %s", p, n.name, r.Outcome, r.FailedTask, r.Message)
	}
	n.w.t.Logf("%s of %s by hand: %v", p, n.name, r.Duration.Round(time.Millisecond))
}

// leave runs the profile's leave on the host and deletes the Node (once).
func (n *handJoined) leave() {
	if n.done {
		return
	}
	n.done = true
	if n.image != "" {
		removeImage(n.w, n.i, n.image)
	}
	n.run(engine.PhaseLeave)
	n.w.mustKubectl("delete", "node", n.name, "--ignore-not-found", "--wait=true", "--timeout=2m")
	_ = n.e.Close()
}

// release is the chart installed in chartNS.
type release struct {
	w    *world
	dep  *appsv1.Deployment
	gone bool
}

// installChart installs charts/kpssh as release kpssh: the controller image
// imported on the nodes (never pulled), the world's CRDs kept (installed by
// the world, not by Helm), host network and the apiserver's address, the
// foreign node's taint tolerated, the world's probe and batch settings.
func (w *world) installChart(img string) *release {
	w.t.Helper()
	repo, tag, ok := strings.Cut(img, ":")
	if !ok {
		w.t.Fatalf("image %q has no tag", img)
	}
	values := map[string]any{
		"image":         map[string]any{"repository": repo, "tag": tag, "pullPolicy": "Never"},
		"karpenterCRDs": map[string]any{"install": false},
		"poolNamespace": poolNS,
		"hostNetwork":   true,
		"extraEnv": []map[string]string{
			{"name": "KUBERNETES_SERVICE_HOST", "value": w.hosts.Inventory().BridgeAddress},
			{"name": "KUBERNETES_SERVICE_PORT", "value": "6443"},
		},
		"tolerations": []map[string]string{{"key": plainMark, "operator": "Exists", "effect": "NoSchedule"}},
		"probe":       map[string]any{"interval": "3s"},
		"settings":    map[string]any{"batchMaxDuration": "3s", "batchIdleDuration": "1s"},
		"logLevel":    "debug",
	}
	if _, err := w.helm(5*time.Minute, "install", "kpssh", filepath.Join(w.repo, "charts/kpssh"), "--namespace", chartNS,
		"--create-namespace", "--skip-crds", "-f", w.yamlFile("values.yaml", values)); err != nil {
		w.t.Fatal(err)
	}
	r := &release{w: w}
	deps := &appsv1.DeploymentList{}
	if err := w.kube.List(context.Background(), deps, client.InNamespace(chartNS)); err != nil || len(deps.Items) != 1 {
		w.t.Fatalf("the release's Deployments: %d (%v), want 1", len(deps.Items), err)
	}
	r.dep = &deps.Items[0]
	return r
}

// pod is the release's controller pod (the newest, when a deleted one is
// still terminating), nil if none.
func (r *release) pod() *corev1.Pod {
	pods := &corev1.PodList{}
	if err := r.w.kube.List(context.Background(), pods, client.InNamespace(chartNS), client.MatchingLabels(r.dep.Spec.Selector.MatchLabels)); err != nil {
		r.w.t.Fatal(err)
	}
	var out *corev1.Pod
	for i, p := range pods.Items {
		if p.DeletionTimestamp == nil && (out == nil || p.CreationTimestamp.After(out.CreationTimestamp.Time)) {
			out = &pods.Items[i]
		}
	}
	return out
}

// runningOn waits for the controller pod Running and Ready on node.
func (r *release) runningOn(node, what string) *corev1.Pod {
	r.w.t.Helper()
	var pod *corev1.Pod
	r.w.eventually(what, 4*time.Minute, func() (bool, string) {
		pod = r.pod()
		if pod == nil {
			return false, "no controller pod"
		}
		ready := false
		for _, c := range pod.Status.Conditions {
			ready = ready || c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
		}
		var cs []string
		for _, s := range pod.Status.ContainerStatuses {
			switch {
			case s.State.Waiting != nil:
				cs = append(cs, "waiting "+s.State.Waiting.Reason+": "+s.State.Waiting.Message)
			case s.State.Terminated != nil:
				cs = append(cs, fmt.Sprintf("terminated %s (exit %d), restarts %d", s.State.Terminated.Reason, s.State.Terminated.ExitCode, s.RestartCount))
			default:
				cs = append(cs, fmt.Sprintf("running, restarts %d", s.RestartCount))
			}
		}
		if pod.Spec.NodeName != "" && pod.Spec.NodeName != node {
			r.w.t.Fatalf("the controller pod %s was scheduled onto %s, want %s", pod.Name, pod.Spec.NodeName, node)
		}
		evs, _ := r.w.kubectl("-n", chartNS, "get", "events", "--field-selector", "involvedObject.name="+pod.Name, "-o", "jsonpath={range .items[*]}{.reason}: {.message}; {end}")
		return ready && pod.Spec.NodeName == node, fmt.Sprintf("pod %s on %q %s ready=%v %v; events: %s", pod.Name, pod.Spec.NodeName, pod.Status.Phase, ready, cs, tail(evs, 1500))
	})
	return pod
}

// logs is the controller container's log (through the apiserver and the
// node's kubelet), or the error saying why not.
func (r *release) logs(pod string) string {
	out, err := r.w.kubectl("-n", chartNS, "logs", pod, "-c", "controller")
	if err != nil {
		return "logs: " + err.Error()
	}
	return out
}

// uninstall removes the release (once) and waits for its pods to go.
func (r *release) uninstall() {
	if r.gone {
		return
	}
	r.gone = true
	if p := r.pod(); p != nil && r.w.t.Failed() {
		r.w.t.Logf("controller pod %s log at the failure:\n%s", p.Name, tail(r.logs(p.Name), 6000))
	}
	if _, err := r.w.helm(5*time.Minute, "uninstall", "kpssh", "--namespace", chartNS, "--wait", "--timeout", "3m"); err != nil {
		r.w.t.Error(err)
	}
}
