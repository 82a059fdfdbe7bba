package engine

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/probe"
	"github.com/dklesev/kpssh/internal/providers/hostkey"
	"github.com/dklesev/kpssh/internal/sshx"
	"github.com/dklesev/kpssh/internal/sshx/sshtest"
)

// A host with the host keys of a fresh Debian install (rsa, ecdsa, ed25519;
// issue 17 defect 1) against its real sshd: whichever of its keys the key
// Secret's knownHost pins, the probe (Go's client) and a phase
// (FetchHostKey, then ansible-playbook's OpenSSH with a known_hosts holding
// only the pinned key) both reach it; a key that is not the host's is
// refused before anything runs; trust on first use pins one key, the one
// ssh(1) negotiates, and keeps seeing it.
func TestStockHostKeys(t *testing.T) {
	if testing.Short() {
		t.Skip("real hosts: not in -short")
	}
	w := upWorld(t, 1)
	e := testEngine(t, nil)
	h := w.Host(0)
	// Every world host is stock (hack/hosts.sh): its keys by type.
	keys := map[string]string{}
	for _, k := range h.HostKeys {
		keys[strings.Fields(k)[0]] = k
	}
	if len(keys) != 3 || keys[ssh.KeyAlgoED25519] != h.HostKey {
		t.Fatalf("host %s serves %q, want rsa, ecdsa and ed25519 keys (the ed25519 one %q)", h.Name, h.HostKeys, h.HostKey)
	}
	ctx := context.Background()
	host := &v1beta1.SSHHost{
		ObjectMeta: metav1.ObjectMeta{Name: h.Name, Namespace: "kpssh-system"},
		Spec: v1beta1.SSHHostSpec{Address: h.Address, Port: int32(h.Port), User: h.User,
			SSHKeySecretRef: v1beta1.LocalObjectReference{Name: "key"}},
	}
	// creds resolves the host's credentials as the controllers do: from the
	// key Secret (knownHost, if any) and the status pin.
	creds := func(t *testing.T, knownHost, statusPin string) hostkey.Credentials {
		t.Helper()
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "key", Namespace: host.Namespace},
			Data: map[string][]byte{hostkey.KeyPrivateKey: w.key}}
		if knownHost != "" {
			s.Data[hostkey.KeyKnownHost] = []byte(knownHost)
		}
		hh := host.DeepCopy()
		hh.Status.HostKeyFingerprint = statusPin
		c, err := hostkey.New(fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(s).Build()).Get(ctx, hh)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	const marker = "/tmp/kpssh-stockkeys-ran"
	// phase does what providers/phase.Runner does: the key line for the
	// pinned fingerprint, then the run with it.
	phase := func(t *testing.T, c hostkey.Credentials) (string, Result, error) {
		t.Helper()
		mustRun(t, w, 0, "rm -f "+marker)
		conn := Connection{Address: h.Address, Port: int32(h.Port), User: h.User, PrivateKey: c.PrivateKey}
		line, err := FetchHostKey(ctx, conn, c.PinnedFingerprint)
		if err != nil {
			return "", Result{}, err
		}
		conn.HostKey = line
		r := e.Run(ctx, Request{Phase: PhaseJoin, Conn: conn, Source: Source{Script: "touch " + marker}, Context: joinContext(h), Timeout: time.Minute})
		return line, r, nil
	}
	ran := func(t *testing.T) bool {
		return mustRun(t, w, 0, "test -e "+marker+" && echo ran || echo none") == "ran"
	}
	fp := func(line string) string {
		k, _, _, _, err := ssh.ParseAuthorizedKey([]byte(line))
		if err != nil {
			t.Fatal(err)
		}
		return sshx.Fingerprint(k)
	}

	for _, tc := range []struct{ name, knownHost, key string }{
		{"ed25519 key line", keys[ssh.KeyAlgoED25519], ssh.KeyAlgoED25519},
		{"ecdsa key line", keys[ssh.KeyAlgoECDSA256], ssh.KeyAlgoECDSA256},
		{"rsa key line with comment", keys[ssh.KeyAlgoRSA] + " root@" + h.Name, ssh.KeyAlgoRSA},
		{"ed25519 known_hosts line", h.Address + " " + keys[ssh.KeyAlgoED25519], ssh.KeyAlgoED25519},
		{"ecdsa fingerprint", fp(keys[ssh.KeyAlgoECDSA256]), ssh.KeyAlgoECDSA256},
		{"rsa fingerprint", fp(keys[ssh.KeyAlgoRSA]), ssh.KeyAlgoRSA},
	} {
		t.Run("knownHost "+tc.name, func(t *testing.T) {
			c := creds(t, tc.knownHost, "")
			want := keys[tc.key]
			if !c.FromSecret || c.PinnedFingerprint != fp(want) {
				t.Fatalf("credentials pin %q (from Secret %v), want %s", c.PinnedFingerprint, c.FromSecret, fp(want))
			}
			res, err := probe.Run(ctx, c.Target(host), false, "", 0)
			if err != nil || res.Facts.CPU <= 0 {
				t.Fatalf("probe with the %s pinned: %+v %v", tc.key, res, err)
			}
			if res.Fingerprint != fp(want) || res.HostKey != want {
				t.Fatalf("probe verified %s %s, want the pinned %s", res.Fingerprint, res.HostKey, want)
			}
			line, r, err := phase(t, c)
			if err != nil {
				t.Fatalf("FetchHostKey: %v", err)
			}
			if line != want {
				t.Fatalf("FetchHostKey = %q, want the pinned %q", line, want)
			}
			mustOutcome(t, r, Succeeded)
			if !ran(t) {
				t.Fatal("the phase succeeded but its script did not run")
			}
		})
	}

	t.Run("knownHost not the host's key is refused", func(t *testing.T) {
		other, _ := sshtest.NewKey(t)
		c := creds(t, sshx.PublicKeyLine(other.PublicKey()), "")
		_, err := probe.Run(ctx, c.Target(host), false, "", 0)
		var mm *sshx.HostKeyMismatchError
		if !errors.As(err, &mm) {
			t.Fatalf("probe: want a host key mismatch, got %v", err)
		}
		// The message names the pin and every key the host offered.
		for _, s := range []string{"host key mismatch", c.PinnedFingerprint, fp(keys[ssh.KeyAlgoED25519]), fp(keys[ssh.KeyAlgoECDSA256]), fp(keys[ssh.KeyAlgoRSA])} {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("probe error %q does not name %s", err, s)
			}
		}
		if _, _, err := phase(t, c); !errors.As(err, &mm) {
			t.Fatalf("FetchHostKey: want a host key mismatch, got %v", err)
		}
		if ran(t) {
			t.Fatal("a command ran on a host whose keys did not match the pin")
		}
	})

	t.Run("trust on first use pins the key ssh negotiates, every probe", func(t *testing.T) {
		first, err := probe.Run(ctx, creds(t, "", "").Target(host), false, "", 0)
		if err != nil {
			t.Fatal(err)
		}
		if want := opensshHostKey(t, w); first.Fingerprint != want {
			t.Fatalf("TOFU pinned %s; OpenSSH negotiates %s", first.Fingerprint, want)
		}
		c := creds(t, "", first.Fingerprint) // the host controller's status pin
		for i := 0; i < 3; i++ {
			res, err := probe.Run(ctx, c.Target(host), false, "", 0)
			if err != nil || res.Fingerprint != first.Fingerprint {
				t.Fatalf("probe %d: %s %v, want %s", i, res.Fingerprint, err, first.Fingerprint)
			}
		}
		line, r, err := phase(t, c)
		if err != nil || fp(line) != first.Fingerprint {
			t.Fatalf("FetchHostKey = %q %v, want the key of %s", line, err, first.Fingerprint)
		}
		mustOutcome(t, r, Succeeded)
		if !ran(t) {
			t.Fatal("the phase succeeded but its script did not run")
		}
	})
}

