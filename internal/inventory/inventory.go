// Package inventory reads Ansible inventories — INI and YAML files, or the
// JSON of `ansible-inventory --list` — into hosts with their resolved
// variables and groups. It knows Ansible's rules, not kpssh's: what a host
// becomes is the caller's business.
package inventory

import (
	"fmt"
	"sort"
)

// MaxBytes bounds one inventory source (a pool of thousands of hosts is well
// below it).
const MaxBytes = 8 << 20

// maxRangeHosts bounds what one range pattern may expand to: a typo like
// node[1:99999999] must be an error, not an out-of-memory.
const maxRangeHosts = 10000

// maxHosts bounds a whole inventory (many large ranges).
const maxHosts = 50000

// maxDepth bounds nested children.
const maxDepth = 64

// Pos is where something is defined: a line of a file. The zero Pos is
// unknown (ansible-inventory reports no lines).
type Pos struct {
	File string // empty for a single-file inventory
	Line int
}

// String is "line 5", "hosts.yml line 5", or "" when unknown.
func (p Pos) String() string {
	switch {
	case p.Line == 0:
		return ""
	case p.File == "":
		return fmt.Sprintf("line %d", p.Line)
	default:
		return fmt.Sprintf("%s line %d", p.File, p.Line)
	}
}

// Before orders positions of one inventory: by file, then line.
func (p Pos) Before(q Pos) bool {
	if p.File != q.File {
		return p.File < q.File
	}
	return p.Line < q.Line
}

// Error is a refusal tied to a position of the input.
type Error struct {
	Pos Pos
	Msg string
}

func (e *Error) Error() string {
	if s := e.Pos.String(); s != "" {
		return s + ": " + e.Msg
	}
	return e.Msg
}

// At is an error at p ("line 5: …", or just the message when p is unknown).
func At(p Pos, format string, a ...any) error {
	return &Error{Pos: p, Msg: fmt.Sprintf(format, a...)}
}

// Membership is one group of a host.
type Membership struct {
	Group  string
	Pos    Pos  // where the group lists the host, else where the group is defined
	Depth  int  // longest chain of parents above the group (Ansible's depth)
	Direct bool // the group lists the host itself (not through children)
}

// Host is one host of an inventory, resolved.
type Host struct {
	Name string
	Pos  Pos // where the host is first listed
	// Groups in Ansible's precedence order: all, then by depth, then name.
	Groups []Membership
	// Vars are the effective variables: all → groups by depth → the host's
	// own. Structured values (lists, mappings) are left out.
	Vars map[string]string
}

// hostEntry is a host occurrence in one group, before resolution.
type hostEntry struct {
	pos  Pos
	vars map[string]string
}

type group struct {
	name     string
	pos      Pos
	hosts    map[string]hostEntry // direct members
	order    []string
	children []string
	vars     map[string]string
	varPos   map[string]Pos
}

// Inventory is a parsed inventory: groups with direct hosts, children and
// variables. Add sources with Add or FromJSON, then call Hosts.
type Inventory struct {
	groups map[string]*group
	order  []string
	hosts  int // host entries so far, for maxHosts
	src    string
	anc    map[string]map[string]bool // filled by Hosts
}

// New is an empty inventory.
func New() *Inventory { return &Inventory{groups: map[string]*group{}} }

// Parse reads one inventory file, format "ini", "yaml" or "" (from the
// content).
func Parse(data []byte, format string) (*Inventory, error) {
	inv := New()
	if err := inv.Add(data, format, ""); err != nil {
		return nil, err
	}
	return inv, nil
}

// Add reads one more source into the inventory; file names its positions
// ("" for a single-file inventory). A source's hosts and groups merge into
// those already read, as Ansible merges an inventory directory's files.
func (inv *Inventory) Add(data []byte, format, file string) error {
	if len(data) > MaxBytes {
		return fmt.Errorf("inventory is larger than %d bytes", MaxBytes)
	}
	if format == "" {
		format = DetectFormat(data)
	}
	inv.src = file
	switch format {
	case "ini":
		return inv.parseINI(data)
	case "yaml":
		return inv.parseYAML(data)
	default:
		return fmt.Errorf("unknown inventory format %q (want ini or yaml)", format)
	}
}

// HasGroup says whether the inventory defines group g.
func (inv *Inventory) HasGroup(g string) bool { _, ok := inv.groups[g]; return ok }

// Contains says whether group parent has child among its descendants
// (valid after Hosts).
func (inv *Inventory) Contains(parent, child string) bool { return inv.anc[child][parent] }

func (inv *Inventory) at(line int, format string, a ...any) error {
	return At(Pos{inv.src, line}, format, a...)
}

func (inv *Inventory) group(name string, line int) *group {
	g, ok := inv.groups[name]
	if !ok {
		g = &group{name: name, pos: Pos{inv.src, line}, hosts: map[string]hostEntry{}, vars: map[string]string{}, varPos: map[string]Pos{}}
		inv.groups[name] = g
		inv.order = append(inv.order, name)
	}
	return g
}

