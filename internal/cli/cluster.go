package cli

import (
	"context"
	"maps"
	"os"
	"slices"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dklesev/kpssh/apis/v1beta1"
)

// DefaultAPITimeout bounds all API calls of one command.
const DefaultAPITimeout = 30 * time.Second

// clusterFlags are the flags of every command that talks to the cluster:
// kubectl's own (k8s.io/cli-runtime's ConfigFlags: --kubeconfig, --context,
// -n/--namespace, --as, --token, …) and --timeout, kpssh's bound on the
// whole command.
type clusterFlags struct {
	*genericclioptions.ConfigFlags
	timeout time.Duration
	nsFlag  *pflag.Flag
	getenv  func(string) string
}

// addClusterFlags adds the cluster flags to c. nsUsage says what the pool
// namespace holds for this command.
func (d deps) addClusterFlags(c *cobra.Command, nsUsage string) *clusterFlags {
	cf := genericclioptions.NewConfigFlags(false)
	cf.CacheDir = nil // kpssh uses no discovery cache
	set := pflag.NewFlagSet("cluster", pflag.ContinueOnError)
	cf.AddFlags(set)
	set.VisitAll(func(f *pflag.Flag) { f.Annotations = map[string][]string{flagGroup: {"cluster"}} })
	f := &clusterFlags{ConfigFlags: cf, getenv: d.getenv, nsFlag: set.Lookup("namespace")}
	f.nsFlag.Usage = nsUsage + "; default: $POOL_NAMESPACE, else " + v1beta1.DefaultPoolNamespace
	set.Lookup("kubeconfig").Usage = "kubeconfig `path` (default: $KUBECONFIG, ~/.kube/config, in-cluster)"
	set.DurationVar(&f.timeout, "timeout", DefaultAPITimeout, "bound on the command's API calls")
	c.Flags().AddFlagSet(set)
	_ = c.RegisterFlagCompletionFunc("context", f.completeContexts)
	_ = c.RegisterFlagCompletionFunc("namespace", d.completeNamespaces(f))
	return f
}

// namespace is the pool namespace: -n, else $POOL_NAMESPACE, else
// kpssh-system. The kubeconfig context's namespace is not used: the pool
// has its own namespace, whatever the context works in.
func (f *clusterFlags) namespace() string {
	if f.nsFlag.Changed {
		return *f.Namespace
	}
	return poolNamespace(f.getenv)
}

// poolNamespace is $POOL_NAMESPACE, else kpssh-system.
func poolNamespace(getenv func(string) string) string {
	if ns := getenv("POOL_NAMESPACE"); ns != "" {
		return ns
	}
	return v1beta1.DefaultPoolNamespace
}

func (f *clusterFlags) check() error {
	if f.timeout <= 0 {
		return usageErr("--timeout must be positive")
	}
	if f.namespace() == "" {
		return usageErr("--namespace must not be empty")
	}
	return nil
}

// connect builds a client from the flags. A kubeconfig that cannot be
// loaded (a missing file, an unknown --context) is a usage error; nothing
// is dialled here.
func connect(f *clusterFlags) (client.Client, error) {
	loader := f.ToRawKubeConfigLoader()
	raw, err := loader.RawConfig()
	if err != nil {
		return nil, usageErr("kubeconfig: %w", err)
	}
	// Without any kubeconfig ConfigFlags falls back to localhost:8080;
	// say what is missing instead.
	if len(raw.Clusters) == 0 && *f.APIServer == "" && os.Getenv("KUBERNETES_SERVICE_HOST") == "" {
		return nil, usageErr("kubeconfig: none found (--kubeconfig, $KUBECONFIG, ~/.kube/config) and not running in a cluster")
	}
	cfg, err := loader.ClientConfig()
	if err != nil {
		return nil, usageErr("kubeconfig: %w", err)
	}
	if cfg.Timeout == 0 || cfg.Timeout > f.timeout {
		cfg.Timeout = f.timeout
	}
	cfg.UserAgent = "kpssh-cli"
	c, err := client.New(cfg, client.Options{Scheme: scheme.Scheme})
	if err != nil {
		return nil, runtimeErr("API client: %w", err)
	}
	return c, nil
}

// completeContexts offers the kubeconfig's contexts for --context.
func (f *clusterFlags) completeContexts(*cobra.Command, []string, string) ([]cobra.Completion, cobra.ShellCompDirective) {
	raw, err := f.ToRawKubeConfigLoader().RawConfig()
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	// sorted: a map's order would make the list differ from one TAB to the next
	return slices.Sorted(maps.Keys(raw.Contexts)), cobra.ShellCompDirectiveNoFileComp
}

// completeNamespaces offers the cluster's namespaces for -n.
func (d deps) completeNamespaces(f *clusterFlags) cobra.CompletionFunc {
	return func(c *cobra.Command, _ []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
		var l corev1.NamespaceList
		var out []cobra.Completion
		if d.list(c, f, &l) {
			for _, n := range l.Items {
				out = append(out, n.Name)
			}
		}
		return out, cobra.ShellCompDirectiveNoFileComp
	}
}

// completeHosts offers the pool's SSHHost names, with address and state.
func (d deps) completeHosts(c *cobra.Command, f *clusterFlags) []cobra.Completion {
	var l v1beta1.SSHHostList
	var out []cobra.Completion
	if d.list(c, f, &l, client.InNamespace(f.namespace())) {
		for _, h := range l.Items {
			out = append(out, cobra.CompletionWithDesc(h.Name, h.Spec.Address+" "+string(h.CurrentState())))
		}
	}
	return out
}

// list is a List for completion: any error yields nothing (a completion
// never fails loudly).
func (d deps) list(c *cobra.Command, f *clusterFlags, l client.ObjectList, opts ...client.ListOption) bool {
	cl, err := d.connect(f)
	if err != nil {
		return false
	}
	ctx := c.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	return cl.List(ctx, l, opts...) == nil
}
