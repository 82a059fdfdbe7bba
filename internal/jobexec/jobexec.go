// Package jobexec is executor `job`: each phase runs as a Kubernetes Job of
// the controller image (built on the runner image) instead of a child
// process of the controller. It implements engine.Engine and knows Jobs,
// Secrets and Pods, and the engine's Request/Result — nothing of hosts or
// claims: the caller names the run with an opaque Request.Key.
//
// One run: the Job is created first, then its inputs Secret (the request,
// private key, token and secrets included) with the Job as owner, so the
// Secret never exists without an owner that the garbage collector follows;
// the pod mounts it read-only and runs `controller phase-run`, which writes
// the redacted result to its termination message. The executor watches the
// pod, reads the result from its terminated state, deletes the Secret, and
// leaves the Job to ttlSecondsAfterFinished (its log stays for a while).
//
// The Secret's name is predictable, and the namespace may hold Secrets and
// pods of others: an inputs Secret that is already there counts only if its
// controller is this Job (any other is refused, and left alone), the Job
// gives phase-run the SHA-256 of the inputs it was made for (phase-run
// refuses other content, whoever wrote it), and only the Job's own pod
// (controlled by the Job, running the Job's command) reports a result.
//
// The Job name derives from the key, so a restarted controller running the
// same phase for the same claim finds the Job and waits for it instead of
// starting a second one. A Job of the same key but other inputs (a new
// bootstrap token after a crash) is stale: it is deleted, its pod gone,
// before the new one starts.
package jobexec

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dklesev/kpssh/internal/engine"
)

// Labels and annotations on the Job, its pod and its Secret.
const (
	LabelManagedBy   = "app.kubernetes.io/managed-by"
	ManagedBy        = "kpssh"
	LabelRun         = "kpssh.dklesev.github.io/run"
	LabelPhase       = "kpssh.dklesev.github.io/phase"
	AnnotationKey    = "kpssh.dklesev.github.io/run-key"
	AnnotationInputs = "kpssh.dklesev.github.io/inputs-sha256"
	// ContainerName is the phase container's name.
	ContainerName = "phase"
	// jobNameLabel is what the Job controller labels its pods with.
	jobNameLabel = "batch.kubernetes.io/job-name"
	// managedNodeLabel marks nodes kpssh joined: a phase pod never runs on
	// one (a leave would stop the kubelet under its own pod).
	managedNodeLabel = "karpenter.dklesev.github.io/managed"
)

// Defaults of Options.
const (
	DefaultTTL          = 15 * time.Minute
	DefaultStartGrace   = 2 * time.Minute
	DefaultPullGrace    = 2 * time.Minute
	DefaultMemoryLimit  = "512Mi"
	DefaultPollInterval = 10 * time.Second
	runAsID             = 65532
)

// Options configure an Executor.
type Options struct {
	// Namespace of the Jobs and their inputs Secrets.
	Namespace string
	// Image is the phase image: the controller image (it holds `controller
	// phase-run`), by default the controller's own.
	Image           string
	ImagePullPolicy corev1.PullPolicy
	// TTL is the Job's ttlSecondsAfterFinished.
	TTL time.Duration
	// HostNetwork runs the phase pod in the node's network namespace (hosts
	// reachable from nodes but not from the pod network).
	HostNetwork bool
	// MemoryLimit of the phase container (a resource quantity).
	MemoryLimit string
	// DefaultTimeout is used for requests without one (engine.DefaultTimeout).
	DefaultTimeout time.Duration
	// StartGrace is added to the phase timeout for scheduling, image pull
	// and start: activeDeadlineSeconds = timeout + StartGrace.
	StartGrace time.Duration
	// PullGrace is how long an image pull may fail before the run is given
	// up as a ConfigError.
	PullGrace time.Duration
	// PollInterval re-reads the Job and pod between watch events.
	PollInterval time.Duration
	// ImagePullSecrets of the phase pod.
	ImagePullSecrets []string
	// NodeSelector of the phase pod.
	NodeSelector map[string]string
	// AllowManagedNodes drops the rule that keeps phase pods off the nodes
	// kpssh manages (for clusters where those are the only workers: pin the
	// pods with NodeSelector, or a leave may stop the kubelet under its own
	// pod).
	AllowManagedNodes bool
	// Content is the operator content the phase pod mounts (ParseContent);
	// RolesPath and CollectionsPaths are the controller's KPSSH_ROLES_PATH
	// and KPSSH_COLLECTIONS_PATH, passed to phase-run so that its engine
	// searches the same paths as the controller's validation did.
	Content          Content
	RolesPath        []string
	CollectionsPaths []string
}

