package nodeclass_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/cli"
	"github.com/dklesev/kpssh/internal/engine"
)

// TestValidateSaysWhatTheControllerSays: a profile naming a role that is
// in no content source makes the node class Ready=False/ProfileInvalid on
// the real apiserver, and `kpssh validate` of the same objects, with the
// controller's content (the shipped roles, then an operator roles
// directory), prints exactly the condition's message.
func TestValidateSaysWhatTheControllerSays(t *testing.T) {
	if env == nil {
		t.Skip("envtest: skipped under -short (needs kube-apiserver and etcd)")
	}
	suffix = "-" + strconv.FormatInt(time.Now().UnixNano()%1_000_000_007, 36)
	pool = "kpssh-nc-validate" + suffix
	create(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: pool}})
	coll, err := engine.FindCollectionsPath()
	if err != nil {
		t.Fatal(err)
	}
	shipped, err := engine.FindRolesPath()
	if err != nil {
		t.Fatal(err)
	}
	content := t.TempDir()
	// What the operator wires (internal/operator): the shipped roles first.
	e, err := engine.New(engine.Options{CollectionsPath: coll, RolesPath: []string{shipped, content}, RunDirBase: t.TempDir(), NoWarmRunner: true})
	if err != nil {
		t.Fatal(err)
	}
	startControllerWith(t, e)
	create(t, host(n("h"), nil))
	p := &v1beta1.SSHJoinProfile{ObjectMeta: metav1.ObjectMeta{Name: n("nowhere")}, Spec: v1beta1.SSHJoinProfileSpec{Ansible: &v1beta1.AnsibleSource{Role: "not_anywhere"}}}
	nc := class(n("nowhere"), p.Name, nil)
	create(t, p)
	create(t, nc)
	got := waitReady(t, nc.Name, metav1.ConditionFalse, v1beta1.ReasonProfileInvalid, "role not_anywhere not found")
	cond := got.StatusConditions().Get(v1beta1.ConditionReady)

	dir := t.TempDir()
	file := func(name string, o client.Object, kind string) string {
		o.GetObjectKind().SetGroupVersionKind(v1beta1.SchemeGroupVersion.WithKind(kind))
		o.SetResourceVersion("")
		b, err := yaml.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		f := filepath.Join(dir, name)
		if err := os.WriteFile(f, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return f
	}
	fresh := &v1beta1.SSHJoinProfile{}
	if err := env.Client.Get(context.Background(), client.ObjectKey{Name: p.Name}, fresh); err != nil {
		t.Fatal(err)
	}
	pf, cf := file("p.yaml", fresh, "SSHJoinProfile"), file("c.yaml", got.DeepCopy(), "SSHNodeClass")
	var out, errb bytes.Buffer
	rc := cli.Validate(context.Background(), []string{pf, "--class", cf, "--content", content}, &out, &errb)
	want := "kpssh validate: SSHNodeClass " + nc.Name + ": " + v1beta1.ReasonProfileInvalid + ": " + cond.Message + "\n"
	if rc != cli.ExitInvalid || errb.String() != want {
		t.Fatalf("kpssh validate: exit %d\nstderr %q\nwant   %q", rc, errb.String(), want)
	}
	if !strings.Contains(cond.Message, "install: role not_anywhere not found") {
		t.Fatalf("condition %q", cond.Message)
	}
	t.Logf("controller and kpssh validate: %s", cond.Message)
}
