package hostenv_test

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dklesev/kpssh/test/hostenv"
)

// Machine-wide sysctls that must never change: the six the kubelet insists
// on (shadowed inside each host) and IP forwarding.
var guardedSysctls = []string{
	"vm.overcommit_memory",
	"vm.panic_on_oom",
	"kernel.panic",
	"kernel.panic_on_oops",
	"kernel.keys.root_maxkeys",
	"kernel.keys.root_maxbytes",
	"net.ipv4.ip_forward",
}

// The values every host must see (hack/host-image/rootfs/etc/kpssh/sysctl-shadow.conf).
var shadowedSysctls = map[string]string{
	"vm.overcommit_memory":      "1",
	"vm.panic_on_oom":           "0",
	"kernel.panic":              "10",
	"kernel.panic_on_oops":      "1",
	"kernel.keys.root_maxkeys":  "1000000",
	"kernel.keys.root_maxbytes": "25000000",
}

// What each release's hosts report (/etc/os-release, python3).
var releaseFacts = map[string]struct{ versionID, python string }{
	hostenv.Bookworm: {"12", "3.11"},
	hostenv.Trixie:   {"13", "3.13"},
}

// TestWorld runs one mixed world: h1 and h3 boot Debian 13 (trixie), h2
// Debian 12 (bookworm), so every step below (reboot and wipe on h1, power
// off on h3, cut on h2, ...) runs on hosts of both releases; the rest of the
// tests' worlds are bookworm.
func TestWorld(t *testing.T) {
	t.Parallel()
	before := snapshotMachine(t)

	releases := []string{hostenv.Trixie, hostenv.Bookworm, hostenv.Trixie}
	w := hostenv.UpWith(t, 3, hostenv.Options{Releases: releases})
	inv := w.Inventory()
	hosts := w.Hosts()
	if len(hosts) != 3 {
		t.Fatalf("got %d hosts, want 3", len(hosts))
	}

	t.Run("inventory", func(t *testing.T) {
		w := w.WithT(t)
		if inv.World != w.Name() {
			t.Errorf("inventory world %q, want %q", inv.World, w.Name())
		}
		if net.ParseIP(inv.BridgeAddress) == nil || !strings.HasSuffix(inv.BridgeAddress, ".1") {
			t.Errorf("bridgeAddress %q, want x.y.z.1", inv.BridgeAddress)
		}
		if fi, err := os.Stat(inv.ClientKey); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("client key %s: %v (mode %v), want mode 0600", inv.ClientKey, err, fi.Mode().Perm())
		}
		prefix := strings.TrimSuffix(inv.BridgeAddress, "1")
		for i, h := range hosts {
			if want := fmt.Sprintf("h%d", i+1); h.Name != want {
				t.Errorf("host %d name %q, want %q", i, h.Name, want)
			}
			if want := prefix + strconv.Itoa(11+i); h.Address != want {
				t.Errorf("%s address %q, want %q", h.Name, h.Address, want)
			}
			if h.Port != 22 || h.User != "root" || h.AltPort != 2222 || h.AltUser != "admin" {
				t.Errorf("%s port/user %d/%q, alt %d/%q, want 22/root, 2222/admin", h.Name, h.Port, h.User, h.AltPort, h.AltUser)
			}
			if want := fmt.Sprintf("h%d.%s.kpssh.test", i+1, inv.Tag); h.DNSName != want {
				t.Errorf("%s dnsName %q, want %q", h.Name, h.DNSName, want)
			}
			var types []string
			for _, k := range h.HostKeys {
				types = append(types, strings.Fields(k)[0])
			}
			if want := []string{"ssh-rsa", "ecdsa-sha2-nistp256", "ssh-ed25519"}; !slices.Equal(types, want) || h.HostKeys[2] != h.HostKey {
				t.Errorf("%s hostKeys of types %v (last %q), want %v, the last hostKey %q", h.Name, types, h.HostKeys[len(h.HostKeys)-1], want, h.HostKey)
			}
			if h.PID <= 1 {
				t.Errorf("%s pid %d", h.Name, h.PID)
			}
			if got := fingerprint(t, h.HostKey); got != h.Fingerprint {
				t.Errorf("%s fingerprint %q, computed %q from hostKey", h.Name, h.Fingerprint, got)
			}
			if _, err := os.Stat("/run/netns/" + h.Netns); err != nil {
				t.Errorf("%s netns: %v", h.Name, err)
			}
		}
	})

	t.Run("releases", func(t *testing.T) {
		w := w.WithT(t)
		// One round trip per host: the release it runs, that python3 works,
		// that systemd came up clean (no failed unit: the kpssh units
		// included), the sshd drop-in in effect, the shadowed sysctls.
		const probe = `. /etc/os-release; echo "codename=$VERSION_CODENAME"; echo "version_id=$VERSION_ID"
python3 -c 'import sys; print("python=%d.%d" % sys.version_info[:2])'
echo "system=$(systemctl is-system-running)"
echo "kpssh_units=$(systemctl is-active kpssh-cgroup-rw kpssh-sysctl-shadow kpssh-sysfs-net | xargs)"
sshd -T | awk '$1 ~ /^(permitrootlogin|passwordauthentication|kbdinteractiveauthentication)$/ { print "sshd_" $1 "=" $2 }'
echo "overcommit=$(cat /proc/sys/vm/overcommit_memory)"`
		for i, h := range hosts {
			if h.Release != releases[i] {
				t.Errorf("%s: inventory release %q, want %q", h.Name, h.Release, releases[i])
			}
			facts := releaseFacts[releases[i]]
			got := map[string]string{}
			for _, l := range strings.Split(w.MustRun(i, probe), "\n") {
				if k, v, ok := strings.Cut(l, "="); ok {
					got[k] = v
				}
			}
			want := map[string]string{
				"codename": releases[i], "version_id": facts.versionID, "python": facts.python,
				"system": "running", "kpssh_units": "active active active",
				"sshd_permitrootlogin": "without-password", "sshd_passwordauthentication": "no",
				"sshd_kbdinteractiveauthentication": "no", "overcommit": shadowedSysctls["vm.overcommit_memory"],
			}
			for k, v := range want {
				if got[k] != v {
					t.Errorf("%s (%s): %s = %q, want %q", h.Name, releases[i], k, got[k], v)
				}
			}
		}
	})

	t.Run("distinct identities", func(t *testing.T) {
		w := w.WithT(t)
		probes := []struct {
			what string
			cmd  string
			want func(h hostenv.Host, got string) error
		}{
			{"hostname", "hostname", func(h hostenv.Host, got string) error {
				if got != h.Name {
					return fmt.Errorf("hostname %q, want %q", got, h.Name)
				}
				return nil
			}},
			{"machine-id", "cat /etc/machine-id", func(_ hostenv.Host, got string) error {
				if !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(got) {
					return fmt.Errorf("machine-id %q is not 32 hex chars", got)
				}
				return nil
			}},
			{"host key", "cut -d' ' -f1,2 /etc/ssh/ssh_host_ed25519_key.pub", func(h hostenv.Host, got string) error {
				if got != h.HostKey {
					return fmt.Errorf("host key %q, inventory says %q", got, h.HostKey)
				}
				return nil
			}},
			{"boot id", "cat /proc/sys/kernel/random/boot_id", func(hostenv.Host, string) error { return nil }},
		}
		for _, p := range probes {
			t.Run(p.what, func(t *testing.T) {
				w := w.WithT(t)
				seen := map[string]string{}
				for i, h := range hosts {
					got := w.MustRun(i, p.cmd)
					if err := p.want(h, got); err != nil {
						t.Errorf("%s: %v", h.Name, err)
					}
					if other, dup := seen[got]; dup {
						t.Errorf("%s and %s share %s %q", other, h.Name, p.what, got)
					}
					seen[got] = h.Name
				}
			})
		}
	})

	t.Run("strict host key checking", func(t *testing.T) {
		w := w.WithT(t)
		// known_hosts claiming h1's address has h2's key must be refused.
		kh := filepath.Join(t.TempDir(), "known_hosts")
		if err := os.WriteFile(kh, []byte(hosts[0].Address+" "+hosts[1].HostKey+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, stderr, err := w.RunSSH(ctx, 0, []string{"-o", "UserKnownHostsFile=" + kh}, "true")
		if err == nil {
			t.Fatalf("ssh to h1 with h2's key in known_hosts succeeded")
		}
		if !strings.Contains(stderr, "verification failed") && !strings.Contains(stderr, "IDENTIFICATION HAS CHANGED") {
			t.Errorf("ssh failed for another reason: %s", stderr)
		}
	})

	// A fleet, not a lab: each host serves the three keys of a stock Debian
	// install, lets a second login (AltUser, AltPort) become root through
	// sudo, and resolves every host of the world by name, which the machine
	// does not (only a process given HostsFile as its /etc/hosts does).
	t.Run("stock hosts", func(t *testing.T) {
		w := w.WithT(t)
		for i, h := range hosts {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			out, err := exec.CommandContext(ctx, "ssh-keyscan", "-T", "10", "-t", "rsa,ecdsa,ed25519", h.Address).Output()
			cancel()
			var served []string
			for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
				if f := strings.Fields(l); len(f) == 3 && f[0] == h.Address {
					served = append(served, f[1]+" "+f[2])
				}
			}
			sort.Strings(served)
			want := slices.Sorted(slices.Values(h.HostKeys))
			if err != nil || !slices.Equal(served, want) {
				t.Errorf("%s: sshd serves %q (%v), want the inventory's %q", h.Name, served, err, want)
			}
			ctx, cancel = context.WithTimeout(context.Background(), time.Minute)
			alt, err := exec.CommandContext(ctx, "ssh", append(w.AltSSHArgs(i), "--", "id -un; sudo -n id -un")...).Output()
			cancel()
			if got := strings.TrimSpace(string(alt)); got != "admin\nroot" || err != nil {
				t.Errorf("%s: as %s on port %d, id -un; sudo -n id -un = %q (%v), want admin, root", h.Name, h.AltUser, h.AltPort, got, exitStderr(err))
			}
			other := hosts[(i+1)%len(hosts)]
			if got := w.MustRun(i, "getent hosts "+other.DNSName+" | awk '{print $1}'"); got != other.Address {
				t.Errorf("%s resolves %s to %q, want %s", h.Name, other.DNSName, got, other.Address)
			}
		}
		b, err := os.ReadFile(inv.HostsFile)
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range hosts {
			if !strings.Contains(string(b), h.Address+"\t"+h.DNSName+"\n") {
				t.Errorf("hostsFile %s has no line %s %s", inv.HostsFile, h.Address, h.DNSName)
			}
			if out, err := exec.Command("getent", "hosts", h.DNSName).CombinedOutput(); err == nil {
				t.Errorf("the machine resolves %s: %s (the world's names are for who asks for them)", h.DNSName, out)
			}
		}
	})

	t.Run("cgroups", func(t *testing.T) {
		w := w.WithT(t)
		lines := len(readLines(t, "/proc/self/cgroup"))
		for _, h := range hosts {
			got := readLines(t, fmt.Sprintf("/proc/%d/cgroup", h.PID))
			if len(got) != lines {
				t.Errorf("%s: /proc/%d/cgroup has %d lines, machine has %d", h.Name, h.PID, len(got), lines)
			}
			for _, l := range got {
				path := cgroupPath(l)
				if path != h.Cgroup && !strings.HasPrefix(path, h.Cgroup+"/") {
					t.Errorf("%s: PID 1 (%d) cgroup line %q is not under %s", h.Name, h.PID, l, h.Cgroup)
				}
			}
			for _, root := range cgroupRoots(t) {
				if fi, err := os.Stat(filepath.Join(root, h.Cgroup)); err != nil || !fi.IsDir() {
					t.Errorf("%s: no cgroup dir in %s: %v", h.Name, root, err)
				}
			}
		}
		// Inside, the cgroup namespace hides the machine's tree.
		if out := w.MustRun(0, "cat /proc/1/cgroup"); strings.Contains(out, "kpssh") {
			t.Errorf("h1 sees machine cgroup paths:\n%s", out)
		}
	})

	t.Run("cgroups writable inside and confined", func(t *testing.T) {
		w := w.WithT(t)
		// kpssh-cgroup-rw.service made the namespaced controller mounts
		// writable: a cgroup made inside h1 must land under h1's cgroup.
		probe := "kpssh-probe-" + strconv.Itoa(os.Getpid())
		out := w.MustRun(0, `set -e; for d in /sys/fs/cgroup/*/; do mkdir "${d}`+probe+`"; echo "${d%/}"; done`)
		dirs := strings.Fields(out)
		if len(dirs) < len(cgroupRoots(t)) {
			t.Errorf("h1 has %d cgroup hierarchies (%v), machine has %d", len(dirs), dirs, len(cgroupRoots(t)))
		}
		for _, root := range cgroupRoots(t) {
			// nspawn roots the name=systemd / unified namespaces one level
			// down (<host>/payload); v1 controllers at the host's cgroup.
			found, _ := filepath.Glob(filepath.Join(root, hosts[0].Cgroup, probe))
			deeper, _ := filepath.Glob(filepath.Join(root, hosts[0].Cgroup, "*", probe))
			if len(found)+len(deeper) != 1 {
				t.Errorf("cgroup made in h1 not found once under its own cgroup in %s: %v %v", root, found, deeper)
			}
			if _, err := os.Stat(filepath.Join(root, probe)); err == nil {
				t.Errorf("cgroup made in h1 appeared at the machine's root of %s", root)
			}
		}
		w.MustRun(0, `for d in /sys/fs/cgroup/*/; do rmdir "${d}`+probe+`"; done`)
	})

	t.Run("sysctl shadow", func(t *testing.T) {
		w := w.WithT(t)
		// kpssh-sysctl-shadow.service: hosts see the kubelet's values, writing
		// them (as the kubelet does) must not reach the machine.
		for key, want := range shadowedSysctls {
			path := "/proc/sys/" + strings.ReplaceAll(key, ".", "/")
			got := w.MustRun(1, "cat "+path+" && echo "+want+" > "+path+" && cat "+path)
			if got != want+"\n"+want {
				t.Errorf("h2 %s: read/write/read gave %q, want %s twice", key, got, want)
			}
			if m := sysctl(t, key); m != before.sysctls[key] {
				t.Errorf("machine %s changed to %q (was %q)", key, m, before.sysctls[key])
			}
		}
	})

	t.Run("network", func(t *testing.T) {
		w := w.WithT(t)
		for i, h := range hosts {
			if out := w.MustRun(i, "ip -4 route show default"); out != "" {
				t.Errorf("%s has a default route: %q", h.Name, out)
			}
			if got := w.MustRun(i, "ip -br link show eth0 | awk '{print $3}'"); got != h.MAC {
				t.Errorf("%s eth0 MAC %q, want %q", h.Name, got, h.MAC)
			}
			// sysfs shows the host's own links only (kpssh-sysfs-net.service)
			if got := w.MustRun(i, "ls /sys/class/net | xargs; cat /sys/class/net/eth0/address"); got != "eth0 lo\n"+h.MAC {
				t.Errorf("%s /sys/class/net: %q, want only eth0 lo and eth0 at %s", h.Name, got, h.MAC)
			}
		}
		// Hosts reach the bridge address (where an apiserver will listen)...
		ln, err := net.Listen("tcp", inv.BridgeAddress+":0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				_, _ = c.Write([]byte("kpssh-bridge-ok\n"))
				_ = c.Close()
			}
		}()
		port := ln.Addr().(*net.TCPAddr).Port
		for i, h := range hosts {
			got := w.MustRun(i, fmt.Sprintf(`python3 -c 'import socket; s=socket.create_connection(("%s", %d), 5); print(s.recv(64).decode().strip())'`, inv.BridgeAddress, port))
			if got != "kpssh-bridge-ok" {
				t.Errorf("%s -> bridge %s:%d: got %q", h.Name, inv.BridgeAddress, port, got)
			}
		}
		// ... and each other.
		got := w.MustRun(0, fmt.Sprintf(`python3 -c 'import socket; s=socket.create_connection(("%s", 22), 5); print(s.recv(64).decode().split("-")[0])'`, hosts[2].Address))
		if got != "SSH" {
			t.Errorf("h1 -> h3:22 got %q, want an SSH banner", got)
		}
	})

	marker := "/root/kpssh-marker-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	t.Run("filesystems are separate", func(t *testing.T) {
		w := w.WithT(t)
		w.MustRun(0, "echo hello > "+marker+" && sync")
		for i := range hosts {
			out, _, err := w.Run(i, "cat "+marker+" 2>/dev/null || echo absent")
			if err != nil {
				t.Fatal(err)
			}
			want := "absent"
			if i == 0 {
				want = "hello"
			}
			if strings.TrimSpace(out) != want {
				t.Errorf("%s: %s reads %q, want %q", hosts[i].Name, marker, strings.TrimSpace(out), want)
			}
		}
	})

	const enabledUnit, startedUnit = "kpssh-dummy.service", "kpssh-started.service"
	t.Run("units are separate", func(t *testing.T) {
		w := w.WithT(t)
		w.MustRun(0, `set -e
for u in `+enabledUnit+` `+startedUnit+`; do
cat > /etc/systemd/system/$u <<EOF
[Unit]
Description=kpssh test unit $u
[Service]
ExecStart=/bin/sleep infinity
[Install]
WantedBy=multi-user.target
EOF
done
systemctl daemon-reload
systemctl enable --now `+enabledUnit+`
systemctl start `+startedUnit)
		wantActive := map[int]string{0: "active"}
		for i, h := range hosts {
			want := wantActive[i]
			if want == "" {
				want = "inactive"
			}
			for _, u := range []string{enabledUnit, startedUnit} {
				if got := unitState(t, w, i, u); got != want {
					t.Errorf("%s: %s is %q, want %q", h.Name, u, got, want)
				}
			}
			procs := w.MustRun(i, "pgrep -xc sleep || true")
			if wantN := map[bool]string{true: "2", false: "0"}[i == 0]; procs != wantN {
				t.Errorf("%s runs %s sleep processes, want %s", h.Name, procs, wantN)
			}
		}
		if got := w.MustRun(0, "systemctl is-enabled "+enabledUnit+" "+startedUnit+" || true"); got != "enabled\ndisabled" {
			t.Errorf("h1 is-enabled: %q", got)
		}
	})

	t.Run("reboot keeps the disk", func(t *testing.T) {
		w := w.WithT(t)
		old := hosts[0]
		oldID := w.MustRun(0, "cat /etc/machine-id")
		oldBoot := w.MustRun(0, "cat /proc/sys/kernel/random/boot_id")
		start := time.Now()
		w.Reboot(0)
		t.Logf("reboot h1: %v", time.Since(start).Round(time.Millisecond))
		now := w.Host(0)
		if now.PID == old.PID || now.PID <= 1 {
			t.Errorf("PID 1 after reboot %d (before %d)", now.PID, old.PID)
		}
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", old.PID)); err == nil && hostenv.ProcessIsOurs(old.PID, old.Machine) {
			t.Errorf("old PID 1 %d still alive", old.PID)
		}
		if now.HostKey != old.HostKey || !slices.Equal(now.HostKeys, old.HostKeys) {
			t.Errorf("host keys changed across reboot")
		}
		if got := w.MustRun(0, "cat /etc/machine-id"); got != oldID {
			t.Errorf("machine-id changed across reboot: %q -> %q", oldID, got)
		}
		if got := w.MustRun(0, "cat /proc/sys/kernel/random/boot_id"); got == oldBoot {
			t.Errorf("boot id unchanged: no reboot happened")
		}
		if got := w.MustRun(0, "cat "+marker); got != "hello" {
			t.Errorf("marker after reboot: %q", got)
		}
		unitsAfterBoot(t, w, 0, enabledUnit, startedUnit, "reboot")
		checkCgroup(t, w.Host(0))
	})

	t.Run("wipe gives a new machine", func(t *testing.T) {
		w := w.WithT(t)
		old := w.Host(0)
		oldID := w.MustRun(0, "cat /etc/machine-id")
		w.Wipe(0)
		now := w.Host(0)
		if now.HostKey == old.HostKey || now.Fingerprint == old.Fingerprint {
			t.Errorf("host key unchanged by wipe")
		}
		for _, k := range now.HostKeys {
			if slices.Contains(old.HostKeys, k) {
				t.Errorf("host key %.30s… unchanged by wipe", k)
			}
		}
		if got := w.MustRun(0, "cut -d' ' -f1,2 /etc/ssh/ssh_host_ed25519_key.pub"); got != now.HostKey {
			t.Errorf("h1 serves key %q, inventory says %q", got, now.HostKey)
		}
		if got := w.MustRun(0, "cat /etc/machine-id"); got == oldID {
			t.Errorf("machine-id unchanged by wipe: %s", got)
		}
		if got := w.MustRun(0, "test -e "+marker+" && echo present || echo absent"); got != "absent" {
			t.Errorf("marker after wipe: %s", got)
		}
		if got := unitState(t, w, 0, enabledUnit); got != "inactive" {
			t.Errorf("%s after wipe: %q", enabledUnit, got)
		}
		if got := w.MustRun(0, "hostname"); got != "h1" {
			t.Errorf("hostname after wipe %q", got)
		}
		if got := w.MustRun(0, ". /etc/os-release; echo $VERSION_CODENAME"); now.Release != old.Release || got != old.Release {
			t.Errorf("wipe changed the release: %s before, inventory %s, os-release %s after", old.Release, now.Release, got)
		}
		checkCgroup(t, now)
	})

	t.Run("cut and heal", func(t *testing.T) {
		w := w.WithT(t)
		w.Cut(1)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		start := time.Now()
		_, _, err := w.RunSSH(ctx, 1, []string{"-o", "ConnectTimeout=3"}, "true")
		if err == nil {
			t.Errorf("ssh to cut h2 succeeded")
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("ssh to cut h2 took %v, want bounded by ConnectTimeout=3", d)
		}
		if !w.Host(1).Cut {
			t.Errorf("inventory does not mark h2 cut")
		}
		w.MustRun(2, "true") // others unaffected
		w.Heal(1)
		waitFor(t, 15*time.Second, func() error {
			_, _, err := w.RunSSH(context.Background(), 1, []string{"-o", "ConnectTimeout=3"}, "true")
			return err
		})
	})

	t.Run("power off and on", func(t *testing.T) {
		w := w.WithT(t)
		// h3 gets its own pair of units (h1's went with the wipe).
		w.MustRun(2, `set -e
for u in `+enabledUnit+` `+startedUnit+`; do
printf '[Service]\nExecStart=/bin/sleep infinity\n[Install]\nWantedBy=multi-user.target\n' >/etc/systemd/system/$u
done
systemctl daemon-reload
systemctl enable --now `+enabledUnit+`
systemctl start `+startedUnit)
		// (Type=simple: start returns once the unit's process is forked, maybe
		// before it execs sleep; trixie's systemd-executor widens that gap)
		waitFor(t, 10*time.Second, func() error {
			if procs := w.Procs(2); countSub(procs, "sleep infinity") != 2 {
				return fmt.Errorf("Procs(h3) lists %d sleep processes, want 2: %q", countSub(procs, "sleep infinity"), procs)
			}
			return nil
		})
		if n := countSub(w.Procs(1), "sleep infinity"); n != 0 {
			t.Errorf("Procs(h2) lists h3's processes: %q", w.Procs(1))
		}
		oldBoot := w.MustRun(2, "cat /proc/sys/kernel/random/boot_id")
		w.Stop(2)
		if h := w.Host(2); h.PID != 0 {
			t.Errorf("inventory PID of stopped h3: %d, want 0", h.PID)
		}
		if procs := w.Procs(2); len(procs) != 0 {
			t.Errorf("processes left in stopped h3: %q", procs)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if _, _, err := w.RunSSH(ctx, 2, []string{"-o", "ConnectTimeout=3"}, "true"); err == nil {
			t.Errorf("ssh to stopped h3 succeeded")
		}
		w.MustRun(1, "true") // others unaffected
		w.Start(2)
		if got := w.MustRun(2, "cat /proc/sys/kernel/random/boot_id"); got == oldBoot {
			t.Errorf("boot id unchanged: h3 was not powered off")
		}
		unitsAfterBoot(t, w, 2, enabledUnit, startedUnit, "power on")
		checkCgroup(t, w.Host(2))
	})

	t.Run("up is idempotent and adds hosts", func(t *testing.T) {
		w := w.WithT(t)
		pids := map[string]int{}
		for _, h := range w.Hosts() {
			pids[h.Name] = h.PID
		}
		w.Scale(3)
		for _, h := range w.Hosts() {
			if h.PID != pids[h.Name] {
				t.Errorf("up 3 on a healthy world restarted %s (pid %d -> %d)", h.Name, pids[h.Name], h.PID)
			}
		}
		// A host keeps its release: asking for another fails in one line
		// and touches nothing.
		out, err := hostsCmd(t, w.Name(), "up", "3", "--release", hostenv.Bookworm).CombinedOutput()
		if lines := strings.Split(strings.TrimSpace(string(out)), "\n"); err == nil || len(lines) != 1 || !strings.Contains(lines[0], "keeps its release") {
			t.Errorf("up 3 --release bookworm on a world whose h1 is trixie: err=%v, want one line saying a host keeps its release:\n%s", err, out)
		}
		w.Refresh()
		for _, h := range w.Hosts() {
			if h.PID != pids[h.Name] {
				t.Errorf("a refused up restarted %s (pid %d -> %d)", h.Name, pids[h.Name], h.PID)
			}
		}
		w.Scale(4)
		if n := len(w.Hosts()); n != 4 {
			t.Fatalf("after up 4: %d hosts", n)
		}
		for _, h := range w.Hosts()[:3] {
			if h.PID != pids[h.Name] {
				t.Errorf("up 4 restarted %s", h.Name)
			}
		}
		if got := w.MustRun(3, "hostname"); got != "h4" {
			t.Errorf("h4 hostname %q", got)
		}
		// A host past the end of Options.Releases gets its last entry.
		if got := w.MustRun(3, ". /etc/os-release; echo $VERSION_CODENAME"); got != releases[len(releases)-1] || w.Host(3).Release != got {
			t.Errorf("h4 runs %q (inventory %q), want %s", got, w.Host(3).Release, releases[len(releases)-1])
		}
		checkCgroup(t, w.Host(3))
	})

	// Tear down explicitly and check nothing of the world is left.
	final := w.Inventory()
	if err := w.Down(); err != nil {
		t.Fatalf("down: %v", err)
	}
	t.Run("down leaves nothing", func(t *testing.T) {
		w := w.WithT(t)
		hostenv.AssertGone(t, final)
		after := snapshotMachine(t)
		for _, k := range guardedSysctls {
			if before.sysctls[k] != after.sysctls[k] {
				t.Errorf("sysctl %s: %q before, %q after", k, before.sysctls[k], after.sysctls[k])
			}
		}
		for root, b := range before.rootCgroups {
			a := after.rootCgroups[root]
			if strings.Join(withoutOtherWorlds(b, final.Tag), " ") != strings.Join(withoutOtherWorlds(a, final.Tag), " ") {
				t.Errorf("root cgroups of %s changed:\nbefore %v\nafter  %v", root, b, a)
			}
		}
		if err := w.Down(); err != nil {
			t.Errorf("second down: %v", err)
		}
	})
}

