package chart

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpapis "sigs.k8s.io/karpenter/pkg/apis"
	"sigs.k8s.io/yaml"

	"github.com/dklesev/kpssh/test/testenv"
)

// keep is the annotation that makes helm leave an object on uninstall and
// when an upgrade drops it from the release.
const keep = "helm.sh/resource-policy"

// TestChartCRDs: crds/ holds exactly kpssh's generated CRDs and
// karpenter-crds/ exactly Karpenter core's (make chart-crds copies both).
func TestChartCRDs(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	ours, err := testenv.OurCRDs()
	if err != nil {
		t.Fatal(err)
	}
	for dir, want := range map[string][]*apiextensionsv1.CustomResourceDefinition{"crds": ours, "karpenter-crds": karpapis.CRDs} {
		chart := readCRDs(t, filepath.Join(root, "charts", "kpssh", dir))
		sameCRDs(t, dir, chart, want)
	}
}

// TestChartKarpenterCRDs: with karpenterCRDs.install (the default) the chart
// renders Karpenter core's CRDs as they are plus the keep annotation and
// the release's labels; off, none. Lint passes both ways.
func TestChartKarpenterCRDs(t *testing.T) {
	w := setup(t)
	off := []string{"--set", "karpenterCRDs.install=false"}
	for _, extra := range [][]string{nil, off} {
		args := append([]string{"lint", "--strict", w.chart, "--kube-version", kubeVersion}, extra...)
		if out, stderr, code := w.run(t, args...); code != 0 || !strings.Contains(out, "1 chart(s) linted, 0 chart(s) failed") {
			t.Errorf("helm lint %q: exit %d\n%s%s", extra, code, out, stderr)
		}
	}
	rendered := map[string]*apiextensionsv1.CustomResourceDefinition{}
	for _, o := range w.template(t, "--set", "additionalLabels.team=platform,additionalAnnotations.owner=platform") {
		if o.GetKind() != "CustomResourceDefinition" {
			continue
		}
		crd := convert[apiextensionsv1.CustomResourceDefinition](t, o)
		rendered[crd.Name] = crd
		if crd.Annotations[keep] != "keep" || crd.Annotations["owner"] != "platform" || crd.Annotations["controller-gen.kubebuilder.io/version"] == "" {
			t.Errorf("%s annotations %v", crd.Name, crd.Annotations)
		}
		if crd.Labels["app.kubernetes.io/instance"] != "kpssh" || crd.Labels["app.kubernetes.io/managed-by"] != "Helm" || crd.Labels["team"] != "platform" {
			t.Errorf("%s labels %v", crd.Name, crd.Labels)
		}
	}
	sameCRDs(t, "rendered", rendered, karpapis.CRDs)
	if n := kinds(w.template(t, off...))["CustomResourceDefinition"]; n != 0 {
		t.Errorf("karpenterCRDs.install=false renders %d CRDs", n)
	}
}

