package cloudprovider

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"

	"github.com/dklesev/kpssh/apis/v1beta1"
)

func TestDrifted(t *testing.T) {
	base := &v1beta1.SSHNodeClass{Spec: v1beta1.SSHNodeClassSpec{
		Vars: v1beta1.Vars{"k8sMinor": "1.36"}, ProviderIDSource: v1beta1.ProviderIDStatic}}
	stamp := func(nc *v1beta1.SSHNodeClass) map[string]string {
		return map[string]string{v1beta1.AnnotationNodeClassHash: NodeClassHash(nc), v1beta1.AnnotationNodeClassHashVersion: NodeClassHashVersion}
	}
	profile := &v1beta1.SSHJoinProfile{ObjectMeta: metav1.ObjectMeta{Name: "tls"}, Spec: v1beta1.SSHJoinProfileSpec{Version: "2"}}
	host := func(marker string) *v1beta1.SSHHost {
		return &v1beta1.SSHHost{Status: v1beta1.SSHHostStatus{InstalledProfile: marker}}
	}
	edit := func(f func(nc *v1beta1.SSHNodeClass)) *v1beta1.SSHNodeClass {
		nc := base.DeepCopy()
		f(nc)
		return nc
	}
	for _, tc := range []struct {
		name   string
		host   *v1beta1.SSHHost
		nc     *v1beta1.SSHNodeClass
		stamp  map[string]string
		reason cloudprovider.DriftReason
	}{
		{"current", host("tls@2"), base, stamp(base), ""},
		{"profile version bumped", host("tls@1"), base, stamp(base), ProfileDrift},
		{"vars edited", host("tls@2"), edit(func(nc *v1beta1.SSHNodeClass) { nc.Spec.Vars["k8sMinor"] = "1.37" }), stamp(base), NodeClassDrift},
		{"joinSecretRef added", host("tls@2"), edit(func(nc *v1beta1.SSHNodeClass) { nc.Spec.JoinSecretRef = &v1beta1.LocalObjectReference{Name: "s"} }), stamp(base), NodeClassDrift},
		{"providerIDSource changed", host("tls@2"), edit(func(nc *v1beta1.SSHNodeClass) { nc.Spec.ProviderIDSource = v1beta1.ProviderIDAdopt }), stamp(base), NodeClassDrift},
		{"cluster override", host("tls@2"), edit(func(nc *v1beta1.SSHNodeClass) { nc.Spec.Cluster = &v1beta1.ClusterEndpoint{Endpoint: "https://x"} }), stamp(base), NodeClassDrift},
		{"price edit never drifts", host("tls@2"), edit(func(nc *v1beta1.SSHNodeClass) { nc.Spec.PricePerCPUHour = "9" }), stamp(base), ""},
		{"maxPods/kubeReserved/selector never drift", host("tls@2"), edit(func(nc *v1beta1.SSHNodeClass) {
			nc.Spec.MaxPods = ptr.To[int32](5)
			nc.Spec.KubeReserved = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}
			nc.Spec.HostSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"a": "b"}}
		}), stamp(base), ""},
		{"unstamped claim abstains", host("tls@2"), edit(func(nc *v1beta1.SSHNodeClass) { nc.Spec.Vars["x"] = "y" }), nil, ""},
		{"other hash version abstains", host("tls@2"), edit(func(nc *v1beta1.SSHNodeClass) { nc.Spec.Vars["x"] = "y" }),
			map[string]string{v1beta1.AnnotationNodeClassHash: "1", v1beta1.AnnotationNodeClassHashVersion: "v0"}, ""},
		{"empty providerIDSource equals the Static default", host("tls@2"), edit(func(nc *v1beta1.SSHNodeClass) { nc.Spec.ProviderIDSource = "" }), stamp(base), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Drifted(tc.host, profile, tc.nc, tc.stamp); got != tc.reason {
				t.Fatalf("got %q, want %q", got, tc.reason)
			}
		})
	}
}
