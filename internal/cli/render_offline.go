package cli

import (
	"context"
	"fmt"
	"io"
	"reflect"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/engine"
)

// offlineClassName names the node class render makes up when --class is
// not given (install/join need one: it carries vars and the cluster).
const offlineClassName = "kpssh-render-no-class"

// fileReader is a client.Reader over the objects of manifest files: the
// Renderer reads through it exactly what it reads from a cluster, and what
// the files do not hold is NotFound (a NodeClaim, cluster-info: the
// Renderer's warnings and placeholders cover those).
type fileReader struct{ objs []client.Object }

var _ client.Reader = (*fileReader)(nil)

func (f *fileReader) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	for _, o := range f.objs {
		if reflect.TypeOf(o) == reflect.TypeOf(obj) && o.GetName() == key.Name && o.GetNamespace() == key.Namespace {
			reflect.ValueOf(obj).Elem().Set(reflect.ValueOf(o.DeepCopyObject()).Elem())
			return nil
		}
	}
	kind := reflect.TypeOf(obj).Elem().Name()
	return apierrors.NewNotFound(schema.GroupResource{Resource: strings.ToLower(kind)}, key.Name)
}

func (f *fileReader) List(_ context.Context, list client.ObjectList, _ ...client.ListOption) error {
	l, ok := list.(*v1beta1.SSHNodeClassList)
	if !ok {
		return fmt.Errorf("offline: no %T in the files", list)
	}
	for _, o := range f.objs {
		if nc, ok := o.(*v1beta1.SSHNodeClass); ok {
			l.Items = append(l.Items, *nc.DeepCopy())
		}
	}
	return nil
}

// OfflineRender is what `kpssh render --profile … --host …` renders from.
type OfflineRender struct {
	Profile *v1beta1.SSHJoinProfile
	Host    *v1beta1.SSHHost
	// Classes from --class; those whose joinProfileRef names Profile are
	// used (exactly one; none given: a made-up class without vars).
	Classes []*v1beta1.SSHNodeClass
	Secret  *corev1.Secret // --secret: the class's joinSecretRef
	Phase   engine.Phase
	Warn    func(string)
}

