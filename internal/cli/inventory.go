package cli

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/crypto/ssh"
	"gopkg.in/yaml.v3"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	sigyaml "sigs.k8s.io/yaml"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/providers/pool"
)

// Host variables import-inventory reads (besides ansible_host, ansible_port,
// ansible_user). kpssh_capacity_<name> becomes capacity <name> with "_"
// read as "-" (kpssh_capacity_ephemeral_storage → ephemeral-storage).
const (
	VarCapacityPrefix = "kpssh_capacity_"
	VarNodeAddress    = "kpssh_node_address"
)

// MaxInventoryBytes bounds an inventory file (a pool of thousands of hosts is
// well below it).
const MaxInventoryBytes = 8 << 20

// maxRangeHosts bounds what one range pattern may expand to: a typo like
// node[1:99999999] must be an error, not an out-of-memory.
const maxRangeHosts = 10000

// maxInventoryHosts bounds a whole inventory (many large ranges).
const maxInventoryHosts = 50000

// InventoryHost is one host of an inventory, resolved: its effective
// variables (all → ancestor groups → its groups → its own), its class and
// where it was defined.
type InventoryHost struct {
	Name        string
	Line        int // the line that defines the host (first occurrence)
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

// lineError is a parse error tied to a line of the input.
type lineError struct {
	line int
	msg  string
}

func (e *lineError) Error() string { return fmt.Sprintf("line %d: %s", e.line, e.msg) }

func errAt(line int, format string, a ...any) error {
	return &lineError{line: line, msg: fmt.Sprintf(format, a...)}
}

// invHost is a host occurrence in one group, before resolution.
type invHost struct {
	line int
	vars map[string]string
}

// invGroup is a group of the raw inventory.
type invGroup struct {
	name     string
	line     int
	hosts    map[string]invHost // direct members
	order    []string
	children []string
	vars     map[string]string
	varLine  map[string]int
}

// rawInventory is the parsed file: groups with hosts, children and vars.
type rawInventory struct {
	groups map[string]*invGroup
	order  []string
	hosts  int // host entries so far, for maxInventoryHosts
}

func newRaw() *rawInventory {
	return &rawInventory{groups: map[string]*invGroup{}}
}

func (r *rawInventory) group(name string, line int) *invGroup {
	g, ok := r.groups[name]
	if !ok {
		g = &invGroup{name: name, line: line, hosts: map[string]invHost{}, vars: map[string]string{}, varLine: map[string]int{}}
		r.groups[name] = g
		r.order = append(r.order, name)
	}
	return g
}

func (r *rawInventory) addHost(group, pattern string, line int, vars map[string]string) error {
	names, err := expandRange(pattern)
	if err != nil {
		return errAt(line, "host %q: %v", pattern, err)
	}
	if r.hosts += len(names); r.hosts > maxInventoryHosts {
		return errAt(line, "the inventory lists more than %d hosts", maxInventoryHosts)
	}
	g := r.group(group, line)
	for _, n := range names {
		if prev, dup := g.hosts[n]; dup {
			return errAt(line, "host %q listed twice in group [%s] (first on line %d)", n, group, prev.line)
		}
		g.hosts[n] = invHost{line: line, vars: vars}
		g.order = append(g.order, n)
	}
	return nil
}

// ParseInventory reads an Ansible inventory, INI or YAML (format "ini",
// "yaml" or "" = detect from the content), and resolves its hosts. Every
// refusal names the line it is about.
func ParseInventory(data []byte, format string, o InventoryOptions) ([]InventoryHost, error) {
	if len(data) > MaxInventoryBytes {
		return nil, fmt.Errorf("inventory is larger than %d bytes", MaxInventoryBytes)
	}
	if format == "" {
		format = detectFormat(data)
	}
	var raw *rawInventory
	var err error
	switch format {
	case "ini":
		raw, err = parseINI(data)
	case "yaml":
		raw, err = parseYAMLInventory(data)
	default:
		return nil, fmt.Errorf("unknown inventory format %q (want ini or yaml)", format)
	}
	if err != nil {
		return nil, err
	}
	return raw.resolve(o)
}

// detectFormat: a YAML inventory starts with a mapping key ("all:", a group
// name followed by ":") or a document marker; an INI one with a section or a
// host line.
func detectFormat(data []byte) string {
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64*1024), MaxInventoryBytes)
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if l == "" || l[0] == '#' || l[0] == ';' {
			continue
		}
		if l == "---" || l == "{" || (strings.HasSuffix(l, ":") && !strings.HasPrefix(l, "[")) {
			return "yaml"
		}
		return "ini"
	}
	return "ini"
}

