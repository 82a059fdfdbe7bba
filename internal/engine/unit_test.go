package engine

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/dklesev/kpssh/internal/sshx/sshtest"
)

// ---------------------------------------------------------------- preamble --

func TestPreambleSortedAndQuoted(t *testing.T) {
	got, err := Preamble(map[string]string{
		"KPSSH_B":   "it's",
		"KPSSH_A":   "plain",
		"KPSSH_C":   "multi\nline $(touch /tmp/x) `x` \"q\" \\",
		"KPSSH_EMP": "",
	})
	if err != nil {
		t.Fatal(err)
	}
	want := "set -euo pipefail\n" +
		"export KPSSH_A='plain'\n" +
		"export KPSSH_B='it'\\''s'\n" +
		"export KPSSH_C='multi\nline $(touch /tmp/x) `x` \"q\" \\'\n" +
		"export KPSSH_EMP=''\n"
	if got != want {
		t.Fatalf("preamble:\n%s\nwant:\n%s", got, want)
	}
}

// The preamble must give bash exactly the values (quoting is where
// injection would happen): run it with the real bash.
func TestPreambleRoundTripsThroughBash(t *testing.T) {
	vals := map[string]string{
		"V1": "it's a 'quote'",
		"V2": "$(echo pwned) ${HOME} `id` ; rm -rf / #",
		"V3": "line1\nline2\r\n\ttab",
		"V4": `back\slash "dq" '' '\''`,
		"V5": "ünïcödé ✓",
		"V6": "",
	}
	pre, err := Preamble(vals)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range vals {
		cmd := exec.Command("bash", "-c", pre+`printf '%s' "$`+name+`"`)
		cmd.Env = []string{"PATH=/usr/bin:/bin"}
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if string(out) != want {
			t.Errorf("%s: bash sees %q, want %q", name, out, want)
		}
	}
}

func TestPreambleRejectsInvalidNames(t *testing.T) {
	for _, name := range []string{"", "1X", "A-B", "A B", "A.B", "A=B", "ä", "A;rm", "$A", "A\n"} {
		if _, err := Preamble(map[string]string{name: "v"}); err == nil {
			t.Errorf("name %q accepted", name)
		}
	}
	if _, err := Preamble(map[string]string{"A": "x\x00y"}); err == nil {
		t.Error("NUL value accepted")
	}
	for _, ok := range []string{"A", "_", "a_b9", "KPSSH_VAR_x"} {
		if _, err := Preamble(map[string]string{ok: "v"}); err != nil {
			t.Errorf("name %q rejected: %v", ok, err)
		}
	}
}

// ----------------------------------------------------------- env contract --

func fullContext() Context {
	return Context{
		ClusterEndpoint: "https://10.0.0.1:6443", ClusterCAB64: "Q0E=", BootstrapToken: "abcdef.0123456789abcdef",
		NodeName: "node-1", ProviderID: "kpssh://pool/h1", HostAddress: "10.1.1.1", NodeAddress: "10.2.2.2",
		NodeLabels: "a=b", Taints: "karpenter.sh/unregistered:NoExecute",
		Vars:    map[string]string{"k8sMinor": "1.36", "region": "eu"},
		Secrets: map[string]string{"activationCode": "s3cr3t-value-xyz", "id": "short"},
	}
}

func TestEnvContract(t *testing.T) {
	c := fullContext()
	fixed := []string{EnvClusterEndpoint, EnvClusterCAB64, EnvBootstrapToken, EnvNodeName, EnvProviderID, EnvHostAddress, EnvNodeAddress, EnvNodeLabels, EnvTaints}

	leave := Env(PhaseLeave, c, true)
	for _, n := range fixed {
		v, ok := leave[n]
		if !ok {
			t.Errorf("leave: %s not exported", n)
		}
		switch n {
		case EnvHostAddress:
			if v != "10.1.1.1" {
				t.Errorf("leave %s=%q", n, v)
			}
		case EnvNodeAddress:
			if v != "10.2.2.2" {
				t.Errorf("leave %s=%q", n, v)
			}
		default:
			if v != "" {
				t.Errorf("leave: %s=%q, want empty", n, v)
			}
		}
	}
	if len(leave) != len(fixed) {
		t.Errorf("leave exports %d names, want only the %d fixed ones: %v", len(leave), len(fixed), leave)
	}

	join := Env(PhaseJoin, c, true)
	if join[EnvBootstrapToken] != c.BootstrapToken {
		t.Error("join lacks the bootstrap token")
	}
	if join["KPSSH_VAR_k8sMinor"] != "1.36" || join["KPSSH_SECRET_ACTIVATIONCODE"] != "s3cr3t-value-xyz" || join["KPSSH_SECRET_ID"] != "short" {
		t.Errorf("join vars/secrets: %v", join)
	}
	if _, ok := Env(PhaseJoin, c, false)["KPSSH_SECRET_ID"]; ok {
		t.Error("withSecrets=false still exports secrets")
	}
	install := Env(PhaseInstall, c, true)
	if v, ok := install[EnvBootstrapToken]; !ok || v != "" {
		t.Errorf("install: KPSSH_BOOTSTRAP_TOKEN=%q (exported: %v), want exported empty", v, ok)
	}
	if install["KPSSH_VAR_region"] != "eu" {
		t.Error("install lacks vars")
	}
}

