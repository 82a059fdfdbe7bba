package verified_test

import (
	"context"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/envelope"
	"github.com/dklesev/kpssh/internal/providers/hostkey"
	"github.com/dklesev/kpssh/internal/providers/leave"
	"github.com/dklesev/kpssh/internal/providers/phase"
	"github.com/dklesev/kpssh/internal/sshsig"
)

// fakeKubelet stands in for a joined node's kubelet: a unit named
// kubelet.service, enabled and running, which leave must stop and disable.
const fakeKubelet = `set -euo pipefail
cat >/etc/systemd/system/kubelet.service <<'EOF'
[Unit]
Description=stand-in kubelet (test/verified)
[Service]
ExecStart=/bin/sleep infinity
[Install]
WantedBy=multi-user.target
EOF
systemctl daemon-reload
systemctl enable --now kubelet.service 2>/dev/null
systemctl is-active kubelet.service`

// kubeletState is "<is-active> <is-enabled>" of the host's kubelet.
func (f *fixture) kubeletState() string {
	f.t.Helper()
	return strings.Join(strings.Fields(f.w.MustRun(0, "systemctl is-active kubelet.service || true; systemctl is-enabled kubelet.service || true")), " ")
}

// expiredField signs a leave manifest for script that expired an hour ago
// (a profile signed with the default --not-after 720h, 31 days later).
func expiredField(f *fixture, profile, script string) string {
	f.t.Helper()
	now := time.Now().UTC().Truncate(time.Second)
	m, err := envelope.MarshalManifest(envelope.Manifest{
		Phase: "leave", Profile: profile, ScriptSHA256: envelope.ScriptDigest([]byte(script)),
		IssuedAt: now.Add(-31 * 24 * time.Hour), NotAfter: now.Add(-time.Hour),
	})
	if err != nil {
		f.t.Fatal(err)
	}
	sig, err := sshsig.Sign(f.signer.priv, m, sshsig.Namespace)
	if err != nil {
		f.t.Fatal(err)
	}
	return envelope.FormatSignedField(envelope.SignedField{Manifest: m, Signature: sig})
}

// leaveProvider is what the zombie guard runs (leave.NewEngine over the
// phase runner, the real engine and the real host-key dial) with the given
// profiles in the API, for the host as the cloud provider holds it.
func (f *fixture) leaveProvider(marker string, objs ...client.Object) (*v1beta1.SSHHost, leave.Provider, hostkey.Credentials) {
	f.t.Helper()
	h := f.w.Host(0)
	host := &v1beta1.SSHHost{ObjectMeta: metav1.ObjectMeta{Name: "h1", Namespace: "pool"}, Spec: v1beta1.SSHHostSpec{
		Address: h.Address, Port: int32(h.Port), User: "kpssh", SSHKeySecretRef: v1beta1.LocalObjectReference{Name: "key"},
		ExecMode: v1beta1.ExecModeVerified, TrustedSigners: []v1beta1.TrustedSigner{v1beta1.TrustedSigner(f.signer.pub)}},
		Status: v1beta1.SSHHostStatus{HostKeyFingerprint: h.Fingerprint, InstalledProfile: marker}}
	objs = append(objs, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "pool", Name: "key"}, Data: map[string][]byte{"privateKey": f.login.priv}})
	c := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(objs...).Build()
	keys := hostkey.New(c)
	creds, err := keys.Get(context.Background(), host)
	if err != nil {
		f.t.Fatal(err)
	}
	return host, leave.NewEngine(c, phase.New(f.e, keys, nil), nil), creds
}

// leaveWithoutSignedLeave: a Verified host whose kubelet runs, and no
// signed leave the controller can send — the profile its install marker
// names was deleted, the host has no marker, or the profile's leave
// manifest expired. Leave must still stop the kubelet (the host's own
// provisioned fallback leave, through the shim); before, every one of them
// was refused forever and the host was released with its kubelet running.
func (f *fixture) leaveWithoutSignedLeave() {
	f.t.Helper()
	const leaveScript = "#!/bin/bash\nset -euo pipefail\nsystemctl disable --now kubelet.service\n"
	expired := &v1beta1.SSHJoinProfile{ObjectMeta: metav1.ObjectMeta{Name: profileName}, Spec: v1beta1.SSHJoinProfileSpec{Version: "3",
		Scripts:    &v1beta1.ProfileScripts{Install: "set -euo pipefail\n", Join: "set -euo pipefail\n", Leave: leaveScript},
		Signatures: &v1beta1.ProfileSignatures{Leave: v1beta1.Signature(expiredField(f, profileName+"@3", leaveScript))}}}
	cases := []struct {
		name   string
		marker string
		objs   []client.Object
	}{
		{"the install marker's profile was deleted", profileName + "@3", nil},
		{"no install marker", "", nil},
		{"the profile's leave manifest expired", profileName + "@3", []client.Object{expired}},
	}
	defer f.w.MustRun(0, "systemctl disable --now kubelet.service 2>/dev/null || true; rm -f /etc/systemd/system/kubelet.service; systemctl daemon-reload")
	for _, c := range cases {
		if got := f.w.MustRun(0, fakeKubelet); got != "active" {
			f.t.Fatalf("%s: the stand-in kubelet is %q, want active", c.name, got)
		}
		host, p, creds := f.leaveProvider(c.marker, c.objs...)
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		start := time.Now()
		err := p.Leave(ctx, host, creds)
		cancel()
		f.t.Logf("%s: leave in %v: %v", c.name, time.Since(start).Round(time.Millisecond), err)
		if err != nil {
			f.t.Errorf("%s: leave: %v", c.name, err)
		}
		if got := f.kubeletState(); got != "inactive disabled" {
			f.t.Errorf("%s: after leave the kubelet is %q, want inactive disabled", c.name, got)
		}
	}
}

