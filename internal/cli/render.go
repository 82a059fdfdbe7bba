// Package cli holds the kpssh command-line subcommands (cmd/kpssh dispatches
// to them). They read the cluster with a controller-runtime client and reuse
// the controller's own packages, so what they show is what the controller
// would do.
package cli

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strings"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	karpcp "sigs.k8s.io/karpenter/pkg/cloudprovider"
	"sigs.k8s.io/karpenter/pkg/scheduling"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/cloudprovider"
	"github.com/dklesev/kpssh/internal/engine"
	"github.com/dklesev/kpssh/internal/profile"
	"github.com/dklesev/kpssh/internal/providers/clusterinfo"
	"github.com/dklesev/kpssh/internal/providers/instancetype"
	"github.com/dklesev/kpssh/internal/providers/leave"
	"github.com/dklesev/kpssh/internal/providers/phase"
)

// BootstrapTokenPlaceholder stands in for the join token: render never mints
// one. Render masks the part after the dot like a real token's secret, so
// the output shows BootstrapTokenShown.
const (
	BootstrapTokenPlaceholder = "<bootstrap-token-id>.<bootstrap-token-secret>"
	BootstrapTokenShown       = "<bootstrap-token-id>." + engine.Mask
)

// Cluster info placeholders when neither the node class nor
// kube-public/cluster-info gives it.
const (
	ClusterEndpointPlaceholder = "<cluster-endpoint>"
	ClusterCAPlaceholder       = "<cluster-ca-b64>"
)

// RenderOptions says what to render.
type RenderOptions struct {
	Namespace string // the pool namespace
	Host      string
	Phase     engine.Phase
	NodeClass string // "" = resolve (NodeClaim, then host selectors)
}

// Renderer resolves what a phase would run on a host, the way the
// controller would, and renders it with the engine, secrets masked.
type Renderer struct {
	Client  client.Reader
	Cluster clusterinfo.Provider // nil = clusterinfo.New(Client)
	// Warn receives warnings (a placeholder used, a stale claimRef…); nil
	// discards them.
	Warn func(msg string)
}

// Rendered is a rendering and what it was resolved from.
type Rendered struct {
	Host      *v1beta1.SSHHost
	Phase     engine.Phase
	Profile   *v1beta1.SSHJoinProfile
	NodeClass *v1beta1.SSHNodeClass // nil for leave
	// ProfileFrom, NodeClassFrom and Inputs say where things came from, for
	// the header.
	ProfileFrom, NodeClassFrom string
	Inputs                     []string
	// Text is engine.Render's output (secrets masked).
	Text string
}

// Header is the comment block naming host, phase, profile and node class.
func (r *Rendered) Header() string {
	var b strings.Builder
	h := r.Host
	fmt.Fprintf(&b, "# kpssh render %s %s\n", h.Name, r.Phase)
	fmt.Fprintf(&b, "# host:       %s/%s (address %s, class %s, state %s)\n", h.Namespace, h.Name, h.Spec.Address, h.Class(), h.CurrentState())
	fmt.Fprintf(&b, "# phase:      %s\n", r.Phase)
	fmt.Fprintf(&b, "# profile:    %s (%s)\n", r.Profile.Marker(), r.ProfileFrom)
	if r.NodeClass != nil {
		fmt.Fprintf(&b, "# node class: %s (%s)\n", r.NodeClass.Name, r.NodeClassFrom)
	} else {
		fmt.Fprintf(&b, "# node class: none (%s)\n", r.NodeClassFrom)
	}
	for _, in := range r.Inputs {
		fmt.Fprintf(&b, "# input:      %s\n", in)
	}
	b.WriteString("# The SSH key is never read or shown; secret values are masked (***).\n")
	return b.String()
}

func (r *Renderer) warn(format string, a ...any) {
	if r.Warn != nil {
		r.Warn(fmt.Sprintf(format, a...))
	}
}

