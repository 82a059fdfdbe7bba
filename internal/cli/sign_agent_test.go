package cli

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/dklesev/kpssh/internal/engine"
)

// startAgent runs a real ssh-agent in the foreground on its own socket in
// a temporary directory, in its own process group; the test's cleanup kills
// the group and reaps it.
func startAgent(t *testing.T) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "agent.sock")
	cmd := exec.Command("ssh-agent", "-D", "-a", sock)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("ssh-agent cannot run (install openssh-client): %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Errorf("ssh-agent %d not reaped", cmd.Process.Pid)
		}
	})
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(sock); err == nil {
			return sock
		}
		select {
		case err := <-done:
			t.Fatalf("ssh-agent exited: %v: %s", err, out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("ssh-agent socket %s did not appear: %s", sock, out.String())
		}
	}
}

// runBounded runs a command with a timeout, killed as a process group.
func runBounded(t *testing.T, env []string, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := exec.CommandContext(ctx, name, args...)
	c.Env = append(os.Environ(), env...)
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	c.Cancel = func() error { return syscall.Kill(-c.Process.Pid, syscall.SIGKILL) }
	c.WaitDelay = 5 * time.Second
	out, err := c.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %q: %v: %s", name, args, err, out)
	}
	return string(out)
}

// TestSignAgent signs through a real ssh-agent holding real ssh-keygen
// keys whose private key files are deleted after ssh-add: the key is chosen
// by its public key file or its fingerprint, v1 and v2 signatures verify in
// the engine and in ssh-keygen -Y verify, RSA signs with rsa-sha2-512; a
// key the agent does not hold, no agent, and an encrypted key file are
// usage errors that say what to do.
func TestSignAgent(t *testing.T) {
	dir := t.TempDir()
	sock := startAgent(t)
	agentEnv := []string{"SSH_AUTH_SOCK=" + sock}
	key := func(name string, args ...string) (path string, pub []byte, fp string) {
		path = filepath.Join(dir, name)
		runBounded(t, nil, "ssh-keygen", append([]string{"-q", "-N", "", "-C", name, "-f", path}, args...)...)
		pub, err := os.ReadFile(path + ".pub")
		if err != nil {
			t.Fatal(err)
		}
		fp = strings.Fields(runBounded(t, nil, "ssh-keygen", "-l", "-E", "sha256", "-f", path+".pub"))[1]
		return path, pub, fp
	}
	edPath, edPub, _ := key("ed", "-t", "ed25519")
	rsaPath, rsaPub, rsaFP := key("rsa", "-t", "rsa", "-b", "3072")
	_, _, strangerFP := key("stranger", "-t", "ed25519")
	runBounded(t, agentEnv, "ssh-add", edPath, rsaPath)
	// Only the agent can sign from here on.
	for _, p := range []string{edPath, rsaPath} {
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
	}
	if out := runBounded(t, agentEnv, "ssh-add", "-l"); !strings.Contains(out, rsaFP) {
		t.Fatalf("ssh-add -l: %s", out)
	}
	prof := writeTemp(t, dir, signProfile)
	t.Setenv("SSH_AUTH_SOCK", sock)
	sign := func(args ...string) (int, string, string) {
		var so, se bytes.Buffer
		rc := Sign(context.Background(), args, &so, &se)
		return rc, so.String(), se.String()
	}
	for _, tc := range []struct {
		name     string
		key      string
		pub      []byte
		manifest bool
	}{
		{"ed25519 by public key file, v1", edPath + ".pub", edPub, false},
		{"ed25519 by public key file, v2", edPath + ".pub", edPub, true},
		{"rsa by fingerprint, v1", rsaFP, rsaPub, false},
		{"rsa by fingerprint, v2", rsaFP, rsaPub, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"--key", tc.key, "--phases", "install,join,leave"}
			if tc.manifest {
				args = append(args, "--manifest", "--not-after", "24h")
			}
			rc, out, stderr := sign(append(args, prof)...)
			if rc != ExitOK {
				t.Fatalf("kpssh sign: exit %d: %s", rc, stderr)
			}
			checkSigned(t, dir, out, tc.pub, tc.manifest, engine.PhaseInstall, engine.PhaseJoin, engine.PhaseLeave)
			// and not by the other key
			other := edPub
			if string(tc.pub) == string(edPub) {
				other = rsaPub
			}
			if !strings.Contains(out, "BEGIN SSH SIGNATURE") || strings.Contains(out, string(other)) {
				t.Fatalf("output:\n%s", out)
			}
		})
	}
	t.Run("ssh-keygen accepts the chosen key's signature only", func(t *testing.T) {
		rc, out, stderr := sign("--key", rsaFP, "--phases", "join", prof)
		if rc != ExitOK {
			t.Fatalf("exit %d: %s", rc, stderr)
		}
		var block struct{ Signatures struct{ Join string } }
		if err := yaml.Unmarshal([]byte(out), &block); err != nil || block.Signatures.Join == "" {
			t.Fatalf("output %q: %v", out, err)
		}
		sig := filepath.Join(dir, "join.sig")
		_ = os.WriteFile(sig, []byte(block.Signatures.Join), 0o600)
		verify := func(pub []byte) error {
			allowed := filepath.Join(dir, "allowed-one")
			_ = os.WriteFile(allowed, []byte("kpssh "+string(pub)), 0o600)
			c := exec.Command("ssh-keygen", "-Y", "verify", "-f", allowed, "-I", "kpssh", "-n", "kpssh", "-s", sig)
			c.Stdin = strings.NewReader("#!/bin/bash\necho \"join $KPSSH_NODE_NAME\"\n")
			_, err := c.CombinedOutput()
			return err
		}
		if err := verify(rsaPub); err != nil {
			t.Fatalf("ssh-keygen rejects the rsa key's signature: %v", err)
		}
		if err := verify(edPub); err == nil {
			t.Fatal("ssh-keygen accepts the rsa key's signature for the ed25519 signer")
		}
	})

	for _, tc := range []struct {
		name, key, sock string
		want            []string
	}{
		{"a key the agent does not hold", strangerFP, sock, []string{"does not hold key " + strangerFP, rsaFP}},
		{"a public key file the agent does not hold", filepath.Join(dir, "stranger.pub"), sock, []string{"does not hold key " + strangerFP}},
		{"no agent", edPath + ".pub", "", []string{"SSH_AUTH_SOCK is not set"}},
		{"agent gone", edPath + ".pub", filepath.Join(dir, "nobody.sock"), []string{"ssh-agent at SSH_AUTH_SOCK"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("SSH_AUTH_SOCK", tc.sock)
			rc, out, stderr := sign("--key", tc.key, prof)
			if rc != ExitUsage || out != "" {
				t.Fatalf("exit %d, stdout %q, stderr %s", rc, out, stderr)
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr lacks %q: %s", w, stderr)
				}
			}
		})
	}
	t.Run("an encrypted key file points to the agent", func(t *testing.T) {
		p := filepath.Join(dir, "locked")
		runBounded(t, nil, "ssh-keygen", "-q", "-N", "a-passphrase", "-t", "ed25519", "-f", p)
		rc, _, stderr := sign("--key", p, prof)
		if rc != ExitUsage || !strings.Contains(stderr, "passphrase-protected; load it into ssh-agent (ssh-add) and sign with its public key") {
			t.Fatalf("exit %d: %s", rc, stderr)
		}
	})
}

