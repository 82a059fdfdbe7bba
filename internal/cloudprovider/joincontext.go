package cloudprovider

// The context a phase gets on a host, shared by Create and `kpssh render`
// so that what render shows is what the controller runs.

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	karpcp "sigs.k8s.io/karpenter/pkg/cloudprovider"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/engine"
	"github.com/dklesev/kpssh/internal/profile"
	"github.com/dklesev/kpssh/internal/providers/clusterinfo"
	"github.com/dklesev/kpssh/internal/providers/leave"
)

// JoinContext is the engine context install, join and uninstall get on host
// h for nodeClaim under node class nc with profile prof — without the
// bootstrap token, which the caller mints (or, for render, stands in for).
// it is the instance type of the host's class under nc.
func JoinContext(h *v1beta1.SSHHost, nc *v1beta1.SSHNodeClass, prof *v1beta1.SSHJoinProfile, nodeClaim *karpv1.NodeClaim, it *karpcp.InstanceType, info clusterinfo.Info, secrets map[string]string) engine.Context {
	pc := engine.Context{
		ClusterEndpoint: info.Endpoint,
		ClusterCAB64:    info.CAB64,
		NodeName:        h.Name,
		HostAddress:     h.Spec.Address,
		NodeAddress:     NodeAddress(h),
		NodeLabels:      NodeLabels(nodeClaim, it, h.Class()),
		Taints:          Taints(nodeClaim),
		Vars:            profile.Vars(prof, nc),
		Secrets:         secrets,
	}
	if nc.Spec.ProviderIDSource != v1beta1.ProviderIDAdopt {
		pc.ProviderID = ProviderID(h.Namespace, h.Name)
	} else {
		// The Node's identity until Adopt learns its providerID
		// (leave.Tied): its InternalIP alone would name no particular Node.
		pc.NodeLabels = withLabel(pc.NodeLabels, v1beta1.LabelHost+"="+v1beta1.HostLabelValue(h.Namespace, h.Name))
	}
	return pc
}

// withLabel adds `k=v` to a sorted KPSSH_NODE_LABELS list.
func withLabel(list, kv string) string {
	labels := []string{kv}
	if list != "" {
		labels = append(strings.Split(list, ","), kv)
	}
	sort.Strings(labels)
	return strings.Join(labels, ",")
}

// NodeAddress is the IP the node advertises (leave.NodeAddress): never a
// DNS name; "" when none is known.
func NodeAddress(h *v1beta1.SSHHost) string { return leave.NodeAddress(h) }

// ErrSecretKey is wrapped by JoinSecrets' error for a key that cannot be
// exported (configuration, not an API failure).
var ErrSecretKey = errors.New("key is not a shell identifier (KPSSH_SECRET_<KEY>)")

// JoinSecrets reads the node class's joinSecretRef from the pool namespace:
// key → value, nil when the class names none. Errors name the Secret and
// keys, never values; a missing Secret wraps the NotFound error
// (apierrors.IsNotFound works on it).
func JoinSecrets(ctx context.Context, c client.Reader, namespace string, nc *v1beta1.SSHNodeClass) (map[string]string, error) {
	if nc.Spec.JoinSecretRef == nil || nc.Spec.JoinSecretRef.Name == "" {
		return nil, nil
	}
	s := &corev1.Secret{}
	key := client.ObjectKey{Namespace: namespace, Name: nc.Spec.JoinSecretRef.Name}
	if err := c.Get(ctx, key, s); err != nil {
		return nil, fmt.Errorf("read join secret %s/%s of node class %s: %w", key.Namespace, key.Name, nc.Name, err)
	}
	out := make(map[string]string, len(s.Data))
	for k, v := range s.Data {
		if !engine.IsIdentifier(k) {
			return nil, fmt.Errorf("join secret %s/%s: %q: %w", key.Namespace, key.Name, k, ErrSecretKey)
		}
		out[k] = string(v)
	}
	return out, nil
}