// TestDownIdempotent: down of a world that never existed, and twice, succeeds.
func TestDownIdempotent(t *testing.T) {
	mustPrereqs(t)
	name := fmt.Sprintf("never-up-%d", os.Getpid())
	for i := 0; i < 2; i++ {
		out, err := hostsCmd(t, name, "down").CombinedOutput()
		if err != nil {
			t.Fatalf("down #%d: %v\n%s", i+1, err, out)
		}
	}
	if _, err := os.Stat("/run/kpssh-world/" + name); !os.IsNotExist(err) {
		t.Errorf("down left a state dir: %v", err)
	}
}

// TestClearErrors: failures are one clear line, not a shell trace.
func TestClearErrors(t *testing.T) {
	mustPrereqs(t)
	t.Run("missing systemd-nspawn names the package", func(t *testing.T) {
		// A PATH with everything from /usr/bin and /bin except systemd-nspawn.
		dir := t.TempDir()
		for _, src := range []string{"/usr/bin", "/bin"} {
			ents, err := os.ReadDir(src)
			if err != nil {
				continue
			}
			for _, e := range ents {
				if e.Name() == "systemd-nspawn" {
					continue
				}
				_ = os.Symlink(filepath.Join(src, e.Name()), filepath.Join(dir, e.Name()))
			}
		}
		name := fmt.Sprintf("nonspawn-%d", os.Getpid())
		c := hostsCmd(t, name, "up", "1")
		c.Env = append(c.Env, "PATH="+dir)
		out, err := c.CombinedOutput()
		if err == nil {
			t.Fatalf("up without systemd-nspawn succeeded:\n%s", out)
		}
		if lines := strings.Split(strings.TrimSpace(string(out)), "\n"); len(lines) != 1 || !strings.Contains(lines[0], "systemd-container") {
			t.Errorf("want one line naming package systemd-container, got:\n%s", out)
		}
		if _, err := os.Stat("/run/kpssh-world/" + name); !os.IsNotExist(err) {
			t.Errorf("failed up left a state dir: %v", err)
		}
	})
	t.Run("not root says so", func(t *testing.T) {
		setpriv, err := exec.LookPath("setpriv")
		if err != nil {
			t.Fatalf("setpriv (util-linux) missing: %v", err)
		}
		script := hostsScript(t)
		c := exec.Command(setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "bash", script, "up", "1")
		c.Env = []string{"PATH=/usr/bin:/bin", "KPSSH_WORLD=notroot"}
		out, err := c.CombinedOutput()
		if err == nil {
			t.Fatalf("up as nobody succeeded:\n%s", out)
		}
		if lines := strings.Split(strings.TrimSpace(string(out)), "\n"); len(lines) != 1 || !strings.Contains(lines[0], "root") {
			t.Errorf("want one line saying root is needed, got:\n%s", out)
		}
	})
	t.Run("unknown release", func(t *testing.T) {
		name := fmt.Sprintf("badrelease-%d", os.Getpid())
		out, err := hostsCmd(t, name, "up", "1", "--release", "hamm").CombinedOutput()
		if lines := strings.Split(strings.TrimSpace(string(out)), "\n"); err == nil || len(lines) != 1 || !strings.Contains(lines[0], "hamm") {
			t.Errorf("up --release hamm: err=%v, want a one-line failure naming the release:\n%s", err, out)
		}
		if _, err := os.Stat("/run/kpssh-world/" + name); !os.IsNotExist(err) {
			t.Errorf("failed up left a state dir: %v", err)
		}
	})
	t.Run("bad world name", func(t *testing.T) {
		out, err := hostsCmd(t, "bad/name", "up", "1").CombinedOutput()
		if err == nil || strings.Count(strings.TrimSpace(string(out)), "\n") != 0 {
			t.Errorf("want a one-line failure, got err=%v:\n%s", err, out)
		}
	})
}

