package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/duration"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/dklesev/kpssh/apis/v1beta1"
)

// HostsUsage is the help text of `kpssh hosts`.
const HostsUsage = `usage: kpssh hosts [flags]

Prints the host pool: one line per SSHHost with its address, class, state,
claiming NodeClaim, installed profile and last phase, then a count per
state. A host whose maintenance annotation is set but whose state has not
caught up (it still serves its claim) shows "(maintenance)" after its state;
one that is the same machine as another host of the pool (condition
Duplicate: never claimed) shows "(duplicate)".

flags:
`

// poolFlags are the flags every pool command shares.
type poolFlags struct {
	kubeconfig *string
	namespace  *string
	timeout    *time.Duration
}

func addPoolFlags(fs *flag.FlagSet, getenv func(string) string) poolFlags {
	defNS := getenv("POOL_NAMESPACE")
	if defNS == "" {
		defNS = v1beta1.DefaultPoolNamespace
	}
	return poolFlags{
		kubeconfig: fs.String("kubeconfig", "", "kubeconfig `path` (default: $KUBECONFIG, ~/.kube/config, in-cluster)"),
		namespace:  fs.String("namespace", defNS, "pool `namespace` holding the SSHHosts; $POOL_NAMESPACE sets the default"),
		timeout:    fs.Duration("timeout", DefaultAPITimeout, "bound on the API calls"),
	}
}

func (p poolFlags) check() error {
	if *p.timeout <= 0 {
		return usageErr("--timeout must be positive")
	}
	if *p.namespace == "" {
		return usageErr("--namespace must not be empty")
	}
	return nil
}

// connectClient is Connect for commands that also write: Connect builds a
// full client.Client and hands it out as a Reader for the read-only render.
func connectClient(kubeconfig string, timeout time.Duration) (client.Client, error) {
	r, err := Connect(kubeconfig, timeout)
	if err != nil {
		return nil, err
	}
	c, ok := r.(client.Client)
	if !ok {
		return nil, runtimeErr("API client is read-only")
	}
	return c, nil
}

// HostRow is one line of the pool table.
type HostRow struct {
	Name, Address, Class, State, Claim, Installed, LastPhase, Age string
}

// HostRows builds the pool table of hosts, sorted by name. now makes AGE
// deterministic in tests.
func HostRows(hosts []v1beta1.SSHHost, now time.Time) []HostRow {
	rows := make([]HostRow, 0, len(hosts))
	for i := range hosts {
		h := &hosts[i]
		state := string(h.CurrentState())
		if h.InMaintenance() && h.CurrentState() != v1beta1.HostMaintenance {
			state += " (maintenance)"
		}
		if h.IsDuplicate() {
			state += " (duplicate)"
		}
		r := HostRow{
			Name:      h.Name,
			Address:   h.Spec.Address,
			Class:     h.Class(),
			State:     state,
			Installed: h.Status.InstalledProfile,
			Age:       duration.HumanDuration(now.Sub(h.CreationTimestamp.Time)),
		}
		if h.Spec.Port != 0 && h.Spec.Port != 22 {
			r.Address = fmt.Sprintf("%s:%d", h.Spec.Address, h.Spec.Port)
		}
		if h.Status.ClaimRef != nil {
			r.Claim = h.Status.ClaimRef.Name
		}
		if lp := h.Status.LastPhase; lp != nil {
			r.LastPhase = fmt.Sprintf("%s %s", lp.Phase, lp.Result)
			if lp.FailedTask != "" {
				r.LastPhase += fmt.Sprintf(" (task %q)", lp.FailedTask)
			}
			if !lp.StartedAt.IsZero() {
				r.LastPhase += " " + duration.HumanDuration(now.Sub(lp.StartedAt.Time)) + " ago"
			}
		}
		rows = append(rows, r)
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].Name < rows[j].Name })
	return rows
}

// WriteHostTable writes the rows as an aligned table plus a per-state count.
func WriteHostTable(w io.Writer, rows []HostRow) error {
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	fmt.Fprintln(tw, "NAME\tADDRESS\tCLASS\tSTATE\tCLAIM\tINSTALLED\tLAST PHASE\tAGE")
	counts := map[string]int{}
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Name, r.Address, r.Class, r.State, dash(r.Claim), dash(r.Installed), dash(r.LastPhase), r.Age)
		st, _, _ := strings.Cut(r.State, " (")
		counts[st]++
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	states := make([]string, 0, len(counts))
	for s := range counts {
		states = append(states, s)
	}
	sort.Strings(states)
	parts := make([]string, 0, len(states))
	for _, s := range states {
		parts = append(parts, fmt.Sprintf("%d %s", counts[s], s))
	}
	_, err := fmt.Fprintf(w, "\n%d host(s): %s\n", len(rows), strings.Join(parts, ", "))
	return err
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// subcommand is the shared frame of the pool commands: a flag set printing
// usage to stderr, interspersed flags, and errors printed with the command's
// name and mapped to exit codes.
type subcommand struct {
	name   string
	fs     *flag.FlagSet
	stderr io.Writer
}

func newSubcommand(name, usage string, stderr io.Writer) *subcommand {
	// controller-runtime complains on stderr when its logger is never set.
	ctrllog.SetLogger(logr.Discard())
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	return &subcommand{name: name, fs: fs, stderr: stderr}
}

// parse returns the positional arguments, or done with the exit code (-h,
// a bad flag: the flag package has printed why).
func (c *subcommand) parse(args []string) (pos []string, code int, done bool) {
	pos, err := parseInterspersed(c.fs, args)
	if errors.Is(err, flag.ErrHelp) {
		return nil, ExitOK, true
	}
	if err != nil {
		return nil, ExitUsage, true
	}
	return pos, ExitOK, false
}

func (c *subcommand) fail(err error) int {
	fmt.Fprintf(c.stderr, "%s: %v\n", c.name, err)
	return ExitCode(err)
}

// Hosts is `kpssh hosts`.
func Hosts(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newSubcommand("kpssh hosts", HostsUsage, stderr)
	pf := addPoolFlags(c.fs, os.Getenv)
	selector := c.fs.String("l", "", "label `selector` (e.g. karpenter.dklesev.github.io/host-class=big)")
	pos, code, done := c.parse(args)
	if done {
		return code
	}
	fail := c.fail
	if len(pos) != 0 {
		return fail(usageErr("unexpected argument(s) %q", pos))
	}
	if err := pf.check(); err != nil {
		return fail(err)
	}
	sel, err := labels.Parse(*selector)
	if err != nil {
		return fail(usageErr("-l: %v", err))
	}
	cl, err := Connect(*pf.kubeconfig, *pf.timeout)
	if err != nil {
		return fail(err)
	}
	ctx, cancel := context.WithTimeout(ctx, *pf.timeout)
	defer cancel()
	var list v1beta1.SSHHostList
	if err := cl.List(ctx, &list, client.InNamespace(*pf.namespace), client.MatchingLabelsSelector{Selector: sel}); err != nil {
		return fail(apiErr(err, "", "SSHHosts in "+*pf.namespace))
	}
	if len(list.Items) == 0 {
		fmt.Fprintf(stderr, "kpssh hosts: no SSHHosts in namespace %s\n", *pf.namespace)
		return ExitOK
	}
	if err := WriteHostTable(stdout, HostRows(list.Items, time.Now())); err != nil {
		return fail(runtimeErr("write output: %w", err))
	}
	return ExitOK
}
