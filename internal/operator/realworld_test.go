package operator_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	coreoperator "sigs.k8s.io/karpenter/pkg/operator"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/operator"
	"github.com/dklesev/kpssh/internal/providers/token"
	"github.com/dklesev/kpssh/test/hostenv"
	"github.com/dklesev/kpssh/test/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { os.Exit(testenv.RunMain(m, &env)) }

const poolNS = "kpssh-system"

// startOperator runs cmd/controller's wiring (Karpenter core + kpssh) in
// this process against envtest. Karpenter's operator reads its options from
// flags and the environment, once per process.
// The controller's log (debug level: the most it ever says) goes to logFile
// only, for the canary scan; errors to stderr too.
func startOperator(t *testing.T, logFile string) {
	t.Helper()
	for k, v := range map[string]string{
		"LOG_OUTPUT_PATHS":        logFile,
		"LOG_ERROR_OUTPUT_PATHS":  "stderr," + logFile,
		"KUBECONFIG":              env.Kubeconfig,
		"DISABLE_LEADER_ELECTION": "true",
		"METRICS_PORT":            testenv.MustFreePort(t),
		"HEALTH_PROBE_PORT":       testenv.MustFreePort(t),
		"POOL_NAMESPACE":          poolNS,
		"PROBE_INTERVAL":          "3s",
		"BATCH_IDLE_DURATION":     "1s",
		"BATCH_MAX_DURATION":      "3s",
		"LOG_LEVEL":               "debug",
	} {
		t.Setenv(k, v)
	}
	args := os.Args
	os.Args = []string{"controller"}
	ctx, op := coreoperator.NewOperator()
	os.Args = args
	k, err := operator.New(ctx, op)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); k.WithControllers(ctx, op).Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Log("operator did not stop within 30s")
		}
	})
}

// nodePool is a NodePool of on-demand nodes of SSHNodeClass class that
// Karpenter never expires or consolidates on its own.
func nodePool(name, class string) *karpv1.NodePool {
	never := karpv1.MustParseNillableDuration("Never")
	return &karpv1.NodePool{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: karpv1.NodePoolSpec{
			Template: karpv1.NodeClaimTemplate{Spec: karpv1.NodeClaimTemplateSpec{
				NodeClassRef: &karpv1.NodeClassReference{Group: v1beta1.Group, Kind: "SSHNodeClass", Name: class},
				Requirements: []karpv1.NodeSelectorRequirementWithMinValues{{Key: karpv1.CapacityTypeLabelKey, Operator: corev1.NodeSelectorOpIn, Values: []string{"on-demand"}}},
				ExpireAfter:  never,
			}},
			Disruption: karpv1.Disruption{ConsolidateAfter: never, ConsolidationPolicy: karpv1.ConsolidationPolicyWhenEmpty},
		},
	}
}

// pendingPod creates a pod asking for 500m CPU and marks it unschedulable,
// as kube-scheduler (not in envtest) would: Karpenter's provisioner takes it.
func pendingPod(t *testing.T, name string, nodeSelector map[string]string) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: corev1.PodSpec{NodeSelector: nodeSelector, Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/pause",
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m")}}}}}}
	mustCreate(t, pod)
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable, LastTransitionTime: metav1.Now()}}
	if err := env.Client.Status().Update(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	return pod
}

func mustCreate(t *testing.T, objs ...client.Object) {
	t.Helper()
	for _, o := range objs {
		if err := env.Client.Create(context.Background(), o); err != nil {
			t.Fatalf("create %T %s: %v", o, o.GetName(), err)
		}
	}
}

func eventually(t *testing.T, what string, timeout time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		ok, s := cond()
		if ok {
			return
		}
		last = s
		time.Sleep(500 * time.Millisecond)
	}
	t.Fatalf("timed out after %s waiting for %s; last: %s", timeout, what, last)
}

func clusterInfo(t *testing.T, server string) *corev1.ConfigMap {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[""] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: env.Config.CAData}
	b, err := clientcmd.Write(*cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-public", Name: "cluster-info"}, Data: map[string]string{"kubeconfig": string(b)}}
}

