package cli

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/dklesev/kpssh/apis/v1beta1"
)

// MaintenanceUsage is the help text of `kpssh maintenance`.
const MaintenanceUsage = `usage: kpssh maintenance on|off [flags] HOST

on   parks the host: sets the annotation karpenter.dklesev.github.io/maintenance,
     so it is never claimed again. A claimed host keeps serving its NodeClaim
     until the claim goes; --evict deletes that NodeClaim now (Karpenter drains
     the node and runs leave), after which the host lands in Maintenance.
off  removes the annotation: the host goes to Pending and the next probe
     decides Available or Unhealthy. --rebuilt also clears the install marker
     and the pinned host key (status installedProfile, hostKeyFingerprint) for
     a host rebuilt from scratch, so the next claim re-runs install and the
     probe re-pins the key.

flags:
`

// MaintenanceOptions is what one maintenance call does.
type MaintenanceOptions struct {
	Namespace, Host string
	On              bool
	Evict           bool // on: delete the claiming NodeClaim
	Rebuilt         bool // off: clear installedProfile and hostKeyFingerprint
}

// Maintain applies o with c and returns what happened, one line each.
func Maintain(ctx context.Context, c client.Client, o MaintenanceOptions) ([]string, error) {
	var h v1beta1.SSHHost
	key := types.NamespacedName{Namespace: o.Namespace, Name: o.Host}
	if err := c.Get(ctx, key, &h); err != nil {
		return nil, apiErr(err, fmt.Sprintf("no SSHHost %s in namespace %s", o.Host, o.Namespace), "SSHHost "+key.String())
	}
	var out []string
	if !o.On {
		if h.InMaintenance() {
			if err := patchJSON(ctx, c, &h, map[string]any{"metadata": map[string]any{"annotations": map[string]any{v1beta1.AnnotationMaintenance: nil}}}, false); err != nil {
				return out, err
			}
			out = append(out, fmt.Sprintf("sshhost %s: maintenance annotation removed; state goes to Pending, the next probe decides Available or Unhealthy", key))
		} else {
			out = append(out, fmt.Sprintf("sshhost %s: not in maintenance (state %s); nothing to remove", key, h.CurrentState()))
		}
		if o.Rebuilt {
			// The seed's status patch; a merge patch of "" drops both fields.
			if err := patchJSON(ctx, c, &h, map[string]any{"status": map[string]any{"installedProfile": "", "hostKeyFingerprint": ""}}, true); err != nil {
				return out, err
			}
			out = append(out, fmt.Sprintf("sshhost %s: install marker and pinned host key cleared (next claim re-runs install, the probe re-pins the key)", key))
		}
		return out, nil
	}

	if h.InMaintenance() {
		out = append(out, fmt.Sprintf("sshhost %s: already annotated for maintenance (state %s)", key, h.CurrentState()))
	} else {
		if err := patchJSON(ctx, c, &h, map[string]any{"metadata": map[string]any{"annotations": map[string]any{v1beta1.AnnotationMaintenance: "true"}}}, false); err != nil {
			return out, err
		}
		out = append(out, fmt.Sprintf("sshhost %s: maintenance annotation set; the host is no longer claimable", key))
	}
	ref := h.Status.ClaimRef
	switch {
	case ref == nil || ref.Name == "":
		out = append(out, fmt.Sprintf("sshhost %s: not claimed; its state becomes Maintenance at the next reconcile", key))
	case !o.Evict:
		out = append(out, fmt.Sprintf("sshhost %s: still claimed by NodeClaim %s and keeps serving it; evict it with --evict (or wait for consolidation)", key, ref.Name))
	default:
		msg, err := evict(ctx, c, ref)
		if err != nil {
			return out, err
		}
		out = append(out, fmt.Sprintf("sshhost %s: %s", key, msg))
	}
	return out, nil
}

