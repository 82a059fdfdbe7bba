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
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/dklesev/kpssh/apis/v1beta1"
)

// crashRig is where crash points look and what they release: the plain
// world (script phases run locally: crashResume), role phases run locally,
// or phase Jobs (crashResumeRoles).
type crashRig struct {
	*world
	exec    string // "": script phases, local; execRole; execJob
	profile string // the profile a cold point bumps
	keep    string // execJob: the joined host the phase pods run on (never looked at, never released by a point)
	ns      string // execJob: the phase Jobs' namespace
}

const (
	execRole = "role" // role phases, ansible-playbook a child of the controller
	execJob  = "job"  // phase Jobs on keep's kubelet
)

// base is the workload's replicas with no point's host joined.
func (w *crashRig) base() int {
	if w.keep != "" {
		return 1
	}
	return 0
}

// snapshot is what a crash point looks at: the host holding the current
// NodeClaim, that claim, whether its phase is in flight and the host's Node.
type snapshot struct {
	host  *v1beta1.SSHHost  // nil: no host is claimed
	claim *karpv1.NodeClaim // nil: the claim is gone
	// phase: the host's phase is in flight. Script phases: the script
	// (`bash -s <run tag>`) runs on the host. Role phases: the controller's
	// ansible-playbook run against the host is live and has connected (a
	// role's tasks are short-lived Python processes on the host, with gaps
	// between them: the host's process table cannot tell). Phase Jobs: the
	// Job's pod runs, or its script still runs on the host.
	phase bool
	job   *phaseJob    // execJob: the claim's current phase Job, nil: none
	node  *corev1.Node // the Node named like the host, nil: none
}

// phaseJob is a phase Job as a crash point sees it.
type phaseJob struct {
	name, phase, key string
	uid              types.UID
	state            string // pending (no pod running yet), running, done (the pod terminated)
}

