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
// counted in PID 1's journal (its "Reloading…" lines).
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
			run := func(enabled bool, state string) int {
				t.Helper()
				tasks := fmt.Sprintf(`- name: Converge the unit
  dklesev.kpssh.units:
    units:
      - {name: kpssh-units.service, enabled: %t, state: %s}
    wait_active: %d
`, enabled, state, map[bool]int{true: 10, false: 0}[state != "stopped"])
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
				defer cancel()
				r := e.Run(ctx, engine.Request{Phase: engine.PhaseInstall, Conn: conn, Source: engine.Source{Tasks: tasks},
					Context: engine.Context{HostAddress: h.Address, NodeAddress: h.Address}, Timeout: 4 * time.Minute})
				if r.Outcome != engine.Succeeded {
					t.Fatalf("units enabled=%t state=%s: %s (task %q): %s", enabled, state, r.Outcome, r.FailedTask, r.Message)
				}
				return len(r.Changes)
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
		})
	}
}
