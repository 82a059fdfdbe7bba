package sshsig

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"
)

// AgentTimeout bounds one session with an ssh-agent: dialling, listing the
// keys and every signature (an agent confirming each use, ssh-add -c, waits
// for its user within it).
const AgentTimeout = 2 * time.Minute

// AgentKey selects a key of an ssh-agent: by its public key, else by its
// SHA256 fingerprint (ssh-keygen -l's "SHA256:…").
type AgentKey struct {
	Public      ssh.PublicKey
	Fingerprint string
}

func (k AgentKey) String() string {
	if k.Public != nil {
		return ssh.FingerprintSHA256(k.Public)
	}
	return k.Fingerprint
}

// Agent is a session with a running ssh-agent; Close it when done.
type Agent struct {
	conn net.Conn
	ag   agent.ExtendedAgent
}

// DialAgent connects to the ssh-agent listening on sock ($SSH_AUTH_SOCK).
// The private key never leaves the agent: it signs what SignWith hands it.
func DialAgent(sock string) (*Agent, error) {
	if sock == "" {
		return nil, errors.New("sshsig: no ssh-agent: SSH_AUTH_SOCK is not set")
	}
	conn, err := net.DialTimeout("unix", sock, 10*time.Second)
	if err != nil {
		return nil, fmt.Errorf("sshsig: ssh-agent at SSH_AUTH_SOCK: %w", err)
	}
	if err := conn.SetDeadline(time.Now().Add(AgentTimeout)); err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("sshsig: ssh-agent: %w", err)
	}
	return &Agent{conn: conn, ag: agent.NewClient(conn)}, nil
}

// Close ends the session.
func (a *Agent) Close() error { return a.conn.Close() }

// Signer is the agent's signer for k. Not holding it is an error naming
// the keys the agent holds (public fingerprints only).
func (a *Agent) Signer(k AgentKey) (ssh.Signer, error) {
	signers, err := a.ag.Signers()
	if err != nil {
		return nil, fmt.Errorf("sshsig: ssh-agent: list keys: %w", err)
	}
	held := make([]string, 0, len(signers))
	for _, s := range signers {
		pk := s.PublicKey()
		if k.Public != nil && string(pk.Marshal()) == string(k.Public.Marshal()) ||
			k.Public == nil && ssh.FingerprintSHA256(pk) == k.Fingerprint {
			return s, nil
		}
		held = append(held, ssh.FingerprintSHA256(pk)+" ("+pk.Type()+")")
	}
	if len(held) == 0 {
		return nil, fmt.Errorf("sshsig: the ssh-agent holds no keys (ssh-add KEY), not %s", k)
	}
	return nil, fmt.Errorf("sshsig: the ssh-agent does not hold key %s; it holds %s", k, strings.Join(held, ", "))
}
