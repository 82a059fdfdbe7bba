package instancetype_test

import (
	"testing"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/providers/instancetype"
)

type hostOpt func(*v1beta1.SSHHost)

func host(name, class, arch, cpu, mem string, opts ...hostOpt) v1beta1.SSHHost {
	h := v1beta1.SSHHost{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:   v1beta1.SSHHostSpec{Capacity: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(mem)}},
		Status: v1beta1.SSHHostStatus{ObservedArch: arch, State: v1beta1.HostAvailable}}
	if arch == "" {
		h.Status.State = v1beta1.HostPending // never probed
	}
	if class != "" {
		h.Labels = map[string]string{v1beta1.LabelHostClass: class}
	}
	for _, o := range opts {
		o(&h)
	}
	return h
}

func withGPU(h *v1beta1.SSHHost) { h.Spec.Capacity["nvidia.com/gpu"] = resource.MustParse("1") }
func inUse(h *v1beta1.SSHHost) {
	h.Status.State = v1beta1.HostInUse
	h.Status.ClaimRef = &v1beta1.ClaimRef{Name: "nc", UID: "u"}
}
func maintenance(h *v1beta1.SSHHost) {
	h.Annotations = map[string]string{v1beta1.AnnotationMaintenance: ""}
}
func pods(n string) hostOpt {
	return func(h *v1beta1.SSHHost) { h.Spec.Capacity[corev1.ResourcePods] = resource.MustParse(n) }
}

func TestClasses(t *testing.T) {
	var logged []string
	log := funcr.New(func(prefix, args string) { logged = append(logged, args) }, funcr.Options{})
	for _, tc := range []struct {
		name      string
		hosts     []v1beta1.SSHHost
		want      map[string]string // class → "arch cpu mem free"
		wantLog   bool
		dropGPUIn string
	}{
		{name: "unlabelled hosts are class default", hosts: []v1beta1.SSHHost{host("a", "", "amd64", "4", "8Gi")},
			want: map[string]string{"default": "amd64 4 8Gi 1"}},
		{name: "per-resource minimum", hosts: []v1beta1.SSHHost{host("a", "big", "amd64", "8", "4Gi"), host("b", "big", "amd64", "4", "16Gi")},
			want: map[string]string{"big": "amd64 4 4Gi 2"}},
		{name: "resource missing on one host is dropped", hosts: []v1beta1.SSHHost{host("a", "gpu", "amd64", "4", "8Gi", withGPU), host("b", "gpu", "amd64", "4", "8Gi")},
			want: map[string]string{"gpu": "amd64 4 8Gi 2"}, dropGPUIn: "gpu"},
		{name: "mixed arch class skipped with an error", hosts: []v1beta1.SSHHost{host("a", "mixed", "amd64", "4", "8Gi"), host("b", "mixed", "arm64", "4", "8Gi"), host("c", "ok", "arm64", "4", "8Gi")},
			want: map[string]string{"ok": "arm64 4 8Gi 1"}, wantLog: true},
		{name: "unprobed class not advertised", hosts: []v1beta1.SSHHost{host("a", "new", "", "4", "8Gi")}, want: map[string]string{}},
		{name: "half-probed class uses the probed arch", hosts: []v1beta1.SSHHost{host("a", "c", "", "4", "8Gi"), host("b", "c", "arm64", "2", "8Gi")},
			want: map[string]string{"c": "arm64 2 8Gi 1"}},
		{name: "exhausted class still listed with zero free", hosts: []v1beta1.SSHHost{host("a", "x", "amd64", "4", "8Gi", inUse), host("b", "x", "amd64", "4", "8Gi", maintenance)},
			want: map[string]string{"x": "amd64 4 8Gi 0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logged = nil
			got := map[string]string{}
			for _, c := range instancetype.Classes(log, tc.hosts) {
				got[c.Name] = c.Arch + " " + c.Capacity.Cpu().String() + " " + c.Capacity.Memory().String() + " " + itoa(c.Free)
				if c.Name == tc.dropGPUIn {
					if _, ok := c.Capacity["nvidia.com/gpu"]; ok {
						t.Error("gpu kept although one host lacks it")
					}
				}
			}
			if len(got) != len(tc.want) {
				t.Fatalf("classes %v, want %v", got, tc.want)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("class %s = %q, want %q", k, got[k], v)
				}
			}
			if tc.wantLog != (len(logged) > 0) {
				t.Errorf("logged %v", logged)
			}
		})
	}
}