// opensshHostKey is the fingerprint of the host key ssh(1) negotiates with
// host 0 when it knows none of its keys (its default HostKeyAlgorithms).
func opensshHostKey(t *testing.T, w *world) string {
	t.Helper()
	dir := t.TempDir()
	key := filepath.Join(dir, "key")
	if err := os.WriteFile(key, w.key, 0o600); err != nil {
		t.Fatal(err)
	}
	h := w.Host(0)
	out, err := exec.Command("ssh", "-F", "/dev/null", "-v", "-i", key, "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
		"-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "GlobalKnownHostsFile=/dev/null",
		"-o", "ConnectTimeout=10", "-p", "22", h.User+"@"+h.Address, "true").CombinedOutput()
	if err != nil {
		t.Fatalf("ssh: %v: %s", err, out)
	}
	m := regexp.MustCompile(`Server host key: \S+ (SHA256:\S+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("ssh -v printed no server host key:\n%s", out)
	}
	return string(m[1])
}

// The run's known_hosts holds the pinned key only, and ssh negotiates its
// type (HostKeyAlgorithms): a stock host's other keys are never what ssh
// checks.
func TestRunNegotiatesThePinnedKeyType(t *testing.T) {
	for _, kt := range sshx.HostKeyTypes { // their algorithms: sshx.TestHostKeyAlgorithms
		algos := strings.Join(sshx.HostKeyAlgorithms(kt), ",")
		t.Run(kt, func(t *testing.T) {
			c := testConn(t)
			c.Port = 2222
			line := sshx.PublicKeyLine(sshtest.NewHostKey(t, kt).PublicKey())
			c.HostKey = line + " root@h1"
			b, err := build(Request{Phase: PhaseJoin, Conn: c, Source: Source{Script: "true"}}, renderConfig{dir: "/dev/shm/kpssh-x", python: DefaultPythonInterpreter})
			if err != nil {
				t.Fatal(err)
			}
			if got, want := string(b.file(fileKnown)), "192.0.2.10 "+line+"\n[192.0.2.10]:2222 "+line+"\n"; got != want {
				t.Errorf("known_hosts:\n%s\nwant:\n%s", got, want)
			}
			if inv, want := string(b.file(fileInventory)), `      ansible_ssh_extra_args: "-o HostKeyAlgorithms=`+algos+`"`+"\n"; !strings.HasSuffix(inv, want) {
				t.Errorf("inventory does not end with %q:\n%s", want, inv)
			}
		})
	}
}
