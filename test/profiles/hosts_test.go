package profiles_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/dklesev/kpssh/internal/engine"
	"github.com/dklesev/kpssh/test/hostenv"
)

const (
	token          = "abcdef.0123456789abcdef"
	tokenSecret    = "0123456789abcdef"
	activationID   = "a1b2c3d4-5e6f-4a7b-8c9d-0123456789ab"
	activationCode = "kpsshActivation+Code/0123456789XYZ="
	kubeletVersion = "1.36.1"
	k8sMinor       = "1.36"
	mirror         = "/srv/kpssh-mirror"
	debs           = "/srv/kpssh-debs"
	phaseTimeout   = 3 * time.Minute
	// a var value that would break naive quoting or templating
	trickyVar = `it's "quoted" $(id) {{ .Secrets }} \n`
)

// host is one test host driven through the engine.
type host struct {
	t   *testing.T
	w   *hostenv.World
	i   int
	e   *engine.Local
	key []byte
}

func (h *host) conn() engine.Connection {
	hh := h.w.Host(h.i)
	return engine.Connection{Address: hh.Address, Port: int32(hh.Port), User: hh.User, PrivateKey: h.key, HostKey: hh.HostKey}
}

// run runs one phase of script on the host through the engine, unchanged.
func (h *host) run(phase engine.Phase, script string, c engine.Context) engine.Result {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), phaseTimeout+time.Minute)
	defer cancel()
	r := h.e.Run(ctx, engine.Request{Phase: phase, Conn: h.conn(), Source: engine.Source{Script: script}, Context: c, Timeout: phaseTimeout})
	h.t.Logf("%s: %s in %v", phase, r.Outcome, r.Duration.Round(time.Millisecond))
	// Whatever the outcome, nothing returned may carry a secret, and a
	// profile that printed one would show as the engine's *** mask.
	for _, s := range append([]string{token, tokenSecret}, values(c.Secrets)...) {
		if strings.Contains(r.Message, s) || strings.Contains(r.FailedTask, s) {
			h.t.Errorf("%s: a secret is in the result: %+v", phase, r)
		}
	}
	if strings.Contains(r.Message, "***") {
		h.t.Errorf("%s: the profile printed a secret (redacted by the engine): %q", phase, r.Message)
	}
	return r
}

func (h *host) mustRun(phase engine.Phase, script string, c engine.Context) {
	h.t.Helper()
	if r := h.run(phase, script, c); r.Outcome != engine.Succeeded {
		h.t.Fatalf("%s: %s (task %q, rc %d): %s", phase, r.Outcome, r.FailedTask, r.RC, r.Message)
	}
}

// mustFail runs a phase that must fail on the host with msg in its message.
func (h *host) mustFail(phase engine.Phase, script string, c engine.Context, msg string) engine.Result {
	h.t.Helper()
	r := h.run(phase, script, c)
	if r.Outcome != engine.Failed || !r.Touched || r.RC == 0 {
		h.t.Fatalf("%s: want Failed on the host, got %+v", phase, r)
	}
	if !strings.Contains(r.Message, msg) {
		h.t.Fatalf("%s: message lacks %q: %q", phase, msg, r.Message)
	}
	return r
}

// sh runs a command on the host over plain ssh (test setup and inspection).
func (h *host) sh(cmd string) string {
	h.t.Helper()
	return h.w.MustRun(h.i, cmd)
}

// put writes data to path on the host.
func (h *host) put(path, mode string, data []byte) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := fmt.Sprintf("mkdir -p %s && cat > %s && chmod %s %s", filepath.Dir(path), path, mode, path)
	c := exec.CommandContext(ctx, "ssh", append(h.w.SSHArgs(h.i), "--", cmd)...)
	c.Stdin = bytes.NewReader(data)
	c.WaitDelay = 5 * time.Second
	if out, err := c.CombinedOutput(); err != nil {
		h.t.Fatalf("put %s: %v: %s", path, err, out)
	}
}

// units reports "<active> <enabled>" of each unit.
func (h *host) units(names ...string) string {
	h.t.Helper()
	var out []string
	for _, u := range names {
		out = append(out, h.sh(fmt.Sprintf("e=$(systemctl is-enabled %[1]s 2>/dev/null); echo $(systemctl is-active %[1]s) ${e:-none}", u)))
	}
	return strings.Join(out, ", ")
}

func (h *host) wantUnits(when, want string, names ...string) {
	h.t.Helper()
	if got := h.units(names...); got != want {
		h.t.Fatalf("%s: %v are %q, want %q", when, names, got, want)
	}
}

func (h *host) exists(path string) bool {
	h.t.Helper()
	return h.sh("test -e "+path+" && echo yes || echo no") == "yes"
}

// starts counts the stub's recorded starts of a program (kept across reboots).
func (h *host) starts(name string) int {
	h.t.Helper()
	out := h.sh("cat /var/lib/kpssh-stub/" + name + ".starts 2>/dev/null | wc -l")
	var n int
	fmt.Sscan(out, &n)
	return n
}

// argv returns the arguments the running kubelet was started with.
func (h *host) argv(name string) []string {
	h.t.Helper()
	return strings.Split(h.sh("cat /run/kpssh-stub/"+name+".argv"), "\n")
}

