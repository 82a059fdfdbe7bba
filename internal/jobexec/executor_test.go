package jobexec

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/dklesev/kpssh/internal/engine"
)

const ns = "kpssh"

// fakeCluster is the fake client plus what the apiserver would add (UIDs,
// creation times) and a count of Job creations.
type fakeCluster struct {
	client.WithWatch
	jobCreates atomic.Int32
	uids       atomic.Int32
}

func newFake(t *testing.T) *fakeCluster {
	t.Helper()
	fc := &fakeCluster{}
	fc.WithWatch = fake.NewClientBuilder().WithScheme(clientgoscheme.Scheme).WithInterceptorFuncs(interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if obj.GetUID() == "" {
				obj.SetUID(types.UID(fmt.Sprintf("uid-%d", fc.uids.Add(1))))
			}
			obj.SetCreationTimestamp(metav1.Now())
			if _, ok := obj.(*batchv1.Job); ok {
				if err := c.Create(ctx, obj, opts...); err != nil {
					return err
				}
				fc.jobCreates.Add(1)
				return nil
			}
			return c.Create(ctx, obj, opts...)
		},
	}).Build()
	return fc
}

func newExec(t *testing.T, c client.WithWatch) *Executor {
	t.Helper()
	e, err := New(c, Options{Namespace: ns, Image: "localhost/kpssh-controller:dev", PollInterval: 50 * time.Millisecond, PullGrace: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func request() engine.Request {
	r := fullRequest()
	r.Source.Verified = nil
	return r
}

// getJob waits for the run's Job.
func getJob(t *testing.T, c client.Client, name string) *batchv1.Job {
	t.Helper()
	job := &batchv1.Job{}
	deadline := time.Now().Add(time.Minute)
	for {
		err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, job)
		if err == nil {
			return job
		}
		if !apierrors.IsNotFound(err) || time.Now().After(deadline) {
			t.Fatalf("Job %s: %v", name, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// podOf is the pod the Job controller would make, in the given state (the
// kubelet's part).
func podOf(job *batchv1.Job, phase corev1.PodPhase, st corev1.ContainerState) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: job.Name + "-abcde", Namespace: job.Namespace, Labels: job.Spec.Template.Labels,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: job.Name, UID: job.UID, Controller: ptr.To(true)}}},
		Spec:   job.Spec.Template.Spec,
		Status: corev1.PodStatus{Phase: phase, ContainerStatuses: []corev1.ContainerStatus{{Name: ContainerName, State: st}}},
	}
}

func terminated(code int32, msg string) corev1.ContainerState {
	return corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code, Reason: "Completed", Message: msg}}
}

func runAsync(ctx context.Context, e *Executor, req engine.Request) <-chan engine.Result {
	ch := make(chan engine.Result, 1)
	go func() { ch <- e.Run(ctx, req) }()
	return ch
}

func await(t *testing.T, ch <-chan engine.Result) engine.Result {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(time.Minute):
		t.Fatal("Run did not return within a minute")
		return engine.Result{}
	}
}

