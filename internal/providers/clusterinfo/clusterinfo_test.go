package clusterinfo

import (
	"context"
	"encoding/base64"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/dklesev/kpssh/apis/v1beta1"
)

func kubeconfig(t testing.TB, servers ...string) string {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	for i, s := range servers {
		cfg.Clusters[string(rune('a'+i))] = &clientcmdapi.Cluster{Server: s, CertificateAuthorityData: []byte("CA-PEM")}
	}
	b, err := clientcmd.Write(*cfg)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestGet(t *testing.T) {
	ca := base64.StdEncoding.EncodeToString([]byte("CA-PEM"))
	cm := func(data string) client.Object {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: Name}, Data: map[string]string{Key: data}}
	}
	override := &v1beta1.SSHNodeClass{ObjectMeta: metav1.ObjectMeta{Name: "o"},
		Spec: v1beta1.SSHNodeClassSpec{Cluster: &v1beta1.ClusterEndpoint{Endpoint: "https://lb:6443", CABundle: []byte("OTHER")}}}
	plain := &v1beta1.SSHNodeClass{ObjectMeta: metav1.ObjectMeta{Name: "p"}}
	for _, tc := range []struct {
		name    string
		nc      *v1beta1.SSHNodeClass
		objs    []client.Object
		want    Info
		wantErr string
	}{
		{"override wins", override, []client.Object{cm(kubeconfig(t, "https://x:6443"))}, Info{"https://lb:6443", base64.StdEncoding.EncodeToString([]byte("OTHER"))}, ""},
		{"override without CA", &v1beta1.SSHNodeClass{Spec: v1beta1.SSHNodeClassSpec{Cluster: &v1beta1.ClusterEndpoint{Endpoint: "https://lb"}}}, nil, Info{}, "caBundle is required"},
		{"cluster-info", plain, []client.Object{cm(kubeconfig(t, "https://10.0.0.1:6443"))}, Info{"https://10.0.0.1:6443", ca}, ""},
		{"no cluster-info", plain, nil, Info{}, "set spec.cluster"},
		{"empty kubeconfig", plain, []client.Object{cm("")}, Info{}, "has no"},
		{"garbage", plain, []client.Object{cm("{{{")}, Info{}, "does not parse"},
		{"two clusters", plain, []client.Object{cm(kubeconfig(t, "https://a", "https://b"))}, Info{}, "2 clusters"},
		{"http server", plain, []client.Object{cm(kubeconfig(t, "http://a"))}, Info{}, "https://"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(tc.objs...).Build()
			got, err := New(c).Get(context.Background(), tc.nc)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %+v %v, want %+v", got, err, tc.want)
			}
		})
	}
}

// FuzzParse: any ConfigMap content gives an Info or an error, never a panic.
func FuzzParse(f *testing.F) {
	f.Add(kubeconfig(f, "https://10.0.0.1:6443"))
	f.Add("")
	f.Add("clusters: [{name: a, cluster: {server: 'https://x'}}]")
	f.Fuzz(func(t *testing.T, s string) {
		info, err := Parse(s)
		if err == nil && (!strings.HasPrefix(info.Endpoint, "https://") || info.CAB64 == "") {
			t.Fatalf("accepted %+v", info)
		}
	})
}
