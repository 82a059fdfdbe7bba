package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/awslabs/operatorpkg/status"
	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/yaml"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/cloudprovider"
	"github.com/dklesev/kpssh/internal/providers/pool"
	"github.com/dklesev/kpssh/internal/sshx/sshtest"
	"github.com/dklesev/kpssh/test/testenv"
	"github.com/dklesev/kpssh/test/testexec"
)

// The benchmark's pool: rssHosts SSHHosts, rssClaims of them held by as
// many launched NodeClaims (a pool 10 % in use), the rest unclaimed.
const (
	rssHosts     = 5000
	rssClaims    = 500
	rssTargetMiB = 200
	rssNS        = v1beta1.DefaultPoolNamespace
	// rssProbeInterval is the chart's probe.interval.
	rssProbeInterval = 2 * time.Minute
	// rssWindow: how long a synced process's RSS is sampled.
	rssWindow = 30 * time.Second
	// rssWorkers: parallel creates and status writes of the fixture (the
	// test's client is envtest's, QPS 1000).
	rssWorkers = 32
)

// rssEnv is the benchmark's world, built once per test binary run and
// shared by every invocation of the benchmark (go test runs it with b.N = 1
// first, then with the -benchtime count); TestMain stops it.
var (
	rssOnce sync.Once
	rssW    *rssWorld
	rssErr  error
)

func TestMain(m *testing.M) {
	flag.Parse()
	ctrllog.SetLogger(logr.Discard()) // envtest's own logging
	code := m.Run()
	if rssW != nil {
		if code != 0 { // the controllers' logs stay for the failure
			fmt.Fprintln(os.Stderr, "controller logs kept in", rssW.dir)
			rssW.dir = ""
		}
		rssW.close()
	}
	os.Exit(code)
}

type rssWorld struct {
	env      *testenv.Env
	repo     string
	dir      string // the binary and the controllers' logs
	bin      string
	runs     int
	baseline rssSample
	claims   map[string]bool // names of the claimed hosts
	setup    []string        // how the world was made, for the report
	hosts    int             // SSHHosts in the pool now
	// memoryLimit is MEMORY_LIMIT as the chart sets it: its default
	// resources.requests.memory, in bytes.
	memoryLimit int64
}

// rssSample is one controller process's memory once it has synced.
type rssSample struct {
	rss, hwm, anon float64 // MiB: VmRSS, VmHWM and RssAnon of /proc/<pid>/status
	probed         int     // hosts whose probe the process wrote by then
	synced         time.Duration
}

