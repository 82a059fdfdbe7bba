//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/jobexec"
)

// jobNS holds the phase Jobs of the JobExec scenario.
const jobNS = "kpssh-jobs"

// jobExec runs executor job for real: the controller image (built here,
// registry-free) is imported into a joined node's containerd, the controller
// restarts with EXECUTOR=job pinned to that node (host network: the pod
// reaches the other hosts' sshd over the world's bridge), and the next host
// joins through phase Jobs run by that real kubelet, then leaves through a
// leave Job there, the controller SIGKILLed while it runs and re-attaching
// after its restart. The controller goes back to the local executor for the
// pinned node's own leave (a leave Job there would stop the kubelet under
// its own pod).
func jobExec(w *world, st *state) {
	img := controllerImage(w)
	// b is the host the pool knows by DNS name (hostLogin: h2), so the
	// phase pods must resolve it (through a's /etc/hosts, the host network's):
	// h2 is parked while a joins, the third host while b does.
	named := w.hosts.Host(1).Name
	w.park(named, true)
	w.scale(1)
	a, _ := w.joined("")
	ai := w.hostIndex(a.Name)
	w.park(named, false)
	third := ""
	for _, h := range w.hosts.Hosts() {
		if h.Name != a.Name && h.Name != named && third == "" {
			third = h.Name
		}
	}
	w.park(third, true)
	importImage(w, ai, img)

	if _, err := w.kubectl("create", "namespace", jobNS); err != nil && !strings.Contains(err.Error(), "AlreadyExists") {
		w.t.Fatal(err)
	}
	local := w.ctrl.env
	w.restartController(jobEnv(local, jobNS, img, a.Name))
	restored := false
	defer func() {
		if !restored {
			w.restartController(local)
		}
	}()

	// The second host joins through Jobs on a's kubelet.
	w.scale(2)
	b := w.joinedBeside(a.Name, jobNS, "a second host joined through phase Jobs")
	w.park(third, false)
	if b.Name != named || b.Spec.Address != w.hosts.Host(1).DNSName {
		w.t.Errorf("the Jobs joined %s (address %s), want %s by its DNS name", b.Name, b.Spec.Address, named)
	}
	w.checkNodeAddress(b.Name)
	// The Job controller marks the Jobs complete a moment after the
	// executor has read the result from the pod.
	w.eventually("the phase Jobs complete", 2*time.Minute, func() (bool, string) {
		var jobs batchv1.JobList
		if err := w.kube.List(context.Background(), &jobs, client.InNamespace(jobNS)); err != nil {
			return false, err.Error()
		}
		for _, j := range jobs.Items {
			if j.Status.Succeeded != 1 && j.Status.Failed == 0 {
				return false, "Job " + j.Name + " not complete yet"
			}
		}
		return len(jobs.Items) > 0, "no Jobs"
	})

	// What ran: a join Job (and an install Job when b had no install cache)
	// for b, completed, its pod on a's node, its inputs Secret gone.
	var jobs batchv1.JobList
	if err := w.kube.List(context.Background(), &jobs, client.InNamespace(jobNS)); err != nil {
		w.t.Fatal(err)
	}
	phases := map[string]bool{}
	for _, j := range jobs.Items {
		key := j.Annotations[jobexec.AnnotationKey]
		if !strings.Contains(key, "/"+b.Name+"/") {
			w.t.Errorf("Job %s has run key %q, not one of host %s", j.Name, key, b.Name)
			continue
		}
		ph := j.Labels[jobexec.LabelPhase]
		phases[ph] = true
		if j.Status.Succeeded != 1 {
			w.t.Errorf("Job %s (%s): succeeded %d, conditions %+v", j.Name, ph, j.Status.Succeeded, j.Status.Conditions)
		}
		var pods corev1.PodList
		if err := w.kube.List(context.Background(), &pods, client.InNamespace(jobNS), client.MatchingLabels{jobexec.LabelRun: j.Name}); err != nil {
			w.t.Fatal(err)
		}
		for _, p := range pods.Items {
			cs := p.Status.ContainerStatuses
			if p.Spec.NodeName != a.Name || len(cs) != 1 || cs[0].State.Terminated == nil {
				w.t.Errorf("pod %s on %q: %+v", p.Name, p.Spec.NodeName, cs)
				continue
			}
			r, err := jobexec.ParseResult(cs[0].State.Terminated.Message)
			w.t.Logf("Job %s (%s) on node %s: %s in %v (%v)", j.Name, ph, p.Spec.NodeName, r.Outcome, r.Duration, err)
		}
		if len(pods.Items) != 1 {
			w.t.Errorf("Job %s: %d pods", j.Name, len(pods.Items))
		}
	}
	if !phases["join"] {
		w.t.Errorf("no join Job for %s (phases %v)", b.Name, phases)
	}
	var secrets corev1.SecretList
	if err := w.kube.List(context.Background(), &secrets, client.InNamespace(jobNS), client.MatchingLabels{jobexec.LabelManagedBy: jobexec.ManagedBy}); err != nil {
		w.t.Fatal(err)
	}
	if len(secrets.Items) != 0 {
		w.t.Errorf("%d inputs Secrets left after the phases", len(secrets.Items))
	}

	// b leaves through a Job too: its pause pod goes first on the scale-down
	// (lowest deletion cost), b is empty, Karpenter consolidates it, and its
	// leave runs as a Job on a's kubelet.
	var pauses corev1.PodList
	if err := w.kube.List(context.Background(), &pauses, client.InNamespace("default"), client.MatchingLabels{"app": "pause"}); err != nil {
		w.t.Fatal(err)
	}
	for _, p := range pauses.Items {
		if p.Spec.NodeName == b.Name {
			w.mustKubectl("-n", "default", "annotate", "pod", p.Name, "controller.kubernetes.io/pod-deletion-cost=-1000", "--overwrite")
		}
	}
	w.scale(1)
	// The controller dies while the leave Job runs (SIGKILL, as a crash);
	// the restarted one re-attaches to that Job instead of starting another.
	leaveOf := func() []batchv1.Job {
		var jobs batchv1.JobList
		if err := w.kube.List(context.Background(), &jobs, client.InNamespace(jobNS), client.MatchingLabels{jobexec.LabelPhase: "leave"}); err != nil {
			w.t.Fatal(err)
		}
		var out []batchv1.Job
		for _, j := range jobs.Items {
			if strings.Contains(j.Annotations[jobexec.AnnotationKey], "/"+b.Name+"/leave/") {
				out = append(out, j)
			}
		}
		return out
	}
	var leaveJob batchv1.Job
	w.eventually("the leave Job of "+b.Name+" running", 5*time.Minute, func() (bool, string) {
		jobs := leaveOf()
		if len(jobs) == 0 {
			return false, "no leave Job yet"
		}
		leaveJob = jobs[0]
		var pods corev1.PodList
		if err := w.kube.List(context.Background(), &pods, client.InNamespace(jobNS), client.MatchingLabels{jobexec.LabelRun: leaveJob.Name}); err != nil {
			return false, err.Error()
		}
		for _, p := range pods.Items {
			if cs := p.Status.ContainerStatuses; len(cs) == 1 && (cs[0].State.Running != nil || cs[0].State.Terminated != nil) {
				return true, ""
			}
		}
		return false, "leave pod not started"
	})
	w.ctrl.kill(syscall.SIGKILL)
	cur := &batchv1.Job{}
	if err := w.kube.Get(context.Background(), client.ObjectKeyFromObject(&leaveJob), cur); err == nil {
		w.t.Logf("controller killed; leave Job %s active=%d succeeded=%d", cur.Name, cur.Status.Active, cur.Status.Succeeded)
	}
	w.ctrl.start()
	w.eventually(b.Name+" left through a leave Job", 5*time.Minute, func() (bool, string) {
		if h := w.sshHost(b.Name); h.Status.State != v1beta1.HostAvailable {
			return false, fmt.Sprintf("%s is %s", b.Name, h.Status.State)
		}
		var jobs batchv1.JobList
		if err := w.kube.List(context.Background(), &jobs, client.InNamespace(jobNS), client.MatchingLabels{jobexec.LabelPhase: "leave"}); err != nil {
			return false, err.Error()
		}
		for _, j := range jobs.Items {
			if strings.Contains(j.Annotations[jobexec.AnnotationKey], "/"+b.Name+"/leave/") && j.Status.Succeeded == 1 {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d leave Jobs, none of %s complete", len(jobs.Items), b.Name)
	})
	if jobs := leaveOf(); len(jobs) != 1 || jobs[0].UID != leaveJob.UID {
		w.t.Errorf("after the restart: %d leave Jobs of %s, want the one that ran before the crash", len(jobs), b.Name)
	}
	if u := w.units(w.hostIndex(b.Name)); u != unitsLeft {
		w.t.Errorf("units on %s after the leave Job: %q, want %q", b.Name, u, unitsLeft)
	}
	if h := w.sshHost(b.Name); h.Status.LastPhase == nil || h.Status.LastPhase.Phase != v1beta1.PhaseLeave || h.Status.LastPhase.Result != v1beta1.PhaseSucceeded {
		w.t.Errorf("%s last phase %+v, want a succeeded leave", b.Name, h.Status.LastPhase)
	}
	if err := w.kube.List(context.Background(), &secrets, client.InNamespace(jobNS), client.MatchingLabels{jobexec.LabelManagedBy: jobexec.ManagedBy}); err != nil || len(secrets.Items) != 0 {
		w.t.Errorf("inputs Secrets after the leave: %d (%v)", len(secrets.Items), err)
	}

	restored = true
	jw := &jobWorld{node: a.Name, img: img, ns: jobNS, local: local}
	if runs("CrashResumeRoles") {
		// The next scenario crashes phase Jobs on this very setup.
		st.jobs = jw
		return
	}
	jw.down(w)
}

// jobWorld is what JobExec sets up for executor job: the node the phase
// pods run on (joined, the controller image in its containerd), the Job
// namespace, the controller restarted with executor job; local is its
// environment before.
type jobWorld struct {
	node, img, ns string
	local         []string
}

// down goes back to the local executor, removes the image from the node's
// containerd and the namespace, and lets every host leave.
func (j *jobWorld) down(w *world) {
	w.t.Helper()
	w.restartController(j.local)
	removeImage(w, w.hostIndex(j.node), j.img)
	w.mustKubectl("delete", "namespace", j.ns, "--wait=false")
	(&crashRig{world: w}).release()
}

// park puts an Available host into maintenance (on) or back (off) and
// waits until the host controller has moved it.
func (w *world) park(name string, on bool) {
	w.t.Helper()
	ann, want := "karpenter.dklesev.github.io/maintenance=true", v1beta1.HostMaintenance
	if !on {
		ann, want = "karpenter.dklesev.github.io/maintenance-", v1beta1.HostAvailable
	}
	w.mustKubectl("-n", poolNS, "annotate", "sshhost", name, ann)
	w.eventually(fmt.Sprintf("%s %s", name, want), 2*time.Minute, func() (bool, string) {
		h := w.sshHost(name)
		return h.Status.State == want, string(h.Status.State)
	})
}

// joinedBeside waits until a host other than first is InUse with a Ready
// Node, its phases run as Jobs in ns (whose pods the wait reports).
func (w *world) joinedBeside(first, ns, what string) *v1beta1.SSHHost {
	w.t.Helper()
	var b *v1beta1.SSHHost
	w.eventually(what, 8*time.Minute, func() (bool, string) {
		for _, h := range w.sshHosts() {
			if h.Name == first || h.Status.State != v1beta1.HostInUse {
				continue
			}
			n := &corev1.Node{}
			if err := w.kube.Get(context.Background(), client.ObjectKey{Name: h.Name}, n); err != nil || !nodeReady(n) {
				return false, fmt.Sprintf("host %s InUse, node not Ready yet (%v)", h.Name, err)
			}
			b = &h
			return true, ""
		}
		// Enough to tell on a timeout where the second join stalls: no
		// claim, no Job, no pod, or a pod the kubelet cannot start.
		var states []string
		for _, h := range w.sshHosts() {
			states = append(states, h.Name+"="+string(h.Status.State))
		}
		pods, _ := w.kubectl("-n", ns, "get", "pods", "-o", "custom-columns=POD:.metadata.name,NODE:.spec.nodeName,PHASE:.status.phase", "--no-headers")
		jobs, _ := w.kubectl("-n", ns, "get", "jobs", "-o", "custom-columns=JOB:.metadata.name,ACTIVE:.status.active,FAILED:.status.failed", "--no-headers")
		warn, _ := w.kubectl("-n", ns, "get", "events", "--field-selector", "type=Warning", "-o", "custom-columns=OBJ:.involvedObject.name,REASON:.reason,MSG:.message", "--no-headers")
		return false, fmt.Sprintf("no second host InUse (%d NodeClaims; hosts %s); jobs: %s; phase pods: %s; warnings: %s",
			len(w.nodeClaims()), strings.Join(states, " "), strings.Join(strings.Fields(jobs), " "),
			strings.Join(strings.Fields(pods), " "), strings.Join(strings.Fields(warn), " "))
	})
	return b
}

// controllerImage builds the controller image (registry-free, cached by
// key) and returns its ref.
func controllerImage(w *world) string {
	w.t.Helper()
	out, err := script(context.Background(), w.repo, nil, 40*time.Minute, "runner-image.sh", "--controller")
	if err != nil {
		w.t.Fatalf("hack/runner-image.sh --controller: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	ref := strings.TrimSpace(lines[len(lines)-1])
	if !strings.HasPrefix(ref, "localhost/kpssh-controller:") {
		w.t.Fatalf("hack/runner-image.sh --controller printed %q last", ref)
	}
	return ref
}

// removeImage removes the image from host i's containerd (before its leave
// stops containerd).
func removeImage(w *world, i int, ref string) {
	w.t.Helper()
	if out, _, err := w.hosts.Run(i, "ctr -n k8s.io images rm "+ref); err != nil {
		w.t.Errorf("removing image %s from %s: %v %s", ref, w.hosts.Host(i).Name, err, out)
	}
}

// importImage copies the image into host i's containerd (namespace k8s.io,
// where the kubelet looks): podman save here, ctr import there.
func importImage(w *world, i int, ref string) {
	w.t.Helper()
	tar := filepath.Join(w.t.TempDir(), "controller.tar")
	if _, err := script(context.Background(), w.repo, nil, 10*time.Minute, "runner-image.sh", "podman", "save", "-o", tar, ref); err != nil {
		w.t.Fatalf("podman save %s: %v", ref, err)
	}
	f, err := os.Open(tar)
	if err != nil {
		w.t.Fatal(err)
	}
	defer f.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ssh", append(w.hosts.SSHArgs(i), "--", "ctr -n k8s.io images import -")...)
	cmd.Stdin = f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		w.t.Fatalf("ctr import on host %d: %v\n%s", i, err, tail(string(out), 2000))
	}
	w.t.Logf("image %s imported into host %d's containerd in %v", ref, i, time.Since(start).Round(time.Millisecond))
}
