// Package probe reads a host's facts over SSH in one session: CPU count,
// memory, architecture and whether a kubelet runs. It knows nothing of
// Kubernetes objects; the host controller turns facts into status.
package probe

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/dklesev/kpssh/internal/sshx"
)

// DefaultTimeout bounds a whole probe (dial, handshake, command).
const DefaultTimeout = 30 * time.Second

// rawCommand prints one key=value line per fact; the `|| true` keeps a host
// without systemctl (or with kubelet unknown) from failing the whole probe.
const rawCommand = `echo "nproc=$(nproc)"; echo "memtotal_kb=$(awk '/^MemTotal:/{print $2}' /proc/meminfo)"; echo "arch=$(uname -m)"; echo "kubelet=$(systemctl is-active kubelet 2>/dev/null || true)"`

// Command returns what a probe runs. Verified hosts only run signed scripts
// behind the shim, whose built-in unsigned `probe` op prints the same lines.
func Command(verified bool, shimCommand string) string {
	if !verified {
		return rawCommand
	}
	if shimCommand == "" {
		shimCommand = "kpssh-shim"
	}
	return shimCommand + " probe"
}

// Facts is what one probe learned.
type Facts struct {
	CPU           int64
	MemoryKiB     int64
	Arch          string // normalised: amd64, arm64, or the raw uname -m
	KubeletActive bool
}

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
		case "nproc", "memtotal_kb", "arch", "kubelet":
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
	return f, nil
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
func Run(ctx context.Context, t sshx.Target, verified bool, shimCommand string, timeout time.Duration) (Result, error) {
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
	out, err := c.Run(ctx, Command(verified, shimCommand), nil)
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
