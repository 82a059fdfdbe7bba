package probe_test

import (
	"context"
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dklesev/kpssh/internal/probe"
	"github.com/dklesev/kpssh/internal/sshx"
	"github.com/dklesev/kpssh/test/hostenv"
)

// The attack of issue 15 item 5 against a real sshd on an nspawn host with the
// real kpssh-shim installed: a Verified host's spec.shimCommand that smuggles
// shell syntax into the probe's remote command line. A root login without
// ForceCommand (docs/verified.md allows it) runs that line through the login
// shell, so before the fix every one of these ran `touch /tmp/pwned`.
func TestShimCommandInjectionAgainstRealHost(t *testing.T) {
	w := hostenv.Up(t, 1)
	root, err := hostenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	shim, err := os.ReadFile(filepath.Join(root, "playbooks/collections/ansible_collections/dklesev/kpssh/files/kpssh-shim"))
	if err != nil {
		t.Fatal(err)
	}
	w.MustRun(0, "echo "+base64.StdEncoding.EncodeToString(shim)+" | base64 -d > /usr/local/bin/kpssh-shim && chmod 0755 /usr/local/bin/kpssh-shim")
	key, err := os.ReadFile(w.Inventory().ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	h := w.Host(0)
	target := sshx.Target{Address: h.Address, Port: int32(h.Port), User: h.User, PrivateKey: key, ExpectedFingerprint: h.Fingerprint}
	const pwned = "/tmp/pwned"
	ran := func() bool {
		return w.MustRun(0, "if test -e "+pwned+"; then rm -f "+pwned+"; echo ran; else echo none; fi") == "ran"
	}

	// The legitimate path works (a refusal below is the validation, not a
	// broken host) and the marker check sees a command that ran.
	res, err := probe.Run(context.Background(), target, true, "/usr/local/bin/kpssh-shim", 0)
	if err != nil || res.Facts.CPU <= 0 || res.Fingerprint != h.Fingerprint {
		t.Fatalf("probe through the real shim: %+v %v", res, err)
	}
	w.MustRun(0, "touch "+pwned)
	if !ran() {
		t.Fatal("the marker check cannot see a command run")
	}

	for _, shimCommand := range []string{
		"/usr/local/bin/kpssh-shim; touch " + pwned,
		"/usr/local/bin/kpssh-shim probe && touch " + pwned + " &&",
		"$(touch " + pwned + ")/usr/local/bin/kpssh-shim",
		"`touch " + pwned + "`/usr/local/bin/kpssh-shim",
		"/usr/local/bin/kpssh-shim\ntouch " + pwned,
		"/usr/local/bin/kpssh-shim | touch " + pwned + " |",
	} {
		_, err := probe.Run(context.Background(), target, true, shimCommand, 0)
		if ran() {
			t.Errorf("shimCommand %q ran a command on the host (probe error: %v)", shimCommand, err)
		}
		if err == nil || !strings.Contains(err.Error(), "spec.shimCommand") {
			t.Errorf("shimCommand %q: probe error %v, want a refusal naming spec.shimCommand", shimCommand, err)
		}
	}
}

// Issue 17 item 2 against a real sshd: the probe learns the host's own IP
// from the session's SSH_CONNECTION (its server half), so a host addressed
// by DNS name gets an IP node address. The host's interfaces confirm it.
func TestProbeLearnsTheHostsIPFromRealSSHD(t *testing.T) {
	w := hostenv.Up(t, 1)
	key, err := os.ReadFile(w.Inventory().ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	h := w.Host(0)
	target := sshx.Target{Address: h.Address, Port: int32(h.Port), User: h.User, PrivateKey: key, ExpectedFingerprint: h.Fingerprint}
	res, err := probe.Run(context.Background(), target, false, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	if res.Facts.NodeIP == "" || res.Facts.NodeIP != h.Address {
		t.Fatalf("probe learnt node IP %q, want the host's %s", res.Facts.NodeIP, h.Address)
	}
	if own := w.MustRun(0, "ip -o addr show"); !strings.Contains(own, " "+res.Facts.NodeIP+"/") {
		t.Fatalf("%s is not an address of the host:\n%s", res.Facts.NodeIP, own)
	}
}
