package engine

import (
	"os/exec"
	"strings"
	"testing"
	"time"
)

func TestScriptCommand(t *testing.T) {
	root := Request{Conn: Connection{User: "root"}}
	user := Request{Conn: Connection{User: "deploy"}}
	rc := renderConfig{tag: "kpssh-1-2", timeout: 90500 * time.Millisecond, remoteTimeout: true}
	for _, tc := range []struct {
		req  Request
		rc   renderConfig
		want string
	}{
		{root, rc, "flock -w 91 /run/kpssh-phase.lock timeout -k 5 91 bash -s kpssh-1-2"},
		{user, rc, "sudo -n flock -w 91 /run/kpssh-phase.lock timeout -k 5 91 bash -s kpssh-1-2"},
		{root, renderConfig{tag: "kpssh-1-2"}, `flock /run/kpssh-phase.lock sh -c 'bash -s "$0"; exit $?' kpssh-1-2`},
		{user, renderConfig{tag: "kpssh-1-2"}, `sudo -n flock /run/kpssh-phase.lock sh -c 'bash -s "$0"; exit $?' kpssh-1-2`},
		{root, renderConfig{}, "bash -s"},
	} {
		if got := scriptCommand(tc.req, tc.rc); got != tc.want {
			t.Errorf("scriptCommand = %q, want %q", got, tc.want)
		}
	}
}

// The remote command lines work as the login shell runs them: the script
// comes from stdin, $1 is the tag, the exit status passes through, and the
// tagged parent stays alive while the script runs.
func TestScriptCommandRunsInAShell(t *testing.T) {
	for _, rc := range []renderConfig{
		{tag: "kpssh-7-8", timeout: time.Minute, remoteTimeout: true},
		{tag: "kpssh-7-8"},
	} {
		cmdline := scriptCommand(Request{Conn: Connection{User: "root"}}, rc)
		for _, sh := range []string{"sh", "bash"} {
			c := exec.Command(sh, "-c", cmdline)
			c.Stdin = strings.NewReader("set -euo pipefail\necho \"tag=$1\"\nps -o args= -p $PPID\nexit 7\n")
			out, err := c.Output()
			ee, ok := err.(*exec.ExitError)
			if !ok || ee.ExitCode() != 7 {
				t.Fatalf("%s -c %q: %v", sh, cmdline, err)
			}
			lines := strings.Split(strings.TrimSpace(string(out)), "\n")
			if len(lines) != 2 || lines[0] != "tag=kpssh-7-8" || !strings.Contains(lines[1], "kpssh-7-8") {
				t.Fatalf("%s -c %q printed %q (want the tag as $1 and a tagged parent)", sh, cmdline, out)
			}
		}
	}
}
