//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dklesev/kpssh/test/testenv"
)

// The chart's leader election (charts/kpssh values leaderElection, _env.tpl):
// its own Lease in the release namespace. Karpenter core's operator runs it
// with controller-runtime's timings (lease 15 s, renew deadline 10 s, retry
// 2 s); neither the chart nor core exposes them, so the e2e keeps them.
const (
	leaseName = "kpssh-leader-election"
	leaseNS   = poolNS
)

// replicas starts one controller per name with leader election on, each in
// its own UTS namespace with that host name (as pods have: the Lease's
// holderIdentity is "<hostname>_<uuid>"), its own log and ports; the
// world's controller must be stopped.
func (w *world) replicas(names ...string) []*controller {
	w.t.Helper()
	var out []*controller
	for _, n := range names {
		dir := filepath.Join(w.logDir, n)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			w.t.Fatal(err)
		}
		c := &controller{t: w.t, bin: w.ctrl.bin, dir: w.ctrl.dir, logDir: dir, metricsPort: testenv.MustFreePort(w.t), hostname: n, hostsFile: w.ctrl.hostsFile,
			env: append(append([]string(nil), w.ctrl.env...), leaderElectionEnv(leaseName, leaseNS)...)}
		c.start()
		out = append(out, c)
	}
	return out
}

// leaderElectionEnv is what the chart sets with leaderElection.enabled (the
// later DISABLE_LEADER_ELECTION wins over the world's).
func leaderElectionEnv(name, ns string) []string {
	return []string{"DISABLE_LEADER_ELECTION=false", "LEADER_ELECTION_NAME=" + name, "LEADER_ELECTION_NAMESPACE=" + ns}
}

// leaseHolder is the Lease's holderIdentity ("" when none or released).
func (w *world) leaseHolder(ns, name string) string {
	l := &coordinationv1.Lease{}
	if err := w.kube.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, l); err != nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// leader waits until one of reps holds the Lease and returns it.
func (w *world) leader(reps []*controller, not *controller) *controller {
	w.t.Helper()
	var got *controller
	w.eventually("a replica holds the Lease", 2*time.Minute, func() (bool, string) {
		h := w.leaseHolder(leaseNS, leaseName)
		for _, c := range reps {
			if c != not && strings.HasPrefix(h, c.hostname+"_") {
				got = c
				return true, ""
			}
		}
		for _, c := range reps {
			if why, gone := c.exitedOnItsOwn(); gone && c != not {
				w.t.Fatalf("replica %s exited on its own: %s", c.hostname, why)
			}
		}
		return false, "holder " + strconv.Quote(h)
	})
	return got
}

// highAvailability: two replicas with leader election; the leader is
// SIGKILLed (its process alone, as the kernel's OOM killer does) while the
// join runs on the host; the other takes the Lease over and the claim
// converges on the same host: one Node created once, at most the CSRs the
// crash explains, no bootstrap token left, no phase script left on a host,
// and nothing of the killed replica's children (ansible-playbook, its
// workers, ssh and the ControlPersist master) left on this machine.
func highAvailability(w *world, st *state) {
	w.allLeft("HA starts with nothing joined (what the previous scenario left, its leave given time)")
	w.ctrl.stop()
	reps := w.replicas("kpssh-ha-a", "kpssh-ha-b")
	defer func() {
		for _, c := range reps {
			c.stop()
		}
		w.ctrl.start()
		w.scale(0)
		w.allLeft("HA: single controller again, scaled to 0")
	}()
	t0 := time.Now()
	lead := w.leader(reps, nil)
	w.t.Logf("leader %s after %v (holder %s)", lead.hostname, time.Since(t0).Round(100*time.Millisecond), w.leaseHolder(leaseNS, leaseName))

	// A warm script join is over in about a second on a quiet machine, too
	// short to be seen running by a poll of the API and the host (CI twice:
	// "the join ended before it was seen running", once with containerd's
	// start delayed by 5 s): for this scenario containerd's start waits on
	// every host until the test opens a gate, after the kill, so the join
	// is held mid-phase on the host however slow the poll is.
	w.gateContainerd(true)
	defer w.gateContainerd(false)

	rig := &crashRig{world: w, profile: w.profile} // script phases, seen as crash_test.go sees them
	csrs := w.clientCSRs()
	nodes := w.watchNodes()
	w.scale(1)
	var at snapshot
	var kids []procID
	deadline := time.Now().Add(4 * time.Minute)
	for {
		s := rig.look()
		if s.claimed() && s.token() && s.phase { // the join runs on the host
			at = s
			kids = familyOf(lead.cmd.Process.Pid)
			break
		}
		if s.host != nil && s.node != nil && nodeReady(s.node) {
			w.t.Fatalf("HA: the join ended before it was seen running (%s)", s)
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("HA: no join seen in 4 minutes; last %s", s)
		}
		time.Sleep(30 * time.Millisecond)
	}
	_ = syscall.Kill(lead.cmd.Process.Pid, syscall.SIGKILL)
	<-lead.done
	killed := time.Now()
	w.openGate()
	w.t.Logf("HA: SIGKILLed leader %s (pid %d) during the join: %s; its processes then: %s", lead.hostname, lead.cmd.Process.Pid, at, procList(kids))

	// A kubelet killed mid-bootstrap may send a second CSR (see crashLaunch).
	maxCSRs := 1
	if rig.bootstrapping(at, csrs) {
		maxCSRs = 2
	}

	// The killed replica's children end with it.
	w.eventually("HA: the killed replica's processes gone", 30*time.Second, func() (bool, string) {
		left := alive(kids)
		return len(left) == 0, procList(left)
	})
	w.t.Logf("HA: killed replica's processes gone %v after the SIGKILL", time.Since(killed).Round(100*time.Millisecond))

	next := w.leader(reps, lead)
	w.t.Logf("HA: %s took the Lease over %v after the SIGKILL", next.hostname, time.Since(killed).Round(100*time.Millisecond))
	host, claim := w.joined("")
	rig.resumedCreate("HA", host, csrs, maxCSRs, nodes.stop())
	if at.host.Name != host.Name || at.claim == nil || at.claim.UID != claim.UID {
		w.t.Errorf("HA: killed during the join (%s), but claim %s joined %s", at, claim.Name, host.Name)
	}
	w.t.Logf("HA: converged on %s %v after the SIGKILL: %s", host.Name, time.Since(killed).Round(100*time.Millisecond), timeline(claim))
	if why, gone := next.exitedOnItsOwn(); gone {
		w.t.Errorf("HA: the new leader exited: %s", why)
	}
}