// TestSignPlainSSHKeygen is docs/verified.md's recipe for v1 without kpssh:
// each script in its own file, signed by plain ssh-keygen -Y sign -n kpssh
// (with the private key file, and with KEY.pub through the ssh-agent), the
// .sig pasted under signatures.<phase>: the engine accepts it.
func TestSignPlainSSHKeygen(t *testing.T) {
	dir := t.TempDir()
	keyPath, pub := signerKey(t, dir)
	var p struct {
		Spec struct{ Scripts map[string]string }
	}
	if err := yaml.Unmarshal([]byte(signProfile), &p); err != nil {
		t.Fatal(err)
	}
	sock := startAgent(t)
	runBounded(t, []string{"SSH_AUTH_SOCK=" + sock}, "ssh-add", keyPath)
	for _, key := range []string{keyPath, keyPath + ".pub"} {
		var block strings.Builder
		block.WriteString("signatures:\n")
		for _, ph := range []string{"install", "join", "leave"} {
			script := filepath.Join(dir, ph+".sh")
			_ = os.Remove(script + ".sig")
			if err := os.WriteFile(script, []byte(p.Spec.Scripts[ph]), 0o600); err != nil {
				t.Fatal(err)
			}
			runBounded(t, []string{"SSH_AUTH_SOCK=" + sock}, "ssh-keygen", "-Y", "sign", "-f", key, "-n", "kpssh", script)
			sig, err := os.ReadFile(script + ".sig")
			if err != nil {
				t.Fatal(err)
			}
			block.WriteString("  " + ph + ": |\n")
			for _, l := range strings.Split(strings.TrimSuffix(string(sig), "\n"), "\n") {
				block.WriteString("    " + l + "\n")
			}
		}
		checkSigned(t, dir, block.String(), pub, false, engine.PhaseInstall, engine.PhaseJoin, engine.PhaseLeave)
	}
}
