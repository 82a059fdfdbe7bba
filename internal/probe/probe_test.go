package probe_test

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"testing"

	"github.com/dklesev/kpssh/internal/probe"
	"github.com/dklesev/kpssh/internal/sshx"
	"github.com/dklesev/kpssh/internal/sshx/sshtest"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      string
		want    probe.Facts
		wantErr string
	}{
		{"x86 idle", "nproc=4\nmemtotal_kb=8000000\narch=x86_64\nkubelet=inactive\n", probe.Facts{CPU: 4, MemoryKiB: 8000000, Arch: "amd64"}, ""},
		{"arm active", "nproc=4\nmemtotal_kb=3906252\narch=aarch64\nkubelet=active\n", probe.Facts{CPU: 4, MemoryKiB: 3906252, Arch: "arm64", KubeletActive: true}, ""},
		{"crlf and noise", "Welcome to host\r\nnproc=2\r\n\r\nmemtotal_kb=1024\r\narch=riscv64\r\nkubelet=\r\n", probe.Facts{CPU: 2, MemoryKiB: 1024, Arch: "riscv64"}, ""},
		{"order and spaces", "  arch=x86_64 \nkubelet=activating\nmemtotal_kb= 2048\nnproc=1", probe.Facts{CPU: 1, MemoryKiB: 2048, Arch: "amd64", KubeletActive: true}, ""},
		{"no systemctl", "nproc=1\nmemtotal_kb=2048\narch=x86_64\nkubelet=\n", probe.Facts{CPU: 1, MemoryKiB: 2048, Arch: "amd64"}, ""},
		{"kubelet unknown", "nproc=1\nmemtotal_kb=2048\narch=x86_64\nkubelet=unknown\n", probe.Facts{CPU: 1, MemoryKiB: 2048, Arch: "amd64"}, ""},
		// power back on: systemd has not reached the kubelet yet, but it will start it
		{"enabled, not started yet", "nproc=1\nmemtotal_kb=2048\narch=x86_64\nkubelet=inactive\nkubelet_enabled=enabled\n", probe.Facts{CPU: 1, MemoryKiB: 2048, Arch: "amd64", KubeletEnabled: true}, ""},
		{"disabled", "nproc=1\nmemtotal_kb=2048\narch=x86_64\nkubelet=inactive\nkubelet_enabled=disabled\n", probe.Facts{CPU: 1, MemoryKiB: 2048, Arch: "amd64"}, ""},
		{"enabled-runtime", "nproc=1\nmemtotal_kb=2048\narch=x86_64\nkubelet=inactive\nkubelet_enabled=enabled-runtime\n", probe.Facts{CPU: 1, MemoryKiB: 2048, Arch: "amd64", KubeletEnabled: true}, ""},
		// SSH_CONNECTION is "client_ip client_port server_ip server_port": the
		// server IP is the host's own address on the connection (issue 17 item 2)
		{"host IP from ssh_connection", "nproc=1\nmemtotal_kb=2048\narch=x86_64\nssh_connection=10.1.0.1 51514 10.1.0.7 22\n", probe.Facts{CPU: 1, MemoryKiB: 2048, Arch: "amd64", NodeIP: "10.1.0.7"}, ""},
		{"host IPv6, canonical", "nproc=1\nmemtotal_kb=2048\narch=x86_64\nssh_connection=2001:db8::1 51514 2001:DB8:0::7 22\n", probe.Facts{CPU: 1, MemoryKiB: 2048, Arch: "amd64", NodeIP: "2001:db8::7"}, ""},
		{"IPv4-mapped IPv6 is the IPv4", "nproc=1\nmemtotal_kb=2048\narch=x86_64\nssh_connection=::ffff:10.1.0.1 1 ::ffff:10.1.0.7 22\n", probe.Facts{CPU: 1, MemoryKiB: 2048, Arch: "amd64", NodeIP: "10.1.0.7"}, ""},
		{"no SSH_CONNECTION (shim, sudo)", "nproc=1\nmemtotal_kb=2048\narch=x86_64\nssh_connection=\n", probe.Facts{CPU: 1, MemoryKiB: 2048, Arch: "amd64"}, ""},
		{"ssh_connection not four fields", "nproc=1\nmemtotal_kb=2048\narch=x86_64\nssh_connection=10.1.0.1 51514 10.1.0.7\n", probe.Facts{CPU: 1, MemoryKiB: 2048, Arch: "amd64"}, ""},
		{"server address not an IP", "nproc=1\nmemtotal_kb=2048\narch=x86_64\nssh_connection=10.1.0.1 51514 host.example 22\n", probe.Facts{CPU: 1, MemoryKiB: 2048, Arch: "amd64"}, ""},
		{"link-local with a zone is no node IP", "nproc=1\nmemtotal_kb=2048\narch=x86_64\nssh_connection=fe80::1%eth0 1 fe80::7%eth0 22\n", probe.Facts{CPU: 1, MemoryKiB: 2048, Arch: "amd64"}, ""},
		{"loopback is no node IP", "nproc=1\nmemtotal_kb=2048\narch=x86_64\nssh_connection=127.0.0.1 1 127.0.0.1 22\n", probe.Facts{CPU: 1, MemoryKiB: 2048, Arch: "amd64"}, ""},
		{"unspecified is no node IP", "nproc=1\nmemtotal_kb=2048\narch=x86_64\nssh_connection=0.0.0.0 1 0.0.0.0 22\n", probe.Facts{CPU: 1, MemoryKiB: 2048, Arch: "amd64"}, ""},
		{"missing nproc", "memtotal_kb=2048\narch=x86_64\n", probe.Facts{}, "nproc missing"},
		{"zero cpus", "nproc=0\nmemtotal_kb=2048\narch=x86_64\n", probe.Facts{}, "nproc"},
		{"negative memory", "nproc=1\nmemtotal_kb=-5\narch=x86_64\n", probe.Facts{}, "memtotal_kb"},
		{"memory not a number", "nproc=1\nmemtotal_kb=lots\narch=x86_64\n", probe.Facts{}, "memtotal_kb"},
		{"empty arch", "nproc=1\nmemtotal_kb=1\narch=\n", probe.Facts{}, "arch"},
		{"empty output", "", probe.Facts{}, "nproc missing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := probe.Parse(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %+v %v, want %+v", got, err, tc.want)
			}
		})
	}
}

