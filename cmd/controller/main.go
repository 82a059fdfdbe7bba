// Command controller is kpssh: Karpenter core with the SSH host-pool cloud
// provider compiled in, one Deployment.
//
// `controller phase-run` is the other half of executor job: the command of a
// phase Job's pod (internal/jobexec), in the same image.
package main

import (
	"os"

	"github.com/samber/lo"
	coreoperator "sigs.k8s.io/karpenter/pkg/operator"

	"github.com/dklesev/kpssh/internal/jobexec"
	"github.com/dklesev/kpssh/internal/operator"
	_ "github.com/dklesev/kpssh/internal/operator/options" // registers kpssh's flags with core's
)

func main() {
	// Before the operator: it parses every argument as its own flags.
	if len(os.Args) > 1 && os.Args[1] == jobexec.PhaseRunCommand {
		os.Exit(jobexec.PhaseRun(os.Args[2:], jobexec.PhaseRunOptions{}))
	}
	ctx, op := coreoperator.NewOperator()
	k := lo.Must(operator.New(ctx, op))
	k.WithControllers(ctx, op).Start(ctx)
}
