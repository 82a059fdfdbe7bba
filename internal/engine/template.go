package engine

import (
	"bytes"
	"fmt"
	"sort"
	"text/template"
	"text/template/parse"
)

// Template data field names (seed-compatible: {{ .ClusterEndpoint }},
// {{ .Vars.key }}, {{ .Secrets.key }}).
const (
	fClusterEndpoint = "ClusterEndpoint"
	fClusterCAB64    = "ClusterCAB64"
	fBootstrapToken  = "BootstrapToken"
	fNodeName        = "NodeName"
	fProviderID      = "ProviderID"
	fHostAddress     = "HostAddress"
	fNodeAddress     = "NodeAddress"
	fNodeLabels      = "NodeLabels"
	fTaints          = "Taints"
	fVars            = "Vars"
	fSecrets         = "Secrets"
)

// templateFields lists the top-level template fields a phase may use.
func templateFields(p Phase) map[string]bool {
	if p.AddressesOnly() {
		return map[string]bool{fHostAddress: true, fNodeAddress: true}
	}
	m := map[string]bool{
		fClusterEndpoint: true, fClusterCAB64: true, fNodeName: true, fProviderID: true,
		fHostAddress: true, fNodeAddress: true, fNodeLabels: true, fTaints: true, fVars: true, fSecrets: true,
	}
	if p == PhaseJoin {
		m[fBootstrapToken] = true
	}
	return m
}

// templateData is the data a script template executes with: exactly the
// fields of templateFields (a map, so missingkey=error also rejects fields a
// phase does not get, e.g. .Vars in leave).
func templateData(p Phase, c Context) map[string]any {
	c = phaseContext(p, c)
	all := map[string]any{
		fClusterEndpoint: c.ClusterEndpoint, fClusterCAB64: c.ClusterCAB64, fBootstrapToken: c.BootstrapToken,
		fNodeName: c.NodeName, fProviderID: c.ProviderID, fHostAddress: c.HostAddress, fNodeAddress: c.NodeAddress,
		fNodeLabels: c.NodeLabels, fTaints: c.Taints, fVars: nonNil(c.Vars), fSecrets: nonNil(c.Secrets),
	}
	data := map[string]any{}
	for f := range templateFields(p) {
		data[f] = all[f]
	}
	return data
}

