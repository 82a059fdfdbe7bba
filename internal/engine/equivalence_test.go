package engine

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// One small profile written three ways — a role (testdata/roles/
// kpssh_eq_role: template, files/, defaults), an inline task list (copy
// with content, shell, command) and a bash script — must leave a host in the
// same state: same files with the same contents, modes and owners, the same
// systemd unit enabled and active after join, and everything gone again
// after leave. Each way runs on its own fresh host of a new world.

const eqUnit = `[Unit]
Description=kpssh equivalence test service
[Service]
ExecStart=/bin/sleep infinity
[Install]
WantedBy=multi-user.target
`

var eqTasks = map[Phase]string{
	PhaseInstall: `- name: state directory
  ansible.builtin.file: {path: /etc/kpssh-eq, state: directory, owner: root, group: root, mode: "0750"}
- name: config
  ansible.builtin.copy:
    dest: /etc/kpssh-eq/config
    owner: root
    group: adm
    mode: "0640"
    content: |
      # kpssh-eq config
      endpoint={{ kpssh.cluster_endpoint }}
      node={{ kpssh.node_name }}
      greeting={{ kpssh_vars.greeting }}
      tricky={{ kpssh_vars.tricky }}
- name: credentials
  ansible.builtin.copy:
    dest: /etc/kpssh-eq/credentials
    content: "{{ kpssh_secrets.apiKey }}\n"
    owner: root
    group: root
    mode: "0600"
  no_log: true
- name: unit file
  ansible.builtin.copy:
    dest: /etc/systemd/system/kpssh-eq.service
    owner: root
    group: root
    mode: "0644"
    content: |
` + indent(eqUnit, "      ") + `- name: systemd sees the unit
  ansible.builtin.command: systemctl daemon-reload
`,
	PhaseJoin: `- name: join token digest
  ansible.builtin.shell:
    cmd: umask 077 && sha256sum | cut -d' ' -f1 > /etc/kpssh-eq/joined
    stdin: "{{ kpssh.bootstrap_token }}"
    stdin_add_newline: false
  no_log: true
- name: enable and start the service
  ansible.builtin.command: systemctl enable --now kpssh-eq.service
`,
	PhaseLeave: `- name: disable and stop the service
  ansible.builtin.command: systemctl disable --now kpssh-eq.service
- name: remove the unit file
  ansible.builtin.file: {path: /etc/systemd/system/kpssh-eq.service, state: absent}
- name: systemd forgets the unit
  ansible.builtin.command: systemctl daemon-reload
- name: remove the state
  ansible.builtin.file: {path: /etc/kpssh-eq, state: absent}
- name: leave marker
  ansible.builtin.copy:
    dest: /var/lib/kpssh-eq.left
    content: "left {{ kpssh.host_address }}\n"
    owner: root
    group: root
    mode: "0644"
`,
}

var eqScripts = map[Phase]string{
	PhaseInstall: `install -d -m 0750 -o root -g root /etc/kpssh-eq
{
  echo '# kpssh-eq config'
  printf 'endpoint=%s\n' "$KPSSH_CLUSTER_ENDPOINT"
  printf 'node=%s\n' "$KPSSH_NODE_NAME"
  printf 'greeting=%s\n' "$KPSSH_VAR_greeting"
  printf 'tricky=%s\n' "$KPSSH_VAR_tricky"
} > /etc/kpssh-eq/config
chown root:adm /etc/kpssh-eq/config
chmod 0640 /etc/kpssh-eq/config
(umask 077; printf '%s\n' "$KPSSH_SECRET_APIKEY" > /etc/kpssh-eq/credentials)
cat > /etc/systemd/system/kpssh-eq.service <<'EOF'
` + eqUnit + `EOF
chmod 0644 /etc/systemd/system/kpssh-eq.service
systemctl daemon-reload
`,
	PhaseJoin: `(umask 077; printf '%s' "$KPSSH_BOOTSTRAP_TOKEN" | sha256sum | cut -d' ' -f1 > /etc/kpssh-eq/joined)
systemctl enable --now kpssh-eq.service
`,
	PhaseLeave: `systemctl disable --now kpssh-eq.service
rm -f /etc/systemd/system/kpssh-eq.service
systemctl daemon-reload
rm -rf /etc/kpssh-eq
printf 'left %s\n' '{{ .HostAddress }}' > /var/lib/kpssh-eq.left
chmod 0644 /var/lib/kpssh-eq.left
`,
}