// TestHelmInstallKarpenterCRDs installs onto a real kube-apiserver that has
// no CRDs: with karpenterCRDs.install=false only kpssh's CRDs appear; by
// default Karpenter's too, kept by helm uninstall; with Karpenter's CRDs
// already there from outside the release the install is refused with the
// message docs/installation.md shows, install=false then uses them untouched,
// and the documented hand-over makes them the release's.
func TestHelmInstallKarpenterCRDs(t *testing.T) {
	w := setup(t)
	k := startCluster(t)
	cl, ctx := k.cl, context.Background()
	helm := func(args ...string) (string, string, int) {
		t.Helper()
		args = append(args, "--kubeconfig", k.kubeconfig, "--namespace", "kpssh")
		if args[0] != "get" {
			args = append(args, "--timeout", "2m")
		}
		return w.run(t, args...)
	}
	mustHelm := func(args ...string) string {
		t.Helper()
		out, stderr, code := helm(args...)
		if code != 0 {
			t.Fatalf("helm %q: exit %d\n%s%s", args, code, out, stderr)
		}
		return out
	}
	ours, err := testenv.OurCRDs()
	if err != nil {
		t.Fatal(err)
	}
	// karpenterCRDs returns the cluster's Karpenter core CRDs by name.
	karpenterCRDs := func() map[string]*apiextensionsv1.CustomResourceDefinition {
		t.Helper()
		var l apiextensionsv1.CustomResourceDefinitionList
		if err := cl.List(ctx, &l); err != nil {
			t.Fatal(err)
		}
		m := map[string]*apiextensionsv1.CustomResourceDefinition{}
		for i := range l.Items {
			if g := l.Items[i].Spec.Group; g == "karpenter.sh" || g == "autoscaling.x-k8s.io" {
				m[l.Items[i].Name] = &l.Items[i]
			}
		}
		return m
	}
	// released checks the release's manifest: n objects, every one in the apiserver.
	released := func(what string, n int) {
		t.Helper()
		objs := decodeAll(t, mustHelm("get", "manifest", "kpssh"))
		if len(objs) != n {
			t.Errorf("%s: %d objects in the release manifest, want %d: %v", what, len(objs), n, kinds(objs))
		}
		for _, o := range objs {
			if err := cl.Get(ctx, client.ObjectKeyFromObject(o), o.DeepCopy()); err != nil {
				t.Errorf("%s: %s %s not in the apiserver: %v", what, o.GetKind(), o.GetName(), err)
			}
		}
	}
	uninstall := func() string {
		t.Helper()
		out := mustHelm("uninstall", "kpssh", "--wait")
		if err := cl.Get(ctx, client.ObjectKey{Namespace: "kpssh", Name: "kpssh"}, &appsv1.Deployment{}); !apierrors.IsNotFound(err) {
			t.Errorf("Deployment after uninstall: %v", err)
		}
		return out
	}

	// 1. install=false: kpssh's CRDs only; NOTES says Karpenter's are missing.
	out := mustHelm("install", "kpssh", w.chart, "--set", "karpenterCRDs.install=false")
	if !strings.Contains(out, "Karpenter core's CRDs are the cluster's own") || !strings.Contains(out, "Missing now: nodepools.karpenter.sh, nodeclaims.karpenter.sh.") {
		t.Errorf("NOTES of install=false on a cluster without Karpenter:\n%s", out)
	}
	for _, c := range ours {
		waitEstablished(t, cl, c.Name)
	}
	if got := karpenterCRDs(); len(got) != 0 {
		t.Errorf("install=false created %d Karpenter CRDs", len(got))
	}
	released("install=false", 15) // SA, ClusterRole(Binding), 5 Roles + Bindings, Deployment, Service
	uninstall()

	// 2. The default: Karpenter's CRDs created as release objects with keep;
	// uninstall leaves them and kpssh's; a reinstall takes them back.
	out = mustHelm("install", "kpssh", w.chart)
	if strings.Contains(out, "Karpenter core's CRDs are the cluster's own") {
		t.Errorf("NOTES of the default install:\n%s", out)
	}
	for _, c := range karpapis.CRDs {
		waitEstablished(t, cl, c.Name)
	}
	got := karpenterCRDs()
	for _, c := range karpapis.CRDs {
		if a := got[c.Name].Annotations; a[keep] != "keep" || a["meta.helm.sh/release-name"] != "kpssh" || a["meta.helm.sh/release-namespace"] != "kpssh" {
			t.Errorf("%s annotations %v", c.Name, a)
		}
	}
	released("default", 19)
	out = uninstall()
	if !strings.Contains(out, "These resources were kept due to the resource policy") {
		t.Errorf("helm uninstall output:\n%s", out)
	}
	for _, c := range append(append([]*apiextensionsv1.CustomResourceDefinition{}, ours...), karpapis.CRDs...) {
		var crd apiextensionsv1.CustomResourceDefinition
		if err := cl.Get(ctx, client.ObjectKey{Name: c.Name}, &crd); err != nil || crd.DeletionTimestamp != nil {
			t.Errorf("CRD %s after uninstall: %v (deleting %v)", c.Name, err, crd.DeletionTimestamp)
		}
	}
	// Another release is refused them, naming their owner.
	if _, stderr, code := helm("install", "other", w.chart); code == 0 || !strings.Contains(stderr, "already exists and it belongs to Helm release kpssh/kpssh; set karpenterCRDs.install=false") {
		t.Errorf("install of a second release: exit %d\n%s", code, stderr)
	}
	mustHelm("install", "kpssh", w.chart)
	released("reinstall", 19)
	uninstall()

	// 3. Karpenter's CRDs from outside the release (as another Karpenter
	// installs them): the default install is refused and creates nothing.
	for _, c := range karpapis.CRDs {
		if err := cl.Delete(ctx, &apiextensionsv1.CustomResourceDefinition{ObjectMeta: c.ObjectMeta}); err != nil {
			t.Fatal(err)
		}
	}
	// The apiserver's CRD finalizer removes them; on a loaded machine (make
	// test runs the e2e beside this) that took longer than 2m once in CI.
	start := time.Now()
	eventuallyWithin(t, "Karpenter CRDs deleted", 6*time.Minute, func() (bool, error) {
		left := karpenterCRDs()
		var s []string
		for name, crd := range left {
			st := "not deleting"
			if crd.DeletionTimestamp != nil {
				st = fmt.Sprintf("deleting since %v, finalizers %v", crd.DeletionTimestamp.Time.Format(time.TimeOnly), crd.Finalizers)
			}
			for _, c := range crd.Status.Conditions {
				if c.Type == apiextensionsv1.Terminating {
					st += fmt.Sprintf(", Terminating %s %s: %s", c.Status, c.Reason, c.Message)
				}
			}
			s = append(s, name+" "+st)
		}
		sort.Strings(s)
		return len(left) == 0, errors.New(strings.Join(s, "; "))
	})
	t.Logf("Karpenter CRDs deleted in %v", time.Since(start).Round(100*time.Millisecond))
	for _, c := range karpapis.CRDs {
		if err := cl.Create(ctx, c.DeepCopy()); err != nil {
			t.Fatal(err)
		}
		waitEstablished(t, cl, c.Name)
	}
	before := karpenterCRDs()
	const refusal = "karpenterCRDs.install: CustomResourceDefinition capacitybuffers.autoscaling.x-k8s.io already exists and it was not created by this release (another Karpenter, kubectl apply, or an older kpssh chart); set karpenterCRDs.install=false to use the cluster's Karpenter CRDs as they are"
	if _, stderr, code := helm("install", "kpssh", w.chart); code == 0 || !strings.Contains(stderr, refusal) {
		t.Errorf("default install over foreign Karpenter CRDs: exit %d\n%s\nwant it to contain %q", code, stderr, refusal)
	} else {
		t.Logf("refused: %s", stderr)
	}
	if err := cl.Get(ctx, client.ObjectKey{Namespace: "kpssh", Name: "kpssh"}, &appsv1.Deployment{}); !apierrors.IsNotFound(err) {
		t.Errorf("Deployment after a refused install: %v", err)
	}
	// install=false uses them untouched.
	mustHelm("install", "kpssh", w.chart, "--set", "karpenterCRDs.install=false")
	released("install=false over foreign CRDs", 15)
	for name, crd := range karpenterCRDs() {
		if crd.ResourceVersion != before[name].ResourceVersion || crd.Annotations[keep] != "" {
			t.Errorf("install=false touched %s (resourceVersion %s → %s, annotations %v)", name, before[name].ResourceVersion, crd.ResourceVersion, crd.Annotations)
		}
	}
	// The hand-over of docs/installation.md (kubectl label/annotate), then
	// an upgrade with the value on makes them the release's.
	for _, c := range karpapis.CRDs {
		patch := `{"metadata":{"labels":{"app.kubernetes.io/managed-by":"Helm"},"annotations":{"meta.helm.sh/release-name":"kpssh","meta.helm.sh/release-namespace":"kpssh"}}}`
		if err := cl.Patch(ctx, &apiextensionsv1.CustomResourceDefinition{ObjectMeta: c.ObjectMeta}, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
			t.Fatal(err)
		}
	}
	mustHelm("upgrade", "kpssh", w.chart, "--reuse-values", "--set", "karpenterCRDs.install=true")
	released("after the hand-over", 19)
	for name, crd := range karpenterCRDs() {
		if crd.Annotations[keep] != "keep" {
			t.Errorf("%s after the hand-over: annotations %v", name, crd.Annotations)
		}
	}
	// Turning the value off again drops them from the release, not from the cluster.
	mustHelm("upgrade", "kpssh", w.chart, "--reuse-values", "--set", "karpenterCRDs.install=false")
	released("switched off", 15)
	if got := karpenterCRDs(); len(got) != len(karpapis.CRDs) {
		t.Errorf("%d Karpenter CRDs after switching install off, want %d", len(got), len(karpapis.CRDs))
	}
	for name, crd := range karpenterCRDs() {
		if crd.DeletionTimestamp != nil {
			t.Errorf("%s is being deleted after switching install off", name)
		}
	}
	uninstall()
}

// readCRDs decodes (strictly) every file of dir, by CRD name.
func readCRDs(t *testing.T, dir string) map[string]*apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]*apiextensionsv1.CustomResourceDefinition{}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.UnmarshalStrict(b, crd); err != nil {
			t.Fatalf("%s: %v", e.Name(), err)
		}
		m[crd.Name] = crd
	}
	return m
}

// sameCRDs: got holds exactly want's CRDs, specs equal.
func sameCRDs(t *testing.T, what string, got map[string]*apiextensionsv1.CustomResourceDefinition, want []*apiextensionsv1.CustomResourceDefinition) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: %d CRDs, want %d (run make chart-crds)", what, len(got), len(want))
	}
	for _, w := range want {
		g, ok := got[w.Name]
		if !ok {
			t.Errorf("%s lacks CRD %s (run make chart-crds)", what, w.Name)
			continue
		}
		if !equality.Semantic.DeepEqual(g.Spec, w.Spec) {
			t.Errorf("%s: CRD %s differs from the generated one (run make chart-crds)", what, w.Name)
		}
	}
}
