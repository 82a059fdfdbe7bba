package jobexec

import (
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"

	"github.com/dklesev/kpssh/internal/engine"
)

func TestJobName(t *testing.T) {
	seen := map[string]string{}
	for _, ph := range []engine.Phase{engine.PhaseInstall, engine.PhaseJoin, engine.PhaseLeave, engine.PhaseUninstall} {
		for _, key := range []string{"kpssh-system/h1/x/uid-1", "kpssh-system/h1/x/uid-2", "kpssh-system/" + strings.Repeat("h", 253) + "/x/" + strings.Repeat("u", 36)} {
			n := JobName(ph, key)
			if n != JobName(ph, key) {
				t.Fatalf("%s %s: not deterministic", ph, key)
			}
			if errs := validation.IsDNS1123Label(n); len(errs) > 0 {
				t.Fatalf("%q: %v", n, errs)
			}
			// The Job controller names its pods <job>-<5 chars>.
			if len(n)+6 > 63 {
				t.Fatalf("%q: %d characters, no room for the pod suffix", n, len(n))
			}
			if !strings.Contains(n, string(ph)) {
				t.Errorf("%q does not show its phase", n)
			}
			if prev, dup := seen[n]; dup {
				t.Fatalf("%q for both %s and %s %s", n, prev, ph, key)
			}
			seen[n] = string(ph) + " " + key
		}
	}
	if a, b := JobName(engine.PhaseLeave, ""), JobName(engine.PhaseLeave, ""); a == b {
		t.Errorf("an empty key got the same name twice: %s", a)
	}
}

func TestJudge(t *testing.T) {
	now := time.Now()
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "kpssh-join-x", UID: "job-uid", CreationTimestamp: metav1.NewTime(now.Add(-time.Minute))},
		Spec: batchv1.JobSpec{ActiveDeadlineSeconds: ptr.To[int64](420)}}
	failedJob := func(reason string) *batchv1.Job {
		j := job.DeepCopy()
		j.Status.Conditions = []batchv1.JobCondition{{Type: batchv1.JobFailed, Status: corev1.ConditionTrue, Reason: reason, Message: "Job was active longer than specified deadline"}}
		return j
	}
	completeJob := job.DeepCopy()
	completeJob.Status.Conditions = []batchv1.JobCondition{{Type: batchv1.JobComplete, Status: corev1.ConditionTrue}}
	pod := func(phase corev1.PodPhase, st corev1.ContainerState) corev1.Pod {
		return corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "kpssh-join-x-abcde"}, Status: corev1.PodStatus{Phase: phase,
			ContainerStatuses: []corev1.ContainerStatus{{Name: ContainerName, State: st}}}}
	}
	term := func(code int32, reason, msg string) corev1.ContainerState {
		return corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code, Reason: reason, Message: msg}}
	}
	waiting := func(reason string) corev1.ContainerState {
		return corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: "rpc error: not found"}}
	}
	result := string(EncodeResult(engine.Result{Outcome: engine.Failed, FailedTask: "kpssh join", RC: 3, ExitCode: 2, Message: "exit 3", Touched: true}))
	deleting := pod(corev1.PodRunning, corev1.ContainerState{Running: &corev1.ContainerStateRunning{}})
	deleting.DeletionTimestamp = ptr.To(metav1.NewTime(now))
	evicted := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Status: corev1.PodStatus{Phase: corev1.PodFailed, Reason: "Evicted", Message: "The node was low on resource: memory."}}

	cases := []struct {
		name      string
		job       *batchv1.Job
		pods      []corev1.Pod
		done      bool
		outcome   engine.Outcome
		msg       string
		pulling   bool
		fatalPull bool
	}{
		{"no pod yet", job, nil, false, "", "", false, false},
		{"running", job, []corev1.Pod{pod(corev1.PodRunning, corev1.ContainerState{Running: &corev1.ContainerStateRunning{}})}, false, "", "", false, false},
		{"result", job, []corev1.Pod{pod(corev1.PodFailed, term(1, "Error", result))}, true, engine.Failed, "exit 3", false, false},
		{"result wins over a failed Job", failedJob("BackoffLimitExceeded"), []corev1.Pod{pod(corev1.PodFailed, term(1, "Error", result))}, true, engine.Failed, "exit 3", false, false},
		{"oom", job, []corev1.Pod{pod(corev1.PodFailed, term(137, "OOMKilled", ""))}, true, engine.Failed, "OOMKilled", false, false},
		{"input refused", job, []corev1.Pod{pod(corev1.PodFailed, term(2, "Error", "phase-run: input version 9, this binary reads 1"))}, true, engine.ConfigError, "input version 9", false, false},
		{"no command", job, []corev1.Pod{pod(corev1.PodFailed, term(127, "Error", ""))}, true, engine.ConfigError, "controller image", false, false},
		{"cannot run", job, []corev1.Pod{pod(corev1.PodFailed, term(128, "StartError", "exec: no such file"))}, true, engine.ConfigError, "could not start", false, false},
		{"killed without result", job, []corev1.Pod{pod(corev1.PodFailed, term(143, "Error", "Traceback ..."))}, true, engine.Failed, "exited 143", false, false},
		{"deadline", failedJob(batchv1.JobReasonDeadlineExceeded), nil, true, engine.TimedOut, "activeDeadlineSeconds (420s)", false, false},
		{"deadline, pod stopped", job, []corev1.Pod{{Status: corev1.PodStatus{Phase: corev1.PodFailed, Reason: "DeadlineExceeded"}}}, true, engine.TimedOut, "deadline", false, false},
		{"evicted", job, []corev1.Pod{evicted}, true, engine.Failed, "Evicted", false, false},
		{"pod deleted, Job failed", failedJob("BackoffLimitExceeded"), nil, true, engine.Failed, "pod is gone without a result", false, false},
		{"pod deleting, Job failed", failedJob("BackoffLimitExceeded"), []corev1.Pod{deleting}, true, engine.Failed, "deleted?", false, false},
		{"pod deleting, Job running", job, []corev1.Pod{deleting}, false, "", "", false, false},
		{"complete, pod gone", completeJob, nil, true, engine.Succeeded, "completed", false, false},
		{"image pull", job, []corev1.Pod{pod(corev1.PodPending, waiting("ImagePullBackOff"))}, false, "", "", true, false},
		{"config error", job, []corev1.Pod{pod(corev1.PodPending, waiting("CreateContainerConfigError"))}, false, "", "", true, false},
		{"invalid image", job, []corev1.Pod{pod(corev1.PodPending, waiting("InvalidImageName"))}, false, "", "", true, true},
		{"never pull", job, []corev1.Pod{pod(corev1.PodPending, waiting("ErrImageNeverPull"))}, false, "", "", true, true},
		{"container creating", job, []corev1.Pod{pod(corev1.PodPending, waiting("ContainerCreating"))}, false, "", "", false, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			st := judge(c.job, c.pods, now)
			if st.done != c.done || st.res.Outcome != c.outcome || !strings.Contains(st.res.Message, c.msg) {
				t.Fatalf("got done %v %+v, want done %v %s containing %q", st.done, st.res, c.done, c.outcome, c.msg)
			}
			if (st.pulling != "") != c.pulling || st.fatalPull != c.fatalPull {
				t.Fatalf("pulling %q fatal %v, want %v %v", st.pulling, st.fatalPull, c.pulling, c.fatalPull)
			}
			if !st.done && st.status == "" {
				t.Fatal("a run that is not done has no description")
			}
		})
	}
}
