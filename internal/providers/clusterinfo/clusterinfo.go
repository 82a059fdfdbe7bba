// Package clusterinfo resolves the API endpoint and CA a joining node is
// given: the node class's `cluster` override, else the public
// kube-public/cluster-info ConfigMap that kubeadm-style clusters publish
// for exactly this purpose.
package clusterinfo

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dklesev/kpssh/apis/v1beta1"
)

// Info is what join gets.
type Info struct {
	Endpoint string // https://host:port
	CAB64    string // base64 of the PEM CA bundle
}

// Provider resolves cluster info for a node class.
type Provider interface {
	Get(ctx context.Context, nc *v1beta1.SSHNodeClass) (Info, error)
}

// New returns the default Provider.
func New(c client.Reader) Provider { return &provider{c: c} }

type provider struct{ c client.Reader }

// ConfigMap coordinates of cluster-info.
const (
	Namespace = "kube-public"
	Name      = "cluster-info"
	Key       = "kubeconfig"
)

func (p *provider) Get(ctx context.Context, nc *v1beta1.SSHNodeClass) (Info, error) {
	if o := nc.Spec.Cluster; o != nil && o.Endpoint != "" {
		if len(o.CABundle) == 0 {
			return Info{}, fmt.Errorf("node class %s: cluster.caBundle is required with cluster.endpoint", nc.Name)
		}
		return Info{Endpoint: o.Endpoint, CAB64: base64.StdEncoding.EncodeToString(o.CABundle)}, nil
	}
	cm := &corev1.ConfigMap{}
	if err := p.c.Get(ctx, client.ObjectKey{Namespace: Namespace, Name: Name}, cm); err != nil {
		if apierrors.IsNotFound(err) {
			return Info{}, fmt.Errorf("configmap %s/%s not found: set spec.cluster on node class %s", Namespace, Name, nc.Name)
		}
		return Info{}, fmt.Errorf("read %s/%s: %w", Namespace, Name, err)
	}
	return Parse(cm.Data[Key])
}

// Parse reads the kubeconfig held by cluster-info.
func Parse(kubeconfig string) (Info, error) {
	if strings.TrimSpace(kubeconfig) == "" {
		return Info{}, fmt.Errorf("%s/%s has no %q", Namespace, Name, Key)
	}
	cfg, err := clientcmd.Load([]byte(kubeconfig))
	if err != nil {
		return Info{}, fmt.Errorf("%s/%s: kubeconfig does not parse: %w", Namespace, Name, err)
	}
	if len(cfg.Clusters) != 1 {
		return Info{}, fmt.Errorf("%s/%s: kubeconfig has %d clusters, want 1", Namespace, Name, len(cfg.Clusters))
	}
	for _, c := range cfg.Clusters {
		if !strings.HasPrefix(c.Server, "https://") {
			return Info{}, errors.New(Namespace + "/" + Name + ": cluster server must be https://")
		}
		if len(c.CertificateAuthorityData) == 0 {
			return Info{}, errors.New(Namespace + "/" + Name + ": cluster has no certificate-authority-data")
		}
		return Info{Endpoint: c.Server, CAB64: base64.StdEncoding.EncodeToString(c.CertificateAuthorityData)}, nil
	}
	panic("unreachable")
}
