// Package examples_test checks every manifest under examples/ (and
// examples/scripts, examples/sbc): each document decodes strictly into its
// kind, every SSHJoinProfile passes the validator the node class controller
// runs (profile.Validate, roles resolved in the shipped roles/), node classes
// name profiles that exist, and all of them are accepted by the real
// kube-apiserver with its CRDs (strict field validation).
package examples_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/yaml"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/engine"
	"github.com/dklesev/kpssh/internal/profile"
	"github.com/dklesev/kpssh/test/testenv"
)

// env is the real kube-apiserver shared by this package's tests (nil under -short).
var env *testenv.Env

func TestMain(m *testing.M) { os.Exit(testenv.RunMain(m, &env)) }

// doc is one YAML document of an example file.
type doc struct {
	file string
	raw  []byte
	obj  *unstructured.Unstructured
}

func (d doc) String() string { return d.file + ": " + d.obj.GetKind() + " " + d.obj.GetName() }

// exampleFiles lists the manifests: examples/*.yaml, examples/*/*.yaml
// (merge patches, *.patch.yaml, are no manifests: TestExamplesVerifyPatch).
func exampleFiles(t *testing.T) []string {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, pat := range []string{"*.yaml", "*/*.yaml"} {
		m, err := filepath.Glob(filepath.Join(root, "examples", pat))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range m {
			if !strings.HasSuffix(f, ".patch.yaml") {
				files = append(files, f)
			}
		}
	}
	sort.Strings(files)
	return files
}

func loadDocs(t *testing.T) []doc {
	t.Helper()
	var docs []doc
	for _, f := range exampleFiles(t) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		rel := f
		if i := strings.LastIndex(f, "/examples/"); i >= 0 {
			rel = f[i+1:]
		}
		r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
		for {
			raw, err := r.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", rel, err)
			}
			if len(bytes.TrimSpace(stripComments(raw))) == 0 {
				continue
			}
			u := &unstructured.Unstructured{}
			if err := yaml.Unmarshal(raw, &u.Object); err != nil {
				t.Fatalf("%s: %v", rel, err)
			}
			docs = append(docs, doc{file: rel, raw: raw, obj: u})
		}
	}
	return docs
}

func stripComments(b []byte) []byte {
	var out [][]byte
	for _, l := range bytes.Split(b, []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(l), []byte("#")) {
			out = append(out, l)
		}
	}
	return bytes.Join(out, []byte("\n"))
}

// strict decodes a document into its typed kind, failing on unknown fields.
func strict(t *testing.T, d doc) any {
	t.Helper()
	var into any
	switch d.obj.GetKind() {
	case "SSHJoinProfile":
		into = &v1beta1.SSHJoinProfile{}
	case "SSHNodeClass":
		into = &v1beta1.SSHNodeClass{}
	case "SSHHost":
		into = &v1beta1.SSHHost{}
	case "Secret":
		into = &corev1.Secret{}
	case "ClusterRoleBinding":
		into = &rbacv1.ClusterRoleBinding{}
	case "NodePool":
		into = &karpv1.NodePool{}
	default:
		t.Fatalf("%s: kind %s has no check here: add it", d, d.obj.GetKind())
	}
	if err := yaml.UnmarshalStrict(d.raw, into); err != nil {
		t.Fatalf("%s: %v", d, err)
	}
	return into
}

// TestExamplesValidate is the static half: strict decoding, the node class
// controller's profile validation, references between the examples.
func TestExamplesValidate(t *testing.T) {
	docs := loadDocs(t)
	roles, err := engine.FindRolesPath()
	if err != nil {
		t.Fatal(err)
	}
	coll, err := engine.FindCollectionsPath()
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(engine.Options{CollectionsPath: coll, RolesPath: []string{roles}, NoWarmRunner: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })

	profiles := map[string]*v1beta1.SSHJoinProfile{}
	kinds := map[string]int{}
	var classes []*v1beta1.SSHNodeClass
	var pools []*karpv1.NodePool
	secrets := map[string]bool{}
	for _, d := range docs {
		kinds[d.obj.GetKind()]++
		switch o := strict(t, d).(type) {
		case *v1beta1.SSHJoinProfile:
			if err := profile.Validate(o, e); err != nil {
				t.Errorf("%s: the node class controller would reject it (ProfileInvalid): %v", d, err)
			}
			if profiles[o.Name] != nil {
				t.Errorf("%s: a second profile named %s", d, o.Name)
			}
			profiles[o.Name] = o
		case *v1beta1.SSHNodeClass:
			classes = append(classes, o)
		case *v1beta1.SSHHost:
			if o.Namespace != "kpssh-system" {
				t.Errorf("%s: hosts live in the pool namespace kpssh-system, not %q", d, o.Namespace)
			}
		case *corev1.Secret:
			secrets[o.Namespace+"/"+o.Name] = true
			for k, v := range o.StringData {
				if strings.Contains(v, "PRIVATE KEY") || (k == "privateKey" && !strings.Contains(v, "REPLACE-ME")) {
					t.Errorf("%s: key %s must be a placeholder, never a key", d, k)
				}
			}
		case *karpv1.NodePool:
			pools = append(pools, o)
		}
	}
	for _, want := range []string{"tls-bootstrap", "nodeadm-ssm", "sbc", "tls-bootstrap-script", "nodeadm-ssm-script", "sbc-script"} {
		if profiles[want] == nil {
			t.Errorf("no example profile %s", want)
		}
	}
	for _, k := range []string{"SSHHost", "SSHNodeClass", "NodePool", "ClusterRoleBinding", "Secret"} {
		if kinds[k] == 0 {
			t.Errorf("no example %s", k)
		}
	}
	// The role twins use the roles, and a node class switching to one
	// changes joinProfileRef only.
	for role, name := range map[string]string{"tls_bootstrap": "tls-bootstrap", "nodeadm_ssm": "nodeadm-ssm", "sbc": "sbc"} {
		if p := profiles[name]; p != nil && (p.Spec.Ansible == nil || p.Spec.Ansible.Role != role) {
			t.Errorf("profile %s does not run role %s", name, role)
		}
	}
	for _, c := range classes {
		if profiles[c.Spec.JoinProfileRef.Name] == nil {
			t.Errorf("node class %s names profile %q, which no example defines", c.Name, c.Spec.JoinProfileRef.Name)
		}
		if r := c.Spec.JoinSecretRef; r != nil && !secrets["kpssh-system/"+r.Name] {
			t.Errorf("node class %s names joinSecretRef %q, which no example defines in kpssh-system", c.Name, r.Name)
		}
	}
	for _, p := range pools {
		if p.Spec.Template.Labels["karpenter.dklesev.github.io/managed"] == "" {
			t.Errorf("NodePool %s lacks the karpenter.dklesev.github.io/managed label", p.Name)
		}
		if p.Spec.Template.Spec.ExpireAfter.Duration != nil {
			t.Errorf("NodePool %s: expireAfter must be Never (the machines are not ephemeral)", p.Name)
		}
		ref := p.Spec.Template.Spec.NodeClassRef
		if ref == nil || ref.Group != v1beta1.SchemeGroupVersion.Group || ref.Kind != "SSHNodeClass" {
			t.Errorf("NodePool %s does not reference an SSHNodeClass: %+v", p.Name, ref)
			continue
		}
		found := false
		for _, c := range classes {
			found = found || c.Name == ref.Name
		}
		if !found {
			t.Errorf("NodePool %s names node class %q, which no example defines", p.Name, ref.Name)
		}
	}
}