func TestRunCreatesJobAndOwnedSecret(t *testing.T) {
	fc := newFake(t)
	e := newExec(t, fc)
	req := request()
	name := JobName(req.Phase, req.Key)
	ch := runAsync(context.Background(), e, req)

	job := getJob(t, fc, name)
	// The Secret follows the Job, owned by it.
	var sec corev1.Secret
	deadline := time.Now().Add(time.Minute)
	for fc.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &sec) != nil {
		if time.Now().After(deadline) {
			t.Fatal("no inputs Secret")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if len(sec.OwnerReferences) != 1 || sec.OwnerReferences[0].UID != job.UID || sec.OwnerReferences[0].Kind != "Job" || !ptr.Deref(sec.Immutable, false) {
		t.Fatalf("Secret meta %+v immutable %v", sec.OwnerReferences, sec.Immutable)
	}
	got, err := DecodeInput(sec.Data[InputKey])
	if err != nil || got.Context.BootstrapToken != req.Context.BootstrapToken || string(got.Conn.PrivateKey) != string(req.Conn.PrivateKey) {
		t.Fatalf("Secret content: %v %+v", err, got)
	}
	checkJobSpec(t, job, req, e.Opts)

	want := engine.Result{Outcome: engine.Failed, FailedTask: "kpssh join", RC: 3, ExitCode: 2, Message: "script exited 3", Touched: true}
	if err := fc.Create(context.Background(), podOf(job, corev1.PodFailed, terminated(1, string(EncodeResult(want))))); err != nil {
		t.Fatal(err)
	}
	res := await(t, ch)
	if res.Outcome != want.Outcome || res.FailedTask != want.FailedTask || res.RC != 3 || res.ExitCode != 2 || res.Message != want.Message || !res.Touched {
		t.Fatalf("result %+v, want %+v", res, want)
	}
	if res.Duration <= 0 {
		t.Errorf("duration %v", res.Duration)
	}
	// The inputs are deleted once the result is read; the Job stays for its TTL.
	if err := fc.Get(context.Background(), client.ObjectKeyFromObject(&sec), &corev1.Secret{}); !apierrors.IsNotFound(err) {
		t.Errorf("inputs Secret after the result: %v", err)
	}
	if err := fc.Get(context.Background(), client.ObjectKeyFromObject(job), &batchv1.Job{}); err != nil {
		t.Errorf("Job after the result: %v", err)
	}
}

func checkJobSpec(t *testing.T, job *batchv1.Job, req engine.Request, o Options) {
	t.Helper()
	s := job.Spec
	ps := s.Template.Spec
	c := ps.Containers[0]
	wantDeadline := int64((req.Timeout + o.StartGrace) / time.Second)
	for _, chk := range []struct {
		what string
		ok   bool
	}{
		{"backoffLimit 0", ptr.Deref(s.BackoffLimit, -1) == 0},
		{fmt.Sprintf("activeDeadlineSeconds %d", wantDeadline), ptr.Deref(s.ActiveDeadlineSeconds, 0) == wantDeadline},
		{"ttlSecondsAfterFinished", ptr.Deref(s.TTLSecondsAfterFinished, 0) == int32(o.TTL/time.Second)},
		{"restartPolicy Never", ps.RestartPolicy == corev1.RestartPolicyNever},
		{"no token automount", ps.AutomountServiceAccountToken != nil && !*ps.AutomountServiceAccountToken},
		{"runAsNonRoot 65532", ps.SecurityContext != nil && ptr.Deref(ps.SecurityContext.RunAsNonRoot, false) && ptr.Deref(ps.SecurityContext.RunAsUser, 0) == 65532},
		{"seccomp RuntimeDefault", ps.SecurityContext.SeccompProfile != nil && ps.SecurityContext.SeccompProfile.Type == corev1.SeccompProfileTypeRuntimeDefault},
		{"no privilege escalation", c.SecurityContext != nil && c.SecurityContext.AllowPrivilegeEscalation != nil && !*c.SecurityContext.AllowPrivilegeEscalation},
		{"capabilities drop ALL", c.SecurityContext.Capabilities != nil && len(c.SecurityContext.Capabilities.Drop) == 1 && c.SecurityContext.Capabilities.Drop[0] == "ALL"},
		{"read-only root", ptr.Deref(c.SecurityContext.ReadOnlyRootFilesystem, false)},
		{"phase-run command with the inputs digest", strings.Join(c.Command, " ") == "/usr/bin/tini -- /usr/local/bin/controller phase-run --input /var/run/kpssh/input/request.json --input-sha256 "+job.Annotations[AnnotationInputs]},
		{"termination message file", c.TerminationMessagePath == TerminationLog && c.TerminationMessagePolicy == corev1.TerminationMessageReadFile},
		{"image", c.Image == o.Image},
		{"memory limit", c.Resources.Limits.Memory().String() == o.MemoryLimit},
		{"secret volume 0400", ps.Volumes[0].Secret != nil && ps.Volumes[0].Secret.SecretName == job.Name && ptr.Deref(ps.Volumes[0].Secret.DefaultMode, 0) == 0o400},
		{"input mounted read-only", c.VolumeMounts[0].Name == "input" && c.VolumeMounts[0].ReadOnly && c.VolumeMounts[0].MountPath == InputDir},
		{"run dir on tmpfs", ps.Volumes[1].EmptyDir != nil && ps.Volumes[1].EmptyDir.Medium == corev1.StorageMediumMemory && c.VolumeMounts[1].MountPath == "/dev/shm"},
		{"never on a managed node", ps.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchExpressions[0].Key == managedNodeLabel},
		{"run key annotation", job.Annotations[AnnotationKey] == req.Key},
		{"labels", job.Labels[LabelPhase] == string(req.Phase) && s.Template.Labels[LabelRun] == job.Name},
	} {
		if !chk.ok {
			t.Errorf("Job spec: not %s", chk.what)
		}
	}
	// Nothing secret in the Job object itself.
	b := fmt.Sprintf("%+v", job)
	for _, v := range []string{req.Context.BootstrapToken, "sekret-value-123", fakeKey} {
		if strings.Contains(b, v) {
			t.Errorf("the Job object holds a secret (%q)", v)
		}
	}
}

// abandonedRun starts req and ends its context once it waits on its Job, as
// a controller dying mid-run: the Job it left and what Run returned.
func abandonedRun(t *testing.T, fc *fakeCluster, req engine.Request) (*batchv1.Job, engine.Result) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ch := runAsync(ctx, newExec(t, fc), req)
	job := getJob(t, fc, JobName(req.Phase, req.Key))
	time.Sleep(100 * time.Millisecond) // let it reach the wait
	cancel()
	return job, await(t, ch)
}

