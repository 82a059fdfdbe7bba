package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/dklesev/kpssh/internal/providers/clusterinfo"
)

// Exit codes of every kpssh subcommand.
const (
	ExitOK      = 0
	ExitRuntime = 1 // the API server could not be reached or answered with an error
	ExitUsage   = 2 // bad arguments or configuration: unknown host, bad phase, invalid profile…
)

// exitError carries an exit code; its message is safe to print (no secret
// values ever reach one). usage: the command's help follows the message;
// silent: the command has said everything already.
type exitError struct {
	code          int
	err           error
	usage, silent bool
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit %d", e.code)
	}
	return e.err.Error()
}
func (e *exitError) Unwrap() error { return e.err }

func usageErr(format string, a ...any) error {
	return &exitError{code: ExitUsage, err: fmt.Errorf(format, a...)}
}

func runtimeErr(format string, a ...any) error {
	return &exitError{code: ExitRuntime, err: fmt.Errorf(format, a...)}
}

// withUsage is a usage error followed by the command's help.
func withUsage(format string, a ...any) error {
	return &exitError{code: ExitUsage, err: fmt.Errorf(format, a...), usage: true}
}

// exitSilently ends a command that has printed its own messages.
func exitSilently(code int) error { return &exitError{code: code, silent: true} }

// ExitCode maps an error of a subcommand to its exit code: ExitUsage for
// usage and configuration errors, ExitRuntime for everything else.
func ExitCode(err error) int {
	if err == nil {
		return ExitOK
	}
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	return ExitRuntime
}

// apiErr classifies an API error for a read of what: NotFound is the
// caller's configuration (ExitUsage, with notFound as the message), anything
// else (unreachable, forbidden, timeout) is ExitRuntime.
func apiErr(err error, notFound string, what string) error {
	if apierrors.IsNotFound(err) && notFound != "" {
		return usageErr("%s", notFound)
	}
	return runtimeErr("read %s: %w", what, err)
}

// deps is what the commands take from the process; tests replace parts.
type deps struct {
	connect        func(*clusterFlags) (client.Client, error)
	cluster        clusterinfo.Provider // render: nil = from the client
	getenv         func(string) string
	stdin          io.Reader
	stdout, stderr io.Writer
}

func processDeps(stdout, stderr io.Writer) deps {
	return deps{connect: connect, getenv: os.Getenv, stdin: os.Stdin, stdout: stdout, stderr: stderr}
}

// Run runs kpssh with args (without the program name) and returns its exit
// code: 0 ok, 1 runtime/API error, 2 usage or configuration error.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return processDeps(stdout, stderr).run(ctx, args)
}

// runSub runs one subcommand: what the per-command entry points and their
// tests call.
func runSub(ctx context.Context, name string, args []string, stdout, stderr io.Writer) int {
	return Run(ctx, append([]string{name}, args...), stdout, stderr)
}

func (d deps) run(ctx context.Context, args []string) int {
	// controller-runtime complains on stderr when its logger is never set.
	ctrllog.SetLogger(logr.Discard())
	root := d.root()
	root.SetArgs(goFlagSpellings(root, args))
	c, err := root.ExecuteContextC(ctx)
	if err == nil {
		return ExitOK
	}
	var ee *exitError
	if !errors.As(err, &ee) {
		// cobra's own: a bad argument to completion or help.
		ee = &exitError{code: ExitUsage, err: err, usage: true}
	}
	if !ee.silent {
		fmt.Fprintf(d.stderr, "%s: %v\n", c.CommandPath(), err)
	}
	switch {
	case ee.usage && c == root:
		listCommands(root, d.stderr)
	case ee.usage:
		c.HelpFunc()(c, nil)
	}
	return ee.code
}