// containerdGate is the file containerd's start waits for under
// gateContainerd (on /run: gone with a reboot).
const containerdGate = "/run/kpssh-e2e-gate"

// gateContainerd adds (on) or removes a drop-in on every host of the world
// that holds containerd's start until containerdGate exists (10 minutes at
// most, then the start fails). Removing it opens the gate too, so a start
// held when a scenario fails goes on.
func (w *world) gateContainerd(on bool) {
	w.t.Helper()
	const dropin = "/etc/systemd/system/containerd.service.d/99-e2e-gate.conf"
	cmd := "touch " + containerdGate + " && rm -f " + dropin + " && systemctl daemon-reload"
	if on {
		cmd = "rm -f " + containerdGate + " && mkdir -p " + filepath.Dir(dropin) + " && printf '[Service]\\nTimeoutStartSec=10min\\nExecStartPre=/bin/sh -c \"until [ -e " + containerdGate + " ]; do sleep 0.1; done\"\\n' >" + dropin + " && systemctl daemon-reload"
	}
	w.onEveryHost(cmd)
}

// openGate lets every host's held containerd start go on.
func (w *world) openGate() {
	w.t.Helper()
	w.onEveryHost("touch " + containerdGate)
}

// onEveryHost runs cmd on every host of the world; a failure fails the test.
func (w *world) onEveryHost(cmd string) {
	w.t.Helper()
	for i := range w.hosts.Hosts() {
		if out, _, err := w.hosts.Run(i, cmd); err != nil {
			w.t.Fatalf("host %d: %s: %v %s", i, cmd, err, out)
		}
	}
}

// procID is a process by pid and start time (a reused pid is another).
type procID struct {
	pid   int
	start string
	cmd   string
}

// procStat reads pid's parent, state and start time from /proc.
func procStat(pid int) (ppid int, state, start string, ok bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, "", "", false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, "", "", false
	}
	f := strings.Fields(s[i+1:]) // state ppid pgrp session … starttime (field 22 of stat)
	if len(f) < 20 {
		return 0, "", "", false
	}
	ppid, _ = strconv.Atoi(f[1])
	return ppid, f[0], f[19], true
}

func cmdline(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
}

func allPIDs() []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		if p, err := strconv.Atoi(e.Name()); err == nil {
			out = append(out, p)
		}
	}
	return out
}

// familyOf lists root's descendants and every process whose command line
// names the run directory (/dev/shm/kpssh-…) one of them works in: the ssh
// ControlPersist master daemonizes away from its parent.
func familyOf(root int) []procID {
	parent := map[int]int{}
	for _, p := range allPIDs() {
		if pp, _, _, ok := procStat(p); ok {
			parent[p] = pp
		}
	}
	isKid := func(p int) bool {
		for i := 0; i < 64 && p > 1; i++ {
			if p = parent[p]; p == root {
				return true
			}
		}
		return false
	}
	var out []procID
	dirs := map[string]bool{}
	for p := range parent {
		if !isKid(p) {
			continue
		}
		if _, _, st, ok := procStat(p); ok {
			out = append(out, procID{p, st, cmdline(p)})
		}
		if d, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", p)); err == nil && strings.HasPrefix(d, "/dev/shm/kpssh-") {
			dirs[d] = true
		}
	}
	for p := range parent {
		if isKid(p) || p == root {
			continue
		}
		c := cmdline(p)
		for d := range dirs {
			if strings.Contains(c, d) {
				if _, _, st, ok := procStat(p); ok {
					out = append(out, procID{p, st, c})
				}
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].pid < out[j].pid })
	return out
}

// alive is the subset of ps still running (zombies count as gone: this
// machine's PID 1 may not reap orphans).
func alive(ps []procID) []procID {
	var out []procID
	for _, p := range ps {
		if _, state, st, ok := procStat(p.pid); ok && st == p.start && state != "Z" {
			out = append(out, p)
		}
	}
	return out
}

func procList(ps []procID) string {
	var s []string
	for _, p := range ps {
		s = append(s, fmt.Sprintf("%d[%s]", p.pid, tail(p.cmd, 80)))
	}
	return strings.Join(s, "; ")
}
