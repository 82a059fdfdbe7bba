// Package controller_test runs the phase pod of executor job for real in a
// container runtime: the controller image (images/controller/Dockerfile,
// built on the runner image by hack/runner-image.sh --controller), started
// with podman the way a kubelet would start the Job's pod — its command, its
// user and groups, read-only root, no capabilities, no privilege escalation,
// the inputs Secret as a read-only file, the emptyDirs, the termination log —
// against a systemd-nspawn test host. Only Kubernetes is missing here (see
// internal/jobexec's tests for the apiserver side).
package controller_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/dklesev/kpssh/internal/engine"
	"github.com/dklesev/kpssh/internal/jobexec"
	"github.com/dklesev/kpssh/test/hostenv"
	"github.com/dklesev/kpssh/test/testexec"
)

// buildTimeout bounds hack/runner-image.sh --controller (a cold runner
// build takes minutes on a loaded machine; the controller layer seconds).
const buildTimeout = 40 * time.Minute

type image struct {
	ref string   // localhost/kpssh-controller:<key>
	env []string // CONTAINERS_*=… of the script's podman configuration
}

func controllerImage(t *testing.T) image {
	t.Helper()
	if testing.Short() {
		t.Skip("heavy: builds the controller image with buildah and runs it with podman; not in -short")
	}
	if os.Geteuid() != 0 {
		t.Fatal("must run as root (rootful buildah/podman, nspawn hosts)")
	}
	for _, c := range []string{"buildah", "podman"} {
		if _, err := exec.LookPath(c); err != nil {
			t.Fatalf("%s not found: install the Debian package %s (hack/deps.sh does)", c, c)
		}
	}
	root, err := hostenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(root, "hack", "runner-image.sh")
	start := time.Now()
	out, err := run(t, buildTimeout, nil, script, "--controller")
	if err != nil {
		t.Fatalf("hack/runner-image.sh --controller: %v\n%s", err, tail(out, 4000))
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	img := image{ref: strings.TrimSpace(lines[len(lines)-1])}
	if !strings.HasPrefix(img.ref, "localhost/kpssh-controller:") {
		t.Fatalf("hack/runner-image.sh --controller ended with %q, want the controller image", img.ref)
	}
	envOut, err := run(t, time.Minute, nil, script, "--print-env")
	if err != nil {
		t.Fatalf("--print-env: %v", err)
	}
	for _, l := range strings.Split(strings.TrimSpace(envOut), "\n") {
		if strings.HasPrefix(l, "CONTAINERS_") {
			img.env = append(img.env, l)
		}
	}
	t.Logf("controller image %s ready in %v", img.ref, time.Since(start).Round(time.Millisecond))
	return img
}

// run runs a command in its own process group, killed as a group at the
// timeout and reaped; stdout only on success, both on failure.
func run(t *testing.T, d time.Duration, extraEnv []string, name string, args ...string) (string, error) {
	t.Helper()
	o, e, err := testexec.Run(d, append(os.Environ(), extraEnv...), name, args...)
	if err != nil {
		return o + e, err
	}
	return o, nil
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}

// podmanArgs maps the Job's pod to `podman run` the way a kubelet runs it.
// Everything the pod spec sets is mapped or refused, so a new field in the
// Job that the image cannot honour fails here.
func podmanArgs(t *testing.T, pod corev1.PodSpec, inputDir, termLog, label string) []string {
	t.Helper()
	if len(pod.Containers) != 1 || len(pod.InitContainers) != 0 {
		t.Fatalf("pod has %d containers, %d init containers", len(pod.Containers), len(pod.InitContainers))
	}
	c := pod.Containers[0]
	psc, sc := pod.SecurityContext, c.SecurityContext
	args := []string{"run", "--rm", "--pull=never", "--label", "kpssh.test=" + label,
		// The test host is on the machine's bridge; in a cluster the pod
		// network (or hostNetwork) reaches it.
		"--network=host",
		"--user", fmt.Sprintf("%d:%d", *psc.RunAsUser, *psc.RunAsGroup),
		"--group-add", fmt.Sprint(*psc.FSGroup),
		"--cap-drop=ALL", "--security-opt=no-new-privileges",
		"--memory", fmt.Sprint(c.Resources.Limits.Memory().Value()),
		"-v", termLog + ":" + c.TerminationMessagePath,
	}
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || *sc.AllowPrivilegeEscalation || len(sc.Capabilities.Drop) != 1 {
		t.Fatalf("container securityContext %+v", sc)
	}
	// Only the pod's own volumes are writable (podman would add tmpfs
	// mounts of its own at /tmp, /run, /var/tmp).
	args = append(args, "--read-only", "--read-only-tmpfs=false")
	vols := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		vols[v.Name] = v
	}
	for _, m := range c.VolumeMounts {
		v := vols[m.Name]
		switch {
		case v.Secret != nil:
			if !m.ReadOnly {
				t.Fatalf("secret volume %s mounted writable", m.Name)
			}
			args = append(args, "-v", inputDir+":"+m.MountPath+":ro")
		case v.EmptyDir != nil && m.MountPath == "/dev/shm":
			// podman gives every container its own /dev/shm tmpfs.
			args = append(args, "--shm-size", fmt.Sprint(v.EmptyDir.SizeLimit.Value()))
		case v.EmptyDir != nil:
			args = append(args, "--tmpfs", fmt.Sprintf("%s:rw,size=%d,mode=1777", m.MountPath, v.EmptyDir.SizeLimit.Value()))
		default:
			t.Fatalf("volume %s: no mapping for %+v", m.Name, v.VolumeSource)
		}
	}
	entry := c.Command
	args = append(args, "--entrypoint", entry[0], "--workdir", "/home/kpssh")
	return append(append(args, c.Image), entry[1:]...)
}