// A drift check the caller stops waiting for (a phase wants the host) is
// not resumed: its Job is deleted, so its pod does not run on beside the
// phase.
func TestCancelledCheckJobDeleted(t *testing.T) {
	fc := newFake(t)
	req := request()
	req.Check, req.Key, req.Context.BootstrapToken = true, "", ""
	ctx, cancel := context.WithCancel(context.Background())
	ch := runAsync(ctx, newExec(t, fc), req)
	var job *batchv1.Job
	deadline := time.Now().Add(30 * time.Second)
	for job == nil && time.Now().Before(deadline) {
		l := &batchv1.JobList{}
		if err := fc.List(context.Background(), l, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		if len(l.Items) == 1 {
			job = &l.Items[0]
		}
		time.Sleep(10 * time.Millisecond)
	}
	if job == nil {
		t.Fatal("no Job")
	}
	time.Sleep(100 * time.Millisecond) // let it reach the wait
	cancel()
	if res := await(t, ch); res.Outcome != engine.TimedOut {
		t.Fatalf("cancelled check: %+v", res)
	}
	err := fc.Get(context.Background(), client.ObjectKeyFromObject(job), &batchv1.Job{})
	if err == nil {
		t.Fatal("the cancelled check's Job is still there")
	}
	if !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
}

func TestReattachAfterRestart(t *testing.T) {
	fc := newFake(t)
	req := request()
	name := JobName(req.Phase, req.Key)

	// The first controller dies while its Job runs (its context ends).
	job, res := abandonedRun(t, fc, req)
	if res.Outcome != engine.TimedOut || !strings.Contains(res.Message, "keeps running") {
		t.Fatalf("canceled: %+v", res)
	}
	if err := fc.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &corev1.Secret{}); err != nil {
		t.Fatalf("the running Job's inputs were deleted: %v", err)
	}

	// A restarted controller runs the same phase: it waits for that Job.
	ch := runAsync(context.Background(), newExec(t, fc), req)
	time.Sleep(100 * time.Millisecond)
	if err := fc.Create(context.Background(), podOf(job, corev1.PodSucceeded, terminated(0, string(EncodeResult(engine.Result{Outcome: engine.Succeeded, Touched: true}))))); err != nil {
		t.Fatal(err)
	}
	if res := await(t, ch); res.Outcome != engine.Succeeded {
		t.Fatalf("re-attached: %+v", res)
	}
	if n := fc.jobCreates.Load(); n != 1 {
		t.Fatalf("%d Jobs created, want 1", n)
	}
	// Re-running after the Job finished reads the same result again.
	if res := newExec(t, fc).Run(context.Background(), req); res.Outcome != engine.Succeeded || fc.jobCreates.Load() != 1 {
		t.Fatalf("finished Job: %+v, %d creates", res, fc.jobCreates.Load())
	}
}

