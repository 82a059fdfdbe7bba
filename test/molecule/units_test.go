package molecule_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dklesev/kpssh/internal/engine"
	"github.com/dklesev/kpssh/test/hostenv"
)

// TestUnitsModule: dklesev.kpssh.units through the phase engine on a real
// host of each release (systemd 252 and 257). Enabling and disabling do not
// reload systemd (a reload costs ≈ 0.25 s of every join and leave; starting
// and stopping need none), yet a unit file changed on disk since systemd
// loaded it is reloaded before the unit starts, without the caller saying
// so (NeedDaemonReload): the new ExecStart is what runs. Reloads are
// counted in PID 1's journal (its "Reloading…" lines). Then
// dklesev.kpssh.files writing and starting a unit in one round trip.
func TestUnitsModule(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: boots test hosts and runs the module through ansible-playbook")
	}
	w := hostenv.UpWith(t, 2, hostenv.Options{Releases: []string{hostenv.Bookworm, hostenv.Trixie}})
	for i, h := range w.Hosts() {
		t.Run(h.Release, func(t *testing.T) {
			w := w.WithT(t)
			e, conn, _ := roleEngine(t, w, i)
			loads := func() string {
				return w.MustRun(i, "journalctl -q -o cat _PID=1 | grep -c '^Reloading' || true")
			}
			unit := func(sleep int) {
				w.MustRun(i, fmt.Sprintf(`printf '[Service]\nExecStart=/bin/sleep %d\n[Install]\nWantedBy=multi-user.target\n' >/etc/systemd/system/kpssh-units.service`, sleep))
			}
			runTasks := func(what, tasks string) int {
				t.Helper()
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
				defer cancel()
				r := e.Run(ctx, engine.Request{Phase: engine.PhaseInstall, Conn: conn, Source: engine.Source{Tasks: tasks},
					Context: engine.Context{HostAddress: h.Address, NodeAddress: h.Address}, Timeout: 4 * time.Minute})
				if r.Outcome != engine.Succeeded {
					t.Fatalf("%s: %s (task %q): %s", what, r.Outcome, r.FailedTask, r.Message)
				}
				return len(r.Changes)
			}
			run := func(enabled bool, state string) int {
				t.Helper()
				return runTasks(fmt.Sprintf("units enabled=%t state=%s", enabled, state), fmt.Sprintf(`- name: Converge the unit
  dklesev.kpssh.units:
    units:
      - {name: kpssh-units.service, enabled: %t, state: %s}
    wait_active: %d
`, enabled, state, map[bool]int{true: 10, false: 0}[state != "stopped"]))
			}
			// A second converge changes nothing: the enablement is read from
			// disk, not systemd's cached UnitFileState (stale after an enable
			// without reload on systemd 257).
			again := func(enabled bool, state string) {
				t.Helper()
				if n := run(enabled, state); n != 0 {
					t.Errorf("a second converge enabled=%t state=%s changed %d task(s), want 0", enabled, state, n)
				}
			}
			state := func() string {
				return w.MustRun(i, "echo $(systemctl is-enabled kpssh-units.service) $(systemctl is-active kpssh-units.service) $(systemctl show -p ExecStart --value kpssh-units.service | grep -o 'sleep [0-9][0-9]*' | head -n 1)")
			}

			unit(1001)
			w.MustRun(i, "systemctl daemon-reload")
			before := loads()
			run(true, "started")
			if got := state(); got != "enabled active sleep 1001" {
				t.Errorf("after enable + start: %q, want enabled, active, sleep 1001", got)
			}
			if got := loads(); got != before {
				t.Errorf("enable + start reloaded systemd (%s reloads before, %s after)", before, got)
			}
			again(true, "started")

			unit(1002) // changed on disk, systemd not told
			if got := w.MustRun(i, "systemctl show -p NeedDaemonReload --value kpssh-units.service"); got != "yes" {
				t.Fatalf("NeedDaemonReload after editing the unit file: %q, want yes", got)
			}
			run(true, "restarted")
			if got := state(); got != "enabled active sleep 1002" {
				t.Errorf("after the edit and a restart: %q, want enabled, active, sleep 1002 (the new ExecStart)", got)
			}
			if pid := w.MustRun(i, "pgrep -fx '/bin/sleep 1002' || true"); pid == "" {
				t.Errorf("no /bin/sleep 1002 running after the restart: %s", w.MustRun(i, "pgrep -af sleep || true"))
			}
			reloaded := loads()
			if reloaded == before {
				t.Errorf("a unit file changed on disk was not reloaded before the restart")
			}

			run(false, "stopped")
			if got := state(); !strings.HasPrefix(got, "disabled inactive") {
				t.Errorf("after disable + stop: %q, want disabled, inactive", got)
			}
			if got := loads(); got != reloaded {
				t.Errorf("disable + stop reloaded systemd (%s reloads before, %s after)", reloaded, got)
			}
			again(false, "stopped")

			// A unit whose process exits non-zero on SIGTERM (as kubelet can)
			// is left "failed" by systemctl stop; stopped means inactive, in
			// the same round trip.
			w.MustRun(i, `printf '#!/bin/sh\ntrap "exit 3" TERM\nwhile :; do sleep 0.2; done\n' >/usr/local/bin/kpssh-units-trap && chmod 0755 /usr/local/bin/kpssh-units-trap && printf '[Service]\nExecStart=/usr/local/bin/kpssh-units-trap\n' >/etc/systemd/system/kpssh-units.service && systemctl daemon-reload && systemctl start kpssh-units.service`)
			run(false, "stopped")
			if got := w.MustRun(i, "systemctl is-active kpssh-units.service || true"); got != "inactive" {
				t.Errorf("a unit that exits 3 on SIGTERM, after stop: %q, want inactive (not failed)", got)
			}

			// dklesev.kpssh.files writes, then starts in the same round
			// trip (the joins' write-then-start): a unit file it wrote is
			// loaded, restart_on_change restarts the unit when a path it
			// wrote changed, but not for a path of restart_ignore.
			write := func(sleep int, conf, ignored string) int {
				t.Helper()
				return runTasks(fmt.Sprintf("files sleep=%d conf=%s ignored=%s", sleep, conf, ignored), fmt.Sprintf(`- name: Write and start
  dklesev.kpssh.files:
    files:
      - {path: /etc/systemd/system/kpssh-write.service, mode: "0644", content: "[Service]\nExecStart=/bin/sleep %d\n[Install]\nWantedBy=multi-user.target\n"}
      - {path: /etc/kpssh-write/conf, mode: "0644", content: %q}
      - {path: /etc/kpssh-write/ignored, mode: "0644", content: %q}
    units:
      - name: kpssh-write.service
        enabled: true
        state: started
        restart_on_change: true
        restart_ignore: [/etc/kpssh-write/ignored]
    wait_active: 10
`, sleep, conf, ignored))
			}
			written := func() (string, string) {
				t.Helper()
				out := w.MustRun(i, "echo $(systemctl is-enabled kpssh-write.service) $(systemctl is-active kpssh-write.service) $(systemctl show -p ExecStart --value kpssh-write.service | grep -o 'sleep [0-9][0-9]*' | head -n 1); systemctl show -p MainPID --value kpssh-write.service")
				state, pid, _ := strings.Cut(out, "\n")
				return state, pid
			}
			if n := write(2001, "a", "x"); n != 1 {
				t.Errorf("the first write and start changed %d task(s), want 1", n)
			}
			st, pid := written()
			if st != "enabled active sleep 2001" || pid == "0" || pid == "" {
				t.Fatalf("after the first write and start: %q pid %q, want enabled, active, sleep 2001, a pid", st, pid)
			}
			if n := write(2001, "a", "x"); n != 0 {
				t.Errorf("a second write and start changed %d task(s), want 0", n)
			}
			if _, p := written(); p != pid {
				t.Errorf("an unchanged write restarted the unit (pid %s, then %s)", pid, p)
			}
			write(2001, "a", "y")
			if _, p := written(); p != pid {
				t.Errorf("a change of a restart_ignore path restarted the unit (pid %s, then %s)", pid, p)
			}
			write(2001, "b", "y")
			st, p := written()
			if p == pid || st != "enabled active sleep 2001" {
				t.Errorf("after a change of its configuration: %q pid %s (before %s), want restarted, active", st, p, pid)
			}
			write(2002, "b", "y")
			if st, _ := written(); st != "enabled active sleep 2002" {
				t.Errorf("after its unit file changed: %q, want the new ExecStart (sleep 2002) running", st)
			}
			w.MustRun(i, "systemctl disable --now kpssh-write.service; rm -rf /etc/systemd/system/kpssh-write.service /etc/kpssh-write; systemctl daemon-reload")
		})
	}
}
