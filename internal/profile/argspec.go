package profile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/engine"
)

// RoleSearchPath is a RoleValidator that also says where it looks, in
// ansible's order; the argument-spec check reads the role's files from
// there.
type RoleSearchPath interface {
	RolesPaths() []string
	CollectionsPaths() []string
}

// RoleDir is the directory ansible loads role from: a short name is the
// first <roles path>/<name> directory, an FQCN ns.coll.role is roles/<role>
// of the first collections path holding ansible_collections/ns/coll (ansible
// loads a collection from one path only). ok=false: not found.
func RoleDir(role string, sp RoleSearchPath) (string, bool) {
	isDir := func(p string) bool { fi, err := os.Stat(p); return err == nil && fi.IsDir() }
	if parts := strings.Split(role, "."); len(parts) == 3 {
		for _, root := range sp.CollectionsPaths() {
			c := filepath.Join(root, "ansible_collections", parts[0], parts[1])
			if isDir(c) {
				d := filepath.Join(c, "roles", parts[2])
				return d, isDir(d)
			}
		}
		return "", false
	}
	for _, root := range sp.RolesPaths() {
		if d := filepath.Join(root, role); isDir(d) {
			return d, true
		}
	}
	return "", false
}

// argumentSpecs is meta/argument_specs.yml (or the argument_specs key of
// meta/main.yml, ansible's fallback): entry point → its options.
type argumentSpecs map[string]struct {
	Options map[string]struct {
		Required bool `yaml:"required"`
	} `yaml:"options"`
}

// maxRoleMetaBytes bounds the role files this check reads.
const maxRoleMetaBytes = 1 << 20

func readRoleYAML(dir string, names ...string) (data []byte, file string, err error) {
	for _, n := range names {
		f := filepath.Join(dir, n)
		fi, err := os.Stat(f)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, f, err
		}
		if fi.Size() > maxRoleMetaBytes {
			return nil, f, fmt.Errorf("%s is %d bytes, more than %d", f, fi.Size(), maxRoleMetaBytes)
		}
		b, err := os.ReadFile(f)
		return b, f, err
	}
	return nil, "", nil
}

func loadArgumentSpecs(dir string) (argumentSpecs, string, error) {
	data, file, err := readRoleYAML(dir, "meta/argument_specs.yml", "meta/argument_specs.yaml")
	if err != nil {
		return nil, file, err
	}
	if data != nil {
		var doc struct {
			Specs argumentSpecs `yaml:"argument_specs"`
		}
		if err := yaml.Unmarshal(data, &doc); err != nil {
			return nil, file, fmt.Errorf("%s: %w", file, err)
		}
		return doc.Specs, file, nil
	}
	data, file, err = readRoleYAML(dir, "meta/main.yml", "meta/main.yaml")
	if err != nil || data == nil {
		return nil, file, err
	}
	var doc struct {
		Specs argumentSpecs `yaml:"argument_specs"`
	}
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, file, fmt.Errorf("%s: %w", file, err)
	}
	return doc.Specs, file, nil
}

// roleVars are the role's own variables (vars/main.yml over
// defaults/main.yml) and the file each comes from.
func roleVars(dir string) (map[string]any, map[string]string, error) {
	vals, from := map[string]any{}, map[string]string{}
	for _, names := range [][]string{{"defaults/main.yml", "defaults/main.yaml"}, {"vars/main.yml", "vars/main.yaml"}} {
		data, file, err := readRoleYAML(dir, names...)
		if err != nil {
			return nil, nil, err
		}
		if data == nil {
			continue
		}
		m := map[string]any{}
		if err := yaml.Unmarshal(data, &m); err != nil {
			return nil, nil, fmt.Errorf("%s: %w", file, err)
		}
		rel, _ := filepath.Rel(dir, file)
		for k, v := range m {
			vals[k], from[k] = v, rel
		}
	}
	return vals, from, nil
}

var (
	kpsshVarsRefRE = regexp.MustCompile(`\bkpssh_vars\s*(?:\.\s*([A-Za-z_]\w*)|\[\s*['"]([^'"]+)['"]\s*\])`)
	defaultArgRE   = regexp.MustCompile(`\b(?:default|d)\s*\(\s*([^,)]*)`)
)