// checkTaskLog: the launch's install and join logged each task that ended
// (V(1)), with the keys Karpenter's own lines carry: the NodeClaim (from
// Karpenter's lifecycle controller) and the SSHHost as klog objects, each
// once, the phase, task, status and duration.
func checkTaskLog(t *testing.T, logFile, claim, host string) {
	t.Helper()
	b, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.Contains(l, `"message":"phase task ended"`) {
			continue
		}
		var e struct {
			Level     string            `json:"level"`
			NodeClaim map[string]string `json:"NodeClaim"`
			SSHHost   map[string]string `json:"SSHHost"`
			Phase     string            `json:"phase"`
			Task      string            `json:"task"`
			Status    string            `json:"status"`
			Duration  string            `json:"duration"`
		}
		if err := json.Unmarshal([]byte(l), &e); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		if e.NodeClaim["name"] != claim {
			continue // another launch's
		}
		d, err := time.ParseDuration(e.Duration)
		if e.Level != "DEBUG" || e.SSHHost["name"] != host || e.SSHHost["namespace"] != poolNS || e.Task == "" || e.Status == "" || err != nil || d <= 0 ||
			strings.Count(l, `"NodeClaim":`) != 1 || strings.Count(l, `"SSHHost":`) != 1 {
			t.Errorf("task log line: %s", l)
		}
		seen[e.Phase+" "+e.Task] = true
	}
	for _, want := range []string{"install kpssh: install script", "join kpssh: join script"} {
		if !seen[want] {
			t.Errorf("no log line for %s's end; logged %v", want, seen)
		}
	}
}

// The profile records what each phase saw on the host.
const (
	installScript = `mkdir -p /etc/kpssh-test
echo "$KPSSH_NODE_NAME" > /etc/kpssh-test/installed
`
	joinScript = `printf '%s\n' "$KPSSH_BOOTSTRAP_TOKEN" "$KPSSH_PROVIDER_ID" "$KPSSH_NODE_NAME" "$KPSSH_CLUSTER_ENDPOINT" "$KPSSH_TAINTS" "$KPSSH_VAR_greeting" > /etc/kpssh-test/joined
rm -f /etc/kpssh-test/left
`
	leaveScript = `rm -f /etc/kpssh-test/joined
echo "$KPSSH_HOST_ADDRESS" > /etc/kpssh-test/left
`
)