// Render resolves and renders one phase of one host.
func (r *Renderer) Render(ctx context.Context, o RenderOptions) (*Rendered, error) {
	if !o.Phase.Valid() {
		return nil, usageErr("unknown phase %q (want %s)", o.Phase, engine.PhaseNames())
	}
	h := &v1beta1.SSHHost{}
	key := client.ObjectKey{Namespace: o.Namespace, Name: o.Host}
	if err := r.Client.Get(ctx, key, h); err != nil {
		return nil, apiErr(err, fmt.Sprintf("SSHHost %s/%s not found (pool namespace: --namespace or $POOL_NAMESPACE)", key.Namespace, key.Name), "SSHHost "+key.String())
	}
	out := &Rendered{Host: h, Phase: o.Phase}
	var pc engine.Context
	fallback := false // leave runs phase.FallbackLeaveRequest
	var redact []string
	if o.Phase.AddressesOnly() {
		if o.NodeClass != "" {
			r.warn("--nodeclass %s is ignored for %s: %s runs the install marker's profile with the empty context", o.NodeClass, o.Phase, o.Phase)
		}
		p, _, err := leave.Resolve(ctx, r.Client, h)
		if err != nil {
			return nil, runtimeErr("read the install marker's profile: %w", err)
		}
		if p == nil {
			p, fallback = leave.FallbackProfile(), o.Phase == engine.PhaseLeave
		}
		out.Profile = p
		out.ProfileFrom = leaveProfileFrom(h, p)
		out.NodeClassFrom = "leave runs the install marker's profile with the empty context"
		pc = leave.EmptyContext(h)
		out.Inputs = append(out.Inputs, "empty context: only the host and node addresses, no vars, no secrets, no token")
	} else {
		claim, err := r.nodeClaim(ctx, h)
		if err != nil {
			return nil, err
		}
		nc, from, err := r.nodeClass(ctx, h, claim, o.NodeClass)
		if err != nil {
			return nil, err
		}
		out.NodeClass, out.NodeClassFrom = nc, from
		p := &v1beta1.SSHJoinProfile{}
		name := nc.Spec.JoinProfileRef.Name
		if err := r.Client.Get(ctx, client.ObjectKey{Name: name}, p); err != nil {
			return nil, apiErr(err, fmt.Sprintf("SSHJoinProfile %q (joinProfileRef of SSHNodeClass %s) not found", name, nc.Name), "SSHJoinProfile "+name)
		}
		out.Profile = p
		out.ProfileFrom = "joinProfileRef of SSHNodeClass " + nc.Name
		if h.Status.InstalledProfile != "" && h.Status.InstalledProfile != p.Marker() {
			out.Inputs = append(out.Inputs, fmt.Sprintf("the host's install marker is %s, not %s", h.Status.InstalledProfile, p.Marker()))
		}
		if pc, redact, err = r.joinContext(ctx, o, h, nc, p, claim, out); err != nil {
			return nil, err
		}
	}
	if err := profile.Validate(out.Profile, nil); err != nil {
		switch {
		case !o.Phase.AddressesOnly():
			return nil, usageErr("SSHJoinProfile %s is invalid: %v", out.Profile.Name, err)
		case out.Profile.Name != leave.FallbackProfile().Name:
			// The controller runs a marker profile's leave whatever its
			// other phases look like today; the engine checks leave itself.
			r.warn("SSHJoinProfile %s is invalid (%v); rendering its leave, as the controller would run it", out.Profile.Name, err)
		}
	}
	conn, err := placeholderConnection(h)
	if err != nil {
		return nil, runtimeErr("placeholder key: %w", err)
	}
	req, err := phase.Request(h, out.Profile, o.Phase, conn, pc, redact)
	if o.Phase == engine.PhaseLeave && (fallback || err != nil) {
		// What the controller does (leave.Run): the fallback leave when
		// there is no profile leave, or when it is refused before it runs.
		if err != nil {
			out.Inputs = append(out.Inputs, fmt.Sprintf("the profile's leave is refused before it runs (%v): the controller runs the fallback leave", err))
		}
		req, err = phase.FallbackLeaveRequest(h, conn, pc), nil
	}
	if err != nil {
		return nil, usageErr("%v", err)
	}
	text, err := engine.Render(req, true)
	if err != nil {
		// Render redacts its errors when masking.
		return nil, usageErr("render %s of SSHJoinProfile %s: %v", o.Phase, out.Profile.Name, err)
	}
	out.Text = text
	return out, nil
}