// BenchmarkControllerRSS5000Hosts measures the controller binary
// (cmd/controller: Karpenter core and kpssh, built once per run) as its own
// process against a real kube-apiserver holding 5,000 SSHHosts and 500
// NodeClaims, with the chart's default settings. Every iteration starts a
// fresh process and reads VmRSS and VmHWM from /proc/<pid>/status once it
// has synced — readyz (its informer caches are), every NodeClaim reconciled
// by Karpenter core, every host reconciled once by the host controller (its
// queue's initial backlog drained, from its metrics) — as the top of the
// GC's saw-tooth over 30 s of samples. Baseline, same run: the same binary and
// settings with no hosts and no NodeClaims. Target: ≤ 200 MiB.
//
// The pool is a restart's: hosts point at a closed port of distinct
// loopback addresses (127.1.x.y:1; one machine's hosts would be duplicates
// and not probed), so every probe is refused at once and writes Unhealthy
// with its error — the largest status an unclaimed host carries. The test
// writes that status first, with probe times spread over the last probe
// interval, so each process probes and writes a steady stream of due hosts
// from its start (~37 a second at the chart's 2m), as a running controller
// does, and the next process finds the pool as the last one left it.
//
// The NodeClaims are what a pool 10 % in use holds: managed (nodeClassRef
// to the SSHNodeClass of a NodePool), Launched with the providerID of the
// host each has claimed (InUse, claimRef with the claim's UID), so Karpenter
// core's controllers (state, lifecycle, disruption, garbage collection) and
// ours keep them as launched nodes whose Node has not registered yet. They
// stay inert: launch is done (Create is never called), garbage collection
// only considers Registered claims, and the registration timeout (15 min
// from the Registered condition) starts over before every iteration, when
// the test rewrites their status to Launched only — which also tells when a
// process has reconciled them (Registered is set again).
func BenchmarkControllerRSS5000Hosts(b *testing.B) {
	rssOnce.Do(func() { rssW, rssErr = newRSSWorld(b) })
	if rssErr != nil {
		b.Fatal(rssErr)
	}
	w := rssW
	// go test keeps a benchmark's first 10 log lines: figures first.
	var worst rssSample
	var runs []string
	for i := 0; i < b.N; i++ {
		w.reset(b)
		s := w.measure(b, rssClaims)
		runs = append(runs, fmt.Sprintf("fresh process %d: VmRSS %.1f MiB (anonymous %.1f), VmHWM %.1f MiB; synced %v after its start; %d hosts probed by it",
			w.runs, s.rss, s.anon, s.hwm, s.synced.Round(time.Second), s.probed))
		worst.rss, worst.hwm = max(worst.rss, s.rss), max(worst.hwm, s.hwm)
	}
	base := w.baseline
	b.Logf("target ≤ %d MiB with %d hosts and %d NodeClaims: VmRSS %.1f MiB %s, VmHWM %.1f MiB %s",
		rssTargetMiB, rssHosts, rssClaims, worst.rss, metOrMissed(worst.rss), worst.hwm, metOrMissed(worst.hwm))
	b.Logf("baseline (same binary, no hosts, no NodeClaims): VmRSS %.1f MiB (anonymous %.1f), VmHWM %.1f MiB", base.rss, base.anon, base.hwm)
	for _, r := range runs {
		b.Log(r)
	}
	b.Log(strings.Join(w.setup, "; "))
	b.ReportMetric(worst.rss, "MiB-VmRSS")
	b.ReportMetric(worst.hwm, "MiB-VmHWM")
	b.ReportMetric(base.rss, "MiB-VmRSS-baseline")
	b.ReportMetric(base.hwm, "MiB-VmHWM-baseline")
	b.ReportMetric(0, "ns/op") // a process's memory, not a duration
}

func metOrMissed(mib float64) string {
	if mib <= rssTargetMiB {
		return "met"
	}
	return "MISSED"
}

// newRSSWorld builds the binary, starts the apiserver, measures the
// baseline on the empty pool, then creates the pool.
func newRSSWorld(b *testing.B) (*rssWorld, error) {
	// ansible-playbook: the controller refuses to start without it (make
	// bench puts the runner image's first on PATH).
	if _, err := exec.LookPath("ansible-playbook"); err != nil {
		return nil, fmt.Errorf("the controller needs ansible-playbook on PATH (PATH=$(hack/runner-image.sh --bin | tail -n 1):$PATH, as make bench sets): %w", err)
	}
	repo, err := testenv.RepoRoot()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "kpssh-rss-")
	if err != nil {
		return nil, err
	}
	w := &rssWorld{repo: repo, dir: dir, bin: filepath.Join(dir, "controller"), claims: map[string]bool{}}
	fail := func(err error) (*rssWorld, error) { w.close(); return nil, err }
	if w.memoryLimit, err = chartMemoryRequest(repo); err != nil {
		return fail(err)
	}
	w.setup = append(w.setup, fmt.Sprintf("MEMORY_LIMIT %d (the chart's requests.memory)", w.memoryLimit))
	if e := os.Getenv("KPSSH_RSS_ENV"); e != "" {
		w.setup = append(w.setup, "KPSSH_RSS_ENV "+e+" (overrides)")
	}
	start := time.Now()
	if bin := os.Getenv("KPSSH_RSS_BIN"); bin != "" {
		// A controller built elsewhere (another commit, to compare).
		w.bin = bin
		w.setup = append(w.setup, "controller binary "+bin+" (KPSSH_RSS_BIN)")
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		defer cancel()
		c := testexec.Command(ctx, "go", "build", "-o", w.bin, "./cmd/controller")
		c.Dir = repo
		if _, e, err := testexec.Output(ctx, c); err != nil {
			return fail(fmt.Errorf("go build ./cmd/controller: %w\n%s", err, e))
		}
		w.setup = append(w.setup, fmt.Sprintf("cmd/controller built in %v", time.Since(start).Round(time.Second)))
	}
	if w.env, err = testenv.Start(); err != nil {
		return fail(err)
	}
	if err := w.fixtures(b); err != nil {
		return fail(err)
	}
	w.baseline = w.measure(b, 0)
	w.setup = append(w.setup, fmt.Sprintf("baseline synced %v after its start", w.baseline.synced.Round(time.Second)))
	start = time.Now()
	if err := w.createPool(b); err != nil {
		return fail(err)
	}
	w.hosts = rssHosts
	w.setup = append(w.setup, fmt.Sprintf("%d SSHHosts and %d NodeClaims created in %v", rssHosts, rssClaims, time.Since(start).Round(time.Second)))
	return w, nil
}