// TestKarpenterDrivesHostsThroughEngine: Karpenter's own provisioner and
// NodeClaim lifecycle controllers drive our provider end to end: a pending
// pod → NodeClaim → Create claims an nspawn host and runs install + join
// through the real engine (ansible-playbook) → Launched; the test plays the
// kubelet and registers the Node → Registered, the token is collected;
// deleting the NodeClaim → Delete runs leave → host Available again.
func TestKarpenterDrivesHostsThroughEngine(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: needs envtest, nspawn hosts and ansible-playbook")
	}
	w := hostenv.Up(t, 2)
	ctx := context.Background()
	key, err := os.ReadFile(w.Inventory().ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	mustCreate(t,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: poolNS}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: poolNS, Name: "world-key"}, Data: map[string][]byte{"privateKey": key}},
		clusterInfo(t, "https://"+w.Inventory().BridgeAddress+":6443"),
		&v1beta1.SSHJoinProfile{ObjectMeta: metav1.ObjectMeta{Name: "test"}, Spec: v1beta1.SSHJoinProfileSpec{Version: "1",
			Scripts: &v1beta1.ProfileScripts{Install: installScript, Join: joinScript, Leave: leaveScript}}},
		&v1beta1.SSHNodeClass{ObjectMeta: metav1.ObjectMeta{Name: "pool"}, Spec: v1beta1.SSHNodeClassSpec{
			JoinProfileRef: v1beta1.ObjectReference{Name: "test"}, Vars: v1beta1.Vars{"greeting": "hello"}}},
	)
	for _, h := range w.Hosts() {
		mustCreate(t, &v1beta1.SSHHost{
			ObjectMeta: metav1.ObjectMeta{Name: h.Name, Namespace: poolNS, Labels: map[string]string{v1beta1.LabelHostClass: "small"}},
			Spec: v1beta1.SSHHostSpec{Address: h.Address, Port: int32(h.Port), User: h.User,
				SSHKeySecretRef: v1beta1.LocalObjectReference{Name: "world-key"},
				Capacity:        corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("2Gi")}},
		})
	}
	logFile := filepath.Join(t.TempDir(), "controller.log")
	startOperator(t, logFile)

	// Probes pin host keys and make the pool Available; the node class turns Ready.
	eventually(t, "hosts Available", 2*time.Minute, func() (bool, string) {
		list := &v1beta1.SSHHostList{}
		if err := env.Client.List(ctx, list, client.InNamespace(poolNS)); err != nil {
			return false, err.Error()
		}
		var states []string
		for _, h := range list.Items {
			states = append(states, h.Name+"="+string(h.Status.State)+" "+h.Status.LastProbeError)
			if h.Status.State != v1beta1.HostAvailable {
				return false, strings.Join(states, ", ")
			}
		}
		return len(list.Items) == 2, strings.Join(states, ", ")
	})
	eventually(t, "node class Ready", time.Minute, func() (bool, string) {
		nc := &v1beta1.SSHNodeClass{}
		if err := env.Client.Get(ctx, client.ObjectKey{Name: "pool"}, nc); err != nil {
			return false, err.Error()
		}
		c := nc.StatusConditions().Get(v1beta1.ConditionReady)
		return c != nil && c.IsTrue(), fmt.Sprintf("%+v", c)
	})

	mustCreate(t, nodePool("ssh", "pool"))
	pod := pendingPod(t, "workload", nil)

	var claim *karpv1.NodeClaim
	eventually(t, "NodeClaim launched", 4*time.Minute, func() (bool, string) {
		list := &karpv1.NodeClaimList{}
		if err := env.Client.List(ctx, list); err != nil {
			return false, err.Error()
		}
		if len(list.Items) == 0 {
			return false, "no NodeClaim yet"
		}
		claim = &list.Items[0]
		c := claim.StatusConditions().Get(karpv1.ConditionTypeLaunched)
		return c != nil && c.IsTrue(), fmt.Sprintf("%d claims; launched=%+v", len(list.Items), c)
	})
	host := hostOf(t, claim)
	i := indexOf(t, w, host.Name)
	if host.Status.State != v1beta1.HostInUse || host.Status.InstalledProfile != "test@1" || host.Status.ProviderID != claim.Status.ProviderID {
		t.Fatalf("host after launch: %+v", host.Status)
	}
	if got := w.MustRun(i, "cat /etc/kpssh-test/installed"); strings.TrimSpace(got) != host.Name {
		t.Fatalf("install saw node name %q", got)
	}
	checkTaskLog(t, logFile, claim.Name, host.Name)
	joined := strings.Split(strings.TrimSpace(w.MustRun(i, "cat /etc/kpssh-test/joined")), "\n")
	if len(joined) != 6 || !strings.HasPrefix(joined[0], host.Status.BootstrapTokenID+".") || joined[1] != claim.Status.ProviderID ||
		joined[2] != host.Name || joined[3] != "https://"+w.Inventory().BridgeAddress+":6443" ||
		!strings.HasPrefix(joined[4], "karpenter.sh/unregistered:NoExecute") || joined[5] != "hello" {
		t.Fatalf("join environment on the host: %q (token id %q)", joined, host.Status.BootstrapTokenID)
	}
	tokenID := host.Status.BootstrapTokenID
	sec := &corev1.Secret{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: "kube-system", Name: token.SecretName(tokenID)}, sec); err != nil {
		t.Fatalf("bootstrap token Secret: %v", err)
	}
	if !strings.Contains(string(sec.Data["description"]), claim.Name) {
		t.Fatalf("token description %q does not name the NodeClaim", sec.Data["description"])
	}

	// Play the kubelet: register the Node the join configured.
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: host.Name, Labels: map[string]string{corev1.LabelHostname: host.Name}},
		Spec: corev1.NodeSpec{ProviderID: claim.Status.ProviderID, Taints: []corev1.Taint{{Key: karpv1.UnregisteredTaintKey, Effect: corev1.TaintEffectNoExecute}}}}
	mustCreate(t, node)
	// Karpenter's node controllers write the Node (labels, finalizer) right
	// after it appears, so the status write re-reads on conflict.
	status := corev1.NodeStatus{
		Capacity:    corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("2Gi"), corev1.ResourcePods: resource.MustParse("110")},
		Allocatable: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1920m"), corev1.ResourceMemory: resource.MustParse("1700Mi"), corev1.ResourcePods: resource.MustParse("110")},
		Conditions:  []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}},
		Addresses:   []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: host.Spec.Address}},
	}
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(node), node); err != nil {
			return err
		}
		node.Status = status
		return env.Client.Status().Update(ctx, node)
	}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "NodeClaim registered", 2*time.Minute, func() (bool, string) {
		nc := &karpv1.NodeClaim{}
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(claim), nc); err != nil {
			return false, err.Error()
		}
		c := nc.StatusConditions().Get(karpv1.ConditionTypeRegistered)
		return c != nil && c.IsTrue(), fmt.Sprintf("registered=%+v", c)
	})
	// Token GC: the Node registered, so its token goes.
	eventually(t, "bootstrap token collected", time.Minute, func() (bool, string) {
		h := hostOf(t, claim)
		err := env.Client.Get(ctx, client.ObjectKey{Namespace: "kube-system", Name: token.SecretName(tokenID)}, &corev1.Secret{})
		return h.Status.BootstrapTokenID == "" && err != nil, fmt.Sprintf("host token id %q, secret get err %v", h.Status.BootstrapTokenID, err)
	})

	// Scale down: the workload goes, the NodeClaim is deleted (what
	// consolidation does) → drain, Node deleted, our Delete runs leave.
	if err := env.Client.Delete(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Delete(ctx, claim); err != nil {
		t.Fatal(err)
	}
	eventually(t, "NodeClaim gone", 3*time.Minute, func() (bool, string) {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(claim), &karpv1.NodeClaim{})
		h := &v1beta1.SSHHost{}
		_ = env.Client.Get(ctx, client.ObjectKey{Namespace: poolNS, Name: host.Name}, h)
		return err != nil, fmt.Sprintf("nodeclaim get err=%v host=%s", err, h.Status.State)
	})
	h := &v1beta1.SSHHost{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: poolNS, Name: host.Name}, h); err != nil {
		t.Fatal(err)
	}
	if h.Status.State != v1beta1.HostAvailable || h.Status.ClaimRef != nil || h.Status.InstalledProfile != "test@1" {
		t.Fatalf("host after leave: %+v", h.Status)
	}
	if got := strings.TrimSpace(w.MustRun(i, "cat /etc/kpssh-test/left; test ! -e /etc/kpssh-test/joined && echo gone")); got != host.Spec.Address+"\ngone" {
		t.Fatalf("leave on host: %q", got)
	}
	if h.Status.LastPhase == nil || h.Status.LastPhase.Phase != v1beta1.PhaseLeave || h.Status.LastPhase.Result != v1beta1.PhaseSucceeded {
		t.Fatalf("lastPhase %+v", h.Status.LastPhase)
	}
	// No kpssh token is left behind.
	secrets := &corev1.SecretList{}
	if err := env.Client.List(ctx, secrets, client.InNamespace("kube-system")); err != nil {
		t.Fatal(err)
	}
	for _, s := range secrets.Items {
		if strings.Contains(string(s.Data["description"]), "karpenter-provider-ssh") {
			t.Fatalf("token Secret %s left behind", s.Name)
		}
	}

	t.Run("canary", func(t *testing.T) { testCanaryFailedJoin(t, w, logFile) })
	t.Run("another provider's reboot", testForeignReboot)
}

