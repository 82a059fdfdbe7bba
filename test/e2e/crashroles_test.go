//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/jobexec"
)

// crashJobNS holds the phase Jobs of CrashResumeRoles run without JobExec
// (ContentRole's namespace may still be terminating).
const crashJobNS = "kpssh-crash-jobs"

// Phase Job points: the Job made but its pod not running yet, the pod
// running, and the pod done while the controller has not read its result
// (settle: the controller frozen while the pod runs, killed once it
// terminated), for install (cold), join and leave.
var jobCreatePoints = []crashPoint{
	{name: "install Job made, pod not running", cold: true, hit: stateless(func(s snapshot) bool {
		return s.claimed() && s.jobIs("install", "pending")
	})},
	{name: "during the install Job", cold: true, hit: stateless(func(s snapshot) bool {
		return s.claimed() && s.jobIs("install", "running")
	})},
	{name: "install Job done, result unread", cold: true, settle: true, hit: stateless(func(s snapshot) bool {
		return s.claimed() && s.jobIs("install", "running") // frozen while it runs; killed once its pod ended
	})},
	{name: "join Job made, pod not running", hit: stateless(func(s snapshot) bool {
		return s.claimed() && s.jobIs("join", "pending")
	})},
	{name: "during the join Job", hit: stateless(func(s snapshot) bool {
		return s.claimed() && s.jobIs("join", "running")
	})},
	{name: "join Job done, result unread", settle: true, hit: stateless(func(s snapshot) bool {
		return s.claimed() && s.jobIs("join", "running")
	})},
}

var jobDeletePoints = []crashPoint{
	{name: "leave Job made, pod not running", hit: stateless(func(s snapshot) bool {
		return s.deleting() && s.jobIs("leave", "pending")
	})},
	{name: "during the leave Job", hit: stateless(func(s snapshot) bool {
		return s.deleting() && s.jobIs("leave", "running")
	})},
	{name: "leave Job done, result unread", settle: true, hit: stateless(func(s snapshot) bool {
		return s.deleting() && s.jobIs("leave", "running")
	})},
}

// crashResumeRoles: CrashResume's kill points for the two other ways a
// phase runs. Phase Jobs (executor job on a real kubelet, as JobExec runs
// it; the script profile): 9 points of install, join and leave Jobs; after
// each resume also no Job active, one Job per run key, an install or leave
// Job adopted (the same Job, its one pod), no inputs Secret. Role phases
// (the shipped role profile, local executor): CrashResume's 11 points, a
// phase in flight seen on the controller (its live ansible-playbook run
// against the host), no module left running on a host after the resume.
func crashResumeRoles(w *world, st *state) {
	crashJobs(w, st.jobs)
	st.jobs = nil

	w.apply(filepath.Join(w.ctrl.dir, "examples/profile-tls-bootstrap.yaml"))
	w.mustKubectl("patch", "sshnodeclass", "pool", "--type=merge", "-p", `{"spec":{"joinProfileRef":{"name":"tls-bootstrap"}}}`)
	defer w.mustKubectl("patch", "sshnodeclass", "pool", "--type=merge", "-p", `{"spec":{"joinProfileRef":{"name":"`+w.profile+`"}}}`)
	r := &crashRig{world: w, exec: execRole, profile: "tls-bootstrap"}
	r.chain("role phases", createPoints, []crashPoint{deletePoints[0], deletePoints[1], deletePoints[2], r.unitsStopped()})
}