// Executor runs phases as Jobs.
type Executor struct {
	Client client.WithWatch
	Opts   Options
	memory resource.Quantity
	now    func() time.Time
	// goneWait bounds the wait for an inputs Secret being deleted.
	goneWait time.Duration
}

var _ engine.Engine = (*Executor)(nil)

// New checks o and returns an executor on c (a direct client: Jobs, pods
// and Secrets are read live, no informer).
func New(c client.WithWatch, o Options) (*Executor, error) {
	if c == nil {
		return nil, errors.New("jobexec: a client is required")
	}
	if errs := validation.IsDNS1123Label(o.Namespace); len(errs) > 0 {
		return nil, fmt.Errorf("jobexec: namespace %q: %s", o.Namespace, strings.Join(errs, "; "))
	}
	if strings.TrimSpace(o.Image) == "" || strings.ContainsAny(o.Image, " \t\n") {
		return nil, fmt.Errorf("jobexec: image %q is not an image reference", o.Image)
	}
	switch o.ImagePullPolicy {
	case "", corev1.PullAlways, corev1.PullIfNotPresent, corev1.PullNever:
	default:
		return nil, fmt.Errorf("jobexec: image pull policy %q is not Always, IfNotPresent or Never", o.ImagePullPolicy)
	}
	if o.TTL == 0 {
		o.TTL = DefaultTTL
	}
	if o.TTL < time.Second {
		return nil, fmt.Errorf("jobexec: ttl %s is below 1s", o.TTL)
	}
	if o.MemoryLimit == "" {
		o.MemoryLimit = DefaultMemoryLimit
	}
	mem, err := resource.ParseQuantity(o.MemoryLimit)
	if err != nil || mem.Sign() <= 0 {
		return nil, fmt.Errorf("jobexec: memory limit %q is not a positive quantity", o.MemoryLimit)
	}
	for k, v := range o.NodeSelector {
		if errs := append(validation.IsQualifiedName(k), validation.IsValidLabelValue(v)...); len(errs) > 0 {
			return nil, fmt.Errorf("jobexec: node selector %s=%s: %s", k, v, strings.Join(errs, "; "))
		}
	}
	for d, def := range map[*time.Duration]time.Duration{&o.DefaultTimeout: engine.DefaultTimeout, &o.StartGrace: DefaultStartGrace,
		&o.PullGrace: DefaultPullGrace, &o.PollInterval: DefaultPollInterval} {
		if *d <= 0 {
			*d = def
		}
	}
	return &Executor{Client: c, Opts: o, memory: mem, now: time.Now, goneWait: 30 * time.Second}, nil
}

// JobName is the Job (and inputs Secret) name of a run: the phase and a hash
// of the key, a DNS-1123 label of at most 63 characters. An empty key gets a
// random suffix (a run that is never resumed).
func JobName(ph engine.Phase, key string) string {
	var sum []byte
	if key == "" {
		sum = make([]byte, 10)
		_, _ = rand.Read(sum)
	} else {
		h := sha256.Sum256([]byte(key))
		sum = h[:10]
	}
	// "kpssh-uninstall-" + 20 hex = 36 characters; the Job controller's pod
	// name suffix (-xxxxx) still fits in 63.
	return "kpssh-" + string(ph) + "-" + hex.EncodeToString(sum)
}