// testForeignReboot: a NodeClaim of another Karpenter in the cluster (its
// nodeClassRef is not an SSHNodeClass) whose own Karpenter asked for a
// reboot (Rebooting=True, RebootRequested, as its repair writes it) is not
// kpssh's to reboot. Karpenter core's reboot controller reconciles every
// NodeClaim with a Rebooting condition: in kpssh it fenced the other's Node
// (reboot taint), asked kpssh's provider, which knows no such claim, and
// then "replaced" it — deleted the other provider's NodeClaim.
func testForeignReboot(t *testing.T) {
	ctx := context.Background()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "other-node"}, Spec: corev1.NodeSpec{ProviderID: "other://other-node"}}
	mustCreate(t, node)
	claim := &karpv1.NodeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "other-claim", Finalizers: []string{"example.com/other-provider"},
			Annotations: map[string]string{karpv1.RebootTerminationGracePeriodAnnotationKey: "0s"}},
		Spec: karpv1.NodeClaimSpec{NodeClassRef: &karpv1.NodeClassReference{Group: "karpenter.kwok.sh", Kind: "KWOKNodeClass", Name: "other"},
			Requirements: []karpv1.NodeSelectorRequirementWithMinValues{{Key: karpv1.CapacityTypeLabelKey, Operator: corev1.NodeSelectorOpIn, Values: []string{"on-demand"}}}},
	}
	mustCreate(t, claim)
	t.Cleanup(func() {
		c := &karpv1.NodeClaim{}
		if env.Client.Get(ctx, client.ObjectKeyFromObject(claim), c) == nil {
			c.Finalizers = nil
			_ = env.Client.Update(ctx, c)
			_ = env.Client.Delete(ctx, c)
		}
		_ = env.Client.Delete(ctx, node)
	})
	claim.Status.ProviderID, claim.Status.NodeName = node.Spec.ProviderID, node.Name
	claim.StatusConditions().SetTrue(karpv1.ConditionTypeLaunched)
	claim.StatusConditions().SetTrue(karpv1.ConditionTypeRegistered)
	claim.StatusConditions().SetTrueWithReason(karpv1.ConditionTypeRebooting, karpv1.RebootReasonRequested, "asked by its own Karpenter")
	if err := env.Client.Status().Update(ctx, claim); err != nil {
		t.Fatal(err)
	}
	// Forceful (grace period 0): kpssh's core would have called the
	// provider after its 5 s minimum drain; watch three times that.
	for end := time.Now().Add(15 * time.Second); time.Now().Before(end); time.Sleep(250 * time.Millisecond) {
		c, n := &karpv1.NodeClaim{}, &corev1.Node{}
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(claim), c); err != nil {
			t.Fatal(err)
		}
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(node), n); err != nil {
			t.Fatal(err)
		}
		if !c.DeletionTimestamp.IsZero() {
			t.Fatalf("kpssh deleted another provider's NodeClaim %s (its reboot request: %+v)", c.Name, c.StatusConditions().Get(karpv1.ConditionTypeRebooting))
		}
		if r := c.StatusConditions().Get(karpv1.ConditionTypeRebooting); r == nil || r.Reason != karpv1.RebootReasonRequested || len(c.Annotations) != 1 {
			t.Fatalf("kpssh worked on another provider's reboot: condition %+v, annotations %v", r, c.Annotations)
		}
		for _, taint := range n.Spec.Taints {
			if taint.MatchTaint(&karpv1.RebootingNoScheduleTaint) {
				t.Fatalf("kpssh fenced another provider's Node %s for its reboot", n.Name)
			}
		}
	}
}