// TestExamplesVerifyPatch: the verify merge patch of the script profiles
// (examples/scripts/verify-kubelet-healthz.patch.yaml) applied to
// tls-bootstrap-script and sbc-script gives a profile with a verify phase
// that the node class controller accepts: valid, install + join + verify
// within the registration window. nodeadm-ssm-script's longer join does not
// fit, as the patch's comment says.
func TestExamplesVerifyPatch(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(root, "examples/scripts/verify-kubelet-healthz.patch.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	patch, err := yaml.YAMLToJSON(raw)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, d := range loadDocs(t) {
		p, ok := strict(t, d).(*v1beta1.SSHJoinProfile)
		if !ok || p.Spec.Scripts == nil {
			continue
		}
		n++
		orig, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		merged, err := strategicpatch.StrategicMergePatch(orig, patch, v1beta1.SSHJoinProfile{})
		if err != nil {
			t.Fatalf("%s: %v", d, err)
		}
		out := &v1beta1.SSHJoinProfile{}
		if err := json.Unmarshal(merged, out); err != nil {
			t.Fatal(err)
		}
		if !profile.Verifies(out, nil) || out.Spec.Scripts.Join != p.Spec.Scripts.Join {
			t.Errorf("%s patched: verify %q, join changed %v", d, out.Spec.Scripts.Verify, out.Spec.Scripts.Join != p.Spec.Scripts.Join)
		}
		c := profile.CheckClass(out, nil, nil)
		if fits := p.Name != "nodeadm-ssm-script"; fits != c.OK() || (!fits && !strings.Contains(c.Message, "+ verify 2m")) {
			t.Errorf("%s patched with the verify example: %q %q, want it to fit: %v", d, c.Reason, c.Message, fits)
		}
	}
	if n < 3 {
		t.Fatalf("%d script profiles patched, want the three of examples/scripts", n)
	}
}

// TestExamplesApply creates every example in the real apiserver with strict
// field validation (CRD schemas, CEL rules, defaults).
func TestExamplesApply(t *testing.T) {
	if env == nil {
		t.Skip("-short: needs the kube-apiserver (make test runs it)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kpssh-system"}}
	if err := env.Client.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	for _, d := range loadDocs(t) {
		u := d.obj.DeepCopy()
		if err := env.Client.Create(ctx, u, &client.CreateOptions{FieldValidation: metav1.FieldValidationStrict}); err != nil {
			t.Errorf("%s: the apiserver rejects it: %v", d, err)
			continue
		}
		// Read it back: what the apiserver stored (defaults applied) still
		// decodes into our types.
		got := &unstructured.Unstructured{}
		got.SetGroupVersionKind(u.GroupVersionKind())
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(u), got); err != nil {
			t.Errorf("%s: %v", d, err)
		}
		if got.GetKind() == "SSHJoinProfile" {
			var p v1beta1.SSHJoinProfile
			if err := runtimeConvert(got, &p); err != nil {
				t.Errorf("%s: stored object: %v", d, err)
			} else if p.Spec.Version == "" || p.Spec.Timeouts.Leave == "" {
				t.Errorf("%s: stored without version/timeouts defaults: %+v", d, p.Spec)
			}
		}
	}
}

func runtimeConvert(u *unstructured.Unstructured, into any) error {
	b, err := u.MarshalJSON()
	if err != nil {
		return err
	}
	return yaml.Unmarshal(b, into)
}