// Run runs req as a Job and waits for its result. Like the Local engine it
// never panics and always returns a redacted result. When ctx ends first the
// Job keeps running (a restarted controller re-attaches) and the result is
// TimedOut.
func (e *Executor) Run(ctx context.Context, req engine.Request) engine.Result {
	start := e.now()
	red := redactor(req)
	res := e.run(ctx, req)
	res.Duration = e.now().Sub(start)
	res.FailedTask = red.Redact(res.FailedTask)
	res.Message = shorten(red.Redact(strings.TrimSpace(res.Message)), engine.MaxMessage)
	for i := range res.Changes {
		res.Changes[i].Task, res.Changes[i].Diff = red.Redact(res.Changes[i].Task), red.Redact(res.Changes[i].Diff)
	}
	return res
}

// redactor scrubs the request's secrets from what the executor returns (the
// pod's result is redacted already; messages built here may quote the pod).
func redactor(req engine.Request) *engine.Redactor {
	vals := append([]string{}, req.Redact...)
	if t := req.Context.BootstrapToken; t != "" {
		vals = append(vals, t)
		if _, s, ok := strings.Cut(t, "."); ok {
			vals = append(vals, s)
		}
	}
	for _, v := range req.Context.Secrets {
		vals = append(vals, v)
	}
	return engine.NewRedactor(vals...)
}

func configError(format string, a ...any) engine.Result {
	return engine.Result{Outcome: engine.ConfigError, ExitCode: -1, Message: fmt.Sprintf(format, a...)}
}

// apiFailure: the apiserver refused or failed before the pod could run;
// the host was not reached (a config error, as for the Local engine when it
// cannot start ansible-playbook: the host is not to blame).
func apiFailure(what string, err error) engine.Result {
	return engine.Result{Outcome: engine.ConfigError, ExitCode: -1, Message: fmt.Sprintf("executor job: %s: %v", what, err)}
}

func (e *Executor) timeout(req engine.Request) time.Duration {
	if req.Timeout > 0 {
		return req.Timeout
	}
	return e.Opts.DefaultTimeout
}

func (e *Executor) run(ctx context.Context, req engine.Request) engine.Result {
	if req.Timeout < 0 {
		return configError("timeout %s is negative", req.Timeout)
	}
	input, err := EncodeInput(req)
	if err != nil {
		return configError("executor job: %v", err)
	}
	name := JobName(req.Phase, req.Key)
	job, err := e.ensureJob(ctx, name, req, digest(input))
	if err != nil {
		if ctx.Err() != nil {
			return canceled(ctx, name)
		}
		if fe := (*ForeignSecretError)(nil); errors.As(err, &fe) {
			return configError("executor job: %v", fe)
		}
		return apiFailure("starting Job "+name, err)
	}
	// A Job re-attached to after it finished needs no inputs again.
	var secret types.UID
	if !finished(job) {
		if secret, err = e.ensureSecret(ctx, job, input); err != nil {
			if ctx.Err() != nil {
				return canceled(ctx, name)
			}
			// A Job without inputs would only wait for its volume until
			// the deadline; one with another's inputs must not run.
			e.abandon(ctx, job)
			if fe := (*ForeignSecretError)(nil); errors.As(err, &fe) {
				return configError("executor job: %v", fe)
			}
			return apiFailure("creating the inputs Secret of Job "+name, err)
		}
	}
	res, done := e.wait(ctx, job)
	if !done && ctx.Err() != nil && (req.Check || req.Phase == engine.PhaseCheck) {
		// A drift check the caller stopped waiting for (a phase wants the
		// host) is not resumed: its Job goes, its pod is interrupted.
		e.abandon(ctx, job)
	}
	if done {
		// The inputs are no longer needed once the pod ended: delete them
		// now rather than with the Job at its TTL.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		_ = e.deleteSecret(dctx, job, secret)
		cancel()
	}
	return res
}