func TestCheckContext(t *testing.T) {
	bad := []Context{
		{Vars: map[string]string{"bad-name": "x"}},
		{Vars: map[string]string{"1x": "x"}},
		{Secrets: map[string]string{"activation-id": "x"}},
		{Secrets: map[string]string{"token": "a", "TOKEN": "b"}},
		{Vars: map[string]string{"a": "x\x00"}},
		{Secrets: map[string]string{"a": "\xff\xfe"}},
		{NodeName: "x\x00y"},
	}
	for i, c := range bad {
		if err := checkContext(c); err == nil {
			t.Errorf("case %d accepted: %+v", i, c)
		}
	}
	if err := checkContext(fullContext()); err != nil {
		t.Fatal(err)
	}
	// Messages name keys, never values.
	err := checkContext(Context{Secrets: map[string]string{"k": "leakme-secret\x00"}})
	if err == nil || strings.Contains(err.Error(), "leakme") {
		t.Fatalf("error %v", err)
	}
}

// --------------------------------------------------------------- templates --

func TestRenderScriptTemplates(t *testing.T) {
	c := fullContext()
	got, err := renderScript(PhaseJoin, `echo {{ .NodeName }} {{ .Vars.region }} {{ .Secrets.activationCode }} {{ .BootstrapToken }}`, c)
	if err != nil {
		t.Fatal(err)
	}
	if got != "echo node-1 eu s3cr3t-value-xyz abcdef.0123456789abcdef" {
		t.Fatalf("rendered %q", got)
	}
	if _, err := renderScript(PhaseJoin, `{{ .Vars.nope }}`, c); err == nil || !strings.Contains(err.Error(), "nope") {
		t.Fatalf("missing var: %v", err)
	}
	if _, err := renderScript(PhaseJoin, `{{ .Secrets.nope }}`, c); err == nil {
		t.Fatal("missing secret rendered")
	}
	// leave: only the addresses, whatever the caller passed
	got, err = renderScript(PhaseLeave, `leave {{ .HostAddress }} {{ .NodeAddress }}`, c)
	if err != nil || got != "leave 10.1.1.1 10.2.2.2" {
		t.Fatalf("leave: %q %v", got, err)
	}
	for _, body := range []string{
		`{{ .Vars.region }}`, `{{ .Secrets.id }}`, `{{ .ClusterEndpoint }}`, `{{ .BootstrapToken }}`, `{{ .NodeName }}`,
		`{{ if false }}{{ .Vars.x }}{{ end }}`, `{{ $.Vars.x }}`, `{{ $c := . }}{{ $c.Secrets }}`, `{{ index . "Vars" }}`,
		`{{ with .HostAddress }}{{ $.ProviderID }}{{ end }}`, `{{ define "x" }}{{ .Taints }}{{ end }}{{ template "x" . }}`,
		`{{ range . }}{{ . }}{{ end }}`, `{{ (.Vars).x }}`,
	} {
		if _, err := renderScript(PhaseLeave, body, c); err == nil {
			t.Errorf("leave accepted %s", body)
		}
	}
	// with/range re-bind the dot: .Foo inside is not a context field.
	if _, err := parseScript(PhaseLeave, `{{ with .HostAddress }}{{ . }}{{ end }}`); err != nil {
		t.Errorf("with on an address rejected: %v", err)
	}
	if _, err := renderScript(PhaseInstall, `{{ .BootstrapToken }}`, c); err == nil {
		t.Error("install may use the bootstrap token")
	}
	if _, err := renderScript(PhaseJoin, `{{ .ClusterEndpont }}`, c); err == nil || !strings.Contains(err.Error(), "unknown field") {
		t.Errorf("typo not caught: %v", err)
	}
}

// ---------------------------------------------------------------- Validate --

