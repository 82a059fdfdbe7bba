// Package hostenv brings up a world of SSH-reachable test hosts for kpssh
// tests: systemd-nspawn containers booting a real systemd, each in its own
// network namespace, cgroup and overlay disk (see hack/hosts.sh and
// hack/rootfs.sh).
//
//	w := hostenv.Up(t, 3)                 // torn down by t.Cleanup
//	out, _, err := w.Run(0, "hostname")   // "h1"
//	w.Reboot(0); w.Wipe(1); w.Cut(2); w.Heal(2)
//	w.Stop(1); w.Start(1)                 // power cut, power back
//	hostenv.UpWith(t, 2, hostenv.Options{Releases: []string{hostenv.Bookworm, hostenv.Trixie}})
//
// Host indices are positions in Hosts() (0-based): index 0 is host "h1".
// It needs root, systemd-nspawn (systemd-container), debootstrap, iproute2
// and openssh-client; a missing component fails the test (never skips).
package hostenv

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// Host is one test host, as reported by `hosts.sh inventory`.
type Host struct {
	Name        string `json:"name"`        // "h1", "h2", ...
	Index       int    `json:"index"`       // 1-based index used by hosts.sh
	Machine     string `json:"machine"`     // systemd-nspawn machine name (unique across worlds)
	Address     string `json:"address"`     // IPv4 address on the world's bridge
	DNSName     string `json:"dnsName"`     // the host's name in Inventory.HostsFile (and every host's /etc/hosts)
	Port        int    `json:"port"`        // SSH port (root's: the harness logs in there)
	User        string `json:"user"`        // SSH user: root
	AltPort     int    `json:"altPort"`     // sshd's second port (2222)
	AltUser     string `json:"altUser"`     // a second login with the world's key and passwordless sudo ("admin")
	HostKey     string `json:"hostKey"`     // "ssh-ed25519 AAAA...": the key known_hosts pins
	Fingerprint string `json:"fingerprint"` // "SHA256:..." of HostKey, as ssh-keygen -lf prints it
	Netns       string `json:"netns"`       // network namespace name (/run/netns/<netns>)
	Veth        string `json:"veth"`        // machine-side veth (bridge port)
	MAC         string `json:"mac"`         // fixed MAC of the host's eth0
	Cgroup      string `json:"cgroup"`      // the host's cgroup path in every hierarchy
	PID         int    `json:"pid"`         // machine PID of the host's PID 1 (0: not running)
	Cut         bool   `json:"cut"`         // link taken down by Cut
	Release     string `json:"release"`     // Debian release the host boots: Bookworm or Trixie (kept by Wipe)
	// HostKeys are every key sshd serves, as a stock Debian host's:
	// "ssh-rsa ...", "ecdsa-sha2-nistp256 ...", "ssh-ed25519 ..." (HostKey).
	HostKeys []string `json:"hostKeys"`
}

// Debian releases a host can boot (hack/rootfs.sh RELEASE).
const (
	Bookworm = "bookworm" // Debian 12: systemd 252, OpenSSH 9.2, Python 3.11
	Trixie   = "trixie"   // Debian 13: systemd 257, OpenSSH 10.0, Python 3.13
)

// Inventory is the JSON printed by `hosts.sh inventory`.
type Inventory struct {
	World         string `json:"world"`
	Tag           string `json:"tag"`           // short hash naming the world's resources
	StateDir      string `json:"stateDir"`      // /run/kpssh-world/<world>
	Bridge        string `json:"bridge"`        // bridge interface name
	BridgeAddress string `json:"bridgeAddress"` // the machine's address on the bridge (x.y.z.1)
	ClientKey     string `json:"clientKey"`     // private key accepted by every host (root)
	KnownHosts    string `json:"knownHosts"`    // known_hosts file with every host's ed25519 key (ports 22 and AltPort)
	HostsFile     string `json:"hostsFile"`     // the world's names (Host.DNSName), /etc/hosts lines
	Cgroup        string `json:"cgroup"`        // the world's cgroup path (parent of hosts')
	Hosts         []Host `json:"hosts"`
}

