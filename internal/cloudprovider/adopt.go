package cloudprovider

import (
	"context"
	"fmt"

	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/providers/leave"
)

// adopt waits for the Node a providerIDSource=Adopt join registered itself
// (its mechanism sets the providerID, e.g. nodeadm's eks-hybrid:///…) and
// returns that providerID. The Node must be tied to the host (leave.Tied):
// it carries the host label the join was given (v1beta1.LabelHost), the
// host's node address as InternalIP, and was created since the NodeClaim.
// A Node with the address alone is not the host's, and of several tied
// Nodes none is adopted.
func (c *CloudProvider) adopt(ctx context.Context, h *v1beta1.SSHHost, nodeClaim *karpv1.NodeClaim) (string, error) {
	since := nodeClaim.CreationTimestamp.Time
	deadline := c.Clock.Now().Add(c.AdoptTimeout)
	for {
		m, err := leave.MatchingNode(ctx, c.Live, h, since)
		if err != nil {
			return "", err
		}
		if n := m.Node; n != nil && n.Spec.ProviderID != "" && n.DeletionTimestamp.IsZero() {
			return n.Spec.ProviderID, nil
		}
		if !c.Clock.Now().Before(deadline) {
			if err := m.Err(h); err != nil {
				c.Recorder.Publish(leave.AmbiguousNodes(h, m))
				return "", err
			}
			return "", fmt.Errorf("no Node with label %s=%s, InternalIP %s and a providerID registered within %s",
				v1beta1.LabelHost, v1beta1.HostLabelValue(h.Namespace, h.Name), NodeAddress(h), c.AdoptTimeout)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-c.Clock.After(c.AdoptPoll):
		}
	}
}
