package jobexec_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/dklesev/kpssh/internal/engine"
	"github.com/dklesev/kpssh/internal/jobexec"
	"github.com/dklesev/kpssh/test/hostenv"
	"github.com/dklesev/kpssh/test/testenv"
	"github.com/dklesev/kpssh/test/testexec"
)

// The real world of executor job, short of a pod runtime: a real
// kube-apiserver (envtest) with a real kube-controller-manager running the
// Job, TTL-after-finished and garbage-collector controllers, a namespace
// enforcing the restricted Pod Security Standard, and a real systemd-nspawn
// host with sshd. The test plays only the kubelet's part: for the pod the
// Job controller creates, it runs the pod's command — the real
// `controller phase-run` binary built from cmd/controller — on the Job's
// Secret content, and writes the termination message into the pod status
// as a kubelet does. The Ansible side (ansible-playbook, ssh, the host) is
// entirely real.

var env *testenv.Env

func TestMain(m *testing.M) { os.Exit(testenv.RunMain(m, &env)) }

// startControllerManager runs kube-controller-manager (the one
// hack/k8s-bins.sh builds beside the apiserver) with the controllers a Job
// needs; stop kills it by its process group and reaps it (before the
// apiserver stops: its watches would hold the apiserver's shutdown up).
func startControllerManager(e *testenv.Env) (stop func(), err error) {
	bin := filepath.Join(e.AssetsDir, "kube-controller-manager")
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("kube-controller-manager missing (hack/k8s-bins.sh builds it): %w", err)
	}
	logf, err := os.CreateTemp("", "kpssh-jobexec-kcm-*.log")
	if err != nil {
		return nil, err
	}
	kcm := exec.Command(bin, "--kubeconfig="+e.Kubeconfig, "--controllers=job,ttl-after-finished,garbagecollector",
		"--leader-elect=false", "--secure-port=0", "--use-service-account-credentials=false", "--concurrent-job-syncs=2")
	kcm.Stdout, kcm.Stderr = logf, logf
	kcm.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := kcm.Start(); err != nil {
		return nil, err
	}
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		_ = kcm.Wait()
		logf.Close()
		os.Remove(logf.Name())
	}()
	return func() {
		_ = syscall.Kill(-kcm.Process.Pid, syscall.SIGKILL)
		<-exited
	}, nil
}

func realWorld(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: needs a kube-apiserver, kube-controller-manager, systemd-nspawn hosts and ansible-playbook")
	}
	stop, err := startControllerManager(env)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
}

// buildController builds cmd/controller (the binary of the phase pod).
func buildController(t *testing.T) string {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "controller")
	out, err := bounded(t, 10*time.Minute, root, nil, "go", "build", "-o", bin, "./cmd/controller")
	if err != nil {
		t.Fatalf("go build ./cmd/controller: %v\n%s", err, out)
	}
	return bin
}

// bounded runs a command in its own process group, killed as a group at
// the timeout, and reaped.
func bounded(t *testing.T, d time.Duration, dir string, extraEnv []string, name string, args ...string) ([]byte, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	cmd := testexec.Command(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), extraEnv...)
	return cmd.CombinedOutput()
}

func eventually(t *testing.T, what string, d time.Duration, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ok, err := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s (last error: %v)", what, d, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// kubelet plays the kubelet for one Job's pod.
type kubelet struct {
	t          *testing.T
	c          client.Client
	controller string // the phase-run binary
	root       string
	lastLog    []byte // the last pod's output (its log)
}

// pod waits for the pod the Job controller made for job.
func (k *kubelet) pod(job *batchv1.Job) *corev1.Pod {
	k.t.Helper()
	var pod *corev1.Pod
	eventually(k.t, "pod of Job "+job.Name, 2*time.Minute, func() (bool, error) {
		var l corev1.PodList
		if err := k.c.List(context.Background(), &l, client.InNamespace(job.Namespace), client.MatchingLabels{jobexec.LabelRun: job.Name}); err != nil {
			return false, err
		}
		for i := range l.Items {
			for _, o := range l.Items[i].OwnerReferences {
				if o.UID == job.UID && o.Controller != nil && *o.Controller {
					pod = &l.Items[i]
					return true, nil
				}
			}
		}
		return false, nil
	})
	return pod
}

func (k *kubelet) setStatus(pod *corev1.Pod, phase corev1.PodPhase, st corev1.ContainerState) {
	k.t.Helper()
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		cur := &corev1.Pod{}
		if err := k.c.Get(context.Background(), client.ObjectKeyFromObject(pod), cur); err != nil {
			return err
		}
		cur.Status.Phase = phase
		cur.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: jobexec.ContainerName, Image: cur.Spec.Containers[0].Image, State: st,
			Ready: st.Running != nil, Started: ptr.To(st.Running != nil)}}
		return k.c.Status().Update(context.Background(), cur)
	})
	if err != nil {
		k.t.Fatalf("pod %s status: %v", pod.Name, err)
	}
}

