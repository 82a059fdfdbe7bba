package sshx_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/dklesev/kpssh/internal/sshx"
	"github.com/dklesev/kpssh/internal/sshx/sshtest"
)

func echoHandler(cmd string, stdin io.Reader, stdout, stderr io.Writer) int {
	switch {
	case cmd == "fail":
		fmt.Fprint(stderr, "boom")
		return 7
	case cmd == "cat":
		_, _ = io.Copy(stdout, stdin)
		return 0
	case cmd == "sleep":
		time.Sleep(5 * time.Second)
		return 0
	case strings.HasPrefix(cmd, "spew "):
		for i := 0; i < 200000; i++ {
			fmt.Fprintf(stdout, "line %06d\n", i)
		}
		return 0
	}
	fmt.Fprintf(stdout, "ran %s", cmd)
	return 0
}

func target(s *sshtest.Server) sshx.Target {
	return sshx.Target{Address: s.Host, Port: s.Port, User: "root", PrivateKey: s.ClientKey}
}

func TestDialTOFUReportsFingerprintAndRuns(t *testing.T) {
	s := sshtest.Start(t, echoHandler)
	ctx := context.Background()
	c, err := sshx.Dial(ctx, target(s))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if want := sshx.Fingerprint(s.HostKey); c.Fingerprint != want {
		t.Fatalf("fingerprint %s, want %s", c.Fingerprint, want)
	}
	if !strings.HasPrefix(c.Fingerprint, "SHA256:") || strings.HasSuffix(c.Fingerprint, "=") {
		t.Fatalf("fingerprint %q not in SHA256:<base64 no pad> form", c.Fingerprint)
	}
	res, err := c.Run(ctx, "hello", nil)
	if err != nil || res.Stdout != "ran hello" {
		t.Fatalf("run: %q %v", res.Stdout, err)
	}
	res, err = c.Run(ctx, "cat", strings.NewReader("stdin-data"))
	if err != nil || res.Stdout != "stdin-data" {
		t.Fatalf("stdin: %q %v", res.Stdout, err)
	}
}

func TestRunReportsExitCodeAndStderr(t *testing.T) {
	s := sshtest.Start(t, echoHandler)
	c, err := sshx.Dial(context.Background(), target(s))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	res, err := c.Run(context.Background(), "fail", nil)
	var ee *sshx.ExitError
	if !errors.As(err, &ee) || ee.Code != 7 || res.ExitCode != 7 || res.Stderr != "boom" {
		t.Fatalf("got %+v, %v", res, err)
	}
}

func TestRunKeepsBoundedTail(t *testing.T) {
	s := sshtest.Start(t, echoHandler)
	c, err := sshx.Dial(context.Background(), target(s))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	res, err := c.Run(context.Background(), "spew x", nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Stdout) != sshx.DefaultTailBytes || !strings.HasSuffix(res.Stdout, "line 199999\n") {
		t.Fatalf("tail len %d, ends %q", len(res.Stdout), res.Stdout[len(res.Stdout)-20:])
	}
}

func TestHostKeyMismatchAbortsBeforeAnySession(t *testing.T) {
	s := sshtest.Start(t, echoHandler)
	tg := target(s)
	tg.ExpectedFingerprint = "SHA256:" + strings.Repeat("A", 43)
	_, err := sshx.Dial(context.Background(), tg)
	var mm *sshx.HostKeyMismatchError
	if !errors.As(err, &mm) {
		t.Fatalf("want HostKeyMismatchError, got %v", err)
	}
	if mm.Expected != tg.ExpectedFingerprint || mm.Got != sshx.Fingerprint(s.HostKey) {
		t.Fatalf("mismatch reports %+v", mm)
	}
	if !strings.Contains(err.Error(), mm.Expected) || !strings.Contains(err.Error(), mm.Got) {
		t.Fatalf("error %q does not name both fingerprints", err)
	}
	if got := s.Executed(); len(got) != 0 {
		t.Fatalf("commands ran despite mismatch: %v", got)
	}
}

func TestPinnedFingerprintAccepted(t *testing.T) {
	s := sshtest.Start(t, echoHandler)
	tg := target(s)
	tg.ExpectedFingerprint = sshx.Fingerprint(s.HostKey)
	c, err := sshx.Dial(context.Background(), tg)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
}

func TestWrongClientKeyRejected(t *testing.T) {
	s := sshtest.Start(t, echoHandler)
	tg := target(s)
	_, other := sshtest.NewKey(t)
	tg.PrivateKey = other
	if _, err := sshx.Dial(context.Background(), tg); err == nil {
		t.Fatal("dial with an unauthorized key succeeded")
	}
}

func TestBadPrivateKeyErrorHasNoKeyMaterial(t *testing.T) {
	secret := string(sshtest.FakePEM("c2VjcmV0LWNhbmFyeS1kNGY5"))
	_, err := sshx.Dial(context.Background(), sshx.Target{Address: "127.0.0.1", PrivateKey: []byte(secret)})
	if err == nil || strings.Contains(err.Error(), "c2VjcmV0") {
		t.Fatalf("error %v", err)
	}
}

// A tarpit accepts TCP and never speaks: the handshake must give up on time.
func TestHandshakeBoundedAgainstTarpit(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var held []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	_, pem := sshtest.NewKey(t)
	tg := sshx.Target{Address: "127.0.0.1", Port: int32(ln.Addr().(*net.TCPAddr).Port), PrivateKey: pem, HandshakeTimeout: 300 * time.Millisecond}
	start := time.Now()
	_, err = sshx.Dial(context.Background(), tg)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("want deadline error, got %v", err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("handshake took %s despite a 300ms bound", el)
	}
}

func TestContextExpiryClosesRunningCommand(t *testing.T) {
	s := sshtest.Start(t, echoHandler)
	c, err := sshx.Dial(context.Background(), target(s))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err = c.Run(ctx, "sleep", nil)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("want deadline, got %v", err)
	}
	if _, err := c.Run(context.Background(), "hello", nil); err == nil {
		t.Fatal("connection still usable after its command's context expired")
	}
}

func TestDialContextCancelClosesConnection(t *testing.T) {
	s := sshtest.Start(t, echoHandler)
	ctx, cancel := context.WithCancel(context.Background())
	c, err := sshx.Dial(ctx, target(s))
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := c.Run(context.Background(), "hello", nil); err != nil {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("connection survived its dial context")
}