// World is a running set of test hosts, bound to the test that reports its
// failures (see WithT).
type World struct {
	t testing.TB
	*world
}

type world struct {
	name     string
	script   string
	mirror   string // Options.Mirror
	releases string // Options.Releases, comma-separated (KPSSH_HOST_RELEASES)
	mu       sync.Mutex
	inv      Inventory
	watchdog *os.Process
	// write end of the watchdog's stdin, held open (and referenced, so it is
	// not closed by a finalizer) for the life of the world
	watchdogPipe *os.File
	downOnce     sync.Once
	downErr      error
}

// WithT returns the same world reporting failures to t: use it in subtests
// (calling t.Fatal of a parent test from a subtest is not allowed).
func (w *World) WithT(t testing.TB) *World { return &World{t: t, world: w.world} }

// DefaultCommandTimeout bounds Run.
const DefaultCommandTimeout = 2 * time.Minute

var worldSeq atomic.Int64

// Up brings up n hosts in a new world and registers its teardown with
// t.Cleanup (which also runs when the test fails or panics). If the test
// process dies without running cleanups (timeout, kill), a watchdog process
// tears the world down.
func Up(t testing.TB, n int) *World {
	t.Helper()
	return UpWith(t, n, Options{})
}

// Options change what a world's hosts get.
type Options struct {
	// Mirror is a directory (hack/node-assets.sh) every host sees read-only
	// at /srv/kpssh-mirror; containerd imports its images/*.tar when it
	// starts (hosts.sh's KPSSH_MIRROR).
	Mirror string
	// Releases are the Debian releases of the hosts: Releases[i] for host i,
	// hosts past the end (Scale) get the last entry, so {Trixie} makes every
	// host trixie. Empty: hosts.sh's default (bookworm), or what
	// KPSSH_HOST_RELEASES in the test's environment says, which runs a whole
	// suite's worlds on another release. A host keeps its release for life.
	Releases []string
}

// UpWith is Up with options.
func UpWith(t testing.TB, n int, o Options) *World {
	t.Helper()
	if testing.Short() {
		// -short is the quick loop (make test-unit): no root, no image build.
		t.Skip("-short: hostenv worlds need root, systemd-nspawn and the host image (make test runs them)")
	}
	if err := CheckPrerequisites(); err != nil {
		t.Fatalf("hostenv: %v", err)
	}
	script, err := hostsScript()
	if err != nil {
		t.Fatalf("hostenv: %v", err)
	}
	w := &World{t: t, world: &world{name: worldName(t.Name()), script: script, mirror: o.Mirror,
		releases: strings.Join(o.Releases, ",")}}

	// Reap worlds left behind by test processes that died.
	if out, err := w.hosts(5*time.Minute, "gc"); err != nil {
		t.Logf("hostenv: hosts.sh gc: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		if err := w.Down(); err != nil {
			t.Errorf("hostenv: tearing down world %s: %v", w.name, err)
		}
	})
	w.startWatchdog()
	start := time.Now()
	if out, err := w.hosts(20*time.Minute, "up", strconv.Itoa(n)); err != nil {
		// Once more (up is idempotent: it boots what is not answering): CI
		// once saw a host's nspawn exit during boot with nothing on its
		// console, among a dozen worlds booting at once. Twice is a failure.
		t.Logf("hostenv: hosts.sh up %d (world %s) failed, trying once more: %v\n%s", n, w.name, err, out)
		if out, err := w.hosts(20*time.Minute, "up", strconv.Itoa(n)); err != nil {
			t.Fatalf("hostenv: hosts.sh up %d (world %s) failed twice: %v\n%s", n, w.name, err, out)
		}
	}
	w.Refresh()
	if got := len(w.Hosts()); got < n {
		t.Fatalf("hostenv: world %s: inventory lists %d hosts, want %d", w.name, got, n)
	}
	t.Logf("hostenv: world %s: %d hosts up in %v (bridge %s, %s)", w.name, n, time.Since(start).Round(time.Millisecond), w.inv.BridgeAddress, w.releaseSummary())
	return w
}