func canceled(ctx context.Context, name string) engine.Result {
	return engine.Result{Outcome: engine.TimedOut, ExitCode: -1, Touched: true,
		Message: fmt.Sprintf("stopped waiting for Job %s: %v (the Job keeps running; a restarted controller re-attaches)", name, context.Cause(ctx))}
}

// ensureJob returns the run's Job: the existing one when it has the same
// key and inputs, else a new one (a stale one deleted first).
func (e *Executor) ensureJob(ctx context.Context, name string, req engine.Request, digest string) (*batchv1.Job, error) {
	key := client.ObjectKey{Namespace: e.Opts.Namespace, Name: name}
	for attempt := 0; ; attempt++ {
		job := &batchv1.Job{}
		err := e.Client.Get(ctx, key, job)
		switch {
		case apierrors.IsNotFound(err):
			// A Secret of the inputs' name before there is a Job: refused
			// before anything can mount it (ensureSecret checks again).
			if _, err := e.checkSecret(ctx, name, ""); err != nil {
				return nil, err
			}
			job = e.jobFor(name, req, digest)
			if err := e.Client.Create(ctx, job); err != nil {
				if apierrors.IsAlreadyExists(err) && attempt < 3 {
					continue // another caller made it meanwhile: look again
				}
				return nil, err
			}
			return job, nil
		case err != nil:
			return nil, err
		}
		if job.DeletionTimestamp == nil && req.Key != "" && job.Annotations[AnnotationKey] == req.Key && job.Annotations[AnnotationInputs] == digest {
			return job, nil // re-attach
		}
		if attempt >= 3 {
			return nil, fmt.Errorf("Job %s is still there after being replaced", name)
		}
		if err := e.removeStale(ctx, job); err != nil {
			return nil, err
		}
	}
}