func (w *rssWorld) close() {
	if w.env != nil {
		_ = w.env.Stop()
	}
	if w.dir != "" {
		_ = os.RemoveAll(w.dir)
	}
}

// fixtures: the pool namespace, its SSH key, and the e2e's profile, node
// class and NodePool (what a user applies before adding hosts).
func (w *rssWorld) fixtures(b *testing.B) error {
	ctx := context.Background()
	if err := w.env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: rssNS}}); err != nil {
		return err
	}
	_, key := sshtest.NewKey(b)
	if err := w.env.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "key", Namespace: rssNS}, Data: map[string][]byte{"privateKey": key}}); err != nil {
		return err
	}
	for _, f := range []string{"examples/scripts/profile-tls-bootstrap.yaml", "test/e2e/testdata/nodeclass.yaml", "test/e2e/testdata/nodepool.yaml"} {
		if out, err := w.env.Kubectl(ctx, "apply", "-f", filepath.Join(w.repo, f)); err != nil {
			return fmt.Errorf("%w: %s", err, out)
		}
	}
	return nil
}

// parallel runs f(0..n-1) on rssWorkers goroutines; the first error wins.
func parallel(n int, f func(i int) error) error {
	var once sync.Once
	var first error
	workqueue.ParallelizeUntil(context.Background(), rssWorkers, n, func(i int) {
		if err := f(i); err != nil {
			once.Do(func() { first = err })
		}
	})
	return first
}

func hostName(i int) string { return fmt.Sprintf("h%05d", i) }

// class: ten host classes of 500 hosts, as a mixed fleet has.
func class(i int) string { return fmt.Sprintf("class-%d", i%10) }

