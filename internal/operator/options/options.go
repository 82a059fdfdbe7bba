// Package options holds kpssh's provider options, injected into Karpenter's
// operator beside core's (flags, each with an environment variable).
package options

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"

	coreoptions "sigs.k8s.io/karpenter/pkg/operator/options"
	"sigs.k8s.io/karpenter/pkg/utils/env"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/cloudprovider"
	"github.com/dklesev/kpssh/internal/jobexec"
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
	// AnsibleMitogen runs role and task-list phases with mitogen's
	// strategy (the runner image ships ansible-mitogen).
	AnsibleMitogen bool
	// Executor runs phases: "local" (child processes) or "job" (a
	// Kubernetes Job per phase, internal/jobexec).
	Executor string
	// Job* configure executor job: the Jobs' namespace and image (the
	// controller image: it holds `controller phase-run`), ttl after they
	// finish, host network, the phase container's memory limit.
	JobNamespace       string
	JobImage           string
	JobImagePullPolicy string
	JobTTL             time.Duration
	JobHostNetwork     bool
	JobMemoryLimit     string
	// JobNodeSelector ("k=v,k2=v2") pins phase pods; JobAllowManagedNodes
	// lets them run on nodes kpssh manages.
	JobNodeSelector      string
	JobAllowManagedNodes bool
	// RolesPath and CollectionsPath (colon lists) are operator content:
	// role directories and directories holding ansible_collections/,
	// searched after the shipped ones (docs/profiles.md, "Custom content").
	RolesPath       string
	CollectionsPath string
	// JobContent (JSON, jobexec.ParseContent) mounts that content into
	// phase pods at the same paths.
	JobContent string
	// Repair: when Karpenter's node repair (gate NodeRepair) reboots a
	// NotReady node and when it replaces it.
	Repair cloudprovider.Repair
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
	fs.BoolVarWithEnv(&o.AnsibleMitogen, "ansible-mitogen", "ANSIBLE_MITOGEN", false, "Executor local: run role and task-list phases with mitogen's strategy (one Python per host for the play instead of one per module task; docs/performance.md)")
	fs.StringVar(&o.Executor, "executor", env.WithDefaultString("EXECUTOR", ExecutorLocal), "Where phases run: local (child processes of the controller) or job (a Kubernetes Job per phase)")
	fs.StringVar(&o.JobNamespace, "job-namespace", env.WithDefaultString("JOB_NAMESPACE", ""), "Executor job: namespace of the phase Jobs and their input Secrets")
	fs.StringVar(&o.JobImage, "job-image", env.WithDefaultString("JOB_IMAGE", ""), "Executor job: image of the phase pods (the controller image)")
	fs.StringVar(&o.JobImagePullPolicy, "job-image-pull-policy", env.WithDefaultString("JOB_IMAGE_PULL_POLICY", "IfNotPresent"), "Executor job: Always, IfNotPresent or Never")
	fs.DurationVar(&o.JobTTL, "job-ttl", env.WithDefaultDuration("JOB_TTL", 15*time.Minute), "Executor job: a finished Job (and its log) is deleted after this")
	fs.BoolVarWithEnv(&o.JobHostNetwork, "job-host-network", "JOB_HOST_NETWORK", false, "Executor job: run phase pods in the node's network (hosts not reachable from the pod network)")
	fs.StringVar(&o.JobMemoryLimit, "job-memory-limit", env.WithDefaultString("JOB_MEMORY_LIMIT", "512Mi"), "Executor job: memory limit of a phase pod")
	fs.StringVar(&o.JobNodeSelector, "job-node-selector", env.WithDefaultString("JOB_NODE_SELECTOR", ""), "Executor job: node selector of phase pods (k=v,k2=v2)")
	fs.StringVar(&o.RolesPath, "roles-path", env.WithDefaultString("KPSSH_ROLES_PATH", ""), "Operator content: role directories (colon-separated), searched after the shipped roles")
	fs.StringVar(&o.CollectionsPath, "collections-path", env.WithDefaultString("KPSSH_COLLECTIONS_PATH", ""), "Operator content: directories holding ansible_collections/ (colon-separated), searched after the shipped collection")
	fs.StringVar(&o.JobContent, "job-content", env.WithDefaultString("KPSSH_JOB_CONTENT", ""), "Executor job: JSON {volumes, volumeMounts, initContainers} mounting the operator content into phase pods (the chart renders it)")
	fs.DurationVar(&o.Repair.RebootAfter, "repair-reboot-after", env.WithDefaultDuration("REPAIR_REBOOT_AFTER", cloudprovider.DefaultRepair.RebootAfter), "Node repair: a node NotReady this long is rebooted in place (the profile's reboot phase); 0 = never reboot")
	fs.DurationVar(&o.Repair.ReplaceAfter, "repair-replace-after", env.WithDefaultDuration("REPAIR_REPLACE_AFTER", cloudprovider.DefaultRepair.ReplaceAfter), "Node repair: a node NotReady this long (since its last reboot) is replaced")
	fs.BoolVarWithEnv(&o.JobAllowManagedNodes, "job-allow-managed-nodes", "JOB_ALLOW_MANAGED_NODES", false, "Executor job: let phase pods run on nodes kpssh manages (pin them with job-node-selector: a leave may stop the kubelet under its own pod)")
}

