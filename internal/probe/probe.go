// Package probe reads a host's facts over SSH in one session: CPU count,
// memory, architecture and whether a kubelet runs. It knows nothing of
// Kubernetes objects; the host controller turns facts into status.
package probe

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/dklesev/kpssh/internal/sshx"
)

// DefaultTimeout bounds a whole probe (dial, handshake, command).
const DefaultTimeout = 30 * time.Second

// rawCommand prints one key=value line per fact; the `|| true` keeps a host
// without systemctl (or with kubelet unknown) from failing the whole probe.
const rawCommand = `echo "nproc=$(nproc)"; echo "memtotal_kb=$(awk '/^MemTotal:/{print $2}' /proc/meminfo)"; echo "arch=$(uname -m)"; echo "kubelet=$(systemctl is-active kubelet 2>/dev/null || true)"; echo "kubelet_enabled=$(systemctl is-enabled kubelet 2>/dev/null || true)"; echo "ssh_connection=${SSH_CONNECTION:-}"; echo "boot_id=$(cat /proc/sys/kernel/random/boot_id 2>/dev/null || true)"`

// ShimCommandPattern is what spec.shimCommand may hold: words of letters,
// digits and /._+=,@- separated by single spaces ("kpssh-shim",
// "sudo -n /usr/local/sbin/kpssh-shim"), or nothing (the default). The
// value becomes a remote shell command line, so no shell syntax may pass.
// It is also the field's CRD pattern (apis/v1beta1 tests that they agree).
const ShimCommandPattern = `^([A-Za-z0-9/._+=,@-]+( [A-Za-z0-9/._+=,@-]+)*)?$`

// MaxShimCommand is spec.shimCommand's CRD maxLength.
const MaxShimCommand = 1024

var shimCommandRE = regexp.MustCompile(ShimCommandPattern)

// ValidateShimCommand checks a host's spec.shimCommand against the CRD's
// rules, for objects stored before the CRD enforced them: the one check of
// the field, for the probe and the engine's Verified phases alike.
func ValidateShimCommand(s string) error {
	if len(s) > MaxShimCommand {
		return fmt.Errorf("spec.shimCommand is %d characters, more than %d", len(s), MaxShimCommand)
	}
	if !shimCommandRE.MatchString(s) {
		return fmt.Errorf("spec.shimCommand %q does not match %s (words of letters, digits and /._+=,@- separated by single spaces)", truncate(s, 80), ShimCommandPattern)
	}
	return nil
}

// Command returns what a probe runs. Verified hosts only run signed scripts
// behind the shim, whose built-in unsigned `probe` op prints the same lines;
// a shimCommand that is not a plain command line is an error (nothing runs).
func Command(verified bool, shimCommand string) (string, error) {
	if !verified {
		return rawCommand, nil
	}
	if err := ValidateShimCommand(shimCommand); err != nil {
		return "", fmt.Errorf("%w; not probing with it", err)
	}
	if shimCommand == "" {
		shimCommand = "kpssh-shim"
	}
	return shimCommand + " probe", nil
}

// Facts is what one probe learned.
type Facts struct {
	CPU           int64
	MemoryKiB     int64
	Arch          string // normalised: amd64, arm64, or the raw uname -m
	KubeletActive bool
	// KubeletEnabled: the unit is enabled, so it starts at boot — a host
	// probed right after power-on, before systemd reached the kubelet, is
	// not a host without one.
	KubeletEnabled bool
	// NodeIP is the host's own address on this SSH connection, the server
	// half of $SSH_CONNECTION, canonical; "" when the session had none (the
	// shim's probe op, sudo) or it is no usable node IP (loopback,
	// unspecified, a zoned link-local). sshd reports the address the
	// connection arrived on, past any NAT: the one a kubelet would advertise.
	NodeIP string
	// BootID is /proc/sys/kernel/random/boot_id (the kubelet reports the
	// same as the Node's bootID), "" when unknown: it changes with every
	// boot, which is how an in-place reboot is seen to have happened.
	BootID string
}

