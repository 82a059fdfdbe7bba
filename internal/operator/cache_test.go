package operator_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/operator"
)

// TestCacheStripsManagedFields: the informer caches keep no managedFields
// (operator.StripManagedFields), and a status patch computed between two
// cached copies, as every kpssh write is, leaves the server's intact.
func TestCacheStripsManagedFields(t *testing.T) {
	if env == nil {
		t.Skip("-short: needs the real apiserver")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mgr, err := manager.New(env.Config, manager.Options{Scheme: env.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := operator.StripManagedFields(ctx, mgr.GetCache()); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	defer func() { cancel(); <-done }()

	ns := "strip-managed-fields"
	mustCreate(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	h := &v1beta1.SSHHost{ObjectMeta: metav1.ObjectMeta{Name: "h", Namespace: ns},
		Spec: v1beta1.SSHHostSpec{Address: "192.0.2.1", SSHKeySecretRef: v1beta1.LocalObjectReference{Name: "key"},
			Capacity: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("1Gi")}}}
	mustCreate(t, h)
	key := client.ObjectKeyFromObject(h)

	cached := &v1beta1.SSHHost{}
	eventually(t, "the host in the cache", 30*time.Second, func() (bool, string) {
		err := mgr.GetClient().Get(ctx, key, cached)
		return err == nil, errString(err)
	})
	if n := len(cached.ManagedFields); n != 0 {
		t.Fatalf("cached host has %d managedFields entries", n)
	}
	orig := cached.DeepCopy()
	cached.Status.State = v1beta1.HostUnhealthy
	if err := mgr.GetClient().Status().Patch(ctx, cached, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})); err != nil {
		t.Fatal(err)
	}
	live := &v1beta1.SSHHost{}
	if err := mgr.GetAPIReader().Get(ctx, key, live); err != nil {
		t.Fatal(err)
	}
	if live.Status.State != v1beta1.HostUnhealthy || len(live.ManagedFields) < 2 {
		t.Fatalf("after the patch: state %q, %d managedFields entries on the server (want the create's and the patch's)", live.Status.State, len(live.ManagedFields))
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