func TestStaleInputsReplaceTheJob(t *testing.T) {
	fc := newFake(t)
	req := request()
	name := JobName(req.Phase, req.Key)
	old, _ := abandonedRun(t, fc, req)

	// Same key, a new token (the join after a crash mints one): the old Job
	// is stale and goes before the new one starts.
	req.Context.BootstrapToken = "ghijkl.0123456789ghijkl"
	ch := runAsync(context.Background(), newExec(t, fc), req)
	deadline := time.Now().Add(time.Minute)
	var cur *batchv1.Job
	for {
		cur = getJob(t, fc, name)
		if cur.UID != old.UID {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("stale Job not replaced")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if cur.Annotations[AnnotationInputs] == old.Annotations[AnnotationInputs] {
		t.Fatal("the new Job has the old inputs digest")
	}
	// A pod of the old Job does not count for the new one.
	if err := fc.Create(context.Background(), podOf(old, corev1.PodSucceeded, terminated(0, string(EncodeResult(engine.Result{Outcome: engine.Succeeded}))))); err != nil {
		t.Fatal(err)
	}
	p := podOf(cur, corev1.PodFailed, terminated(1, string(EncodeResult(engine.Result{Outcome: engine.Failed, Message: "new one"}))))
	p.Name = cur.Name + "-fghij"
	time.Sleep(100 * time.Millisecond)
	if err := fc.Create(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	if res := await(t, ch); res.Outcome != engine.Failed || res.Message != "new one" {
		t.Fatalf("result %+v", res)
	}
	if n := fc.jobCreates.Load(); n != 2 {
		t.Fatalf("%d Jobs created, want 2", n)
	}
}

func TestRunFailures(t *testing.T) {
	cases := []struct {
		name    string
		act     func(t *testing.T, fc *fakeCluster, skew func(time.Duration), job *batchv1.Job)
		outcome engine.Outcome
		msg     string
		jobGone bool
	}{
		{"image pull fails", func(t *testing.T, fc *fakeCluster, _ func(time.Duration), job *batchv1.Job) {
			_ = fc.Create(context.Background(), podOf(job, corev1.PodPending, corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff", Message: "Back-off pulling image"}}))
		}, engine.ConfigError, "cannot start its image", true},
		{"Job deleted", func(t *testing.T, fc *fakeCluster, _ func(time.Duration), job *batchv1.Job) {
			_ = fc.Delete(context.Background(), job)
		}, engine.Failed, "deleted before its pod reported", true},
		{"oom", func(t *testing.T, fc *fakeCluster, _ func(time.Duration), job *batchv1.Job) {
			_ = fc.Create(context.Background(), podOf(job, corev1.PodFailed, corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "OOMKilled"}}))
		}, engine.Failed, "OOMKilled", false},
		{"deadline", func(t *testing.T, fc *fakeCluster, _ func(time.Duration), job *batchv1.Job) {
			job.Status.Conditions = []batchv1.JobCondition{{Type: batchv1.JobFailed, Status: corev1.ConditionTrue, Reason: batchv1.JobReasonDeadlineExceeded, Message: "Job was active longer than specified deadline"}}
			if err := fc.Status().Update(context.Background(), job); err != nil {
				t.Error(err)
			}
		}, engine.TimedOut, "activeDeadlineSeconds", false},
		{"no Job controller", func(t *testing.T, fc *fakeCluster, skew func(time.Duration), job *batchv1.Job) {
			// Past the Job's deadline and the margin with nothing ever
			// happening: the executor gives up and removes the Job.
			skew(2 * time.Hour)
		}, engine.TimedOut, "no pod after", true},
		{"leaked secret in a pod message", func(t *testing.T, fc *fakeCluster, _ func(time.Duration), job *batchv1.Job) {
			_ = fc.Create(context.Background(), podOf(job, corev1.PodFailed, terminated(143, "dump: token abcdef.0123456789abcdef and sekret-value-123")))
		}, engine.Failed, "token *** and ***", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fc := newFake(t)
			e := newExec(t, fc)
			req := request()
			var offset atomic.Int64
			e.now = func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
			ch := runAsync(context.Background(), e, req)
			job := getJob(t, fc, JobName(req.Phase, req.Key))
			c.act(t, fc, func(d time.Duration) { offset.Store(int64(d)) }, job)
			res := await(t, ch)
			if res.Outcome != c.outcome || !strings.Contains(res.Message, c.msg) {
				t.Fatalf("got %+v, want %s with %q", res, c.outcome, c.msg)
			}
			for _, s := range []string{"0123456789abcdef", "sekret-value-123"} {
				if strings.Contains(res.Message, s) {
					t.Fatalf("secret in the result: %q", res.Message)
				}
			}
			err := fc.Get(context.Background(), client.ObjectKeyFromObject(job), &batchv1.Job{})
			if gone := apierrors.IsNotFound(err); gone != c.jobGone {
				t.Errorf("Job gone %v, want %v (%v)", gone, c.jobGone, err)
			}
		})
	}
}

func TestRunRefusesBadRequests(t *testing.T) {
	fc := newFake(t)
	e := newExec(t, fc)
	for _, req := range []engine.Request{{Phase: "bogus"}, {Phase: engine.PhaseLeave, Timeout: -time.Second}} {
		if res := e.Run(context.Background(), req); res.Outcome != engine.ConfigError {
			t.Errorf("%+v: %+v", req, res)
		}
	}
	if n := fc.jobCreates.Load(); n != 0 {
		t.Errorf("%d Jobs created for bad requests", n)
	}
	for _, o := range []Options{{Image: "x"}, {Namespace: "Bad_NS", Image: "x"}, {Namespace: ns}, {Namespace: ns, Image: "a b"},
		{Namespace: ns, Image: "x", MemoryLimit: "lots"}, {Namespace: ns, Image: "x", ImagePullPolicy: "Sometimes"}, {Namespace: ns, Image: "x", TTL: time.Millisecond}} {
		if _, err := New(fc, o); err == nil {
			t.Errorf("New(%+v) accepted", o)
		}
	}
}

func TestRenderPlacement(t *testing.T) {
	fc := newFake(t)
	e, err := New(fc, Options{Namespace: ns, Image: "x", NodeSelector: map[string]string{"kubernetes.io/hostname": "h1"}, AllowManagedNodes: true})
	if err != nil {
		t.Fatal(err)
	}
	job, sec, err := e.Render(request())
	if err != nil {
		t.Fatal(err)
	}
	ps := job.Spec.Template.Spec
	if ps.Affinity != nil || ps.NodeSelector["kubernetes.io/hostname"] != "h1" {
		t.Errorf("placement: affinity %+v selector %v", ps.Affinity, ps.NodeSelector)
	}
	if sec.Name != job.Name || len(sec.Data[InputKey]) == 0 {
		t.Errorf("rendered Secret %s", sec.Name)
	}
	if fc.jobCreates.Load() != 0 {
		t.Error("Render created a Job")
	}
	if _, err := New(fc, Options{Namespace: ns, Image: "x", NodeSelector: map[string]string{"bad key": "v"}}); err == nil {
		t.Error("a bad node selector was accepted")
	}
}

// An apiserver refusing the inputs Secret (quota, RBAC) is a config error:
// the host was never reached; the Job without inputs is removed.
func TestSecretRefused(t *testing.T) {
	fc := &fakeCluster{}
	inner := newFake(t)
	fc.WithWatch = interceptor.NewClient(inner, interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if _, ok := obj.(*corev1.Secret); ok {
				return apierrors.NewForbidden(corev1.Resource("secrets"), obj.GetName(), fmt.Errorf("quota"))
			}
			return c.Create(ctx, obj, opts...)
		},
	})
	e := newExec(t, fc)
	req := request()
	res := e.Run(context.Background(), req)
	if res.Outcome != engine.ConfigError || !strings.Contains(res.Message, "creating the inputs Secret") || res.Touched {
		t.Fatalf("result %+v", res)
	}
	err := inner.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: JobName(req.Phase, req.Key)}, &batchv1.Job{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("Job without inputs left: %v", err)
	}
}

