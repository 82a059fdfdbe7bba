//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/dklesev/kpssh/apis/v1beta1"
)

// snapshot is what a crash point looks at: the host holding the current
// NodeClaim, that claim, whether a phase script runs on the host and the
// host's Node.
type snapshot struct {
	host  *v1beta1.SSHHost  // nil: no host is claimed
	claim *karpv1.NodeClaim // nil: the claim is gone
	phase bool              // a phase script (`bash -s <run tag>`) runs on the host
	node  *corev1.Node      // the Node named like the host, nil: none
}

func (s snapshot) String() string {
	if s.host == nil {
		return "no claimed host"
	}
	h := s.host
	out := fmt.Sprintf("%s %s installed=%q token=%v phase=%v", h.Name, h.Status.State, h.Status.InstalledProfile, h.Status.BootstrapTokenID != "", s.phase)
	if s.claim != nil && s.claim.DeletionTimestamp != nil {
		out += " claim deleting"
	}
	switch {
	case s.node == nil:
		out += " node=none"
	case nodeReady(s.node):
		out += " node=Ready"
	default:
		out += " node=NotReady"
	}
	return out
}

func (s snapshot) claimed() bool  { return s.host != nil && s.host.Status.State == v1beta1.HostClaimed }
func (s snapshot) deleting() bool { return s.claim != nil && s.claim.DeletionTimestamp != nil }
func (s snapshot) token() bool    { return s.host != nil && s.host.Status.BootstrapTokenID != "" }

// look takes a snapshot. The host is the one whose claim is live (Create
// side) or deleting (Delete side); phases are seen in the host's process
// table (hostenv Procs: cheap, no SSH).
func (w *world) look() snapshot {
	var s snapshot
	for _, h := range w.sshHosts() {
		if h.Status.ClaimRef != nil {
			h := h
			s.host = &h
			break
		}
	}
	if s.host == nil {
		return s
	}
	c := &karpv1.NodeClaim{}
	if err := w.kube.Get(context.Background(), client.ObjectKey{Name: s.host.Status.ClaimRef.Name}, c); err == nil {
		s.claim = c
	}
	for _, p := range w.hosts.Procs(w.hostIndex(s.host.Name)) {
		if strings.Contains(p, "bash -s ") {
			s.phase = true
		}
	}
	n := &corev1.Node{}
	if err := w.kube.Get(context.Background(), client.ObjectKey{Name: s.host.Name}, n); err == nil {
		s.node = n
	}
	return s
}

// crashPoint is one place of Create or Delete to SIGKILL the controller at.
type crashPoint struct {
	name string
	// cold: bump the profile's version first, so that install runs
	// (and the windows before and around it exist).
	cold bool
	// hit returns a fresh detector: true on the snapshot to crash at. It
	// may remember earlier snapshots of the attempt.
	hit func() func(snapshot) bool
	// settle: SIGSTOP the controller's process group at the hit and SIGKILL
	// it only once the phase script on the host has exited: a crash after
	// the host finished a phase, before the controller recorded it (a
	// window too narrow to hit by polling).
	settle bool
}

// Create-side points (replicas 1), in the order Create passes them.
var createPoints = []crashPoint{
	{name: "after claim", cold: true, hit: stateless(func(s snapshot) bool {
		return s.claimed() && !s.token() && !s.phase // claimed, install not started on the host
	})},
	{name: "during install", cold: true, hit: stateless(func(s snapshot) bool {
		return s.claimed() && !s.token() && s.phase
	})},
	{name: "after install, before join", cold: true, settle: true, hit: stateless(func(s snapshot) bool {
		return s.claimed() && !s.token() && s.phase // frozen in install; killed once it ended on the host
	})},
	{name: "after token mint", hit: func() func(snapshot) bool {
		joinSeen := false // after the join the same state comes back: not this point
		return func(s snapshot) bool {
			joinSeen = joinSeen || s.token() && s.phase
			return s.claimed() && s.token() && !s.phase && !joinSeen // token recorded, join not started
		}
	}},
	{name: "during join", hit: stateless(func(s snapshot) bool {
		return s.claimed() && s.token() && s.phase
	})},
	{name: "after join, before registration", settle: true, hit: stateless(func(s snapshot) bool {
		return s.claimed() && s.token() && s.phase && s.node == nil // frozen in join; killed once it ended
	})},
	{name: "after registration, before Ready", hit: stateless(func(s snapshot) bool {
		return s.host != nil && !s.deleting() && s.node != nil && !nodeReady(s.node)
	})},
}