// parseINI reads Ansible's INI inventory: [group], [group:vars],
// [group:children] sections, host lines "name k=v k='v w'", hosts before any
// section in group "ungrouped", # and ; comments.
func parseINI(data []byte) (*rawInventory, error) {
	r := newRaw()
	section, kind := "ungrouped", "hosts"
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64*1024), MaxInventoryBytes)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' || line[0] == ';' {
			continue
		}
		if line[0] == '[' {
			if !strings.HasSuffix(line, "]") {
				return nil, errAt(n, "malformed section header %q", line)
			}
			name := strings.TrimSpace(line[1 : len(line)-1])
			section, kind = name, "hosts"
			if i := strings.LastIndexByte(name, ':'); i >= 0 {
				section, kind = name[:i], name[i+1:]
				if kind != "vars" && kind != "children" {
					return nil, errAt(n, "section [%s]: unknown suffix %q (want :vars or :children)", name, kind)
				}
			}
			if err := validGroupName(section); err != nil {
				return nil, errAt(n, "section [%s]: %v", name, err)
			}
			r.group(section, n)
			continue
		}
		switch kind {
		case "vars":
			k, v, ok := strings.Cut(line, "=")
			k = strings.TrimSpace(k)
			if !ok || k == "" || strings.ContainsAny(k, " \t") {
				return nil, errAt(n, "[%s:vars]: want NAME=VALUE, got %q", section, line)
			}
			val, err := unquote(strings.TrimSpace(v))
			if err != nil {
				return nil, errAt(n, "[%s:vars] %s: %v", section, k, err)
			}
			g := r.group(section, n)
			if prev, dup := g.varLine[k]; dup {
				return nil, errAt(n, "[%s:vars]: %s set twice (first on line %d)", section, k, prev)
			}
			g.vars[k], g.varLine[k] = val, n
		case "children":
			if strings.ContainsAny(line, " \t=") {
				return nil, errAt(n, "[%s:children]: want one group name per line, got %q", section, line)
			}
			if err := validGroupName(line); err != nil {
				return nil, errAt(n, "[%s:children] %q: %v", section, line, err)
			}
			g := r.group(section, n)
			g.children = append(g.children, line)
			r.group(line, n)
		default:
			fields, err := splitINIFields(line)
			if err != nil {
				return nil, errAt(n, "%v", err)
			}
			vars := map[string]string{}
			for _, f := range fields[1:] {
				k, v, ok := strings.Cut(f, "=")
				if !ok || k == "" {
					return nil, errAt(n, "host %s: want NAME=VALUE, got %q", fields[0], f)
				}
				if _, dup := vars[k]; dup {
					return nil, errAt(n, "host %s: %s set twice", fields[0], k)
				}
				if vars[k], err = unquote(v); err != nil {
					return nil, errAt(n, "host %s: %s: %v", fields[0], k, err)
				}
			}
			// Ansible's "host:port" form (the port after any range).
			pattern := fields[0]
			if i := strings.LastIndexByte(pattern, ':'); i > strings.LastIndexByte(pattern, ']') && strings.Count(pattern, "[") == strings.Count(pattern, "]") {
				if _, set := vars["ansible_port"]; set {
					return nil, errAt(n, "host %s: port given twice (host:port and ansible_port)", pattern)
				}
				pattern, vars["ansible_port"] = pattern[:i], pattern[i+1:]
			}
			if err := r.addHost(section, pattern, n, vars); err != nil {
				return nil, err
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read inventory: %w", err)
	}
	return r, nil
}