func FuzzParse(f *testing.F) {
	f.Add("nproc=4\nmemtotal_kb=8000000\narch=x86_64\nkubelet=inactive\n")
	f.Add("nproc=99999999999999999999\nmemtotal_kb=1\narch=x\n")
	f.Add("=\n==\nnproc==1\n")
	f.Add("nproc=1\nmemtotal_kb=1\narch=x\nssh_connection=1.2.3.4 5 ::ffff:10.0.0.1 22\n")
	f.Fuzz(func(t *testing.T, s string) {
		f, err := probe.Parse(s)
		if err == nil && (f.CPU <= 0 || f.MemoryKiB <= 0 || f.Arch == "") {
			t.Fatalf("accepted nonsense %+v from %q", f, s)
		}
		if ip, perr := netip.ParseAddr(f.NodeIP); f.NodeIP != "" && (perr != nil || ip.String() != f.NodeIP || ip.Zone() != "" || ip.IsLoopback()) {
			t.Fatalf("node IP %q from %q is not a canonical, zoneless, non-loopback IP", f.NodeIP, s)
		}
	})
}

func TestRunOverSSH(t *testing.T) {
	s := sshtest.Start(t, func(cmd string, _ io.Reader, stdout, _ io.Writer) int {
		if raw, _ := probe.Command(false, ""); cmd != raw {
			return 127
		}
		fmt.Fprint(stdout, "nproc=8\nmemtotal_kb=16000000\narch=aarch64\nkubelet=active\n")
		return 0
	})
	res, err := probe.Run(context.Background(), sshx.Target{Address: s.Host, Port: s.Port, PrivateKey: s.ClientKey}, false, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	if res.Facts != (probe.Facts{CPU: 8, MemoryKiB: 16000000, Arch: "arm64", KubeletActive: true}) || res.Fingerprint != sshx.Fingerprint(s.HostKey) {
		t.Fatalf("%+v", res)
	}
}
