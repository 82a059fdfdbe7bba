package jobexec

import (
	"errors"
	"fmt"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/dklesev/kpssh/internal/engine"
)

// state is what a Job and its pods tell about a run.
type state struct {
	done bool
	res  engine.Result
	// pulling is non-empty while the container cannot start (image pull,
	// container config): "reason: message". fatalPull: it never will.
	pulling   string
	fatalPull bool
	// started: the container ran (the host may have been reached).
	started bool
	// status describes a run that is not done, for timeout messages.
	status string
}

// Waiting reasons of a container that cannot start.
var (
	retryablePull = map[string]bool{"ErrImagePull": true, "ImagePullBackOff": true, "CreateContainerConfigError": true, "CreateContainerError": true, "RunContainerError": true}
	fatalPull     = map[string]bool{"InvalidImageName": true, "ErrImageNeverPull": true}
)

// judge maps a Job and its pods to the run's state. A result in a pod's
// termination message wins over everything else; without one, the pod's and
// the Job's failure reasons become the outcome.
func judge(job *batchv1.Job, pods []corev1.Pod, now time.Time) state {
	var st state
	var noResult *state
	for i := range pods {
		p := &pods[i]
		cs := containerStatus(p)
		if cs == nil {
			continue
		}
		if cs.State.Running != nil || cs.State.Terminated != nil || cs.LastTerminationState.Terminated != nil {
			st.started = true
		}
		if t := cs.State.Terminated; t != nil {
			res, err := ParseResult(t.Message)
			if err == nil {
				return state{done: true, res: res, started: true}
			}
			s := state{done: true, res: terminatedWithout(job, t, err), started: true}
			noResult = &s
			continue
		}
		if w := cs.State.Waiting; w != nil {
			switch {
			case fatalPull[w.Reason]:
				st.pulling, st.fatalPull = w.Reason+": "+w.Message, true
			case retryablePull[w.Reason]:
				st.pulling = w.Reason + ": " + w.Message
			}
		}
	}
	if noResult != nil {
		return *noResult
	}
	for i := range pods {
		p := &pods[i]
		if cs := containerStatus(p); p.Status.Phase == corev1.PodFailed && (cs == nil || cs.State.Terminated == nil) {
			// Failed without the container ending: evicted, or killed at
			// the deadline before it started.
			if p.Status.Reason == "DeadlineExceeded" {
				return state{done: true, res: timedOut(job, "the phase pod was stopped at the Job's deadline"), started: st.started}
			}
			return state{done: true, started: st.started, res: engine.Result{Outcome: engine.Failed, ExitCode: -1, Touched: st.started,
				Message: fmt.Sprintf("phase pod %s failed (%s) before it reported a result: %s", p.Name, orUnknown(p.Status.Reason), p.Status.Message)}}
		}
	}
	if c := jobCondition(job, batchv1.JobFailed); c != nil {
		if c.Reason == batchv1.JobReasonDeadlineExceeded {
			return state{done: true, res: timedOut(job, c.Message), started: st.started}
		}
		if len(pods) == 0 || allDeleting(pods) {
			return state{done: true, started: st.started, res: engine.Result{Outcome: engine.Failed, ExitCode: -1, Touched: true,
				Message: fmt.Sprintf("Job %s failed (%s) and its pod is gone without a result (deleted?): %s", job.Name, orUnknown(c.Reason), c.Message)}}
		}
	}
	if jobCondition(job, batchv1.JobComplete) != nil && (len(pods) == 0 || allDeleting(pods)) {
		// The container exits 0 only after a Succeeded phase: the outcome is
		// known, its details left with the pod.
		return state{done: true, started: true, res: engine.Result{Outcome: engine.Succeeded, Touched: true,
			Message: fmt.Sprintf("Job %s completed; its pod (with the detailed result) is gone", job.Name)}}
	}
	st.status = describe(job, pods, now)
	return st
}

func containerStatus(p *corev1.Pod) *corev1.ContainerStatus {
	for i := range p.Status.ContainerStatuses {
		if p.Status.ContainerStatuses[i].Name == ContainerName {
			return &p.Status.ContainerStatuses[i]
		}
	}
	return nil
}