func (w *rssWorld) createPool(b *testing.B) error {
	ctx := context.Background()
	np := &karpv1.NodePool{}
	if err := w.env.Client.Get(ctx, client.ObjectKey{Name: "ssh"}, np); err != nil {
		return err
	}
	claims := make([]*karpv1.NodeClaim, rssClaims)
	err := parallel(rssClaims, func(i int) error {
		nc := &karpv1.NodeClaim{
			ObjectMeta: metav1.ObjectMeta{
				Name: fmt.Sprintf("ssh-%05d", i),
				Labels: map[string]string{
					karpv1.NodePoolLabelKey:        np.Name,
					karpv1.CapacityTypeLabelKey:    karpv1.CapacityTypeOnDemand,
					corev1.LabelInstanceTypeStable: class(i * (rssHosts / rssClaims)),
					v1beta1.LabelHostClass:         class(i * (rssHosts / rssClaims)),
				},
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "karpenter.sh/v1", Kind: "NodePool", Name: np.Name, UID: np.UID, BlockOwnerDeletion: new(true)}},
			},
			Spec: karpv1.NodeClaimSpec{
				NodeClassRef: &karpv1.NodeClassReference{Group: v1beta1.Group, Kind: "SSHNodeClass", Name: "pool"},
				Requirements: []karpv1.NodeSelectorRequirementWithMinValues{
					{Key: karpv1.CapacityTypeLabelKey, Operator: corev1.NodeSelectorOpIn, Values: []string{karpv1.CapacityTypeOnDemand}},
					{Key: karpv1.NodePoolLabelKey, Operator: corev1.NodeSelectorOpIn, Values: []string{np.Name}},
				},
				Resources: karpv1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourcePods: resource.MustParse("1")}},
			},
		}
		if err := w.env.Client.Create(ctx, nc); err != nil {
			return err
		}
		claims[i] = nc
		return nil
	})
	if err != nil {
		return fmt.Errorf("create NodeClaims: %w", err)
	}
	byHost := map[string]*karpv1.NodeClaim{}
	for i, nc := range claims {
		h := hostName(i * (rssHosts / rssClaims))
		byHost[h] = nc
		w.claims[h] = true
	}
	err = parallel(rssHosts, func(i int) error {
		h := &v1beta1.SSHHost{
			ObjectMeta: metav1.ObjectMeta{Name: hostName(i), Namespace: rssNS, Labels: map[string]string{v1beta1.LabelHostClass: class(i)}},
			Spec: v1beta1.SSHHostSpec{
				Address: fmt.Sprintf("127.1.%d.%d", i/250, i%250+1), Port: 1,
				SSHKeySecretRef: v1beta1.LocalObjectReference{Name: "key"},
				Capacity:        corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("8Gi")},
			},
		}
		if err := w.env.Client.Create(ctx, h); err != nil {
			return err
		}
		// As the pool's controller leaves it: unclaimed hosts probed (the
		// probe refused: Unhealthy with its error), at times spread over the
		// last probe interval as a running controller's sweep spreads them,
		// so a new process probes a steady ~37 hosts a second from its
		// start; claimed hosts joined, as Create leaves them.
		id := pool.Identity(h)
		now := metav1.Now()
		nc := byHost[h.Name]
		if nc == nil {
			probed := metav1.NewTime(now.Add(-time.Duration(i) * rssProbeInterval / rssHosts))
			msg := fmt.Sprintf("dial %s: dial tcp %s: connect: connection refused", id.Address, id.Address)
			h.Status = v1beta1.SSHHostStatus{Machine: &id, ObservedGeneration: h.Generation, LastProbeTime: &probed, LastProbeError: msg}
			h.SetState(v1beta1.HostUnhealthy, msg, probed)
			return w.env.Client.Status().Update(ctx, h)
		}
		h.Status = v1beta1.SSHHostStatus{
			Machine: &id, ClaimRef: &v1beta1.ClaimRef{Name: nc.Name, UID: nc.UID}, JoinClaimUID: nc.UID,
			ProviderID: cloudprovider.ProviderID(rssNS, h.Name), InstalledProfile: "tls-bootstrap-script/1",
			HostKeyFingerprint: "SHA256:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU", ObservedArch: "amd64",
			ObservedCapacity: h.Spec.Capacity, ObservedGeneration: h.Generation, LastProbeTime: &now,
		}
		h.SetState(v1beta1.HostInUse, "joined as NodeClaim "+nc.Name, now)
		return w.env.Client.Status().Update(ctx, h)
	})
	if err != nil {
		return fmt.Errorf("create SSHHosts: %w", err)
	}
	return nil
}

