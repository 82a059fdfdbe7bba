// Package sshx is the controller's SSH transport (golang.org/x/crypto/ssh):
// key auth only, host keys pinned by SHA256 fingerprint (trust on first use
// or an operator-given pin), every dial, handshake and command bounded.
package sshx

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"

	"golang.org/x/crypto/ssh"
)

// DefaultHandshakeTimeout bounds TCP connect plus SSH handshake, so a tarpit
// cannot hold a probe worker.
const DefaultHandshakeTimeout = 15 * time.Second

// DefaultTailBytes is how much of stdout/stderr a Run keeps.
const DefaultTailBytes = 64 * 1024

// Target is everything needed to reach one host.
type Target struct {
	Address string
	Port    int32
	User    string
	// PrivateKey is the PEM key from the host's Secret (never logged).
	PrivateKey []byte
	// ExpectedFingerprint pins the host key ("SHA256:…"). Empty means trust on
	// first use: the handshake accepts any key and reports it.
	ExpectedFingerprint string
	// HandshakeTimeout overrides DefaultHandshakeTimeout (tests).
	HandshakeTimeout time.Duration
}

// Conn is one authenticated connection. Close it; a context passed to Dial
// also closes it on expiry.
type Conn struct {
	client *ssh.Client
	// Fingerprint is the host key the server presented, "SHA256:…".
	Fingerprint string
	// HostKey is that key as a public-key line.
	HostKey string
	stop    func() bool
}

// Dial connects and authenticates. A host key that differs from
// ExpectedFingerprint aborts the handshake before any session exists and
// returns a *HostKeyMismatchError. The connection is closed when ctx ends.
func Dial(ctx context.Context, t Target) (*Conn, error) {
	signer, err := ssh.ParsePrivateKey(t.PrivateKey)
	if err != nil {
		var pp *ssh.PassphraseMissingError
		if errors.As(err, &pp) {
			return nil, errors.New("ssh private key is passphrase-protected; kpssh needs an unencrypted key")
		}
		// The parser's error text never includes key material, but keep ours generic anyway.
		return nil, errors.New("ssh private key cannot be parsed (want a PEM or OpenSSH private key)")
	}
	timeout := t.HandshakeTimeout
	if timeout <= 0 {
		timeout = DefaultHandshakeTimeout
	}
	port := t.Port
	if port == 0 {
		port = 22
	}
	user := t.User
	if user == "" {
		user = "root"
	}
	addr := net.JoinHostPort(t.Address, strconv.Itoa(int(port)))

	var got ssh.PublicKey
	cfg := &ssh.ClientConfig{
		User: user,
		Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)},
		HostKeyCallback: func(_ string, _ net.Addr, key ssh.PublicKey) error {
			got = key
			if fp := Fingerprint(key); t.ExpectedFingerprint != "" && fp != t.ExpectedFingerprint {
				return &HostKeyMismatchError{Expected: t.ExpectedFingerprint, Got: fp}
			}
			return nil
		},
		Timeout: timeout,
	}

	hsCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	d := net.Dialer{Timeout: timeout}
	raw, err := d.DialContext(hsCtx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	// The handshake has no context of its own: a deadline on the socket and a
	// watcher that closes it bound it against a peer that never answers.
	_ = raw.SetDeadline(time.Now().Add(timeout))
	stopHS := context.AfterFunc(hsCtx, func() { _ = raw.Close() })
	c, chans, reqs, err := ssh.NewClientConn(raw, addr, cfg)
	stopped := stopHS()
	if err != nil {
		_ = raw.Close()
		var mm *HostKeyMismatchError
		if errors.As(err, &mm) {
			return nil, mm
		}
		var ne net.Error
		if !stopped || hsCtx.Err() != nil || errors.As(err, &ne) && ne.Timeout() {
			return nil, fmt.Errorf("ssh handshake with %s: no answer within %s: %w", addr, timeout, context.DeadlineExceeded)
		}
		return nil, fmt.Errorf("ssh handshake with %s: %w", addr, err)
	}
	_ = raw.SetDeadline(time.Time{})
	conn := &Conn{client: ssh.NewClient(c, chans, reqs), Fingerprint: Fingerprint(got), HostKey: PublicKeyLine(got)}
	conn.stop = context.AfterFunc(ctx, func() { _ = conn.client.Close() })
	return conn, nil
}

// Close ends the connection.
func (c *Conn) Close() error {
	c.stop()
	return c.client.Close()
}

// Result is a finished command.
type Result struct {
	Stdout, Stderr string // tails, at most DefaultTailBytes each
	ExitCode       int
}

// ExitError is a command that ran and exited non-zero.
type ExitError struct {
	Code   int
	Stderr string
}

func (e *ExitError) Error() string { return fmt.Sprintf("remote command exited %d", e.Code) }

// Run executes cmd in one session, feeding stdin if non-nil. It returns when
// the command exits or ctx ends (then the session and connection are closed).
// A non-zero exit returns the Result and an *ExitError.
func (c *Conn) Run(ctx context.Context, cmd string, stdin io.Reader) (Result, error) {
	sess, err := c.client.NewSession()
	if err != nil {
		return Result{}, fmt.Errorf("open session: %w", err)
	}
	defer sess.Close()
	out := &TailBuffer{Max: DefaultTailBytes}
	errb := &TailBuffer{Max: DefaultTailBytes}
	sess.Stdout, sess.Stderr, sess.Stdin = out, errb, stdin

	done := make(chan error, 1)
	go func() { done <- sess.Run(cmd) }()
	select {
	case err = <-done:
	case <-ctx.Done():
		_ = sess.Close()
		_ = c.client.Close()
		<-done
		return Result{Stdout: out.String(), Stderr: errb.String(), ExitCode: -1}, fmt.Errorf("remote command: %w", ctx.Err())
	}
	res := Result{Stdout: out.String(), Stderr: errb.String()}
	var ee *ssh.ExitError
	switch {
	case err == nil:
		return res, nil
	case errors.As(err, &ee):
		res.ExitCode = ee.ExitStatus()
		return res, &ExitError{Code: res.ExitCode, Stderr: res.Stderr}
	default:
		res.ExitCode = -1
		return res, fmt.Errorf("remote command: %w", err)
	}
}
