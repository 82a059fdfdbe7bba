package engine

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// Names inside a run directory (kept short: the ControlPath socket must fit
// in a unix socket path, and ssh appends a 17-byte suffix while creating it).
const (
	fileConfig    = "ansible.cfg"
	fileInventory = "inventory.yml"
	fileKey       = "id"
	fileKnown     = "known_hosts"
	filePlaybook  = "playbook.yml"
	fileVars      = "vars.yml"
	fileTasks     = "tasks.yml"
	fileScript    = "script.sh"
	fileResult    = "result.json"
	dirTmp        = "tmp"
	sockControl   = "cm"
)

// maxControlPath keeps <rundir>/cm plus ssh's temporary suffix inside
// sun_path (108 bytes on Linux).
const maxControlPath = 108 - 1 - 17

// runDirPrefix names run directories: kpssh-<pid>-<random>; the pid lets a
// restarted process sweep directories of dead ones (SweepStale).
const runDirPrefix = "kpssh-"

// runDir is a private directory for one run.
type runDir struct{ path string }

// defaultRunBase is /dev/shm when it is a writable directory (tmpfs: secrets
// never touch a disk), else os.TempDir().
func defaultRunBase() string {
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() && syscall.Access("/dev/shm", 2 /* W_OK */) == nil {
		return "/dev/shm"
	}
	return os.TempDir()
}

// newRunDir creates a 0700 directory under base (or the default base).
func newRunDir(base string) (*runDir, error) {
	if base == "" {
		base = defaultRunBase()
	}
	p, err := os.MkdirTemp(base, runDirPrefix+strconv.Itoa(os.Getpid())+"-")
	if err != nil {
		return nil, fmt.Errorf("create run directory: %w", err)
	}
	if err := os.Chmod(p, 0o700); err != nil {
		_ = os.RemoveAll(p)
		return nil, fmt.Errorf("create run directory: %w", err)
	}
	if p, err = filepath.Abs(p); err != nil {
		return nil, err
	}
	if len(p)+1+len(sockControl) > maxControlPath {
		_ = os.RemoveAll(p)
		return nil, fmt.Errorf("run directory %s is too long for an ssh ControlPath socket; set a shorter run directory base", p)
	}
	if strings.ContainsAny(p, "{}%\"'\\ \n:") {
		_ = os.RemoveAll(p)
		return nil, fmt.Errorf("run directory %q holds characters unsafe for ssh/ansible options", p)
	}
	r := &runDir{path: p}
	if err := os.Mkdir(r.join(dirTmp), 0o700); err != nil {
		_ = os.RemoveAll(p)
		return nil, fmt.Errorf("create run directory: %w", err)
	}
	return r, nil
}

func (r *runDir) join(name string) string { return filepath.Join(r.path, name) }

// write creates name with mode 0600 (O_EXCL: nothing pre-planted is reused).
func (r *runDir) write(name string, data []byte) error {
	f, err := os.OpenFile(r.join(name), os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// remove deletes the directory and everything in it.
func (r *runDir) remove() error {
	if r == nil || r.path == "" {
		return nil
	}
	return os.RemoveAll(r.path)
}

// SweepStale removes run directories under base (default base when empty)
// left by processes that no longer exist (a controller that crashed mid-run
// leaves its run directory, secrets included, on tmpfs). Directories of live
// processes are left alone. It returns what it removed.
func SweepStale(base string) ([]string, error) {
	if base == "" {
		base = defaultRunBase()
	}
	ents, err := os.ReadDir(base)
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, e := range ents {
		name := e.Name()
		if !e.IsDir() || !strings.HasPrefix(name, runDirPrefix) {
			continue
		}
		rest := strings.TrimPrefix(name, runDirPrefix)
		i := strings.IndexByte(rest, '-')
		if i <= 0 {
			continue
		}
		pid, err := strconv.Atoi(rest[:i])
		if err != nil || pid <= 0 {
			continue
		}
		if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err == nil || !errors.Is(err, os.ErrNotExist) {
			continue // alive (or unknown): not ours to judge
		}
		p := filepath.Join(base, name)
		// only our own directories (same owner)
		if fi, err := os.Lstat(p); err != nil || fi.Sys().(*syscall.Stat_t).Uid != uint32(os.Geteuid()) {
			continue
		}
		if err := os.RemoveAll(p); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, p)
	}
	return removed, errors.Join(errs...)
}
