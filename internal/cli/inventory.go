package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	sigyaml "sigs.k8s.io/yaml"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/inventory"
	"github.com/dklesev/kpssh/internal/providers/pool"
)

// Host variables import-inventory reads (besides ansible_host, ansible_port,
// ansible_user). kpssh_capacity_<name> becomes capacity <name> with "_"
// read as "-" (kpssh_capacity_ephemeral_storage → ephemeral-storage).
const (
	VarCapacityPrefix = "kpssh_capacity_"
	VarNodeAddress    = "kpssh_node_address"
)

// InventoryHost is one inventory host as an SSHHost: its class and what its
// variables say, and where it was defined.
type InventoryHost struct {
	Name        string
	Pos         inventory.Pos // where the host is first listed (unknown from ansible-inventory)
	Class       string
	Address     string
	Port        int32
	User        string
	NodeAddress string
	Capacity    corev1.ResourceList
	Vars        map[string]string
}

// InventoryOptions steer the conversion.
type InventoryOptions struct {
	// ClassGroups are the groups that are host classes; empty = every group
	// that lists hosts directly.
	ClassGroups []string
}

// ParseInventory reads one inventory file with the built-in parser (format
// "ini", "yaml" or "" = from the content) and maps its hosts.
func ParseInventory(data []byte, format string, o InventoryOptions) ([]InventoryHost, error) {
	inv, err := inventory.Parse(data, format)
	if err != nil {
		return nil, err
	}
	return inventoryHosts(inv, o)
}

// inventoryHosts maps the resolved hosts to SSHHosts: their class, address,
// user, capacity; one host per machine.
func inventoryHosts(inv *inventory.Inventory, o InventoryOptions) ([]InventoryHost, error) {
	hosts, err := inv.Hosts()
	if err != nil {
		return nil, err
	}
	classGroups := map[string]bool{}
	for _, c := range o.ClassGroups {
		if !inv.HasGroup(c) {
			return nil, fmt.Errorf("--class-groups: no group %q in the inventory", c)
		}
		classGroups[c] = true
	}
	if len(o.ClassGroups) == 0 {
		for _, h := range hosts {
			for _, m := range h.Groups {
				if m.Direct && m.Group != "all" && m.Group != "ungrouped" {
					classGroups[m.Group] = true
				}
			}
		}
	}
	out := make([]InventoryHost, 0, len(hosts))
	for _, h := range hosts {
		class, err := classOf(inv, h, classGroups)
		if err != nil {
			return nil, err
		}
		ih, err := inventoryHost(h.Name, h.Pos, class, h.Vars)
		if err != nil {
			return nil, err
		}
		out = append(out, ih)
	}
	if err := oneHostPerMachine(out); err != nil {
		return nil, err
	}
	return out, nil
}

// classOf is the host's class: the most specific of its class groups, the
// one no other of them is a child (or grandchild…) of — as Ansible's group
// depth ranks a child above its parent. Class groups on unrelated branches
// are refused: a host has one class.
func classOf(inv *inventory.Inventory, h inventory.Host, classGroups map[string]bool) (string, error) {
	var most []inventory.Membership
	for _, c := range h.Groups {
		if !classGroups[c.Group] {
			continue
		}
		specific := true
		for _, d := range h.Groups {
			if classGroups[d.Group] && d.Group != c.Group && inv.Contains(c.Group, d.Group) {
				specific = false
				break
			}
		}
		if specific {
			most = append(most, c)
		}
	}
	if len(most) < 2 {
		if len(most) == 0 {
			return "", nil
		}
		return most[0].Group, nil
	}
	a, b := most[0], most[1]
	at := a.Pos
	if at.Before(b.Pos) {
		at = b.Pos
	}
	return "", inventory.At(at, "host %s is in two class groups, %s%s and %s%s, neither inside the other: a host has one class (pick the class groups with --class-groups)",
		h.Name, a.Group, paren(a.Pos), b.Group, paren(b.Pos))
}

