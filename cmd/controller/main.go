// Command controller is kpssh: Karpenter core with the SSH host-pool cloud
// provider compiled in, one Deployment.
package main

import (
	"github.com/samber/lo"
	coreoperator "sigs.k8s.io/karpenter/pkg/operator"

	"github.com/dklesev/kpssh/internal/operator"
	_ "github.com/dklesev/kpssh/internal/operator/options" // registers kpssh's flags with core's
)

func main() {
	ctx, op := coreoperator.NewOperator()
	k := lo.Must(operator.New(ctx, op))
	k.WithControllers(ctx, op).Start(ctx)
}
