package cli

import (
	"os"
	"os/exec"
	"path/filepath"

	"github.com/dklesev/kpssh/internal/engine"
	"github.com/dklesev/kpssh/internal/profile"
)

// contentRoles resolves roles the way the controller does: the engine's own
// ValidateRole over the shipped roles and collection, then the --content
// sources (the order the controller searches its operator content in). It
// also says where it searches, for the argument-spec check.
type contentRoles struct {
	*engine.Local
	roles, collections []string
	// noAnsible: ansible-playbook is not on PATH, so ansible's load of a
	// role (ValidateRole's --syntax-check) is not run; a note says so.
	noAnsible bool
}

var _ profile.RoleSearchPath = (*contentRoles)(nil)

func (c *contentRoles) RolesPaths() []string       { return c.roles }
func (c *contentRoles) CollectionsPaths() []string { return c.collections }

// contentKind classifies a --content directory: a collections path (it
// holds ansible_collections/), a role (it holds tasks/ or meta/main.yml: its
// parent is the roles path), else a roles path.
func contentKind(dir string) (rolesPath, collectionsPath string, err error) {
	fi, err := os.Stat(dir)
	if err != nil {
		return "", "", usageErr("--content %s: %v", dir, err)
	}
	if !fi.IsDir() {
		return "", "", usageErr("--content %s is not a directory", dir)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", "", usageErr("--content %s: %v", dir, err)
	}
	switch {
	case isDir(filepath.Join(abs, "ansible_collections")):
		return "", abs, nil
	case isDir(filepath.Join(abs, "tasks")) || fileExists(filepath.Join(abs, "meta", "main.yml")):
		return filepath.Dir(abs), "", nil
	}
	return abs, "", nil
}

func isDir(p string) bool      { fi, err := os.Stat(p); return err == nil && fi.IsDir() }
func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// newContentRoles builds the resolver: the controller's role lookup, and
// ansible's load of operator roles (ansible-playbook --syntax-check) when
// ansible-playbook is on PATH. Nothing else runs (no warm runner).
func newContentRoles(content []string, runBase string) (*contentRoles, error) {
	coll, err := engine.FindCollectionsPath()
	if err != nil {
		return nil, usageErr("the shipped collection dklesev.kpssh: %v (run kpssh from a checkout or the runner image, or install the collection)", err)
	}
	c := &contentRoles{collections: []string{coll}}
	if r, err := engine.FindRolesPath(); err == nil {
		c.roles = append(c.roles, r)
	}
	for _, d := range content {
		r, cp, err := contentKind(d)
		if err != nil {
			return nil, err
		}
		if cp != "" {
			// The engine of this build searches one collections path; the
			// operator content paths (ExtraCollectionsPaths) extend it.
			return nil, usageErr("--content %s is a collections path (it holds ansible_collections/): this build's engine resolves collection roles in the shipped collection only; give a roles directory", d)
		}
		c.roles = append(c.roles, r)
	}
	ap, err := exec.LookPath("ansible-playbook")
	if err != nil {
		ap = "/usr/bin/ansible-playbook" // never run: role lookup only
		c.noAnsible = true
	}
	e, err := engine.New(engine.Options{AnsiblePlaybook: ap, CollectionsPath: coll, RolesPath: c.roles, NoWarmRunner: true, RunDirBase: runBase, NoRoleSyntaxCheck: c.noAnsible})
	if err != nil {
		return nil, usageErr("role lookup: %v", err)
	}
	c.Local = e
	return c, nil
}