// testCanaryFailedJoin: one run, Secret → Create → failed join, then
// everything the product writes is scanned for the secrets: the join
// secret's values (a single-line one, and every line of a multi-line PEM)
// and the bootstrap token, all of which the join script prints on stdout
// and stderr and puts into its failure. Scanned: the controller's log
// (debug level), every Event, every SSHHost's, NodeClaim's and
// SSHNodeClass's status, and the run directories left on tmpfs.
func testCanaryFailedJoin(t *testing.T, w *hostenv.World, logFile string) {
	ctx := context.Background()
	const single = "KPSSH-CANARY-SINGLE-5f3c9a1e77d2"
	pemLines := []string{"-----BEGIN KPSSH CANARY KEY-----", "Q2FuYXJ5TGluZU9uZS1hOGYzZDIxYw", "Q2FuYXJ5TGluZVR3by05YjdlNDRmMQ", "-----END KPSSH CANARY KEY-----"}
	pem := strings.Join(pemLines, "\n") + "\n"
	const failingJoin = `echo "secret: $KPSSH_SECRET_APIKEY"
printf '%s' "$KPSSH_SECRET_PEM" >&2
echo "second PEM line: $(printf '%s\n' "$KPSSH_SECRET_PEM" | sed -n 2p)"
echo "$KPSSH_BOOTSTRAP_TOKEN" > /etc/kpssh-test/canary-token
echo "token: $KPSSH_BOOTSTRAP_TOKEN" >&2
echo "join refused: key $KPSSH_SECRET_APIKEY, token $KPSSH_BOOTSTRAP_TOKEN" >&2
exit 1
`
	mustCreate(t,
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: poolNS, Name: "canary-join"}, Data: map[string][]byte{"apiKey": []byte(single), "pem": []byte(pem)}},
		&v1beta1.SSHJoinProfile{ObjectMeta: metav1.ObjectMeta{Name: "canary"}, Spec: v1beta1.SSHJoinProfileSpec{Version: "1",
			Scripts: &v1beta1.ProfileScripts{Install: "mkdir -p /etc/kpssh-test\n", Join: v1beta1.Script(failingJoin), Leave: leaveScript}}},
		&v1beta1.SSHNodeClass{ObjectMeta: metav1.ObjectMeta{Name: "canary"}, Spec: v1beta1.SSHNodeClassSpec{
			JoinProfileRef: v1beta1.ObjectReference{Name: "canary"}, JoinSecretRef: &v1beta1.LocalObjectReference{Name: "canary-join"}}},
	)
	mustCreate(t, nodePool("canary", "canary"))
	pod := pendingPod(t, "canary", map[string]string{karpv1.NodePoolLabelKey: "canary"})
	// The failed join: a host's lastPhase says so, and its message is the
	// script's (redacted) output — the scan below is not of an empty run.
	var failed *v1beta1.SSHHost
	eventually(t, "a failed canary join", 4*time.Minute, func() (bool, string) {
		list := &v1beta1.SSHHostList{}
		if err := env.Client.List(ctx, list, client.InNamespace(poolNS)); err != nil {
			return false, err.Error()
		}
		var seen []string
		for i := range list.Items {
			h := &list.Items[i]
			if lp := h.Status.LastPhase; lp != nil && lp.Phase == v1beta1.PhaseJoin && lp.Result == v1beta1.PhaseFailed {
				failed = h
				return true, ""
			}
			seen = append(seen, fmt.Sprintf("%s=%s %+v", h.Name, h.Status.State, h.Status.LastPhase))
		}
		return false, strings.Join(seen, "; ")
	})
	if m := failed.Status.LastPhase.Message; !strings.Contains(m, "join refused: key ***, token ***") {
		t.Fatalf("the failed join's message does not carry the script's output (the scan would prove nothing): %q", m)
	}
	tok := strings.TrimSpace(w.MustRun(indexOf(t, w, failed.Name), "cat /etc/kpssh-test/canary-token"))
	id, secret, ok := strings.Cut(tok, ".")
	if !ok || len(id) != 6 || len(secret) != 16 {
		t.Fatalf("the join did not see a bootstrap token: %q", tok)
	}
	// The whole launch has ended (the NodeClaim event is emitted after the
	// host's release); then the controller has had its say.
	eventually(t, "JoinFailed event", time.Minute, func() (bool, string) {
		evs := &corev1.EventList{}
		if err := env.Client.List(ctx, evs); err != nil {
			return false, err.Error()
		}
		for _, e := range evs.Items {
			if e.Reason == "JoinFailed" && strings.Contains(e.Message, failed.Name) {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d events", len(evs.Items))
	})
	time.Sleep(2 * time.Second) // log lines of the release, flushed

	needles := map[string]string{"the single-line join secret": single, "the bootstrap token": tok, "the token's secret": secret}
	for i, l := range pemLines[1:3] {
		needles[fmt.Sprintf("PEM line %d", i+2)] = l
	}
	scan := func(where, text string) {
		t.Helper()
		for what, n := range needles {
			if strings.Contains(text, n) {
				i := strings.Index(text, n)
				t.Errorf("%s holds %s, around: %q", where, what, text[max(0, i-120):min(len(text), i+len(n)+40)])
			}
		}
	}
	logs, err := os.ReadFile(logFile)
	if err != nil || len(logs) == 0 {
		t.Fatalf("controller log %s: %d bytes, %v", logFile, len(logs), err)
	}
	if !strings.Contains(string(logs), "launch failed; releasing host") {
		t.Fatalf("the controller log does not have the failed launch (wrong file?)")
	}
	scan("the controller's log", string(logs))
	evs := &corev1.EventList{}
	if err := env.Client.List(ctx, evs); err != nil {
		t.Fatal(err)
	}
	for _, e := range evs.Items {
		scan(fmt.Sprintf("event %s/%s (%s %s)", e.Namespace, e.Name, e.Reason, e.InvolvedObject.Name), e.Message+" "+e.Reason)
	}
	for _, l := range []client.ObjectList{&v1beta1.SSHHostList{}, &karpv1.NodeClaimList{}, &v1beta1.SSHNodeClassList{}} {
		if err := env.Client.List(ctx, l); err != nil {
			t.Fatal(err)
		}
		b, err := json.Marshal(l)
		if err != nil {
			t.Fatal(err)
		}
		scan(fmt.Sprintf("%T", l), string(b))
	}
	// Stop the retries (the pool goes, the workload goes) and wait for every
	// run to end: a run in progress on another host holds its secrets in
	// its private directory, as it must; what a run leaves is what counts.
	// (no garbage collector here: the NodeClaims go by hand, through
	// Karpenter's termination and so through leave)
	_ = env.Client.Delete(ctx, pod)
	_ = env.Client.Delete(ctx, &karpv1.NodePool{ObjectMeta: metav1.ObjectMeta{Name: "canary"}})
	eventually(t, "no NodeClaim, every host released", 3*time.Minute, func() (bool, string) {
		ncs, hosts := &karpv1.NodeClaimList{}, &v1beta1.SSHHostList{}
		if err := env.Client.List(ctx, ncs); err != nil {
			return false, err.Error()
		}
		for i := range ncs.Items {
			if ncs.Items[i].DeletionTimestamp.IsZero() {
				_ = env.Client.Delete(ctx, &ncs.Items[i])
			}
		}
		if err := env.Client.List(ctx, hosts); err != nil {
			return false, err.Error()
		}
		var claimed []string
		for _, h := range hosts.Items {
			if h.Status.ClaimRef != nil {
				claimed = append(claimed, h.Name)
			}
		}
		return len(ncs.Items) == 0 && len(claimed) == 0, fmt.Sprintf("%d NodeClaims, claimed hosts %v", len(ncs.Items), claimed)
	})
	ents, _ := os.ReadDir("/dev/shm")
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "kpssh-"+strconv.Itoa(os.Getpid())+".") || strings.HasPrefix(e.Name(), "kpssh-"+strconv.Itoa(os.Getpid())+"-") {
			_ = filepath.WalkDir(filepath.Join("/dev/shm", e.Name()), func(p string, d os.DirEntry, err error) error {
				if err == nil && !d.IsDir() {
					if b, err := os.ReadFile(p); err == nil {
						scan("left on tmpfs: "+p, string(b))
					}
				}
				return nil
			})
		}
	}
}

func hostOf(t *testing.T, claim *karpv1.NodeClaim) *v1beta1.SSHHost {
	t.Helper()
	list := &v1beta1.SSHHostList{}
	if err := env.Client.List(context.Background(), list, client.InNamespace(poolNS)); err != nil {
		t.Fatal(err)
	}
	for i := range list.Items {
		if r := list.Items[i].Status.ClaimRef; r != nil && r.UID == claim.UID {
			return &list.Items[i]
		}
	}
	t.Fatalf("no host holds NodeClaim %s", claim.Name)
	return nil
}

func indexOf(t *testing.T, w *hostenv.World, name string) int {
	t.Helper()
	for i, h := range w.Hosts() {
		if h.Name == name {
			return i
		}
	}
	t.Fatalf("host %s not in the world", name)
	return -1
}