// removeStale deletes a Job of other inputs and waits until it and its pods
// are gone (foreground deletion: the Job goes last), so that two runs of the
// same phase never overlap on a host.
func (e *Executor) removeStale(ctx context.Context, job *batchv1.Job) error {
	if job.DeletionTimestamp == nil {
		err := e.Client.Delete(ctx, job, client.PropagationPolicy(metav1.DeletePropagationForeground), client.Preconditions{UID: &job.UID})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return fmt.Errorf("deleting stale Job %s: %w", job.Name, err)
		}
	}
	bound := e.Opts.StartGrace
	deadline := e.now().Add(bound)
	for {
		err := e.Client.Get(ctx, client.ObjectKeyFromObject(job), &batchv1.Job{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if e.now().After(deadline) {
			return fmt.Errorf("stale Job %s (other inputs) still terminating after %s", job.Name, bound)
		}
		if err := sleep(ctx, min(time.Second, e.Opts.PollInterval)); err != nil {
			return err
		}
	}
}

// ensureSecret creates job's inputs Secret, or finds the one this Job was
// given before (re-attached after a restart), and returns its UID.
func (e *Executor) ensureSecret(ctx context.Context, job *batchv1.Job, input []byte) (types.UID, error) {
	for attempt := 0; ; attempt++ {
		s := secretFor(job, input)
		err := e.Client.Create(ctx, s)
		if err == nil {
			return s.UID, nil
		}
		if !apierrors.IsAlreadyExists(err) || attempt >= 3 {
			return "", err
		}
		// The name is taken: by this Job's Secret (its content is the
		// same: the Job's digest says so, and the pod checks it), a
		// leftover of an earlier Job of this name, or someone else's.
		uid, err := e.checkSecret(ctx, job.Name, job.UID)
		if err != nil || uid != "" {
			return uid, err
		}
	}
}

// ForeignSecretError: the inputs Secret's name is taken by a Secret that was
// not created for this run. Its content would decide what the phase runs and
// what it reports, so the run is refused; that Secret is not deleted.
type ForeignSecretError struct {
	Namespace, Name string
	// Owner describes the Secret's controller ("no controller", or kind,
	// name and UID).
	Owner string
	// Job is the UID of the Job it should belong to, empty before the Job
	// was created.
	Job types.UID
}

func (e *ForeignSecretError) Error() string {
	want := "Job " + e.Name
	if e.Job != "" {
		want += ", uid " + string(e.Job)
	}
	return fmt.Sprintf("inputs Secret %s/%s already exists and was not created for this run (controller: %s; expected: %s): "+
		"the phase does not run on inputs the controller did not write; that Secret is left alone: find out who created it "+
		"(anyone who can create Secrets in %s can), then delete it", e.Namespace, e.Name, e.Owner, want, e.Namespace)
}

// checkSecret looks at the Secret named name in the Job namespace, for the
// Job of that name with UID job (empty: no Job exists yet). It returns the
// Secret's UID when the Job controls it (made for it before), "" when there
// is no Secret (any more). A leftover of an earlier Job of this name — its
// only owner that Job, now gone: garbage the garbage collector would delete
// — is deleted; a Secret being deleted is waited for; any other Secret is a
// ForeignSecretError. Only the Secret's metadata is read.
func (e *Executor) checkSecret(ctx context.Context, name string, job types.UID) (types.UID, error) {
	deadline := e.now().Add(e.goneWait)
	for {
		m := &metav1.PartialObjectMetadata{}
		m.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Secret"))
		err := e.Client.Get(ctx, client.ObjectKey{Namespace: e.Opts.Namespace, Name: name}, m)
		if apierrors.IsNotFound(err) {
			return "", nil
		}
		if err != nil {
			return "", fmt.Errorf("reading the owner of the existing inputs Secret %s/%s: %w", e.Opts.Namespace, name, err)
		}
		ref := metav1.GetControllerOfNoCopy(m)
		isJob := ref != nil && ref.APIVersion == "batch/v1" && ref.Kind == "Job" && ref.Name == name
		switch {
		case isJob && job != "" && ref.UID == job:
			return m.UID, nil
		case m.DeletionTimestamp != nil:
			if e.now().After(deadline) {
				return "", fmt.Errorf("inputs Secret %s/%s is still being deleted after %s", e.Opts.Namespace, name, e.goneWait)
			}
			if err := sleep(ctx, min(time.Second, e.Opts.PollInterval)); err != nil {
				return "", err
			}
		case isJob && len(m.OwnerReferences) == 1:
			// Its owner is a Job of this name: gone unless that Job is
			// there (a concurrent run of the same key made both).
			cur := &batchv1.Job{}
			err := e.Client.Get(ctx, client.ObjectKey{Namespace: e.Opts.Namespace, Name: name}, cur)
			if err == nil && cur.UID == ref.UID {
				return "", nil
			}
			if err != nil && !apierrors.IsNotFound(err) {
				return "", err
			}
			uid := m.UID
			err = e.Client.Delete(ctx, m, client.Preconditions{UID: &uid})
			if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				return "", fmt.Errorf("deleting the inputs Secret %s/%s of an earlier Job: %w", e.Opts.Namespace, name, err)
			}
		default:
			owner := "no controller"
			if ref != nil {
				owner = fmt.Sprintf("%s %s, uid %s", ref.Kind, ref.Name, ref.UID)
			}
			return "", &ForeignSecretError{Namespace: e.Opts.Namespace, Name: name, Owner: owner, Job: job}
		}
	}
}

// secretFor is the inputs Secret of job, owned by it.
func secretFor(job *batchv1.Job, input []byte) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: job.Name, Namespace: job.Namespace,
			Labels: map[string]string{LabelManagedBy: ManagedBy, LabelRun: job.Name},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: job.Name, UID: job.UID,
				Controller: ptr.To(true)}},
		},
		Immutable: ptr.To(true),
		Type:      corev1.SecretTypeOpaque,
		Data:      map[string][]byte{InputKey: input},
	}
}