// reset puts the NodeClaims' status back to Launched with their host's
// providerID (no controller runs): Karpenter sets the rest again, which
// tells when the next process has reconciled them, and their 15-min
// registration timeout starts over. The hosts stay as the last process left
// them (a restart's pool).
func (w *rssWorld) reset(b *testing.B) {
	b.Helper()
	ctx := context.Background()
	start := time.Now()
	claims := &karpv1.NodeClaimList{}
	if err := w.env.Client.List(ctx, claims); err != nil {
		b.Fatal(err)
	}
	if len(claims.Items) != rssClaims {
		b.Fatalf("%d NodeClaims, want %d (deleted by a controller?)", len(claims.Items), rssClaims)
	}
	err := parallel(len(claims.Items), func(i int) error {
		nc := &claims.Items[i]
		n, err := strconv.Atoi(strings.TrimPrefix(nc.Name, "ssh-"))
		if err != nil {
			return err
		}
		capacity := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("8Gi"), corev1.ResourcePods: resource.MustParse("110")}
		nc.Status = karpv1.NodeClaimStatus{
			ProviderID: cloudprovider.ProviderID(rssNS, hostName(n*(rssHosts/rssClaims))),
			Capacity:   capacity, Allocatable: capacity,
			Conditions: []status.Condition{{Type: karpv1.ConditionTypeLaunched, Status: metav1.ConditionTrue, Reason: karpv1.ConditionTypeLaunched,
				LastTransitionTime: metav1.Now(), ObservedGeneration: nc.Generation}},
		}
		return w.env.Client.Status().Update(ctx, nc)
	})
	if err != nil {
		b.Fatalf("reset NodeClaims: %v", err)
	}
	if testing.Verbose() {
		b.Logf("reset the NodeClaims' status in %v", time.Since(start).Round(time.Second))
	}
}

// measure starts a fresh controller, waits until it has synced (ready:
// its informer caches synced; wantClaims NodeClaims reconciled by
// Karpenter, as the API shows; every host reconciled once), samples its RSS
// for rssWindow, and stops it.
func (w *rssWorld) measure(b *testing.B, wantClaims int) rssSample {
	b.Helper()
	p := w.start(b)
	defer p.stop()
	var s rssSample
	start := time.Now()
	deadline := start.Add(10 * time.Minute)
	lastLog := time.Now()
	for {
		reconciled, ready, backlog, err := w.progress(p)
		if err == nil && ready && reconciled >= wantClaims && backlog == 0 {
			break
		}
		if why, gone := p.exited(); gone {
			b.Fatalf("the controller exited on its own: %s", why)
		}
		now := fmt.Sprintf("ready=%t, %d/%d NodeClaims reconciled, %d hosts not yet reconciled once", ready, reconciled, wantClaims, backlog)
		if err != nil {
			// The apiserver times out now and then while the controller's
			// start floods it (this machine is shared): ask again.
			now = "reading progress: " + err.Error()
		}
		if time.Now().After(deadline) {
			b.Fatalf("not synced after %v: %s (log: %s)", time.Since(start).Round(time.Second), now, p.log)
		}
		if testing.Verbose() && time.Since(lastLog) > 30*time.Second {
			b.Logf("waiting for the controller (%v): %s", time.Since(start).Round(time.Second), now)
			lastLog = time.Now()
		}
		time.Sleep(2 * time.Second)
	}
	s.synced = time.Since(start)
	// Steady state: the GC's saw-tooth, sampled every 2 s for rssWindow;
	// the figure is its top (what a memory limit has to hold).
	for end := time.Now().Add(rssWindow); ; time.Sleep(2 * time.Second) {
		m, err := procStatus(p.pid())
		if err != nil {
			b.Fatal(err)
		}
		s.rss, s.anon = max(s.rss, m["VmRSS"]), max(s.anon, m["RssAnon"])
		s.hwm = m["VmHWM"]
		if time.Now().After(end) {
			break
		}
	}
	s.probed = w.probedSince(start)
	if dir := os.Getenv("KPSSH_RSS_PPROF"); dir != "" { // a heap profile of this process (ENABLE_PROFILING is on then)
		w.saveHeap(b, p, dir)
	}
	return s
}

