// Command controller is kpssh: Karpenter core with the SSH host-pool cloud
// provider compiled in, one Deployment.
//
// `controller phase-run` is the other half of executor job: the command of a
// phase Job's pod (internal/jobexec), in the same image. `controller
// --version` prints the version, Go release and platform of the binary.
package main

import (
	"fmt"
	"os"
	"runtime"
	"runtime/debug"

	"github.com/samber/lo"
	coreoperator "sigs.k8s.io/karpenter/pkg/operator"

	"github.com/dklesev/kpssh/internal/jobexec"
	"github.com/dklesev/kpssh/internal/operator"
	_ "github.com/dklesev/kpssh/internal/operator/options" // registers kpssh's flags with core's
)

// version is set at build time (-ldflags "-X main.version=…", the image's
// VERSION build argument); empty, the module version Go recorded is shown.
var version string

func main() {
	// Before the operator: it parses every argument as its own flags.
	if len(os.Args) > 1 && os.Args[1] == jobexec.PhaseRunCommand {
		os.Exit(jobexec.PhaseRun(os.Args[2:], jobexec.PhaseRunOptions{}))
	}
	if len(os.Args) == 2 && os.Args[1] == "--version" {
		fmt.Println(versionLine())
		return
	}
	ctx, op := coreoperator.NewOperator()
	k := lo.Must(operator.New(ctx, op))
	k.WithControllers(ctx, op).Start(ctx)
	// Shut down (SIGTERM): the idle warm runners and their run directories
	// go with the controller, not after it.
	_ = k.Engine.Close()
}

// versionLine is "kpssh-controller <version> <go release> <os>/<arch>".
func versionLine() string {
	v := version
	if bi, ok := debug.ReadBuildInfo(); v == "" && ok {
		v = bi.Main.Version
	}
	if v == "" {
		v = "(devel)"
	}
	return fmt.Sprintf("kpssh-controller %s %s %s/%s", v, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
