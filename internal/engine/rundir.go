package engine

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
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

// runDirPrefix names run directories: kpssh-<pid>.<start>-<random>, start
// being the process's start time (clock ticks since boot, /proc/<pid>/stat):
// a restarted process sweeps the directories of dead ones (SweepStale), and
// pid and start time together tell a dead process from a new one with its
// pid — a controller restarted in its pod is pid 1 again.
const runDirPrefix = "kpssh-"

// selfStart is this process's start time, read once ("" if unreadable:
// then the name carries the pid alone, and the sweep judges by pid).
var selfStart = sync.OnceValue(func() string { return procStart(os.Getpid()) })

// procStart is field 22 of /proc/<pid>/stat, "" if the process does not
// exist or the file does not parse.
func procStart(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	// comm (field 2) may hold spaces and parentheses: fields 3.. follow the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return ""
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return ""
	}
	return f[19]
}

// runDirOwner is the <pid>[.<start>] part of the run directory names this
// process creates.
func runDirOwner() string {
	own := strconv.Itoa(os.Getpid())
	if st := selfStart(); st != "" {
		own += "." + st
	}
	return own
}

// runDir is a private directory for one run.
type runDir struct{ path string }

// defaultRunBase is RunBaseOwn, else /dev/shm, when it is a writable
// directory (tmpfs: secrets never touch a disk), else os.TempDir().
func defaultRunBase() string {
	// a tmpfs of the run directories' own (the chart mounts one): the run
	// sandbox grants /dev/shm (semaphores) to every run, so directories
	// there are not hidden from the other runs
	if fi, err := os.Stat(RunBaseOwn); err == nil && fi.IsDir() && syscall.Access(RunBaseOwn, 2 /* W_OK */) == nil {
		return RunBaseOwn
	}
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() && syscall.Access("/dev/shm", 2 /* W_OK */) == nil {
		return "/dev/shm"
	}
	return os.TempDir()
}

// RunBaseOwn is the preferred base of run directories when it exists and
// is writable (chart: a Memory emptyDir).
const RunBaseOwn = "/run/kpssh"

// newRunDir creates a 0700 directory under base (or the default base).
func newRunDir(base string) (*runDir, error) {
	if base == "" {
		base = defaultRunBase()
	}
	p, err := os.MkdirTemp(base, runDirPrefix+runDirOwner()+"-")
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
// leaves its run directory, secrets included, on tmpfs) — also when a new
// process has the dead one's pid — and stops the processes still naming
// them (the dead run's ssh ControlPersist master). Directories of live
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
		if !ownerGone(strings.TrimPrefix(name, runDirPrefix)) {
			continue
		}
		p := filepath.Join(base, name)
		// only our own directories (same owner)
		if fi, err := os.Lstat(p); err != nil || fi.Sys().(*syscall.Stat_t).Uid != uint32(os.Geteuid()) {
			continue
		}
		// The dead run's ssh ControlPersist master ("ssh: <dir>/cm [mux]")
		// left the run's process group and has no parent-death signal: it
		// would keep its connection to the host open with its socket gone.
		stopMentioning(p + "/")
		if err := os.RemoveAll(p); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, p)
	}
	return removed, errors.Join(errs...)
}

// ownerGone reports whether the process that named a run directory
// (<pid>[.<start>]-<random>) is gone: no such pid, or a pid with another
// start time (reused). A name without a start time (older kpssh) is gone if
// its pid is dead or is this process's own: this process never makes such
// names, so it is an earlier process that had this pid. Anything that does
// not parse is not ours to judge.
func ownerGone(rest string) bool {
	i := strings.IndexByte(rest, '-')
	if i <= 0 {
		return false
	}
	pidStr, start, hasStart := strings.Cut(rest[:i], ".")
	pid, err := strconv.Atoi(pidStr)
	if err != nil || pid <= 0 || (hasStart && start == "") {
		return false
	}
	if _, err := os.Stat("/proc/" + pidStr); err != nil {
		return errors.Is(err, os.ErrNotExist)
	}
	if !hasStart {
		return pid == os.Getpid() && selfStart() != ""
	}
	now := procStart(pid)
	return now != "" && now != start
}