func indent(s, pre string) string {
	var b strings.Builder
	for _, l := range strings.SplitAfter(s, "\n") {
		if l != "" {
			b.WriteString(pre + l)
		}
	}
	return b.String()
}

// eqSnapshot prints everything the profile may touch: per path its type,
// mode, owner, size and content digest (or symlink target, or directory
// listing), the config's text, and the unit's systemd state.
const eqSnapshot = `for p in /etc/kpssh-eq /etc/kpssh-eq/config /etc/kpssh-eq/credentials /etc/kpssh-eq/joined \
  /etc/systemd/system/kpssh-eq.service /etc/systemd/system/multi-user.target.wants/kpssh-eq.service /var/lib/kpssh-eq.left; do
  if [ -L "$p" ]; then echo "$p symlink -> $(readlink "$p")"
  elif [ -d "$p" ]; then echo "$p dir $(stat -c '%a %U:%G' "$p") [$(ls -A "$p" | tr '\n' ' ')]"
  elif [ -f "$p" ]; then echo "$p file $(stat -c '%a %U:%G %s' "$p") sha256=$(sha256sum < "$p" | cut -d' ' -f1)"
  elif [ -e "$p" ]; then echo "$p other"
  else echo "$p absent"; fi
done
echo '--- config'
cat /etc/kpssh-eq/config 2>/dev/null
echo '--- systemd'
systemctl show kpssh-eq.service -p LoadState -p ActiveState -p SubState -p UnitFileState
echo "is-enabled: $(systemctl is-enabled kpssh-eq.service 2>/dev/null)"
echo "is-active: $(systemctl is-active kpssh-eq.service 2>/dev/null)"
true`

