package options

import (
	"strings"
	"testing"
	"time"

	"github.com/dklesev/kpssh/internal/cloudprovider"
)

func TestValidateExecutor(t *testing.T) {
	base := func() Options {
		return Options{PoolNamespace: "kpssh-system", ProbeInterval: time.Minute, ProbeTimeout: time.Second, ProbeConcurrency: 1, Executor: ExecutorLocal,
			JobImagePullPolicy: "IfNotPresent", JobTTL: 15 * time.Minute, JobMemoryLimit: "512Mi", Repair: cloudprovider.DefaultRepair}
	}
	job := func(f func(*Options)) Options {
		o := base()
		o.Executor, o.JobNamespace, o.JobImage = ExecutorJob, "kpssh", "localhost/kpssh-controller:dev"
		if f != nil {
			f(&o)
		}
		return o
	}
	cases := []struct {
		name string
		o    Options
		want string // "" = valid
	}{
		{"local", base(), ""},
		{"local ignores job settings", func() Options { o := base(); o.JobImage = ""; return o }(), ""},
		{"job", job(nil), ""},
		{"unknown executor", func() Options { o := base(); o.Executor = "ssh"; return o }(), `executor "ssh" is unknown (local, job)`},
		{"job without namespace", job(func(o *Options) { o.JobNamespace = "" }), "needs job-namespace (JOB_NAMESPACE)"},
		{"job bad namespace", job(func(o *Options) { o.JobNamespace = "Bad_NS" }), `job-namespace "Bad_NS"`},
		{"job without image", job(func(o *Options) { o.JobImage = "" }), "needs job-image (JOB_IMAGE)"},
		{"job image with a space", job(func(o *Options) { o.JobImage = "a b" }), "not an image reference"},
		{"job pull policy", job(func(o *Options) { o.JobImagePullPolicy = "Sometimes" }), "job-image-pull-policy"},
		{"job ttl", job(func(o *Options) { o.JobTTL = 0 }), "job-ttl 0s is below 1s"},
		{"job memory", job(func(o *Options) { o.JobMemoryLimit = "lots" }), `job-memory-limit "lots"`},
		{"job memory zero", job(func(o *Options) { o.JobMemoryLimit = "0" }), `job-memory-limit "0"`},
		{"job node selector", job(func(o *Options) { o.JobNodeSelector = "kubernetes.io/hostname=h1, pool=a" }), ""},
		{"job node selector not k=v", job(func(o *Options) { o.JobNodeSelector = "h1" }), `"h1" is not key=value`},
		{"job node selector bad key", job(func(o *Options) { o.JobNodeSelector = "bad key=x" }), "job-node-selector bad key=x"},
		{"job node selector twice", job(func(o *Options) { o.JobNodeSelector = "a=1,a=2" }), "a given twice"},
		{"repair without reboot", func() Options { o := base(); o.Repair.RebootAfter = 0; return o }(), ""},
		{"repair replaces before it reboots", func() Options { o := base(); o.Repair.ReplaceAfter = o.Repair.RebootAfter; return o }(), "must exceed reboot-after"},
		{"content paths", func() Options { o := base(); o.RolesPath, o.CollectionsPath = "/a:/b", "/c"; return o }(), ""},
		{"relative roles path", func() Options { o := base(); o.RolesPath = "/a:roles"; return o }(), `roles-path: "roles" is not an absolute path`},
		{"relative collections path", func() Options { o := base(); o.CollectionsPath = "c"; return o }(), `collections-path: "c" is not an absolute path`},
		{"job content", job(func(o *Options) {
			o.JobContent = `{"volumes":[{"name":"c","configMap":{"name":"c"}}],"volumeMounts":[{"name":"c","mountPath":"/c"}]}`
		}), ""},
		{"job content bad", job(func(o *Options) { o.JobContent = `{"volumeMounts":[{"name":"c","mountPath":"/c"}]}` }), "job content: volumeMount /c names no volume"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.o.Validate()
			if c.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err %v, want %q", err, c.want)
			}
		})
	}
}

func TestNodeSelector(t *testing.T) {
	o := Options{JobNodeSelector: " kubernetes.io/hostname=h1 ,pool=a"}
	m, err := o.NodeSelector()
	if err != nil || len(m) != 2 || m["kubernetes.io/hostname"] != "h1" || m["pool"] != "a" {
		t.Fatalf("%v %v", m, err)
	}
	if m, err := (&Options{}).NodeSelector(); m != nil || err != nil {
		t.Fatalf("empty: %v %v", m, err)
	}
}
