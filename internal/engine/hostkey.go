package engine

import (
	"context"
	"errors"

	"github.com/dklesev/kpssh/internal/sshx"
)

// FetchHostKey returns the host's public-key line ("ssh-ed25519 AAAA…") for
// Connection.HostKey. Status stores only the SHA256 fingerprint, but
// known_hosts needs the key itself: this dials with the fingerprint pinned
// (sshx.Dial accepts whichever of the host's keys has it, of any type, and
// aborts with a *sshx.HostKeyMismatchError, before any session, when none
// has) and returns the key the handshake verified: the one key the run's
// known_hosts holds and whose type its ssh negotiates. conn.HostKey is ignored; fingerprint is required (no
// trust on first use here — the probe pins).
func FetchHostKey(ctx context.Context, conn Connection, fingerprint string) (string, error) {
	if fingerprint == "" {
		return "", errors.New("no pinned host key fingerprint")
	}
	c, err := sshx.Dial(ctx, sshx.Target{
		Address: conn.Address, Port: conn.Port, User: conn.User,
		PrivateKey: conn.PrivateKey, ExpectedFingerprint: fingerprint,
	})
	if err != nil {
		return "", err
	}
	defer c.Close()
	if c.Fingerprint != fingerprint { // belt and braces: Dial checked it already
		return "", &sshx.HostKeyMismatchError{Expected: fingerprint, Got: c.Fingerprint}
	}
	return c.HostKey, nil
}