var bootIDRE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// KubeletMayRun reports whether a kubelet runs or will start by itself (an
// unclaimed host with one is a zombie, not Available).
func (f Facts) KubeletMayRun() bool { return f.KubeletActive || f.KubeletEnabled }

// NormalizeArch maps uname -m to Kubernetes' arch names.
func NormalizeArch(m string) string {
	switch m {
	case "x86_64", "amd64":
		return "amd64"
	case "aarch64", "arm64", "armv8l":
		return "arm64"
	}
	return m
}

// Parse reads the probe output. It tolerates CRLF, blank lines, noise lines
// (motd, shell warnings) and key order; it rejects missing or nonsensical
// values with an error naming the field.
func Parse(out string) (Facts, error) {
	vals := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(strings.TrimSuffix(line, "\r"))
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		switch k {
		case "nproc", "memtotal_kb", "arch", "kubelet", "kubelet_enabled", "ssh_connection", "boot_id":
			vals[k] = strings.TrimSpace(v)
		}
	}
	var f Facts
	var err error
	if f.CPU, err = positive(vals, "nproc", 1<<20); err != nil {
		return Facts{}, err
	}
	if f.MemoryKiB, err = positive(vals, "memtotal_kb", 1<<50); err != nil {
		return Facts{}, err
	}
	arch := vals["arch"]
	if arch == "" || len(arch) > 32 || strings.ContainsAny(arch, " \t") {
		return Facts{}, fmt.Errorf("probe output: arch %q is not a machine name", arch)
	}
	f.Arch = NormalizeArch(arch)
	switch vals["kubelet"] {
	case "active", "activating", "reloading", "deactivating":
		f.KubeletActive = true
	}
	switch vals["kubelet_enabled"] {
	case "enabled", "enabled-runtime":
		f.KubeletEnabled = true
	}
	f.NodeIP = serverIP(vals["ssh_connection"])
	if b := vals["boot_id"]; bootIDRE.MatchString(b) {
		f.BootID = b
	}
	return f, nil
}

// serverIP is the server address of an SSH_CONNECTION value ("client_ip
// client_port server_ip server_port") when it can be a node IP, else "".
func serverIP(conn string) string {
	fields := strings.Fields(conn)
	if len(fields) != 4 {
		return ""
	}
	ip, err := netip.ParseAddr(fields[2])
	if err != nil || ip.Zone() != "" {
		return ""
	}
	ip = ip.Unmap()
	if ip.IsLoopback() || ip.IsUnspecified() {
		return ""
	}
	return ip.String()
}

func positive(vals map[string]string, key string, max int64) (int64, error) {
	s, ok := vals[key]
	if !ok {
		return 0, fmt.Errorf("probe output: %s missing", key)
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 || n > max {
		return 0, fmt.Errorf("probe output: %s=%q is not a positive count", key, truncate(s, 40))
	}
	return n, nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// Result is a probe's outcome, including the host key seen (for TOFU pinning).
type Result struct {
	Facts       Facts
	Fingerprint string
	HostKey     string
}

// Run dials the target and probes it within timeout (DefaultTimeout if 0).
// A shimCommand that Command refuses fails it before any connection.
func Run(ctx context.Context, t sshx.Target, verified bool, shimCommand string, timeout time.Duration) (Result, error) {
	cmd, err := Command(verified, shimCommand)
	if err != nil {
		return Result{}, err
	}
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c, err := sshx.Dial(ctx, t)
	if err != nil {
		return Result{}, err
	}
	defer c.Close()
	res := Result{Fingerprint: c.Fingerprint, HostKey: c.HostKey}
	out, err := c.Run(ctx, cmd, nil)
	if err != nil {
		var ee *sshx.ExitError
		if errors.As(err, &ee) {
			return res, fmt.Errorf("probe command exited %d: %s", ee.Code, truncate(strings.TrimSpace(ee.Stderr), 200))
		}
		return res, err
	}
	if res.Facts, err = Parse(out.Stdout); err != nil {
		return res, err
	}
	return res, nil
}