func jobCondition(job *batchv1.Job, t batchv1.JobConditionType) *batchv1.JobCondition {
	for i := range job.Status.Conditions {
		if c := &job.Status.Conditions[i]; c.Type == t && c.Status == corev1.ConditionTrue {
			return c
		}
	}
	return nil
}

func allDeleting(pods []corev1.Pod) bool {
	for i := range pods {
		if pods[i].DeletionTimestamp == nil {
			return false
		}
	}
	return true
}

func timedOut(job *batchv1.Job, why string) engine.Result {
	return engine.Result{Outcome: engine.TimedOut, ExitCode: -1, Touched: true,
		Message: fmt.Sprintf("Job %s exceeded its activeDeadlineSeconds (%ds): %s", job.Name, deref(job.Spec.ActiveDeadlineSeconds), why)}
}

// terminatedWithout maps a container of job that ended without a result.
func terminatedWithout(job *batchv1.Job, t *corev1.ContainerStateTerminated, perr error) engine.Result {
	msg := strings.TrimSpace(t.Message)
	switch {
	case t.Reason == "OOMKilled":
		return engine.Result{Outcome: engine.Failed, ExitCode: -1, Touched: true,
			Message: "the phase pod ran out of memory (OOMKilled) before it reported a result; raise the executor's memory limit (JOB_MEMORY_LIMIT)"}
	case t.Reason == "ContainerCannotRun" || t.Reason == "StartError":
		return engine.Result{Outcome: engine.ConfigError, ExitCode: -1,
			Message: fmt.Sprintf("the phase container could not start (%s, exit %d): %s; is the Job image the kpssh controller image?", t.Reason, t.ExitCode, msg)}
	case t.ExitCode == ExitUsage && strings.HasPrefix(msg, "phase-run: "):
		// The pod refused its input before running anything.
		return engine.Result{Outcome: engine.ConfigError, ExitCode: -1, Message: msg}
	case t.ExitCode == ExitInputMismatch && strings.HasPrefix(msg, "phase-run: "):
		// Someone else's content under the inputs' name: nothing ran.
		return engine.Result{Outcome: engine.ConfigError, ExitCode: -1,
			Message: fmt.Sprintf("the phase pod refused the inputs Secret %s/%s, not the one written for Job %s: %s", job.Namespace, job.Name, job.Name, msg)}
	case t.ExitCode == 127 || t.ExitCode == 126:
		return engine.Result{Outcome: engine.ConfigError, ExitCode: -1,
			Message: fmt.Sprintf("the phase container's command is missing (exit %d): the Job image must be the kpssh controller image (it holds `controller %s`)", t.ExitCode, PhaseRunCommand)}
	}
	detail := perr.Error()
	if errors.Is(perr, ErrNoResult) && msg != "" {
		detail = "its output ends: " + validPrefix(msg, 512)
	}
	return engine.Result{Outcome: engine.Failed, ExitCode: -1, Touched: true,
		Message: fmt.Sprintf("the phase pod exited %d (%s) without a result; %s", t.ExitCode, orUnknown(t.Reason), detail)}
}

// describe is a short account of a Job that is not done.
func describe(job *batchv1.Job, pods []corev1.Pod, now time.Time) string {
	age := now.Sub(job.CreationTimestamp.Time).Round(time.Second)
	if len(pods) == 0 {
		return fmt.Sprintf("no pod after %s (is a Job controller running? quota?)", age)
	}
	p := &pods[0]
	s := fmt.Sprintf("pod %s %s", p.Name, p.Status.Phase)
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status != corev1.ConditionTrue {
			s += fmt.Sprintf(", not scheduled (%s: %s)", c.Reason, c.Message)
		}
	}
	if cs := containerStatus(p); cs != nil && cs.State.Waiting != nil {
		s += fmt.Sprintf(", waiting (%s: %s)", cs.State.Waiting.Reason, cs.State.Waiting.Message)
	}
	return s
}

func orUnknown(s string) string {
	if s == "" {
		return "no reason given"
	}
	return s
}

func deref(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}