// nonEmptyFallback reports whether a template gives a non-empty default
// (`| default('10.96.0.10', true)`): the variable then always has a value.
func nonEmptyFallback(expr string) bool {
	for _, m := range defaultArgRE.FindAllStringSubmatch(expr, -1) {
		switch strings.TrimSpace(m[1]) {
		case "", "''", `""`, "omit":
		default:
			return true
		}
	}
	return false
}

// CheckArgumentSpecs checks, for each phase of a role profile, the entry
// point named after the phase in the role's argument specs (ansible
// validates the entry point of import_role's tasks_from): every required
// option must get a value. kpssh hands node-class and profile vars to a role
// only as kpssh_vars, so a role variable has a value in a phase when the
// role's vars/main.yml or defaults/main.yml defines it — and, when that
// definition maps kpssh_vars.<name> without a non-empty default(), when the
// merged vars (Vars(p, nc)) set <name>; leave gets no vars at all. A
// definition that is a template of other variables cannot be evaluated here:
// it is returned as a note, not an error. A role without argument specs, or
// without an entry point for a phase, has nothing to check there.
func CheckArgumentSpecs(p *v1beta1.SSHJoinProfile, nc *v1beta1.SSHNodeClass, sp RoleSearchPath) (notes []string, err error) {
	role := strings.TrimSpace(p.Spec.Ansible.Role)
	dir, ok := RoleDir(role, sp)
	if !ok {
		return nil, nil // Validate reports a missing role
	}
	specs, specFile, err := loadArgumentSpecs(dir)
	if err != nil {
		return nil, fmt.Errorf("role %s: argument specs: %w", role, err)
	}
	if specs == nil {
		return nil, nil
	}
	vals, from, err := roleVars(dir)
	if err != nil {
		return nil, fmt.Errorf("role %s: %w", role, err)
	}
	vars := Vars(p, nc)
	specRel, _ := filepath.Rel(dir, specFile)
	for _, ph := range engine.Phases {
		entry, ok := specs[string(ph)]
		if !ok {
			continue
		}
		names := make([]string, 0, len(entry.Options))
		for n, o := range entry.Options {
			if o.Required {
				names = append(names, n)
			}
		}
		sort.Strings(names)
		where := fmt.Sprintf("%s: role %s, entry point %s (%s)", ph, role, ph, specRel)
		for _, opt := range names {
			v, defined := vals[opt]
			if !defined {
				return notes, fmt.Errorf("%s: required option %s has no value: kpssh passes node-class vars to a role only as kpssh_vars, so define it in defaults/main.yml (%s: \"{{ kpssh_vars.<name> }}\")", where, opt, opt)
			}
			expr, isString := v.(string)
			if !isString || !strings.Contains(expr, "{{") {
				continue // a literal value
			}
			var refs []string
			for _, m := range kpsshVarsRefRE.FindAllStringSubmatch(expr, -1) {
				if r := m[1] + m[2]; !slices.Contains(refs, r) {
					refs = append(refs, r)
				}
			}
			if len(refs) == 0 {
				// kpssh.<field> is the engine's (cluster endpoint, node
				// name…): always set in install and join.
				if !strings.Contains(expr, "kpssh.") && !strings.Contains(expr, "kpssh[") {
					notes = append(notes, fmt.Sprintf("%s: option %s is the template %q in %s, which is not checked here", where, opt, expr, from[opt]))
				}
				continue
			}
			if nonEmptyFallback(expr) {
				continue
			}
			for _, r := range refs {
				if ph == engine.PhaseLeave {
					return notes, fmt.Errorf("%s: required option %s maps kpssh_vars.%s (%s), but leave renders with the empty context (no vars): leave's options must come from the role itself", where, opt, r, from[opt])
				}
				if _, set := vars[r]; !set {
					return notes, fmt.Errorf("%s: required option %s needs var %s (%s maps it from kpssh_vars.%s), which neither SSHNodeClass %s's vars nor SSHJoinProfile %s's spec.ansible.vars set", where, opt, r, from[opt], r, nc.Name, p.Name)
				}
			}
		}
	}
	return notes, nil
}