// snapshot lists every file and directory under paths with type, mode,
// owner, size, inode, mtime and ctime, plus the units' states: a phase that
// rewrites, re-chmods or replaces anything changes it.
func (h *host) snapshot(paths ...string) string {
	h.t.Helper()
	return h.sh(fmt.Sprintf(`find %s -xdev -printf '%%p %%y %%m %%U %%s %%i %%T@ %%C@\n' 2>/dev/null | sort
for u in kubelet.service containerd.service; do echo "$u $(systemctl is-active $u) $(systemctl is-enabled $u 2>/dev/null)"; done`, strings.Join(paths, " ")))
}

// envProbe dumps the KPSSH_* environment a phase gets.
const envProbe = `env -0 | grep -z '^KPSSH_' >/root/kpssh-env.bin
`

// probeEnv runs envProbe as phase with c, through the same engine request
// path as the profile's scripts, and returns what the script saw.
func (h *host) probeEnv(phase engine.Phase, c engine.Context) map[string]string {
	h.t.Helper()
	h.mustRun(phase, envProbe, c)
	raw, err := base64.StdEncoding.DecodeString(h.sh("base64 -w0 /root/kpssh-env.bin && rm -f /root/kpssh-env.bin"))
	if err != nil {
		h.t.Fatal(err)
	}
	got := map[string]string{}
	for _, kv := range strings.Split(strings.TrimSuffix(string(raw), "\x00"), "\x00") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			h.t.Fatalf("%s: malformed env entry %q", phase, kv)
		}
		if _, dup := got[k]; dup {
			h.t.Fatalf("%s: %s exported twice", phase, k)
		}
		got[k] = v
	}
	return got
}

// wantEnv is the seed's environment contract, written out independently of
// the engine: every fixed name in every phase; the token in join only; leave
// sees the two addresses and nothing else (no KPSSH_VAR_*/KPSSH_SECRET_* at
// all); the others get every var and every secret (upper-cased key).
func wantEnv(phase engine.Phase, c engine.Context) map[string]string {
	m := map[string]string{
		"KPSSH_CLUSTER_ENDPOINT": c.ClusterEndpoint,
		"KPSSH_CLUSTER_CA_B64":   c.ClusterCAB64,
		"KPSSH_BOOTSTRAP_TOKEN":  "",
		"KPSSH_NODE_NAME":        c.NodeName,
		"KPSSH_PROVIDER_ID":      c.ProviderID,
		"KPSSH_HOST_ADDRESS":     c.HostAddress,
		"KPSSH_NODE_ADDRESS":     c.NodeAddress,
		"KPSSH_NODE_LABELS":      c.NodeLabels,
		"KPSSH_TAINTS":           c.Taints,
	}
	if phase == engine.PhaseLeave {
		for k := range m {
			if k != "KPSSH_HOST_ADDRESS" && k != "KPSSH_NODE_ADDRESS" {
				m[k] = ""
			}
		}
		return m
	}
	if phase == engine.PhaseJoin {
		m["KPSSH_BOOTSTRAP_TOKEN"] = c.BootstrapToken
	}
	for k, v := range c.Vars {
		m["KPSSH_VAR_"+k] = v
	}
	for k, v := range c.Secrets {
		m["KPSSH_SECRET_"+strings.ToUpper(k)] = v
	}
	return m
}

// checkEnvContract probes every phase with c and compares exactly.
func (h *host) checkEnvContract(c engine.Context) {
	h.t.Helper()
	for _, phase := range []engine.Phase{engine.PhaseInstall, engine.PhaseJoin, engine.PhaseLeave, engine.PhaseUninstall} {
		got, want := h.probeEnv(phase, c), wantEnv(phase, c)
		var diffs []string
		for _, k := range sortedKeys(want, got) {
			g, gok := got[k]
			w, wok := want[k]
			if gok != wok || g != w {
				if strings.HasPrefix(k, "KPSSH_SECRET_") || k == "KPSSH_BOOTSTRAP_TOKEN" {
					g, w = fmt.Sprintf("<%d bytes>", len(g)), fmt.Sprintf("<%d bytes>", len(w))
				}
				diffs = append(diffs, fmt.Sprintf("%s: got %q (present %v), want %q (present %v)", k, g, gok, w, wok))
			}
		}
		if len(diffs) > 0 {
			h.t.Errorf("%s environment differs from the contract:\n  %s", phase, strings.Join(diffs, "\n  "))
		}
		// The contract's sharp edges, spelled out.
		switch phase {
		case engine.PhaseJoin:
			if got["KPSSH_BOOTSTRAP_TOKEN"] != token {
				h.t.Errorf("join: KPSSH_BOOTSTRAP_TOKEN is not the token")
			}
		case engine.PhaseInstall, engine.PhaseUninstall:
			if v, ok := got["KPSSH_BOOTSTRAP_TOKEN"]; !ok || v != "" {
				h.t.Errorf("%s: KPSSH_BOOTSTRAP_TOKEN must be exported empty (present %v, %d bytes)", phase, ok, len(v))
			}
		case engine.PhaseLeave:
			for k := range got {
				if strings.HasPrefix(k, "KPSSH_VAR_") || strings.HasPrefix(k, "KPSSH_SECRET_") {
					h.t.Errorf("leave: %s is exported", k)
				}
			}
			if got["KPSSH_HOST_ADDRESS"] == "" || got["KPSSH_NODE_ADDRESS"] == "" {
				h.t.Errorf("leave: addresses missing: %v", got)
			}
		}
	}
}