// run runs the pod's container: its command, on the Secret volume's
// content, then reports its end as the kubelet would.
func (k *kubelet) run(pod *corev1.Pod) {
	k.t.Helper()
	k.setStatus(pod, corev1.PodRunning, corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}})
	c := pod.Spec.Containers[0]
	// The volume the kubelet would mount: the Secret named by the pod.
	var secretName string
	for _, v := range pod.Spec.Volumes {
		if v.Secret != nil {
			secretName = v.Secret.SecretName
		}
	}
	var sec corev1.Secret
	eventually(k.t, "inputs Secret "+secretName, time.Minute, func() (bool, error) {
		err := k.c.Get(context.Background(), client.ObjectKey{Namespace: pod.Namespace, Name: secretName}, &sec)
		return err == nil, err
	})
	dir := k.t.TempDir()
	input := filepath.Join(dir, jobexec.InputKey)
	if err := os.WriteFile(input, sec.Data[jobexec.InputKey], 0o400); err != nil {
		k.t.Fatal(err)
	}
	term := filepath.Join(dir, "termination-log")
	// The pod's command is tini -- /usr/local/bin/controller phase-run
	// --input <mounted file>: the same binary and arguments, paths mapped.
	if len(c.Command) < 4 || c.Command[2] != "/usr/local/bin/controller" || c.Command[3] != jobexec.PhaseRunCommand {
		k.t.Fatalf("pod command %q", c.Command)
	}
	var args []string
	for _, a := range c.Command[3:] {
		if a == jobexec.InputDir+"/"+jobexec.InputKey {
			a = input
		}
		args = append(args, a)
	}
	args = append(args, "--termination-log", term)
	home := filepath.Join(dir, "home")
	_ = os.Mkdir(home, 0o700)
	out, err := bounded(k.t, 5*time.Minute, k.root, append(k.content(pod, dir), "HOME="+home), k.controller, args...)
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		k.t.Fatalf("phase-run: %v\n%s", err, out)
	}
	k.t.Logf("phase-run exit %d:\n%s", code, out)
	k.lastLog = out
	msg, _ := os.ReadFile(term)
	if len(msg) > 4096 { // what the kubelet keeps
		msg = msg[:4096]
	}
	phase, reason := corev1.PodSucceeded, "Completed"
	if code != 0 {
		phase, reason = corev1.PodFailed, "Error"
	}
	k.setStatus(pod, phase, corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: int32(code), Reason: reason, Message: string(msg),
		StartedAt: metav1.Now(), FinishedAt: metav1.Now()}})
}