func leaveProfileFrom(h *v1beta1.SSHHost, p *v1beta1.SSHJoinProfile) string {
	m := h.Status.InstalledProfile
	switch {
	case p.Name == leave.FallbackProfile().Name && m == "":
		return "the host has no install marker: the fallback leave"
	case p.Name == leave.FallbackProfile().Name:
		return fmt.Sprintf("install marker %s names no existing profile: the fallback leave", m)
	case m != p.Marker():
		return fmt.Sprintf("install marker %s; the profile is at version %s now", m, p.Spec.Version)
	}
	return "the host's install marker"
}

// joinContext builds the context install/join/uninstall would get.
func (r *Renderer) joinContext(ctx context.Context, o RenderOptions, h *v1beta1.SSHHost, nc *v1beta1.SSHNodeClass, p *v1beta1.SSHJoinProfile, claim *karpv1.NodeClaim, out *Rendered) (engine.Context, []string, error) {
	secrets, err := cloudprovider.JoinSecrets(ctx, r.Client, o.Namespace, nc)
	if err != nil {
		if apierrors.IsNotFound(err) {
			return engine.Context{}, nil, usageErr("join secret %s/%s of SSHNodeClass %s not found", o.Namespace, nc.Spec.JoinSecretRef.Name, nc.Name)
		}
		if errors.Is(err, cloudprovider.ErrSecretKey) {
			return engine.Context{}, nil, usageErr("%v", err)
		}
		return engine.Context{}, nil, runtimeErr("%v", err)
	}
	if len(secrets) > 0 {
		out.Inputs = append(out.Inputs, fmt.Sprintf("%d secret(s) from Secret %s/%s: %s (values masked)", len(secrets), o.Namespace, nc.Spec.JoinSecretRef.Name, strings.Join(slices.Sorted(maps.Keys(secrets)), ", ")))
	}
	cl := r.Cluster
	if cl == nil {
		cl = clusterinfo.New(r.Client)
	}
	info, err := cl.Get(ctx, nc)
	switch {
	case err != nil:
		r.warn("cluster info: %v; rendering with placeholders %s and %s", err, ClusterEndpointPlaceholder, ClusterCAPlaceholder)
		info = clusterinfo.Info{Endpoint: ClusterEndpointPlaceholder, CAB64: ClusterCAPlaceholder}
		out.Inputs = append(out.Inputs, "cluster endpoint and CA: placeholders (see the warning on stderr)")
	case nc.Spec.Cluster != nil && nc.Spec.Cluster.Endpoint != "":
		out.Inputs = append(out.Inputs, "cluster endpoint and CA: spec.cluster of SSHNodeClass "+nc.Name)
	default:
		out.Inputs = append(out.Inputs, "cluster endpoint and CA: "+clusterinfo.Namespace+"/"+clusterinfo.Name)
	}
	it := hostInstanceType(h, nc)
	nodeClaim := claim
	if nodeClaim == nil {
		// Unclaimed: what a fresh NodeClaim gets at the least — the
		// unregistered taint and the host class's labels.
		nodeClaim = &karpv1.NodeClaim{}
		out.Inputs = append(out.Inputs, "node labels and taints: not claimed, so the host class's labels and the unregistered taint only")
	} else {
		out.Inputs = append(out.Inputs, "node labels and taints: NodeClaim "+claim.Name)
	}
	pc := cloudprovider.JoinContext(h, nc, p, nodeClaim, it, info, secrets)
	if o.Phase == engine.PhaseJoin {
		pc.BootstrapToken = BootstrapTokenPlaceholder
		out.Inputs = append(out.Inputs, "bootstrap token: placeholder "+BootstrapTokenShown+" (render never mints a token)")
	}
	return pc, secretValues(secrets), nil
}

