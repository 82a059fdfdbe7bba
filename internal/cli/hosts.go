package cli

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/printers"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/providers/leave"
)

// HostsUsage is the help text of `kpssh hosts`.
const HostsUsage = `usage: kpssh hosts [flags]

Prints the host pool: one line per SSHHost with its address, class, state,
claiming NodeClaim, installed profile and last phase (while a phase runs:
"Running" and the task it is at), then a count per
state. A host whose maintenance annotation is set but whose state has not
caught up (it still serves its claim) shows "(maintenance)" after its state;
one that is the same machine as another host of the pool (condition
Duplicate: never claimed) shows "(duplicate)".

-o wide adds user, node address, arch, capacity, exec mode and the pinned
host key; -o json and -o yaml print the SSHHostList as the API returns it,
-o name one sshhost.karpenter.dklesev.github.io/NAME per line, -o
jsonpath=... and -o go-template=... as in kubectl. The pool namespace is -n,
else $POOL_NAMESPACE, else kpssh-system; the cluster flags are kubectl's
(--kubeconfig, --context, --as, ...).

flags:
`

// HostRow is one line of the pool table; the fields after Age are the
// wide table's (-o wide).
type HostRow struct {
	Name, Address, Class, State, Claim, Installed, LastPhase, Age string
	User, NodeAddress, Arch, CPU, Memory, ExecMode, HostKey       string
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

			User:        h.Spec.User,
			NodeAddress: leave.NodeAddress(h),
			Arch:        h.Status.ObservedArch,
			ExecMode:    string(h.Spec.ExecMode),
			HostKey:     h.Status.HostKeyFingerprint,
		}
		if q, ok := h.Spec.Capacity[corev1.ResourceCPU]; ok {
			r.CPU = q.String()
		}
		if q, ok := h.Spec.Capacity[corev1.ResourceMemory]; ok {
			r.Memory = q.String()
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
			if lp.CurrentTask != "" { // a phase still running: where it is
				r.LastPhase += fmt.Sprintf(" (at task %q)", lp.CurrentTask)
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

// WriteHostTable writes the rows as an aligned table plus a per-state
// count; wide adds user, node address, arch, capacity, exec mode and the
// pinned host key.
func WriteHostTable(w io.Writer, rows []HostRow, wide bool) error {
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	head := "NAME\tADDRESS\tCLASS\tSTATE\tCLAIM\tINSTALLED\tLAST PHASE\tAGE"
	if wide {
		head += "\tUSER\tNODE ADDRESS\tARCH\tCPU\tMEMORY\tEXEC MODE\tHOST KEY"
	}
	fmt.Fprintln(tw, head)
	counts := map[string]int{}
	for _, r := range rows {
		cols := []string{r.Name, r.Address, r.Class, r.State, dash(r.Claim), dash(r.Installed), dash(r.LastPhase), r.Age}
		if wide {
			cols = append(cols, dash(r.User), dash(r.NodeAddress), dash(r.Arch), dash(r.CPU), dash(r.Memory), dash(r.ExecMode), dash(r.HostKey))
		}
		fmt.Fprintln(tw, strings.Join(cols, "\t"))
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

func (d deps) hostsCommand() *cobra.Command {
	var cf *clusterFlags
	var selector string
	pf := genericclioptions.NewPrintFlags("").WithTypeSetter(scheme.Scheme)
	c := d.command("hosts", "print the host pool: address, class, state, claim, installed profile, last phase", HostsUsage,
		func(c *cobra.Command, args []string) error { return d.hosts(c.Context(), cf, pf, selector, args) })
	cf = d.addClusterFlags(c, "pool `namespace` holding the SSHHosts")
	c.Flags().StringVarP(&selector, "selector", "l", "", "label `selector` (e.g. karpenter.dklesev.github.io/host-class=big)")
	pf.AddFlags(c)
	c.Flags().Lookup("output").Usage = "output `format`: wide, " + strings.Join(pf.AllowedFormats(), ", ") + " (default: the table)"
	_ = c.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{"wide", "json", "yaml", "name", "jsonpath=", "go-template="}, cobra.ShellCompDirectiveNoFileComp))
	return c
}

func (d deps) hosts(ctx context.Context, cf *clusterFlags, pf *genericclioptions.PrintFlags, selector string, args []string) error {
	if len(args) != 0 {
		return usageErr("unexpected argument(s) %q", args)
	}
	if err := cf.check(); err != nil {
		return err
	}
	sel, err := labels.Parse(selector)
	if err != nil {
		return usageErr("-l: %v", err)
	}
	format := *pf.OutputFormat
	table := format == "wide" || format == "" && *pf.TemplatePrinterFlags.TemplateArgument == ""
	var printer printers.ResourcePrinter
	if !table {
		if printer, err = pf.ToPrinter(); genericclioptions.IsNoCompatiblePrinterError(err) {
			return usageErr("-o %s: want wide, %s", format, strings.Join(pf.AllowedFormats(), ", "))
		} else if err != nil {
			return usageErr("-o %s: %v", format, err)
		}
	}
	cl, err := d.connect(cf)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, cf.timeout)
	defer cancel()
	ns := cf.namespace()
	var list v1beta1.SSHHostList
	if err := cl.List(ctx, &list, client.InNamespace(ns), client.MatchingLabelsSelector{Selector: sel}); err != nil {
		return apiErr(err, "", "SSHHosts in "+ns)
	}
	if table && len(list.Items) == 0 {
		fmt.Fprintf(d.stderr, "kpssh hosts: no SSHHosts in namespace %s\n", ns)
		return nil
	}
	if table {
		err = WriteHostTable(d.stdout, HostRows(list.Items, time.Now()), format == "wide")
	} else {
		err = printHosts(d.stdout, &list, printer, format == "name")
	}
	if err != nil {
		return runtimeErr("write output: %w", err)
	}
	return nil
}

// printHosts prints the list with a cli-runtime printer: json, yaml and
// the templates get the SSHHostList, name one line per host
// (sshhost.karpenter.dklesev.github.io/NAME: it prints no lists).
func printHosts(w io.Writer, list *v1beta1.SSHHostList, p printers.ResourcePrinter, perItem bool) error {
	for i := range list.Items {
		// The API's list items carry no kind; the printers need one.
		list.Items[i].SetGroupVersionKind(v1beta1.SchemeGroupVersion.WithKind("SSHHost"))
	}
	if !perItem {
		return p.PrintObj(list, w)
	}
	for i := range list.Items {
		if err := p.PrintObj(&list.Items[i], w); err != nil {
			return err
		}
	}
	return nil
}