// Delete-side points (the claim deleted), paired with the Create-side ones.
var deletePoints = []crashPoint{
	{name: "at Delete start", hit: func() func(snapshot) bool {
		leaveSeen := false
		return func(s snapshot) bool {
			leaveSeen = leaveSeen || s.deleting() && s.phase
			return s.deleting() && s.host.Status.State == v1beta1.HostInUse && !s.phase && !leaveSeen // leave not started on the host
		}
	}},
	{name: "during leave", hit: stateless(func(s snapshot) bool {
		return s.deleting() && s.phase
	})},
	{name: "after leave, before release", settle: true, hit: stateless(func(s snapshot) bool {
		return s.deleting() && s.phase // frozen in leave; killed once it ended on the host
	})},
	{name: "during leave, kubelet already stopped", hit: nil}, // set in crashResume: needs the world
}

func stateless(f func(snapshot) bool) func() func(snapshot) bool {
	return func() func(snapshot) bool { return f }
}

// crashResume: SIGKILL the controller (its whole process group, so
// in-flight ansible-playbook runs die with it) at 11 points of Create and
// Delete, restart it, and check that it converges: one claim on one host,
// one Node created once from one CSR, no leaked bootstrap token, the other
// hosts Available; after the release every host Available with kubelet and
// containerd disabled.
func crashResume(w *world, st *state) {
	points := append([]crashPoint(nil), deletePoints...)
	points[3].hit = stateless(func(s snapshot) bool {
		return s.deleting() && s.phase && strings.HasPrefix(w.units(w.hostIndex(s.host.Name)), "kubelet=disabled/inactive")
	})
	start := time.Now()
	hits := 0
	for i, up := range createPoints {
		hits += w.crashUp(up)
		if i < len(points) {
			hits += w.crashDown(points[i])
		} else {
			w.release()
		}
	}
	w.t.Logf("%d crash points in %v", hits, time.Since(start).Round(time.Second))
}

// attempts bounds the retries of a point whose moment the poll missed (the
// flow ran past it): the world converges anyway, then the point is tried
// again.
const attempts = 3

// crashUp scales to 1 and crashes at p; then checks the resumed Create.
func (w *world) crashUp(p crashPoint) int {
	w.t.Helper()
	for a := 1; a <= attempts; a++ {
		if p.cold {
			w.bumpProfile()
		}
		csrs := w.clientCSRs()
		nodes := w.watchNodes()
		w.scale(1)
		// A kubelet killed mid-bootstrap (its CSR sent, no certificate on
		// the host yet) is restarted by the resumed join with a fresh token
		// and may send a second CSR; one that already held its certificate
		// must not.
		maxCSRs := 1
		atKill := func(s snapshot) {
			if s.host == nil || len(w.newCSRs(csrs)) == 0 {
				return
			}
			out, _, err := w.hosts.Run(w.hostIndex(s.host.Name), "test -e /var/lib/kubelet/pki/kubelet-client-current.pem && echo cert || echo none")
			if err == nil && strings.TrimSpace(out) == "none" {
				maxCSRs = 2
				w.t.Logf("crash %s: the kubelet was bootstrapping (CSR sent, no certificate yet)", p.name)
			}
		}
		hit, at := w.crashAt(p, atKill, func(s snapshot) bool {
			return s.host != nil && s.host.Status.State == v1beta1.HostInUse && s.node != nil && nodeReady(s.node)
		})
		crashed := time.Now()
		host, claim := w.joined("")
		w.resumedCreate(p.name, host, csrs, maxCSRs, nodes.stop())
		if hit {
			// The resume finished the launch it interrupted: the same
			// claim on the same host, not a failed one replaced.
			if at.host == nil || at.claim == nil || at.host.Name != host.Name || at.claim.UID != claim.UID {
				w.t.Errorf("%s: crashed at %s, but %s joined as claim %s", p.name, at, host.Name, claim.Name)
			}
			w.t.Logf("crash %s: resumed to Ready and checked %v after the SIGKILL", p.name, time.Since(crashed).Round(100*time.Millisecond))
			return 1
		}
		w.t.Logf("crash %s: missed (attempt %d), again", p.name, a)
		w.release()
	}
	w.t.Errorf("crash point %q: missed %d times", p.name, attempts)
	return 0
}

