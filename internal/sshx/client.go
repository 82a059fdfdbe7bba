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
	"slices"
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
	// ExpectedFingerprint pins the host key ("SHA256:…"): any of the host's
	// keys with this fingerprint is accepted, whatever its type (see Dial).
	// Empty means trust on first use: the host's key of the first type in
	// HostKeyTypes it has is accepted and reported.
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

// Dial connects and authenticates. With ExpectedFingerprint set it accepts
// whichever of the host's keys has that fingerprint, whatever its type; a
// host none of whose keys has it is refused before any session exists (a
// *HostKeyMismatchError naming them all). Without it (trust on first use)
// the host's key of the first type in HostKeyTypes is taken — the one
// OpenSSH's ssh(1) takes too. The connection is closed when ctx ends.
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
	auth := []ssh.AuthMethod{ssh.PublicKeys(signer)}

	// A host has several keys (a stock install: rsa, ecdsa, ed25519) and
	// shows one per handshake, the first of the client's host-key
	// algorithms it has. Offer every key type (the pin's remembered type
	// first); while the key shown is not the pinned one, ask again without
	// its type. A host without another key type ends it (no common host-key
	// algorithm): a mismatch naming every key the host showed.
	types := hostKeyOrder(t.ExpectedFingerprint)
	var shown []ssh.PublicKey
	for {
		c, key, err := handshake(ctx, addr, user, auth, algorithmsOf(types), t.ExpectedFingerprint, timeout)
		var mm *HostKeyMismatchError
		var ne *ssh.AlgorithmNegotiationError
		switch {
		case err == nil:
			rememberKeyType(t.ExpectedFingerprint, key.Type())
			conn := &Conn{client: c, Fingerprint: Fingerprint(key), HostKey: PublicKeyLine(key)}
			conn.stop = context.AfterFunc(ctx, func() { _ = conn.client.Close() })
			return conn, nil
		case errors.As(err, &mm):
			shown = append(shown, key)
			types = slices.DeleteFunc(types, func(kt string) bool { return kt == key.Type() })
			if len(types) == 0 {
				return nil, mismatch(t.ExpectedFingerprint, shown)
			}
		case len(shown) > 0 && errors.As(err, &ne) && ne.What == "host key":
			return nil, mismatch(t.ExpectedFingerprint, shown)
		default:
			return nil, err
		}
	}
}

// handshake dials addr and runs one SSH handshake offering the host-key
// algorithms algos. It returns the key the host presented, also on a
// *HostKeyMismatchError (a key that is not expected, when expected is set:
// the handshake ends there, before authentication).
func handshake(ctx context.Context, addr, user string, auth []ssh.AuthMethod, algos []string, expected string, timeout time.Duration) (*ssh.Client, ssh.PublicKey, error) {
	var got ssh.PublicKey
	cfg := &ssh.ClientConfig{
		User:              user,
		Auth:              auth,
		HostKeyAlgorithms: algos,
		HostKeyCallback: func(_ string, _ net.Addr, key ssh.PublicKey) error {
			got = key
			if fp := Fingerprint(key); expected != "" && fp != expected {
				return &HostKeyMismatchError{Expected: expected, Got: fp}
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
		return nil, nil, fmt.Errorf("dial %s: %w", addr, err)
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
			return nil, got, mm
		}
		var ne net.Error
		if !stopped || hsCtx.Err() != nil || errors.As(err, &ne) && ne.Timeout() {
			return nil, nil, fmt.Errorf("ssh handshake with %s: no answer within %s: %w", addr, timeout, context.DeadlineExceeded)
		}
		return nil, nil, fmt.Errorf("ssh handshake with %s: %w", addr, err)
	}
	_ = raw.SetDeadline(time.Time{})
	return ssh.NewClient(c, chans, reqs), got, nil
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