// content projects the pod's ConfigMap volumes (their items: key → path)
// under dir as the kubelet would at their mountPaths, and returns the
// container's environment with those mountPaths mapped to dir.
func (k *kubelet) content(pod *corev1.Pod, dir string) []string {
	k.t.Helper()
	vols := map[string]corev1.Volume{}
	for _, v := range pod.Spec.Volumes {
		vols[v.Name] = v
	}
	c := pod.Spec.Containers[0]
	for _, m := range c.VolumeMounts {
		v := vols[m.Name]
		if v.ConfigMap == nil {
			continue
		}
		if !m.ReadOnly {
			k.t.Errorf("content volume %s mounted writable", m.Name)
		}
		var cm corev1.ConfigMap
		if err := k.c.Get(context.Background(), client.ObjectKey{Namespace: pod.Namespace, Name: v.ConfigMap.Name}, &cm); err != nil {
			k.t.Fatalf("ConfigMap %s of volume %s: %v", v.ConfigMap.Name, m.Name, err)
		}
		for _, it := range v.ConfigMap.Items {
			f := filepath.Join(dir, m.MountPath, it.Path)
			if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
				k.t.Fatal(err)
			}
			if err := os.WriteFile(f, []byte(cm.Data[it.Key]), 0o444); err != nil {
				k.t.Fatal(err)
			}
		}
	}
	var env []string
	for _, e := range c.Env {
		val := e.Value
		if e.Name == jobexec.EnvRolesPath || e.Name == jobexec.EnvCollectionsPath {
			var ps []string
			for _, p := range engine.SplitPaths(val) {
				ps = append(ps, filepath.Join(dir, p))
			}
			val = strings.Join(ps, ":")
		}
		env = append(env, e.Name+"="+val)
	}
	return env
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// start runs r on a new executor (a controller) in the background and waits
// for its Job.
func start(t *testing.T, ctx context.Context, e *jobexec.Executor, c client.Client, ns string, r engine.Request) (<-chan engine.Result, *batchv1.Job) {
	t.Helper()
	done := make(chan engine.Result, 1)
	go func() { done <- e.Run(ctx, r) }()
	job := &batchv1.Job{}
	eventually(t, "Job", time.Minute, func() (bool, error) {
		err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: jobexec.JobName(r.Phase, r.Key)}, job)
		return err == nil, err
	})
	return done, job
}

func await(t *testing.T, done <-chan engine.Result) engine.Result {
	t.Helper()
	select {
	case r := <-done:
		return r
	case <-time.After(3 * time.Minute):
		t.Fatal("no result within 3 minutes")
		return engine.Result{}
	}
}

