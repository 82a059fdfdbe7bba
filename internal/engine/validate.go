package engine

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"

	"gopkg.in/yaml.v3"
)

// MaxSourceBytes bounds a script or task list (seed: scripts ≤ 256 KiB).
const MaxSourceBytes = 256 * 1024

// roleRE is a role name or a collection role FQCN (ns.collection.role).
var roleRE = regexp.MustCompile(`^[A-Za-z0-9_]+(\.[A-Za-z0-9_]+){0,2}$`)

// ValidRoleName reports whether s is a sane role name.
func ValidRoleName(s string) bool { return len(s) <= 253 && roleRE.MatchString(s) }

// Validate is the node class controller's pre-flight check of one phase
// source: exactly one source; scripts parse as templates and reference only
// the fields the phase gets (leave renders with the empty context: no .Vars,
// no .Secrets, nothing but .HostAddress/.NodeAddress); task lists parse as a
// YAML list of task mappings, and a leave task list uses no kpssh_vars,
// kpssh_secrets or kpssh.<field> but the addresses; role names are sane.
// It needs no host, no roles path and no network.
func Validate(phase Phase, src Source) error {
	if !phase.Valid() {
		return fmt.Errorf("unknown phase %q (want install, join, leave or uninstall)", phase)
	}
	if src.Verified != nil {
		return VerifySignature(phase, src)
	}
	n := 0
	for _, s := range []string{src.Script, src.Tasks, src.Role} {
		if strings.TrimSpace(s) != "" {
			n++
		}
	}
	if n != 1 {
		if n == 0 {
			return fmt.Errorf("%s: no source: set exactly one of script, tasks or role", phase)
		}
		return fmt.Errorf("%s: set exactly one of script, tasks or role", phase)
	}
	switch {
	case strings.TrimSpace(src.Script) != "":
		return validateScript(phase, src.Script)
	case strings.TrimSpace(src.Tasks) != "":
		if len(src.Tasks) > MaxSourceBytes {
			return fmt.Errorf("%s tasks are %d bytes, more than %d", phase, len(src.Tasks), MaxSourceBytes)
		}
		if err := ValidateTaskList(src.Tasks); err != nil {
			return fmt.Errorf("%s tasks: %w", phase, err)
		}
		if phase == PhaseLeave {
			return checkLeaveJinja("leave tasks", src.Tasks)
		}
		return nil
	default:
		if !ValidRoleName(src.Role) {
			return fmt.Errorf("%s: role name %q is not a role name or collection FQCN ([A-Za-z0-9_]+, up to ns.collection.role)", phase, src.Role)
		}
		return nil
	}
}

func validateScript(phase Phase, body string) error {
	if len(body) > MaxSourceBytes {
		return fmt.Errorf("%s script is %d bytes, more than %d", phase, len(body), MaxSourceBytes)
	}
	if strings.IndexByte(body, 0) >= 0 {
		return fmt.Errorf("%s script contains a NUL byte", phase)
	}
	if _, err := parseScript(phase, body); err != nil {
		return err
	}
	if phase == PhaseLeave {
		// The static walk covers branches not taken; rendering with the
		// empty context covers anything it cannot see.
		if _, err := renderScript(phase, body, Context{HostAddress: "192.0.2.1", NodeAddress: "192.0.2.1"}); err != nil {
			return err
		}
	}
	return nil
}

// ValidateTaskList checks that text is one YAML document holding a non-empty
// list of task mappings (not a play, not a playbook import).
func ValidateTaskList(text string) error {
	dec := yaml.NewDecoder(strings.NewReader(text))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return errors.New("empty task list")
		}
		return fmt.Errorf("not valid YAML: %w", err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		return errors.New("more than one YAML document: a task list is a single list")
	} else if !errors.Is(err, io.EOF) {
		return fmt.Errorf("not valid YAML: %w", err)
	}
	root := &doc
	if root.Kind == yaml.DocumentNode {
		if len(root.Content) == 0 {
			return errors.New("empty task list")
		}
		root = root.Content[0]
	}
	if root.Kind == yaml.AliasNode {
		return errors.New("a task list must be a YAML list, not an alias")
	}
	if root.Kind != yaml.SequenceNode {
		return fmt.Errorf("a task list must be a YAML list of tasks, got %s", kindName(root))
	}
	if len(root.Content) == 0 {
		return errors.New("empty task list (use `- ansible.builtin.meta: noop` for a phase with nothing to do)")
	}
	for i, item := range root.Content {
		if item.Kind != yaml.MappingNode {
			return fmt.Errorf("task %d (line %d) is %s, want a mapping like `- name: …\\n  ansible.builtin.command: …`", i+1, item.Line, kindName(item))
		}
		if len(item.Content) == 0 {
			return fmt.Errorf("task %d (line %d) is an empty mapping", i+1, item.Line)
		}
		keys := map[string]bool{}
		for j := 0; j+1 < len(item.Content); j += 2 {
			k := item.Content[j]
			if k.Kind != yaml.ScalarNode {
				return fmt.Errorf("task %d (line %d) has a non-scalar key", i+1, k.Line)
			}
			if keys[k.Value] {
				return fmt.Errorf("task %d (line %d) repeats the key %q", i+1, k.Line, k.Value)
			}
			keys[k.Value] = true
		}
		if keys["hosts"] || keys["import_playbook"] || keys["ansible.builtin.import_playbook"] {
			return fmt.Errorf("task %d (line %d) is a play or playbook import; give a list of tasks, the engine writes the play", i+1, item.Line)
		}
	}
	return nil
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return "null"
		}
		return "a scalar"
	case yaml.AliasNode:
		return "an alias"
	}
	return "a document"
}

// Jinja references a leave task list must not make (the kpssh.* dict keeps
// its keys in leave, but only the addresses hold values).
var (
	leaveVarsRE     = regexp.MustCompile(`\bkpssh_(vars|secrets)\b`)
	kpsshAttrRE     = regexp.MustCompile(`(^|[^.\w])kpssh\s*\.\s*([A-Za-z_]\w*)`)
	kpsshIndexRE    = regexp.MustCompile(`(^|[^.\w])kpssh\s*\[\s*['"]([^'"]*)['"]\s*\]`)
	leaveAllowedVar = map[string]bool{"host_address": true, "node_address": true}
)

// checkLeaveJinja scans a leave task file for references to values leave
// does not get. It is a lexical check (it also fires inside comments), which
// errs on the side of rejecting.
func checkLeaveJinja(what, text string) error {
	if m := leaveVarsRE.FindString(text); m != "" {
		return fmt.Errorf("%s reference %s: leave renders with the empty context (only kpssh.host_address and kpssh.node_address) — it must work without a node class", what, m)
	}
	for _, re := range []*regexp.Regexp{kpsshAttrRE, kpsshIndexRE} {
		for _, m := range re.FindAllStringSubmatch(text, -1) {
			if !leaveAllowedVar[m[2]] {
				return fmt.Errorf("%s reference kpssh.%s: leave gets only kpssh.host_address and kpssh.node_address", what, m[2])
			}
		}
	}
	return nil
}

// validateLeaveFile applies the leave scan to a role's tasks/leave.yml.
func validateLeaveFile(what string, data []byte) error {
	if err := ValidateTaskList(string(bytes.TrimPrefix(data, []byte("\xef\xbb\xbf")))); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return checkLeaveJinja(what, string(data))
}
