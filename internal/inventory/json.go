package inventory

import (
	"fmt"

	"gopkg.in/yaml.v3"
)

// FromJSON reads the output of `ansible-inventory --list`: groups with
// hosts and children, and _meta.hostvars holding every host's variables as
// Ansible resolved them (group_vars/, host_vars/, plugins). It is decoded as
// YAML (JSON is YAML) to keep the groups' order and numbers' text. Nothing
// has a line.
func FromJSON(data []byte) (*Inventory, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("ansible-inventory output: %w", err)
	}
	inv := New()
	if len(doc.Content) == 0 || isNull(doc.Content[0]) {
		return inv, nil
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("ansible-inventory output: not a mapping of groups")
	}
	hostvars := map[string]map[string]string{}
	for i := 0; i+1 < len(root.Content); i += 2 {
		if root.Content[i].Value != "_meta" {
			continue
		}
		var err error
		if hostvars, err = jsonHostvars(root.Content[i+1]); err != nil {
			return nil, err
		}
	}
	for i := 0; i+1 < len(root.Content); i += 2 {
		name, body := root.Content[i].Value, root.Content[i+1]
		if name == "_meta" {
			continue
		}
		if err := inv.jsonGroup(name, body, hostvars); err != nil {
			return nil, err
		}
	}
	return inv, nil
}

func (inv *Inventory) jsonGroup(name string, body *yaml.Node, hostvars map[string]map[string]string) error {
	if err := validGroupName(name); err != nil {
		return fmt.Errorf("ansible-inventory output: %v", err)
	}
	g := inv.group(name, 0)
	if body.Kind != yaml.MappingNode {
		return fmt.Errorf("ansible-inventory output: group %s is not a mapping", name)
	}
	for j := 0; j+1 < len(body.Content); j += 2 {
		k, v := body.Content[j], body.Content[j+1]
		switch k.Value {
		case "hosts", "children":
			if v.Kind != yaml.SequenceNode {
				return fmt.Errorf("ansible-inventory output: group %s: %s is not a list", name, k.Value)
			}
			for _, item := range v.Content {
				if item.Kind != yaml.ScalarNode || item.Value == "" {
					return fmt.Errorf("ansible-inventory output: group %s: %s lists a non-name", name, k.Value)
				}
				if k.Value == "children" {
					inv.addChild(g, item.Value, 0)
					continue
				}
				vars := hostvars[item.Value]
				if vars == nil {
					vars = map[string]string{}
				}
				if err := inv.addNames(name, []string{item.Value}, 0, vars); err != nil {
					return err
				}
			}
		case "vars": // --export only; without it they are in hostvars
			vars, err := plainVars(v, "group "+name)
			if err != nil {
				return err
			}
			g.vars = vars
		}
	}
	return nil
}

func jsonHostvars(meta *yaml.Node) (map[string]map[string]string, error) {
	out := map[string]map[string]string{}
	if meta.Kind != yaml.MappingNode {
		return out, nil
	}
	for i := 0; i+1 < len(meta.Content); i += 2 {
		if meta.Content[i].Value != "hostvars" || meta.Content[i+1].Kind != yaml.MappingNode {
			continue
		}
		hv := meta.Content[i+1]
		for j := 0; j+1 < len(hv.Content); j += 2 {
			vars, err := plainVars(hv.Content[j+1], "host "+hv.Content[j].Value)
			if err != nil {
				return nil, err
			}
			out[hv.Content[j].Value] = vars
		}
	}
	return out, nil
}

// plainVars keeps a mapping's scalar values (numbers and booleans as
// written); structured ones are left out unless mustBePlain refuses them.
func plainVars(n *yaml.Node, what string) (map[string]string, error) {
	vars := map[string]string{}
	if n.Kind != yaml.MappingNode {
		return vars, nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i].Value, n.Content[i+1]
		switch {
		case isNull(v):
		case v.Kind == yaml.ScalarNode:
			vars[k] = v.Value
		case mustBePlain(k):
			return nil, fmt.Errorf("ansible-inventory output: %s: %s must be a plain value", what, k)
		}
	}
	return vars, nil
}
