package molecule_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/dklesev/kpssh/internal/engine"
	"github.com/dklesev/kpssh/test/hostenv"
)

// TestHostStateProbe: dklesev.kpssh.host_state answers from one POSIX sh
// run (its action plugin: no Python on the host, the join's probe is on
// every warm join's critical path) exactly what its module answers, on a
// real host of each release, as root and through sudo, under the phase
// lock; and a host whose sh lacks base64 gets the same answers from the
// module. The tasks assert every value against what the test put there.
func TestHostStateProbe(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: boots test hosts and runs the plugin through ansible-playbook")
	}
	w := hostenv.UpWith(t, 2, hostenv.Options{Releases: []string{hostenv.Bookworm, hostenv.Trixie}})
	const tasks = `- name: Learn the host's state
  dklesev.kpssh.host_state:
    read: [/etc/kpssh-probe/text, /etc/kpssh-probe/missing, "/etc/kpssh-probe/odd name's", /etc/kpssh-probe]
    exists: [/etc/kpssh-probe/text, /etc/kpssh-probe/missing, /etc/kpssh-probe/dangling]
    commands:
      fails: [sh, -c, "echo out; echo err >&2; exit 3"]
      missing: [/no/such/binary, --version]
      quiet: ["true"]
    units: [kpssh-probe-none.service, systemd-journald.service]
  register: probe

- name: The answers are the host's
  ansible.builtin.assert:
    that:
      - probe is not changed
      - probe.read['/etc/kpssh-probe/text'] == 'line one\nline "two" $HOME end\n'
      - probe.read['/etc/kpssh-probe/missing'] is none
      - probe.read["/etc/kpssh-probe/odd name's"] == ''
      - probe.read['/etc/kpssh-probe'] is none
      - probe.exists['/etc/kpssh-probe/text']
      - not probe.exists['/etc/kpssh-probe/missing']
      - probe.exists['/etc/kpssh-probe/dangling']
      - probe.commands.fails.rc == 3
      - probe.commands.fails.stdout == 'out\n'
      - probe.commands.fails.stderr == 'err\n'
      - probe.commands.missing.rc is none
      - probe.commands.quiet.rc == 0
      - probe.commands.quiet.stdout == ''
      - probe.commands.quiet.stderr == ''
      - probe.units['kpssh-probe-none.service'].ActiveState == 'inactive'
      - probe.units['systemd-journald.service'].ActiveState == 'active'
      - probe.units['systemd-journald.service'].UnitFileState == 'static'
      - probe.machine == 'x86_64'
    fail_msg: "{{ probe | to_json }}"
`
	for i, h := range w.Hosts() {
		t.Run(h.Release, func(t *testing.T) {
			w := w.WithT(t)
			w.MustRun(i, `mkdir -p /etc/kpssh-probe && printf 'line one\nline "two" $HOME end\n' >/etc/kpssh-probe/text && : >"/etc/kpssh-probe/odd name's" && ln -sfn /nowhere /etc/kpssh-probe/dangling`)
			e, conn, _ := roleEngine(t, w, i)
			sudo := conn
			sudo.User, sudo.Port = h.AltUser, int32(h.AltPort)
			run := func(what string, c engine.Connection) {
				t.Helper()
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
				defer cancel()
				r := e.Run(ctx, engine.Request{Phase: engine.PhaseJoin, Conn: c, Source: engine.Source{Tasks: tasks},
					Context: engine.Context{HostAddress: h.Address, NodeAddress: h.Address}, Timeout: 2 * time.Minute})
				if r.Outcome != engine.Succeeded {
					t.Errorf("%s: %s (task %q): %s", what, r.Outcome, r.FailedTask, r.Message)
				}
			}
			run("as root", conn)
			run(fmt.Sprintf("as %s through sudo", h.AltUser), sudo)
			// No base64 on the host: the sh probe's report is incomplete and
			// the module answers instead.
			w.MustRun(i, "mv /usr/bin/base64 /usr/bin/base64.kpssh-off")
			run("without base64 (the module)", conn)
			w.MustRun(i, "mv /usr/bin/base64.kpssh-off /usr/bin/base64; rm -rf /etc/kpssh-probe")
		})
	}
}