// crashDown deletes the joined host's claim (after scaling to 0, so no
// replacement) and crashes at p; then checks the resumed Delete.
func (w *world) crashDown(p crashPoint) int {
	w.t.Helper()
	for a := 1; a <= attempts; a++ {
		if a > 1 {
			w.scale(1)
			w.joined("")
		}
		w.deleteClaims()
		hit, _ := w.crashAt(p, nil, func(s snapshot) bool { return s.host == nil })
		crashed := time.Now()
		w.allLeft(p.name + ": converged after the crash")
		w.noPhaseLeft(p.name)
		if hit {
			w.t.Logf("crash %s: all hosts Available and checked %v after the SIGKILL", p.name, time.Since(crashed).Round(100*time.Millisecond))
			return 1
		}
		w.t.Logf("crash %s: missed (attempt %d), again", p.name, a)
	}
	w.t.Errorf("crash point %q: missed %d times", p.name, attempts)
	return 0
}

// crashAt polls snapshots until p hits (crash, restart: true and the
// snapshot crashed at) or passed says the flow went beyond it (false).
// atKill, if set, looks at the world while the controller is dead.
func (w *world) crashAt(p crashPoint, atKill func(snapshot), passed func(snapshot) bool) (bool, snapshot) {
	w.t.Helper()
	hit := p.hit()
	deadline := time.Now().Add(4 * time.Minute)
	for time.Now().Before(deadline) {
		s := w.look()
		if hit(s) {
			if p.settle {
				w.ctrl.freeze()
				w.eventually(p.name+": the phase ended on the host (controller frozen)", 2*time.Minute, func() (bool, string) {
					s = w.look()
					return !s.phase, s.String()
				})
			}
			w.ctrl.kill(syscall.SIGKILL)
			w.t.Logf("crash %s: SIGKILLed the controller at %s", p.name, s)
			if atKill != nil {
				atKill(s)
			}
			w.ctrl.start()
			return true, s
		}
		if passed(s) {
			return false, s
		}
		time.Sleep(30 * time.Millisecond)
	}
	w.t.Fatalf("crash point %q: neither reached nor passed in 4 minutes; last %s", p.name, w.look())
	return false, snapshot{}
}

// resumedCreate checks what a resumed Create must leave: one Node, created
// once, from one bootstrap CSR of this point (maxCSRs: see crashUp); the
// other hosts Available; no token left.
func (w *world) resumedCreate(point string, host *v1beta1.SSHHost, csrsBefore map[string]bool, maxCSRs int, nodeUIDs map[string][]string) {
	w.t.Helper()
	// Karpenter may launch a second claim for the workload after a crash
	// (seen once in CI at "after join, before registration": the pod was
	// replaced while the resumed join restarted the kubelet); that claim
	// joins another host, once, and is consolidated later. What must hold
	// is per host: each joined at most once, from its own bootstrap.
	extra := map[string]bool{}
	for name, uids := range nodeUIDs {
		if len(uids) != 1 {
			w.t.Errorf("%s: Node %s created %d times during the point (%v), want once", point, name, len(uids), uids)
		}
		if name != host.Name {
			extra[name] = true
		}
	}
	if len(nodeUIDs[host.Name]) != 1 {
		w.t.Errorf("%s: Nodes seen during the point %v, want %s created once", point, nodeUIDs, host.Name)
	}
	if len(extra) > 0 {
		w.t.Logf("%s: Karpenter launched another claim after the resume; also joined (once each): %v", point, slices.Sorted(maps.Keys(extra)))
	}
	if fresh := w.newCSRs(csrsBefore); len(fresh) < 1 || len(fresh) > maxCSRs+len(extra) {
		w.t.Errorf("%s: %d new kubelet client CSRs %v, want 1 per joined host (the crashed host at most %d)", point, len(fresh), fresh, maxCSRs)
	}
	var others []string
	for _, h := range w.sshHosts() {
		if h.Name != host.Name && !extra[h.Name] && h.Status.State != v1beta1.HostAvailable {
			others = append(others, h.Name+"="+string(h.Status.State))
		}
	}
	if len(others) > 0 {
		w.t.Errorf("%s: other hosts not Available: %v", point, others)
	}
	w.eventually(point+": no token left", 2*time.Minute, func() (bool, string) {
		tk := w.tokens()
		return len(tk) == 0, strings.Join(tk, " ")
	})
	w.noPhaseLeft(point)
}