// paren is " (line 5)", or "" for an unknown position.
func paren(p inventory.Pos) string {
	if s := p.String(); s != "" {
		return " (" + s + ")"
	}
	return ""
}

// maxDuplicateErrors bounds the duplicates one refusal lists.
const maxDuplicateErrors = 20

// oneHostPerMachine refuses entries that are the same machine — the same
// address and port, or the same node address (kpssh_node_address, else the
// address when it is an IP) — compared as the controller compares them
// (pool.AddressIdentity, pool.NodeIdentity: IPs normalised, names in
// lowercase). The controller would claim only the first of them; here
// every one is named, with its line and the host it repeats.
func oneHostPerMachine(hosts []InventoryHost) error {
	var errs []error
	n := 0
	report := func(err error) {
		if n++; n <= maxDuplicateErrors {
			errs = append(errs, err)
		}
	}
	byAddr, byNode := map[string]InventoryHost{}, map[string]InventoryHost{}
	for _, h := range hosts {
		k := pool.AddressIdentity(h.Address, h.Port)
		if prev, dup := byAddr[k]; dup {
			report(inventory.At(h.Pos, "host %s has the address %s of host %s%s", h.Name, k, prev.Name, paren(prev.Pos)))
			continue
		}
		byAddr[k] = h
		nk := pool.NodeIdentity(h.NodeAddress, h.Address)
		if nk == "" {
			continue
		}
		if prev, dup := byNode[nk]; dup {
			report(inventory.At(h.Pos, "host %s has the node address %s of host %s%s (%s, else the address when it is an IP: give each host its own %s)",
				h.Name, nk, prev.Name, paren(prev.Pos), VarNodeAddress, VarNodeAddress))
			continue
		}
		byNode[nk] = h
	}
	if n > maxDuplicateErrors {
		errs = append(errs, fmt.Errorf("… and %d more hosts of machines listed before", n-maxDuplicateErrors))
	}
	if len(errs) > 0 {
		errs = append([]error{fmt.Errorf("%d host(s) repeat a machine listed before; one machine is one SSHHost:", n)}, errs...)
	}
	return errors.Join(errs...)
}

func inventoryHost(name string, pos inventory.Pos, class string, vars map[string]string) (InventoryHost, error) {
	h := InventoryHost{Name: name, Pos: pos, Class: class, Address: name, Port: 22, User: "root", Capacity: corev1.ResourceList{}, Vars: vars}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return h, inventory.At(pos, "host %q cannot be an SSHHost name: %s", name, strings.Join(errs, "; "))
	}
	if class != "" {
		if errs := validation.IsValidLabelValue(class); len(errs) > 0 {
			return h, inventory.At(pos, "host %s: class %q is not a label value: %s", name, class, strings.Join(errs, "; "))
		}
	}
	if v, ok := vars["ansible_host"]; ok {
		h.Address = v
	}
	if net.ParseIP(h.Address) == nil && len(validation.IsDNS1123Subdomain(strings.ToLower(h.Address))) > 0 {
		return h, inventory.At(pos, "host %s: address %q is neither an IP nor a DNS name", name, h.Address)
	}
	if v, ok := vars["ansible_port"]; ok {
		p, err := strconv.Atoi(v)
		if err != nil || p < 1 || p > 65535 {
			return h, inventory.At(pos, "host %s: ansible_port %q is not a port (1-65535)", name, v)
		}
		h.Port = int32(p)
	}
	if v, ok := vars["ansible_user"]; ok {
		if v == "" || len(v) > 32 || strings.ContainsAny(v, " \t/:@") {
			return h, inventory.At(pos, "host %s: ansible_user %q is not a user name (1-32 characters)", name, v)
		}
		h.User = v
	}
	if v, ok := vars[VarNodeAddress]; ok {
		if net.ParseIP(v) == nil {
			return h, inventory.At(pos, "host %s: %s %q is not an IP", name, VarNodeAddress, v)
		}
		h.NodeAddress = v
	}
	for k, v := range vars {
		res, ok := strings.CutPrefix(k, VarCapacityPrefix)
		if !ok {
			continue
		}
		res = strings.ReplaceAll(res, "_", "-")
		if errs := validation.IsQualifiedName(res); res == "" || len(errs) > 0 {
			return h, inventory.At(pos, "host %s: %s does not name a resource", name, k)
		}
		q, err := resource.ParseQuantity(v)
		if err != nil || q.Sign() <= 0 {
			return h, inventory.At(pos, "host %s: %s %q is not a positive quantity", name, k, v)
		}
		h.Capacity[corev1.ResourceName(res)] = q
	}
	for _, need := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if _, ok := h.Capacity[need]; !ok {
			return h, inventory.At(pos, "host %s: missing capacity %s (set %s%s for the host or one of its groups)", name, need, VarCapacityPrefix, need)
		}
	}
	return h, nil
}

