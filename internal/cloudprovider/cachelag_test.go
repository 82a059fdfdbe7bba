package cloudprovider

import (
	"context"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/engine"
)

// A host released a moment ago is Available in the API server while the
// cache still shows it Leaving: Create answers "no free host" only from
// what the API server says (a live re-list), not from the lagging cache.
func TestCreateRelistsLiveBeforeNoCapacity(t *testing.T) {
	ctx := context.Background()
	base := fakeAPIServer().
		WithObjects(standard(newHost("h1", "small", func(h *v1beta1.SSHHost) { h.Status.InstalledProfile = "prof@2" }))...).Build()
	lagging := true
	// The "cache": every host list still shows the leave in progress.
	cached := interceptor.NewClient(base, interceptor.Funcs{List: func(ctx context.Context, c client.WithWatch, l client.ObjectList, opts ...client.ListOption) error {
		if err := c.List(ctx, l, opts...); err != nil {
			return err
		}
		if hl, ok := l.(*v1beta1.SSHHostList); ok && lagging {
			for i := range hl.Items {
				hl.Items[i].Status.State = v1beta1.HostLeaving
			}
		}
		return nil
	}})
	ph := &fakePhases{results: map[engine.Phase]engine.Result{}}
	cp := New(cached, base, ns, ph, &fakeTokens{}, &recorder{}, clocktesting.NewFakeClock(time.Date(2026, 12, 2, 7, 0, 0, 0, time.UTC)))
	cp.Cluster = fakeCluster{}
	if _, err := cp.Create(ctx, newNodeClaim("a")); err != nil {
		t.Fatalf("Create with a lagging cache: %v (want the host the API server has Available)", err)
	}
	h := &v1beta1.SSHHost{}
	if err := base.Get(ctx, client.ObjectKey{Namespace: ns, Name: "h1"}, h); err != nil {
		t.Fatal(err)
	}
	if h.Status.State != v1beta1.HostInUse {
		t.Fatalf("host %s", h.Status.State)
	}
	// And a pool that is really full is still "no capacity".
	if _, err := cp.Create(ctx, newNodeClaim("b")); !cloudprovider.IsInsufficientCapacityError(err) {
		t.Fatalf("second Create on a full pool: %v, want insufficient capacity", err)
	}
}