// hostInstanceType is the instance type of the host's class under nc, built
// by the controller's own code from this host (its single-valued labels —
// instance type, arch, os, zone — are the class's; the capacity type is
// the NodeClaim's, as the claim launched). A host
// not probed yet (no arch) or a class the node class cannot price gets the
// instance-type label alone.
func hostInstanceType(h *v1beta1.SSHHost, nc *v1beta1.SSHNodeClass) *karpcp.InstanceType {
	if cls := instancetype.Classes(logr.Discard(), []v1beta1.SSHHost{*h}); len(cls) == 1 {
		if it, err := instancetype.New(cls[0], nc); err == nil {
			return it
		}
	}
	return &karpcp.InstanceType{
		Name:         h.Class(),
		Requirements: scheduling.NewRequirements(scheduling.NewRequirement(corev1.LabelInstanceTypeStable, corev1.NodeSelectorOpIn, h.Class())),
	}
}

// nodeClaim is the NodeClaim the host's claimRef names, nil when unclaimed
// (or the claimRef is stale: a warning, the host is rendered as unclaimed).
func (r *Renderer) nodeClaim(ctx context.Context, h *v1beta1.SSHHost) (*karpv1.NodeClaim, error) {
	ref := h.Status.ClaimRef
	if ref == nil || ref.Name == "" {
		return nil, nil
	}
	nc := &karpv1.NodeClaim{}
	if err := r.Client.Get(ctx, client.ObjectKey{Name: ref.Name}, nc); err != nil {
		if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
			r.warn("host %s is claimed by NodeClaim %s, which does not exist: rendering it as unclaimed", h.Name, ref.Name)
			return nil, nil
		}
		return nil, runtimeErr("read NodeClaim %s: %w", ref.Name, err)
	}
	if ref.UID != "" && nc.UID != ref.UID {
		r.warn("host %s's claimRef names NodeClaim %s with uid %s, but that NodeClaim has uid %s: rendering the host as unclaimed", h.Name, ref.Name, ref.UID, nc.UID)
		return nil, nil
	}
	return nc, nil
}

func ours(ref *karpv1.NodeClassReference) bool {
	return ref != nil && ref.Group == v1beta1.Group && ref.Kind == "SSHNodeClass" && ref.Name != ""
}