// crashJobs runs the Job points on JobExec's setup (jobs), or makes the
// same when JobExec did not run before: a host joins (local executor), the
// controller image goes into its containerd, the controller restarts with
// executor job pinned to that node. The node is kept joined and never
// disrupted (a cold point's version bump drifts it too); the points run on
// the other hosts.
func crashJobs(w *world, jobs *jobWorld) {
	if jobs == nil {
		img := controllerImage(w)
		w.scale(1)
		a, _ := w.joined("")
		importImage(w, w.hostIndex(a.Name), img)
		if _, err := w.kubectl("create", "namespace", crashJobNS); err != nil && !strings.Contains(err.Error(), "AlreadyExists") {
			w.t.Fatal(err)
		}
		jobs = &jobWorld{node: a.Name, img: img, ns: crashJobNS, local: w.ctrl.env}
		w.restartController(jobEnv(jobs.local, jobs.ns, img, a.Name))
	}
	defer jobs.down(w)
	// JobExec's kept node must still be the one joined (once, its scale to
	// one saw Karpenter delete both nodes as Empty in one command, and the
	// points then ran against a host joined again behind their back).
	if h := w.sshHost(jobs.node); h.Status.State != v1beta1.HostInUse || h.Status.ClaimRef == nil {
		w.t.Fatalf("the Job executor's node %s is %s, not joined: the points need it kept from JobExec (or set up here)", jobs.node, h.Status.State)
	}
	w.mustKubectl("annotate", "node", jobs.node, "karpenter.sh/do-not-disrupt=true")
	r := &crashRig{world: w, exec: execJob, profile: w.profile, keep: jobs.node, ns: jobs.ns}
	r.chain("phase Jobs", jobCreatePoints, jobDeletePoints)
}

// jobEnv is the controller's environment for executor job: Jobs in ns, the
// controller image imported into node's containerd, pods pinned there on
// the host network (they reach the other hosts' sshd over the bridge).
func jobEnv(local []string, ns, img, node string) []string {
	return append(append([]string{}, local...), "EXECUTOR=job", "JOB_NAMESPACE="+ns, "JOB_IMAGE="+img,
		"JOB_IMAGE_PULL_POLICY=Never", "JOB_HOST_NETWORK=true", "JOB_ALLOW_MANAGED_NODES=true",
		"JOB_NODE_SELECTOR=kubernetes.io/hostname="+node)
}

// restartController stops the controller and starts it with env.
func (w *world) restartController(env []string) {
	w.t.Helper()
	w.ctrl.stop()
	w.ctrl.env = env
	w.ctrl.start()
}

// liveRun reports whether the controller has a phase run in flight against
// address: a live child of the controller (a run's launcher; its working
// directory is the run directory: docs/engine.md) whose run directory
// holds the playbook (an idle warm runner's does not), the ssh
// ControlPersist socket (the run has connected) and an inventory naming
// the address. An exited launcher the frozen controller has not reaped is a
// zombie without a working directory: not live.
func (c *controller) liveRun(address string) bool {
	if c.cmd == nil {
		return false
	}
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", c.cmd.Process.Pid))
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		for _, child := range strings.Fields(string(b)) {
			dir, err := os.Readlink("/proc/" + child + "/cwd")
			if err != nil || !strings.HasPrefix(filepath.Base(dir), "kpssh-") {
				continue
			}
			if _, err := os.Stat(filepath.Join(dir, "playbook.yml")); err != nil {
				continue
			}
			if _, err := os.Stat(filepath.Join(dir, "cm")); err != nil {
				continue
			}
			inv, err := os.ReadFile(filepath.Join(dir, "inventory.yml"))
			if err == nil && inventoryHost(string(inv)) == address {
				return true
			}
		}
	}
	return false
}

// inventoryHost is the ansible_host of a run's one-host inventory.
func inventoryHost(inv string) string {
	for _, l := range strings.Split(inv, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "ansible_host:"); ok {
			return strings.Trim(strings.TrimSpace(v), `"'`)
		}
	}
	return ""
}

// currentJob is the phase Job of h's claim that has not ended yet, else
// the newest one; nil when there is none.
func (w *crashRig) currentJob(h *v1beta1.SSHHost) *phaseJob {
	if h.Status.ClaimRef == nil {
		return nil
	}
	var jobs batchv1.JobList
	if err := w.kube.List(context.Background(), &jobs, client.InNamespace(w.ns)); err != nil {
		return nil
	}
	var cur *phaseJob
	var curAt time.Time
	for _, j := range jobs.Items {
		key := j.Annotations[jobexec.AnnotationKey]
		if j.DeletionTimestamp != nil || !strings.HasPrefix(key, poolNS+"/"+h.Name+"/") || !strings.HasSuffix(key, "/"+string(h.Status.ClaimRef.UID)) {
			continue
		}
		pj := &phaseJob{name: j.Name, phase: j.Labels[jobexec.LabelPhase], key: key, uid: j.UID, state: w.jobState(&j)}
		if cur == nil || cur.state == "done" && (pj.state != "done" || j.CreationTimestamp.After(curAt)) {
			cur, curAt = pj, j.CreationTimestamp.Time
		}
	}
	return cur
}