func TestValidateTable(t *testing.T) {
	cases := []struct {
		name  string
		phase Phase
		src   Source
		ok    bool
		want  string // substring of the error
	}{
		{"script ok", PhaseJoin, Source{Script: "echo {{ .NodeName }}"}, true, ""},
		{"script plain bash with braces", PhaseInstall, Source{Script: "f() { echo ${X:-y}; }; f"}, true, ""},
		{"script bad template", PhaseJoin, Source{Script: "echo {{ .NodeName "}, false, "template"},
		{"script unknown func", PhaseJoin, Source{Script: "{{ shell `id` }}"}, false, "template"},
		{"leave script vars", PhaseLeave, Source{Script: "echo {{ .Vars.clusterName }}"}, false, "empty context"},
		{"leave script secrets", PhaseLeave, Source{Script: "echo {{ .Secrets.x }}"}, false, "empty context"},
		{"leave script endpoint", PhaseLeave, Source{Script: "echo {{ .ClusterEndpoint }}"}, false, "empty context"},
		{"leave script addresses", PhaseLeave, Source{Script: "echo {{ .HostAddress }} {{ .NodeAddress }}"}, true, ""},
		{"leave script dead branch", PhaseLeave, Source{Script: "{{ if false }}{{ .Vars.x }}{{ end }}"}, false, "empty context"},
		{"install token", PhaseInstall, Source{Script: "echo {{ .BootstrapToken }}"}, false, "only the join"},
		{"script NUL", PhaseJoin, Source{Script: "echo \x00"}, false, "NUL"},
		{"script too big", PhaseJoin, Source{Script: strings.Repeat("#", MaxSourceBytes+1)}, false, "more than"},
		{"no source", PhaseJoin, Source{}, false, "no source"},
		{"two sources", PhaseJoin, Source{Script: "x", Role: "r"}, false, "exactly one"},
		{"unknown phase", Phase("bogus"), Source{Script: "x"}, false, "unknown phase"},
		{"tasks ok", PhaseJoin, Source{Tasks: "- name: a\n  ansible.builtin.command: /bin/true\n"}, true, ""},
		{"tasks not yaml", PhaseJoin, Source{Tasks: "- name: [unclosed\n"}, false, "YAML"},
		{"tasks mapping", PhaseJoin, Source{Tasks: "name: x\ncommand: y\n"}, false, "list"},
		{"tasks list of strings", PhaseJoin, Source{Tasks: "- echo hi\n"}, false, "mapping"},
		{"tasks empty list", PhaseJoin, Source{Tasks: "[]\n"}, false, "empty"},
		{"tasks a play", PhaseJoin, Source{Tasks: "- hosts: all\n  tasks: []\n"}, false, "play"},
		{"tasks two docs", PhaseJoin, Source{Tasks: "- command: a\n---\n- command: b\n"}, false, "more than one"},
		{"tasks dup key", PhaseJoin, Source{Tasks: "- command: a\n  command: b\n"}, false, ""},
		{"tasks null item", PhaseJoin, Source{Tasks: "- \n"}, false, "null"},
		{"leave tasks vars", PhaseLeave, Source{Tasks: "- debug: msg={{ kpssh_vars.x }}\n"}, false, "kpssh_vars"},
		{"leave tasks secrets", PhaseLeave, Source{Tasks: "- debug: msg={{ kpssh_secrets['x'] }}\n"}, false, "kpssh_secrets"},
		{"leave tasks token", PhaseLeave, Source{Tasks: "- debug: msg={{ kpssh.bootstrap_token }}\n"}, false, "bootstrap_token"},
		{"leave tasks index", PhaseLeave, Source{Tasks: "- debug: msg={{ kpssh['node_name'] }}\n"}, false, "node_name"},
		{"leave tasks addresses", PhaseLeave, Source{Tasks: "- debug: msg={{ kpssh.host_address }} {{ kpssh['node_address'] }}\n- dklesev.kpssh.stdin_exec: {cmd: 'true'}\n"}, true, ""},
		{"role ok", PhaseJoin, Source{Role: "tls_bootstrap"}, true, ""},
		{"role fqcn", PhaseJoin, Source{Role: "dklesev.kpssh.tls_bootstrap"}, true, ""},
		{"role path traversal", PhaseJoin, Source{Role: "../../etc"}, false, "role name"},
		{"role with jinja", PhaseJoin, Source{Role: "{{ lookup('pipe','id') }}"}, false, "role name"},
		{"role four parts", PhaseJoin, Source{Role: "a.b.c.d"}, false, "role name"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := Validate(tc.phase, tc.src)
			if tc.ok && err != nil {
				t.Fatalf("want ok, got %v", err)
			}
			if !tc.ok {
				if err == nil {
					t.Fatal("want an error")
				}
				if !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("error %q does not mention %q", err, tc.want)
				}
			}
		})
	}
}

// ---------------------------------------------------------------- redaction --