// A Secret of the inputs' name that is not the run's own is refused before
// a Job exists, and left alone; one left by an earlier Job of the name (its
// owner gone) is garbage and replaced.
func TestExistingInputsSecret(t *testing.T) {
	req := request()
	name := JobName(req.Phase, req.Key)
	secret := func(owner *metav1.OwnerReference) *corev1.Secret {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Data: map[string][]byte{InputKey: []byte("{}")}}
		if owner != nil {
			s.OwnerReferences = []metav1.OwnerReference{*owner}
		}
		return s
	}
	jobRef := func(uid types.UID) *metav1.OwnerReference {
		return &metav1.OwnerReference{APIVersion: "batch/v1", Kind: "Job", Name: name, UID: uid, Controller: ptr.To(true)}
	}
	for _, c := range []struct {
		name  string
		owner *metav1.OwnerReference
		msg   string
	}{
		{"no owner", nil, "(controller: no controller; expected: Job " + name + ")"},
		{"another controller", &metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: "x", UID: "cm-1", Controller: ptr.To(true)},
			"(controller: ConfigMap x, uid cm-1; expected: Job " + name + ")"},
		{"a Job of another name", &metav1.OwnerReference{APIVersion: "batch/v1", Kind: "Job", Name: "other", UID: "job-9", Controller: ptr.To(true)},
			"controller: Job other, uid job-9"},
	} {
		t.Run("refused: "+c.name, func(t *testing.T) {
			fc := newFake(t)
			planted := secret(c.owner)
			if err := fc.Create(context.Background(), planted); err != nil {
				t.Fatal(err)
			}
			res := newExec(t, fc).Run(context.Background(), req)
			if res.Outcome != engine.ConfigError || res.Touched || !strings.Contains(res.Message, "inputs Secret "+ns+"/"+name+" already exists and was not created for this run") ||
				!strings.Contains(res.Message, c.msg) {
				t.Fatalf("result %+v", res)
			}
			if n := fc.jobCreates.Load(); n != 0 {
				t.Errorf("%d Jobs created", n)
			}
			cur := &corev1.Secret{}
			if err := fc.Get(context.Background(), client.ObjectKeyFromObject(planted), cur); err != nil || cur.UID != planted.UID {
				t.Errorf("the planted Secret was touched: %v", err)
			}
		})
	}
	t.Run("leftover of an earlier Job", func(t *testing.T) {
		fc := newFake(t)
		old := secret(jobRef("job-gone"))
		if err := fc.Create(context.Background(), old); err != nil {
			t.Fatal(err)
		}
		ch := runAsync(context.Background(), newExec(t, fc), req)
		job := getJob(t, fc, name)
		deadline := time.Now().Add(time.Minute)
		for {
			cur := &corev1.Secret{}
			err := fc.Get(context.Background(), client.ObjectKeyFromObject(old), cur)
			if err == nil && cur.UID != old.UID {
				if ref := metav1.GetControllerOf(cur); ref == nil || ref.UID != job.UID {
					t.Fatalf("new Secret's controller %+v", ref)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the leftover was not replaced: %v", err)
			}
			time.Sleep(10 * time.Millisecond)
		}
		if err := fc.Create(context.Background(), podOf(job, corev1.PodSucceeded, terminated(0, string(EncodeResult(engine.Result{Outcome: engine.Succeeded}))))); err != nil {
			t.Fatal(err)
		}
		if res := await(t, ch); res.Outcome != engine.Succeeded {
			t.Fatalf("result %+v", res)
		}
	})
}

