package chart

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/dklesev/kpssh/internal/jobexec"
)

const contentValues = `executor: job
jobExecutor: {namespace: kpssh-jobs}
content:
  roles:
    - name: site_join
      files:
        tasks/install.yml: "- ansible.builtin.meta: noop\n"
        tasks/join.yml: "- ansible.builtin.meta: noop\n"
        tasks/leave.yml: "- ansible.builtin.meta: noop\n"
    - name: site_leave
      configMap: site-leave-role
      paths: [tasks/install.yml, tasks/join.yml, tasks/leave.yml]
  images:
    - name: acme
      reference: registry.example/acme/kpssh-content:1.0.0
      sourcePath: /content
    - name: old
      reference: registry.example/acme/kpssh-content:0.9
      copy: true
      roles: ""
`

// TestContent: the content block becomes read-only volumes of the
// controller, the search paths in KPSSH_ROLES_PATH / KPSSH_COLLECTIONS_PATH,
// and (executor job) KPSSH_JOB_CONTENT, which the controller's own parser
// accepts and which names the same volumes and mounts; chart-made role
// ConfigMaps exist in both namespaces with '/' keys written as '__'.
func TestContent(t *testing.T) {
	w := setup(t)
	vf := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(vf, []byte(contentValues), 0o600); err != nil {
		t.Fatal(err)
	}
	objs := w.template(t, "-f", vf)
	dep := convert[appsv1.Deployment](t, find(objs, "Deployment", "kpssh", "kpssh"))
	spec := dep.Spec.Template.Spec
	ctr := spec.Containers[0]
	env := map[string]string{}
	for _, e := range ctr.Env {
		env[e.Name] = e.Value
	}
	const root = "/usr/share/kpssh/content"
	if got, want := env["KPSSH_ROLES_PATH"], root+"/roles:"+root+"/images/acme/roles"; got != want {
		t.Errorf("KPSSH_ROLES_PATH %q, want %q", got, want)
	}
	if got, want := env["KPSSH_COLLECTIONS_PATH"], root+"/images/acme/collections:"+root+"/images/old/collections"; got != want {
		t.Errorf("KPSSH_COLLECTIONS_PATH %q, want %q", got, want)
	}
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range ctr.VolumeMounts {
		mounts[m.Name] = m
	}
	for name, path := range map[string]string{"content-role-site-join": root + "/roles/site_join", "content-role-site-leave": root + "/roles/site_leave",
		"content-image-acme": root + "/images/acme", "content-image-old": root + "/images/old"} {
		if m, ok := mounts[name]; !ok || m.MountPath != path || !m.ReadOnly {
			t.Errorf("mount %s: %+v, want %s read-only", name, m, path)
		}
	}
	if mounts["content-image-acme"].SubPath != "content" {
		t.Errorf("image volume subPath %q, want content (sourcePath)", mounts["content-image-acme"].SubPath)
	}
	vols := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		vols[v.Name] = v
	}
	if v := vols["content-image-acme"]; v.Image == nil || v.Image.Reference != "registry.example/acme/kpssh-content:1.0.0" {
		t.Errorf("image volume %+v", v)
	}
	if v := vols["content-role-site-join"]; v.ConfigMap == nil || v.ConfigMap.Name != "kpssh-role-site-join" || len(v.ConfigMap.Items) != 3 ||
		v.ConfigMap.Items[1] != (corev1.KeyToPath{Key: "tasks__join.yml", Path: "tasks/join.yml"}) {
		t.Errorf("ConfigMap volume %+v", v.ConfigMap)
	}
	if v := vols["content-role-site-leave"]; v.ConfigMap == nil || v.ConfigMap.Name != "site-leave-role" {
		t.Errorf("existing ConfigMap volume %+v", v.ConfigMap)
	}
	// A missing ConfigMap (or key) must not keep the controller's pod from
	// starting: every profile would stop, not only the one of that role.
	for _, n := range []string{"content-role-site-join", "content-role-site-leave"} {
		if v := vols[n]; v.ConfigMap == nil || v.ConfigMap.Optional == nil || !*v.ConfigMap.Optional {
			t.Errorf("ConfigMap volume %s is not optional: %+v", n, v.ConfigMap)
		}
	}
	if len(spec.InitContainers) != 1 || spec.InitContainers[0].Name != "copy-old" || strings.Join(spec.InitContainers[0].Command, " ") != "cp -R /. /kpssh-content/" ||
		spec.InitContainers[0].SecurityContext == nil || *spec.InitContainers[0].SecurityContext.AllowPrivilegeEscalation {
		t.Errorf("copy init container %+v", spec.InitContainers)
	}
	for _, ns := range []string{"kpssh", "kpssh-jobs"} {
		cm := find(objs, "ConfigMap", ns, "kpssh-role-site-join")
		if cm == nil {
			t.Errorf("no role ConfigMap in %s", ns)
			continue
		}
		if data := convert[corev1.ConfigMap](t, cm).Data; data["tasks__join.yml"] != "- ansible.builtin.meta: noop\n" || len(data) != 3 {
			t.Errorf("ConfigMap %s data %v", ns, data)
		}
	}
	// The phase pods get the same: the controller's parser reads it.
	c, err := jobexec.ParseContent(env["KPSSH_JOB_CONTENT"])
	if err != nil {
		t.Fatalf("KPSSH_JOB_CONTENT: %v", err)
	}
	if len(c.Volumes) != 4 || len(c.VolumeMounts) != 4 || len(c.InitContainers) != 1 {
		t.Fatalf("KPSSH_JOB_CONTENT %+v", c)
	}
	for _, m := range c.VolumeMounts {
		if mounts[m.Name].MountPath != m.MountPath || mounts[m.Name].SubPath != m.SubPath {
			t.Errorf("phase pod mount %+v differs from the controller's %+v", m, mounts[m.Name])
		}
	}

	// executor local: no KPSSH_JOB_CONTENT, no ConfigMap in a Job namespace
	objs = w.template(t, "-f", vf, "--set", "executor=local")
	dep = convert[appsv1.Deployment](t, find(objs, "Deployment", "kpssh", "kpssh"))
	for _, e := range dep.Spec.Template.Spec.Containers[0].Env {
		if e.Name == "KPSSH_JOB_CONTENT" {
			t.Error("KPSSH_JOB_CONTENT with executor local")
		}
	}
	if find(objs, "ConfigMap", "kpssh-jobs", "kpssh-role-site-join") != nil {
		t.Error("a role ConfigMap in the Job namespace with executor local")
	}

	for set, want := range map[string]string{
		"content.roles[0].name=site_join":                                                     "needs files (path in the role: content) or configMap",
		"content.roles[0].name=x,content.roles[0].configMap=cm":                               "configMap cm needs paths",
		"content.roles[0].name=Bad-Name,content.roles[0].configMap=cm":                        "/content/roles/0/name",
		"content.roles[0].name=x,content.roles[0].configMap=cm,content.roles[0].paths={../x}": "must be a relative path inside the role without .. or __",
		"content.images[0].name=a":                                                            "missing property 'reference'",
		"content.images[0].name=a,content.images[0].reference=r,content.images[0].typo=1":     "additional properties 'typo' not allowed",
		"content.rolesPath={relative}":                                                        "/content/rolesPath/0",
		"content.images[0].name=tmp,content.images[0].reference=r,extraVolumes[0].name=content-image-tmp,extraVolumes[0].emptyDir.medium=Memory": "or a content volume",
	} {
		if _, stderr, code := w.run(t, "template", "kpssh", w.chart, "--kube-version", kubeVersion, "--set", set); code == 0 || !strings.Contains(stderr, want) {
			t.Errorf("--set %s: exit %d, stderr %q, want %q", set, code, stderr, want)
		}
	}
}