func TestRedactTokenAndSecretHalf(t *testing.T) {
	req := Request{Context: Context{BootstrapToken: "abcdef.0123456789abcdef", Secrets: map[string]string{"a": "longsecret1", "b": "short"}}, Redact: []string{"extra-value-1", "tiny"}}
	r := redactorFor(req)
	in := "token abcdef.0123456789abcdef half 0123456789abcdef a longsecret1 b short extra extra-value-1 tiny id abcdef"
	got := r.Redact(in)
	for _, leak := range []string{"0123456789abcdef", "longsecret1", "extra-value-1"} {
		if strings.Contains(got, leak) {
			t.Errorf("%q survives in %q", leak, got)
		}
	}
	// <8 characters are not redacted; the token id is public
	for _, keep := range []string{"short", "tiny", "id abcdef"} {
		if !strings.Contains(got, keep) {
			t.Errorf("%q was redacted: %q", keep, got)
		}
	}
	if want := "token *** half *** a *** b short extra *** tiny id abcdef"; got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
}

func TestRedactOverlaps(t *testing.T) {
	r := NewRedactor("abcdefgh12", "defgh12345", "zzzzzzzz")
	for in, want := range map[string]string{
		"x abcdefgh12345 y":    "x *** y",   // overlapping different values
		"zzzzzzzzzz":           "***",       // overlapping occurrences of one value
		"abcdefgh12defgh12345": "***",       // adjacent
		"abcdefgh1":            "abcdefgh1", // prefix only: no match
		"":                     "",
		"no secrets at all":    "no secrets at all",
	} {
		if got := r.Redact(in); got != want {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
		}
	}
	// a secret that is a substring of another
	r = NewRedactor("secretvalue", "mysecretvalue99")
	if got := r.Redact("[mysecretvalue99] [secretvalue]"); got != "[***] [***]" {
		t.Errorf("nested: %q", got)
	}
}

func TestRedactEscapedForms(t *testing.T) {
	s := `it's"a\secret`
	r := NewRedactor(s)
	for _, form := range []string{s, `it'\''s"a\secret`, `it's\"a\\secret`} {
		if got := r.Redact("x " + form + " y"); got != "x *** y" {
			t.Errorf("form %q: %q", form, got)
		}
	}
}

func TestRedactTailDropsStraddlingFragment(t *testing.T) {
	secret := "0123456789abcdef"
	r := NewRedactor(secret)
	full := "prefix " + secret + " and more output\nlast line\n"
	// the tail was cut in the middle of the secret
	cut := strings.Index(full, secret) + 5
	tail := full[cut:]
	got := r.RedactTail(tail, true)
	if strings.Contains(got, "56789abcdef") || strings.Contains(got, "abcdef") {
		t.Fatalf("fragment survives: %q", got)
	}
	if !strings.Contains(got, "last line") {
		t.Fatalf("lost the tail: %q", got)
	}
	if r.RedactTail(tail, false) == got {
		t.Fatal("truncated=false must not drop anything")
	}
}

// ------------------------------------------------------------------ events --

const sampleStream = `{"event": "start", "v": 1}
[WARNING]: something unrelated on stdout
{"event": "play", "name": "kpssh join", "v": 1}
{"event": "task", "internal": "connect", "task": "kpssh: connect", "v": 1}
{"changed": false, "event": "ok", "host": "h", "internal": "connect", "task": "kpssh: connect", "v": 1}
{"event": "task", "task": "step 1", "v": 1}
{"event": "failed", "host": "h", "task": "step 1", "ignore_errors": true, "rc": 9, "v": 1}
{"event": "task", "task": "step 2", "v": 1}
{"event": "failed", "host": "h", "task": "step 2", "rc": 3, "msg": "non-zero return code", "stderr": "boom", "v": 1}
{"event": "stats", "hosts": 1, "totals": {"ok": 1, "changed": 0, "failures": 1, "unreachable": 0, "skipped": 0, "rescued": 0, "ignored": 1}, "v": 1}
{"event": "future", "v": 2}
not json at all
`

func TestParseEvents(t *testing.T) {
	s := ParseEvents([]byte(sampleStream))
	if !s.Started || s.Plays != 1 || !s.Reached {
		t.Fatalf("summary %+v", s)
	}
	if s.Failed == nil || s.Failed.Task != "step 2" || *s.Failed.RC != 3 || s.Failed.Stderr != "boom" {
		t.Fatalf("failed %+v", s.Failed)
	}
	if s.Stats == nil || s.Stats.Failures != 1 || s.Stats.Ignored != 1 {
		t.Fatalf("stats %+v", s.Stats)
	}
	if s.LastTask != "step 2" || s.Ignored != 3 {
		t.Fatalf("last %q ignored %d", s.LastTask, s.Ignored)
	}
	// unreachable at the connect check: not reached
	u := ParseEvents([]byte(`{"event":"start","v":1}
{"event":"unreachable","task":"kpssh: connect","internal":"connect","msg":"Failed to connect","v":1}
{"event":"stats","totals":{"unreachable":1},"v":1}`))
	if u.Reached || u.Unreachable == nil || u.Stats.Unreachable != 1 {
		t.Fatalf("unreachable summary %+v", u)
	}
}

