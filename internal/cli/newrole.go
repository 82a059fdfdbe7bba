package cli

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"text/template"

	"github.com/spf13/cobra"

	"github.com/dklesev/kpssh/internal/engine"
)

// roleTemplates is the skeleton `kpssh new-role` writes; [[ ]] delimits the
// Go template actions so that Jinja's {{ }} passes through.
//
//go:embed all:roletmpl/role
var roleTemplates embed.FS

const roleTemplateRoot = "roletmpl/role"

// NewRoleUsage is the synopsis of `kpssh new-role`.
const NewRoleUsage = `usage: kpssh new-role [--dir DIR] NAME

Write a role skeleton for a join profile into DIR/NAME (DIR defaults to the
working directory): tasks/install.yml, join.yml, leave.yml, uninstall.yml,
meta/main.yml, meta/argument_specs.yml (one entry point per phase),
defaults/main.yml (node-class vars mapped from kpssh_vars), README.md and a
molecule scenario molecule/default/ (delegated driver: install + join
converged twice, then verified). It passes kpssh validate, ansible-lint and
ansible-playbook --syntax-check as written. DIR/NAME must not exist.

Exit status: 0 written, 1 write error, 2 usage error (bad name, DIR/NAME exists).

flags:
`

// lintRoleRE is ansible-lint's role-name rule: a role ansible-lint accepts.
var lintRoleRE = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)

// CheckNewRoleName refuses a name the engine would not run or ansible-lint
// would flag.
func CheckNewRoleName(name string) error {
	switch {
	case !engine.ValidRoleName(name):
		return fmt.Errorf("role name %q is not a role name ([A-Za-z0-9_]+)", name)
	case strings.Contains(name, "."):
		return fmt.Errorf("role name %q: a dotted name is a collection's FQCN (ns.collection.role); new-role writes a role directory: give the role's own name", name)
	case !lintRoleRE.MatchString(name):
		return fmt.Errorf("role name %q: use lower case letters, digits and _, starting with a letter (ansible-lint's role-name rule: ^[a-z][a-z0-9_]*$)", name)
	}
	return nil
}

// NewRole writes the skeleton of role name into dir/name and returns the
// files written (relative to dir/name).
func NewRole(dir, name string) ([]string, error) {
	if err := CheckNewRoleName(name); err != nil {
		return nil, usageErr("%v", err)
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return nil, usageErr("--dir %s is not a directory", dir)
	}
	absDir, err := filepath.Abs(dir)
	if err != nil {
		return nil, usageErr("--dir %s: %v", dir, err)
	}
	root := filepath.Join(absDir, name)
	if _, err := os.Lstat(root); err == nil {
		return nil, usageErr("%s exists: new-role never writes into an existing directory", root)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, runtimeErr("%s: %v", root, err)
	}
	data := struct{ Name, Dir, Profile string }{name, absDir, strings.ReplaceAll(name, "_", "-")}
	type file struct {
		rel  string
		body []byte
	}
	var files []file
	err = fs.WalkDir(roleTemplates, roleTemplateRoot, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		raw, err := roleTemplates.ReadFile(p)
		if err != nil {
			return err
		}
		t, err := template.New(p).Delims("[[", "]]").Option("missingkey=error").Parse(string(raw))
		if err != nil {
			return err
		}
		var b bytes.Buffer
		if err := t.Execute(&b, data); err != nil {
			return err
		}
		files = append(files, file{strings.TrimPrefix(p, roleTemplateRoot+"/"), b.Bytes()})
		return nil
	})
	if err != nil {
		return nil, runtimeErr("role templates: %v", err) // a build defect
	}
	// Mkdir (not MkdirAll) of the root: a directory that appeared since the
	// check above is refused, not written into.
	if err := os.Mkdir(root, 0o755); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil, usageErr("%s exists: new-role never writes into an existing directory", root)
		}
		return nil, runtimeErr("%v", err)
	}
	var written []string
	for _, f := range files {
		p := filepath.Join(root, filepath.FromSlash(f.rel))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return written, runtimeErr("%v", err)
		}
		if err := os.WriteFile(p, f.body, 0o644); err != nil {
			return written, runtimeErr("%v", err)
		}
		written = append(written, f.rel)
	}
	return written, nil
}

// NewRoleCmd is `kpssh new-role` (args without the subcommand name).
func NewRoleCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return runSub(ctx, "new-role", args, stdout, stderr)
}

func (d deps) newRoleCommand() *cobra.Command {
	var dir string
	c := d.command("new-role", "NAME: write a role skeleton (phases, argument specs, defaults, README, molecule scenario)", NewRoleUsage,
		func(_ *cobra.Command, pos []string) error {
			if len(pos) != 1 {
				return withUsage("want NAME, got %d argument(s)", len(pos))
			}
			files, err := NewRole(dir, pos[0])
			if err != nil {
				return err
			}
			root := filepath.Join(dir, pos[0])
			for _, f := range files {
				fmt.Fprintln(d.stdout, filepath.Join(root, f))
			}
			fmt.Fprintf(d.stdout, "\nrole %s written; next: kpssh validate PROFILE.yaml --class CLASS.yaml --content %s\n", pos[0], dir)
			return nil
		})
	c.Flags().StringVar(&dir, "dir", ".", "parent `directory` of the new role")
	_ = c.MarkFlagDirname("dir")
	c.ValidArgsFunction = cobra.NoFileCompletions
	return c
}
