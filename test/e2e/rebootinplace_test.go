//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/dklesev/kpssh/apis/v1beta1"
)

// rebootInPlace: a reboot committed on the joined node's NodeClaim (what
// Karpenter's repair does for a RebootNode policy: Rebooting=True,
// RebootRequested) goes through Karpenter's own reboot controller, which
// calls Reboot: kpssh runs the default reboot phase, the host reboots, its
// kubelet comes back by itself — the same host, Node and claim, no leave,
// no join — and Karpenter sees the new boot id and Ready: RebootSucceeded.
func rebootInPlace(w *world, st *state) {
	ctx := context.Background()
	host, claim := w.joined("")
	i := w.hostIndex(host.Name)
	node := &corev1.Node{}
	if err := w.kube.Get(ctx, client.ObjectKey{Name: host.Name}, node); err != nil {
		w.t.Fatal(err)
	}
	before := node.Status.NodeInfo.BootID
	// Forceful (no drain): the pause pod rides the reboot.
	orig := claim.DeepCopy()
	claim.Annotations[karpv1.RebootTerminationGracePeriodAnnotationKey] = "0s"
	if err := w.kube.Patch(ctx, claim, client.MergeFrom(orig)); err != nil {
		w.t.Fatal(err)
	}
	orig = claim.DeepCopy()
	claim.StatusConditions().SetTrueWithReason(karpv1.ConditionTypeRebooting, karpv1.RebootReasonRequested, "e2e: reboot in place")
	if err := w.kube.Status().Patch(ctx, claim, client.MergeFrom(orig)); err != nil {
		w.t.Fatal(err)
	}
	start := time.Now()
	w.eventually("RebootSucceeded on the NodeClaim", 8*time.Minute, func() (bool, string) {
		c := &karpv1.NodeClaim{}
		if err := w.kube.Get(ctx, client.ObjectKey{Name: claim.Name}, c); err != nil {
			return false, err.Error()
		}
		cond := c.StatusConditions().Get(karpv1.ConditionTypeRebooting)
		h := w.sshHost(host.Name)
		return cond != nil && cond.Reason == karpv1.RebootReasonSucceeded,
			fmt.Sprintf("Rebooting=%+v; host %s reboot %+v", cond, h.Status.State, h.Status.Reboot)
	})
	w.t.Logf("reboot in place: RebootSucceeded %s after the request", time.Since(start).Round(time.Second))
	if err := w.kube.Get(ctx, client.ObjectKey{Name: host.Name}, node); err != nil {
		w.t.Fatalf("the Node %s is gone after the reboot: %v", host.Name, err)
	}
	if node.Status.NodeInfo.BootID == before || !nodeReady(node) {
		w.t.Fatalf("Node %s boot id %s → %s, Ready %v", node.Name, before, node.Status.NodeInfo.BootID, nodeReady(node))
	}
	h := w.sshHost(host.Name)
	if h.Status.State != v1beta1.HostInUse || h.Status.ClaimRef == nil || h.Status.ClaimRef.UID != claim.UID {
		w.t.Fatalf("host after the reboot: state %s claim %+v", h.Status.State, h.Status.ClaimRef)
	}
	if h.Status.LastPhase == nil || h.Status.LastPhase.Phase != v1beta1.PhaseReboot {
		w.t.Errorf("last phase %+v: a leave or join ran during the reboot", h.Status.LastPhase)
	}
	w.eventually("the host controller sees the host back", 2*time.Minute, func() (bool, string) {
		h := w.sshHost(host.Name)
		return h.Status.Reboot != nil && h.Status.Reboot.Result == v1beta1.RebootReturned, fmt.Sprintf("%+v", h.Status.Reboot)
	})
	if u := w.units(i); u != unitsJoined {
		w.t.Errorf("units after the reboot: %q, want %q", u, unitsJoined)
	}
	if live := w.nodeClaims(); len(live) != 1 || live[0].Name != claim.Name {
		var names []string
		for _, c := range live {
			names = append(names, c.Name)
		}
		w.t.Errorf("NodeClaims after the reboot: %s, want only %s", strings.Join(names, " "), claim.Name)
	}
}