func sortedKeys(ms ...map[string]string) []string {
	seen := map[string]bool{}
	var keys []string
	for _, m := range ms {
		for k := range m {
			if !seen[k] {
				seen[k] = true
				keys = append(keys, k)
			}
		}
	}
	sort.Strings(keys)
	return keys
}

func values(m map[string]string) []string {
	var out []string
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// testCA returns a freshly made self-signed CA certificate (PEM).
func testCA(t *testing.T) []byte {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kpssh-test-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func testdata(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// setupMirror pre-places the stand-in binaries: the binary source the
// profiles' binarySource var points at (<mirror>/<arch>/...), as an
// operator's local mirror would be laid out.
func (h *host) setupMirror() {
	h.t.Helper()
	stub := bytes.ReplaceAll(testdata(h.t, "stub-daemon"), []byte("@KUBELET_VERSION@"), []byte(kubeletVersion))
	h.put("/srv/kpssh-test/stub-daemon", "0755", stub)
	h.put("/srv/kpssh-test/nodeadm", "0755", testdata(h.t, "nodeadm"))
	h.sh(`set -e
case $(uname -m) in x86_64) a=amd64 ;; aarch64) a=arm64 ;; *) a=$(uname -m) ;; esac
m=` + mirror + `/$a
mkdir -p $m /srv/kpssh-test/cni
for b in kubelet containerd containerd-shim-runc-v2 ctr runc; do install -m 0755 /srv/kpssh-test/stub-daemon $m/$b; done
for b in bridge host-local loopback portmap; do install -m 0755 /srv/kpssh-test/stub-daemon /srv/kpssh-test/cni/$b; done
tar -czf $m/cni-plugins.tgz -C /srv/kpssh-test/cni .
sed "s|@MIRROR@|$m|" /srv/kpssh-test/nodeadm > $m/nodeadm && chmod 0755 $m/nodeadm`)
}

// context is a full join context for host i.
func (h *host) context(vars, secrets map[string]string) engine.Context {
	hh := h.w.Host(h.i)
	return engine.Context{
		ClusterEndpoint: "https://10.231.255.1:6443",
		BootstrapToken:  token,
		NodeName:        "kpssh-node-" + hh.Name,
		ProviderID:      "kpssh://kpssh-system/" + hh.Name,
		HostAddress:     hh.Address,
		// A distinct advertised address (SSHHost.spec.nodeAddress), so the
		// two cannot be confused; documentation range, never contacted.
		NodeAddress: fmt.Sprintf("192.0.2.%d", 10+hh.Index),
		NodeLabels:  "kpssh.example/pool=test,topology.kubernetes.io/zone=pool",
		Taints:      "karpenter.sh/unregistered:NoExecute,kpssh.example/dedicated=ssh:NoSchedule",
		Vars:        vars,
		Secrets:     secrets,
	}
}

// spawnWorkload starts what a joined node has running that leave must clean
// up: a pod process in kubepods.slice, a containerd shim (outside any unit,
// as shims outlive containerd), CNI devices (cilium_wg0 is a bridge here:
// the test kernel has no dummy/wireguard modules) and IPAM state.
func (h *host) spawnWorkload() {
	h.t.Helper()
	h.sh(`set -e
systemd-run --quiet --unit=kpssh-fake-pod --slice=kubepods.slice /bin/sleep infinity
install -D -m 0755 /srv/kpssh-test/stub-daemon /srv/kpssh-test/shim/containerd-shim-runc-v2
setsid -f /srv/kpssh-test/shim/containerd-shim-runc-v2 -namespace k8s.io -id kpssh-test </dev/null >/dev/null 2>&1
ip link add cni0 type bridge
ip link add cilium_wg0 type bridge
ip link add cilium_host type veth peer name cilium_net
mkdir -p /var/lib/cni/networks/kpssh-test && touch /var/lib/cni/networks/kpssh-test/10.85.0.5`)
	// setsid -f returns before its child has exec'd: wait for the name.
	for end := time.Now().Add(20 * time.Second); !h.shims(); time.Sleep(200 * time.Millisecond) {
		if time.Now().After(end) {
			h.t.Fatal("fake containerd shim did not start")
		}
	}
}

// shims reports whether a process named containerd-shim* runs on the host.
func (h *host) shims() bool {
	h.t.Helper()
	return h.sh(`for p in /proc/[0-9]*; do c=$(cat $p/comm 2>/dev/null) || continue; case $c in containerd-shim*) echo yes; exit;; esac; done; echo no`) == "yes"
}

func (h *host) links() string {
	h.t.Helper()
	return h.sh(`ip -o link show | awk -F': ' '{print $2}' | cut -d@ -f1 | sort | tr '\n' ' '`)
}

// TestProfilesOnHosts runs the shipped scripts, as they are in the
// manifests, through the engine against real systemd hosts: one world, one
// host per profile, in parallel.
func TestProfilesOnHosts(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: needs systemd-nspawn test hosts and ansible-playbook")
	}
	w := hostenv.Up(t, 3)
	key, err := os.ReadFile(w.Inventory().ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	coll, err := engine.FindCollectionsPath()
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(engine.Options{CollectionsPath: coll})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() }) // stops the engine's idle pre-warmed runner
	ca := testCA(t)
	newHost := func(t *testing.T, i int) *host { return &host{t: t, w: w.WithT(t), i: i, e: e, key: key} }
	t.Run("profiles", func(t *testing.T) {
		t.Run("tls-bootstrap", func(t *testing.T) { t.Parallel(); testTLSBootstrap(t, newHost(t, 0), ca) })
		t.Run("nodeadm-ssm", func(t *testing.T) { t.Parallel(); testNodeadmSSM(t, newHost(t, 1)) })
		t.Run("sbc", func(t *testing.T) { t.Parallel(); testSBC(t, newHost(t, 2), ca) })
	})
}

// installPaths is what the tls-bootstrap and sbc installs may write.
var installPaths = []string{"/usr/local", "/opt/cni", "/etc/containerd", "/etc/systemd/system", "/etc/kubernetes", "/var/lib/kubelet", "/var/lib/kpssh", "/usr/lib/cni", "/etc/default/kubelet"}

func testTLSBootstrap(t *testing.T, h *host, ca []byte) {
	p := loadProfile(t, "profile-tls-bootstrap.yaml")
	s := p.Spec.Scripts
	h.setupMirror()
	vars := map[string]string{"k8sMinor": k8sMinor, "clusterDNS": "10.32.0.10", "serverTLSBootstrap": "true", "binarySource": mirror, "note": trickyVar}
	c := h.context(vars, nil)
	c.ClusterCAB64 = base64.StdEncoding.EncodeToString(ca)

	h.checkEnvContract(c)

	// k8sMinor is required, clearly (join runs the same check).
	noMinor := h.context(map[string]string{"binarySource": mirror}, nil)
	h.mustFail(engine.PhaseInstall, string(s.Install), noMinor, "var k8sMinor is required")
	if h.exists("/usr/local/bin/kubelet") {
		t.Fatal("a failed install placed kubelet")
	}

	// install: binaries, units, config; nothing enabled or started.
	h.mustRun(engine.PhaseInstall, string(s.Install), c)
	for _, f := range []string{"/usr/local/bin/kubelet", "/usr/local/bin/containerd", "/usr/local/bin/containerd-shim-runc-v2", "/usr/local/bin/ctr", "/usr/local/sbin/runc", "/opt/cni/bin/bridge", "/opt/cni/bin/loopback", "/etc/containerd/config.toml", "/etc/systemd/system/kubelet.service", "/etc/systemd/system/containerd.service"} {
		if !h.exists(f) {
			t.Errorf("install did not write %s", f)
		}
	}
	if cfg := h.sh("cat /etc/containerd/config.toml"); !strings.Contains(cfg, `bin_dir = "/opt/cni/bin"`) || !strings.Contains(cfg, "SystemdCgroup = true") {
		t.Errorf("containerd config:\n%s", cfg)
	}
	h.wantUnits("after install", "inactive disabled, inactive disabled", "kubelet.service", "containerd.service")
	// A second install changes nothing observable.
	before := h.snapshot(installPaths...)
	h.mustRun(engine.PhaseInstall, string(s.Install), c)
	if after := h.snapshot(installPaths...); after != before {
		t.Fatalf("second install changed the host:\n%s", lineDiff(before, after))
	}

	// join
	h.mustRun(engine.PhaseJoin, string(s.Join), c)
	h.wantUnits("after join", "active enabled, active enabled", "kubelet.service", "containerd.service")
	if h.sh("stat -c %a /etc/kubernetes/bootstrap-kubelet.conf") != "600" {
		t.Error("bootstrap kubeconfig is not 0600")
	}
	kc, err := clientcmd.Load([]byte(h.sh("cat /etc/kubernetes/bootstrap-kubelet.conf")))
	if err != nil {
		t.Fatalf("bootstrap kubeconfig: %v", err)
	}
	cur := kc.Contexts[kc.CurrentContext]
	if cur == nil || kc.Clusters[cur.Cluster] == nil || kc.AuthInfos[cur.AuthInfo] == nil {
		t.Fatalf("bootstrap kubeconfig has no usable current context: %+v", kc)
	}
	if got := kc.Clusters[cur.Cluster].Server; got != c.ClusterEndpoint {
		t.Errorf("server %q, want %q", got, c.ClusterEndpoint)
	}
	if got := kc.Clusters[cur.Cluster].CertificateAuthorityData; !bytes.Equal(got, ca) {
		t.Errorf("certificate-authority-data is not the cluster CA")
	}
	if kc.AuthInfos[cur.AuthInfo].Token != token {
		t.Errorf("bootstrap kubeconfig does not carry the token")
	}
	if got := h.sh("cat /etc/kubernetes/pki/ca.crt"); got != strings.TrimSpace(string(ca)) {
		t.Errorf("pki/ca.crt is not the CA")
	}
	argv := h.argv("kubelet")
	for _, want := range []string{
		"--provider-id=" + c.ProviderID, "--node-ip=" + c.NodeAddress, "--hostname-override=" + c.NodeName,
		"--register-with-taints=" + c.Taints, "--node-labels=" + c.NodeLabels,
		"--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf", "--kubeconfig=/etc/kubernetes/kubelet.conf",
		"--config=/var/lib/kubelet/config.yaml",
	} {
		if !contains(argv, want) {
			t.Errorf("kubelet argv lacks %s: %q", want, argv)
		}
	}
	cfg := h.sh("cat /var/lib/kubelet/config.yaml")
	for _, want := range []string{"clusterDNS:\n  - 10.32.0.10\n", "serverTLSBootstrap: true", "clientCAFile: /etc/kubernetes/pki/ca.crt", "cgroupDriver: systemd"} {
		if !strings.Contains(cfg, want) {
			t.Errorf("kubelet config lacks %q:\n%s", want, cfg)
		}
	}
	// A re-run converges: nothing changed, so kubelet is not restarted.
	n := h.starts("kubelet")
	h.mustRun(engine.PhaseJoin, string(s.Join), c)
	if got := h.starts("kubelet"); got != n {
		t.Errorf("re-running an unchanged join restarted kubelet (%d → %d starts)", n, got)
	}

	// leave, with a workload, its shim and CNI devices in place
	h.spawnWorkload()
	h.mustRun(engine.PhaseLeave, string(s.Leave), c)
	h.wantUnits("after leave", "inactive disabled, inactive disabled", "kubelet.service", "containerd.service")
	if got := h.sh("systemctl is-active kpssh-fake-pod.service || true"); got == "active" {
		t.Error("leave left the pod running")
	}
	if h.shims() {
		t.Error("leave left a containerd shim running")
	}
	links := h.links()
	for _, l := range []string{"cni0", "cilium_wg0", "cilium_host", "cilium_net"} {
		if strings.Contains(" "+links, " "+l+" ") {
			t.Errorf("leave kept CNI device %s (links: %s)", l, links)
		}
	}
	for f, want := range map[string]bool{
		"/var/lib/cni": false, "/etc/kubernetes/bootstrap-kubelet.conf": false, // membership wiped
		"/usr/local/bin/kubelet": true, "/usr/local/bin/containerd": true, "/usr/local/sbin/runc": true, // warm pool: binaries stay
		"/opt/cni/bin/bridge": true, "/etc/systemd/system/kubelet.service": true,
	} {
		if h.exists(f) != want {
			t.Errorf("after leave: %s exists=%v, want %v", f, !want, want)
		}
	}
	// leave again (the zombie guard and retries re-run it): converges.
	h.mustRun(engine.PhaseLeave, string(s.Leave), c)
	// The warm pool survives a reboot: nothing starts at boot.
	kStarts, cStarts := h.starts("kubelet"), h.starts("containerd")
	h.w.Reboot(h.i)
	h.wantUnits("after leave + reboot", "inactive disabled, inactive disabled", "kubelet.service", "containerd.service")
	if h.starts("kubelet") != kStarts || h.starts("containerd") != cStarts {
		t.Error("kubelet or containerd started at boot after leave")
	}

	// join alone reconnects the warm host; under providerIDSource: Adopt the
	// provider ID is empty and --provider-id is left out.
	adopt := c
	adopt.ProviderID = ""
	h.mustRun(engine.PhaseJoin, string(s.Join), adopt)
	h.wantUnits("after warm rejoin", "active enabled, active enabled", "kubelet.service", "containerd.service")
	argv = h.argv("kubelet")
	for _, a := range argv {
		if strings.HasPrefix(a, "--provider-id") {
			t.Errorf("Adopt join passed %s", a)
		}
	}
	if !contains(argv, "--hostname-override="+c.NodeName) {
		t.Errorf("warm rejoin argv: %q", argv)
	}
	h.mustRun(engine.PhaseLeave, string(s.Leave), c)

	// uninstall (by hand in production): the binaries go.
	h.mustRun(engine.PhaseUninstall, string(s.Uninstall), c)
	for _, f := range []string{"/usr/local/bin/kubelet", "/usr/local/bin/containerd", "/usr/local/sbin/runc", "/opt/cni/bin", "/etc/systemd/system/kubelet.service", "/etc/containerd/config.toml", "/var/lib/kpssh/tls-bootstrap.files"} {
		if h.exists(f) {
			t.Errorf("uninstall left %s", f)
		}
	}
}

func testNodeadmSSM(t *testing.T, h *host) {
	p := loadProfile(t, "profile-nodeadm-ssm.yaml")
	s := p.Spec.Scripts
	h.setupMirror()
	vars := map[string]string{"clusterName": "kpssh-test", "region": "eu-central-1", "k8sVersion": "1.34", "binarySource": mirror, "note": trickyVar}
	secrets := map[string]string{"activationId": activationID, "activationCode": activationCode}
	c := h.context(vars, secrets)
	c.ProviderID = "" // providerIDSource: Adopt
	noSecrets := h.context(vars, nil)
	noSecrets.ProviderID = ""

	h.checkEnvContract(c)

	h.mustRun(engine.PhaseInstall, string(s.Install), c)
	if !h.exists("/usr/local/bin/nodeadm") {
		t.Fatal("install did not place nodeadm")
	}
	before := h.snapshot("/usr/local")
	h.mustRun(engine.PhaseInstall, string(s.Install), c)
	if after := h.snapshot("/usr/local"); after != before {
		t.Fatalf("second install changed the host:\n%s", lineDiff(before, after))
	}
	calls := func() string { return h.sh("cat /var/lib/kpssh-stub/nodeadm.calls 2>/dev/null || true") }
	if got := calls(); got != "" {
		t.Fatalf("install ran nodeadm: %q", got)
	}

	// Cold without activation secrets: fails clearly, touches nothing.
	h.mustFail(engine.PhaseJoin, string(s.Join), noSecrets, "activation required")
	if got := calls(); got != "" || h.exists("/etc/kpssh/nodeadm/nodeConfig.yaml") {
		t.Fatalf("a join without activation ran nodeadm (%q) or wrote nodeConfig.yaml", got)
	}

	// Cold, nodeadm init failing: the run's (traced) output is in the
	// message, the activation values are not — not even as the engine's mask.
	h.sh("mkdir -p /etc/kpssh-stub && touch /etc/kpssh-stub/nodeadm-init-fails")
	r := h.mustFail(engine.PhaseJoin, string(s.Join), c, "activation expired (stub)")
	if !strings.Contains(r.Message, "nodeadm init --config-source file:///etc/kpssh/nodeadm/nodeConfig.yaml") {
		t.Errorf("the traced nodeadm call is not in the message: %q", r.Message)
	}
	h.sh("rm -f /etc/kpssh-stub/nodeadm-init-fails")
	if h.exists("/var/lib/amazon/ssm/registration") {
		t.Fatal("failed init left a registration")
	}

	// Cold with activation: nodeConfig.yaml from vars + secrets, nodeadm
	// install + init, units up.
	h.mustRun(engine.PhaseJoin, string(s.Join), c)
	wantCalls := "install 1.34 --credential-provider ssm --region eu-central-1\n" +
		"init --config-source file:///etc/kpssh/nodeadm/nodeConfig.yaml\n"
	wantCalls = wantCalls + wantCalls // the failed attempt ran both too
	if got := calls() + "\n"; got != wantCalls {
		t.Errorf("nodeadm calls:\n%s\nwant:\n%s", got, wantCalls)
	}
	if h.sh("stat -c %a /etc/kpssh/nodeadm/nodeConfig.yaml") != "600" {
		t.Error("nodeConfig.yaml is not 0600")
	}
	nc := h.sh("cat /etc/kpssh/nodeadm/nodeConfig.yaml")
	for _, want := range []string{
		"apiVersion: node.eks.aws/v1alpha1", "kind: NodeConfig", `    name: "kpssh-test"`, `    region: "eu-central-1"`,
		`      activationId: "` + activationID + `"`, `      activationCode: "` + activationCode + `"`,
		`      - "--node-ip=` + c.NodeAddress + `"`, `      - "--node-labels=` + c.NodeLabels + `"`,
		`      - "--register-with-taints=` + c.Taints + `"`,
	} {
		if !strings.Contains(nc, want) {
			t.Errorf("nodeConfig.yaml lacks %q", want)
		}
	}
	if !h.exists("/var/lib/amazon/ssm/registration") {
		t.Fatal("no SSM registration after a cold join")
	}
	h.wantUnits("after cold join", "active enabled, active enabled", "kubelet.service", "containerd.service")

	// leave: units disabled and stopped, identity and binaries kept.
	h.mustRun(engine.PhaseLeave, string(s.Leave), c)
	h.wantUnits("after leave", "inactive disabled, inactive disabled", "kubelet.service", "containerd.service")
	for _, f := range []string{"/var/lib/amazon/ssm/registration", "/etc/kpssh/nodeadm/nodeConfig.yaml", "/usr/bin/kubelet", "/usr/bin/containerd", "/usr/local/bin/nodeadm"} {
		if !h.exists(f) {
			t.Errorf("leave removed %s", f)
		}
	}
	kStarts := h.starts("kubelet")
	h.w.Reboot(h.i)
	h.wantUnits("after leave + reboot", "inactive disabled, inactive disabled", "kubelet.service", "containerd.service")
	if h.starts("kubelet") != kStarts {
		t.Error("kubelet started at boot after leave")
	}

	// Warm: registration + nodeConfig.yaml present; no secrets given at all,
	// no nodeadm call, units up.
	callsBefore := calls()
	h.mustRun(engine.PhaseJoin, string(s.Join), noSecrets)
	h.wantUnits("after warm join", "active enabled, active enabled", "kubelet.service", "containerd.service")
	if got := calls(); got != callsBefore {
		t.Errorf("warm join called nodeadm: %q", strings.TrimPrefix(got, callsBefore))
	}
	// A warm host registered for another cluster is refused, not rejoined.
	other := h.context(map[string]string{"clusterName": "other-cluster", "region": "eu-central-1", "k8sVersion": "1.34"}, nil)
	h.mustFail(engine.PhaseJoin, string(s.Join), other, "registered for cluster kpssh-test")
	h.mustRun(engine.PhaseLeave, string(s.Leave), c)

	// uninstall: nodeadm uninstall, registration gone: the next join is cold.
	h.mustRun(engine.PhaseUninstall, string(s.Uninstall), c)
	if got := calls(); !strings.HasSuffix(got, "uninstall --skip node-validation,pod-validation") {
		t.Errorf("uninstall did not run nodeadm uninstall: %q", got)
	}
	for _, f := range []string{"/var/lib/amazon/ssm/registration", "/etc/kpssh/nodeadm/nodeConfig.yaml", "/usr/local/bin/nodeadm"} {
		if h.exists(f) {
			t.Errorf("uninstall left %s", f)
		}
	}
}

// setupDebs builds stand-ins for Debian's containerd, runc and
// containernetworking-plugins packages (containerd's postinst enables and
// starts it, as the real one does) and an apt-get that records its calls and
// installs them from the local directory: the hosts have no network.
func (h *host) setupDebs() {
	h.t.Helper()
	h.put("/usr/local/sbin/apt-get", "0755", bytes.ReplaceAll(testdata(h.t, "apt-get"), []byte("@DEBS@"), []byte(debs)))
	h.sh(`set -e
arch=$(dpkg --print-architecture)
b=/srv/kpssh-test/debs
rm -rf $b && mkdir -p $b ` + debs + `
deb() { # NAME: DEBIAN/control for package NAME in $b/NAME, then build
	mkdir -p $b/$1/DEBIAN
	printf 'Package: %s\nVersion: 9.9.9-kpssh-stub\nArchitecture: %s\nMaintainer: kpssh tests <tests@kpssh.invalid>\nDescription: kpssh test stand-in for %s\n' $1 $arch $1 >$b/$1/DEBIAN/control
}
deb containerd
install -D -m 0755 /srv/kpssh-test/stub-daemon $b/containerd/usr/bin/containerd
mkdir -p $b/containerd/lib/systemd/system
printf '[Unit]\nDescription=containerd (stub)\n[Service]\nType=notify\nExecStart=/usr/bin/containerd\nKillMode=process\n[Install]\nWantedBy=multi-user.target\n' >$b/containerd/lib/systemd/system/containerd.service
printf '#!/bin/sh\nset -e\nsystemctl daemon-reload\nsystemctl enable containerd.service\nsystemctl start containerd.service\n' >$b/containerd/DEBIAN/postinst
chmod 0755 $b/containerd/DEBIAN/postinst
deb runc
install -D -m 0755 /srv/kpssh-test/stub-daemon $b/runc/usr/sbin/runc
deb containernetworking-plugins
for p in bridge host-local loopback portmap; do install -D -m 0755 /srv/kpssh-test/stub-daemon $b/containernetworking-plugins/usr/lib/cni/$p; done
for p in containerd runc containernetworking-plugins; do dpkg-deb --root-owner-group --build $b/$p ` + debs + `/$p.deb >/dev/null; done`)
}

func testSBC(t *testing.T, h *host, ca []byte) {
	p := loadProfile(t, "profile-sbc.yaml")
	s := p.Spec.Scripts
	h.setupMirror()
	h.setupDebs()
	vars := map[string]string{"k8sMinor": k8sMinor, "binarySource": mirror, "note": trickyVar}
	c := h.context(vars, nil)
	c.ClusterCAB64 = base64.StdEncoding.EncodeToString(ca)

	h.checkEnvContract(c)

	// Memory-cgroup guard: a kernel with the controller off fails install
	// and join before anything is touched (the hosts' /proc/cgroups is
	// shadowed by a copy with memory disabled).
	h.sh(`awk 'BEGIN{OFS="\t"} $1 == "memory" { $4 = 0 } { print }' /proc/cgroups >/run/kpssh-fake-cgroups && mount --bind /run/kpssh-fake-cgroups /proc/cgroups`)
	h.mustFail(engine.PhaseInstall, string(s.Install), c, "memory cgroup controller is not available")
	r := h.mustFail(engine.PhaseJoin, string(s.Join), c, "memory cgroup controller is not available")
	if !strings.Contains(r.Message, "cgroup_enable=memory cgroup_memory=1") {
		t.Errorf("the guard does not say how to fix it: %q", r.Message)
	}
	h.sh("umount /proc/cgroups")
	aptCalls := func() string { return h.sh("cat /var/lib/kpssh-stub/apt-get.calls 2>/dev/null || true") }
	if got := aptCalls(); got != "" {
		t.Fatalf("apt ran behind the memory guard: %q", got)
	}

	// First install: packages missing, so apt runs; containerd, enabled and
	// started by its package, is disabled again (only join may start it).
	h.mustRun(engine.PhaseInstall, string(s.Install), c)
	wantApt := "-q update\n-q install -y --no-install-recommends -o Dpkg::Options::=--force-confold containerd runc containernetworking-plugins"
	if got := aptCalls(); got != wantApt {
		t.Errorf("apt calls:\n%s\nwant:\n%s", got, wantApt)
	}
	h.wantUnits("after install", "inactive disabled, inactive disabled", "kubelet.service", "containerd.service")
	if cfg := h.sh("cat /etc/containerd/config.toml"); !strings.Contains(cfg, `bin_dir = "/usr/lib/cni"`) {
		t.Errorf("containerd config does not use Debian's CNI path:\n%s", cfg)
	}
	// Second install: the packages are current, apt is skipped, nothing changes.
	before := h.snapshot(installPaths...)
	h.mustRun(engine.PhaseInstall, string(s.Install), c)
	if after := h.snapshot(installPaths...); after != before {
		t.Fatalf("second install changed the host:\n%s", lineDiff(before, after))
	}
	if got := aptCalls(); got != wantApt {
		t.Errorf("second install ran apt: %q", strings.TrimPrefix(got, wantApt))
	}

	// join: flags in kubeadm-flags.env, kubeadm drop-in order (the
	// operator's KUBELET_EXTRA_ARGS last).
	h.sh("echo 'KUBELET_EXTRA_ARGS=--v=2' >/etc/default/kubelet")
	h.mustRun(engine.PhaseJoin, string(s.Join), c)
	h.wantUnits("after join", "active enabled, active enabled", "kubelet.service", "containerd.service")
	wantFlags := fmt.Sprintf(`KUBELET_KUBEADM_ARGS="--cert-dir=/var/lib/kubelet/pki --hostname-override=%s --node-ip=%s --provider-id=%s --node-labels=%s --register-with-taints=%s"`,
		c.NodeName, c.NodeAddress, c.ProviderID, c.NodeLabels, c.Taints)
	if got := h.sh("cat /var/lib/kubelet/kubeadm-flags.env"); got != wantFlags {
		t.Errorf("kubeadm-flags.env:\n%s\nwant:\n%s", got, wantFlags)
	}
	wantArgv := []string{
		"--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf", "--kubeconfig=/etc/kubernetes/kubelet.conf",
		"--config=/var/lib/kubelet/config.yaml", "--cert-dir=/var/lib/kubelet/pki", "--hostname-override=" + c.NodeName,
		"--node-ip=" + c.NodeAddress, "--provider-id=" + c.ProviderID, "--node-labels=" + c.NodeLabels,
		"--register-with-taints=" + c.Taints, "--v=2",
	}
	if got := h.argv("kubelet"); strings.Join(got, " ") != strings.Join(wantArgv, " ") {
		t.Errorf("kubelet argv:\n%q\nwant:\n%q", got, wantArgv)
	}
	kc, err := clientcmd.Load([]byte(h.sh("cat /etc/kubernetes/bootstrap-kubelet.conf")))
	if err != nil {
		t.Fatal(err)
	}
	if cur := kc.Contexts[kc.CurrentContext]; cur == nil || kc.AuthInfos[cur.AuthInfo].Token != token || kc.Clusters[cur.Cluster].Server != c.ClusterEndpoint {
		t.Errorf("bootstrap kubeconfig: %+v", kc)
	}

	// leave keeps cilium_wg0 and wipes the other CNI devices.
	h.spawnWorkload()
	h.mustRun(engine.PhaseLeave, string(s.Leave), c)
	h.wantUnits("after leave", "inactive disabled, inactive disabled", "kubelet.service", "containerd.service")
	links := h.links()
	if !strings.Contains(" "+links, " cilium_wg0 ") {
		t.Errorf("leave deleted cilium_wg0 (links: %s)", links)
	}
	for _, l := range []string{"cni0", "cilium_host", "cilium_net"} {
		if strings.Contains(" "+links, " "+l+" ") {
			t.Errorf("leave kept CNI device %s (links: %s)", l, links)
		}
	}
	if h.shims() {
		t.Error("leave left a containerd shim running")
	}
	if !h.exists("/usr/local/bin/kubelet") || !h.exists("/usr/bin/containerd") {
		t.Error("leave removed binaries")
	}
	h.w.Reboot(h.i)
	h.wantUnits("after leave + reboot", "inactive disabled, inactive disabled", "kubelet.service", "containerd.service")
	// join alone reconnects it.
	h.mustRun(engine.PhaseJoin, string(s.Join), c)
	h.wantUnits("after warm rejoin", "active enabled, active enabled", "kubelet.service", "containerd.service")
	h.mustRun(engine.PhaseLeave, string(s.Leave), c)
}

// lineDiff shows the lines only in a (-) or only in b (+).
func lineDiff(a, b string) string {
	in := func(s string) map[string]bool {
		m := map[string]bool{}
		for _, l := range strings.Split(s, "\n") {
			m[l] = true
		}
		return m
	}
	ma, mb := in(a), in(b)
	var out []string
	for _, l := range strings.Split(a, "\n") {
		if !mb[l] {
			out = append(out, "- "+l)
		}
	}
	for _, l := range strings.Split(b, "\n") {
		if !ma[l] {
			out = append(out, "+ "+l)
		}
	}
	return strings.Join(out, "\n")
}
