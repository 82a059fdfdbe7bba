//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/cli"
	"github.com/dklesev/kpssh/internal/jobexec"
)

// contentRole: a role written outside roles/ (test/e2e/testdata/content,
// never in an image) is operator content. A profile naming a role in no
// source leaves the node class ProfileInvalid, naming the role and the
// searched paths, and no host is claimed. Then the role joins a node with the
// local executor (a directory on KPSSH_ROLES_PATH, as a mount is to the
// controller) and, from a ConfigMap that the real kubelet projects into the
// phase pods (KPSSH_JOB_CONTENT, at the same path), with the Job executor.
func contentRole(w *world, _ *state) {
	// The author's loop: kpssh new-role writes the skeleton outside roles/,
	// the author's edits (testdata) go over it, and the result ships as
	// content. The controller reads the role where it is (as it would a
	// mount); phase pods mount the ConfigMap at that same path. So the path
	// must be one a phase pod can mount: not under its own /tmp, /dev/shm,
	// /var/run or home (jobexec.ParseContent refuses those, and the
	// controller does not start) — which is where a checkout in /tmp put it
	// (<repo>/.cache: a fresh clone in /tmp/fresh, as CI runs it). /run is
	// none of them, and the runner's bubblewrap binds it.
	roles, err := os.MkdirTemp("/run", "kpssh-e2e-content-")
	if err != nil {
		w.t.Fatal(err)
	}
	defer os.RemoveAll(roles)
	if err := os.Chmod(roles, 0o755); err != nil { // the controller's sandbox and the phase pods read it
		w.t.Fatal(err)
	}
	written, err := cli.NewRole(roles, "site_join")
	if err != nil {
		w.t.Fatalf("kpssh new-role site_join: %v", err)
	}
	role := filepath.Join(roles, "site_join")
	edits := filepath.Join(w.repo, "test/e2e/testdata/content/roles/site_join")
	if err := filepath.WalkDir(edits, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(edits, p)
		if err := os.MkdirAll(filepath.Dir(filepath.Join(role, rel)), 0o755); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(role, rel), b, 0o644)
	}); err != nil {
		w.t.Fatal(err)
	}
	files := map[string]string{}
	if err := filepath.WalkDir(role, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		rel, _ := filepath.Rel(role, p)
		files[rel] = string(b)
		return err
	}); err != nil {
		w.t.Fatal(err)
	}
	if _, ok := files["tasks/uninstall.yml"]; !ok {
		w.t.Fatalf("new-role wrote %v: no tasks/uninstall.yml", written)
	}
	w.t.Logf("kpssh new-role site_join: %d files; with the author's edits %d", len(written), len(files))

	local := w.ctrl.env
	restart := func(env []string) {
		w.ctrl.stop()
		w.ctrl.env = env
		w.ctrl.start()
	}
	withContent := append(append([]string{}, local...), "KPSSH_ROLES_PATH="+roles)
	restart(withContent)
	defer func() {
		restart(local)
		w.mustKubectl("patch", "sshnodeclass", "pool", "--type=merge", "-p", `{"spec":{"joinProfileRef":{"name":"`+w.profile+`"}}}`)
	}()

	// The profiles: the shipped role's example, renamed to the content role
	// (the same vars), and one naming a role nobody ships.
	ex, err := os.ReadFile(filepath.Join(w.repo, "examples/profile-tls-bootstrap.yaml"))
	if err != nil {
		w.t.Fatal(err)
	}
	prof := strings.Replace(strings.Replace(string(ex), "name: tls-bootstrap\n", "name: site-join\n", 1), "role: tls_bootstrap\n", "role: site_join\n", 1)
	missing := strings.Replace(strings.Replace(string(ex), "name: tls-bootstrap\n", "name: site-missing\n", 1), "role: tls_bootstrap\n", "role: site_missing\n", 1)
	if !strings.Contains(prof, "role: site_join") || !strings.Contains(missing, "role: site_missing") {
		w.t.Fatalf("examples/profile-tls-bootstrap.yaml changed shape: %s", ex)
	}
	for name, text := range map[string]string{"site-join.yaml": prof, "site-missing.yaml": missing} {
		f := filepath.Join(w.t.TempDir(), name)
		if err := os.WriteFile(f, []byte(text), 0o600); err != nil {
			w.t.Fatal(err)
		}
		w.apply(f)
	}

	// A role in no source: ProfileInvalid with the searched paths; no
	// host is claimed while the pool wants a node.
	w.mustKubectl("patch", "sshnodeclass", "pool", "--type=merge", "-p", `{"spec":{"joinProfileRef":{"name":"site-missing"}}}`)
	want := "role site_missing not found in: " + filepath.Join(w.repo, "roles") + ", " + roles
	w.eventually("node class ProfileInvalid naming the searched paths", time.Minute, func() (bool, string) {
		nc := &v1beta1.SSHNodeClass{}
		if err := w.kube.Get(context.Background(), client.ObjectKey{Name: "pool"}, nc); err != nil {
			return false, err.Error()
		}
		c := nc.StatusConditions().Get(v1beta1.ConditionReady)
		if c == nil {
			return false, "no Ready condition"
		}
		return c.Status == metav1.ConditionFalse && c.Reason == v1beta1.ReasonProfileInvalid && strings.Contains(c.Message, want),
			fmt.Sprintf("%s/%s %q", c.Status, c.Reason, c.Message)
	})
	w.scale(1)
	for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(time.Second) {
		for _, h := range w.sshHosts() {
			if h.Status.State != v1beta1.HostAvailable || h.Status.ClaimRef != nil {
				w.t.Fatalf("host %s is %s (claim %+v) under a ProfileInvalid node class", h.Name, h.Status.State, h.Status.ClaimRef)
			}
		}
	}

	// Local executor: the content role joins a node.
	w.mustKubectl("patch", "sshnodeclass", "pool", "--type=merge", "-p", `{"spec":{"joinProfileRef":{"name":"site-join"}}}`)
	a, _ := w.joined("")
	ai := w.hostIndex(a.Name)
	if a.Status.InstalledProfile != "site-join@1" {
		w.t.Errorf("installedProfile %q, want site-join@1", a.Status.InstalledProfile)
	}
	if got, _, err := w.hosts.Run(ai, "cat /var/lib/kpssh-site-join.join"); err != nil || strings.TrimSpace(got) != "join by site_join for "+a.Name {
		w.t.Errorf("the content role's join marker on %s: %q %v", a.Name, got, err)
	}
	if u := w.units(ai); u != unitsJoined {
		w.t.Errorf("units on %s: %q, want %q", a.Name, u, unitsJoined)
	}

	// Job executor: the same role from a ConfigMap in the Job namespace,
	// projected by the kubelet of a (keys: paths with / as __).
	img := controllerImage(w)
	importImage(w, ai, img)
	// Its own namespace: JobExec's may still be terminating.
	const ns = "kpssh-content-jobs"
	w.mustKubectl("create", "namespace", ns)
	defer w.kubectl("delete", "namespace", ns, "--wait=false") //nolint:errcheck // best effort
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "role-site-join"}, Data: map[string]string{}}
	var items []corev1.KeyToPath
	for rel, text := range files {
		key := strings.ReplaceAll(rel, "/", "__")
		cm.Data[key] = text
		items = append(items, corev1.KeyToPath{Key: key, Path: rel})
	}
	if err := w.kube.Create(context.Background(), cm); err != nil {
		w.t.Fatal(err)
	}
	content := jobexec.Content{
		Volumes: []corev1.Volume{{Name: "content-role-site-join", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: cm.Name}, Items: items}}}},
		VolumeMounts: []corev1.VolumeMount{{Name: "content-role-site-join", MountPath: filepath.Join(roles, "site_join"), ReadOnly: true}},
	}
	js, err := json.Marshal(content)
	if err != nil {
		w.t.Fatal(err)
	}
	if _, err := jobexec.ParseContent(string(js)); err != nil {
		w.t.Fatalf("the controller would refuse to start with this KPSSH_JOB_CONTENT: %v", err)
	}
	restart(append(append([]string{}, withContent...), "EXECUTOR=job", "JOB_NAMESPACE="+ns, "JOB_IMAGE="+img,
		"JOB_IMAGE_PULL_POLICY=Never", "JOB_HOST_NETWORK=true", "JOB_ALLOW_MANAGED_NODES=true",
		"JOB_NODE_SELECTOR=kubernetes.io/hostname="+a.Name, "KPSSH_JOB_CONTENT="+string(js)))
	w.scale(2)
	b := w.joinedBeside(a.Name, ns, "a second host joined with the content role through phase Jobs")
	bi := w.hostIndex(b.Name)
	if got, _, err := w.hosts.Run(bi, "cat /var/lib/kpssh-site-join.join"); err != nil || strings.TrimSpace(got) != "join by site_join for "+b.Name {
		w.t.Errorf("the content role's join marker on %s: %q %v", b.Name, got, err)
	}
	// It ran in a phase pod that mounted the ConfigMap.
	var pods corev1.PodList
	if err := w.kube.List(context.Background(), &pods, client.InNamespace(ns), client.MatchingLabels{jobexec.LabelPhase: "join"}); err != nil {
		w.t.Fatal(err)
	}
	ran := false
	for _, p := range pods.Items {
		for _, v := range p.Spec.Volumes {
			if v.ConfigMap != nil && v.ConfigMap.Name == cm.Name && len(p.Status.ContainerStatuses) == 1 &&
				p.Status.ContainerStatuses[0].State.Terminated != nil && p.Status.ContainerStatuses[0].State.Terminated.ExitCode == 0 {
				ran = true
			}
		}
	}
	if !ran {
		w.t.Errorf("no succeeded join pod in %s mounting ConfigMap %s (%d join pods)", ns, cm.Name, len(pods.Items))
	}

	// Both leave through the local executor (a leave Job on a would stop
	// the kubelet under its own pod), the content role's leave.
	restart(withContent)
	removeImage(w, ai, img)
	w.scale(0)
	w.allLeft("content role: both hosts left")
	for _, i := range []int{ai, bi} {
		if got, _, err := w.hosts.Run(i, "cat /var/lib/kpssh-site-join.leave"); err != nil || strings.TrimSpace(got) != "leave by site_join" {
			w.t.Errorf("the content role's leave marker on host %d: %q %v", i, got, err)
		}
	}
}