// deleteSecret deletes job's inputs Secret: the one of UID uid, or (uid
// empty: a Job re-attached to after it finished) the one the Job controls.
// A Secret of that name that is not the Job's stays.
func (e *Executor) deleteSecret(ctx context.Context, job *batchv1.Job, uid types.UID) error {
	if uid == "" {
		var err error
		if uid, err = e.checkSecret(ctx, job.Name, job.UID); err != nil || uid == "" {
			return err
		}
	}
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: job.Name, Namespace: job.Namespace}}
	if err := e.Client.Delete(ctx, s, client.Preconditions{UID: &uid}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return err
	}
	return nil
}

// Render returns the Job and inputs Secret that Run would create for req,
// without creating anything (the Secret holds the request: handle it as one).
func (e *Executor) Render(req engine.Request) (*batchv1.Job, *corev1.Secret, error) {
	input, err := EncodeInput(req)
	if err != nil {
		return nil, nil, err
	}
	job := e.jobFor(JobName(req.Phase, req.Key), req, digest(input))
	return job, secretFor(job, input), nil
}

// digest identifies a run's inputs on its Job and in phase-run's command (a
// SHA-256 of the Secret's content: it includes the private key, so it
// reveals nothing guessable).
func digest(input []byte) string {
	sum := sha256.Sum256(input)
	return hex.EncodeToString(sum[:])
}

// jobFor is the Job of one run.
func (e *Executor) jobFor(name string, req engine.Request, digest string) *batchv1.Job {
	deadline := int64((e.timeout(req) + e.Opts.StartGrace + time.Second - 1) / time.Second)
	labels := map[string]string{LabelManagedBy: ManagedBy, LabelRun: name, LabelPhase: string(req.Phase)}
	annotations := map[string]string{AnnotationInputs: digest}
	if req.Key != "" {
		annotations[AnnotationKey] = req.Key
	}
	var pullSecrets []corev1.LocalObjectReference
	for _, s := range e.Opts.ImagePullSecrets {
		pullSecrets = append(pullSecrets, corev1.LocalObjectReference{Name: s})
	}
	pull := e.Opts.ImagePullPolicy
	if pull == "" {
		pull = corev1.PullIfNotPresent
	}
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.Opts.Namespace, Labels: labels, Annotations: annotations},
		Spec: batchv1.JobSpec{
			// One attempt: a phase that failed is reported, not retried
			// behind the controller's back.
			BackoffLimit:            ptr.To[int32](0),
			ActiveDeadlineSeconds:   &deadline,
			TTLSecondsAfterFinished: ptr.To(int32(e.Opts.TTL / time.Second)),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					RestartPolicy:                 corev1.RestartPolicyNever,
					AutomountServiceAccountToken:  ptr.To(false),
					EnableServiceLinks:            ptr.To(false),
					HostNetwork:                   e.Opts.HostNetwork,
					ImagePullSecrets:              pullSecrets,
					TerminationGracePeriodSeconds: ptr.To[int64](30),
					Affinity:                      e.affinity(),
					NodeSelector:                  e.Opts.NodeSelector,
					// Restricted Pod Security Standard. fsGroup makes the
					// Secret's files (0400) group-readable for the user.
					SecurityContext: &corev1.PodSecurityContext{
						RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](runAsID), RunAsGroup: ptr.To[int64](runAsID),
						FSGroup: ptr.To[int64](runAsID), SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
					},
					Containers: []corev1.Container{{
						Name:            ContainerName,
						Image:           e.Opts.Image,
						ImagePullPolicy: pull,
						// The digest: phase-run runs only the inputs this
						// Job was made for (the Job's spec is the
						// controller's; the Secret's name anyone may take).
						Command: []string{"/usr/bin/tini", "--", "/usr/local/bin/controller", PhaseRunCommand,
							"--input", InputDir + "/" + InputKey, "--" + DigestFlag, digest},
						Resources: corev1.ResourceRequirements{
							Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")},
							Limits:   corev1.ResourceList{corev1.ResourceMemory: e.memory},
						},
						TerminationMessagePath:   TerminationLog,
						TerminationMessagePolicy: corev1.TerminationMessageReadFile,
						SecurityContext: &corev1.SecurityContext{
							AllowPrivilegeEscalation: ptr.To(false), ReadOnlyRootFilesystem: ptr.To(true), RunAsNonRoot: ptr.To(true),
							Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
						},
						Env: e.contentEnv(),
						VolumeMounts: append([]corev1.VolumeMount{
							{Name: "input", MountPath: InputDir, ReadOnly: true},
							{Name: "run", MountPath: "/dev/shm"},
							{Name: "tmp", MountPath: "/tmp"},
							{Name: "home", MountPath: "/home/kpssh"},
						}, e.Opts.Content.VolumeMounts...),
					}},
					InitContainers: e.Opts.Content.InitContainers,
					Volumes: append([]corev1.Volume{
						{Name: "input", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
							SecretName: name, DefaultMode: ptr.To[int32](0o400)}}},
						// The engine's run directory (key, secrets): tmpfs.
						{Name: "run", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{
							Medium: corev1.StorageMediumMemory, SizeLimit: ptr.To(resource.MustParse("64Mi"))}}},
						{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: ptr.To(resource.MustParse("256Mi"))}}},
						{Name: "home", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: ptr.To(resource.MustParse("64Mi"))}}},
					}, e.Opts.Content.Volumes...),
				},
			},
		},
	}
}