// InventoryManifests renders the hosts as SSHHost objects in namespace ns,
// each referencing keySecret.
func InventoryManifests(hosts []InventoryHost, ns, keySecret string) []*v1beta1.SSHHost {
	out := make([]*v1beta1.SSHHost, 0, len(hosts))
	for _, h := range hosts {
		obj := &v1beta1.SSHHost{
			TypeMeta:   metav1.TypeMeta{APIVersion: v1beta1.SchemeGroupVersion.String(), Kind: "SSHHost"},
			ObjectMeta: metav1.ObjectMeta{Name: h.Name, Namespace: ns},
			Spec: v1beta1.SSHHostSpec{
				Address:         h.Address,
				Port:            h.Port,
				User:            h.User,
				NodeAddress:     h.NodeAddress,
				SSHKeySecretRef: v1beta1.LocalObjectReference{Name: keySecret},
				Capacity:        h.Capacity,
			},
		}
		if h.Class != "" {
			obj.Labels = map[string]string{v1beta1.LabelHostClass: h.Class}
		}
		out = append(out, obj)
	}
	return out
}

// writeManifests writes objects as a multi-document YAML stream.
func writeManifests(w io.Writer, objs ...any) error {
	for _, o := range objs {
		b, err := sigyaml.Marshal(o)
		if err != nil {
			return err
		}
		// status: {} of an empty status says nothing and is not ours to set.
		b = bytes.Replace(b, []byte("\nstatus: {}\n"), []byte("\n"), 1)
		if _, err := fmt.Fprintf(w, "---\n%s", b); err != nil {
			return err
		}
	}
	return nil
}

// keySecret reads an SSH private key file into the key Secret; an encrypted
// key is refused (the controller cannot type a passphrase).
func keySecret(path, name, ns string) (*corev1.Secret, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, usageErr("--key-file: %v", err)
	}
	if info.Size() > 64*1024 {
		return nil, usageErr("--key-file %s: larger than 64 KiB, not an SSH private key", path)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, usageErr("--key-file: %v", err)
	}
	if _, err := ssh.ParseRawPrivateKey(b); err != nil {
		var pp *ssh.PassphraseMissingError
		if errors.As(err, &pp) {
			return nil, usageErr("--key-file %s: the key is passphrase-protected; the controller needs an unencrypted key", path)
		}
		// The parser's message never quotes key material.
		return nil, usageErr("--key-file %s: not an SSH private key: %v", path, err)
	}
	return &corev1.Secret{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Type:       corev1.SecretTypeOpaque,
		StringData: map[string]string{"privateKey": string(b)},
	}, nil
}

