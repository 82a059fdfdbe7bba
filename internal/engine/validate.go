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
// Inline task lists also pass CheckInlineTasks (nothing of them may run on
// or read from the controller). It needs no host, no roles path and no
// network.
func Validate(phase Phase, src Source) error { return validate(phase, src, true) }

// validate is Validate; checkInline false (tests only: the run sandbox's
// own attack tests) skips CheckInlineTasks.
func validate(phase Phase, src Source, checkInline bool) error {
	if !phase.Valid() {
		return fmt.Errorf("unknown phase %q (want %s)", phase, PhaseNames())
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
		if checkInline {
			if err := CheckInlineTasks(src.Tasks); err != nil {
				return fmt.Errorf("%s tasks: %w", phase, err)
			}
		}
		if phase.AddressesOnly() {
			return checkLeaveJinja(phase, string(phase)+" tasks", src.Tasks)
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
	if phase.AddressesOnly() {
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
func checkLeaveJinja(ph Phase, what, text string) error {
	if m := leaveVarsRE.FindString(text); m != "" {
		return fmt.Errorf("%s reference %s: %s renders with the empty context (only kpssh.host_address and kpssh.node_address) — it must work without a node class", what, m, ph)
	}
	for _, re := range []*regexp.Regexp{kpsshAttrRE, kpsshIndexRE} {
		for _, m := range re.FindAllStringSubmatch(text, -1) {
			if !leaveAllowedVar[m[2]] {
				return fmt.Errorf("%s reference kpssh.%s: %s gets only kpssh.host_address and kpssh.node_address", what, m[2], ph)
			}
		}
	}
	return nil
}

// validateLeaveFile applies the leave scan to a role's tasks/leave.yml.
func validateLeaveFile(ph Phase, what string, data []byte) error {
	if err := ValidateTaskList(string(bytes.TrimPrefix(data, []byte("\xef\xbb\xbf")))); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return checkLeaveJinja(ph, what, string(data))
}

// Inline task lists come from the API (SSHJoinProfile spec.ansible.tasks):
// whoever may edit a profile writes them. A task that runs on the
// controller, or a template that reads from it, would act with the
// controller's credentials (its ServiceAccount token, the other runs'
// directories). CheckInlineTasks refuses every construct known to do so;
// the run sandbox (sandbox.go) stops what it does not know.
var (
	// task keywords that move a task (or its templating) to the controller,
	// or open a debugger there
	inlineRefusedKeywords = map[string]string{
		"delegate_to":    "it runs the task on another host (localhost: the controller)",
		"delegate_facts": "it goes with delegate_to",
		"local_action":   "it runs on the controller",
		"connection":     "it changes how the task connects (local: the controller)",
		"debugger":       "it starts a debugger on the controller",
	}
	// modules (short names; ansible.builtin./ansible.legacy. stripped)
	// whose action runs on the controller or reads or writes its files
	inlineRefusedModules = map[string]string{
		"include_vars":  "it reads variable files on the controller",
		"include_tasks": "it reads a task file on the controller",
		"import_tasks":  "it reads a task file on the controller",
		"include":       "it reads a task file on the controller",
		"include_role":  "use the profile's role instead",
		"import_role":   "use the profile's role instead",
		"template":      "it reads its src on the controller",
		"script":        "it reads its script on the controller",
		"fetch":         "it writes to the controller",
		"add_host":      "it adds hosts (ansible_connection: local would be the controller)",
		"group_by":      "it changes the inventory",
		"stdin_exec":    "its stdin_file and result_file are controller files",
		"synchronize":   "it runs rsync on the controller",
		"win_template":  "it reads its src on the controller",
		"win_copy":      "it reads its src on the controller",
		"assemble":      "it reads its src on the controller unless remote_src",
		"copy":          "its src is read on the controller unless remote_src",
		"unarchive":     "its src is read on the controller unless remote_src",
		"patch":         "its src is read on the controller unless remote_src",
	}
	// modules refused only when they read a controller src (or file)
	inlineSrcModules = map[string]bool{"assemble": true, "copy": true, "unarchive": true, "patch": true, "stdin_exec": true}
	// with_<lookup> loops that run no controller-reading lookup
	inlineSafeWith = map[string]bool{
		"with_items": true, "with_list": true, "with_dict": true, "with_indexed_items": true,
		"with_sequence": true, "with_subelements": true, "with_nested": true, "with_cartesian": true,
		"with_together": true, "with_random_choice": true, "with_flattened": true,
	}
	// keys whose string values are bare Jinja expressions
	inlineExprKeys = map[string]bool{"when": true, "changed_when": true, "failed_when": true, "until": true, "that": true}
	jinjaRegionRE  = regexp.MustCompile(`(?s)\{\{.*?(\}\}|$)|\{%.*?(%\}|$)`)
	// a lookup, query or q identifier (a call or an alias of the function)
	jinjaLookupRE = regexp.MustCompile(`(^|[^\w.'"])(lookup|query|q)\b`)
	// Jinja statements that read other templates (controller files)
	jinjaIncludeRE = regexp.MustCompile(`\{%[-+]?\s*(include|import|from|extends)\b`)
)

// CheckInlineTasks refuses, in an inline task list, anything that makes the
// controller run or read something: the keywords delegate_to,
// delegate_facts, local_action, connection, debugger; variables (vars,
// set_fact, register, loop_var/index_var) named ansible_* (connection
// variables such as ansible_connection, ansible_host); modules whose action
// reads or writes controller files (include_vars, template, script, fetch,
// copy/unarchive/assemble/patch with a src not remote_src, …), include/import
// of tasks and roles, add_host/group_by and the engine's own stdin_exec;
// with_<lookup> loops other than the list-shaped ones; and in every string a
// Jinja lookup/query/q (called or aliased) or an {% include/import/from/
// extends %}. block/rescue/always are checked task by task. YAML aliases
// and merge keys are refused (they would hide keys from this check). The
// error names the task and the rule. text must be a valid task list.
func CheckInlineTasks(text string) error {
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(text), &doc); err != nil {
		return fmt.Errorf("not valid YAML: %w", err)
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) == 0 || doc.Content[0].Kind != yaml.SequenceNode {
		return errors.New("a task list must be a YAML list of tasks")
	}
	return checkInlineList(doc.Content[0], "task")
}

func checkInlineList(list *yaml.Node, prefix string) error {
	for i, item := range list.Content {
		label := fmt.Sprintf("%s %d", prefix, i+1)
		if item.Kind != yaml.MappingNode {
			return fmt.Errorf("%s (line %d) is %s, want a task mapping", label, item.Line, kindName(item))
		}
		if err := checkInlineTask(item, label); err != nil {
			return err
		}
	}
	return nil
}

func scalarOf(m *yaml.Node, key string) string {
	for j := 0; j+1 < len(m.Content); j += 2 {
		if m.Content[j].Value == key && m.Content[j+1].Kind == yaml.ScalarNode {
			return m.Content[j+1].Value
		}
	}
	return ""
}

func moduleShort(name string) string {
	for _, p := range []string{"ansible.builtin.", "ansible.legacy.", "ansible.posix.", "ansible.windows.", "dklesev.kpssh."} {
		if strings.HasPrefix(name, p) {
			return strings.TrimPrefix(name, p)
		}
	}
	return name
}

func checkInlineTask(task *yaml.Node, label string) error {
	if n := scalarOf(task, "name"); n != "" {
		label += fmt.Sprintf(" (%q)", n)
	}
	refuse := func(line int, what, why string) error {
		return fmt.Errorf("%s (line %d): %s is not allowed in inline tasks: %s", label, line, what, why)
	}
	if err := checkNoAliases(task, refuse); err != nil {
		return err
	}
	for j := 0; j+1 < len(task.Content); j += 2 {
		k, v := task.Content[j], task.Content[j+1]
		key := k.Value
		switch {
		case inlineRefusedKeywords[key] != "":
			return refuse(k.Line, key, inlineRefusedKeywords[key])
		case key == "block" || key == "rescue" || key == "always":
			if v.Kind != yaml.SequenceNode {
				return fmt.Errorf("%s (line %d): %s must be a list of tasks", label, k.Line, key)
			}
			if err := checkInlineList(v, label+" "+key+" task"); err != nil {
				return err
			}
			continue
		case key == "vars":
			if err := checkVarNames(v, "vars", refuse); err != nil {
				return err
			}
		case key == "register":
			if strings.HasPrefix(v.Value, "ansible_") {
				return refuse(v.Line, "register: "+v.Value, "ansible_* variables steer the connection")
			}
		case key == "loop_control":
			for _, lk := range []string{"loop_var", "index_var"} {
				if s := scalarOf(v, lk); strings.HasPrefix(s, "ansible_") {
					return refuse(v.Line, lk+": "+s, "ansible_* variables steer the connection")
				}
			}
		case strings.HasPrefix(key, "with_") && !inlineSafeWith[key]:
			return refuse(k.Line, key, "a with_<lookup> loop runs the lookup "+strings.TrimPrefix(key, "with_")+" on the controller")
		case key == "action":
			mod := v.Value
			if v.Kind == yaml.MappingNode {
				mod = scalarOf(v, "module")
			} else if f := strings.Fields(mod); len(f) > 0 {
				mod = f[0]
			}
			if err := checkInlineModule(task, &yaml.Node{Value: "action: " + mod, Line: k.Line}, moduleShort(mod), v, refuse); err != nil {
				return err
			}
		default:
			if err := checkInlineModule(task, k, moduleShort(key), v, refuse); err != nil {
				return err
			}
		}
		if err := checkInlineStrings(v, inlineExprKeys[key], func(line int, what string) error {
			return refuse(line, what, "a template runs on the controller")
		}); err != nil {
			return err
		}
	}
	return nil
}

// checkInlineModule applies the module rules to the task key k (a module
// name when it is not a keyword) with arguments v.
func checkInlineModule(task, k *yaml.Node, mod string, v *yaml.Node, refuse func(int, string, string) error) error {
	why := inlineRefusedModules[mod]
	if mod == "set_fact" {
		return checkVarNames(v, "set_fact", refuse)
	}
	if why == "" {
		return nil
	}
	if inlineSrcModules[mod] {
		args := v
		if v.Kind != yaml.MappingNode {
			args = argsOf(task)
		}
		src := args != nil && (scalarOf(args, "src") != "" || scalarOf(args, "stdin_file") != "" || scalarOf(args, "result_file") != "")
		if v.Kind == yaml.ScalarNode && (strings.Contains(v.Value, "src=") || strings.Contains(v.Value, "_file=")) {
			src = true
		}
		if !src {
			return nil // content:, or no src at all
		}
		if args != nil && isYAMLTrue(scalarOf(args, "remote_src")) {
			return nil
		}
		if v.Kind == yaml.ScalarNode && regexp.MustCompile(`\bremote_src=(true|yes|True|1)\b`).MatchString(v.Value) {
			return nil
		}
		what := " with src"
		if mod == "stdin_exec" {
			what = " with a file"
		}
		return refuse(k.Line, k.Value+what, why)
	}
	return refuse(k.Line, k.Value, why)
}

func argsOf(task *yaml.Node) *yaml.Node {
	for j := 0; j+1 < len(task.Content); j += 2 {
		if task.Content[j].Value == "args" && task.Content[j+1].Kind == yaml.MappingNode {
			return task.Content[j+1]
		}
	}
	return nil
}

func isYAMLTrue(s string) bool {
	switch strings.ToLower(s) {
	case "true", "yes", "on", "1":
		return true
	}
	return false
}

// checkVarNames refuses ansible_* names among a vars/set_fact mapping's keys
// (a set_fact in k=v form too).
func checkVarNames(v *yaml.Node, what string, refuse func(int, string, string) error) error {
	if v.Kind == yaml.ScalarNode {
		for _, f := range strings.Fields(v.Value) {
			if name, _, ok := strings.Cut(f, "="); ok && strings.HasPrefix(name, "ansible_") {
				return refuse(v.Line, what+" "+name, "ansible_* variables steer the connection")
			}
		}
		return nil
	}
	if v.Kind != yaml.MappingNode {
		return nil
	}
	for j := 0; j+1 < len(v.Content); j += 2 {
		if name := v.Content[j].Value; strings.HasPrefix(name, "ansible_") {
			return refuse(v.Content[j].Line, what+" "+name, "ansible_* variables steer the connection (ansible_connection: local is the controller)")
		}
	}
	return nil
}

// checkNoAliases refuses anchors' uses and merge keys anywhere in a task.
func checkNoAliases(n *yaml.Node, refuse func(int, string, string) error) error {
	if n.Kind == yaml.AliasNode {
		return refuse(n.Line, "a YAML alias (*"+n.Value+")", "aliases and merge keys would hide keys from the check")
	}
	for i, c := range n.Content {
		if n.Kind == yaml.MappingNode && i%2 == 0 && c.Value == "<<" && c.Tag == "!!merge" {
			return refuse(c.Line, "a YAML merge key (<<)", "aliases and merge keys would hide keys from the check")
		}
		if err := checkNoAliases(c, refuse); err != nil {
			return err
		}
	}
	return nil
}

// checkInlineStrings scans every scalar under n for Jinja lookups and
// template includes; expr: the scalars are bare expressions (when: …).
func checkInlineStrings(n *yaml.Node, expr bool, refuse func(int, string) error) error {
	if n.Kind == yaml.ScalarNode {
		regions := jinjaRegionRE.FindAllString(n.Value, -1)
		if expr {
			regions = append(regions, n.Value)
		}
		for _, r := range regions {
			if m := jinjaLookupRE.FindStringSubmatch(r); m != nil {
				return refuse(n.Line, "Jinja "+m[2]+"()")
			}
		}
		if m := jinjaIncludeRE.FindStringSubmatch(n.Value); m != nil {
			return refuse(n.Line, "Jinja {% "+m[1]+" %}")
		}
		return nil
	}
	for i, c := range n.Content {
		// a mapping's keys are not templated; its values may be
		if n.Kind == yaml.MappingNode && i%2 == 0 {
			continue
		}
		e := expr
		if n.Kind == yaml.MappingNode {
			e = expr || inlineExprKeys[n.Content[i-1].Value]
		}
		if err := checkInlineStrings(c, e, refuse); err != nil {
			return err
		}
	}
	return nil
}