// root is `kpssh` with every subcommand. Help and usage go where they went
// before cobra: the command list to stdout when asked for (help, -h), to
// stderr with exit 2 otherwise; a subcommand's help to stderr.
func (d deps) root() *cobra.Command {
	root := &cobra.Command{
		Use:           "kpssh",
		Short:         "the operator's CLI for the kpssh SSH host pool (also: kubectl kpssh)",
		Args:          cobra.ArbitraryArgs,
		SilenceErrors: true,
		SilenceUsage:  true,
		RunE: func(c *cobra.Command, args []string) error {
			if len(args) > 0 {
				fmt.Fprintf(d.stderr, "kpssh: unknown command %q\n\n", args[0])
			}
			listCommands(c, d.stderr)
			return exitSilently(ExitUsage)
		},
	}
	root.SetOut(d.stdout)
	root.SetErr(d.stderr)
	root.SetIn(d.stdin)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return withUsage("%v", err) })
	defaultHelp := root.HelpFunc()
	root.SetHelpFunc(func(c *cobra.Command, args []string) {
		if c == root {
			listCommands(root, d.stdout)
			return
		}
		defaultHelp(c, args) // completion's subcommands
	})
	root.AddCommand(d.renderCommand(), d.hostsCommand(), d.maintenanceCommand(), d.importInventoryCommand(),
		d.signCommand(), d.newRoleCommand(), d.validateCommand(), d.versionCommand())
	root.InitDefaultCompletionCmd()
	if c, _, err := root.Find([]string{"completion"}); err == nil && c != root {
		c.Short = "bash|zsh|fish|powershell: write the shell completion script (kubectl kpssh too: docs/operations.md)"
	}
	return root
}

// listCommands is kpssh's usage: one line per command.
func listCommands(root *cobra.Command, w io.Writer) {
	fmt.Fprintln(w, "usage: kpssh COMMAND [flags] [args]   (or: kubectl kpssh COMMAND ...)\n\ncommands:")
	for _, c := range root.Commands() {
		if c.IsAvailableCommand() && c.Name() != "help" {
			fmt.Fprintf(w, "  %-17s %s\n", c.Name(), c.Short)
		}
	}
	fmt.Fprintln(w, "\nRun 'kpssh COMMAND -h' for a command's flags.")
}

// command is a subcommand with kpssh's frame: arguments checked by run
// itself (with its own messages), help = the usage text plus the flags, on
// stderr.
func (d deps) command(use, short, usage string, run func(c *cobra.Command, args []string) error) *cobra.Command {
	c := &cobra.Command{
		Use:                   use,
		Short:                 short,
		Long:                  usage,
		Args:                  cobra.ArbitraryArgs,
		DisableFlagsInUseLine: true,
		RunE:                  run,
	}
	c.SetHelpFunc(func(c *cobra.Command, _ []string) { writeHelp(d.stderr, c, usage) })
	return c
}

// flagGroup annotates the flags kubectl's ConfigFlags adds, for the help.
const flagGroup = "kpssh/group"

func writeHelp(w io.Writer, c *cobra.Command, usage string) {
	own, cluster := pflag.NewFlagSet("own", pflag.ContinueOnError), pflag.NewFlagSet("cluster", pflag.ContinueOnError)
	c.Flags().VisitAll(func(f *pflag.Flag) {
		if f.Name == "help" {
			return
		}
		if _, ok := f.Annotations[flagGroup]; ok {
			cluster.AddFlag(f)
		} else {
			own.AddFlag(f)
		}
	})
	fmt.Fprint(w, usage)
	fmt.Fprint(w, own.FlagUsages())
	if cluster.HasAvailableFlags() {
		fmt.Fprint(w, "\ncluster flags (kubectl's):\n"+cluster.FlagUsages())
	}
}

// goFlagSpellings rewrites the spellings of Go's flag package that kpssh
// accepted before cobra — "-key FILE", "-timeout=20s" — into pflag's
// "--key", for the long flags the called command defines: users' scripts
// keep working. Shorthands (-n, -l, -o, -h) and everything after "--" stay.
func goFlagSpellings(root *cobra.Command, args []string) []string {
	c, _, err := root.Find(args)
	if err != nil {
		c = root
	}
	c.InitDefaultHelpFlag()
	out := make([]string, 0, len(args))
	for i, a := range args {
		if a == "--" {
			return append(out, args[i:]...)
		}
		if len(a) > 2 && a[0] == '-' && a[1] != '-' {
			if name, _, _ := strings.Cut(a[1:], "="); len(name) > 1 && c.Flags().Lookup(name) != nil {
				a = "-" + a
			}
		}
		out = append(out, a)
	}
	return out
}