// progress: NodeClaims whose Registered condition Karpenter set again since
// the reset, the controller's readyz (its caches synced), and the host
// controller's initial backlog (its queue's low-priority items: the adds of
// the cache's first list, from its metrics; each later probe is a
// higher-priority requeue).
func (w *rssWorld) progress(p *rssProcess) (reconciled int, ready bool, backlog int, err error) {
	claims := &karpv1.NodeClaimList{}
	if err := w.env.Client.List(context.Background(), claims); err != nil {
		return 0, false, 0, err
	}
	for i := range claims.Items {
		if claims.Items[i].StatusConditions().Get(karpv1.ConditionTypeRegistered) != nil {
			reconciled++
		}
	}
	resp, err := http.Get("http://127.0.0.1:" + p.healthPort + "/readyz")
	if err != nil {
		return reconciled, false, 0, nil
	}
	ready = resp.StatusCode == http.StatusOK
	resp.Body.Close()
	if !ready {
		return reconciled, false, 0, nil
	}
	queued, err := scrape(p, `workqueue_depth{controller="host",name="host",priority="-100"}`)
	if err != nil {
		return reconciled, ready, 0, err
	}
	done, err := scrape(p, `controller_runtime_reconcile_total{controller="host",`)
	if err != nil {
		return reconciled, ready, 0, err
	}
	// Before the host controller starts its queue is empty too.
	return reconciled, ready, max(int(queued), w.hosts-int(done)), nil
}

// scrape sums the series of the controller's /metrics whose name and
// labels start with prefix (0 when none).
func scrape(p *rssProcess, prefix string) (float64, error) {
	resp, err := http.Get("http://127.0.0.1:" + p.metricsPort + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sum := 0.0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if !strings.HasPrefix(sc.Text(), prefix) {
			continue
		}
		f := strings.Fields(sc.Text())
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return 0, err
		}
		sum += v
	}
	return sum, sc.Err()
}

// probedSince counts the hosts whose probe this process wrote (-1: the
// apiserver did not answer).
func (w *rssWorld) probedSince(t time.Time) int {
	hosts := &v1beta1.SSHHostList{}
	if err := w.env.Client.List(context.Background(), hosts, client.InNamespace(rssNS)); err != nil {
		return -1
	}
	n := 0
	for _, h := range hosts.Items {
		if lp := h.Status.LastProbeTime; lp != nil && !lp.Time.Before(t.Truncate(time.Second)) {
			n++
		}
	}
	return n
}

// procStatus reads the Vm* and Rss* lines of /proc/<pid>/status in MiB.
func procStatus(pid int) (map[string]float64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || !(strings.HasPrefix(k, "Vm") || strings.HasPrefix(k, "Rss")) {
			continue
		}
		fields := strings.Fields(v)
		if len(fields) == 2 && fields[1] == "kB" {
			kb, err := strconv.ParseFloat(fields[0], 64)
			if err != nil {
				return nil, err
			}
			out[k] = kb / 1024
		}
	}
	if _, ok := out["VmRSS"]; !ok {
		return nil, fmt.Errorf("/proc/%d/status: no VmRSS", pid)
	}
	return out, sc.Err()
}

// rssProcess is one controller process (own process group).
type rssProcess struct {
	cmd                     *exec.Cmd
	done                    chan struct{}
	log                     string
	metricsPort, healthPort string
}

func (p *rssProcess) pid() int { return p.cmd.Process.Pid }

// start runs the binary with the chart's default settings (charts/kpssh
// values.yaml: probe interval 2m, 32 concurrent probes, MEMORY_LIMIT from
// requests.memory, read from values.yaml), from the checkout (it finds the
// collection and roles there).
func (w *rssWorld) start(b *testing.B) *rssProcess {
	b.Helper()
	w.runs++
	p := &rssProcess{log: filepath.Join(w.dir, fmt.Sprintf("controller-%d.log", w.runs)), metricsPort: testenv.MustFreePort(b), healthPort: testenv.MustFreePort(b)}
	f, err := os.Create(p.log)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	p.cmd = exec.Command(w.bin)
	p.cmd.Dir = w.repo
	p.cmd.Env = append(os.Environ(),
		"KUBECONFIG="+w.env.Kubeconfig,
		"POOL_NAMESPACE="+rssNS,
		"EXECUTOR=local",
		"PROBE_INTERVAL="+rssProbeInterval.String(), "PROBE_TIMEOUT=30s", "PROBE_CONCURRENCY=32",
		"BATCH_MAX_DURATION=10s", "BATCH_IDLE_DURATION=1s",
		"FEATURE_GATES=NodeRepair=true,TerminateFirstDrift=true,TerminateFirstRepair=true",
		"LOG_LEVEL=info",
		// One replica and no standby: leader election off (as the e2e
		// runs it). On, a renewal that times out on this loaded machine
		// ends the process (Karpenter panics on a lost lease) mid-run.
		"DISABLE_LEADER_ELECTION=true",
		"MEMORY_LIMIT="+strconv.FormatInt(w.memoryLimit, 10),
		"METRICS_PORT="+p.metricsPort, "HEALTH_PROBE_PORT="+p.healthPort,
		"ENABLE_PROFILING="+strconv.FormatBool(os.Getenv("KPSSH_RSS_PPROF") != ""),
	)
	// KPSSH_RSS_ENV="K=V K2=V2": settings to try against the defaults
	// (GOGC=50, MEMORY_LIMIT=...), last so they win.
	p.cmd.Env = append(p.cmd.Env, strings.Fields(os.Getenv("KPSSH_RSS_ENV"))...)
	p.cmd.Stdout, p.cmd.Stderr = f, f
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		b.Fatal(err)
	}
	p.done = make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	return p
}