// splitINIFields splits a host line on blanks outside quotes, keeping the
// quotes (unquote removes them per value). A '#' after a blank starts a
// comment.
func splitINIFields(line string) ([]string, error) {
	var out []string
	var cur strings.Builder
	var quote byte
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case quote != 0:
			cur.WriteByte(c)
			if c == quote {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
			cur.WriteByte(c)
		case c == ' ' || c == '\t':
			if cur.Len() > 0 {
				out = append(out, cur.String())
				cur.Reset()
			}
		case c == '#' && cur.Len() == 0:
			i = len(line)
		default:
			cur.WriteByte(c)
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("unterminated %c quote", quote)
	}
	if cur.Len() > 0 {
		out = append(out, cur.String())
	}
	if len(out) == 0 {
		return nil, errors.New("empty host line")
	}
	return out, nil
}

func unquote(v string) (string, error) {
	if len(v) >= 2 && (v[0] == '\'' || v[0] == '"') {
		if v[len(v)-1] != v[0] {
			return "", fmt.Errorf("unterminated quote in %q", v)
		}
		return v[1 : len(v)-1], nil
	}
	if strings.ContainsAny(v, "'\"") {
		return "", fmt.Errorf("stray quote in %q", v)
	}
	return v, nil
}

func validGroupName(name string) error {
	if name == "" {
		return errors.New("empty group name")
	}
	for _, c := range name {
		if !(c == '_' || c == '-' || c == '.' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return fmt.Errorf("group name %q has character %q", name, c)
		}
	}
	return nil
}

// parseYAMLInventory reads Ansible's YAML inventory: nested groups with
// hosts, vars and children, starting at the top-level groups (usually all).
func parseYAMLInventory(data []byte) (*rawInventory, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("inventory YAML: %w", err)
	}
	r := newRaw()
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return r, nil
	}
	root := doc.Content[0]
	if root.Kind == yaml.ScalarNode && root.Tag == "!!null" {
		return r, nil
	}
	if root.Kind != yaml.MappingNode {
		return nil, errAt(root.Line, "inventory must be a mapping of groups")
	}
	for i := 0; i+1 < len(root.Content); i += 2 {
		if err := r.yamlGroup(root.Content[i], root.Content[i+1], 0); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// yamlGroup reads one group mapping (hosts, vars, children). A group may
// appear under several parents; its bodies merge as in Ansible (a var set to
// two values is refused).
func (r *rawInventory) yamlGroup(key, val *yaml.Node, depth int) error {
	if key.Kind != yaml.ScalarNode {
		return errAt(key.Line, "group name must be a string")
	}
	name := key.Value
	if err := validGroupName(name); err != nil {
		return errAt(key.Line, "%v", err)
	}
	if depth > 64 {
		return errAt(key.Line, "groups nested deeper than 64")
	}
	g := r.group(name, key.Line)
	if val.Kind == yaml.ScalarNode && val.Tag == "!!null" {
		return nil
	}
	if val.Kind != yaml.MappingNode {
		return errAt(val.Line, "group %s: want a mapping with hosts, vars, children", name)
	}
	keys := map[string]int{}
	for i := 0; i+1 < len(val.Content); i += 2 {
		k, v := val.Content[i], val.Content[i+1]
		if prev, dup := keys[k.Value]; dup {
			return errAt(k.Line, "group %s: %q twice (first on line %d)", name, k.Value, prev)
		}
		keys[k.Value] = k.Line
		if v.Kind == yaml.ScalarNode && v.Tag == "!!null" {
			continue
		}
		switch k.Value {
		case "hosts":
			if v.Kind != yaml.MappingNode {
				return errAt(v.Line, "group %s: hosts must be a mapping of host names", name)
			}
			for j := 0; j+1 < len(v.Content); j += 2 {
				hk, hv := v.Content[j], v.Content[j+1]
				if hk.Kind != yaml.ScalarNode || hk.Value == "" {
					return errAt(hk.Line, "group %s: host name must be a string", name)
				}
				vars, _, err := yamlVars(hv, "host "+hk.Value)
				if err != nil {
					return err
				}
				if err := r.addHost(name, hk.Value, hk.Line, vars); err != nil {
					return err
				}
			}
		case "vars":
			vars, lines, err := yamlVars(v, "group "+name+" vars")
			if err != nil {
				return err
			}
			for vk, vv := range vars {
				if prev, dup := g.varLine[vk]; dup && g.vars[vk] != vv {
					return errAt(lines[vk], "group %s: %s is %q here and %q on line %d", name, vk, vv, g.vars[vk], prev)
				}
				g.vars[vk], g.varLine[vk] = vv, lines[vk]
			}
		case "children":
			if v.Kind != yaml.MappingNode {
				return errAt(v.Line, "group %s: children must be a mapping of groups", name)
			}
			for j := 0; j+1 < len(v.Content); j += 2 {
				g.children = append(g.children, v.Content[j].Value)
				if err := r.yamlGroup(v.Content[j], v.Content[j+1], depth+1); err != nil {
					return err
				}
			}
		default:
			return errAt(k.Line, "group %s: unknown key %q (want hosts, vars or children)", name, k.Value)
		}
	}
	return nil
}

// yamlVars reads a mapping of scalar variables; a host's null value is no
// variables. Non-scalar values (lists, dicts) are kept out: none of the
// variables import-inventory reads is structured.
func yamlVars(n *yaml.Node, what string) (map[string]string, map[string]int, error) {
	vars, lines := map[string]string{}, map[string]int{}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return vars, lines, nil
	}
	if n.Kind != yaml.MappingNode {
		return nil, nil, errAt(n.Line, "%s: want a mapping of variables", what)
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			return nil, nil, errAt(k.Line, "%s: variable name must be a string", what)
		}
		if prev, dup := lines[k.Value]; dup {
			return nil, nil, errAt(k.Line, "%s: %s set twice (first on line %d)", what, k.Value, prev)
		}
		lines[k.Value] = k.Line
		if v.Kind == yaml.ScalarNode {
			vars[k.Value] = v.Value
		} else if strings.HasPrefix(k.Value, "kpssh_") || strings.HasPrefix(k.Value, "ansible_") {
			return nil, nil, errAt(v.Line, "%s: %s must be a plain value", what, k.Value)
		}
	}
	return vars, lines, nil
}