func (s snapshot) String() string {
	if s.host == nil {
		return "no claimed host"
	}
	h := s.host
	out := fmt.Sprintf("%s %s installed=%q token=%v phase=%v", h.Name, h.Status.State, h.Status.InstalledProfile, h.Status.BootstrapTokenID != "", s.phase)
	if s.job != nil {
		out += fmt.Sprintf(" job=%s(%s %s)", s.job.name, s.job.phase, s.job.state)
	}
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

// jobIs: the claim's current phase Job is of phase ph and in state st.
func (s snapshot) jobIs(ph, st string) bool {
	return s.job != nil && s.job.phase == ph && s.job.state == st
}

// look takes a snapshot. The host is the one whose claim is live (Create
// side) or deleting (Delete side), keep aside; scripts are seen in the
// host's process table (hostenv Procs: cheap, no SSH).
func (w *crashRig) look() snapshot {
	var s snapshot
	for _, h := range w.sshHosts() {
		if h.Status.ClaimRef != nil && h.Name != w.keep {
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
	switch w.exec {
	case execRole:
		s.phase = w.ctrl.liveRun(s.host.Spec.Address)
	case execJob:
		s.job = w.currentJob(s.host)
		s.phase = s.job != nil && s.job.state == "running" || w.scriptOn(w.hostIndex(s.host.Name))
	default:
		s.phase = w.scriptOn(w.hostIndex(s.host.Name))
	}
	n := &corev1.Node{}
	if err := w.kube.Get(context.Background(), client.ObjectKey{Name: s.host.Name}, n); err == nil {
		s.node = n
	}
	return s
}

// scriptOn: a phase script runs on host i.
func (w *world) scriptOn(i int) bool {
	return slices.ContainsFunc(w.hosts.Procs(i), func(p string) bool { return strings.Contains(p, "bash -s ") })
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

// unitsStopped: during leave, with the kubelet already stopped (the
// "during leave" point of a leave past its first step).
func (w *crashRig) unitsStopped() crashPoint {
	return crashPoint{name: "during leave, kubelet already stopped", hit: stateless(func(s snapshot) bool {
		return s.deleting() && s.phase && strings.HasPrefix(w.units(w.hostIndex(s.host.Name)), "kubelet=disabled/inactive")
	})}
}

// crashResume: SIGKILL the controller (its whole process group, so
// in-flight ansible-playbook runs die with it) at 11 points of Create and
// Delete, restart it, and check that it converges: one claim on one host,
// one Node created once from one CSR, no leaked bootstrap token, the other
// hosts Available; after the release every host Available with kubelet and
// containerd disabled.
func crashResume(w *world, st *state) {
	r := &crashRig{world: w, profile: w.profile}
	r.run("script phases", createPoints, []crashPoint{deletePoints[0], deletePoints[1], deletePoints[2], r.unitsStopped()})
}

// run crashes at every point: each Create-side point paired with the
// Delete-side point of the same index (the host the first one joined
// leaves through the second), a point without a partner released plainly.
// It fails the test for every point never hit.
func (w *crashRig) run(what string, ups, downs []crashPoint) {
	w.t.Helper()
	start := time.Now()
	var hit, missed []string
	count := func(p crashPoint, ok bool) {
		if ok {
			hit = append(hit, p.name)
		} else {
			missed = append(missed, p.name)
		}
	}
	for i := 0; i < max(len(ups), len(downs)); i++ {
		if i < len(ups) {
			count(ups[i], w.crashUp(ups[i]))
		} else {
			w.scale(w.base() + 1)
			w.joinedOne()
		}
		if i < len(downs) {
			count(downs[i], w.crashDown(downs[i]))
		} else {
			w.release()
		}
	}
	w.t.Logf("%s: %d of %d crash points hit in %v: %s", what, len(hit), len(ups)+len(downs), time.Since(start).Round(time.Second), strings.Join(hit, "; "))
	if len(missed) > 0 {
		w.t.Errorf("%s: crash points never hit: %s", what, strings.Join(missed, "; "))
	}
}

// bootstrapping reports whether the kill at s caught the host's kubelet
// mid-bootstrap (its CSR sent, no certificate on the host yet): the resumed
// join restarts it with a fresh token and it may send a second CSR; one
// that already held its certificate must not.
func (w *crashRig) bootstrapping(s snapshot, csrsBefore map[string]bool) bool {
	if s.host == nil || len(w.newCSRs(csrsBefore)) == 0 {
		return false
	}
	out, _, err := w.hosts.Run(w.hostIndex(s.host.Name), "test -e /var/lib/kubelet/pki/kubelet-client-current.pem && echo cert || echo none")
	if err != nil || strings.TrimSpace(out) != "none" {
		return false
	}
	w.t.Logf("crash at %s: the kubelet was bootstrapping (CSR sent, no certificate yet)", s)
	return true
}

// crashLaunch is a scale-up by one that crash points interrupt: the client
// CSRs before it, the Nodes created since, and how many CSRs the resumed
// Create may leave — one, and one more per kill that caught the kubelet
// bootstrapping (atKill).
type crashLaunch struct {
	csrs    map[string]bool
	nodes   *nodeWatch
	maxCSRs int
	atKill  func(snapshot)
}

// launch scales up by one, after bumping the profile's version when the
// launch must install (cold).
func (w *crashRig) launch(cold bool) *crashLaunch {
	if cold {
		w.bumpProfileOf(w.profile)
	}
	l := &crashLaunch{csrs: w.clientCSRs(), nodes: w.watchNodes(), maxCSRs: 1}
	l.atKill = func(s snapshot) {
		if w.bootstrapping(s, l.csrs) {
			l.maxCSRs++
		}
	}
	w.scale(w.base() + 1)
	return l
}

// chain crashes at every point of ups during one launch (a cold one when
// any of them is cold) and at every point of downs during that host's one
// Delete: after each SIGKILL the restarted controller resumes and the next
// point is waited for in the same run, so that a phase of tens of seconds
// (a role's, a Job's) is paid for once, not once per point. The checks of
// crashUp and crashDown run once the launch and the release converged,
// over every crash of the chain: one Node created once, one CSR per
// bootstrap a kill interrupted, the claim crashed at finished on the same
// host, no token, nothing of a phase left. A point the chain passed
// without hitting it is tried again on its own (crashUp, crashDown). It
// fails the test for every point never hit.
func (w *crashRig) chain(what string, ups, downs []crashPoint) {
	w.t.Helper()
	// From a world the scenario before left: its hosts Available and its
	// Nodes gone. A Node of the last scenario still being deleted when a
	// point joins the same host again is counted as that host joined twice
	// (seen after JobExec's leave Job: h2's old Node, then its new one).
	w.allLeftBut(what+": the world before the points", w.keep)
	start := time.Now()
	var hit, missed []string
	l := w.launch(slices.ContainsFunc(ups, func(p crashPoint) bool { return p.cold }))
	ats := map[string]snapshot{}
	var retryUp, retryDown []crashPoint
	w.crashEach(ups, l.atKill, func(s snapshot) bool {
		return s.host != nil && s.host.Status.State == v1beta1.HostInUse && s.node != nil && nodeReady(s.node)
	}, func(p crashPoint, ok bool, at snapshot) {
		if ok {
			ats[p.name] = at
			hit = append(hit, p.name)
		} else {
			retryUp = append(retryUp, p)
		}
	})
	crashed := time.Now()
	host, claim := w.joinedOne()
	w.resumedCreate(what+" (launch)", host, l.csrs, l.maxCSRs, l.nodes.stop())
	for _, p := range ups {
		at, ok := ats[p.name]
		if !ok {
			continue
		}
		if at.host == nil || at.claim == nil || at.host.Name != host.Name || at.claim.UID != claim.UID {
			w.t.Errorf("%s: crashed at %s, but %s joined as claim %s", p.name, at, host.Name, claim.Name)
		}
		w.jobAfterResume(p.name, at)
	}
	w.t.Logf("%s: launch resumed to Ready and checked %v after the last SIGKILL", what, time.Since(crashed).Round(100*time.Millisecond))

	w.deleteClaims()
	w.crashEach(downs, nil, func(s snapshot) bool { return s.host == nil }, func(p crashPoint, ok bool, at snapshot) {
		if ok {
			ats[p.name] = at
			hit = append(hit, p.name)
		} else {
			retryDown = append(retryDown, p)
		}
	})
	crashed = time.Now()
	w.allLeftBut(what+": Delete converged after the crashes", w.keep)
	w.noPhaseLeft(what + " (release)")
	for _, p := range downs {
		if at, ok := ats[p.name]; ok {
			w.jobAfterResume(p.name, at)
		}
	}
	w.t.Logf("%s: all hosts Available and checked %v after the last SIGKILL", what, time.Since(crashed).Round(100*time.Millisecond))

	for _, p := range retryUp {
		w.t.Logf("crash %s: passed in the chain, alone now", p.name)
		if w.crashUp(p) {
			hit = append(hit, p.name)
		} else {
			missed = append(missed, p.name)
		}
		w.release()
	}
	for _, p := range retryDown {
		w.t.Logf("crash %s: passed in the chain, alone now", p.name)
		w.scale(w.base() + 1)
		w.joinedOne()
		if w.crashDown(p) {
			hit = append(hit, p.name)
		} else {
			missed = append(missed, p.name)
		}
	}
	w.t.Logf("%s: %d of %d crash points hit in %v: %s", what, len(hit), len(ups)+len(downs), time.Since(start).Round(time.Second), strings.Join(hit, "; "))
	if len(missed) > 0 {
		w.t.Errorf("%s: crash points never hit: %s", what, strings.Join(missed, "; "))
	}
}

// crashEach waits for each point of ps in turn and crashes there; a point
// counts as passed (done gets false) once the flow reached a later point's
// moment or done. crashAt's bound holds per point.
func (w *crashRig) crashEach(ps []crashPoint, atKill func(snapshot), final func(snapshot) bool, done func(crashPoint, bool, snapshot)) {
	w.t.Helper()
	hits := make([]func(snapshot) bool, len(ps))
	for i, p := range ps {
		hits[i] = p.hit()
	}
	for i, p := range ps {
		later := hits[i+1:]
		ok, at := w.crashAtWith(p, hits[i], atKill, func(s snapshot) bool {
			return final(s) || slices.ContainsFunc(later, func(h func(snapshot) bool) bool { return h(s) })
		})
		done(p, ok, at)
	}
}

// attempts bounds the retries of a point whose moment the poll missed (the
// flow ran past it): the world converges anyway, then the point is tried
// again.
const attempts = 3

// crashUp scales up by one and crashes at p; then checks the resumed
// Create. It reports whether p was hit.
func (w *crashRig) crashUp(p crashPoint) bool {
	w.t.Helper()
	for a := 1; a <= attempts; a++ {
		l := w.launch(p.cold)
		hit, at := w.crashAt(p, l.atKill, func(s snapshot) bool {
			return s.host != nil && s.host.Status.State == v1beta1.HostInUse && s.node != nil && nodeReady(s.node)
		})
		crashed := time.Now()
		host, claim := w.joinedOne()
		w.resumedCreate(p.name, host, l.csrs, l.maxCSRs, l.nodes.stop())
		if hit {
			// The resume finished the launch it interrupted: the same
			// claim on the same host, not a failed one replaced.
			if at.host == nil || at.claim == nil || at.host.Name != host.Name || at.claim.UID != claim.UID {
				w.t.Errorf("%s: crashed at %s, but %s joined as claim %s", p.name, at, host.Name, claim.Name)
			}
			w.jobAfterResume(p.name, at)
			w.t.Logf("crash %s: resumed to Ready and checked %v after the SIGKILL", p.name, time.Since(crashed).Round(100*time.Millisecond))
			return true
		}
		w.t.Logf("crash %s: missed (attempt %d), again", p.name, a)
		w.release()
	}
	w.t.Errorf("crash point %q: missed %d times", p.name, attempts)
	return false
}

// crashDown deletes the joined host's claim (after scaling down, so no
// replacement) and crashes at p; then checks the resumed Delete. It
// reports whether p was hit.
func (w *crashRig) crashDown(p crashPoint) bool {
	w.t.Helper()
	for a := 1; a <= attempts; a++ {
		if a > 1 {
			w.scale(w.base() + 1)
			w.joinedOne()
		}
		w.deleteClaims()
		hit, at := w.crashAt(p, nil, func(s snapshot) bool { return s.host == nil })
		crashed := time.Now()
		w.allLeftBut(p.name+": converged after the crash", w.keep)
		w.noPhaseLeft(p.name)
		if hit {
			w.jobAfterResume(p.name, at)
			w.t.Logf("crash %s: all hosts Available and checked %v after the SIGKILL", p.name, time.Since(crashed).Round(100*time.Millisecond))
			return true
		}
		w.t.Logf("crash %s: missed (attempt %d), again", p.name, a)
	}
	w.t.Errorf("crash point %q: missed %d times", p.name, attempts)
	return false
}

// crashAt polls snapshots until p hits (crash, restart: true and the
// snapshot crashed at) or passed says the flow went beyond it (false).
// atKill, if set, looks at the world while the controller is dead.
func (w *crashRig) crashAt(p crashPoint, atKill func(snapshot), passed func(snapshot) bool) (bool, snapshot) {
	w.t.Helper()
	return w.crashAtWith(p, p.hit(), atKill, passed)
}

// crashAtWith is crashAt with p's detector given.
func (w *crashRig) crashAtWith(p crashPoint, hit func(snapshot) bool, atKill func(snapshot), passed func(snapshot) bool) (bool, snapshot) {
	w.t.Helper()
	deadline := time.Now().Add(4 * time.Minute)
	for time.Now().Before(deadline) {
		s := w.look()
		if hit(s) {
			if p.settle {
				w.ctrl.freeze()
				// Bounded beyond the phase timeouts of the points (a role's
				// leave under load takes 2 min; the frozen controller cannot
				// enforce them).
				w.eventually(p.name+": the phase ended on the host (controller frozen)", 6*time.Minute, func() (bool, string) {
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
func (w *crashRig) resumedCreate(point string, host *v1beta1.SSHHost, csrsBefore map[string]bool, maxCSRs int, nodeUIDs map[string][]string) {
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
		if name != host.Name && name != w.keep {
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
		if h.Name != host.Name && h.Name != w.keep && !extra[h.Name] && h.Status.State != v1beta1.HostAvailable {
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

// noPhaseLeft: nothing of a phase outlives the crash. No phase script on
// any host (one whose controller died loses its SSH channel and must end,
// not run on beside the resumed phase); role phases: no module (python3)
// either; phase Jobs: none still active, at most one per run key (a stale
// one replaced, not kept beside), no inputs Secret left.
func (w *crashRig) noPhaseLeft(point string) {
	w.t.Helper()
	w.eventually(point+": no orphaned phase on the hosts", time.Minute, func() (bool, string) {
		var left []string
		for i, h := range w.hosts.Hosts() {
			for _, p := range w.hosts.Procs(i) {
				if strings.Contains(p, "bash -s ") || w.exec == execRole && strings.Contains(p, "python3") {
					left = append(left, h.Name+": "+p)
				}
			}
		}
		if w.exec == execJob {
			left = append(left, w.jobsLeft()...)
		}
		return len(left) == 0, strings.Join(left, "; ")
	})
}

// release scales down and deletes the claim (faster than waiting for
// consolidation), then waits until everything left.
func (w *crashRig) release() {
	w.t.Helper()
	w.deleteClaims()
	w.allLeftBut("released", w.keep)
}

// deleteClaims scales down to base and deletes every NodeClaim but keep's.
// With a host kept, the other host's pause pod goes first on the scale-down
// (lowest deletion cost): keep stays busy.
func (w *crashRig) deleteClaims() {
	w.t.Helper()
	keepClaim := ""
	if w.keep != "" {
		if h := w.sshHost(w.keep); h.Status.ClaimRef != nil {
			keepClaim = h.Status.ClaimRef.Name
		}
		var pods corev1.PodList
		if err := w.kube.List(context.Background(), &pods, client.InNamespace("default"), client.MatchingLabels{"app": "pause"}); err != nil {
			w.t.Fatal(err)
		}
		for _, p := range pods.Items {
			if p.Spec.NodeName != w.keep {
				w.mustKubectl("-n", "default", "annotate", "pod", p.Name, "controller.kubernetes.io/pod-deletion-cost=-1000", "--overwrite")
			}
		}
	}
	w.scale(w.base())
	for _, c := range w.nodeClaims() {
		if c.Name == keepClaim {
			continue
		}
		if err := w.kube.Delete(context.Background(), &c); client.IgnoreNotFound(err) != nil {
			w.t.Fatal(err)
		}
	}
}

// bumpProfile raises the world profile's spec.version: every host's
// install marker is stale, so the next claim runs install.
func (w *world) bumpProfile() { w.t.Helper(); w.bumpProfileOf(w.profile) }

func (w *world) bumpProfileOf(profile string) {
	w.t.Helper()
	v, err := strconv.Atoi(w.mustKubectl("get", "sshjoinprofile", profile, "-o", "jsonpath={.spec.version}"))
	if err != nil {
		w.t.Fatalf("profile version: %v", err)
	}
	w.mustKubectl("patch", "sshjoinprofile", profile, "--type=merge", "-p", fmt.Sprintf(`{"spec":{"version":"%d"}}`, v+1))
}

// joinedOne is joined beside the kept host.
func (w *crashRig) joinedOne() (*v1beta1.SSHHost, *karpv1.NodeClaim) {
	w.t.Helper()
	return w.joinedExcept("", w.keep)
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