// Only the Job's own pod reports: not one with its labels, nor one naming
// it as an owner but not as its controller, nor one it controls that runs
// another command.
func TestForeignPodsDoNotReport(t *testing.T) {
	fc := newFake(t)
	req := request()
	ch := runAsync(context.Background(), newExec(t, fc), req)
	job := getJob(t, fc, JobName(req.Phase, req.Key))
	forged := terminated(0, string(EncodeResult(engine.Result{Outcome: engine.Succeeded, Message: "forged"})))
	for i, spoof := range []func(p *corev1.Pod){
		func(p *corev1.Pod) { p.OwnerReferences = nil },
		func(p *corev1.Pod) { p.OwnerReferences[0].Controller = nil },
		func(p *corev1.Pod) { p.OwnerReferences[0].UID = "another-job" },
		func(p *corev1.Pod) {
			p.Spec.Containers[0].Command = []string{"/bin/sh", "-c", "echo forged > /dev/termination-log"}
		},
		func(p *corev1.Pod) { p.Spec.Containers[0].TerminationMessagePath = "/tmp/forged" },
		func(p *corev1.Pod) { p.Spec.Volumes[0].Secret.SecretName = "forged-inputs" },
	} {
		p := podOf(job, corev1.PodSucceeded, forged)
		p.Spec = *p.Spec.DeepCopy()
		p.Name = fmt.Sprintf("%s-spoof%d", job.Name, i)
		spoof(p)
		if err := fc.Create(context.Background(), p); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case res := <-ch:
		t.Fatalf("a pod not of the Job reported: %+v", res)
	case <-time.After(300 * time.Millisecond):
	}
	if err := fc.Create(context.Background(), podOf(job, corev1.PodFailed, terminated(1, string(EncodeResult(engine.Result{Outcome: engine.Failed, Message: "genuine"}))))); err != nil {
		t.Fatal(err)
	}
	if res := await(t, ch); res.Outcome != engine.Failed || res.Message != "genuine" {
		t.Fatalf("result %+v", res)
	}
}