func TestEventWriterChunkingAndLongLines(t *testing.T) {
	whole := ParseEvents([]byte(sampleStream))
	w := &eventWriter{}
	for i := 0; i < len(sampleStream); i++ {
		_, _ = w.Write([]byte{sampleStream[i]})
	}
	w.Close()
	if !reflect.DeepEqual(whole, w.sum) {
		t.Fatalf("byte-wise %+v != whole %+v", w.sum, whole)
	}
	long := append(bytes.Repeat([]byte("x"), maxEventLine+10), '\n')
	w = &eventWriter{}
	_, _ = w.Write(long)
	_, _ = w.Write([]byte(`{"event":"start","v":1}` + "\n"))
	w.Close()
	if !w.sum.Started || w.sum.Ignored != 1 {
		t.Fatalf("after a long line: %+v", w.sum)
	}
}

// ----------------------------------------------------------------- outcomes --

func intp(i int) *int { return &i }

func TestDecideOutcomes(t *testing.T) {
	red := NewRedactor("S3CRET-VALUE-1")
	started := Summary{Started: true, Plays: 1}
	okStats := &Stats{OK: 2}
	cases := []struct {
		name    string
		f       facts
		outcome Outcome
		touched bool
		task    string
		rc      int
		msg     string
	}{
		{"success", facts{exitCode: 0, sum: Summary{Started: true, Reached: true, Stats: okStats}}, Succeeded, true, "", 0, ""},
		{"syntax error exit 4 before start", facts{exitCode: 4, stderr: "[WARNING]: x\nERROR! couldn't resolve module/action 'nope'"}, ConfigError, false, "", 0, "couldn't resolve module"},
		{"unknown role exit 1", facts{exitCode: 1, stderr: "ERROR! the role 'nope' was not found"}, ConfigError, false, "", 0, "role 'nope'"},
		{"crash 250 before start", facts{exitCode: 250, stderr: "Traceback"}, ConfigError, false, "", 0, "exit 250"},
		{"task failed exit 2", facts{exitCode: 2, sum: Summary{Started: true, Reached: true, Failed: &Event{Event: "failed", Task: "t1", RC: intp(7), Msg: "non-zero return code", Stderr: "err S3CRET-VALUE-1"}, Stats: &Stats{Failures: 1}}}, Failed, true, "t1", 7, "stderr: err ***"},
		{"script failed uses result file", facts{exitCode: 2, sum: Summary{Started: true, Reached: true, Failed: &Event{Event: "failed", Task: "kpssh: join script", Internal: internalScript, Censored: true}}, script: &scriptResult{RC: intp(3), Stderr: "line S3CRET-VALUE-1\nfatal"}}, Failed, true, "kpssh: join script", 3, "rc=3"},
		{"unreachable at connect exit 4", facts{exitCode: 4, sum: Summary{Started: true, Unreachable: &Event{Event: "unreachable", Task: "kpssh: connect", Internal: internalConnect, Msg: "Failed to connect to the host via ssh: Connection refused"}, Stats: &Stats{Unreachable: 1}}}, Failed, false, "kpssh: connect", 0, "nothing ran"},
		{"host key mismatch", facts{exitCode: 4, sum: Summary{Started: true, Unreachable: &Event{Event: "unreachable", Task: "kpssh: connect", Internal: internalConnect, Msg: "Host key verification failed."}}}, Failed, false, "kpssh: connect", 0, "host key mismatch"},
		{"connection lost in script", facts{exitCode: 4, sum: Summary{Started: true, Reached: true, Unreachable: &Event{Event: "unreachable", Task: "kpssh: join script", Internal: internalScript}}, script: &scriptResult{RC: intp(255), ConnectionError: "Data could not be sent"}}, Failed, true, "kpssh: join script", 255, "ssh exited 255"},
		{"timeout", facts{interrupted: "timeout", timeout: 3 * time.Second, exitCode: -1, sum: Summary{Started: true, Reached: true, LastTask: "kpssh: join script"}}, TimedOut, true, "kpssh: join script", 0, "timed out after 3s"},
		{"canceled before connect", facts{interrupted: "canceled", exitCode: -1, sum: started}, TimedOut, false, "", 0, "interrupted"},
		{"error mid-run after reaching", facts{exitCode: 1, sum: Summary{Started: true, Reached: true, LastTask: "x"}, stderr: "ERROR! boom"}, Failed, true, "x", 0, "boom"},
		{"error mid-run before reaching", facts{exitCode: 1, sum: started, stderr: "ERROR! vars_files missing"}, ConfigError, false, "", 0, "before reaching"},
		{"exit 0 but no stats", facts{exitCode: 0, sum: Summary{Started: true, Reached: true}}, Failed, true, "", 0, "exited 0"},
		{"ignored failure then success", facts{exitCode: 0, sum: Summary{Started: true, Reached: true, Stats: &Stats{OK: 1, Ignored: 1}}}, Succeeded, true, "", 0, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := decide(tc.f, red)
			if r.Outcome != tc.outcome || r.Touched != tc.touched || r.FailedTask != tc.task || r.RC != tc.rc {
				t.Fatalf("got %+v", r)
			}
			if !strings.Contains(r.Message, tc.msg) {
				t.Fatalf("message %q lacks %q", r.Message, tc.msg)
			}
			if strings.Contains(r.Message, "S3CRET-VALUE-1") {
				t.Fatalf("secret in message %q", r.Message)
			}
		})
	}
}