// TestPhasePodInImage runs phases through the Job's pod in the real image.
func TestPhasePodInImage(t *testing.T) {
	img := controllerImage(t)
	w := hostenv.Up(t, 1)
	h := w.Host(0)
	key, err := os.ReadFile(w.Inventory().ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	e, err := jobexec.New(fake.NewClientBuilder().Build(), jobexec.Options{Namespace: "kpssh", Image: img.ref})
	if err != nil {
		t.Fatal(err)
	}
	const secret = "join-secret-value-42"
	base := engine.Request{
		Phase: engine.PhaseInstall,
		Conn:  engine.Connection{Address: h.Address, Port: int32(h.Port), User: h.User, PrivateKey: key, HostKey: h.HostKey},
		Context: engine.Context{HostAddress: h.Address, NodeAddress: h.Address, NodeName: "n1", ClusterEndpoint: "https://10.0.0.1:6443", ClusterCAB64: "Q0E=",
			Vars: map[string]string{"GREETING": "hello-from-the-image"}, Secrets: map[string]string{"API": secret}},
		Timeout: 2 * time.Minute,
	}
	cases := []struct {
		name, script string
		exit         int
		outcome      engine.Outcome
		rc           int
		check        func(t *testing.T, r engine.Result)
	}{
		{"succeeds", `set -eu; [ "$KPSSH_SECRET_API" = "` + secret + `" ]; echo "$KPSSH_VAR_GREETING" > /root/image-proof`, jobexec.ExitSucceeded, engine.Succeeded, 0,
			func(t *testing.T, _ engine.Result) {
				if got := w.MustRun(0, "cat /root/image-proof"); got != "hello-from-the-image" {
					t.Errorf("proof on the host: %q", got)
				}
			}},
		{"fails, redacted", `echo "leaking $KPSSH_SECRET_API" >&2; exit 3`, jobexec.ExitFailed, engine.Failed, 3,
			func(t *testing.T, r engine.Result) {
				if strings.Contains(r.Message, secret) || !strings.Contains(r.Message, "leaking ***") {
					t.Errorf("message %q", r.Message)
				}
			}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req := base
			req.Source.Script = c.script
			job, sec, err := e.Render(req)
			if err != nil {
				t.Fatal(err)
			}
			// The Secret volume as the kubelet writes it: root-owned files,
			// mode 0400 plus group read for the pod's fsGroup.
			dir := t.TempDir()
			input := filepath.Join(dir, "input")
			if err := os.Mkdir(input, 0o755); err != nil {
				t.Fatal(err)
			}
			gid := int(*job.Spec.Template.Spec.SecurityContext.FSGroup)
			if mode := *job.Spec.Template.Spec.Volumes[0].Secret.DefaultMode; mode != 0o400 {
				t.Fatalf("secret mode %o", mode)
			}
			f := filepath.Join(input, jobexec.InputKey)
			if err := os.WriteFile(f, sec.Data[jobexec.InputKey], 0o440); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(f, 0, gid); err != nil {
				t.Fatal(err)
			}
			term := filepath.Join(dir, "termination-log")
			if err := os.WriteFile(term, nil, 0o666); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(term, 0o666); err != nil { // umask
				t.Fatal(err)
			}
			label := fmt.Sprintf("jobexec-image-%d-%d", os.Getpid(), time.Now().UnixNano())
			// A podman killed at its timeout can leave its container behind
			// (conmon is detached): remove whatever carries this run's label.
			t.Cleanup(func() {
				ids, _ := run(t, time.Minute, img.env, "podman", "ps", "-a", "-q", "--filter", "label=kpssh.test="+label)
				if ids = strings.TrimSpace(ids); ids != "" {
					_, _ = run(t, time.Minute, img.env, "podman", append([]string{"rm", "-f"}, strings.Fields(ids)...)...)
				}
			})
			args := podmanArgs(t, job.Spec.Template.Spec, input, term, label)
			start := time.Now()
			out, err := run(t, 5*time.Minute, img.env, "podman", args...)
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatalf("podman: %v\n%s", err, out)
			}
			t.Logf("pod exit %d in %v:\n%s", code, time.Since(start).Round(time.Millisecond), tail(out, 3000))
			if code != c.exit {
				t.Fatalf("exit %d, want %d", code, c.exit)
			}
			msg, err := os.ReadFile(term)
			if err != nil {
				t.Fatal(err)
			}
			r, err := jobexec.ParseResult(string(msg))
			if err != nil {
				t.Fatalf("termination message %q: %v", msg, err)
			}
			if r.Outcome != c.outcome || r.RC != c.rc || !r.Touched {
				t.Fatalf("result %+v", r)
			}
			c.check(t, r)
			for _, s := range []string{secret, "PRIVATE KEY"} {
				if strings.Contains(out, s) {
					t.Fatalf("%q in the pod's output", s)
				}
			}
			// --rm: nothing of the pod is left.
			if ps, err := run(t, time.Minute, img.env, "podman", "ps", "-a", "-q", "--filter", "label=kpssh.test="+label); err != nil || strings.TrimSpace(ps) != "" {
				t.Errorf("containers left: %q %v", ps, err)
			}
		})
	}
}