// expandRange expands Ansible host ranges: node[01:20] (width kept),
// node[1:9:2] (step), rack[a:f]; several ranges multiply.
func expandRange(pattern string) ([]string, error) {
	i := strings.IndexByte(pattern, '[')
	if i < 0 {
		if strings.ContainsRune(pattern, ']') {
			return nil, errors.New("']' without '['")
		}
		return []string{pattern}, nil
	}
	j := strings.IndexByte(pattern[i:], ']')
	if j < 0 {
		return nil, errors.New("unterminated range '['")
	}
	j += i
	body := pattern[i+1 : j]
	parts := strings.Split(body, ":")
	if len(parts) < 2 || len(parts) > 3 {
		return nil, fmt.Errorf("range [%s]: want [start:end] or [start:end:step]", body)
	}
	step := 1
	if len(parts) == 3 {
		s, err := strconv.Atoi(parts[2])
		if err != nil || s < 1 {
			return nil, fmt.Errorf("range [%s]: step must be a positive integer", body)
		}
		step = s
	}
	var items []string
	lo, hi := parts[0], parts[1]
	if a, errA := strconv.Atoi(lo); errA == nil {
		b, errB := strconv.Atoi(hi)
		if errB != nil || a < 0 || b < a {
			return nil, fmt.Errorf("range [%s]: want numbers start ≤ end", body)
		}
		if (b-a)/step+1 > maxRangeHosts {
			return nil, fmt.Errorf("range [%s] expands to more than %d hosts", body, maxRangeHosts)
		}
		width := 0
		if len(lo) > 1 && lo[0] == '0' {
			width = len(lo)
		}
		for k := a; k <= b; k += step {
			items = append(items, fmt.Sprintf("%0*d", width, k))
		}
	} else {
		if len(lo) != 1 || len(hi) != 1 || !isLower(lo[0]) || !isLower(hi[0]) || hi[0] < lo[0] {
			return nil, fmt.Errorf("range [%s]: want numbers or single lowercase letters start ≤ end", body)
		}
		for c := int(lo[0]); c <= int(hi[0]); c += step {
			items = append(items, string(rune(c)))
		}
	}
	rest, err := expandRange(pattern[j+1:])
	if err != nil {
		return nil, err
	}
	if len(items)*len(rest) > maxRangeHosts {
		return nil, fmt.Errorf("%q expands to more than %d hosts", pattern, maxRangeHosts)
	}
	out := make([]string, 0, len(items)*len(rest))
	for _, it := range items {
		for _, r := range rest {
			out = append(out, pattern[:i]+it+r)
		}
	}
	return out, nil
}