// evict deletes the host's NodeClaim, fenced by UID: a NodeClaim of the same
// name but another UID is a successor the host does not serve.
func evict(ctx context.Context, c client.Client, ref *v1beta1.ClaimRef) (string, error) {
	var nc karpv1.NodeClaim
	if err := c.Get(ctx, types.NamespacedName{Name: ref.Name}, &nc); err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Sprintf("NodeClaim %s is already gone; the probe releases the stale claim", ref.Name), nil
		}
		return "", runtimeErr("read NodeClaim %s: %w", ref.Name, err)
	}
	if ref.UID != "" && nc.UID != ref.UID {
		return fmt.Sprintf("NodeClaim %s is another object (uid %s, the host's claim was %s); not deleted, the probe releases the stale claim", ref.Name, nc.UID, ref.UID), nil
	}
	if nc.DeletionTimestamp != nil {
		return fmt.Sprintf("NodeClaim %s is already being deleted; the host lands in Maintenance after leave", ref.Name), nil
	}
	if err := c.Delete(ctx, &nc, client.Preconditions{UID: &nc.UID}); err != nil && !apierrors.IsNotFound(err) {
		return "", runtimeErr("delete NodeClaim %s: %w", ref.Name, err)
	}
	return fmt.Sprintf("NodeClaim %s deleted: Karpenter drains the node and runs leave, then the host lands in Maintenance", ref.Name), nil
}

func patchJSON(ctx context.Context, c client.Client, h *v1beta1.SSHHost, body map[string]any, status bool) error {
	b, err := json.Marshal(body)
	if err != nil {
		return runtimeErr("patch: %w", err)
	}
	p := client.RawPatch(types.MergePatchType, b)
	if status {
		err = c.Status().Patch(ctx, h, p)
	} else {
		err = c.Patch(ctx, h, p)
	}
	if err != nil {
		return runtimeErr("patch SSHHost %s/%s: %w", h.Namespace, h.Name, err)
	}
	return nil
}

func (d deps) maintenanceCommand() *cobra.Command {
	var cf *clusterFlags
	var o MaintenanceOptions
	c := d.command("maintenance", "on|off HOST: park a host for maintenance (--evict its NodeClaim) or hand it back", MaintenanceUsage,
		func(c *cobra.Command, args []string) error { return d.maintenance(c.Context(), cf, o, args) })
	cf = d.addClusterFlags(c, "pool `namespace` holding the SSHHosts")
	c.Flags().BoolVar(&o.Evict, "evict", false, "on: delete the NodeClaim the host serves (drain + leave through Karpenter)")
	c.Flags().BoolVar(&o.Rebuilt, "rebuilt", false, "off: also clear the install marker and the pinned host key")
	c.ValidArgsFunction = func(c *cobra.Command, args []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
		switch len(args) {
		case 0:
			return []cobra.Completion{"on", "off"}, cobra.ShellCompDirectiveNoFileComp
		case 1:
			return d.completeHosts(c, cf), cobra.ShellCompDirectiveNoFileComp
		}
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	return c
}

func (d deps) maintenance(ctx context.Context, cf *clusterFlags, o MaintenanceOptions, pos []string) error {
	if len(pos) != 2 || (pos[0] != "on" && pos[0] != "off") {
		return withUsage("want on|off HOST, got %q", pos)
	}
	o.Namespace, o.Host, o.On = cf.namespace(), pos[1], pos[0] == "on"
	if err := cf.check(); err != nil {
		return err
	}
	if o.Host == "" {
		return usageErr("HOST must not be empty")
	}
	if o.On && o.Rebuilt {
		return usageErr("--rebuilt goes with off (clear the marker when handing a rebuilt host back)")
	}
	if !o.On && o.Evict {
		return usageErr("--evict goes with on")
	}
	cl, err := d.connect(cf)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, cf.timeout)
	defer cancel()
	lines, err := Maintain(ctx, cl, o)
	for _, l := range lines {
		fmt.Fprintln(d.stdout, l)
	}
	return err
}