// CheckPrerequisites reports what is missing to run a world (root, tools),
// naming the Debian package to install.
func CheckPrerequisites() error {
	return checkPrerequisites(os.Geteuid(), lookPath)
}

// Prerequisite tools and the Debian packages providing them.
var prerequisites = []struct{ cmd, pkg string }{
	{"debootstrap", "debootstrap"},
	{"systemd-nspawn", "systemd-container"},
	{"ip", "iproute2"},
	{"ssh", "openssh-client"},
	{"ssh-keygen", "openssh-client"},
	{"unshare", "util-linux"},
	{"flock", "util-linux"},
	{"bash", "bash"},
}

// CheckPrerequisitesWith is CheckPrerequisites for a given effective uid and
// command lookup (for tests of the messages).
func CheckPrerequisitesWith(euid int, look func(string) (string, error)) error {
	return checkPrerequisites(euid, look)
}

func checkPrerequisites(euid int, look func(string) (string, error)) error {
	var missing []string
	if euid != 0 {
		missing = append(missing, "root (test hosts need netns, mounts, cgroups and systemd-nspawn: run the tests as root)")
	}
	for _, p := range prerequisites {
		if _, err := look(p.cmd); err != nil {
			missing = append(missing, fmt.Sprintf("%s (apt-get install %s)", p.cmd, p.pkg))
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("missing: %s", strings.Join(missing, "; "))
	}
	return nil
}

// lookPath is exec.LookPath that also searches the sbin dirs, which are not
// always on PATH for root.
func lookPath(cmd string) (string, error) {
	if p, err := exec.LookPath(cmd); err == nil {
		return p, nil
	}
	for _, d := range []string{"/usr/local/sbin", "/usr/sbin", "/sbin"} {
		p := filepath.Join(d, cmd)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: not found", cmd)
}

// RepoRoot returns the directory holding go.mod, walking up from the working
// directory (a test's working directory is its package directory).
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("cannot find go.mod above the working directory")
		}
		dir = parent
	}
}

func hostsScript() (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	s := filepath.Join(root, "hack", "hosts.sh")
	if _, err := os.Stat(s); err != nil {
		return "", fmt.Errorf("hack/hosts.sh: %w", err)
	}
	return s, nil
}

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9_.-]+`)

// worldName derives a unique world name from a test name and this process.
func worldName(testName string) string {
	base := strings.Trim(unsafeChars.ReplaceAllString(testName, "-"), "-._")
	if base == "" {
		base = "test"
	}
	if len(base) > 60 {
		base = base[:60]
	}
	return fmt.Sprintf("%s-%d-%d", base, os.Getpid(), worldSeq.Add(1))
}

// Name is the world's name (KPSSH_WORLD).
func (w *world) Name() string { return w.name }

// Inventory returns the last inventory read (see Refresh).
func (w *world) Inventory() Inventory {
	w.mu.Lock()
	defer w.mu.Unlock()
	inv := w.inv
	inv.Hosts = append([]Host(nil), w.inv.Hosts...)
	return inv
}

// Hosts returns the world's hosts (index i is host "h<i+1>").
func (w *world) Hosts() []Host { return w.Inventory().Hosts }

// releaseSummary is "h1 bookworm, h2 trixie, ...".
func (w *world) releaseSummary() string {
	var parts []string
	for _, h := range w.Hosts() {
		parts = append(parts, h.Name+" "+h.Release)
	}
	return strings.Join(parts, ", ")
}

// AnsibleInventory is a YAML inventory for ansible-playbook naming host i,
// logged in to as root with the world's key, its host key pinned.
func (w *world) AnsibleInventory(i int) string {
	inv := w.Inventory()
	h := inv.Hosts[i]
	return fmt.Sprintf(`all:
  hosts:
    %s:
      ansible_host: %s
      ansible_port: %d
      ansible_user: root
      ansible_ssh_private_key_file: %s
      ansible_python_interpreter: /usr/bin/python3
      ansible_ssh_common_args: "-F /dev/null -o StrictHostKeyChecking=yes -o UserKnownHostsFile=%s -o GlobalKnownHostsFile=/dev/null -o IdentitiesOnly=yes"