// contentEnv tells phase-run where the operator content is (paths only).
func (e *Executor) contentEnv() []corev1.EnvVar {
	var env []corev1.EnvVar
	if len(e.Opts.RolesPath) > 0 {
		env = append(env, corev1.EnvVar{Name: EnvRolesPath, Value: strings.Join(e.Opts.RolesPath, ":")})
	}
	if len(e.Opts.CollectionsPaths) > 0 {
		env = append(env, corev1.EnvVar{Name: EnvCollectionsPath, Value: strings.Join(e.Opts.CollectionsPaths, ":")})
	}
	return env
}

// affinity keeps phase pods off kpssh's own nodes unless allowed.
func (e *Executor) affinity() *corev1.Affinity {
	if e.Opts.AllowManagedNodes {
		return nil
	}
	return &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: managedNodeLabel, Operator: corev1.NodeSelectorOpDoesNotExist}},
		}}},
	}}
}

// wait follows the Job until it has a result. done reports that the run is
// over (its inputs may go); false when ctx ended first.
func (e *Executor) wait(ctx context.Context, job *batchv1.Job) (res engine.Result, done bool) {
	// The Job's own deadline plus a margin for its controller to act: past
	// it, the executor gives up on a Job that never ends (no Job controller,
	// a stuck node) and removes it.
	deadline := job.CreationTimestamp.Time
	if deadline.IsZero() {
		deadline = e.now()
	}
	deadline = deadline.Add(time.Duration(*job.Spec.ActiveDeadlineSeconds)*time.Second + time.Minute)
	var pullSince time.Time
	last := "" // the last account of a run not done, for timeouts
	for {
		cur := &batchv1.Job{}
		err := e.Client.Get(ctx, client.ObjectKeyFromObject(job), cur)
		switch {
		case ctx.Err() != nil:
			return canceled(ctx, job.Name), false
		case apierrors.IsNotFound(err) || (err == nil && cur.UID != job.UID):
			return engine.Result{Outcome: engine.Failed, ExitCode: -1, Touched: true,
				Message: fmt.Sprintf("Job %s was deleted before its pod reported a result", job.Name)}, true
		case err != nil:
			// A flaky apiserver: keep trying until the deadline.
		}
		pods, rv, perr := e.pods(ctx, job)
		if err == nil && perr == nil {
			st := judge(cur, pods, e.now())
			if st.done {
				if st.res.Outcome == engine.TimedOut && last != "" {
					st.res.Message += " (last seen: " + last + ")"
				}
				return st.res, true
			}
			last = st.status
			if st.pulling != "" {
				if pullSince.IsZero() {
					pullSince = e.now()
				}
				if st.fatalPull || e.now().Sub(pullSince) >= e.Opts.PullGrace {
					e.abandon(ctx, cur)
					return configError("phase pod cannot start its image %s: %s (nothing ran on the host)", e.Opts.Image, st.pulling), true
				}
			} else {
				pullSince = time.Time{}
			}
			if e.now().After(deadline) {
				e.abandon(ctx, cur)
				return engine.Result{Outcome: engine.TimedOut, ExitCode: -1, Touched: st.started,
					Message: fmt.Sprintf("Job %s has no result %s after its deadline (%s); deleted", job.Name, time.Minute, st.status)}, true
			}
		}
		e.waitEvent(ctx, job, rv)
	}
}

