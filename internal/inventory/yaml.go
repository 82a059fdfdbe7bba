package inventory

import (
	"fmt"
	"strings"

	"gopkg.in/yaml.v3"
)

// parseYAMLInventory reads Ansible's YAML inventory: nested groups with
// hosts, vars and children, starting at the top-level groups (usually all).
func (inv *Inventory) parseYAML(data []byte) error {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return fmt.Errorf("inventory YAML: %w", err)
	}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return nil
	}
	root := doc.Content[0]
	if isNull(root) {
		return nil
	}
	if root.Kind != yaml.MappingNode {
		return inv.at(root.Line, "inventory must be a mapping of groups")
	}
	for i := 0; i+1 < len(root.Content); i += 2 {
		if err := inv.yamlGroup(root.Content[i], root.Content[i+1], 0); err != nil {
			return err
		}
	}
	return nil
}

func isNull(n *yaml.Node) bool { return n.Kind == yaml.ScalarNode && n.Tag == "!!null" }

// yamlGroup reads one group mapping (hosts, vars, children). A group may
// appear under several parents; its bodies merge as in Ansible (a var set to
// two values is refused).
func (inv *Inventory) yamlGroup(key, val *yaml.Node, depth int) error {
	if key.Kind != yaml.ScalarNode {
		return inv.at(key.Line, "group name must be a string")
	}
	name := key.Value
	if err := validGroupName(name); err != nil {
		return inv.at(key.Line, "%v", err)
	}
	if depth > maxDepth {
		return inv.at(key.Line, "groups nested deeper than %d", maxDepth)
	}
	g := inv.group(name, key.Line)
	if isNull(val) {
		return nil
	}
	if val.Kind != yaml.MappingNode {
		return inv.at(val.Line, "group %s: want a mapping with hosts, vars, children", name)
	}
	keys := map[string]int{}
	for i := 0; i+1 < len(val.Content); i += 2 {
		k, v := val.Content[i], val.Content[i+1]
		if prev, dup := keys[k.Value]; dup {
			return inv.at(k.Line, "group %s: %q twice (first on line %d)", name, k.Value, prev)
		}
		keys[k.Value] = k.Line
		if isNull(v) {
			continue
		}
		switch k.Value {
		case "hosts":
			if v.Kind != yaml.MappingNode {
				return inv.at(v.Line, "group %s: hosts must be a mapping of host names", name)
			}
			for j := 0; j+1 < len(v.Content); j += 2 {
				hk, hv := v.Content[j], v.Content[j+1]
				if hk.Kind != yaml.ScalarNode || hk.Value == "" {
					return inv.at(hk.Line, "group %s: host name must be a string", name)
				}
				vars, _, err := inv.yamlVars(hv, "host "+hk.Value)
				if err != nil {
					return err
				}
				if err := inv.addHost(name, hk.Value, hk.Line, vars); err != nil {
					return err
				}
			}
		case "vars":
			vars, lines, err := inv.yamlVars(v, "group "+name+" vars")
			if err != nil {
				return err
			}
			for vk, vv := range vars {
				// Not quoting the values: they may be passwords.
				if prev, dup := g.varPos[vk]; dup && g.vars[vk] != vv {
					return inv.at(lines[vk], "group %s: %s has another value here than on %s", name, vk, prev)
				}
				g.vars[vk], g.varPos[vk] = vv, Pos{inv.src, lines[vk]}
			}
		case "children":
			if v.Kind != yaml.MappingNode {
				return inv.at(v.Line, "group %s: children must be a mapping of groups", name)
			}
			for j := 0; j+1 < len(v.Content); j += 2 {
				g.children = append(g.children, v.Content[j].Value)
				if err := inv.yamlGroup(v.Content[j], v.Content[j+1], depth+1); err != nil {
					return err
				}
			}
		default:
			return inv.at(k.Line, "group %s: unknown key %q (want hosts, vars or children)", name, k.Value)
		}
	}
	return nil
}

// yamlVars reads a mapping of scalar variables; a host's null value is no
// variables. Non-scalar values (lists, dicts) are kept out (see mustBePlain).
func (inv *Inventory) yamlVars(n *yaml.Node, what string) (map[string]string, map[string]int, error) {
	vars, lines := map[string]string{}, map[string]int{}
	if isNull(n) {
		return vars, lines, nil
	}
	if n.Kind != yaml.MappingNode {
		return nil, nil, inv.at(n.Line, "%s: want a mapping of variables", what)
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			return nil, nil, inv.at(k.Line, "%s: variable name must be a string", what)
		}
		if prev, dup := lines[k.Value]; dup {
			return nil, nil, inv.at(k.Line, "%s: %s set twice (first on %s)", what, k.Value, Pos{inv.src, prev})
		}
		lines[k.Value] = k.Line
		if v.Kind == yaml.ScalarNode {
			vars[k.Value] = v.Value
		} else if mustBePlain(k.Value) {
			return nil, nil, inv.at(v.Line, "%s: %s must be a plain value", what, k.Value)
		}
	}
	return vars, lines, nil
}

// mustBePlain names the variables whose structured value is refused rather
// than left out: the connection's address, port and user and kpssh's own
// (a list there is a mistake; elsewhere, a list or a vaulted value is none of
// ours).
func mustBePlain(name string) bool {
	switch name {
	case "ansible_host", "ansible_port", "ansible_user":
		return true
	}
	return strings.HasPrefix(name, "kpssh_")
}
