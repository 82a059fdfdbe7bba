package engine

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"gopkg.in/yaml.v3"
)

// Role lookup over the content sources: the shipped collection and roles
// first, then the operator's (Options.ExtraCollectionsPaths and the later
// RolesPath entries). The lookup follows ansible-playbook's own resolution
// (the rendered ansible.cfg lists the same paths in the same order), so a
// role validation finds is the role the run loads:
//   - a short name is the first <roles path entry>/<name> directory;
//   - an FQCN ns.coll.role is roles/<role> of the FIRST collections path
//     holding ansible_collections/ns/coll: ansible loads a collection from one
//     path only, so a later copy of the same collection is never used.

// Limits of the content check of one role (a role is a handful of files;
// these stop a mistaken mount of a large tree from stalling validation).
const (
	maxRoleFiles    = 512
	maxRoleFileSize = 1 << 20
)

// SplitPaths splits a colon-separated path list (KPSSH_ROLES_PATH,
// KPSSH_COLLECTIONS_PATH), dropping empty entries.
func SplitPaths(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ":") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// CollectionsPaths is the collections search path, in ansible's order.
func (l *Local) CollectionsPaths() []string {
	return append([]string{l.opts.CollectionsPath}, l.opts.ExtraCollectionsPaths...)
}

// RolesPaths is the roles search path, in ansible's order.
func (l *Local) RolesPaths() []string { return append([]string(nil), l.opts.RolesPath...) }

// contentErr: a content source that cannot be read, named with the path.
func contentErr(root string, err error) error {
	return fmt.Errorf("content source %s is unreadable: %w", root, cause(err))
}

// statDir reports whether p is a directory; a permission or I/O error (not
// "does not exist") is returned, so that an unreadable content source is
// reported instead of being taken for an absent role.
func statDir(p string) (bool, error) {
	fi, err := os.Stat(p)
	switch {
	case err == nil:
		return fi.IsDir(), nil
	case errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR):
		return false, nil
	}
	return false, err
}

// resolveRole finds role's directory. shadowed lists later copies of the
// same role (never loaded: a mistake worth a condition).
func (l *Local) resolveRole(role string) (dir string, shadowed []string, err error) {
	parts := strings.Split(role, ".")
	if len(parts) == 3 {
		return resolveFQCN(l.CollectionsPaths(), parts[0], parts[1], parts[2], role)
	}
	for _, root := range l.opts.RolesPath {
		d := filepath.Join(root, role)
		ok, err := statDir(d)
		if err != nil {
			if dir == "" {
				return "", nil, contentErr(root, err)
			}
			continue // a later, unreadable source cannot shadow anything
		}
		if !ok {
			continue
		}
		if dir == "" {
			dir = d
		} else {
			shadowed = append(shadowed, d)
		}
	}
	if dir == "" {
		return "", nil, fmt.Errorf("role %s not found in: %s", role, strings.Join(l.opts.RolesPath, ", "))
	}
	return dir, shadowed, nil
}

func resolveFQCN(roots []string, ns, coll, name, role string) (dir string, shadowed []string, err error) {
	first := "" // the collection ansible loads
	for _, root := range roots {
		c := filepath.Join(root, "ansible_collections", ns, coll)
		ok, err := statDir(c)
		if err != nil {
			if first == "" {
				return "", nil, contentErr(root, err)
			}
			continue
		}
		if !ok {
			continue
		}
		r := filepath.Join(c, "roles", name)
		if first == "" {
			first = c
			if ok, err := statDir(r); err != nil {
				return "", nil, contentErr(root, err)
			} else if ok {
				dir = r
			}
			continue
		}
		if ok, _ := statDir(r); ok {
			shadowed = append(shadowed, r)
		}
	}
	switch {
	case first == "":
		return "", nil, fmt.Errorf("role %s not found in: %s (no collection %s.%s there)", role, strings.Join(roots, ", "), ns, coll)
	case dir == "":
		msg := fmt.Sprintf("role %s not found in: %s (collection %s.%s is loaded from %s, which has no roles/%s", role, strings.Join(roots, ", "), ns, coll, first, name)
		if len(shadowed) > 0 {
			msg += fmt.Sprintf("; ansible loads a collection from the first path that has it, so %s is never used", strings.Join(shadowed, ", "))
		}
		return "", nil, errors.New(msg + ")")
	}
	return dir, shadowed, nil
}

// checkRoleFiles reads every YAML file of the role (tasks, handlers,
// defaults, vars, meta, …) and reports the first that is unreadable or not
// valid YAML, by its path: ansible would fail on it only when the phase
// runs on a host.
func checkRoleFiles(role, dir string) error {
	var files []string
	if err := roleYAMLFiles(role, dir, 0, &files); err != nil {
		return err
	}
	sort.Strings(files)
	for _, f := range files {
		data, err := readBoundedFile(f, maxRoleFileSize)
		if err != nil {
			return fmt.Errorf("role %s: %w", role, err)
		}
		dec := yaml.NewDecoder(strings.NewReader(string(data)))
		for {
			var n yaml.Node
			if err := dec.Decode(&n); err != nil {
				if errors.Is(err, io.EOF) {
					break
				}
				return fmt.Errorf("role %s: %s is not valid YAML: %v", role, f, strings.TrimPrefix(err.Error(), "yaml: "))
			}
		}
	}
	return nil
}

// roleYAMLFiles collects the YAML files under dir. Symlinks are followed
// (a ConfigMap volume is symlinks into its ..data directory), dot entries
// (..data itself) and data directories are skipped, depth is bounded.
func roleYAMLFiles(role, dir string, depth int, files *[]string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("role %s: cannot read %s: %w", role, dir, cause(err))
	}
	for _, e := range ents {
		n := e.Name()
		p := filepath.Join(dir, n)
		if strings.HasPrefix(n, ".") {
			continue
		}
		fi, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("role %s: cannot read %s: %w", role, p, cause(err))
		}
		if fi.IsDir() {
			if depth == 0 && (n == "files" || n == "templates" || n == "molecule") || depth >= 8 {
				continue // data ansible does not parse as YAML
			}
			if err := roleYAMLFiles(role, p, depth+1, files); err != nil {
				return err
			}
			continue
		}
		if ext := filepath.Ext(n); ext == ".yml" || ext == ".yaml" {
			*files = append(*files, p)
			if len(*files) > maxRoleFiles {
				return fmt.Errorf("role %s: more than %d YAML files under it", role, maxRoleFiles)
			}
		}
	}
	return nil
}

func readBoundedFile(p string, n int64) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, fmt.Errorf("cannot read %s: %w", p, cause(err))
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("cannot read %s: %w", p, err)
	}
	if fi.Size() > n {
		return nil, fmt.Errorf("%s is over %d bytes", p, n)
	}
	data, err := io.ReadAll(io.LimitReader(f, n))
	if err != nil {
		return nil, fmt.Errorf("cannot read %s: %w", p, cause(err))
	}
	return data, nil
}

// cause is the errno of a path error (its path is named by the caller).
func cause(err error) error {
	if pe := (*fs.PathError)(nil); errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