// stop: SIGTERM to the group, SIGKILL after 30 s, reaped.
func (p *rssProcess) stop() {
	_ = syscall.Kill(-p.pid(), syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(-p.pid(), syscall.SIGKILL)
		<-p.done
	}
	_ = syscall.Kill(-p.pid(), syscall.SIGKILL)
}

func (p *rssProcess) exited() (string, bool) {
	select {
	case <-p.done:
	default:
		return "", false
	}
	out, _ := os.ReadFile(p.log)
	s := string(out)
	if len(s) > 3000 {
		s = "…" + s[len(s)-3000:]
	}
	return fmt.Sprintf("%v; log tail:\n%s", p.cmd.ProcessState, s), true
}

// saveHeap writes the process's heap profile to dir/heap-<run>.pprof.
func (w *rssWorld) saveHeap(b *testing.B, p *rssProcess, dir string) {
	b.Helper()
	resp, err := http.Get("http://127.0.0.1:" + p.metricsPort + "/debug/pprof/heap")
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	f := filepath.Join(dir, fmt.Sprintf("heap-%d.pprof", w.runs))
	out, err := os.Create(f)
	if err != nil {
		b.Fatal(err)
	}
	defer out.Close()
	if _, err := out.ReadFrom(resp.Body); err != nil {
		b.Fatal(err)
	}
	b.Logf("heap profile: %s", f)
	var stats []string // the Go runtime's own account, beside it
	for _, name := range []string{"go_memstats_heap_inuse_bytes", "go_memstats_heap_alloc_bytes", "go_memstats_heap_idle_bytes",
		"go_memstats_heap_released_bytes", "go_memstats_stack_inuse_bytes", "go_memstats_sys_bytes", "go_goroutines"} {
		v, err := scrape(p, name)
		if err != nil {
			b.Fatal(err)
		}
		stats = append(stats, fmt.Sprintf("%s %.0f", name, v))
	}
	b.Logf("runtime: %s", strings.Join(stats, ", "))
}

// chartMemoryRequest is the chart's default resources.requests.memory in
// bytes: the chart passes it as MEMORY_LIMIT (Go's soft limit at 90 %).
func chartMemoryRequest(repo string) (int64, error) {
	raw, err := os.ReadFile(filepath.Join(repo, "charts", "kpssh", "values.yaml"))
	if err != nil {
		return 0, err
	}
	var v struct {
		Resources struct {
			Requests map[string]string `json:"requests"`
		} `json:"resources"`
	}
	if err := yaml.Unmarshal(raw, &v); err != nil {
		return 0, fmt.Errorf("charts/kpssh/values.yaml: %w", err)
	}
	q, err := resource.ParseQuantity(v.Resources.Requests["memory"])
	if err != nil || q.Sign() <= 0 {
		return 0, fmt.Errorf("charts/kpssh/values.yaml: resources.requests.memory %q: %v", v.Resources.Requests["memory"], err)
	}
	return q.Value(), nil
}