func itoa(i int) string { return resource.NewQuantity(int64(i), resource.DecimalSI).String() }

func TestNewInstanceType(t *testing.T) {
	nc := &v1beta1.SSHNodeClass{Spec: v1beta1.SSHNodeClassSpec{PricePerCPUHour: "0.05",
		KubeReserved: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")}}}
	cls := instancetype.Classes(logr.Discard(), []v1beta1.SSHHost{host("a", "big", "arm64", "4", "8Gi", pods("50")), host("b", "big", "arm64", "4", "8Gi", pods("60"), inUse)})
	it, err := instancetype.New(cls[0], nc)
	if err != nil {
		t.Fatal(err)
	}
	if it.Name != "big" || it.Offerings[0].Price != 0.2 || !it.Offerings[0].Available {
		t.Fatalf("%s price %v available %v", it.Name, it.Offerings[0].Price, it.Offerings[0].Available)
	}
	for key, want := range map[string]string{corev1.LabelInstanceTypeStable: "big", corev1.LabelArchStable: "arm64", corev1.LabelOSStable: "linux",
		corev1.LabelTopologyZone: "pool", karpv1.CapacityTypeLabelKey: "on-demand"} {
		if !it.Requirements.Get(key).Has(want) {
			t.Errorf("requirement %s lacks %s", key, want)
		}
	}
	if it.Overhead.KubeReserved.Cpu().String() != "100m" {
		t.Errorf("kubeReserved %v", it.Overhead.KubeReserved)
	}
	nc.Spec.PricePerCPUHour = "bogus"
	if _, err := instancetype.New(cls[0], nc); err == nil {
		t.Fatal("bad price accepted")
	}
}

// SPEC §1: a host's capacity.pods is honoured unless the node class sets
// maxPods; neither set gives the kubelet's 110.
func TestPodsCapacity(t *testing.T) {
	for _, tc := range []struct {
		name    string
		hosts   []v1beta1.SSHHost
		maxPods *int32
		want    int64
	}{
		{name: "neither set: 110", hosts: []v1beta1.SSHHost{host("a", "c", "amd64", "4", "8Gi")}, want: 110},
		{name: "host pods below 110", hosts: []v1beta1.SSHHost{host("a", "c", "amd64", "4", "8Gi", pods("50"))}, want: 50},
		{name: "host pods above 110", hosts: []v1beta1.SSHHost{host("a", "c", "amd64", "4", "8Gi", pods("250"))}, want: 250},
		{name: "class minimum of host pods", hosts: []v1beta1.SSHHost{host("a", "c", "amd64", "4", "8Gi", pods("250")), host("b", "c", "amd64", "4", "8Gi", pods("300"))}, want: 250},
		{name: "pods missing on one host: 110", hosts: []v1beta1.SSHHost{host("a", "c", "amd64", "4", "8Gi", pods("250")), host("b", "c", "amd64", "4", "8Gi")}, want: 110},
		{name: "maxPods below host pods", hosts: []v1beta1.SSHHost{host("a", "c", "amd64", "4", "8Gi", pods("250"))}, maxPods: ptr(20), want: 20},
		{name: "maxPods above host pods", hosts: []v1beta1.SSHHost{host("a", "c", "amd64", "4", "8Gi", pods("50"))}, maxPods: ptr(300), want: 300},
		{name: "maxPods without host pods", hosts: []v1beta1.SSHHost{host("a", "c", "amd64", "4", "8Gi")}, maxPods: ptr(2000), want: 2000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nc := &v1beta1.SSHNodeClass{Spec: v1beta1.SSHNodeClassSpec{MaxPods: tc.maxPods}}
			it, err := instancetype.New(instancetype.Classes(logr.Discard(), tc.hosts)[0], nc)
			if err != nil {
				t.Fatal(err)
			}
			if got := it.Capacity.Pods().Value(); got != tc.want {
				t.Fatalf("pods %d, want %d", got, tc.want)
			}
		})
	}
}

func ptr(n int32) *int32 { return &n }