func TestJobOnRealAPIServer(t *testing.T) {
	realWorld(t)
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	controller := buildController(t)
	w := hostenv.Up(t, 1)
	h := w.Host(0)
	key, err := os.ReadFile(w.Inventory().ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ns := "jobexec-" + strings.ToLower(fmt.Sprint(time.Now().UnixNano()%1e6))
	// Pods here must meet the restricted Pod Security Standard: the
	// apiserver's PodSecurity admission refuses the Job controller's pod
	// otherwise.
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{
		"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest"}}}); err != nil {
		t.Fatal(err)
	}
	// No service account controller here; the admission wants the account.
	if err := env.Client.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "default"}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	c, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	newExec := func() *jobexec.Executor {
		e, err := jobexec.New(c, jobexec.Options{Namespace: ns, Image: "localhost/kpssh-controller:dev", TTL: 3 * time.Second, PollInterval: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	kl := &kubelet{t: t, c: env.Client, controller: controller, root: root}
	const token, secret = "abcdef.0123456789abcdef", "join-secret-value-42"
	req := engine.Request{
		Phase: engine.PhaseJoin,
		Conn:  engine.Connection{Address: h.Address, Port: int32(h.Port), User: h.User, PrivateKey: key, HostKey: h.HostKey},
		Source: engine.Source{Script: `set -eu
[ "$KPSSH_BOOTSTRAP_TOKEN" = "` + token + `" ]
[ "$KPSSH_SECRET_API" = "` + secret + `" ]
echo "$KPSSH_NODE_NAME $KPSSH_VAR_GREETING" > /root/jobexec-proof
`},
		Context: engine.Context{BootstrapToken: token, NodeName: "node-1", HostAddress: h.Address, NodeAddress: h.Address,
			ClusterEndpoint: "https://10.0.0.1:6443", ClusterCAB64: "Q0E=", ProviderID: "kpssh://kpssh-system/h1",
			Vars: map[string]string{"GREETING": "hello-from-a-job"}, Secrets: map[string]string{"API": secret}},
		Timeout: 3 * time.Minute,
		Key:     "kpssh-system/h1/join/claim-uid-1",
	}
	name := jobexec.JobName(req.Phase, req.Key)

	t.Run("create, restart, re-attach, result, cleanup", func(t *testing.T) {
		kl.t = t
		// The first controller starts the run, then dies.
		ctx1, cancel := context.WithCancel(ctx)
		first := make(chan engine.Result, 1)
		go func() { first <- newExec().Run(ctx1, req) }()
		var job batchv1.Job
		var sec corev1.Secret
		eventually(t, "Job and its inputs Secret", time.Minute, func() (bool, error) {
			if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &job); err != nil {
				return false, err
			}
			err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &sec)
			return err == nil, err
		})
		if o := sec.OwnerReferences; len(o) != 1 || o[0].UID != job.UID || o[0].Kind != "Job" {
			t.Fatalf("Secret owners %+v, want the Job %s", o, job.UID)
		}
		if job.Spec.TTLSecondsAfterFinished == nil || *job.Spec.TTLSecondsAfterFinished != 3 || *job.Spec.BackoffLimit != 0 || *job.Spec.ActiveDeadlineSeconds != 300 {
			t.Fatalf("Job spec as stored: ttl %v backoff %v deadline %v", job.Spec.TTLSecondsAfterFinished, job.Spec.BackoffLimit, job.Spec.ActiveDeadlineSeconds)
		}
		pod := kl.pod(&job) // made by the real Job controller, admitted as restricted
		// The admission is really enforcing: the same pod with one
		// restricted rule broken is refused.
		bad := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "bad-"}, Spec: *pod.Spec.DeepCopy()}
		bad.Spec.Containers[0].SecurityContext.AllowPrivilegeEscalation = ptr.To(true)
		if err := env.Client.Create(ctx, bad, client.DryRunAll); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "restricted") {
			t.Fatalf("a pod breaking the restricted PSS: %v, want it refused", err)
		}
		cancel()
		if r := <-first; r.Outcome != engine.TimedOut || !strings.Contains(r.Message, "keeps running") {
			t.Fatalf("first controller: %+v", r)
		}

		// The restarted controller runs the same phase for the same claim.
		second := make(chan engine.Result, 1)
		go func() { second <- newExec().Run(ctx, req) }()
		kl.run(pod)
		res := await(t, second)
		if res.Outcome != engine.Succeeded || !res.Touched {
			t.Fatalf("result %+v", res)
		}
		var jobs batchv1.JobList
		if err := env.Client.List(ctx, &jobs, client.InNamespace(ns), client.MatchingLabels{jobexec.LabelRun: name}); err != nil {
			t.Fatal(err)
		}
		if len(jobs.Items) > 1 || (len(jobs.Items) == 1 && jobs.Items[0].UID != job.UID) {
			t.Fatalf("a second Job was started: %d Jobs", len(jobs.Items))
		}
		if got := w.MustRun(0, "cat /root/jobexec-proof"); got != "node-1 hello-from-a-job" {
			t.Fatalf("proof on the host: %q", got)
		}
		// The pod's log: the script's task, once it ended, one line.
		if n := strings.Count(string(kl.lastLog), `phase-run: join task "kpssh: join script" changed in `); n != 1 {
			t.Fatalf("the pod's log has the ended script task %d times:\n%s", n, kl.lastLog)
		}
		// The inputs go as soon as the result is read; the Job at its TTL
		// (the real ttl-after-finished controller), its pod with it (the
		// garbage collector).
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(&sec), &corev1.Secret{}); !apierrors.IsNotFound(err) {
			t.Errorf("inputs Secret after the result: %v", err)
		}
		eventually(t, "Job deleted by its TTL, pod collected", 2*time.Minute, func() (bool, error) {
			err := env.Client.Get(ctx, client.ObjectKeyFromObject(&job), &batchv1.Job{})
			if !apierrors.IsNotFound(err) {
				return false, err
			}
			err = env.Client.Get(ctx, client.ObjectKeyFromObject(pod), &corev1.Pod{})
			return apierrors.IsNotFound(err), err
		})
	})

	t.Run("failed phase, redacted", func(t *testing.T) {
		kl.t = t
		r := req
		r.Key = "kpssh-system/h1/join/claim-uid-2"
		r.Source.Script = `echo "leaking $KPSSH_SECRET_API and $KPSSH_BOOTSTRAP_TOKEN" >&2; exit 3`
		done, job := start(t, ctx, newExec(), env.Client, ns, r)
		kl.run(kl.pod(job))
		res := await(t, done)
		if res.Outcome != engine.Failed || res.RC != 3 || !res.Touched || res.FailedTask == "" {
			t.Fatalf("result %+v", res)
		}
		if strings.Contains(res.Message, secret) || strings.Contains(res.Message, "0123456789abcdef") || !strings.Contains(res.Message, "leaking ***") {
			t.Fatalf("message not redacted as expected: %q", res.Message)
		}
	})

	// The canary through the Job executor: a failing phase prints every
	// secret (a single-line one, each line of a multi-line PEM, the token)
	// on stdout and stderr; the result, the pod's log and termination
	// message, the Job and pod as stored and the namespace's events hold
	// none of them.
	t.Run("canary", func(t *testing.T) {
		kl.t = t
		pemLines := []string{"-----BEGIN KPSSH CANARY KEY-----", "Q2FuYXJ5TGluZU9uZS1qb2JleGVjLTE", "Q2FuYXJ5TGluZVR3by1qb2JleGVjLTI", "-----END KPSSH CANARY KEY-----"}
		r := req
		r.Key = "kpssh-system/h1/join/claim-uid-canary"
		r.Context.Secrets = map[string]string{"API": secret, "PEM": strings.Join(pemLines, "\n") + "\n"}
		r.Source.Script = `echo "stdout: $KPSSH_SECRET_API $KPSSH_BOOTSTRAP_TOKEN"
printf '%s' "$KPSSH_SECRET_PEM"
printf '%s' "$KPSSH_SECRET_PEM" >&2
echo "line two: $(printf '%s\n' "$KPSSH_SECRET_PEM" | sed -n 2p)" >&2
echo "stderr: $KPSSH_SECRET_API $KPSSH_BOOTSTRAP_TOKEN" >&2
exit 4
`
		done, job := start(t, ctx, newExec(), env.Client, ns, r)
		pod := kl.pod(job)
		kl.run(pod)
		res := await(t, done)
		if res.Outcome != engine.Failed || res.RC != 4 || !strings.Contains(res.Message, "stderr: *** ***") {
			t.Fatalf("the canary phase's result does not carry its redacted output (the scan would prove nothing): %+v", res)
		}
		needles := map[string]string{"the join secret": secret, "the token": token, "the token's secret": "0123456789abcdef",
			"PEM line 2": pemLines[1], "PEM line 3": pemLines[2]}
		scan := func(where, text string) {
			t.Helper()
			for what, n := range needles {
				if i := strings.Index(text, n); i >= 0 {
					t.Errorf("%s holds %s, around %q", where, what, text[max(0, i-80):min(len(text), i+len(n)+40)])
				}
			}
		}
		b, _ := json.Marshal(res)
		scan("the result", string(b))
		scan("the pod's log", string(kl.lastLog))
		var p corev1.Pod
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(pod), &p); err == nil {
			b, _ := json.Marshal(p)
			scan("the pod as stored", string(b))
		}
		var j batchv1.Job
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(job), &j); err == nil {
			b, _ := json.Marshal(j)
			scan("the Job as stored", string(b))
		}
		var evs corev1.EventList
		if err := env.Client.List(ctx, &evs, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		for _, e := range evs.Items {
			scan("event "+e.Reason, e.Message)
		}
	})

	// Operator content: a role that exists only in a ConfigMap (keys
	// tasks__join.yml …, projected by items into a role directory) runs in
	// the phase pod, whose engine searches the paths the Job's environment
	// names; the Job also carries an image volume, admitted as restricted.
	t.Run("role from a ConfigMap content volume", func(t *testing.T) {
		kl.t = t
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "role-site-join"}, Data: map[string]string{}}
		var items []corev1.KeyToPath
		for _, ph := range []string{"install", "join", "leave"} {
			key := "tasks__" + ph + ".yml"
			cm.Data[key] = "- name: " + ph + " from a ConfigMap\n  ansible.builtin.copy:\n    dest: /root/content-" + ph + "\n    content: \"{{ kpssh_phase }} {{ kpssh_vars.GREETING | default('') }}\"\n    mode: \"0600\"\n"
			items = append(items, corev1.KeyToPath{Key: key, Path: "tasks/" + ph + ".yml"})
		}
		if err := env.Client.Create(ctx, cm); err != nil {
			t.Fatal(err)
		}
		content, err := jobexec.ParseContent(`{"volumes":[{"name":"content-role-site-join","configMap":{"name":"role-site-join","items":` + mustJSON(t, items) + `}},
			{"name":"content-image-acme","image":{"reference":"localhost/acme-content:1","pullPolicy":"IfNotPresent"}}],
			"volumeMounts":[{"name":"content-role-site-join","mountPath":"/usr/share/kpssh/content/roles/site_join"},
			{"name":"content-image-acme","mountPath":"/usr/share/kpssh/content/images/acme"}]}`)
		if err != nil {
			t.Fatal(err)
		}
		e, err := jobexec.New(c, jobexec.Options{Namespace: ns, Image: "localhost/kpssh-controller:dev", TTL: 3 * time.Second, PollInterval: 2 * time.Second,
			Content: content, RolesPath: []string{"/usr/share/kpssh/content/roles"}, CollectionsPaths: []string{"/usr/share/kpssh/content/images/acme/collections"}})
		if err != nil {
			t.Fatal(err)
		}
		r := req
		r.Key = "kpssh-system/h1/join/claim-uid-content"
		r.Source = engine.Source{Role: "site_join"}
		done, job := start(t, ctx, e, env.Client, ns, r)
		pod := kl.pod(job) // the Job controller's pod, admitted as restricted with both volumes
		kl.run(pod)
		if res := await(t, done); res.Outcome != engine.Succeeded {
			t.Fatalf("result %+v\n%s", res, kl.lastLog)
		}
		if got := w.MustRun(0, "cat /root/content-join"); got != "join hello-from-a-job" {
			t.Fatalf("the ConfigMap role wrote %q", got)
		}
	})

	attacks(t, attackWorld{ctx: ctx, ns: ns, c: c, kl: kl, w: w, req: req, newExec: newExec})

	t.Run("pod deleted before a result", func(t *testing.T) {
		kl.t = t
		r := req
		r.Key = "kpssh-system/h1/join/claim-uid-3"
		done, job := start(t, ctx, newExec(), env.Client, ns, r)
		pod := kl.pod(job)
		kl.setStatus(pod, corev1.PodRunning, corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}})
		if err := env.Client.Delete(ctx, pod, client.GracePeriodSeconds(0)); err != nil {
			t.Fatal(err)
		}
		if res := await(t, done); res.Outcome != engine.Failed || !strings.Contains(res.Message, "without a result") {
			t.Fatalf("result %+v", res)
		}
	})
}

