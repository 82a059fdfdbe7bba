package cloudprovider

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"

	"github.com/dklesev/kpssh/apis/v1beta1"
)

// adopt waits for the Node a providerIDSource=Adopt join registered itself
// (its mechanism sets the providerID, e.g. nodeadm's eks-hybrid:///…) and
// returns that providerID. The Node is matched by InternalIP = the host's
// node address.
func (c *CloudProvider) adopt(ctx context.Context, h *v1beta1.SSHHost) (string, error) {
	addr := NodeAddress(h)
	deadline := c.Clock.Now().Add(c.AdoptTimeout)
	for {
		id, err := c.nodeProviderIDByIP(ctx, addr)
		if err != nil {
			return "", err
		}
		if id != "" {
			return id, nil
		}
		if !c.Clock.Now().Before(deadline) {
			return "", fmt.Errorf("no Node with InternalIP %s and a providerID appeared within %s", addr, c.AdoptTimeout)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-c.Clock.After(c.AdoptPoll):
		}
	}
}

func (c *CloudProvider) nodeProviderIDByIP(ctx context.Context, ip string) (string, error) {
	nodes := &corev1.NodeList{}
	if err := c.Live.List(ctx, nodes); err != nil {
		return "", err
	}
	for i := range nodes.Items {
		n := &nodes.Items[i]
		if n.Spec.ProviderID == "" || !n.DeletionTimestamp.IsZero() {
			continue
		}
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP && a.Address == ip {
				return n.Spec.ProviderID, nil
			}
		}
	}
	return "", nil
}
