// Command kpssh is the operator's CLI for the SSH host pool: one binary,
// one subcommand per task (`kpssh render HOST PHASE`, …), internal/cli's
// cobra commands. Exit codes: 0 ok, 1 runtime/API error, 2 usage or
// configuration error. Installed as kubectl-kpssh it is the kubectl plugin
// `kubectl kpssh`; as kubectl_complete-kpssh it answers kubectl's shell
// completion for that plugin.
package main

import (
	"context"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/dklesev/kpssh/internal/cli"
)

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return cli.Run(ctx, args, stdout, stderr)
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	args := os.Args[1:]
	// kubectl (1.26+) completes `kubectl kpssh …` by running
	// kubectl_complete-kpssh with the words typed so far.
	if filepath.Base(os.Args[0]) == "kubectl_complete-kpssh" {
		args = append([]string{"__complete"}, args...)
	}
	code := run(ctx, args, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