// attackWorld is what the attacks on the inputs share with the test above.
type attackWorld struct {
	ctx     context.Context
	ns      string
	c       client.WithWatch // the executor's (the controller's) client
	kl      *kubelet
	w       *hostenv.World
	req     engine.Request
	newExec func() *jobexec.Executor
}

// attacker is a client for mallory, who may create Secrets in the Job
// namespace and read its Jobs — nothing else (the apiserver authorizes her
// through RBAC as it would any user).
func attacker(t *testing.T, ns string) client.Client {
	t.Helper()
	ctx := context.Background()
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "mallory"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"create"}},
		{APIGroups: []string{"batch"}, Resources: []string{"jobs"}, Verbs: []string{"get", "list", "watch"}},
	}}
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "mallory"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "mallory"},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "mallory"}}}
	for _, o := range []client.Object{role, rb} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "mallory"}
	m, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	// She is really held to those rules.
	if err := m.Get(ctx, client.ObjectKey{Namespace: ns, Name: "anything"}, &corev1.Secret{}); !apierrors.IsForbidden(err) {
		t.Fatalf("mallory reading a Secret: %v, want forbidden", err)
	}
	return m
}

// planted is a Secret of the inputs' name holding inputs of the attacker's
// choosing, controlled by owner if not nil (an owner reference anyone who
// can read the Job can write).
func planted(ns, name string, input []byte, owner *batchv1.Job) *corev1.Secret {
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
		Labels: map[string]string{jobexec.LabelManagedBy: jobexec.ManagedBy, jobexec.LabelRun: name}},
		Immutable: ptr.To(true), Data: map[string][]byte{jobexec.InputKey: input}}
	if owner != nil {
		s.OwnerReferences = []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: owner.Name, UID: owner.UID, Controller: ptr.To(true)}}
	}
	return s
}