func TestPrerequisiteMessages(t *testing.T) {
	// Missing tools fail with the Debian package to install.
	err := hostenv.CheckPrerequisitesWith(1000, func(cmd string) (string, error) {
		if cmd == "systemd-nspawn" || cmd == "debootstrap" {
			return "", errors.New("not found")
		}
		return "/usr/bin/" + cmd, nil
	})
	if err == nil {
		t.Fatal("no error for missing tools and non-root")
	}
	for _, want := range []string{"root", "apt-get install systemd-container", "apt-get install debootstrap"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if err := hostenv.CheckPrerequisitesWith(0, func(cmd string) (string, error) { return "/x/" + cmd, nil }); err != nil {
		t.Errorf("all present: %v", err)
	}
}

// ---------------------------------------------------------------- helpers --

type machineState struct {
	sysctls     map[string]string
	rootCgroups map[string][]string
}

func snapshotMachine(t *testing.T) machineState {
	t.Helper()
	s := machineState{sysctls: map[string]string{}, rootCgroups: map[string][]string{}}
	for _, k := range guardedSysctls {
		s.sysctls[k] = sysctl(t, k)
	}
	for _, root := range cgroupRoots(t) {
		ents, err := os.ReadDir(root)
		if err != nil {
			t.Fatal(err)
		}
		var dirs []string
		for _, e := range ents {
			if e.IsDir() {
				dirs = append(dirs, e.Name())
			}
		}
		sort.Strings(dirs)
		s.rootCgroups[root] = dirs
	}
	return s
}

// withoutOtherWorlds drops cgroup dirs of other worlds and of container
// builds (tests run in parallel).
func withoutOtherWorlds(dirs []string, tag string) []string {
	var out []string
	for _, d := range dirs {
		if strings.HasPrefix(d, "kpssh-") && d != "kpssh-"+tag {
			continue
		}
		if strings.HasPrefix(d, "buildah-") { // a container build beside the test (the runner image's)
			continue
		}
		out = append(out, d)
	}
	return out
}

func sysctl(t *testing.T, key string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/sys/" + strings.ReplaceAll(key, ".", "/"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func cgroupRoots(t *testing.T) []string {
	t.Helper()
	roots, err := hostenv.CgroupRoots()
	if err != nil {
		t.Fatal(err)
	}
	return roots
}

func readLines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

func cgroupPath(line string) string {
	parts := strings.SplitN(line, ":", 3)
	if len(parts) != 3 {
		return ""
	}
	return parts[2]
}

func checkCgroup(t *testing.T, h hostenv.Host) {
	t.Helper()
	for _, l := range readLines(t, fmt.Sprintf("/proc/%d/cgroup", h.PID)) {
		if p := cgroupPath(l); p != h.Cgroup && !strings.HasPrefix(p, h.Cgroup+"/") {
			t.Errorf("%s: PID 1 cgroup line %q not under %s", h.Name, l, h.Cgroup)
		}
	}
}

// fingerprint computes "SHA256:<base64 without padding>" of an OpenSSH public key.
func fingerprint(t *testing.T, pub string) string {
	t.Helper()
	f := strings.Fields(pub)
	if len(f) < 2 {
		t.Fatalf("bad public key %q", pub)
	}
	blob, err := base64.StdEncoding.DecodeString(f[1])
	if err != nil {
		t.Fatalf("bad public key %q: %v", pub, err)
	}
	sum := sha256.Sum256(blob)
	return "SHA256:" + base64.RawStdEncoding.EncodeToString(sum[:])
}

func unitState(t *testing.T, w *hostenv.World, i int, unit string) string {
	t.Helper()
	out, _, err := w.Run(i, "systemctl is-active "+unit+" || true")
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(out)
}

// unitsAfterBoot: after a boot of host i the enabled unit comes back (maybe
// still starting), the started-only one does not.
func unitsAfterBoot(t *testing.T, w *hostenv.World, i int, enabled, started, what string) {
	t.Helper()
	waitFor(t, 20*time.Second, func() error {
		if s := unitState(t, w, i, enabled); s != "active" {
			return fmt.Errorf("%s is %q after %s, want active", enabled, s, what)
		}
		return nil
	})
	if s := unitState(t, w, i, started); s != "inactive" {
		t.Errorf("%s is %q after %s, want inactive", started, s, what)
	}
}

func countSub(list []string, sub string) int {
	n := 0
	for _, s := range list {
		if strings.Contains(s, sub) {
			n++
		}
	}
	return n
}

func waitFor(t *testing.T, d time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %v", d, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// exitStderr is err with the stderr of a failed exec.Cmd.Output.
func exitStderr(err error) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return fmt.Sprintf("%v: %s", err, strings.TrimSpace(string(ee.Stderr)))
	}
	return fmt.Sprint(err)
}

