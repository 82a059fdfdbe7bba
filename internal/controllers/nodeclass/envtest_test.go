package nodeclass_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/controllers/nodeclass"
	"github.com/dklesev/kpssh/internal/engine"
	"github.com/dklesev/kpssh/internal/profile"
	"github.com/dklesev/kpssh/test/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { os.Exit(testenv.RunMain(m, &env)) }

// pool and every object name carry a per-run suffix so -count=N runs do not
// collide in the shared apiserver.
var suffix, pool string

func n(name string) string { return name + suffix }

// Content sources of the real engine: the "shipped" roles (one complete
// role, complete_role, and shipped_role), then an operator roles directory
// and an operator collections directory, filled by the tests.
var shippedRoles, opRoles, opColls string

// writeRole writes a role whose phases are no-ops under dir/name.
func writeRole(t *testing.T, dir, name string) {
	t.Helper()
	for _, ph := range []string{"install", "join", "leave"} {
		d := filepath.Join(dir, name, "tasks")
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, ph+".yml"), []byte("- ansible.builtin.meta: noop\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// realEngine is the engine's real role resolution over those sources.
func realEngine(t *testing.T) *engine.Local {
	t.Helper()
	coll, err := engine.FindCollectionsPath()
	if err != nil {
		t.Fatal(err)
	}
	shippedRoles, opRoles, opColls = t.TempDir(), t.TempDir(), t.TempDir()
	writeRole(t, shippedRoles, "complete_role")
	writeRole(t, shippedRoles, "shipped_role")
	e, err := engine.New(engine.Options{CollectionsPath: coll, RolesPath: []string{shippedRoles, opRoles}, ExtraCollectionsPaths: []string{opColls}, RunDirBase: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// startController runs the node class controller in a manager against the
// real apiserver until the test ends.
func startController(t *testing.T) { t.Helper(); startControllerWith(t, realEngine(t)) }

// startControllerWith is startController with the given role resolution.
func startControllerWith(t *testing.T, roles profile.RoleValidator) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	mgr, err := manager.New(env.Config, manager.Options{Scheme: env.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		// -count=N starts the controller once per run in one process.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)}})
	if err != nil {
		t.Fatal(err)
	}
	c := nodeclass.New(mgr.GetClient(), roles, pool, clock.RealClock{})
	c.ContentRecheck = time.Second // content fixes are seen without an API event
	if err := c.Register(ctx, mgr); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = mgr.Start(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

func eventually(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(45 * time.Second) // generous: the machine is shared
	var last string
	for time.Now().Before(deadline) {
		ok, s := cond()
		if ok {
			return
		}
		last = s
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s; last: %s", what, last)
}

func create(t *testing.T, o client.Object) {
	t.Helper()
	if err := env.Client.Create(context.Background(), o); err != nil {
		t.Fatalf("create %T %s: %v", o, o.GetName(), err)
	}
}

func waitReady(t *testing.T, name string, want metav1.ConditionStatus, reason, msg string) *v1beta1.SSHNodeClass {
	t.Helper()
	nc := &v1beta1.SSHNodeClass{}
	eventually(t, fmt.Sprintf("%s Ready=%s/%s", name, want, reason), func() (bool, string) {
		if err := env.Client.Get(context.Background(), client.ObjectKey{Name: name}, nc); err != nil {
			return false, err.Error()
		}
		for _, c := range nc.Status.Conditions {
			if c.Type == v1beta1.ConditionReady {
				return c.Status == want && c.Reason == reason && strings.Contains(c.Message, msg),
					fmt.Sprintf("%s/%s %q", c.Status, c.Reason, c.Message)
			}
		}
		return false, "no Ready condition"
	})
	return nc
}

// waitEvent waits for an event on the class (cluster-scoped objects' events
// live in the default namespace).
func waitEvent(t *testing.T, class, reason, msg string) {
	t.Helper()
	eventually(t, fmt.Sprintf("event %s on %s", reason, class), func() (bool, string) {
		list := &corev1.EventList{}
		if err := env.Client.List(context.Background(), list, client.InNamespace(metav1.NamespaceDefault)); err != nil {
			return false, err.Error()
		}
		var seen []string
		for _, e := range list.Items {
			if e.InvolvedObject.Name == class && e.InvolvedObject.Kind == nodeclass.Kind {
				if e.Reason == reason && strings.Contains(e.Message, msg) {
					return true, ""
				}
				seen = append(seen, e.Reason)
			}
		}
		return false, fmt.Sprintf("events %v", seen)
	})
}

func class(name, prof string, sel *metav1.LabelSelector) *v1beta1.SSHNodeClass {
	return &v1beta1.SSHNodeClass{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1beta1.SSHNodeClassSpec{JoinProfileRef: v1beta1.ObjectReference{Name: prof}, HostSelector: sel}}
}

func scripts(name, leave string) *v1beta1.SSHJoinProfile {
	return &v1beta1.SSHJoinProfile{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1beta1.SSHJoinProfileSpec{
		Scripts: &v1beta1.ProfileScripts{Install: "echo install", Join: "echo join {{ .Vars.k8sMinor }}", Leave: v1beta1.Script(leave)}}}
}

func host(name string, labels map[string]string) *v1beta1.SSHHost {
	return &v1beta1.SSHHost{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: pool, Labels: labels},
		Spec: v1beta1.SSHHostSpec{Address: "192.0.2.10", SSHKeySecretRef: v1beta1.LocalObjectReference{Name: "k"},
			Capacity: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("1Gi")}}}
}

const goodLeave = "systemctl disable --now kubelet containerd"

func TestNodeClassAgainstAPIServer(t *testing.T) {
	if env == nil {
		t.Skip("envtest: skipped under -short (needs kube-apiserver and etcd)")
	}
	ctx := context.Background()
	suffix = "-" + strconv.FormatInt(time.Now().UnixNano()%1_000_000_007, 36)
	pool = "kpssh-nc-envtest" + suffix
	create(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: pool}})
	startController(t)
	classSel := func(c string) *metav1.LabelSelector {
		return &metav1.LabelSelector{MatchLabels: map[string]string{v1beta1.LabelHostClass: c}}
	}
	create(t, host(n("h-x86"), map[string]string{v1beta1.LabelHostClass: "x86"}))

	t.Run("signed script without set -euo pipefail is a warning, not ProfileInvalid", func(t *testing.T) {
		p := &v1beta1.SSHJoinProfile{ObjectMeta: metav1.ObjectMeta{Name: n("signed-lax")}, Spec: v1beta1.SSHJoinProfileSpec{
			Scripts:    &v1beta1.ProfileScripts{Install: "set -euo pipefail\necho install", Join: "echo join", Leave: "set -euo pipefail\n" + goodLeave},
			Signatures: &v1beta1.ProfileSignatures{Install: "sig", Join: "sig", Leave: "sig"}}}
		create(t, p)
		create(t, class(n("signed-lax"), n("signed-lax"), classSel("x86")))
		waitReady(t, n("signed-lax"), metav1.ConditionTrue, "Ready", "join script has no `set -euo pipefail`")
		waitEvent(t, n("signed-lax"), nodeclass.ReasonVerifiedScriptWarning, "join script")
	})

	t.Run("missing profile, then created", func(t *testing.T) {
		create(t, class(n("late"), n("late-profile"), classSel("x86")))
		nc := waitReady(t, n("late"), metav1.ConditionFalse, v1beta1.ReasonProfileNotFound, `"`+n("late-profile")+`" not found`)
		if !contains(nc.Finalizers, v1beta1.TerminationFinalizer) {
			t.Errorf("finalizers = %v", nc.Finalizers)
		}
		waitEvent(t, n("late"), v1beta1.ReasonProfileNotFound, n("late-profile"))
		create(t, scripts(n("late-profile"), goodLeave))
		nc = waitReady(t, n("late"), metav1.ConditionTrue, "Ready", "")
		if c := nc.StatusConditions().Get(v1beta1.ConditionReady); c.ObservedGeneration != nc.Generation {
			t.Errorf("observedGeneration %d, generation %d", c.ObservedGeneration, nc.Generation)
		}
	})

	t.Run("leave using vars is ProfileInvalid, fixing it makes Ready", func(t *testing.T) {
		create(t, scripts(n("vars-leave"), "echo {{ .Vars.x }}"))
		create(t, class(n("vars-leave"), n("vars-leave"), classSel("x86")))
		waitReady(t, n("vars-leave"), metav1.ConditionFalse, v1beta1.ReasonProfileInvalid, "leave script references .Vars")
		waitEvent(t, n("vars-leave"), v1beta1.ReasonProfileInvalid, "leave")
		p := &v1beta1.SSHJoinProfile{}
		if err := env.Client.Get(ctx, client.ObjectKey{Name: n("vars-leave")}, p); err != nil {
			t.Fatal(err)
		}
		p.Spec.Scripts.Leave = goodLeave
		if err := env.Client.Update(ctx, p); err != nil {
			t.Fatal(err)
		}
		waitReady(t, n("vars-leave"), metav1.ConditionTrue, "Ready", "")
	})

	t.Run("timeouts over the registration window are refused, lowering them makes Ready", func(t *testing.T) {
		p := scripts(n("slow"), goodLeave)
		p.Spec.Timeouts = v1beta1.PhaseTimeouts{Install: "14m", Join: "2m"} // leave gets the CRD default
		create(t, p)
		create(t, class(n("slow"), n("slow"), classSel("x86")))
		msg := "timeouts install 14m + join 2m = 16m exceeds Karpenter's registration window of 15m"
		waitReady(t, n("slow"), metav1.ConditionFalse, v1beta1.ReasonTimeoutsExceedRegistration, msg)
		waitEvent(t, n("slow"), v1beta1.ReasonTimeoutsExceedRegistration, msg)
		if err := env.Client.Get(ctx, client.ObjectKey{Name: n("slow")}, p); err != nil {
			t.Fatal(err)
		}
		p.Spec.Timeouts.Install = "13m"
		if err := env.Client.Update(ctx, p); err != nil {
			t.Fatal(err)
		}
		waitReady(t, n("slow"), metav1.ConditionTrue, "Ready", "")
	})

	t.Run("roles resolve through the real engine", func(t *testing.T) {
		role := func(name, r string) *v1beta1.SSHJoinProfile {
			return &v1beta1.SSHJoinProfile{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1beta1.SSHJoinProfileSpec{Ansible: &v1beta1.AnsibleSource{Role: r}}}
		}
		create(t, role(n("role-ok"), "complete_role"))
		create(t, role(n("role-missing"), "absent_role"))
		create(t, class(n("role-ok"), n("role-ok"), nil))
		create(t, class(n("role-missing"), n("role-missing"), nil))
		waitReady(t, n("role-ok"), metav1.ConditionTrue, "Ready", "")
		waitReady(t, n("role-missing"), metav1.ConditionFalse, v1beta1.ReasonProfileInvalid, "install: role absent_role not found")
	})

	// Operator content (the engine's second roles directory and its
	// collections directory): a role found there is Ready; a role in no
	// source, a broken one, an unreadable source and a shadowing copy each
	// make only the classes of their profiles ProfileInvalid, naming the
	// role, the searched paths or the file; fixing the files (no API event)
	// makes the class Ready.
	t.Run("operator content", func(t *testing.T) {
		role := func(name, r string) {
			create(t, &v1beta1.SSHJoinProfile{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1beta1.SSHJoinProfileSpec{Ansible: &v1beta1.AnsibleSource{Role: r}}})
			create(t, class(name, name, nil))
		}
		writeRole(t, opRoles, "site_join")
		writeRole(t, filepath.Join(opColls, "ansible_collections/acme/site/roles"), "site_join")
		role(n("op-short"), "site_join")
		role(n("op-fqcn"), "acme.site.site_join")
		role(n("op-shipped"), "shipped_role")
		role(n("op-missing"), "acme.site.nowhere")
		collections := []string{}
		if c, err := engine.FindCollectionsPath(); err == nil {
			collections = append(collections, c)
		}
		waitReady(t, n("op-missing"), metav1.ConditionFalse, v1beta1.ReasonProfileInvalid,
			"install: role acme.site.nowhere not found in: "+strings.Join(append(collections, opColls), ", "))
		waitReady(t, n("op-short"), metav1.ConditionTrue, "Ready", "")
		waitReady(t, n("op-fqcn"), metav1.ConditionTrue, "Ready", "")

		// a YAML syntax error in one operator role
		writeRole(t, opRoles, "broken_role")
		bad := filepath.Join(opRoles, "broken_role", "defaults", "main.yml")
		if err := os.MkdirAll(filepath.Dir(bad), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(bad, []byte("a: [unclosed\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		role(n("op-syntax"), "broken_role")
		waitReady(t, n("op-syntax"), metav1.ConditionFalse, v1beta1.ReasonProfileInvalid, "role broken_role: "+bad+" is not valid YAML")
		waitEvent(t, n("op-syntax"), v1beta1.ReasonProfileInvalid, bad)

		// valid YAML that ansible cannot load: its own parser's verdict
		writeRole(t, opRoles, "ansible_broken")
		loadErr := filepath.Join(opRoles, "ansible_broken", "tasks", "join.yml")
		if err := os.WriteFile(loadErr, []byte("- name: two\n  ansible.builtin.command: /bin/true\n  ansible.builtin.shell: /bin/true\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		role(n("op-ansible"), "ansible_broken")
		waitReady(t, n("op-ansible"), metav1.ConditionFalse, v1beta1.ReasonProfileInvalid,
			"role ansible_broken: ansible cannot load it: conflicting action statements: ansible.builtin.command, ansible.builtin.shell ("+loadErr+":1:3)")
		waitEvent(t, n("op-ansible"), v1beta1.ReasonProfileInvalid, loadErr)

		// an operator role with a shipped role's name
		writeRole(t, opRoles, "shipped_role")
		waitReady(t, n("op-shipped"), metav1.ConditionFalse, v1beta1.ReasonProfileInvalid,
			"role shipped_role in "+filepath.Join(opRoles, "shipped_role")+" has the name of the role in "+filepath.Join(shippedRoles, "shipped_role"))

		// an unreadable collections source (a symlink loop: root reads
		// through a chmod 000)
		loop := filepath.Join(opColls, "ansible_collections", "loop")
		if err := os.Symlink(loop, loop); err != nil {
			t.Fatal(err)
		}
		role(n("op-unreadable"), "loop.site.x")
		waitReady(t, n("op-unreadable"), metav1.ConditionFalse, v1beta1.ReasonProfileInvalid, "content source "+opColls+" is unreadable")

		// the other profiles keep running
		for _, c := range []string{"op-short", "op-fqcn", "role-ok"} {
			waitReady(t, n(c), metav1.ConditionTrue, "Ready", "")
		}
		// fixing the files is enough: the class is re-checked
		if err := os.WriteFile(bad, []byte("a: [closed]\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.RemoveAll(filepath.Join(opRoles, "shipped_role")); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(loadErr, []byte("- ansible.builtin.meta: noop\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		waitReady(t, n("op-syntax"), metav1.ConditionTrue, "Ready", "")
		waitReady(t, n("op-ansible"), metav1.ConditionTrue, "Ready", "")
		waitReady(t, n("op-shipped"), metav1.ConditionTrue, "Ready", "")
	})

	t.Run("invalid selector is SelectorError", func(t *testing.T) {
		create(t, scripts(n("sel-profile"), goodLeave))
		// The CRD lets a LabelSelector with an unknown operator through (its
		// schema has no enum), so the controller is what catches it.
		create(t, class(n("bad-selector"), n("sel-profile"), &metav1.LabelSelector{
			MatchExpressions: []metav1.LabelSelectorRequirement{{Key: v1beta1.LabelHostClass, Operator: "Near", Values: []string{"x86"}}}}))
		waitReady(t, n("bad-selector"), metav1.ConditionFalse, v1beta1.ReasonSelectorError, "hostSelector")
		waitEvent(t, n("bad-selector"), v1beta1.ReasonSelectorError, "hostSelector")
	})

	t.Run("no matching hosts, then a host, then none again", func(t *testing.T) {
		create(t, scripts(n("arm-profile"), goodLeave))
		create(t, class(n("arm"), n("arm-profile"), classSel("arm")))
		waitReady(t, n("arm"), metav1.ConditionFalse, v1beta1.ReasonNoHosts, "namespace "+pool)
		waitEvent(t, n("arm"), v1beta1.ReasonNoHosts, pool)
		// a host in another namespace does not count
		create(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: pool + "-other"}})
		other := host(n("h-arm-elsewhere"), map[string]string{v1beta1.LabelHostClass: "arm"})
		other.Namespace = pool + "-other"
		create(t, other)
		h := host(n("h-arm"), map[string]string{v1beta1.LabelHostClass: "arm"})
		create(t, h)
		waitReady(t, n("arm"), metav1.ConditionTrue, "Ready", "")
		if err := env.Client.Delete(ctx, h); err != nil {
			t.Fatal(err)
		}
		waitReady(t, n("arm"), metav1.ConditionFalse, v1beta1.ReasonNoHosts, "")
		// relabelling the x86 host wakes the class (label changes are watched)
		x := &v1beta1.SSHHost{}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: pool, Name: n("h-x86")}, x); err != nil {
			t.Fatal(err)
		}
		x.Labels["extra"] = "1"
		x.Labels[v1beta1.LabelHostClass] = "arm"
		if err := env.Client.Update(ctx, x); err != nil {
			t.Fatal(err)
		}
		waitReady(t, n("arm"), metav1.ConditionTrue, "Ready", "")
	})

	t.Run("deletion waits for NodeClaims", func(t *testing.T) {
		create(t, scripts(n("held-profile"), goodLeave))
		create(t, class(n("held"), n("held-profile"), nil))
		waitReady(t, n("held"), metav1.ConditionTrue, "Ready", "")
		claim := &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: n("held-claim")}, Spec: karpv1.NodeClaimSpec{
			NodeClassRef: &karpv1.NodeClassReference{Group: v1beta1.Group, Kind: nodeclass.Kind, Name: n("held")},
			Requirements: []karpv1.NodeSelectorRequirementWithMinValues{{Key: karpv1.CapacityTypeLabelKey, Operator: corev1.NodeSelectorOpIn, Values: []string{karpv1.CapacityTypeOnDemand}}},
		}}
		create(t, claim)
		// a claim of another provider naming the same class does not hold it
		create(t, &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: n("foreign-claim")}, Spec: karpv1.NodeClaimSpec{
			NodeClassRef: &karpv1.NodeClassReference{Group: "karpenter.k8s.aws", Kind: "EC2NodeClass", Name: n("held")},
			Requirements: claim.Spec.Requirements,
		}})
		if err := env.Client.Delete(ctx, class(n("held"), "", nil)); err != nil {
			t.Fatal(err)
		}
		// The event proves the controller saw the deletion and chose to wait.
		waitEvent(t, n("held"), nodeclass.ReasonWaitingOnNodeClaims, n("held-claim"))
		nc := &v1beta1.SSHNodeClass{}
		if err := env.Client.Get(ctx, client.ObjectKey{Name: n("held")}, nc); err != nil {
			t.Fatalf("class gone while a NodeClaim references it: %v", err)
		}
		if nc.DeletionTimestamp.IsZero() || !contains(nc.Finalizers, v1beta1.TerminationFinalizer) {
			t.Fatalf("deletionTimestamp=%v finalizers=%v", nc.DeletionTimestamp, nc.Finalizers)
		}
		if err := env.Client.Delete(ctx, claim); err != nil {
			t.Fatal(err)
		}
		eventually(t, "class released after its NodeClaim went", func() (bool, string) {
			err := env.Client.Get(ctx, client.ObjectKey{Name: n("held")}, &v1beta1.SSHNodeClass{})
			return apierrors.IsNotFound(err), fmt.Sprintf("get: %v", err)
		})
	})
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