func nonNil(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

// parseScript parses a script body as a Go text/template (missingkey=error)
// and checks statically that it only references fields the phase gets.
func parseScript(p Phase, body string) (*template.Template, error) {
	t, err := template.New(string(p)).Option("missingkey=error").Parse(body)
	if err != nil {
		return nil, fmt.Errorf("%s script is not a valid template: %w", p, err)
	}
	if err := checkTemplateRefs(p, t); err != nil {
		return nil, err
	}
	return t, nil
}

// renderScript renders a script body with the phase's context.
func renderScript(p Phase, body string, c Context) (string, error) {
	t, err := parseScript(p, body)
	if err != nil {
		return "", err
	}
	var buf bytes.Buffer
	if err := t.Execute(&buf, templateData(p, c)); err != nil {
		if p.AddressesOnly() {
			return "", fmt.Errorf("%s script does not render with the empty context (%s gets only .HostAddress and .NodeAddress): %w", p, p, err)
		}
		return "", fmt.Errorf("%s script does not render: %w", p, err)
	}
	return buf.String(), nil
}

// checkTemplateRefs walks every parse tree of t and rejects references to
// top-level fields the phase does not get: .Vars/.Secrets/.ClusterEndpoint…
// in leave, .BootstrapToken outside join, and unknown fields anywhere. It
// follows the dot: inside {{with}}/{{range}} the dot is no longer the root,
// $ always is, and variables assigned from the root are tracked. Bodies of
// {{define}}d templates are checked as if their dot were the root.
func checkTemplateRefs(p Phase, t *template.Template) error {
	allowed := templateFields(p)
	c := &refChecker{phase: p, allowed: allowed, aliases: map[string]bool{"$": true}}
	// Deterministic order for stable messages.
	tmpls := t.Templates()
	sort.Slice(tmpls, func(i, j int) bool { return tmpls[i].Name() < tmpls[j].Name() })
	for _, tt := range tmpls {
		if tt.Tree == nil || tt.Tree.Root == nil {
			continue
		}
		c.walk(tt.Tree.Root, true)
		if c.err != nil {
			return c.err
		}
	}
	return nil
}

type refChecker struct {
	phase   Phase
	allowed map[string]bool
	aliases map[string]bool // variables holding the root ($ and $x := .)
	err     error
}

func (c *refChecker) field(name string) {
	if c.err != nil || c.allowed[name] {
		return
	}
	switch {
	case !templateFields(PhaseJoin)[name]:
		c.err = fmt.Errorf("%s script references unknown field .%s (known: .ClusterEndpoint .ClusterCAB64 .BootstrapToken .NodeName .ProviderID .HostAddress .NodeAddress .NodeLabels .Taints .Vars .Secrets)", c.phase, name)
	case c.phase.AddressesOnly():
		c.err = fmt.Errorf("%s script references .%s: %s renders with the empty context (only .HostAddress and .NodeAddress) — it must work without a node class", c.phase, name, c.phase)
	default:
		c.err = fmt.Errorf("%s script references .%s, which only the join phase gets", c.phase, name)
	}
}

// isRoot reports whether a pipeline/argument evaluates to the root context.
func (c *refChecker) isRoot(n parse.Node, dotRoot bool) bool {
	switch n := n.(type) {
	case *parse.DotNode:
		return dotRoot
	case *parse.VariableNode:
		return len(n.Ident) == 1 && c.aliases[n.Ident[0]]
	case *parse.PipeNode:
		return n != nil && len(n.Cmds) == 1 && len(n.Cmds[0].Args) == 1 && c.isRoot(n.Cmds[0].Args[0], dotRoot)
	}
	return false
}

func (c *refChecker) walk(n parse.Node, dotRoot bool) {
	if c.err != nil || n == nil {
		return
	}
	switch n := n.(type) {
	case *parse.ListNode:
		if n == nil {
			return
		}
		for _, x := range n.Nodes {
			c.walk(x, dotRoot)
		}
	case *parse.ActionNode:
		c.pipe(n.Pipe, dotRoot)
	case *parse.IfNode:
		c.pipe(n.Pipe, dotRoot)
		c.walk(n.List, dotRoot)
		c.walk(n.ElseList, dotRoot)
	case *parse.WithNode:
		c.pipe(n.Pipe, dotRoot)
		c.walk(n.List, c.isRoot(n.Pipe, dotRoot))
		c.walk(n.ElseList, dotRoot)
	case *parse.RangeNode:
		c.pipe(n.Pipe, dotRoot)
		if c.isRoot(n.Pipe, dotRoot) && c.phase.AddressesOnly() && c.err == nil {
			c.err = fmt.Errorf("%s script ranges over the whole context: %s gets only .HostAddress and .NodeAddress", c.phase, c.phase)
			return
		}
		c.walk(n.List, false)
		c.walk(n.ElseList, dotRoot)
	case *parse.TemplateNode:
		c.pipe(n.Pipe, dotRoot)
	case *parse.PipeNode:
		c.pipe(n, dotRoot)
	case *parse.CommandNode:
		c.command(n, dotRoot)
	case *parse.FieldNode:
		if dotRoot && len(n.Ident) > 0 {
			c.field(n.Ident[0])
		}
	case *parse.VariableNode:
		if len(n.Ident) > 1 && c.aliases[n.Ident[0]] {
			c.field(n.Ident[1])
		}
	case *parse.ChainNode:
		c.walk(n.Node, dotRoot)
		if len(n.Field) > 0 && c.isRoot(n.Node, dotRoot) {
			c.field(n.Field[0])
		}
	}
}

func (c *refChecker) pipe(p *parse.PipeNode, dotRoot bool) {
	if p == nil || c.err != nil {
		return
	}
	for _, cmd := range p.Cmds {
		c.command(cmd, dotRoot)
	}
	if c.isRoot(p, dotRoot) {
		for _, d := range p.Decl {
			c.aliases[d.Ident[0]] = true
		}
	}
}

func (c *refChecker) command(cmd *parse.CommandNode, dotRoot bool) {
	if cmd == nil {
		return
	}
	// {{ index . "Vars" … }} reaches fields by name.
	if len(cmd.Args) >= 2 {
		if id, ok := cmd.Args[0].(*parse.IdentifierNode); ok && id.Ident == "index" && c.isRoot(cmd.Args[1], dotRoot) {
			if len(cmd.Args) >= 3 {
				if s, ok := cmd.Args[2].(*parse.StringNode); ok {
					c.field(s.Text)
				} else if c.err == nil && c.phase.AddressesOnly() {
					c.err = fmt.Errorf("%s script indexes the context with a computed key: %s gets only .HostAddress and .NodeAddress", c.phase, c.phase)
				}
			}
		}
	}
	for _, a := range cmd.Args {
		c.walk(a, dotRoot)
	}
}