// jobState: done once the Job or its pod ended, running while its phase
// container runs, else pending.
func (w *crashRig) jobState(j *batchv1.Job) string {
	if j.Status.Succeeded > 0 || j.Status.Failed > 0 {
		return "done"
	}
	var pods corev1.PodList
	if err := w.kube.List(context.Background(), &pods, client.InNamespace(w.ns), client.MatchingLabels{jobexec.LabelRun: j.Name}); err != nil {
		return "pending"
	}
	st := "pending"
	for _, p := range pods.Items {
		for _, cs := range p.Status.ContainerStatuses {
			switch {
			case cs.State.Terminated != nil:
				return "done"
			case cs.State.Running != nil:
				st = "running"
			}
		}
	}
	return st
}

// jobsLeft lists what a resumed phase Job run must not leave: a Job still
// active or being deleted, two Jobs of one run key, an inputs Secret.
func (w *crashRig) jobsLeft() []string {
	var left []string
	var jobs batchv1.JobList
	if err := w.kube.List(context.Background(), &jobs, client.InNamespace(w.ns)); err != nil {
		return []string{err.Error()}
	}
	perKey := map[string][]string{}
	for _, j := range jobs.Items {
		switch {
		case j.DeletionTimestamp != nil:
			left = append(left, "Job "+j.Name+" being deleted")
			continue
		case j.Status.Active > 0:
			left = append(left, "Job "+j.Name+" active")
		}
		key := j.Annotations[jobexec.AnnotationKey]
		perKey[key] = append(perKey[key], j.Name)
	}
	for key, names := range perKey {
		if len(names) > 1 {
			left = append(left, fmt.Sprintf("%d Jobs of run key %s: %v", len(names), key, names))
		}
	}
	var secrets corev1.SecretList
	if err := w.kube.List(context.Background(), &secrets, client.InNamespace(w.ns), client.MatchingLabels{jobexec.LabelManagedBy: jobexec.ManagedBy}); err != nil {
		return append(left, err.Error())
	}
	for _, s := range secrets.Items {
		left = append(left, "inputs Secret "+s.Name)
	}
	return left
}

// jobAfterResume checks the phase Job crashed at once the resume
// converged: one Job of its run key; an install or leave Job (the same
// inputs after the restart) adopted — the same Job, its pod run once — and
// a join Job (a fresh bootstrap token: other inputs) replaced or adopted.
func (w *crashRig) jobAfterResume(point string, at snapshot) {
	w.t.Helper()
	if w.exec != execJob {
		return
	}
	if at.job == nil {
		w.t.Errorf("%s: crashed with no phase Job of the claim (%s)", point, at)
		return
	}
	var jobs batchv1.JobList
	if err := w.kube.List(context.Background(), &jobs, client.InNamespace(w.ns)); err != nil {
		w.t.Fatal(err)
	}
	var same []batchv1.Job
	for _, j := range jobs.Items {
		if j.DeletionTimestamp == nil && j.Annotations[jobexec.AnnotationKey] == at.job.key {
			same = append(same, j)
		}
	}
	if len(same) != 1 {
		w.t.Errorf("%s: %d Jobs of run key %s after the resume, want 1", point, len(same), at.job.key)
		return
	}
	j := same[0]
	var pods corev1.PodList
	if err := w.kube.List(context.Background(), &pods, client.InNamespace(w.ns), client.MatchingLabels{jobexec.LabelRun: j.Name}); err != nil {
		w.t.Fatal(err)
	}
	how := "rerun (a new Job)"
	if j.UID == at.job.uid {
		how = "adopted"
	}
	w.t.Logf("crash %s: the %s Job %s: %s, %d pod(s), succeeded %d", point, at.job.phase, j.Name, how, len(pods.Items), j.Status.Succeeded)
	if at.job.phase != "join" && (j.UID != at.job.uid || len(pods.Items) != 1) {
		w.t.Errorf("%s: the %s Job after the resume: %s with %d pods, want the Job crashed at adopted, its pod run once", point, at.job.phase, how, len(pods.Items))
	}
	if j.Status.Succeeded != 1 {
		w.t.Errorf("%s: Job %s succeeded %d, want 1 (conditions %+v)", point, j.Name, j.Status.Succeeded, j.Status.Conditions)
	}
}