// noPhaseLeft: no phase script outlives the crash on any host (one whose
// controller died loses its SSH channel and must end, not run on beside
// the resumed phase).
func (w *world) noPhaseLeft(point string) {
	w.t.Helper()
	w.eventually(point+": no orphaned phase script on the hosts", time.Minute, func() (bool, string) {
		var left []string
		for i, h := range w.hosts.Hosts() {
			for _, p := range w.hosts.Procs(i) {
				if strings.Contains(p, "bash -s ") {
					left = append(left, h.Name+": "+p)
				}
			}
		}
		return len(left) == 0, strings.Join(left, "; ")
	})
}

// release scales to 0 and deletes the claim (faster than waiting for
// consolidation), then waits until everything left.
func (w *world) release() {
	w.t.Helper()
	w.deleteClaims()
	w.allLeft("released")
}

func (w *world) deleteClaims() {
	w.t.Helper()
	w.scale(0)
	for _, c := range w.nodeClaims() {
		if err := w.kube.Delete(context.Background(), &c); client.IgnoreNotFound(err) != nil {
			w.t.Fatal(err)
		}
	}
}

// bumpProfile raises the profile's spec.version: every host's install
// marker is stale, so the next claim runs install.
func (w *world) bumpProfile() {
	w.t.Helper()
	v, err := strconv.Atoi(w.mustKubectl("get", "sshjoinprofile", w.profile, "-o", "jsonpath={.spec.version}"))
	if err != nil {
		w.t.Fatalf("profile version: %v", err)
	}
	w.mustKubectl("patch", "sshjoinprofile", w.profile, "--type=merge", "-p", fmt.Sprintf(`{"spec":{"version":"%d"}}`, v+1))
}

// clientCSRUsers maps kubelet client CSRs (bootstrap-token requests) to
// their requesting user.
func (w *world) clientCSRUsers() map[string]string {
	w.t.Helper()
	l := &certv1.CertificateSigningRequestList{}
	if err := w.kube.List(context.Background(), l); err != nil {
		w.t.Fatal(err)
	}
	out := map[string]string{}
	for _, c := range l.Items {
		if c.Spec.SignerName == certv1.KubeAPIServerClientKubeletSignerName && strings.HasPrefix(c.Spec.Username, "system:bootstrap:") {
			out[c.Name] = c.Spec.Username
		}
	}
	return out
}

// newCSRs lists the kubelet client CSRs not in before, as "name(user)".
func (w *world) newCSRs(before map[string]bool) []string {
	var out []string
	for name, user := range w.clientCSRUsers() {
		if !before[name] {
			out = append(out, name+"("+user+")")
		}
	}
	sort.Strings(out)
	return out
}

func (w *world) clientCSRs() map[string]bool {
	out := map[string]bool{}
	for n := range w.clientCSRUsers() {
		out[n] = true
	}
	return out
}

// nodeWatch records every Node UID seen per name (a Node deleted and
// created again is a second join).
type nodeWatch struct {
	poller
	mu   sync.Mutex
	uids map[string]map[string]bool
}

func (w *world) watchNodes() *nodeWatch {
	nw := &nodeWatch{uids: map[string]map[string]bool{}}
	nw.run(250*time.Millisecond, func() {
		l := &corev1.NodeList{}
		if err := w.kube.List(context.Background(), l); err != nil {
			return
		}
		nw.mu.Lock()
		defer nw.mu.Unlock()
		for _, n := range l.Items {
			if nw.uids[n.Name] == nil {
				nw.uids[n.Name] = map[string]bool{}
			}
			nw.uids[n.Name][string(n.UID)] = true
		}
	})
	return nw
}

func (nw *nodeWatch) stop() map[string][]string {
	nw.poller.stop()
	nw.mu.Lock()
	defer nw.mu.Unlock()
	out := map[string][]string{}
	for name, uids := range nw.uids {
		for u := range uids {
			out[name] = append(out[name], u)
		}
		sort.Strings(out[name])
	}
	return out
}

// poller runs f every interval in a goroutine until stop.
type poller struct {
	once sync.Once
	done chan struct{}
	wg   sync.WaitGroup
}

func (p *poller) run(interval time.Duration, f func()) {
	p.done = make(chan struct{})
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			f()
			select {
			case <-p.done:
				return
			case <-time.After(interval):
			}
		}
	}()
}

func (p *poller) stop() {
	p.once.Do(func() { close(p.done) })
	p.wg.Wait()
}

// freeze SIGSTOPs the controller's process group (SIGKILL still ends it).
func (c *controller) freeze() {
	if c.cmd != nil {
		_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGSTOP)
	}
}
