package startuptaint

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dklesev/kpssh/apis/v1beta1"
)

// verdict is one gate's evaluation; gate describes what was checked (and,
// for podsReady, how far it got) for events and logs.
type verdict struct {
	key   string
	gate  string
	holds bool
}

// invalidGateError is a gate that can never be evaluated as written (a
// selector that does not parse); the CRD's schema cannot rule all of these out.
type invalidGateError struct{ msg string }

func (e *invalidGateError) Error() string { return e.msg }

func (c *Controller) evaluate(ctx context.Context, node *corev1.Node, g *v1beta1.StartupTaintGate) (verdict, error) {
	switch w := g.RemoveWhen; {
	case w.PodsReady != nil && w.NodeCondition == nil:
		return c.podsReady(ctx, node, g.TaintKey, w.PodsReady)
	case w.NodeCondition != nil && w.PodsReady == nil:
		nc := w.NodeCondition
		v := verdict{key: g.TaintKey, gate: fmt.Sprintf("nodeCondition %s=%s", nc.Type, nc.Status)}
		for _, cond := range node.Status.Conditions {
			if string(cond.Type) == nc.Type && cond.Status == nc.Status {
				v.holds = true
			}
		}
		return v, nil
	default:
		return verdict{}, &invalidGateError{msg: "removeWhen needs exactly one of podsReady or nodeCondition"}
	}
}

// podsReady counts Ready, non-terminating Pods matching the gate that are
// bound to this node; pods elsewhere or in other namespaces never count.
func (c *Controller) podsReady(ctx context.Context, node *corev1.Node, key string, g *v1beta1.PodsReadyGate) (verdict, error) {
	if g.Selector == nil {
		return verdict{}, &invalidGateError{msg: "podsReady.selector is required"}
	}
	sel, err := metav1.LabelSelectorAsSelector(g.Selector)
	if err != nil {
		return verdict{}, &invalidGateError{msg: fmt.Sprintf("podsReady.selector: %v", err)}
	}
	want := g.MinReady
	if want < 1 {
		want = 1 // the CRD default; a zero here is an unset field, not "no pods needed"
	}
	list := &corev1.PodList{}
	if err := c.Client.List(ctx, list, client.InNamespace(g.Namespace), client.MatchingLabelsSelector{Selector: sel},
		client.MatchingFields{podNodeIndex: node.Name}); err != nil {
		return verdict{}, err
	}
	var ready int32
	for i := range list.Items {
		if p := &list.Items[i]; p.Spec.NodeName == node.Name && p.DeletionTimestamp.IsZero() && podReady(p) {
			ready++
		}
	}
	return verdict{key: key, holds: ready >= want,
		gate: fmt.Sprintf("podsReady %d/%d pods %q in namespace %s Ready on the node", ready, want, sel.String(), g.Namespace)}, nil
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