func TestMessageBounds(t *testing.T) {
	m := joinMessage("head", strings.Repeat("a", 10*MaxMessage)+"END")
	if len(m) > MaxMessage+8 || !strings.HasPrefix(m, "head: …") || !strings.HasSuffix(m, "END") {
		t.Fatalf("len %d %q…", len(m), m[:20])
	}
	b := boundMessage("START" + strings.Repeat("é", MaxMessage) + "END")
	if len(b) > MaxMessage || !strings.HasPrefix(b, "START") || !strings.HasSuffix(b, "END") {
		t.Fatalf("bound %d", len(b))
	}
}

// ------------------------------------------------------------------ run dir --

func TestRunDirPermsAndRemoval(t *testing.T) {
	base := t.TempDir()
	d, err := newRunDir(base)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(d.path)
	if err != nil || fi.Mode().Perm() != 0o700 || !fi.IsDir() {
		t.Fatalf("dir mode %v %v", fi.Mode(), err)
	}
	if !strings.HasPrefix(filepath.Base(d.path), runDirPrefix) {
		t.Fatalf("name %s", d.path)
	}
	old := syscallUmask(0)
	defer syscallUmask(old)
	if err := d.write("secret", []byte("x")); err != nil {
		t.Fatal(err)
	}
	fi, _ = os.Stat(d.join("secret"))
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("file mode %v", fi.Mode())
	}
	if err := d.write("secret", []byte("y")); err == nil {
		t.Fatal("write over an existing file succeeded (O_EXCL)")
	}
	// a planted symlink is not followed
	if err := os.Symlink("/etc/passwd", d.join("link")); err != nil {
		t.Fatal(err)
	}
	if err := d.write("link", []byte("x")); err == nil {
		t.Fatal("write followed a symlink")
	}
	if err := d.remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(d.path); !os.IsNotExist(err) {
		t.Fatalf("dir still there: %v", err)
	}
}

func TestDefaultRunBaseIsTmpfs(t *testing.T) {
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		if got := defaultRunBase(); got != "/dev/shm" {
			t.Fatalf("base %s, want /dev/shm", got)
		}
	}
}

func TestSweepStale(t *testing.T) {
	base := t.TempDir()
	dead := filepath.Join(base, runDirPrefix+"999999999-123") // no such pid
	live := filepath.Join(base, runDirPrefix+"1-456")         // pid 1 is alive
	other := filepath.Join(base, "unrelated")
	for _, d := range []string{dead, live, other} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	removed, err := SweepStale(base)
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != 1 || removed[0] != dead {
		t.Fatalf("removed %v", removed)
	}
	for _, d := range []string{live, other} {
		if _, err := os.Stat(d); err != nil {
			t.Fatalf("%s removed", d)
		}
	}
}

// ---------------------------------------------------------------- YAML quoting --