`, h.Name, h.Address, h.Port, inv.ClientKey, inv.KnownHosts)
}

// Host returns host i.
func (w *World) Host(i int) Host {
	w.t.Helper()
	hs := w.Hosts()
	if i < 0 || i >= len(hs) {
		w.t.Fatalf("hostenv: no host %d in world %s (%d hosts)", i, w.name, len(hs))
	}
	return hs[i]
}

// Refresh re-reads the inventory (host keys, PIDs) from hosts.sh.
func (w *World) Refresh() {
	w.t.Helper()
	inv, err := w.readInventory()
	if err != nil {
		w.t.Fatalf("hostenv: %v", err)
	}
	w.mu.Lock()
	w.inv = inv
	w.mu.Unlock()
}

func (w *world) readInventory() (Inventory, error) {
	var inv Inventory
	out, err := w.hostsStdout(time.Minute, "inventory")
	if err != nil {
		return inv, fmt.Errorf("hosts.sh inventory (world %s): %w", w.name, err)
	}
	if err := json.Unmarshal(out, &inv); err != nil {
		return inv, fmt.Errorf("hosts.sh inventory (world %s): bad JSON: %w\n%s", w.name, err, out)
	}
	return inv, nil
}

// Scale runs `hosts.sh up n` on the running world: a no-op for hosts that
// are healthy, adds the missing ones.
func (w *World) Scale(n int) { w.t.Helper(); w.mustHosts("up", strconv.Itoa(n)) }

// Reboot stops host i (SIGKILL of its PID 1) and boots it again on the same
// disk; returns when it answers SSH.
func (w *World) Reboot(i int) { w.t.Helper(); w.mustHosts("reboot", w.index(i)) }

// Wipe stops host i and boots it on a fresh disk with a new host key and
// machine-id; returns when it answers SSH.
func (w *World) Wipe(i int) { w.t.Helper(); w.mustHosts("wipe", w.index(i)) }

// Stop powers host i off the way a power cut does: SIGKILL of its PID 1,
// nothing shut down cleanly; its disk is kept and its address stops
// answering. Start boots it again.
func (w *World) Stop(i int) { w.t.Helper(); w.mustHosts("stop", w.index(i)) }

// Start boots a stopped host i on the same disk; returns when it answers SSH.
func (w *World) Start(i int) { w.t.Helper(); w.mustHosts("start", w.index(i)) }

// Procs returns the command lines (arguments joined by spaces) of the
// processes running in host i, read from this machine's /proc through the
// host's cgroup: no SSH, so it is cheap enough to poll and works while the
// host's sshd is busy.
func (w *World) Procs(i int) []string {
	w.t.Helper()
	return procsInCgroup(w.Host(i).Cgroup)
}

func procsInCgroup(cg string) []string {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range ents {
		pid := e.Name()
		if pid[0] < '0' || pid[0] > '9' {
			continue
		}
		b, err := os.ReadFile("/proc/" + pid + "/cgroup")
		if err != nil || !inCgroup(string(b), cg) {
			continue // gone, or not the host's
		}
		cmd, err := os.ReadFile("/proc/" + pid + "/cmdline")
		if err != nil || len(cmd) == 0 {
			continue // gone, or a kernel thread
		}
		out = append(out, strings.TrimSpace(strings.ReplaceAll(string(cmd), "\x00", " ")))
	}
	return out
}

// inCgroup reports whether a /proc/PID/cgroup text places the process in cg
// or below it on the name=systemd (v1) or unified (v2) hierarchy.
func inCgroup(procCgroup, cg string) bool {
	for _, l := range strings.Split(procCgroup, "\n") {
		parts := strings.SplitN(l, ":", 3)
		if len(parts) != 3 || (parts[1] != "name=systemd" && parts[0] != "0") {
			continue
		}
		if parts[2] == cg || strings.HasPrefix(parts[2], cg+"/") {
			return true
		}
	}
	return false
}

// Cut takes host i's link down (it keeps running, unreachable).
func (w *World) Cut(i int) { w.t.Helper(); w.mustHosts("cut", w.index(i)) }

// Heal brings host i's link back up.
func (w *World) Heal(i int) { w.t.Helper(); w.mustHosts("heal", w.index(i)) }

func (w *World) index(i int) string {
	w.t.Helper()
	return strconv.Itoa(w.Host(i).Index)
}

func (w *World) mustHosts(args ...string) {
	w.t.Helper()
	if out, err := w.hosts(10*time.Minute, args...); err != nil {
		w.t.Fatalf("hostenv: hosts.sh %s (world %s): %v\n%s", strings.Join(args, " "), w.name, err, out)
	}
	w.Refresh()
}

// SSHArgs returns the ssh arguments (without the "ssh" and the command) that
// log in to host i as root with the world's key and strict host key
// checking. Options in extra come first, so they override the defaults
// (ssh keeps the first value of an option).
func (w *World) SSHArgs(i int, extra ...string) []string {
	w.t.Helper()
	h := w.Host(i)
	return w.sshArgs(h.User, h.Address, h.Port, extra)
}

// AltSSHArgs is SSHArgs for host i's second login: AltUser on AltPort.
func (w *World) AltSSHArgs(i int, extra ...string) []string {
	w.t.Helper()
	h := w.Host(i)
	return w.sshArgs(h.AltUser, h.Address, h.AltPort, extra)
}

func (w *World) sshArgs(user, address string, port int, extra []string) []string {
	inv := w.Inventory()
	args := append([]string{}, extra...)
	args = append(args,
		"-F", "/dev/null",
		"-i", inv.ClientKey,
		"-o", "IdentitiesOnly=yes",
		"-o", "BatchMode=yes",
		"-o", "StrictHostKeyChecking=yes",
		"-o", "UserKnownHostsFile="+inv.KnownHosts,
		"-o", "GlobalKnownHostsFile=/dev/null",
		"-o", "LogLevel=ERROR",
		"-o", "ConnectTimeout=5",
		"-p", strconv.Itoa(port),
		user+"@"+address,
	)
	return args
}

// Run runs a shell command on host i over SSH.
func (w *World) Run(i int, cmd string) (stdout, stderr string, err error) {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), DefaultCommandTimeout)
	defer cancel()
	return w.RunContext(ctx, i, cmd)
}

// RunContext is Run with a context; extra ssh options may be passed via
// RunSSH.
func (w *World) RunContext(ctx context.Context, i int, cmd string) (stdout, stderr string, err error) {
	w.t.Helper()
	return w.RunSSH(ctx, i, nil, cmd)
}

// RunSSH runs cmd on host i with extra ssh options (e.g. "-o",
// "ConnectTimeout=3") placed before the defaults.
func (w *World) RunSSH(ctx context.Context, i int, extra []string, cmd string) (stdout, stderr string, err error) {
	w.t.Helper()
	args := append(w.SSHArgs(i, extra...), "--", cmd)
	c := exec.CommandContext(ctx, "ssh", args...)
	var o, e bytes.Buffer
	c.Stdin = nil
	c.Stdout, c.Stderr = &o, &e
	c.WaitDelay = 5 * time.Second
	err = c.Run()
	if err != nil {
		err = fmt.Errorf("ssh %s@%s %q: %w: %s", w.Host(i).User, w.Host(i).Name, cmd, err, strings.TrimSpace(e.String()))
	}
	return o.String(), e.String(), err
}

// MustRun is Run that fails the test on error and returns trimmed stdout.
func (w *World) MustRun(i int, cmd string) string {
	w.t.Helper()
	out, _, err := w.Run(i, cmd)
	if err != nil {
		w.t.Fatalf("hostenv: %v", err)
	}
	return strings.TrimSpace(out)
}

// Down tears the world down (idempotent; also registered with t.Cleanup).
func (w *world) Down() error {
	w.downOnce.Do(func() {
		out, err := w.hosts(5*time.Minute, "down")
		if err != nil {
			w.downErr = fmt.Errorf("hosts.sh down: %w\n%s", err, out)
		}
		w.stopWatchdog()
	})
	return w.downErr
}

// hosts runs hack/hosts.sh for this world and returns its combined output.
func (w *world) hosts(timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c := w.command(ctx, args...)
	var buf bytes.Buffer
	c.Stdout, c.Stderr = &buf, &buf
	err := c.Run()
	return buf.String(), err
}

// hostsStdout runs hack/hosts.sh and returns its stdout (stderr in the error).
func (w *world) hostsStdout(timeout time.Duration, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c := w.command(ctx, args...)
	var o, e bytes.Buffer
	c.Stdout, c.Stderr = &o, &e
	if err := c.Run(); err != nil {
		return o.Bytes(), fmt.Errorf("%w: %s", err, strings.TrimSpace(e.String()))
	}
	return o.Bytes(), nil
}

func (w *world) command(ctx context.Context, args ...string) *exec.Cmd {
	c := exec.CommandContext(ctx, "bash", append([]string{w.script}, args...)...)
	c.Env = append(worldEnv(os.Environ()),
		"KPSSH_WORLD="+w.name,
		"KPSSH_OWNER_PID="+strconv.Itoa(os.Getpid()),
		"PATH="+os.Getenv("PATH")+":/usr/local/sbin:/usr/sbin:/sbin",
	)
	if w.mirror != "" {
		c.Env = append(c.Env, "KPSSH_MIRROR="+w.mirror)
	}
	if w.releases != "" {
		c.Env = append(c.Env, "KPSSH_HOST_RELEASES="+w.releases)
	}
	c.Stdin = nil
	// On timeout, kill the script (hosts it launched are detached and are
	// torn down by "down").
	c.WaitDelay = 10 * time.Second
	return c
}

// worldEnv drops variables that would change which world or nspawn
// behaviour a hosts.sh run gets.
func worldEnv(env []string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if strings.HasPrefix(kv, "KPSSH_WORLD=") || strings.HasPrefix(kv, "KPSSH_OWNER_PID=") || strings.HasPrefix(kv, "KPSSH_MIRROR=") ||
			strings.HasPrefix(kv, "SYSTEMD_NSPAWN_") || strings.HasPrefix(kv, "PATH=") {
			continue
		}
		out = append(out, kv)
	}
	return out
}

// startWatchdog starts a detached process that runs `hosts.sh down` for this
// world if this test process dies without cleaning up (e.g. go test's
// -timeout panic, SIGKILL): it blocks reading a pipe whose write end only this
// process holds, so EOF means the process is gone. No polling, no child
// processes. Down stops it.
func (w *World) startWatchdog() {
	r, wr, err := os.Pipe()
	if err != nil {
		w.t.Logf("hostenv: cannot start watchdog: %v", err)
		return
	}
	c := exec.Command("bash", "-c", `read -r _; exec bash "$1" down >/dev/null 2>&1`, "kpssh-watchdog", w.script)
	c.Env = append(worldEnv(os.Environ()), "KPSSH_WORLD="+w.name,
		"PATH="+os.Getenv("PATH")+":/usr/local/sbin:/usr/sbin:/sbin")
	c.Stdin = r
	c.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := c.Start(); err != nil {
		_ = r.Close()
		_ = wr.Close()
		w.t.Logf("hostenv: cannot start watchdog: %v", err)
		return
	}
	_ = r.Close() // the child has it
	w.watchdog, w.watchdogPipe = c.Process, wr
	go func() { _, _ = c.Process.Wait() }()
}

func (w *world) stopWatchdog() {
	if w.watchdog != nil {
		_ = w.watchdog.Kill()
		w.watchdog = nil
	}
	if w.watchdogPipe != nil {
		_ = w.watchdogPipe.Close()
		w.watchdogPipe = nil
	}
}