func finished(job *batchv1.Job) bool {
	return jobCondition(job, batchv1.JobComplete) != nil || jobCondition(job, batchv1.JobFailed) != nil
}

// abandon deletes a Job the executor gives up on (its pod with it).
func (e *Executor) abandon(ctx context.Context, job *batchv1.Job) {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	_ = e.Client.Delete(dctx, job, client.PropagationPolicy(metav1.DeletePropagationBackground))
}

func (e *Executor) pods(ctx context.Context, job *batchv1.Job) ([]corev1.Pod, string, error) {
	var l corev1.PodList
	if err := e.Client.List(ctx, &l, client.InNamespace(job.Namespace), client.MatchingLabels{LabelRun: job.Name}); err != nil {
		return nil, "", err
	}
	var out []corev1.Pod
	for _, p := range l.Items {
		if ofJob(&p, job) {
			out = append(out, p)
		}
	}
	return out, l.ResourceVersion, nil
}

// ofJob: p is a pod the Job controller made for job. Its labels anyone can
// copy, and an owner reference anyone can write: its controller must be the
// Job (by UID), and its phase container the Job's (the same command, which
// names the inputs digest, termination message file and inputs Secret).
// Others' pods never report for the Job.
func ofJob(p *corev1.Pod, job *batchv1.Job) bool {
	ref := metav1.GetControllerOfNoCopy(p)
	if ref == nil || ref.UID != job.UID || ref.Kind != "Job" {
		return false
	}
	got, want := phaseContainer(p.Spec.Containers), phaseContainer(job.Spec.Template.Spec.Containers)
	return got != nil && want != nil && slices.Equal(got.Command, want.Command) && slices.Equal(got.Args, want.Args) &&
		got.TerminationMessagePath == want.TerminationMessagePath && got.TerminationMessagePolicy == want.TerminationMessagePolicy &&
		inputSecret(p.Spec) == inputSecret(job.Spec.Template.Spec)
}

func phaseContainer(cs []corev1.Container) *corev1.Container {
	for i := range cs {
		if cs[i].Name == ContainerName {
			return &cs[i]
		}
	}
	return nil
}

// inputSecret is the Secret of a pod's input volume.
func inputSecret(ps corev1.PodSpec) string {
	for _, v := range ps.Volumes {
		if v.Name == "input" && v.Secret != nil {
			return v.Secret.SecretName
		}
	}
	return ""
}

// waitEvent blocks until a pod of the Job changes, PollInterval passes, or
// ctx ends.
func (e *Executor) waitEvent(ctx context.Context, job *batchv1.Job, rv string) {
	wctx, cancel := context.WithTimeout(ctx, e.Opts.PollInterval)
	defer cancel()
	opts := []client.ListOption{client.InNamespace(job.Namespace), client.MatchingLabels{LabelRun: job.Name}}
	if rv != "" {
		opts = append(opts, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv}})
	}
	w, err := e.Client.Watch(wctx, &corev1.PodList{}, opts...)
	if err != nil {
		<-wctx.Done()
		return
	}
	defer w.Stop()
	for {
		select {
		case <-wctx.Done():
			return
		case ev, ok := <-w.ResultChan():
			if ok && ev.Type == watch.Error {
				// An expired resourceVersion and the like: re-list, but not
				// in a tight loop.
				_ = sleep(wctx, time.Second)
				return
			}
			if !ok || ev.Type != watch.Bookmark {
				return
			}
		}
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