func (inv *Inventory) addChild(parent *group, child string, line int) {
	parent.children = append(parent.children, child)
	inv.group(child, line)
}

func (inv *Inventory) addHost(groupName, pattern string, line int, vars map[string]string) error {
	names, err := expandRange(pattern)
	if err != nil {
		return inv.at(line, "host %q: %v", pattern, err)
	}
	return inv.addNames(groupName, names, line, vars)
}

// addNames adds hosts by name (ranges already expanded).
func (inv *Inventory) addNames(groupName string, names []string, line int, vars map[string]string) error {
	if inv.hosts += len(names); inv.hosts > maxHosts {
		return inv.at(line, "the inventory lists more than %d hosts", maxHosts)
	}
	g := inv.group(groupName, line)
	for _, n := range names {
		if prev, dup := g.hosts[n]; dup {
			return inv.at(line, "host %q listed twice in group [%s] (first on %s)", n, groupName, prev.pos)
		}
		g.hosts[n] = hostEntry{pos: Pos{inv.src, line}, vars: vars}
		g.order = append(g.order, n)
	}
	return nil
}

// ancestry computes each group's depth (longest parent chain) and ancestor
// set, memoized: enumerating paths would be exponential in diamond-shaped
// children.
func (inv *Inventory) ancestry() (map[string]int, error) {
	parents := map[string][]string{}
	for _, name := range inv.order {
		for _, c := range inv.groups[name].children {
			parents[c] = append(parents[c], name)
		}
	}
	const visiting = -1
	depth := map[string]int{}
	inv.anc = map[string]map[string]bool{}
	var visit func(g string) error
	visit = func(g string) error {
		if d, ok := depth[g]; ok {
			if d == visiting {
				return At(inv.groups[g].pos, "group %s is its own ancestor (children cycle)", g)
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
			for a := range inv.anc[p] {
				set[a] = true
			}
		}
		depth[g], inv.anc[g] = d, set
		return nil
	}
	for _, name := range inv.order {
		if err := visit(name); err != nil {
			return nil, err
		}
	}
	return depth, nil
}

// occurrence is a host listed by a group.
type occurrence struct {
	group string
	e     hostEntry
}

// Hosts resolves every host, in the order they are first listed: its
// groups (direct ones and their ancestors) and variables in Ansible's
// precedence. A host variable given two values is refused (the values are
// not quoted: they may be passwords).
func (inv *Inventory) Hosts() ([]Host, error) {
	depth, err := inv.ancestry()
	if err != nil {
		return nil, err
	}
	byHost := map[string][]occurrence{}
	var hostOrder []string
	for _, name := range inv.order {
		g := inv.groups[name]
		for _, h := range g.order {
			if _, ok := byHost[h]; !ok {
				hostOrder = append(hostOrder, h)
			}
			byHost[h] = append(byHost[h], occurrence{name, g.hosts[h]})
		}
	}
	out := make([]Host, 0, len(hostOrder))
	for _, name := range hostOrder {
		h, err := inv.resolveHost(name, byHost[name], depth)
		if err != nil {
			return nil, err
		}
		out = append(out, h)
	}
	return out, nil
}

func (inv *Inventory) resolveHost(name string, occs []occurrence, depth map[string]int) (Host, error) {
	h := Host{Name: name, Pos: occs[0].e.pos, Vars: map[string]string{}}
	member := map[string]Membership{}
	own, ownPos := map[string]string{}, map[string]Pos{}
	for _, oc := range occs {
		if oc.e.pos.Before(h.Pos) {
			h.Pos = oc.e.pos
		}
		member[oc.group] = Membership{Group: oc.group, Pos: oc.e.pos, Depth: depth[oc.group], Direct: true}
		for a := range inv.anc[oc.group] {
			if _, ok := member[a]; !ok {
				member[a] = Membership{Group: a, Pos: inv.groups[a].pos, Depth: depth[a]}
			}
		}
		for k, v := range oc.e.vars {
			if prev, ok := own[k]; ok && prev != v {
				return h, At(oc.e.pos, "host %s: %s has another value here than on %s", name, k, ownPos[k])
			}
			own[k], ownPos[k] = v, oc.e.pos
		}
	}
	if g, ok := inv.groups["all"]; ok {
		if _, in := member["all"]; !in {
			member["all"] = Membership{Group: "all", Pos: g.pos}
		}
	}
	for _, m := range member {
		h.Groups = append(h.Groups, m)
	}
	sort.Slice(h.Groups, func(i, j int) bool {
		a, b := h.Groups[i], h.Groups[j]
		if (a.Group == "all") != (b.Group == "all") {
			return a.Group == "all"
		}
		if a.Depth != b.Depth {
			return a.Depth < b.Depth
		}
		return a.Group < b.Group
	})
	for _, m := range h.Groups {
		for k, v := range inv.groups[m.Group].vars {
			h.Vars[k] = v
		}
	}
	for k, v := range own {
		h.Vars[k] = v
	}
	return h, nil
}
