// Package sshtest is an in-process SSH server for unit tests: real protocol,
// fake commands. Tests that need real sshd use test/hostenv.
package sshtest

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
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
	HostKey   ssh.PublicKey   // the first of HostKeys
	HostKeys  []ssh.PublicKey // every host key the server offers
	ClientKey []byte          // PEM private key the server accepts
	handler   Handler
	ln        net.Listener
	mu        sync.Mutex
	Commands  []string
	conns     map[net.Conn]struct{}
	accepted  int
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

// NewHostKey returns a new key of keyType: ssh.KeyAlgoED25519,
// ssh.KeyAlgoECDSA256/384/521 or ssh.KeyAlgoRSA (2048 bits).
func NewHostKey(t testing.TB, keyType string) ssh.Signer {
	t.Helper()
	var priv crypto.Signer
	var err error
	switch keyType {
	case ssh.KeyAlgoED25519:
		s, _ := NewKey(t)
		return s
	case ssh.KeyAlgoECDSA256:
		priv, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	case ssh.KeyAlgoECDSA384:
		priv, err = ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	case ssh.KeyAlgoECDSA521:
		priv, err = ecdsa.GenerateKey(elliptic.P521(), rand.Reader)
	case ssh.KeyAlgoRSA:
		priv, err = rsa.GenerateKey(rand.Reader, 2048)
	default:
		t.Fatalf("sshtest: no key type %q", keyType)
	}
	if err != nil {
		t.Fatal(err)
	}
	s, err := ssh.NewSignerFromSigner(priv)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Start runs a server on loopback until the test ends, with one ed25519
// host key.
func Start(t testing.TB, h Handler) *Server {
	t.Helper()
	hostSigner, _ := NewKey(t)
	return StartWithHostKeys(t, h, hostSigner)
}

// StartWithHostKeys is Start with these host keys (a stock host: rsa, ecdsa
// and ed25519). A client is shown the one of the first host-key algorithm
// it lists that the server has.
func StartWithHostKeys(t testing.TB, h Handler, hostKeys ...ssh.Signer) *Server {
	t.Helper()
	clientSigner, clientPEM := NewKey(t)
	cfg := &ssh.ServerConfig{
		PublicKeyCallback: func(_ ssh.ConnMetadata, k ssh.PublicKey) (*ssh.Permissions, error) {
			if string(k.Marshal()) == string(clientSigner.PublicKey().Marshal()) {
				return nil, nil
			}
			return nil, errUnauthorized
		},
	}
	var pubs []ssh.PublicKey
	for _, k := range hostKeys {
		cfg.AddHostKey(k)
		pubs = append(pubs, k.PublicKey())
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Addr: ln.Addr().String(), Host: "127.0.0.1", Port: int32(ln.Addr().(*net.TCPAddr).Port),
		HostKey: pubs[0], HostKeys: pubs, ClientKey: clientPEM, handler: h, ln: ln, conns: map[net.Conn]struct{}{}}
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
			s.accepted++
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

// Connections counts the TCP connections accepted so far (one per client
// handshake).
func (s *Server) Connections() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.accepted
}

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
