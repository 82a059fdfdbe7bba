package jobexec

import (
	"strings"
	"testing"
)

func TestParseContent(t *testing.T) {
	ok := `{"volumes":[{"name":"content-a","configMap":{"name":"a"}}],"volumeMounts":[{"name":"content-a","mountPath":"/usr/share/kpssh/content/roles/a"}]}`
	c, err := ParseContent(ok)
	if err != nil || len(c.Volumes) != 1 || !c.VolumeMounts[0].ReadOnly {
		t.Fatalf("%+v %v (mounts must come out read-only)", c, err)
	}
	if c, err := ParseContent(""); err != nil || len(c.Volumes) != 0 {
		t.Fatalf("empty: %+v %v", c, err)
	}
	for in, want := range map[string]string{
		`{"volume":[]}`: "unknown field",
		`[`:             "not the JSON",
		`{"volumes":[{"name":"input","emptyDir":{}}]}`:                                                  `"input" is taken`,
		`{"volumes":[{"name":"Bad_Name","emptyDir":{}}]}`:                                               `volume name "Bad_Name"`,
		`{"volumeMounts":[{"name":"x","mountPath":"/a"}]}`:                                              "names no volume",
		`{"volumes":[{"name":"x","emptyDir":{}}],"volumeMounts":[{"name":"x","mountPath":"a/b"}]}`:      "not a clean absolute path",
		`{"volumes":[{"name":"x","emptyDir":{}}],"volumeMounts":[{"name":"x","mountPath":"/tmp/x"}]}`:   "overlaps the phase pod's own /tmp",
		`{"volumes":[{"name":"x","emptyDir":{}}],"volumeMounts":[{"name":"x","mountPath":"/var/run"}]}`: "overlaps the phase pod's own " + InputDir,
		`{"initContainers":[{"name":"phase","image":"x"}]}`:                                             "another name",
		// /var/run is /run in the image
		`{"volumes":[{"name":"x","emptyDir":{}}],"volumeMounts":[{"name":"x","mountPath":"/run/kpssh"}]}`: "overlaps the phase pod's own " + InputDir,
		`{"volumes":[{"name":"x","emptyDir":{}}],"volumeMounts":[{"name":"x","mountPath":"/run"}]}`:       "overlaps the phase pod's own " + InputDir,
	} {
		if _, err := ParseContent(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", in, err, want)
		}
	}
}

func TestJobCarriesContent(t *testing.T) {
	c, err := ParseContent(`{"volumes":[{"name":"content-a","image":{"reference":"localhost/c:1"}}],"volumeMounts":[{"name":"content-a","mountPath":"/c/a"}],
		"initContainers":[{"name":"copy","image":"localhost/c:1","command":["cp","-a","/content/.","/c/b/"]}]}`)
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(newFake(t), Options{Namespace: ns, Image: "localhost/kpssh-controller:dev", Content: c, RolesPath: []string{"/c/a/roles"}, CollectionsPaths: []string{"/c/a/collections", "/c/b"}})
	if err != nil {
		t.Fatal(err)
	}
	spec := e.jobFor("kpssh-join-x", request(), strings.Repeat("0", 64)).Spec.Template.Spec
	last := spec.Volumes[len(spec.Volumes)-1]
	ctr := spec.Containers[0]
	m := ctr.VolumeMounts[len(ctr.VolumeMounts)-1]
	if last.Name != "content-a" || last.Image == nil || m.MountPath != "/c/a" || !m.ReadOnly || len(spec.InitContainers) != 1 {
		t.Fatalf("content not in the pod: volumes %+v mounts %+v init %+v", spec.Volumes, ctr.VolumeMounts, spec.InitContainers)
	}
	env := map[string]string{}
	for _, v := range ctr.Env {
		env[v.Name] = v.Value
	}
	if env[EnvRolesPath] != "/c/a/roles" || env[EnvCollectionsPath] != "/c/a/collections:/c/b" {
		t.Fatalf("env %v", env)
	}
}

// TestContentConfigMapsOptional: every phase pod mounts all of the operator
// content, so one ConfigMap or Secret that is missing (deleted, or never
// made in the Job namespace) or lacks a listed key would hold the phase pods
// of every profile at ContainerCreating until their deadline. Optional, the
// pod starts without it: only the profile whose role was there fails (its
// role is not found), the others run.
func TestContentConfigMapsOptional(t *testing.T) {
	c, err := ParseContent(`{"volumes":[
		{"name":"cm","configMap":{"name":"a","items":[{"key":"tasks__join.yml","path":"tasks/join.yml"}]}},
		{"name":"sec","secret":{"secretName":"b"}},
		{"name":"proj","projected":{"sources":[{"configMap":{"name":"c"}},{"secret":{"name":"d"}}]}},
		{"name":"img","image":{"reference":"localhost/c:1"}}],
		"volumeMounts":[{"name":"cm","mountPath":"/c/a"},{"name":"sec","mountPath":"/c/b"},{"name":"proj","mountPath":"/c/c"},{"name":"img","mountPath":"/c/d"}]}`)
	if err != nil {
		t.Fatal(err)
	}
	v := c.Volumes
	for what, opt := range map[string]*bool{
		"configMap": v[0].ConfigMap.Optional, "secret": v[1].Secret.Optional,
		"projected configMap": v[2].Projected.Sources[0].ConfigMap.Optional, "projected secret": v[2].Projected.Sources[1].Secret.Optional,
	} {
		if opt == nil || !*opt {
			t.Errorf("%s content volume not optional: a missing one would stop every phase pod", what)
		}
	}
}