// Every value we pass into YAML must come back byte for byte, as a string,
// through Ansible's own loader the way it loads `-e @vars.yml` (trusted as
// a template), and not trusted as a template (never templated). The control
// map without !unsafe must come back trusted, or the check proves nothing.
func TestYAMLQuotingRoundTripsThroughAnsible(t *testing.T) {
	vals := []string{
		"plain", "", `{{ lookup('pipe', 'id') }}`, "quote \" and \\ backslash", "nl\nand\ttab\rcr",
		"\x01\x1f\x7f ctrl", "\u0085 nel \u2028 ls \u2029 ps", "\ufeff bom", "émoji 🚀", "- not a list", "key: value", "#comment", "!tag", "'single'", "yes", "~", "  spaces  ", "1", "0x1f", "2026-12-02", "null",
	}
	ctx := Context{Vars: map[string]string{}, Secrets: map[string]string{}, NodeName: vals[2], ClusterEndpoint: ""}
	for i, v := range vals {
		ctx.Vars[fmt.Sprintf("v%02d", i)] = v
		ctx.Secrets[fmt.Sprintf("s%02d", i)] = v
	}
	doc, err := varsFile(PhaseJoin, ctx)
	if err != nil {
		t.Fatal(err)
	}
	// the control: the same values in a map without the tag
	doc += "control:\n"
	for i, v := range vals {
		doc += fmt.Sprintf("  v%02d: %s\n", i, yq(v))
	}
	f := filepath.Join(t.TempDir(), "vars.yml")
	if err := os.WriteFile(f, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	py := `
import sys, json
from ansible.parsing.dataloader import DataLoader
from ansible._internal._datatag._tags import TrustedAsTemplate
d = DataLoader().load_from_file(sys.argv[1], trusted_as_template=True)
out = {}
for m in ("kpssh", "kpssh_vars", "kpssh_secrets", "control"):
    out[m] = {k: [v if isinstance(v, str) else repr(v), TrustedAsTemplate.is_tagged_on(v)] for k, v in d[m].items()}
print(json.dumps(out))
`
	// the runner image's Python and ansible (make puts its bin dir first on PATH)
	out, err := exec.Command("python3", "-c", py, f).Output()
	if err != nil {
		t.Fatalf("python: %v", err)
	}
	var got map[string]map[string][2]any
	if err := jsonUnmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	for i, v := range vals {
		for _, m := range []struct{ name, key string }{{"kpssh_vars", "v"}, {"kpssh_secrets", "s"}, {"control", "v"}} {
			g := got[m.name][fmt.Sprintf("%s%02d", m.key, i)]
			wantTrusted := m.name == "control"
			if g[0] != v || g[1] != wantTrusted {
				t.Errorf("%s value %d: %q (trusted=%v), want %q (trusted=%v)", m.name, i, g[0], g[1], v, wantTrusted)
			}
		}
	}
	if g := got["kpssh"]["node_name"]; g[0] != vals[2] || g[1] != false {
		t.Errorf("kpssh.node_name: %q (trusted=%v), want %q untrusted", g[0], g[1], vals[2])
	}
	if g := got["kpssh"]["cluster_endpoint"]; g[0] != "" || g[1] != false {
		t.Errorf("kpssh.cluster_endpoint: %q (trusted=%v), want an empty untrusted string", g[0], g[1])
	}
}

// --------------------------------------------------------------- rendering --

func testConn(t testing.TB) Connection {
	t.Helper()
	return Connection{Address: "192.0.2.10", Port: 22, User: "root", PrivateKey: testKeyPEM(t), HostKey: testHostKeyLine(t)}
}

func TestRenderMasksSecretsAndNeverShowsKey(t *testing.T) {
	c := fullContext()
	c.Secrets["short"] = "abc" // <8: masked in render anyway
	req := Request{Phase: PhaseJoin, Conn: testConn(t), Source: Source{Script: "echo {{ .Secrets.activationCode }} {{ .Secrets.short }}\n"}, Context: c, Redact: []string{"redact-me-too"}}
	req.Context.NodeLabels = "x=redact-me-too"
	out, err := Render(req, true)
	if err != nil {
		t.Fatal(err)
	}
	for _, leak := range []string{"s3cr3t-value-xyz", "0123456789abcdef", "redact-me-too", "PRIVATE KEY", "'abc'", " abc\n"} {
		if strings.Contains(out, leak) {
			t.Errorf("render shows %q:\n%s", leak, out)
		}
	}
	for _, want := range []string{"dklesev.kpssh.stdin_exec", "no_log: true", "set -euo pipefail", "export KPSSH_BOOTSTRAP_TOKEN='abcdef.***'", "export KPSSH_SECRET_ACTIVATIONCODE='***'", "export KPSSH_VAR_region='eu'", "kpssh: connect"} {
		if !strings.Contains(out, want) {
			t.Errorf("render lacks %q:\n%s", want, out)
		}
	}
	shown, err := Render(req, false)
	if err != nil || !strings.Contains(shown, "s3cr3t-value-xyz") {
		t.Fatalf("unmasked render: %v", err)
	}

	// tasks: vars file with !unsafe maps; no secret in the environment keyword
	req.Source = Source{Tasks: "- ansible.builtin.command: /bin/true\n"}
	out, err = Render(req, false)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "kpssh_secrets: !unsafe\n") || !strings.Contains(out, `  activationCode: "s3cr3t-value-xyz"`) || !strings.Contains(out, "import_tasks") {
		t.Fatalf("tasks render:\n%s", out)
	}
	if strings.Contains(out, "mitogen") {
		t.Fatalf("mitogen named without the option:\n%s", out)
	}
	env := out[strings.Index(out, "environment:"):strings.Index(out, "tasks:")]
	if strings.Contains(env, "SECRET") || strings.Contains(env, "BOOTSTRAP_TOKEN") || strings.Contains(env, "s3cr3t") {
		t.Fatalf("secret in the play environment:\n%s", env)
	}
	// non-root: become for tasks, sudo -n for scripts
	req.Conn.User = "deploy"
	out, _ = Render(req, true)
	if !strings.Contains(out, "become: true") {
		t.Fatalf("no become for a non-root user:\n%s", out)
	}
	req.Source = Source{Script: "id"}
	out, _ = Render(req, true)
	if !strings.Contains(out, `cmd: "sudo -n flock -w 600 /run/kpssh-phase.lock timeout -k 5 600 bash -s kpssh-RUN"`) {
		t.Fatalf("no sudo -n:\n%s", out)
	}
}

