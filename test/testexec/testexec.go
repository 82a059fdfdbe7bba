// Package testexec starts the tests' helper commands (hack scripts, podman,
// ssh-keygen, ansible-playbook, go build) the way the project runs every
// child: in its own process group, SIGKILLed as a group when its context
// ends, and reaped.
package testexec

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"syscall"
	"time"
)

// Command is exec.CommandContext with the process-group handling: ctx ending
// kills the whole group (a script's children too), and Wait gives up on
// leftover pipe holders after 10 s.
func Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	c := exec.CommandContext(ctx, name, args...)
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	c.Cancel = func() error { return syscall.Kill(-c.Process.Pid, syscall.SIGKILL) }
	c.WaitDelay = 10 * time.Second
	return c
}

// Output runs c (from Command) and returns its stdout and stderr; when the
// context ended the error says so.
func Output(ctx context.Context, c *exec.Cmd) (stdout, stderr string, err error) {
	var o, e bytes.Buffer
	c.Stdout, c.Stderr = &o, &e
	err = c.Run()
	if err != nil && ctx.Err() != nil {
		err = fmt.Errorf("%w (%v)", err, ctx.Err())
	}
	return o.String(), e.String(), err
}

// Run runs name bounded by timeout with env (nil: this process's
// environment) and returns its stdout and stderr.
func Run(timeout time.Duration, env []string, name string, args ...string) (stdout, stderr string, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c := Command(ctx, name, args...)
	c.Env = env
	return Output(ctx, c)
}