// ImportInventoryUsage is import-inventory's help text.
const ImportInventoryUsage = `usage: kpssh import-inventory [flags] INVENTORY

Turns an Ansible inventory (a file or a directory) into SSHHost manifests on
stdout, preceded by the key Secret when --key-file is given:

  ansible_host / ansible_port / ansible_user  → spec.address / port / user (INI host:port works too)
  kpssh_capacity_cpu, _memory, _pods, …       → spec.capacity (cpu and memory required)
  kpssh_node_address                          → spec.nodeAddress
  the group listing a host                    → label karpenter.dklesev.github.io/host-class

With ansible-inventory on PATH, the inventory is what "ansible-inventory
--list" resolves (group_vars/, host_vars/, plugins, all of Ansible's rules).
Without it, a built-in parser reads INI and YAML files (all:vars, parent
groups, the group, the host; ranges like node[01:20]) and warns about the
group_vars/ and host_vars/ it does not read. A host in a group and in its
child group takes the child's class. Ambiguous input is refused (with its
line, when the built-in parser read it): a host in two unrelated class
groups, a host listed twice, a bad range, a missing capacity, two hosts of
one machine (the same address and port, or the same node address, compared
normalised: 2001:DB8:0::1 is 2001:db8::1, names in any case are one; names
are not resolved). Apply with:

  kpssh import-inventory --key-file ~/.ssh/pool inventory.ini | kubectl apply -f -

flags:
`

// inventoryFlags are how import-inventory reads the inventory.
type inventoryFlags struct {
	parser, format string
	timeout        time.Duration
	classGroups    string
}

// load reads the inventory at path with ansible-inventory or the built-in
// parser, writing their warnings to stderr.
func (f inventoryFlags) load(ctx context.Context, path string, stderr io.Writer) (*inventory.Inventory, error) {
	if f.parser != "auto" && f.parser != "ansible" && f.parser != "builtin" {
		return nil, usageErr("--parser %q: want auto, ansible or builtin", f.parser)
	}
	if _, err := os.Stat(path); err != nil {
		return nil, usageErr("%v", err)
	}
	bin, lookErr := exec.LookPath("ansible-inventory")
	switch {
	case f.parser == "builtin" || f.parser == "auto" && lookErr != nil:
		return f.loadBuiltin(path, stderr)
	case lookErr != nil:
		return nil, usageErr("--parser ansible: %v", lookErr)
	}
	return f.loadAnsible(ctx, bin, path, stderr)
}

func (f inventoryFlags) loadBuiltin(path string, stderr io.Writer) (*inventory.Inventory, error) {
	inv, warnings, err := inventory.ReadPath(path, f.format)
	for _, w := range warnings {
		fmt.Fprintf(stderr, "kpssh import-inventory: warning: %s\n", w)
	}
	if err != nil {
		return nil, usageErr("%s: %v", path, err)
	}
	return inv, nil
}

// loadAnsible: ansible-inventory's refusal of the inventory is a usage
// error; its failing otherwise (a timeout) is a runtime one.
func (f inventoryFlags) loadAnsible(ctx context.Context, bin, path string, stderr io.Writer) (*inventory.Inventory, error) {
	out, said, err := inventory.RunAnsible(ctx, bin, path, f.timeout)
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		return nil, usageErr("%v", err)
	case err != nil && said != "":
		return nil, runtimeErr("%v (it said: %s)", err, said)
	case err != nil:
		return nil, runtimeErr("%v", err)
	case said != "":
		fmt.Fprintf(stderr, "kpssh import-inventory: ansible-inventory said: %s\n", said)
	}
	inv, err := inventory.FromJSON(out)
	if err != nil {
		return nil, runtimeErr("%v", err)
	}
	return inv, nil
}

func (f inventoryFlags) options() InventoryOptions {
	var o InventoryOptions
	for _, g := range strings.Split(f.classGroups, ",") {
		if g = strings.TrimSpace(g); g != "" {
			o.ClassGroups = append(o.ClassGroups, g)
		}
	}
	return o
}

// ImportInventory is `kpssh import-inventory` (args without the subcommand
// name).
func ImportInventory(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return runSub(ctx, "import-inventory", args, stdout, stderr)
}