// nodeClass resolves the node class: --nodeclass, else the claiming
// NodeClaim's, else the only one whose hostSelector selects the host.
func (r *Renderer) nodeClass(ctx context.Context, h *v1beta1.SSHHost, claim *karpv1.NodeClaim, flagName string) (*v1beta1.SSHNodeClass, string, error) {
	get := func(name string) (*v1beta1.SSHNodeClass, error) {
		nc := &v1beta1.SSHNodeClass{}
		if err := r.Client.Get(ctx, client.ObjectKey{Name: name}, nc); err != nil {
			return nil, apiErr(err, fmt.Sprintf("SSHNodeClass %q not found", name), "SSHNodeClass "+name)
		}
		return nc, nil
	}
	if flagName != "" {
		nc, err := get(flagName)
		if err != nil {
			return nil, "", err
		}
		if claim != nil && ours(claim.Spec.NodeClassRef) && claim.Spec.NodeClassRef.Name != flagName {
			r.warn("host %s is claimed by NodeClaim %s of SSHNodeClass %s; rendering with --nodeclass %s as asked", h.Name, claim.Name, claim.Spec.NodeClassRef.Name, flagName)
		} else if ok, err := selects(nc, h); err == nil && !ok {
			r.warn("SSHNodeClass %s does not select host %s (hostSelector); rendering with it as asked", flagName, h.Name)
		}
		return nc, "--nodeclass", nil
	}
	if claim != nil {
		if ours(claim.Spec.NodeClassRef) {
			nc, err := get(claim.Spec.NodeClassRef.Name)
			if err != nil {
				return nil, "", err
			}
			return nc, "of NodeClaim " + claim.Name, nil
		}
		r.warn("NodeClaim %s does not reference an SSHNodeClass; resolving the node class by host selector", claim.Name)
	}
	list := &v1beta1.SSHNodeClassList{}
	if err := r.Client.List(ctx, list); err != nil {
		return nil, "", runtimeErr("list SSHNodeClasses: %w", err)
	}
	var match, all []string
	var found *v1beta1.SSHNodeClass
	for i := range list.Items {
		nc := &list.Items[i]
		all = append(all, nc.Name)
		ok, err := selects(nc, h)
		if err != nil {
			r.warn("SSHNodeClass %s: invalid hostSelector: %v", nc.Name, err)
			continue
		}
		if ok {
			match = append(match, nc.Name)
			found = nc
		}
	}
	sort.Strings(match)
	sort.Strings(all)
	switch len(match) {
	case 1:
		return found, "the only SSHNodeClass whose hostSelector selects the host", nil
	case 0:
		if len(all) == 0 {
			return nil, "", usageErr("no SSHNodeClass exists; create one or pass --nodeclass NAME")
		}
		return nil, "", usageErr("no SSHNodeClass selects host %s (SSHNodeClasses: %s); pass --nodeclass NAME", h.Name, strings.Join(all, ", "))
	}
	return nil, "", usageErr("host %s is selected by %d SSHNodeClasses (%s); pass --nodeclass NAME", h.Name, len(match), strings.Join(match, ", "))
}

// selects applies the controller's rule: no hostSelector selects every host.
func selects(nc *v1beta1.SSHNodeClass, h *v1beta1.SSHHost) (bool, error) {
	if nc.Spec.HostSelector == nil {
		return true, nil
	}
	sel, err := metav1.LabelSelectorAsSelector(nc.Spec.HostSelector)
	if err != nil {
		return false, err
	}
	return sel.Matches(labels.Set(h.Labels)), nil
}

// placeholderConnection is the host's address, port and user with an SSH
// key pair made up in memory: engine.Render validates a key and a pinned
// host key but never prints either, and render must not read the host's
// key Secret at all.
func placeholderConnection(h *v1beta1.SSHHost) (engine.Connection, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return engine.Connection{}, err
	}
	blk, err := ssh.MarshalPrivateKey(priv, "kpssh render placeholder")
	if err != nil {
		return engine.Connection{}, err
	}
	sp, err := ssh.NewPublicKey(pub)
	if err != nil {
		return engine.Connection{}, err
	}
	return engine.Connection{
		Address:    h.Spec.Address,
		Port:       h.Spec.Port,
		User:       h.Spec.User,
		PrivateKey: pem.EncodeToMemory(blk),
		HostKey:    strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sp))),
	}, nil
}

func secretValues(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, m[k])
	}
	return out
}