// attacks: the inputs Secret's name is predictable and the pods are found
// by label, so whoever can create Secrets (or pods) in the Job namespace
// tries to decide what a phase runs or what its result is. Each attack
// proves itself: a forged phase writes a file on the host.
func attacks(t *testing.T, a attackWorld) {
	mallory := attacker(t, a.ns)
	// The attacker's inputs: their own script (on a host they can reach
	// with a key they hold: here the test host's), a success to report.
	forge := func(t *testing.T, r engine.Request, proof string) []byte {
		t.Helper()
		f := r
		f.Source.Script = "echo forged > " + proof
		b, err := jobexec.EncodeInput(f)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	ran := func(t *testing.T, proof string) bool {
		t.Helper()
		return a.w.WithT(t).MustRun(0, "if [ -e "+proof+" ]; then echo yes; else echo no; fi") == "yes"
	}
	// answer waits for the executor's answer to an attack. An executor that
	// waits for its pod instead has taken the planted inputs: the kubelet
	// runs that pod to show what it does, and the test fails.
	answer := func(t *testing.T, done <-chan engine.Result, name, proof string) engine.Result {
		t.Helper()
		select {
		case r := <-done:
			return r
		case <-time.After(20 * time.Second):
		}
		job := &batchv1.Job{}
		if err := env.Client.Get(a.ctx, client.ObjectKey{Namespace: a.ns, Name: name}, job); err != nil {
			t.Fatalf("no answer within 20 s and no Job: %v", err)
		}
		a.kl.run(a.kl.pod(job))
		r := await(t, done)
		t.Fatalf("the executor took inputs it did not write and ran them: result %+v; the forged script ran on the host: %v", r, ran(t, proof))
		return r
	}
	// refused: the run is refused before anything ran, the refusal names
	// the Secret, and the attacker's Secret is still there (not ours to
	// delete).
	refused := func(t *testing.T, r engine.Result, sec *corev1.Secret, proof string) {
		t.Helper()
		t.Logf("refused: %s", r.Message)
		if r.Outcome != engine.ConfigError || r.Touched || !strings.Contains(r.Message, "inputs Secret "+a.ns+"/"+sec.Name) ||
			!strings.Contains(r.Message, "not created for this run") {
			t.Errorf("result %+v, want a ConfigError naming the Secret", r)
		}
		cur := &corev1.Secret{}
		if err := env.Client.Get(a.ctx, client.ObjectKeyFromObject(sec), cur); err != nil || cur.UID != sec.UID {
			t.Errorf("the planted Secret was removed or replaced (%v)", err)
		}
		if ran(t, proof) {
			t.Error("the forged script ran on the host")
		}
		// No Job is left to run it.
		eventually(t, "no Job of the refused run", time.Minute, func() (bool, error) {
			job := &batchv1.Job{}
			err := env.Client.Get(a.ctx, client.ObjectKeyFromObject(sec), job)
			return apierrors.IsNotFound(err) || (err == nil && job.DeletionTimestamp != nil), err
		})
	}

	t.Run("attack: inputs Secret planted before the Job", func(t *testing.T) {
		a.kl.t = t
		r := a.req
		r.Key = "kpssh-system/h1/join/claim-uid-4"
		name, proof := jobexec.JobName(r.Phase, r.Key), "/root/jobexec-forged-before"
		sec := planted(a.ns, name, forge(t, r, proof), nil)
		if err := mallory.Create(a.ctx, sec); err != nil {
			t.Fatal(err)
		}
		done := make(chan engine.Result, 1)
		go func() { done <- a.newExec().Run(a.ctx, r) }()
		refused(t, answer(t, done, name, proof), sec, proof)
	})

	// racer starts a run (of the claim) on an executor whose Secret creation
	// mallory races: watching the Jobs, she creates the name after the Job,
	// before its Secret, with her inputs (their script writes proof), the
	// Job as its controller if owned. sec is what she planted.
	racer := func(t *testing.T, claim, proof string, owned bool) (name string, done <-chan engine.Result, sec func() *corev1.Secret) {
		a.kl.t = t
		r := a.req
		r.Key = "kpssh-system/h1/join/" + claim
		name = jobexec.JobName(r.Phase, r.Key)
		input := forge(t, r, proof)
		var mu sync.Mutex
		var hers *corev1.Secret
		var perr error
		c := interceptor.NewClient(a.c, interceptor.Funcs{Create: func(ctx context.Context, cl client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if s, ok := obj.(*corev1.Secret); ok && s.Name == name {
				mu.Lock()
				if hers == nil && perr == nil {
					job := &batchv1.Job{}
					if perr = mallory.Get(ctx, client.ObjectKey{Namespace: a.ns, Name: name}, job); perr == nil {
						var owner *batchv1.Job
						if owned {
							owner = job
						}
						hers = planted(a.ns, name, input, owner)
						if perr = mallory.Create(ctx, hers); perr != nil {
							hers = nil
						}
					}
				}
				mu.Unlock()
			}
			return cl.Create(ctx, obj, opts...)
		}})
		e := a.newExec()
		e.Client = c
		ch := make(chan engine.Result, 1)
		go func() { ch <- e.Run(a.ctx, r) }()
		return name, ch, func() *corev1.Secret {
			t.Helper()
			mu.Lock()
			defer mu.Unlock()
			if hers == nil {
				t.Fatalf("the racer did not plant its Secret: %v", perr)
			}
			return hers
		}
	}

	t.Run("attack: inputs Secret planted between the Job and its Secret", func(t *testing.T) {
		proof := "/root/jobexec-forged-race"
		name, done, sec := racer(t, "claim-uid-5", proof, false)
		res := answer(t, done, name, proof)
		refused(t, res, sec(), proof)
	})

	// The Job as the planted Secret's owner: its owner reference cannot be
	// told from ours, but its content is not what the Job was made for, and
	// the pod (given the digest by the Job) refuses it.
	t.Run("attack: tampered inputs owned by the Job", func(t *testing.T) {
		proof := "/root/jobexec-forged-tampered"
		name, done, sec := racer(t, "claim-uid-6", proof, true)
		job := &batchv1.Job{}
		eventually(t, "Job", time.Minute, func() (bool, error) {
			err := env.Client.Get(a.ctx, client.ObjectKey{Namespace: a.ns, Name: name}, job)
			return err == nil, err
		})
		a.kl.run(a.kl.pod(job))
		res := await(t, done)
		_ = sec()
		if ran(t, proof) {
			t.Fatalf("the pod ran the tampered inputs on the host: result %+v", res)
		}
		t.Logf("refused: %s", res.Message)
		if res.Outcome != engine.ConfigError || res.Touched || !strings.Contains(res.Message, "inputs Secret "+a.ns+"/"+name) ||
			!strings.Contains(res.Message, "sha256") {
			t.Fatalf("result %+v, want the pod's refusal of the inputs (a ConfigError naming the Secret and the digest)", res)
		}
	})

	// Pods are found by label; only the Job's own pod may report: one with
	// the labels alone, and one that names the Job as a (non-controller)
	// owner, both report a forged success before the real pod ends.
	t.Run("attack: spoofed pods with the Job's labels", func(t *testing.T) {
		a.kl.t = t
		r := a.req
		r.Key = "kpssh-system/h1/join/claim-uid-7"
		r.Source.Script = "exit 7"
		done, job := start(t, a.ctx, a.newExec(), env.Client, a.ns, r)
		pod := a.kl.pod(job)
		forged := string(jobexec.EncodeResult(engine.Result{Outcome: engine.Succeeded, Touched: true, Message: "forged"}))
		for i, owner := range []*metav1.OwnerReference{nil, {APIVersion: "batch/v1", Kind: "Job", Name: job.Name, UID: job.UID}} {
			spoof := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: a.ns, Name: fmt.Sprintf("%s-spoof%d", job.Name, i), Labels: map[string]string{}},
				Spec: *pod.Spec.DeepCopy()}
			// The Job's labels but the one its controller selects by (the
			// Job controller would count it).
			for k, v := range pod.Labels {
				if k != "batch.kubernetes.io/controller-uid" && k != "controller-uid" {
					spoof.Labels[k] = v
				}
			}
			if owner != nil {
				spoof.OwnerReferences = []metav1.OwnerReference{*owner}
			}
			spoof.Spec.Containers[0].Command = []string{"/bin/sh", "-c", "echo '" + forged + "' > /dev/termination-log"}
			if err := env.Client.Create(a.ctx, spoof); err != nil {
				t.Fatal(err)
			}
			// What its kubelet reports once that command ran.
			a.kl.setStatus(spoof, corev1.PodSucceeded, corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "Completed", Message: forged,
				StartedAt: metav1.Now(), FinishedAt: metav1.Now()}})
		}
		// The executor sees them (it watches the label): it must keep
		// waiting for its own pod.
		select {
		case res := <-done:
			t.Fatalf("the executor took a result from a pod its Job did not make: %+v", res)
		case <-time.After(3 * time.Second):
		}
		a.kl.run(pod)
		res := await(t, done)
		if res.Outcome != engine.Failed || res.RC != 7 || strings.Contains(res.Message, "forged") {
			t.Fatalf("result %+v, want the Job's own pod's (Failed, rc 7)", res)
		}
	})
}