func (d deps) importInventoryCommand() *cobra.Command {
	var f importFlags
	c := d.command("import-inventory", "turn an Ansible inventory into SSHHost manifests and a key Secret", ImportInventoryUsage,
		func(c *cobra.Command, pos []string) error { return d.importInventory(c.Context(), f, pos) })
	fs := c.Flags()
	fs.StringVarP(&f.ns, "namespace", "n", poolNamespace(d.getenv), "pool `namespace` of the manifests; $POOL_NAMESPACE sets the default")
	fs.StringVar(&f.inv.parser, "parser", "auto", "`how` to read the inventory: auto (ansible-inventory when on PATH, else the built-in parser), ansible or builtin")
	fs.StringVar(&f.inv.format, "format", "", "inventory `format` for the built-in parser: ini or yaml (default: from the extension, else the content)")
	fs.DurationVar(&f.inv.timeout, "ansible-timeout", 2*time.Minute, "`bound` on ansible-inventory --list (inventory plugins may ask remote APIs)")
	fs.StringVar(&f.keyFile, "key-file", "", "SSH private key `path` to put into the key Secret (no Secret is written without it)")
	fs.StringVar(&f.secretName, "key-secret", "kpssh-ssh-key", "`name` of the key Secret the hosts reference")
	fs.StringVar(&f.inv.classGroups, "class-groups", "", "comma-separated `groups` that are host classes (default: every group listing hosts)")
	_ = c.RegisterFlagCompletionFunc("parser", cobra.FixedCompletions([]string{"auto", "ansible", "builtin"}, cobra.ShellCompDirectiveNoFileComp))
	_ = c.RegisterFlagCompletionFunc("format", cobra.FixedCompletions([]string{"ini", "yaml"}, cobra.ShellCompDirectiveNoFileComp))
	return c
}

// importFlags are import-inventory's flags.
type importFlags struct {
	inv                     inventoryFlags
	ns, keyFile, secretName string
}

func (d deps) importInventory(ctx context.Context, f importFlags, pos []string) error {
	if len(pos) != 1 {
		return withUsage("want INVENTORY, got %d argument(s)", len(pos))
	}
	ns := f.ns
	if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
		return usageErr("--namespace %q: %s", ns, strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Subdomain(f.secretName); len(errs) > 0 {
		return usageErr("--key-secret %q: %s", f.secretName, strings.Join(errs, "; "))
	}
	if f.inv.timeout <= 0 {
		return usageErr("--ansible-timeout must be positive")
	}
	path := pos[0]
	inv, err := f.inv.load(ctx, path, d.stderr)
	if err != nil {
		return err
	}
	hosts, err := inventoryHosts(inv, f.inv.options())
	if err != nil {
		return usageErr("%s: %v", path, err)
	}
	if len(hosts) == 0 {
		return usageErr("%s: no hosts", path)
	}
	var objs []any
	if f.keyFile != "" {
		s, err := keySecret(f.keyFile, f.secretName, ns)
		if err != nil {
			return err
		}
		objs = append(objs, s)
	}
	warnKeyFiles(hosts, f.secretName, d.stderr)
	for _, h := range InventoryManifests(hosts, ns, f.secretName) {
		objs = append(objs, h)
	}
	if err := writeManifests(d.stdout, objs...); err != nil {
		return runtimeErr("write: %v", err)
	}
	fmt.Fprintf(d.stderr, "kpssh import-inventory: %d SSHHost(s) in namespace %s\n", len(hosts), ns)
	return nil
}

// warnKeyFiles: a host's own private key file is not what it will use.
func warnKeyFiles(hosts []InventoryHost, secretName string, stderr io.Writer) {
	var names []string
	for _, h := range hosts {
		if h.Vars["ansible_ssh_private_key_file"]+h.Vars["ansible_private_key_file"] != "" {
			names = append(names, h.Name)
		}
	}
	if len(names) > 0 {
		sort.Strings(names)
		fmt.Fprintf(stderr, "kpssh import-inventory: warning: %d host(s) set a private key file (%s…); every host references Secret %s\n", len(names), names[0], secretName)
	}
}
