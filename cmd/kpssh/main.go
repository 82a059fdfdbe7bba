// Command kpssh is the operator's CLI for the SSH host pool: one binary,
// one subcommand per task (`kpssh render HOST PHASE`, …). Each subcommand
// parses its own flags (standard library flag package) and returns its exit
// code: 0 ok, 1 runtime/API error, 2 usage or configuration error.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"syscall"

	"github.com/dklesev/kpssh/internal/cli"
)

// command is one subcommand: run gets the arguments after its name.
type command struct {
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) int
}

// commands is the dispatch table; later subcommands (sign, import-inventory,
// hosts, maintenance) add themselves here.
var commands = map[string]command{
	"render":           {"print the playbook and inputs a phase would run on a host (secrets masked)", cli.Render},
	"hosts":            {"print the host pool: address, class, state, claim, installed profile, last phase", cli.Hosts},
	"maintenance":      {"on|off HOST: park a host for maintenance (--evict its NodeClaim) or hand it back", cli.MaintenanceCmd},
	"import-inventory": {"turn an Ansible inventory into SSHHost manifests and a key Secret", cli.ImportInventory},
	"sign":             {"sign a profile's scripts (or v2 manifests) for Verified hosts; prints the signatures: block", cli.Sign},
	"new-role":         {"NAME: write a role skeleton (phases, argument specs, defaults, README, molecule scenario)", cli.NewRoleCmd},
	"validate":         {"PROFILE.yaml: the node class controller's checks on a profile (and --class) file, offline", cli.Validate},
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: kpssh COMMAND [flags] [args]\n\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-17s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w, "\nRun 'kpssh COMMAND -h' for a command's flags.")
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return cli.ExitUsage
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		usage(stdout)
		return cli.ExitOK
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "kpssh: unknown command %q\n\n", args[0])
		usage(stderr)
		return cli.ExitUsage
	}
	return c.run(ctx, args[1:], stdout, stderr)
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
