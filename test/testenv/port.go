package testenv

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
)

var (
	portsMu sync.Mutex
	ports   = map[int]bool{} // handed out by this process
)

// FreePort is a TCP port free on every interface now, for a server a test
// starts later (a controller's metrics or health address). It is drawn
// below the kernel's ephemeral range: a port the kernel picked (":0") is
// free only until the kernel hands it to someone's outgoing connection
// (the tests' own, to the apiserver or over SSH), and then the server
// fails with "address already in use" (CI saw it for a metrics port).
func FreePort() (string, error) {
	lo := ephemeralLow()
	const first = 10000
	if lo-first < 1000 {
		return kernelPort()
	}
	portsMu.Lock()
	defer portsMu.Unlock()
	for range 200 {
		p := first + rand.IntN(lo-first)
		if ports[p] {
			continue
		}
		l, err := net.Listen("tcp", ":"+strconv.Itoa(p))
		if err != nil {
			continue
		}
		l.Close()
		ports[p] = true
		return strconv.Itoa(p), nil
	}
	return "", fmt.Errorf("no free TCP port in %d–%d after 200 tries", first, lo-1)
}

// MustFreePort is FreePort for a test: it fails tb when there is none.
func MustFreePort(tb testing.TB) string {
	tb.Helper()
	p, err := FreePort()
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// ephemeralLow is the first port of net.ipv4.ip_local_port_range (Linux's
// default 32768 when it cannot be read).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 32768
	}
	lo, err := strconv.Atoi(f[0])
	if err != nil {
		return 32768
	}
	return lo
}

// kernelPort is the kernel's pick, when the ephemeral range leaves no room
// below it.
func kernelPort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port), nil
}
