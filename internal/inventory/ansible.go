package inventory

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// maxListBytes bounds ansible-inventory's output: every host's resolved
// variables, so several times the inventory itself.
const maxListBytes = 8 * MaxBytes

// maxStderr is how much of ansible-inventory's stderr an error quotes.
const maxStderr = 2048

// killGrace is how long ansible-inventory has between SIGTERM and SIGKILL.
const killGrace = 2 * time.Second

// RunAnsible runs `bin --list -i path` and returns its JSON (see FromJSON)
// and what it said on stderr (its warnings). The child runs in its own
// process group: on timeout or cancellation the group gets SIGTERM, then
// SIGKILL, and whatever of the group outlives the child (an inventory
// script's children) is killed before the child is reaped.
func RunAnsible(ctx context.Context, bin, path string, timeout time.Duration) (stdout []byte, stderr string, err error) {
	var out limitedBuffer
	var errb tailBuffer
	out.max, errb.max = maxListBytes, maxStderr
	cmd := exec.Command(bin, "--list", "-i", path)
	// A source no plugin can read is an error, not an empty inventory.
	cmd.Env = append(os.Environ(), "ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED=True", "ANSIBLE_NOCOLOR=True")
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.WaitDelay = killGrace
	if err := cmd.Start(); err != nil {
		return nil, "", fmt.Errorf("start %s: %w", bin, err)
	}
	pid := cmd.Process.Pid
	exited := make(chan struct{})
	go func() { waitExitedNoReap(pid); close(exited) }()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var stopped error
	select {
	case <-exited:
	case <-timer.C:
		stopped = fmt.Errorf("%s --list timed out after %s", bin, timeout)
	case <-ctx.Done():
		stopped = ctx.Err()
	}
	if stopped != nil {
		_ = syscall.Kill(-pid, syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(killGrace):
		}
	}
	// Exited but not reaped: the group id cannot have been reused yet.
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	<-exited
	waitErr := cmd.Wait()
	stderr = strings.TrimSpace(errb.String())
	switch {
	case stopped != nil:
		return nil, stderr, stopped
	case out.over:
		return nil, stderr, fmt.Errorf("%s --list wrote more than %d bytes", bin, maxListBytes)
	case waitErr != nil:
		var ee *exec.ExitError
		if errors.As(waitErr, &ee) {
			return nil, stderr, fmt.Errorf("%s --list -i %s: %w: %s", bin, path, ee, stderr)
		}
		return nil, stderr, waitErr
	}
	return out.Bytes(), stderr, nil
}

// waitExitedNoReap blocks until pid has exited, leaving it a zombie (its
// pid and process group id stay reserved until cmd.Wait reaps it).
func waitExitedNoReap(pid int) {
	var info unix.Siginfo
	for unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil) == unix.EINTR {
	}
}

// limitedBuffer keeps up to max bytes and notes that more came.
type limitedBuffer struct {
	bytes.Buffer
	max  int
	over bool
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if b.Len()+len(p) > b.max {
		b.over = true
		return len(p), nil
	}
	return b.Buffer.Write(p)
}

// tailBuffer keeps the last max bytes.
type tailBuffer struct {
	b   []byte
	max int
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = append(t.b[:0], t.b[len(t.b)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string { return string(t.b) }