func TestBuildRejectsBadConnections(t *testing.T) {
	good := testConn(t)
	src := Source{Script: "true"}
	bad := map[string]func(*Connection){
		"address with space": func(c *Connection) { c.Address = "a b" },
		"address jinja":      func(c *Connection) { c.Address = "{{x}}" },
		"user with shell":    func(c *Connection) { c.User = "root;id" },
		"no host key":        func(c *Connection) { c.HostKey = "" },
		"garbage host key":   func(c *Connection) { c.HostKey = "ssh-ed25519 notbase64!" },
		"two host keys":      func(c *Connection) { c.HostKey = good.HostKey + "\n" + good.HostKey },
		"no private key":     func(c *Connection) { c.PrivateKey = nil },
		"garbage private key": func(c *Connection) {
			c.PrivateKey = sshtest.FakePEM("c2VjcmV0")
		},
		"port": func(c *Connection) { c.Port = 70000 },
	}
	for name, mut := range bad {
		c := good
		mut(&c)
		_, err := build(Request{Phase: PhaseJoin, Conn: c, Source: src}, renderConfig{dir: "/dev/shm/kpssh-x", python: DefaultPythonInterpreter})
		if err == nil {
			t.Errorf("%s: accepted", name)
		} else if strings.Contains(err.Error(), "c2VjcmV0") {
			t.Errorf("%s: key material in error", name)
		}
	}
	if _, err := build(Request{Phase: PhaseJoin, Conn: good, Source: src}, renderConfig{dir: "/dev/shm/kpssh-x", python: DefaultPythonInterpreter}); err != nil {
		t.Fatal(err)
	}
}

// With MitogenStrategyPath, role and task plays name mitogen_linear and the
// config makes it loadable; script plays (one task) keep the default.
func TestRenderMitogen(t *testing.T) {
	rc := renderConfig{dir: "/dev/shm/kpssh-RUN", python: DefaultPythonInterpreter, mitogen: DefaultMitogenStrategyPath}
	if cfg := ansibleConfig(rc); !strings.Contains(cfg, "strategy_plugins = "+DefaultMitogenStrategyPath+"\n") {
		t.Errorf("ansible.cfg lacks strategy_plugins:\n%s", cfg)
	}
	for _, c := range []struct {
		src  Source
		want bool
	}{
		{Source{Role: "kpssh_test_role"}, true},
		{Source{Tasks: "- ansible.builtin.command: /bin/true\n"}, true},
		{Source{Script: "true\n"}, false},
	} {
		req := Request{Phase: PhaseJoin, Conn: testConn(t), Source: c.src, Context: fullContext(), Timeout: time.Minute}
		b, err := build(req, rc)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(b.playbook, "  strategy: mitogen_linear\n"); got != c.want {
			t.Errorf("%+v: strategy mitogen_linear in the play = %v, want %v:\n%s", c.src, got, c.want, b.playbook)
		}
	}
}

// Every line (≥ MinRedactLen, spaces trimmed) of a multi-line secret is
// masked where it is printed alone; shorter lines are not (they would shred
// ordinary output), and nor is anything but the secret's own lines.
func TestRedactMultiLineSecret(t *testing.T) {
	pem := "-----BEGIN TEST KEY-----\r\n  MIIEvQIBADANBgkq  \nshort\nZm9vYmFyYmF6cXV4\n-----END TEST KEY-----\n"
	r := NewRedactor(pem)
	for _, c := range []struct{ in, want string }{
		{"line: MIIEvQIBADANBgkq\n", "line: ***\n"},
		{"tail Zm9vYmFyYmF6cXV4 end", "tail *** end"},
		{"-----BEGIN TEST KEY-----", "***"},
		{"short and MIIEvQIBADANBgk", "short and MIIEvQIBADANBgk"}, // a prefix of a line is not the line
		{"whole " + pem, "whole ***"},
	} {
		if got := r.Redact(c.in); got != c.want {
			t.Errorf("Redact(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
