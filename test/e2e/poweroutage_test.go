//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/dklesev/kpssh/apis/v1beta1"
)

// powerOutage: a joined host loses power, then its NodeClaim is deleted.
// Leave cannot run, so Delete releases the host Unhealthy (unclaimed) and
// Karpenter deletes the Node. Power comes back: the kubelet, still enabled,
// starts again on an unclaimed host of ours; the zombie guard runs leave
// and deletes the Node if it re-registered → Available, units disabled.
func powerOutage(w *world, st *state) {
	ctx := context.Background()
	w.scale(1)
	host, claim := w.joined("")
	name, i := host.Name, w.hostIndex(host.Name)
	states := w.watchHostStates(name)
	defer states.stop()

	w.hosts.Stop(i)
	cut := time.Now()
	// No replacement wanted: the pod goes away with the deployment's scale.
	w.scale(0)
	if err := w.kube.Delete(ctx, claim); client.IgnoreNotFound(err) != nil {
		w.t.Fatal(err)
	}
	w.eventually(name+" released Unhealthy, claim and Node gone", 6*time.Minute, func() (bool, string) {
		h := w.sshHost(name)
		c := &karpv1.NodeClaim{}
		err := w.kube.Get(ctx, client.ObjectKeyFromObject(claim), c)
		claimGone := client.IgnoreNotFound(err) == nil && err != nil
		nodes := len(w.nodes())
		return claimGone && nodes == 0 && h.Status.ClaimRef == nil && h.Status.State == v1beta1.HostUnhealthy,
			fmt.Sprintf("host %s claimRef=%v, claim gone=%v, %d Nodes", h.Status.State, h.Status.ClaimRef != nil, claimGone, nodes)
	})
	h := w.sshHost(name)
	if lp := h.Status.LastPhase; lp == nil || lp.Phase != v1beta1.PhaseLeave || lp.Result == v1beta1.PhaseSucceeded {
		w.t.Errorf("last phase %+v, want the failed leave of the powered-off host", lp)
	}
	if h.Status.BootstrapTokenID != "" || h.Status.ProviderID != "" {
		w.t.Errorf("released host keeps token %q / providerID %q", h.Status.BootstrapTokenID, h.Status.ProviderID)
	}
	w.t.Logf("power cut → released Unhealthy in %v (leave: %s)", time.Since(cut).Round(time.Second), h.Status.LastPhase.Message)
	if tk := w.tokens(); len(tk) != 0 {
		w.t.Errorf("bootstrap tokens left after the release: %v", tk)
	}

	zombieLogs := w.ctrl.countLog("zombie kubelet on unclaimed host", `"SSHHost":{"name":"`+name+`"`)
	w.hosts.Start(i)
	on := time.Now()
	w.allLeft("power back: zombie guard left, " + name + " Available")
	w.t.Logf("power on → Available, units disabled in %v", time.Since(on).Round(time.Second))

	if n := w.ctrl.countLog("zombie kubelet on unclaimed host", `"SSHHost":{"name":"`+name+`"`); n <= zombieLogs {
		w.t.Errorf("the zombie guard did not leave %s after power came back (controller log: %s)", name, w.ctrl.logPath())
	}
	// Karpenter's recorder drops a repeat of the same event on the same
	// object within 2 minutes (ZombieGuard may have left this host just
	// before), so the events are checked as present, the log above as new.
	evs := w.mustKubectl("-n", poolNS, "get", "events", "--field-selector", "involvedObject.name="+name, "-o", "jsonpath={.items[*].reason}")
	if !strings.Contains(evs, "ZombieKubelet") || !strings.Contains(evs, "ZombieLeft") {
		w.t.Errorf("events of %s: %q, want ZombieKubelet and ZombieLeft", name, evs)
	}
	seq := states.stop()
	w.t.Logf("%s states: %s", name, strings.Join(seq, " → "))
	if !subsequence(seq, string(v1beta1.HostInUse), string(v1beta1.HostUnhealthy), string(v1beta1.HostLeaving), string(v1beta1.HostAvailable)) {
		w.t.Errorf("%s went %v, want InUse → Unhealthy → Leaving (zombie guard) → Available", name, seq)
	}
}

// hostStates records the distinct successive states of one SSHHost.
type hostStates struct {
	poller
	mu  sync.Mutex
	seq []string
}

// watchHostStates polls host name's state every 200 ms (often enough to see
// the seconds-long Leaving of a zombie leave) until stop.
func (w *world) watchHostStates(name string) *hostStates {
	s := &hostStates{}
	s.run(200*time.Millisecond, func() {
		h := &v1beta1.SSHHost{}
		if err := w.kube.Get(context.Background(), client.ObjectKey{Namespace: poolNS, Name: name}, h); err != nil {
			return
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if st := string(h.Status.State); len(s.seq) == 0 || s.seq[len(s.seq)-1] != st {
			s.seq = append(s.seq, st)
		}
	})
	return s
}

func (s *hostStates) stop() []string {
	s.poller.stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.seq...)
}

// subsequence reports whether want appears in seq in order (not necessarily
// adjacent).
func subsequence(seq []string, want ...string) bool {
	j := 0
	for _, s := range seq {
		if j < len(want) && s == want[j] {
			j++
		}
	}
	return j == len(want)
}

// countLog counts the controller log's lines containing every one of subs.
func (c *controller) countLog(subs ...string) int {
	b, err := os.ReadFile(c.logPath())
	if err != nil {
		return 0
	}
	n := 0
lines:
	for _, l := range strings.Split(string(b), "\n") {
		for _, s := range subs {
			if !strings.Contains(l, s) {
				continue lines
			}
		}
		n++
	}
	return n
}