// fallbackLeaveOp: the shim's fallback-leave op runs only the operator's
// provisioned file — nothing the controller sends (stdin is not read) — and
// refuses a file that anyone but root could have changed, or none at all;
// through the engine such a host's leave fails (the host is then held
// Unhealthy, never released Available: internal/cloudprovider).
func (f *fixture) fallbackLeaveOp() {
	f.t.Helper()
	const file = "/etc/kpssh/fallback-leave"
	if got := f.w.MustRun(0, "stat -c '%U:%G %a' "+file); got != "root:root 644" {
		f.t.Fatalf("provisioned %s: %s, want root:root 644", file, got)
	}
	defer f.w.MustRun(0, "systemctl disable --now kubelet.service 2>/dev/null || true; rm -f /etc/systemd/system/kubelet.service; systemctl daemon-reload")
	// What the controller sends is not what runs.
	if got := f.w.MustRun(0, fakeKubelet); got != "active" {
		f.t.Fatalf("stand-in kubelet %q", got)
	}
	if rc, out := f.sshAsKpssh("kpssh-shim fallback-leave 60", []byte("#!/bin/bash\ntouch "+marker+"\n")); rc != 0 {
		f.t.Fatalf("fallback-leave op: exit %d: %s", rc, out)
	}
	f.markerGone("a script sent on the fallback-leave op's stdin")
	if got := f.kubeletState(); got != "inactive disabled" {
		f.t.Fatalf("after the fallback-leave op the kubelet is %q", got)
	}
	// A file someone but root could have written is refused, and so is none.
	for _, c := range []struct{ name, breakIt, want string }{
		{"group-writable", "chmod 664 " + file, "writable by group or others"},
		{"owned by the kpssh login", "chown kpssh " + file, "not owned by root"},
		{"a symlink", "mv " + file + " " + file + ".real && ln -s " + file + ".real " + file, "no " + file},
		{"missing", "mv " + file + " " + file + ".real", "no " + file},
		{"its directory writable by others", "chmod 777 /etc/kpssh", "/etc/kpssh is not owned by root or is writable"},
	} {
		f.w.MustRun(0, fakeKubelet)
		f.w.MustRun(0, "cp -p "+file+" /var/tmp/fallback-leave.bak && "+c.breakIt)
		rc, out := f.sshAsKpssh("kpssh-shim fallback-leave 60", nil)
		f.w.MustRun(0, "chmod 755 /etc/kpssh; rm -f "+file+" "+file+".real; cp -p /var/tmp/fallback-leave.bak "+file+" && chown root:root "+file+" && chmod 644 "+file)
		if rc != 1 || !strings.Contains(out, c.want) {
			f.t.Errorf("%s: exit %d (%s), want 1 saying %q", c.name, rc, strings.TrimSpace(out), c.want)
		}
		if got := f.kubeletState(); got != "active enabled" {
			f.t.Errorf("%s: the refused op ran something: kubelet %q", c.name, got)
		}
	}
	// Through the engine, a host without the file: the leave fails (shim
	// exit 1) and says how to fix it.
	f.w.MustRun(0, "mv "+file+" "+file+".real")
	defer f.w.MustRun(0, "mv "+file+".real "+file)
	host, _, _ := f.leaveProvider("")
	_, r := f.verifiedRunner(f.w.Host(0))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out := r.RunFallbackLeave(ctx, host, leave.EmptyContext(host))
	if out.OK() || out.RC != 1 || !strings.Contains(out.Message, "provision the host") {
		f.t.Fatalf("fallback leave without the file: %s rc %d: %s", out.Outcome, out.RC, out.Message)
	}
}
