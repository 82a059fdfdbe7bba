package hostenv

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// CgroupRoots returns every cgroup hierarchy's mount point (the v1
// controllers, name=systemd and the unified one), sorted.
func CgroupRoots() ([]string, error) {
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return nil, err
	}
	var roots []string
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) > 2 && (f[2] == "cgroup" || f[2] == "cgroup2") {
			roots = append(roots, f[1])
		}
	}
	if len(roots) == 0 {
		return nil, errors.New("no cgroup hierarchies mounted")
	}
	sort.Strings(roots)
	return roots, nil
}

// processIsOurs: pid runs in a cgroup of some world (a reused pid does not).
func processIsOurs(pid int, machine string) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	return err == nil && strings.Contains(string(b), "/kpssh-") && strings.Contains(machine, "kpssh-")
}

// AssertGone checks that no netns, cgroup, link, mount, process or state of
// the world inv (its inventory while it was up) is left on the machine.
func AssertGone(t testing.TB, inv Inventory) {
	t.Helper()
	if inv.Tag == "" {
		t.Fatal("inventory has no tag")
	}
	// netns
	if ents, err := os.ReadDir("/run/netns"); err == nil {
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), "kpssh-"+inv.Tag) {
				t.Errorf("netns %s left", e.Name())
			}
		}
	}
	out, _ := exec.Command("ip", "netns", "list").Output()
	if strings.Contains(string(out), "kpssh-"+inv.Tag) {
		t.Errorf("ip netns list still shows the world:\n%s", out)
	}
	// links: bridge and veths
	ents, err := os.ReadDir("/sys/class/net")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.Name() == inv.Bridge || strings.HasPrefix(e.Name(), "kpv"+inv.Tag) {
			t.Errorf("link %s left", e.Name())
		}
	}
	for _, h := range inv.Hosts {
		if _, err := net.InterfaceByName(h.Veth); err == nil {
			t.Errorf("veth %s left", h.Veth)
		}
	}
	// addresses: nobody holds the bridge address any more
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if strings.HasPrefix(a.String(), inv.BridgeAddress+"/") {
			t.Errorf("bridge address %s still assigned", a)
		}
	}
	// cgroups, in every hierarchy
	roots, err := CgroupRoots()
	if err != nil {
		t.Fatal(err)
	}
	for _, root := range roots {
		if _, err := os.Stat(filepath.Join(root, inv.Cgroup)); !os.IsNotExist(err) {
			t.Errorf("cgroup %s%s left (%v)", root, inv.Cgroup, err)
		}
	}
	// mounts and processes, in every mount namespace
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		pid := filepath.Base(p)
		if mi, err := os.ReadFile(p + "/mountinfo"); err == nil {
			if strings.Contains(string(mi), inv.StateDir+"/") || strings.Contains(string(mi), "/kpssh-"+inv.Tag+"-h") {
				t.Errorf("pid %s still has a mount of the world (%s, netns kpssh-%s-*)", pid, inv.StateDir, inv.Tag)
			}
		}
		if cg, err := os.ReadFile(p + "/cgroup"); err == nil && strings.Contains(string(cg), inv.Cgroup+"/") {
			t.Errorf("pid %s is still in the world's cgroup:\n%s", pid, cg)
		}
		if cl, err := os.ReadFile(p + "/cmdline"); err == nil {
			s := strings.ReplaceAll(string(cl), "\x00", " ")
			if strings.Contains(s, "kpssh-"+inv.Tag+"-h") || strings.Contains(s, inv.StateDir) {
				t.Errorf("process %s of the world left: %s", pid, s)
			}
		}
	}
	for _, h := range inv.Hosts {
		if h.PID > 0 {
			if _, err := os.Stat(fmt.Sprintf("/proc/%d", h.PID)); err == nil && processIsOurs(h.PID, h.Machine) {
				t.Errorf("%s PID 1 %d still alive", h.Name, h.PID)
			}
		}
		if _, err := os.Stat("/run/systemd/nspawn/propagate/" + h.Machine); err == nil {
			t.Errorf("nspawn propagate dir of %s left", h.Machine)
		}
	}
	// the hosts' disks: no loop device still backed by a file of the world
	backing, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range backing {
		if b, err := os.ReadFile(f); err == nil && strings.HasPrefix(string(b), inv.StateDir+"/") {
			t.Errorf("loop device %s still attached to %s", filepath.Base(filepath.Dir(filepath.Dir(f))), strings.TrimSpace(string(b)))
		}
	}
	// state
	if _, err := os.Stat(inv.StateDir); !os.IsNotExist(err) {
		t.Errorf("state dir %s left (%v)", inv.StateDir, err)
	}
}