func mustPrereqs(t *testing.T) {
	t.Helper()
	if err := hostenv.CheckPrerequisites(); err != nil {
		t.Fatalf("hostenv: %v", err)
	}
}

func hostsScript(t *testing.T) string {
	t.Helper()
	root, err := hostenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "hack", "hosts.sh")
}

func hostsCmd(t *testing.T, world string, args ...string) *exec.Cmd {
	t.Helper()
	c := exec.Command("bash", append([]string{hostsScript(t)}, args...)...)
	c.Env = append(os.Environ(), "KPSSH_WORLD="+world)
	return c
}

// TestWorldsAreIsolated: two worlds coexist (while TestWorld runs a third)
// with their own bridge, subnet and names, and cannot reach each other.
func TestWorldsAreIsolated(t *testing.T) {
	t.Parallel()
	a := hostenv.Up(t, 1)
	b := hostenv.Up(t, 1)
	ia, ib := a.Inventory(), b.Inventory()
	if ia.Tag == ib.Tag || ia.Bridge == ib.Bridge || ia.BridgeAddress == ib.BridgeAddress || ia.StateDir == ib.StateDir {
		t.Fatalf("worlds share resources:\n%+v\n%+v", ia, ib)
	}
	ha, hb := a.Host(0), b.Host(0)
	if ha.Machine == hb.Machine || ha.Netns == hb.Netns || ha.Veth == hb.Veth || ha.MAC == hb.MAC || ha.Address == hb.Address {
		t.Errorf("hosts of two worlds share names/addresses:\n%+v\n%+v", ha, hb)
	}
	if ha.Name != "h1" || hb.Name != "h1" {
		t.Errorf("host names %q %q, want h1 in both", ha.Name, hb.Name)
	}
	// a's host has no route to b's subnet.
	out, _, err := a.Run(0, fmt.Sprintf(`python3 -c 'import socket
try:
    socket.create_connection(("%s", 22), 3); print("reached")
except OSError as e:
    print("unreachable")'`, hb.Address))
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(out) != "unreachable" {
		t.Errorf("host of world A reached host of world B: %q", out)
	}
	// Each world's key is only accepted by its own hosts.
	bad := a.SSHArgs(0)
	for j := range bad {
		if bad[j] == ia.ClientKey {
			bad[j] = ib.ClientKey
		}
	}
	if out, err := exec.Command("ssh", append(bad, "true")...).CombinedOutput(); err == nil {
		t.Errorf("world B's key logged in to world A's host: %s", out)
	}
	if got := b.MustRun(0, "hostname"); got != "h1" {
		t.Errorf("world B h1 hostname %q", got)
	}
	for _, w := range []*hostenv.World{a, b} {
		inv := w.Inventory()
		if err := w.Down(); err != nil {
			t.Fatal(err)
		}
		hostenv.AssertGone(t, inv)
	}
}

