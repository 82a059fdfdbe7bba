package inventory

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// ignoredExts are the names Ansible skips in an inventory directory: the
// default INVENTORY_IGNORE_EXTS (`ansible-config dump` of the runner image's
// ansible-core; .ini files are read).
var ignoredExts = []string{".pyc", ".pyo", ".swp", ".bak", "~", ".rpm", ".md", ".txt", ".rst", ".orig", ".cfg", ".retry"}

// varsDirs are what Ansible reads beside an inventory and this parser does
// not.
var varsDirs = []string{"group_vars", "host_vars"}

// ReadPath reads an inventory file, or every inventory file of a directory,
// with the built-in parser. format ("ini", "yaml", "") applies to a single
// file; a directory's files are told apart by extension and content. The
// warnings name what Ansible would read and this parser does not:
// group_vars/ and host_vars/ beside the inventory, and executable inventory
// scripts.
func ReadPath(path, format string) (*Inventory, []string, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, nil, err
	}
	inv := New()
	if !info.IsDir() {
		data, err := readBounded(path)
		if err == nil {
			err = inv.Add(data, formatFor(path, format), "")
		}
		return inv, varsDirWarnings(filepath.Dir(path)), err
	}
	dir := path
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, err
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].Name() < entries[j].Name() })
	warnings := varsDirWarnings(dir)
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || strings.HasPrefix(name, ".") || ignored(name) {
			continue
		}
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode()&0o111 != 0 {
			warnings = append(warnings, fmt.Sprintf("%s is executable (an inventory script): the built-in parser does not run it", p))
			continue
		}
		data, err := readBounded(p)
		if err == nil {
			err = inv.Add(data, formatFor(p, ""), name)
		}
		if err != nil {
			return nil, warnings, err
		}
	}
	return inv, warnings, nil
}

func ignored(name string) bool {
	for _, ext := range ignoredExts {
		if strings.HasSuffix(name, ext) {
			return true
		}
	}
	return false
}

func varsDirWarnings(dir string) []string {
	var out []string
	for _, d := range varsDirs {
		if fi, err := os.Stat(filepath.Join(dir, d)); err == nil && fi.IsDir() {
			out = append(out, fmt.Sprintf("%s/ is not read by the built-in parser: its variables are missing (put ansible-inventory on PATH)", filepath.Join(dir, d)))
		}
	}
	return out
}

func formatFor(path, format string) string {
	if format != "" {
		return format
	}
	switch strings.ToLower(filepath.Ext(path)) {
	case ".yml", ".yaml", ".json":
		return "yaml"
	case ".ini", ".cfg":
		return "ini"
	}
	return ""
}

func readBounded(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(data) > MaxBytes {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, MaxBytes)
	}
	return data, nil
}
