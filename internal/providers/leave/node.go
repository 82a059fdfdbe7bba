package leave

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dklesev/kpssh/apis/v1beta1"
)

// MatchingNode finds the Node this host's kubelet registered: by providerID
// recorded on the host, else by InternalIP equal to the node address.
func MatchingNode(ctx context.Context, c client.Reader, h *v1beta1.SSHHost) (*corev1.Node, error) {
	nodes := &corev1.NodeList{}
	if err := c.List(ctx, nodes); err != nil {
		return nil, err
	}
	ip := h.Spec.NodeAddress
	if ip == "" {
		ip = h.Spec.Address
	}
	for i := range nodes.Items {
		n := &nodes.Items[i]
		if h.Status.ProviderID != "" && n.Spec.ProviderID == h.Status.ProviderID {
			return n, nil
		}
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP && a.Address == ip {
				return n, nil
			}
		}
	}
	return nil, nil
}

// DeleteNode deletes the host's Node, if any, after a leave stopped its
// kubelet. Looked up only now: a kubelet registering while leave ran (a
// host powered back on, or a claim deleted before Karpenter saw its Node
// register) leaves a Node no one else removes. One already terminating is
// left to Karpenter's termination.
func DeleteNode(ctx context.Context, c client.Client, h *v1beta1.SSHHost) (string, error) {
	node, err := MatchingNode(ctx, c, h)
	if err != nil || node == nil || node.DeletionTimestamp != nil {
		return "", err
	}
	if err := c.Delete(ctx, node, client.Preconditions{UID: &node.UID}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return "", err
	}
	return node.Name, nil
}