// A reboot inside a host (what kpssh's default reboot phase does) ends its
// systemd-nspawn with 133; the launcher boots it again on the same disk: a
// new boot id, sshd back, the inventory's PID 1 the new one, and stop/start
// still reach the running nspawn.
func TestRebootInsideHost(t *testing.T) {
	t.Parallel()
	w := hostenv.Up(t, 1)
	bootID := func() string {
		out, _, err := w.Run(0, "cat /proc/sys/kernel/random/boot_id")
		if err != nil {
			return ""
		}
		return strings.TrimSpace(out)
	}
	before, pid := bootID(), w.Host(0).PID
	if before == "" || pid == 0 {
		t.Fatalf("boot id %q, pid %d", before, pid)
	}
	w.MustRun(0, "touch /root/kept && systemd-run --quiet --collect --on-active=1 systemctl reboot")
	deadline := time.Now().Add(2 * time.Minute)
	var after string
	for time.Now().Before(deadline) {
		if after = bootID(); after != "" && after != before {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if after == "" || after == before {
		t.Fatalf("host did not come back from an in-container reboot (boot id %q → %q)", before, after)
	}
	w.MustRun(0, "test -f /root/kept") // same disk
	w.Refresh()
	if p := w.Host(0).PID; p == 0 || p == pid {
		t.Fatalf("inventory PID 1 %d after the reboot (before %d)", p, pid)
	}
	w.Stop(0)
	if _, _, err := w.Run(0, "true"); err == nil {
		t.Fatal("host still answers after stop")
	}
	w.Start(0)
	if got := bootID(); got == "" || got == after {
		t.Fatalf("boot id after stop/start %q (was %q)", got, after)
	}
}
