package v1beta1_test

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dklesev/kpssh/apis/v1beta1"
)

// The seed's runbook shows `kubectl get sshhost` output; users read and grep
// it, so the real kubectl against the real apiserver must print those columns.
func TestKubectlGetSSHHostsColumns(t *testing.T) {
	needEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h := &v1beta1.SSHHost{
		ObjectMeta: metav1.ObjectMeta{Name: "host-a", Namespace: poolNS, Labels: map[string]string{v1beta1.LabelHostClass: "big"}},
		Spec: v1beta1.SSHHostSpec{
			Address:         "10.0.0.11",
			SSHKeySecretRef: v1beta1.LocalObjectReference{Name: "host-key"},
			Capacity:        corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("8Gi")},
		},
	}
	if err := env.Client.Create(ctx, h); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), h) })
	h.Status.State = v1beta1.HostMaintenance
	h.Status.InstalledProfile = "tls-bootstrap@1"
	if err := env.Client.Status().Update(ctx, h); err != nil {
		t.Fatal(err)
	}

	for _, resourceName := range []string{"sshhosts", "sshhost", "sshh"} {
		out, err := env.Kubectl(ctx, "get", resourceName, "-n", poolNS)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		header := strings.Fields(lines[0])
		want := []string{"NAME", "ADDRESS", "CLASS", "STATE", "CLAIM", "INSTALLED", "READY", "AGE"}
		if strings.Join(header, " ") != strings.Join(want, " ") {
			t.Fatalf("kubectl get %s header = %q, want %q", resourceName, lines[0], strings.Join(want, " "))
		}
		row := regexp.MustCompile(`^host-a\s+10\.0\.0\.11\s+big\s+Maintenance\s+tls-bootstrap@1\s`)
		if !row.MatchString(lines[1]) {
			t.Fatalf("row = %q, want host-a 10.0.0.11 big Maintenance (no claim) tls-bootstrap@1", lines[1])
		}
	}

	// Short names and the karpenter category reach all three kinds.
	out, err := env.Kubectl(ctx, "api-resources", "--api-group", v1beta1.Group, "-o", "wide")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^sshhosts\s+sshh\s+karpenter\.dklesev\.github\.io/v1beta1\s+true\s+SSHHost\s.*karpenter`),
		regexp.MustCompile(`(?m)^sshjoinprofiles\s+sjp\s+karpenter\.dklesev\.github\.io/v1beta1\s+false\s+SSHJoinProfile\s.*karpenter`),
		regexp.MustCompile(`(?m)^sshnodeclasses\s+snc\s+karpenter\.dklesev\.github\.io/v1beta1\s+false\s+SSHNodeClass\s.*karpenter`),
	} {
		if !want.MatchString(out) {
			t.Errorf("api-resources lacks %s:\n%s", want, out)
		}
	}
}

func TestKubectlGetNodeClassAndProfileColumns(t *testing.T) {
	needEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := &v1beta1.SSHJoinProfile{
		ObjectMeta: metav1.ObjectMeta{Name: "cols-profile"},
		Spec:       v1beta1.SSHJoinProfileSpec{Version: "7", Scripts: &v1beta1.ProfileScripts{Install: "true", Join: "true", Leave: "true"}},
	}
	nc := &v1beta1.SSHNodeClass{
		ObjectMeta: metav1.ObjectMeta{Name: "cols-class"},
		Spec:       v1beta1.SSHNodeClassSpec{JoinProfileRef: v1beta1.ObjectReference{Name: "cols-profile"}},
	}
	for _, o := range []interface {
		client.Object
	}{p, nc} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), o) })
	}
	for _, tc := range []struct{ resource, name, header, row string }{
		{"snc", "cols-class", "NAME PROFILE READY AGE", `^cols-class\s+cols-profile\s`},
		{"sjp", "cols-profile", "NAME VERSION AGE", `^cols-profile\s+7\s`},
	} {
		out, err := env.Kubectl(ctx, "get", tc.resource, tc.name)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if got := strings.Join(strings.Fields(lines[0]), " "); got != tc.header {
			t.Errorf("kubectl get %s header = %q, want %q", tc.resource, got, tc.header)
		}
		if len(lines) < 2 || !regexp.MustCompile(tc.row).MatchString(lines[1]) {
			t.Errorf("kubectl get %s row = %q, want match %s", tc.resource, lines, tc.row)
		}
	}
}