func TestSourcesEquivalent(t *testing.T) {
	if testing.Short() {
		t.Skip("real ansible-playbook against nspawn hosts: skipped under -short")
	}
	start := time.Now()
	w := upWorld(t, 3)
	e := testEngine(t, nil)
	t.Cleanup(func() { _ = e.Close() })

	// One context for all three hosts (the engine connects through Conn;
	// these are data), so the resulting states can be compared verbatim.
	c := Context{
		ClusterEndpoint: "https://10.99.0.1:6443", ClusterCAB64: "Q0EtQlVORExF", BootstrapToken: token,
		NodeName: "node-eq", ProviderID: "kpssh://kpssh-system/eq", HostAddress: "192.0.2.10", NodeAddress: "192.0.2.10",
		NodeLabels: "pool=eq", Taints: "karpenter.sh/unregistered:NoExecute",
		Vars:    map[string]string{"greeting": "hello", "tricky": `it's {{ lookup('pipe', 'id') }} $(id) "q"`},
		Secrets: map[string]string{"apiKey": apiKey},
	}
	ways := []struct {
		name string
		src  func(Phase) Source
	}{
		{"role", func(Phase) Source { return Source{Role: "kpssh_eq_role"} }},
		{"tasks", func(p Phase) Source { return Source{Tasks: eqTasks[p]} }},
		{"script", func(p Phase) Source { return Source{Script: eqScripts[p]} }},
	}
	for _, p := range []Phase{PhaseInstall, PhaseJoin, PhaseLeave} {
		if err := e.ValidateRole("kpssh_eq_role", p); err != nil {
			t.Fatalf("ValidateRole %s: %v", p, err)
		}
		for _, way := range ways[1:] {
			if err := Validate(p, way.src(p)); err != nil {
				t.Fatalf("Validate %s %s: %v", way.name, p, err)
			}
		}
	}

	snapshots := func(stage string) []string {
		out := make([]string, len(ways))
		for i := range ways {
			out[i] = mustRun(t, w, i, eqSnapshot)
		}
		for i := 1; i < len(ways); i++ {
			if out[i] != out[0] {
				t.Errorf("%s: host state after %s differs from %s:\n--- %s\n%s\n--- %s\n%s",
					stage, ways[i].name, ways[0].name, ways[0].name, out[0], ways[i].name, out[i])
			}
		}
		t.Logf("%s: host state (%s):\n%s", stage, ways[0].name, out[0])
		return out
	}
	phases := func(stage string, ps ...Phase) {
		var wg sync.WaitGroup
		for i, way := range ways {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for _, p := range ps {
					t0 := time.Now()
					r := e.Run(context.Background(), Request{Phase: p, Conn: w.conn(i), Source: way.src(p), Context: c, Timeout: 5 * time.Minute})
					if r.Outcome != Succeeded {
						t.Errorf("%s %s on %s: %+v", way.name, p, w.Host(i).Name, r)
						return
					}
					t.Logf("%s %s: %s", way.name, p, time.Since(t0).Round(time.Millisecond))
				}
			}()
		}
		wg.Wait()
		if t.Failed() {
			t.FailNow()
		}
	}

	// fresh hosts: nothing there yet
	before := snapshots("fresh")
	if !strings.Contains(before[0], "/etc/kpssh-eq absent") || !strings.Contains(before[0], "LoadState=not-found") {
		t.Fatalf("the hosts are not fresh:\n%s", before[0])
	}

	phases("install+join", PhaseInstall, PhaseJoin)
	joined := snapshots("install+join")[0]
	// the shared state is the intended one (three ways doing nothing would
	// be equal too)
	for _, want := range []string{
		"/etc/kpssh-eq dir 750 root:root [config credentials joined ]",
		"/etc/kpssh-eq/config file 640 root:adm",
		fmt.Sprintf("/etc/kpssh-eq/credentials file 600 root:root %d sha256=%s", len(apiKey)+1, sha256hex(apiKey+"\n")),
		"/etc/kpssh-eq/joined file 600 root:root 65 sha256=" + sha256hex(sha256hex(token)+"\n"),
		fmt.Sprintf("/etc/systemd/system/kpssh-eq.service file 644 root:root %d sha256=%s", len(eqUnit), sha256hex(eqUnit)),
		"/etc/systemd/system/multi-user.target.wants/kpssh-eq.service symlink -> /etc/systemd/system/kpssh-eq.service",
		"--- config\n# kpssh-eq config\nendpoint=https://10.99.0.1:6443\nnode=node-eq\ngreeting=hello\ntricky=" + c.Vars["tricky"] + "\n--- systemd",
		"ActiveState=active", "SubState=running", "UnitFileState=enabled", "is-enabled: enabled", "is-active: active",
		"/var/lib/kpssh-eq.left absent",
	} {
		if !strings.Contains(joined, want) {
			t.Errorf("after install+join the state lacks %q", want)
		}
	}

	phases("leave", PhaseLeave)
	left := snapshots("leave")[0]
	for _, want := range []string{
		"/etc/kpssh-eq absent", "/etc/systemd/system/kpssh-eq.service absent",
		"/etc/systemd/system/multi-user.target.wants/kpssh-eq.service absent",
		"/var/lib/kpssh-eq.left file 644 root:root 16 sha256=" + sha256hex("left 192.0.2.10\n"),
		"LoadState=not-found", "ActiveState=inactive",
	} {
		if !strings.Contains(left, want) {
			t.Errorf("after leave the state lacks %q", want)
		}
	}
	// and nothing of the service is left running on any host
	for i := range ways {
		if out, _, _ := w.Run(i, "pgrep -fx '/bin/sleep infinity' || true"); strings.TrimSpace(out) != "" {
			t.Errorf("%s: the service's process survives leave: %s", ways[i].name, out)
		}
	}
	t.Logf("TestSourcesEquivalent wall time %s", time.Since(start).Round(time.Millisecond))
}