func isLower(c byte) bool { return c >= 'a' && c <= 'z' }

// resolve computes each host's groups (direct ones and their ancestors),
// variables and class, and validates what becomes an SSHHost.
func (r *rawInventory) resolve(o InventoryOptions) ([]InventoryHost, error) {
	parents := map[string][]string{}
	for _, name := range r.order {
		for _, c := range r.groups[name].children {
			parents[c] = append(parents[c], name)
		}
	}
	// Each group's depth (longest parent chain) and ancestor set, memoized:
	// enumerating paths would be exponential in diamond-shaped children.
	// Variables apply in Ansible's order: all, then groups by depth, then
	// name, then the host's own.
	const visiting = -1
	depth := map[string]int{}
	anc := map[string]map[string]bool{}
	var visit func(g string) error
	visit = func(g string) error {
		if d, ok := depth[g]; ok {
			if d == visiting {
				return errAt(r.groups[g].line, "group %s is its own ancestor (children cycle)", g)
			}
			return nil
		}
		depth[g] = visiting
		d, set := 0, map[string]bool{}
		for _, p := range parents[g] {
			if err := visit(p); err != nil {
				return err
			}
			d = max(d, depth[p]+1)
			set[p] = true
			for a := range anc[p] {
				set[a] = true
			}
		}
		depth[g], anc[g] = d, set
		return nil
	}
	for _, name := range r.order {
		if err := visit(name); err != nil {
			return nil, err
		}
	}

	classGroups := map[string]bool{}
	for _, c := range o.ClassGroups {
		if _, ok := r.groups[c]; !ok {
			return nil, fmt.Errorf("--class-groups: no group %q in the inventory", c)
		}
		classGroups[c] = true
	}
	if len(o.ClassGroups) == 0 {
		for name, g := range r.groups {
			if len(g.hosts) > 0 && name != "all" && name != "ungrouped" {
				classGroups[name] = true
			}
		}
	}

	type occ struct {
		group string
		h     invHost
	}
	byHost := map[string][]occ{}
	var hostOrder []string
	for _, name := range r.order {
		g := r.groups[name]
		for _, h := range g.order {
			if _, ok := byHost[h]; !ok {
				hostOrder = append(hostOrder, h)
			}
			byHost[h] = append(byHost[h], occ{name, g.hosts[h]})
		}
	}

	var out []InventoryHost
	for _, name := range hostOrder {
		occs := byHost[name]
		first := occs[0].h.line
		for _, oc := range occs {
			first = min(first, oc.h.line)
		}
		// The groups of the host, in precedence order, and its own vars.
		set := map[string]bool{}
		own := map[string]string{}
		ownLine := map[string]int{}
		for _, oc := range occs {
			set[oc.group] = true
			for g := range anc[oc.group] {
				set[g] = true
			}
			for k, v := range oc.h.vars {
				if prev, ok := own[k]; ok && prev != v {
					return nil, errAt(oc.h.line, "host %s: %s is %q here and %q on line %d", name, k, v, prev, ownLine[k])
				}
				own[k], ownLine[k] = v, oc.h.line
			}
		}
		delete(set, "all")
		groups := make([]string, 0, len(set)+1)
		for g := range set {
			groups = append(groups, g)
		}
		sort.Slice(groups, func(i, j int) bool {
			if depth[groups[i]] != depth[groups[j]] {
				return depth[groups[i]] < depth[groups[j]]
			}
			return groups[i] < groups[j]
		})
		if _, ok := r.groups["all"]; ok {
			groups = append([]string{"all"}, groups...)
		}
		vars := map[string]string{}
		for _, g := range groups {
			for k, v := range r.groups[g].vars {
				vars[k] = v
			}
		}
		for k, v := range own {
			vars[k] = v
		}

		var class string
		classLine := 0
		for _, g := range groups {
			if !classGroups[g] {
				continue
			}
			line := r.groups[g].line
			for _, oc := range occs {
				if oc.group == g {
					line = oc.h.line
				}
			}
			if class != "" {
				return nil, errAt(max(line, classLine), "host %s is in two class groups, %s (line %d) and %s (line %d): a host has one class (pick the class groups with --class-groups)", name, class, classLine, g, line)
			}
			class, classLine = g, line
		}
		h, err := inventoryHost(name, first, class, vars)
		if err != nil {
			return nil, err
		}
		out = append(out, h)
	}

	if err := oneHostPerMachine(out); err != nil {
		return nil, err
	}
	return out, nil
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
			report(errAt(h.Line, "host %s has the address %s of host %s (line %d)", h.Name, k, prev.Name, prev.Line))
			continue
		}
		byAddr[k] = h
		nk := pool.NodeIdentity(h.NodeAddress, h.Address)
		if nk == "" {
			continue
		}
		if prev, dup := byNode[nk]; dup {
			report(errAt(h.Line, "host %s has the node address %s of host %s (line %d) (%s, else the address when it is an IP: give each host its own %s)",
				h.Name, nk, prev.Name, prev.Line, VarNodeAddress, VarNodeAddress))
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

func inventoryHost(name string, line int, class string, vars map[string]string) (InventoryHost, error) {
	h := InventoryHost{Name: name, Line: line, Class: class, Address: name, Port: 22, User: "root", Capacity: corev1.ResourceList{}, Vars: vars}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return h, errAt(line, "host %q cannot be an SSHHost name: %s", name, strings.Join(errs, "; "))
	}
	if class != "" {
		if errs := validation.IsValidLabelValue(class); len(errs) > 0 {
			return h, errAt(line, "host %s: class %q is not a label value: %s", name, class, strings.Join(errs, "; "))
		}
	}
	if v, ok := vars["ansible_host"]; ok {
		h.Address = v
	}
	if net.ParseIP(h.Address) == nil && len(validation.IsDNS1123Subdomain(strings.ToLower(h.Address))) > 0 {
		return h, errAt(line, "host %s: address %q is neither an IP nor a DNS name", name, h.Address)
	}
	if v, ok := vars["ansible_port"]; ok {
		p, err := strconv.Atoi(v)
		if err != nil || p < 1 || p > 65535 {
			return h, errAt(line, "host %s: ansible_port %q is not a port (1-65535)", name, v)
		}
		h.Port = int32(p)
	}
	if v, ok := vars["ansible_user"]; ok {
		if v == "" || len(v) > 32 || strings.ContainsAny(v, " \t/:@") {
			return h, errAt(line, "host %s: ansible_user %q is not a user name (1-32 characters)", name, v)
		}
		h.User = v
	}
	if v, ok := vars[VarNodeAddress]; ok {
		if net.ParseIP(v) == nil {
			return h, errAt(line, "host %s: %s %q is not an IP", name, VarNodeAddress, v)
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
			return h, errAt(line, "host %s: %s does not name a resource", name, k)
		}
		q, err := resource.ParseQuantity(v)
		if err != nil || q.Sign() <= 0 {
			return h, errAt(line, "host %s: %s %q is not a positive quantity", name, k, v)
		}
		h.Capacity[corev1.ResourceName(res)] = q
	}
	for _, need := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if _, ok := h.Capacity[need]; !ok {
			return h, errAt(line, "host %s: missing capacity %s (set %s%s for the host or one of its groups)", name, need, VarCapacityPrefix, need)
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
const ImportInventoryUsage = `usage: kpssh import-inventory [flags] FILE

Turns an Ansible inventory (INI or YAML) into SSHHost manifests on stdout,
preceded by the key Secret when --key-file is given:

  ansible_host / ansible_port / ansible_user  → spec.address / port / user (INI host:port works too)
  kpssh_capacity_cpu, _memory, _pods, …       → spec.capacity (cpu and memory required)
  kpssh_node_address                          → spec.nodeAddress
  the group listing a host                    → label karpenter.dklesev.github.io/host-class

Variables resolve like Ansible's (all:vars, parent groups, the group, the
host); ranges like node[01:20] expand. Ambiguous input is refused with its
line: a host in two class groups, a host listed twice, a bad range, a missing
capacity, two hosts of one machine (the same address and port, or the same
node address, compared normalised: 2001:DB8:0::1 is 2001:db8::1, names in
any case are one; names are not resolved). Apply with:

  kpssh import-inventory --key-file ~/.ssh/pool inventory.ini | kubectl apply -f -

flags:
`

// ImportInventory is `kpssh import-inventory`.
func ImportInventory(_ context.Context, args []string, stdout, stderr io.Writer) int {
	c := newSubcommand("kpssh import-inventory", ImportInventoryUsage, stderr)
	fs := c.fs
	defNS := os.Getenv("POOL_NAMESPACE")
	if defNS == "" {
		defNS = v1beta1.DefaultPoolNamespace
	}
	ns := fs.String("namespace", defNS, "pool `namespace` of the manifests; $POOL_NAMESPACE sets the default")
	format := fs.String("format", "", "inventory `format`: ini or yaml (default: from the content)")
	keyFile := fs.String("key-file", "", "SSH private key `path` to put into the key Secret (no Secret is written without it)")
	secretName := fs.String("key-secret", "kpssh-ssh-key", "`name` of the key Secret the hosts reference")
	classGroups := fs.String("class-groups", "", "comma-separated `groups` that are host classes (default: every group listing hosts)")
	pos, code, done := c.parse(args)
	if done {
		return code
	}
	fail := c.fail
	if len(pos) != 1 {
		fmt.Fprintf(stderr, "kpssh import-inventory: want FILE, got %d argument(s)\n", len(pos))
		fs.Usage()
		return ExitUsage
	}
	if errs := validation.IsDNS1123Label(*ns); len(errs) > 0 {
		return fail(usageErr("--namespace %q: %s", *ns, strings.Join(errs, "; ")))
	}
	if errs := validation.IsDNS1123Subdomain(*secretName); len(errs) > 0 {
		return fail(usageErr("--key-secret %q: %s", *secretName, strings.Join(errs, "; ")))
	}
	var o InventoryOptions
	for _, g := range strings.Split(*classGroups, ",") {
		if g = strings.TrimSpace(g); g != "" {
			o.ClassGroups = append(o.ClassGroups, g)
		}
	}
	path := pos[0]
	f, err := os.Open(path)
	if err != nil {
		return fail(usageErr("%v", err))
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxInventoryBytes+1))
	f.Close()
	if err != nil {
		return fail(usageErr("read %s: %v", path, err))
	}
	if *format == "" {
		switch strings.ToLower(filepath.Ext(path)) {
		case ".yml", ".yaml", ".json":
			*format = "yaml"
		case ".ini", ".cfg":
			*format = "ini"
		}
	}
	hosts, err := ParseInventory(data, *format, o)
	if err != nil {
		return fail(usageErr("%s: %v", path, err))
	}
	if len(hosts) == 0 {
		return fail(usageErr("%s: no hosts", path))
	}
	var objs []any
	if *keyFile != "" {
		s, err := keySecret(*keyFile, *secretName, *ns)
		if err != nil {
			return fail(err)
		}
		objs = append(objs, s)
	}
	keyVars := map[string]bool{}
	for _, h := range hosts {
		if v := h.Vars["ansible_ssh_private_key_file"] + h.Vars["ansible_private_key_file"]; v != "" {
			keyVars[h.Name] = true
		}
	}
	if len(keyVars) > 0 {
		names := make([]string, 0, len(keyVars))
		for n := range keyVars {
			names = append(names, n)
		}
		sort.Strings(names)
		fmt.Fprintf(stderr, "kpssh import-inventory: warning: %d host(s) set a private key file (%s…); every host references Secret %s\n", len(names), names[0], *secretName)
	}
	for _, h := range InventoryManifests(hosts, *ns, *secretName) {
		objs = append(objs, h)
	}
	if err := writeManifests(stdout, objs...); err != nil {
		return fail(runtimeErr("write: %v", err))
	}
	fmt.Fprintf(stderr, "kpssh import-inventory: %d SSHHost(s) in namespace %s\n", len(hosts), *ns)
	return ExitOK
}