// Render renders o the way `kpssh render HOST PHASE` renders from a
// cluster: the same Renderer, over the files.
func (o OfflineRender) Render(ctx context.Context) (*Rendered, error) {
	if !o.Phase.Valid() {
		return nil, usageErr("unknown phase %q (want %s)", o.Phase, engine.PhaseNames())
	}
	h, p := o.Host.DeepCopy(), o.Profile.DeepCopy()
	if h.Namespace == "" {
		h.Namespace = v1beta1.DefaultPoolNamespace
	}
	p.Namespace = ""
	var nc *v1beta1.SSHNodeClass
	var names []string
	for _, c := range o.Classes {
		names = append(names, c.Name+" → "+c.Spec.JoinProfileRef.Name)
		if c.Spec.JoinProfileRef.Name == p.Name {
			if nc != nil {
				return nil, usageErr("--class holds more than one SSHNodeClass referencing SSHJoinProfile %s (%s, %s): give a file with one", p.Name, nc.Name, c.Name)
			}
			nc = c.DeepCopy()
		}
	}
	madeUp := false
	switch {
	case nc == nil && len(o.Classes) > 0:
		return nil, usageErr("no SSHNodeClass in --class references SSHJoinProfile %s (joinProfileRef: %s)", p.Name, strings.Join(names, ", "))
	case nc == nil:
		madeUp = true
		nc = &v1beta1.SSHNodeClass{Spec: v1beta1.SSHNodeClassSpec{JoinProfileRef: v1beta1.ObjectReference{Name: p.Name}}}
		nc.Name = offlineClassName
	}
	objs := []client.Object{h, p, nc}
	if ref := nc.Spec.JoinSecretRef; ref != nil && o.Phase != engine.PhaseLeave {
		if o.Secret == nil {
			return nil, usageErr("SSHNodeClass %s has joinSecretRef %s: pass its Secret with --secret SECRET.yaml (its values are masked)", nc.Name, ref.Name)
		}
		if o.Secret.Name != ref.Name {
			return nil, usageErr("--secret is Secret %s, but SSHNodeClass %s's joinSecretRef names %s", o.Secret.Name, nc.Name, ref.Name)
		}
		s := o.Secret.DeepCopy()
		s.Namespace = h.Namespace // the pool namespace: where the controller reads it
		objs = append(objs, s)
	}
	leaveNote := ""
	if o.Phase == engine.PhaseLeave && h.Status.InstalledProfile != p.Marker() {
		// Leave runs the install marker's profile; offline the profile is
		// the one given.
		if m := h.Status.InstalledProfile; m == "" {
			leaveNote = "--profile; the host file has no install marker"
		} else {
			leaveNote = fmt.Sprintf("--profile; the host file's install marker is %s", m)
		}
		h.Status.InstalledProfile = p.Marker()
	}
	r := &Renderer{Client: &fileReader{objs: objs}, Warn: o.Warn}
	ro := RenderOptions{Namespace: h.Namespace, Host: h.Name, Phase: o.Phase}
	if o.Phase != engine.PhaseLeave {
		ro.NodeClass = nc.Name
	}
	out, err := r.Render(ctx, ro)
	if err != nil {
		return nil, err
	}
	if leaveNote != "" {
		out.ProfileFrom = leaveNote
	}
	if o.Phase != engine.PhaseLeave {
		out.ProfileFrom = "--profile"
		out.NodeClassFrom = "--class"
		if madeUp {
			out.NodeClass = nil
			out.NodeClassFrom = "no --class: no vars, no secrets, cluster placeholders"
		}
	}
	out.Inputs = append([]string{"offline: from files, no cluster read"}, out.Inputs...)
	return out, nil
}

// renderOffline is `kpssh render --profile P --host H [--class C] [--secret S] PHASE`.
func renderOffline(ctx context.Context, profileFile, hostFile, classFile, secretFile string, pos []string, stdout, stderr io.Writer) error {
	if len(pos) != 1 {
		return usageErr("with --profile and --host, want PHASE, got %d argument(s)", len(pos))
	}
	if profileFile == "" || hostFile == "" {
		return usageErr("offline render needs both --profile and --host")
	}
	o := OfflineRender{Phase: engine.Phase(pos[0]), Warn: func(msg string) { fmt.Fprintf(stderr, "kpssh render: warning: %s\n", msg) }}
	if !o.Phase.Valid() {
		return usageErr("unknown phase %q (want %s)", pos[0], engine.PhaseNames())
	}
	var err error
	if o.Profile, err = readObject[v1beta1.SSHJoinProfile](profileFile, "SSHJoinProfile"); err != nil {
		return err
	}
	if o.Host, err = readObject[v1beta1.SSHHost](hostFile, "SSHHost"); err != nil {
		return err
	}
	if classFile != "" {
		if o.Classes, err = readObjects[v1beta1.SSHNodeClass](classFile, "SSHNodeClass"); err != nil {
			return err
		}
	}
	if secretFile != "" {
		if o.Secret, err = readCoreObject[corev1.Secret](secretFile, "Secret"); err != nil {
			return err
		}
		for k, v := range o.Secret.StringData {
			// the apiserver folds stringData into data
			if o.Secret.Data == nil {
				o.Secret.Data = map[string][]byte{}
			}
			o.Secret.Data[k] = []byte(v)
		}
		o.Secret.StringData = nil
	}
	res, err := o.Render(ctx)
	if err != nil {
		return err
	}
	if _, err := io.WriteString(stdout, res.Header()+"\n"+res.Text); err != nil {
		return runtimeErr("write output: %w", err)
	}
	return nil
}
