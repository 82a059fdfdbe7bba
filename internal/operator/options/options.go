// Package options holds kpssh's provider options, injected into Karpenter's
// operator beside core's (flags, each with an environment variable).
package options

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	coreoptions "sigs.k8s.io/karpenter/pkg/operator/options"
	"sigs.k8s.io/karpenter/pkg/utils/env"

	"github.com/dklesev/kpssh/apis/v1beta1"
)

func init() {
	coreoptions.Injectables = append(coreoptions.Injectables, &Options{})
}

type optionsKey struct{}

// Options are kpssh's provider settings.
type Options struct {
	// PoolNamespace holds every SSHHost and their Secrets (POOL_NAMESPACE).
	PoolNamespace string
	// ProbeInterval, ProbeTimeout, ProbeConcurrency: the host probe.
	ProbeInterval    time.Duration
	ProbeTimeout     time.Duration
	ProbeConcurrency int
	// AnsiblePlaybook is the ansible-playbook binary; empty = PATH.
	AnsiblePlaybook string
	// Executor runs phases: "local" (child process). "job" is reserved.
	Executor string
}

// Executors.
const (
	ExecutorLocal = "local"
	ExecutorJob   = "job"
)

// AddFlags implements coreoptions.Injectable.
func (o *Options) AddFlags(fs *coreoptions.FlagSet) {
	fs.StringVar(&o.PoolNamespace, "pool-namespace", env.WithDefaultString("POOL_NAMESPACE", v1beta1.DefaultPoolNamespace), "Namespace holding the SSHHosts of the pool and their Secrets")
	fs.DurationVar(&o.ProbeInterval, "probe-interval", env.WithDefaultDuration("PROBE_INTERVAL", 2*time.Minute), "Interval between probes of an unclaimed host")
	fs.DurationVar(&o.ProbeTimeout, "probe-timeout", env.WithDefaultDuration("PROBE_TIMEOUT", 30*time.Second), "Timeout of one host probe")
	fs.IntVar(&o.ProbeConcurrency, "probe-concurrency", env.WithDefaultInt("PROBE_CONCURRENCY", 32), "Maximum concurrent host probes")
	fs.StringVar(&o.AnsiblePlaybook, "ansible-playbook", env.WithDefaultString("ANSIBLE_PLAYBOOK", ""), "ansible-playbook executable (default: from PATH)")
	fs.StringVar(&o.Executor, "executor", env.WithDefaultString("EXECUTOR", ExecutorLocal), "Where phases run: local (child processes of the controller)")
}

// Parse implements coreoptions.Injectable.
func (o *Options) Parse(fs *coreoptions.FlagSet, args ...string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		return fmt.Errorf("parsing flags, %w", err)
	}
	return o.Validate()
}

// Validate checks the values.
func (o *Options) Validate() error {
	var errs []error
	if o.PoolNamespace == "" {
		errs = append(errs, errors.New("pool-namespace must not be empty"))
	}
	if o.ProbeInterval < time.Second {
		errs = append(errs, fmt.Errorf("probe-interval %s is below 1s", o.ProbeInterval))
	}
	if o.ProbeTimeout <= 0 {
		errs = append(errs, fmt.Errorf("probe-timeout %s must be positive", o.ProbeTimeout))
	}
	if o.ProbeConcurrency < 1 {
		errs = append(errs, fmt.Errorf("probe-concurrency %d must be at least 1", o.ProbeConcurrency))
	}
	switch o.Executor {
	case ExecutorLocal:
	case ExecutorJob:
		errs = append(errs, errors.New("executor job is not implemented yet; use local"))
	default:
		errs = append(errs, fmt.Errorf("executor %q is unknown (local)", o.Executor))
	}
	return errors.Join(errs...)
}

// ToContext implements coreoptions.Injectable.
func (o *Options) ToContext(ctx context.Context) context.Context { return ToContext(ctx, o) }

// ToContext stores o in ctx.
func ToContext(ctx context.Context, o *Options) context.Context {
	return context.WithValue(ctx, optionsKey{}, o)
}

// FromContext returns the options in ctx (nil if none).
func FromContext(ctx context.Context) *Options {
	o, _ := ctx.Value(optionsKey{}).(*Options)
	return o
}
