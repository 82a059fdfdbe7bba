package engine

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unicode/utf8"

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

// ansibleCollectionsPaths is where ansible itself looks for collections:
// ANSIBLE_COLLECTIONS_PATH (or the older ANSIBLE_COLLECTIONS_PATHS), else
// its default, ~/.ansible/collections and /usr/share/ansible/collections.
func ansibleCollectionsPaths() []string {
	for _, v := range []string{"ANSIBLE_COLLECTIONS_PATH", "ANSIBLE_COLLECTIONS_PATHS"} {
		if p := SplitPaths(os.Getenv(v)); len(p) > 0 {
			return p
		}
	}
	var out []string
	if home, err := os.UserHomeDir(); err == nil {
		out = append(out, filepath.Join(home, ".ansible", "collections"))
	}
	return append(out, "/usr/share/ansible/collections")
}

// installedCollection finds the project's collection where ansible-galaxy
// installed it (an author's machine: kpssh validate and render outside a
// checkout): the first of ansible's collections paths that holds it, with
// the engine's plugins.
func installedCollection() (string, bool) {
	for _, p := range ansibleCollectionsPaths() {
		if abs, err := filepath.Abs(p); err == nil && exists(filepath.Join(abs, "ansible_collections/dklesev/kpssh/plugins/callback/kpssh_events.py")) {
			return abs, true
		}
	}
	return "", false
}

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
// runs on a host. It returns a fingerprint of the files (paths and
// contents): the key of the role's ansible verdict.
func checkRoleFiles(role, dir string) (fingerprint string, err error) {
	var files []string
	if err := roleYAMLFiles(role, dir, 0, &files); err != nil {
		return "", err
	}
	sort.Strings(files)
	h := sha256.New()
	for _, f := range files {
		data, err := readBoundedFile(f, maxRoleFileSize)
		if err != nil {
			return "", fmt.Errorf("role %s: %w", role, err)
		}
		fmt.Fprintf(h, "%s\x00%d\x00", f, len(data))
		h.Write(data)
		dec := yaml.NewDecoder(strings.NewReader(string(data)))
		for {
			var n yaml.Node
			if err := dec.Decode(&n); err != nil {
				if errors.Is(err, io.EOF) {
					break
				}
				return "", fmt.Errorf("role %s: %s is not valid YAML: %v", role, f, strings.TrimPrefix(err.Error(), "yaml: "))
			}
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
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

// Ansible's own load of a role: ansible-playbook --syntax-check of the play
// a run renders (same ansible.cfg, roles and collections paths, sandbox),
// importing each phase file the controller may run (install, join, leave,
// reboot) in one go. It finds what the YAML check cannot: two actions in
// one task, a module or a dependency role that exists nowhere, an import of
// a missing file, a broken handler — which a run would report only as a
// ConfigError at each claim. A verdict is kept per role and fingerprint of
// its files for syntaxCacheTTL, so an unchanged role costs one run (~1 s of
// CPU) per TTL, and what lies outside the role (a dependency role, a
// collection's modules) is re-read at most that late.
const (
	syntaxCheckTimeout = 2 * time.Minute
	syntaxCacheTTL     = 10 * time.Minute
	// maxSyntaxMessage bounds ansible's message in the error (conditions
	// hold 1 KiB).
	maxSyntaxMessage = 640
)

// syntaxPhases are the phases whose files the check imports.
var syntaxPhases = []Phase{PhaseInstall, PhaseJoin, PhaseLeave, PhaseReboot}

// shippedRole reports whether dir is a role of the project's collection
// (in a checkout, its roles/ symlink leads to the repo's roles/): those are
// checked where the image is built (molecule, ansible-lint), not at every
// start of every controller.
func (l *Local) shippedRole(dir string) bool {
	roots := []string{filepath.Join(l.opts.CollectionsPath, collectionRolesDir)}
	if r, err := filepath.EvalSymlinks(roots[0]); err == nil {
		roots = append(roots, r)
	}
	for _, r := range roots {
		if filepath.Dir(dir) == r {
			return true
		}
	}
	return false
}

// syntaxCache holds ValidateRole's ansible verdicts.
type syntaxCache struct {
	mu       sync.Mutex
	verdicts map[string]syntaxVerdict
	runs     atomic.Int64 // ansible-playbook --syntax-check runs (tests)
}

type syntaxVerdict struct {
	err error
	at  time.Time
}

// roleSyntax is the cached verdict of ansible on the role in dir.
func (l *Local) roleSyntax(role, dir, fingerprint string) error {
	key := role + "\x00" + dir + "\x00" + fingerprint
	c := &l.syntax
	c.mu.Lock()
	v, ok := c.verdicts[key]
	c.mu.Unlock()
	if ok && time.Since(v.at) < syntaxCacheTTL {
		return v.err
	}
	err, verdict := l.syntaxCheck(role, dir)
	if !verdict {
		return nil // not ansible's verdict (timeout, no launcher): the run will tell
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	for k, v := range c.verdicts {
		if now.Sub(v.at) >= syntaxCacheTTL {
			delete(c.verdicts, k)
		}
	}
	if c.verdicts == nil {
		c.verdicts = map[string]syntaxVerdict{}
	}
	c.verdicts[key] = syntaxVerdict{err: err, at: now}
	return err
}

// syntaxCheck runs ansible-playbook --syntax-check on the role's phases in a
// run directory of its own (no key, no secrets: the inventory names a
// documentation address that is never contacted). verdict is false when
// ansible gave none (it could not start, timed out or was killed).
func (l *Local) syntaxCheck(role, roleDir string) (err error, verdict bool) {
	var phases []Phase
	for _, ph := range syntaxPhases {
		if _, err := os.Stat(filepath.Join(roleDir, "tasks", string(ph)+".yml")); err == nil {
			phases = append(phases, ph)
		}
	}
	// No ansible to ask (an engine not made by New: tests of the checks
	// before it): no verdict, the run will tell.
	if len(phases) == 0 || l.opts.AnsiblePlaybook == "" || len(l.interp) == 0 {
		return nil, false
	}
	l.syntax.runs.Add(1)
	dir, err := newRunDir(l.opts.RunDirBase)
	if err != nil {
		return nil, false
	}
	defer func() {
		_ = dir.remove()
		if l.opts.onDone != nil {
			l.opts.onDone(dir.path)
		}
	}()
	rc := l.renderConfig(dir.path, syntaxCheckTimeout)
	req := Request{Phase: phases[0], Source: Source{Role: role}, Conn: Connection{Address: "192.0.2.1", Port: 22, User: "root"}}
	ctx := phaseContext(req.Phase, Context{HostAddress: "192.0.2.1", NodeAddress: "192.0.2.1"})
	vars, err := varsFile(req.Phase, ctx)
	if err != nil {
		return nil, false
	}
	// the first phase's play as a run renders it, the others' imports after
	play := ansiblePlaybook(req, ctx, rc, kindRole)
	for _, ph := range phases[1:] {
		play += fmt.Sprintf("    - ansible.builtin.import_role:\n        name: %s\n        tasks_from: %s\n", yq(role), yq(string(ph)))
	}
	for _, f := range []struct{ name, data string }{
		{fileConfig, ansibleConfig(rc)}, {fileInventory, inventory(req.Conn, rc, phaseLockVars(rc, kindRole))}, {fileVars, vars}, {filePlaybook, play},
	} {
		if err := dir.write(f.name, []byte(f.data)); err != nil {
			return nil, false
		}
	}
	args := []string{"--syntax-check", "-i", dir.join(fileInventory), "-e", "@" + dir.join(fileVars), dir.join(filePlaybook)}
	launch, err := launchRequest(args, req.Conn)
	if err != nil {
		return nil, false
	}
	p, err := l.startCold(args, launch, dir, nil)
	if err != nil {
		return nil, false
	}
	if l.opts.onStart != nil {
		l.opts.onStart(p.cmd.Process.Pid, dir.path)
	}
	timer := time.NewTimer(syntaxCheckTimeout)
	defer timer.Stop()
	timedOut := false
	select {
	case <-p.exited:
	case <-timer.C:
		timedOut = true
	}
	// nothing of a syntax check outlives it
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	_ = p.cmd.Wait()
	p.ew.Close()
	if timedOut {
		return nil, false
	}
	if p.cmd.ProcessState.ExitCode() == 0 {
		return nil, true
	}
	msg := syntaxMessage(strings.ReplaceAll(p.errTail.String(), dir.path, "<run>"), roleDir)
	if msg == "" {
		return nil, false // no message of ansible's: the sandbox, a crash
	}
	return fmt.Errorf("role %s: ansible cannot load it: %s", role, msg), true
}

// syntaxMessage is ansible's error on one line: ansible-core ≥ 2.19's
// "[ERROR]: what" and "Origin: file:line:col" (shown in parentheses; without
// one, the role directory being loaded), or an older "ERROR! what … The
// error appears to be in 'file': line …". Empty when stderr holds no
// ansible error.
func syntaxMessage(stderr, loading string) string {
	var msg, origin string
	if i := strings.Index(stderr, "[ERROR]: "); i >= 0 {
		rest := stderr[i+len("[ERROR]: "):]
		for n, line := range strings.Split(rest, "\n") {
			if strings.HasPrefix(line, "Origin: ") {
				origin = strings.Join(strings.Fields(strings.TrimPrefix(line, "Origin: ")), " ")
				break
			}
			if n > 0 && strings.TrimSpace(line) == "" {
				break
			}
			msg += " " + line
		}
	} else if i := strings.Index(stderr, "ERROR! "); i >= 0 {
		msg = stderr[i+len("ERROR! "):]
	}
	msg = strings.Join(strings.Fields(msg), " ")
	if msg == "" {
		return ""
	}
	switch {
	case origin != "":
		msg += " (" + origin + ")"
	case !strings.Contains(msg, "The error appears to be in"):
		msg += " (while loading " + loading + ")"
	}
	if len(msg) > maxSyntaxMessage {
		n := maxSyntaxMessage
		for n > 0 && !utf8.RuneStart(msg[n]) {
			n--
		}
		msg = msg[:n] + "…"
	}
	return msg
}