// NodeSelector parses JobNodeSelector ("k=v,k2=v2"; "" is none).
func (o *Options) NodeSelector() (map[string]string, error) {
	if strings.TrimSpace(o.JobNodeSelector) == "" {
		return nil, nil
	}
	m := map[string]string{}
	for _, kv := range strings.Split(o.JobNodeSelector, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok {
			return nil, fmt.Errorf("job-node-selector: %q is not key=value", kv)
		}
		if e := append(validation.IsQualifiedName(k), validation.IsValidLabelValue(v)...); len(e) > 0 {
			return nil, fmt.Errorf("job-node-selector %s=%s: %s", k, v, strings.Join(e, "; "))
		}
		if _, dup := m[k]; dup {
			return nil, fmt.Errorf("job-node-selector: %s given twice", k)
		}
		m[k] = v
	}
	return m, nil
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
	for flag, list := range map[string]string{"roles-path": o.RolesPath, "collections-path": o.CollectionsPath} {
		for _, p := range strings.Split(list, ":") {
			if p = strings.TrimSpace(p); p != "" && !path.IsAbs(p) {
				errs = append(errs, fmt.Errorf("%s: %q is not an absolute path", flag, p))
			}
		}
	}
	if err := o.Repair.Validate(); err != nil {
		errs = append(errs, err)
	}
	switch o.Executor {
	case ExecutorLocal:
	case ExecutorJob:
		errs = append(errs, o.validateJob()...)
	default:
		errs = append(errs, fmt.Errorf("executor %q is unknown (local, job)", o.Executor))
	}
	return errors.Join(errs...)
}

func (o *Options) validateJob() []error {
	var errs []error
	if o.JobNamespace == "" {
		errs = append(errs, errors.New("executor job needs job-namespace (JOB_NAMESPACE)"))
	} else if e := validation.IsDNS1123Label(o.JobNamespace); len(e) > 0 {
		errs = append(errs, fmt.Errorf("job-namespace %q: %s", o.JobNamespace, strings.Join(e, "; ")))
	}
	if o.JobImage == "" {
		errs = append(errs, errors.New("executor job needs job-image (JOB_IMAGE), the controller image"))
	} else if strings.ContainsAny(o.JobImage, " \t\n") {
		errs = append(errs, fmt.Errorf("job-image %q is not an image reference", o.JobImage))
	}
	switch o.JobImagePullPolicy {
	case "Always", "IfNotPresent", "Never":
	default:
		errs = append(errs, fmt.Errorf("job-image-pull-policy %q is not Always, IfNotPresent or Never", o.JobImagePullPolicy))
	}
	if o.JobTTL < time.Second {
		errs = append(errs, fmt.Errorf("job-ttl %s is below 1s", o.JobTTL))
	}
	if q, err := resource.ParseQuantity(o.JobMemoryLimit); err != nil || q.Sign() <= 0 {
		errs = append(errs, fmt.Errorf("job-memory-limit %q is not a positive quantity", o.JobMemoryLimit))
	}
	if _, err := o.NodeSelector(); err != nil {
		errs = append(errs, err)
	}
	if _, err := jobexec.ParseContent(o.JobContent); err != nil {
		errs = append(errs, err)
	}
	return errs
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
