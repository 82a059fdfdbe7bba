package testexec

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A timed-out command is killed with its whole process group (the
// grandchild too) and the error names the deadline.
func TestRunKillsTheGroupAtTheTimeout(t *testing.T) {
	pidFile := t.TempDir() + "/pid"
	start := time.Now()
	_, _, err := Run(time.Second, nil, "bash", "-c", "sleep 300 & echo $! >"+pidFile+"; wait")
	if err == nil || !strings.Contains(err.Error(), "deadline") {
		t.Fatalf("err %v, want the deadline named", err)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("Run returned after %v", d)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for syscall.Kill(pid, 0) == nil {
		if s, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); strings.Contains(string(s), ") Z ") {
			break // killed, waiting for its reaper (init)
		}
		if time.Now().After(deadline) {
			t.Fatalf("grandchild %d still running after the group was killed", pid)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestRunOutputs(t *testing.T) {
	out, errOut, err := Run(time.Minute, []string{"A=1"}, "bash", "-c", `echo "out $A"; echo err >&2`)
	if err != nil || out != "out 1\n" || errOut != "err\n" {
		t.Fatalf("Run: %q %q %v", out, errOut, err)
	}
}