// RenderUsage is the synopsis of `kpssh render`.
const RenderUsage = `usage: kpssh render [--nodeclass NAME] [-n POOL_NS] [--context CTX] [--timeout 30s] HOST PHASE
       kpssh render --profile PROFILE.yaml --host HOST.yaml [--class CLASS.yaml] [--secret SECRET.yaml] PHASE

Print the playbook and the script (with its KPSSH_* preamble), or the
variables file and task list, that PHASE (install, join, leave, uninstall)
would run on the SSHHost HOST — secrets masked, the SSH key never read.
The node class is --nodeclass, else the class of the NodeClaim holding the
host, else the only SSHNodeClass whose hostSelector selects it. Leave uses
the install marker's profile and the empty context. join shows a
placeholder bootstrap token (render never mints one).

With --profile and --host it reads no cluster: the same rendering from
manifest files (--class: the SSHNodeClass referencing the profile, else no
vars; --secret: its joinSecretRef Secret, values masked; cluster endpoint
and CA from the class's spec.cluster, else placeholders; leave renders
--profile's leave).

Exit status: 0 rendered, 1 API error (unreachable, forbidden), 2 usage or
configuration error (unknown host, bad phase, invalid profile, ...).

flags:
`

func (d deps) renderCommand() *cobra.Command {
	var cf *clusterFlags
	var ncName, profileFile, hostFile, classFile, secretFile string
	c := d.command("render", "print the playbook and inputs a phase would run on a host (secrets masked)", RenderUsage,
		func(c *cobra.Command, pos []string) error {
			if profileFile != "" || hostFile != "" || classFile != "" || secretFile != "" {
				return renderOffline(c.Context(), profileFile, hostFile, classFile, secretFile, pos, d.stdout, d.stderr)
			}
			return d.render(c.Context(), cf, ncName, pos)
		})
	cf = d.addClusterFlags(c, "pool `namespace` holding the SSHHosts and the join Secret")
	fs := c.Flags()
	fs.StringVar(&ncName, "nodeclass", "", "SSHNodeClass `name` (default: the claiming NodeClaim's, else the only one selecting the host)")
	fs.StringVar(&profileFile, "profile", "", "offline: SSHJoinProfile manifest `file` (with --host; no cluster is read)")
	fs.StringVar(&hostFile, "host", "", "offline: SSHHost manifest `file`")
	fs.StringVar(&classFile, "class", "", "offline: SSHNodeClass manifest `file`")
	fs.StringVar(&secretFile, "secret", "", "offline: the join Secret's manifest `file` (values masked)")
	c.ValidArgsFunction = func(c *cobra.Command, args []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
		offline := profileFile != "" || hostFile != ""
		switch {
		case len(args) == 0 && !offline:
			return d.completeHosts(c, cf), cobra.ShellCompDirectiveNoFileComp
		case len(args) == 0, len(args) == 1 && !offline:
			return phaseNames(), cobra.ShellCompDirectiveNoFileComp
		}
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	return c
}

func phaseNames() []string {
	out := make([]string, 0, len(engine.Phases))
	for _, ph := range engine.Phases {
		out = append(out, string(ph))
	}
	return out
}

func (d deps) render(ctx context.Context, cf *clusterFlags, ncName string, pos []string) error {
	if len(pos) != 2 {
		return withUsage("want HOST PHASE, got %d argument(s)", len(pos))
	}
	if cf.timeout <= 0 {
		return usageErr("--timeout must be positive")
	}
	o := RenderOptions{Namespace: cf.namespace(), Host: pos[0], Phase: engine.Phase(pos[1]), NodeClass: ncName}
	// Bad input needs no API server.
	if !o.Phase.Valid() {
		return usageErr("unknown phase %q (want %s)", pos[1], engine.PhaseNames())
	}
	if o.Host == "" || o.Namespace == "" {
		return usageErr("HOST and --namespace must not be empty")
	}
	cl, err := d.connect(cf)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, cf.timeout)
	defer cancel()
	r := &Renderer{Client: cl, Cluster: d.cluster, Warn: func(msg string) { fmt.Fprintf(d.stderr, "kpssh render: warning: %s\n", msg) }}
	res, err := r.Render(ctx, o)
	if err != nil {
		return err
	}
	if _, err := io.WriteString(d.stdout, res.Header()+"\n"+res.Text); err != nil {
		return runtimeErr("write output: %w", err)
	}
	return nil
}
