package probe_test

import (
	"context"
	"fmt"
	"io"
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
	f.Fuzz(func(t *testing.T, s string) {
		f, err := probe.Parse(s)
		if err == nil && (f.CPU <= 0 || f.MemoryKiB <= 0 || f.Arch == "") {
			t.Fatalf("accepted nonsense %+v from %q", f, s)
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
