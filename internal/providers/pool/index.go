package pool

import (
	"context"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dklesev/kpssh/apis/v1beta1"
)

// Field indexes (informer cache) of SSHHosts that event handlers look hosts
// up by. Without them a handler lists the whole pool for every event: at
// 5,000 hosts and 500 NodeClaims the controller's start (one event per
// NodeClaim, each a deep copy of every host) outlasted the cache-sync
// timeout and the process panicked (docs/performance.md, "Memory").
const (
	// IndexClaim: the name of the NodeClaim a host's claimRef holds.
	IndexClaim = "kpssh.claim"
	// IndexToken: "held" on a host that records a bootstrap token.
	IndexToken = "kpssh.token"
)

// Indexes are the SSHHost field indexes by name: Index registers them on a
// manager, tests on their fake clients.
var Indexes = map[string]client.IndexerFunc{
	IndexMachine: IndexMachineKeys,
	IndexClaim: func(o client.Object) []string {
		if h, ok := o.(*v1beta1.SSHHost); ok && h.Status.ClaimRef != nil {
			return []string{h.Status.ClaimRef.Name}
		}
		return nil
	},
	IndexToken: func(o client.Object) []string {
		if h, ok := o.(*v1beta1.SSHHost); ok && h.Status.BootstrapTokenID != "" {
			return []string{"held"}
		}
		return nil
	},
}

// Index registers Indexes with idx (a manager's field indexer).
func Index(ctx context.Context, idx client.FieldIndexer) error {
	for name, keys := range Indexes {
		if err := idx.IndexField(ctx, &v1beta1.SSHHost{}, name, keys); err != nil {
			return err
		}
	}
	return nil
}
