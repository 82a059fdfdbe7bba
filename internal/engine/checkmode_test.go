package engine

import (
	"strings"
	"testing"
)

// Check mode: role and task sources, install and join only; a check-mode
// join carries the placeholder token, never the caller's.
func TestCheckModeBuild(t *testing.T) {
	rc := renderConfig{dir: "/dev/shm/kpssh-RUN", python: DefaultPythonInterpreter}
	c := fullContext()
	for _, tc := range []struct {
		name  string
		phase Phase
		src   Source
		err   string
	}{
		{"role join", PhaseJoin, Source{Role: "tls_bootstrap"}, ""},
		{"tasks install", PhaseInstall, Source{Tasks: "- ansible.builtin.debug: {msg: hi}\n"}, ""},
		{"script", PhaseJoin, Source{Script: "true"}, "role and task profiles only"},
		{"verified script", PhaseJoin, Source{Script: "true", Verified: &Verified{Signature: "x"}}, "role and task profiles only"},
		{"leave", PhaseLeave, Source{Role: "tls_bootstrap"}, "install and join only"},
		{"check phase", PhaseCheck, Source{Role: "tls_bootstrap"}, "install and join only"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := build(Request{Phase: tc.phase, Conn: testConn(t), Source: tc.src, Context: c, Check: true}, rc)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			vars := string(b.file(fileVars))
			want := `bootstrap_token: ""`
			if tc.phase == PhaseJoin {
				want = `bootstrap_token: "` + CheckModeToken + `"`
			}
			if !strings.Contains(vars, want) || strings.Contains(vars, c.BootstrapToken) {
				t.Fatalf("vars.yml lacks %s or carries the real token:\n%s", want, vars)
			}
		})
	}
	// Without check mode the token is the caller's.
	b, err := build(Request{Phase: PhaseJoin, Conn: testConn(t), Source: Source{Role: "r"}, Context: c}, rc)
	if err != nil || !strings.Contains(string(b.file(fileVars)), c.BootstrapToken) {
		t.Fatalf("plain join: %v", err)
	}
}

// The placeholder has a bootstrap token's shape (roles check it) and is
// not a secret the engine would mask.
func TestCheckModeTokenShape(t *testing.T) {
	id, secret, ok := strings.Cut(CheckModeToken, ".")
	if !ok || len(id) != 6 || len(secret) != 16 || strings.Trim(CheckModeToken, "abcdefghijklmnopqrstuvwxyz0123456789.") != "" {
		t.Fatalf("%q is not <6>.<16> of [a-z0-9]", CheckModeToken)
	}
}

// Changed tasks come from the ok events of the profile's own tasks, with
// their diffs redacted and bounded; the engine's own tasks are not listed.
func TestChangesFromEvents(t *testing.T) {
	secret := "s3cr3t-value-xyz"
	long := "--- /etc/a\n+++ /etc/a\n" + strings.Repeat("+line\n", 2*MaxDiff/6) + "+" + secret[:5]
	stream := `{"event":"start","v":1}
{"event":"ok","task":"kpssh: connect","internal":"connect","changed":true,"v":1}
{"event":"ok","task":"unchanged","changed":false,"v":1}
{"event":"ok","task":"Write config","changed":true,"diff":"--- /etc/x\n+++ /etc/x\n-key: ` + secret + `\n+key: new","v":1}
{"event":"ok","task":"Hidden","changed":true,"censored":true,"v":1}
{"event":"ok","task":"Long","changed":true,"diff":` + quote(long) + `,"diff_truncated":true,"v":1}
{"event":"stats","totals":{"ok":4,"changed":3},"v":1}
`
	s := ParseEvents([]byte(stream))
	res := decide(facts{exitCode: 0, sum: s}, NewRedactor(secret))
	if res.Outcome != Succeeded || len(res.Changes) != 3 {
		t.Fatalf("%+v", res)
	}
	c := res.Changes
	if c[0].Task != "Write config" || !strings.Contains(c[0].Diff, "-key: ***") || strings.Contains(c[0].Diff, secret) {
		t.Fatalf("change 0: %+v", c[0])
	}
	if c[1].Task != "Hidden" || !c[1].Censored || c[1].Diff != "" {
		t.Fatalf("change 1: %+v", c[1])
	}
	if len(c[2].Diff) > MaxDiff || !strings.HasPrefix(c[2].Diff, "--- /etc/a") || !strings.HasSuffix(c[2].Diff, "…") || strings.Contains(c[2].Diff, secret[:5]) {
		t.Fatalf("change 2 (bounded head, straddling fragment dropped): %d bytes, ends %q", len(c[2].Diff), c[2].Diff[len(c[2].Diff)-20:])
	}
	// at most MaxChanges
	var b strings.Builder
	for i := 0; i < MaxChanges+5; i++ {
		b.WriteString(`{"event":"ok","task":"t","changed":true,"v":1}` + "\n")
	}
	if n := len(ParseEvents([]byte(b.String())).Changed); n != MaxChanges {
		t.Fatalf("%d changes kept", n)
	}
}

func quote(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)
	return `"` + r.Replace(s) + `"`
}

func TestRedactHeadDropsStraddlingFragment(t *testing.T) {
	secret := "0123456789abcdef"
	r := NewRedactor(secret)
	full := "first line\nsecond line, long enough to hold the cut " + secret + " more"
	head := full[:strings.Index(full, secret)+5] // cut inside the secret
	got := r.RedactHead(head, true)
	if strings.Contains(got, "01234") || !strings.HasPrefix(got, "first line") {
		t.Fatalf("%q", got)
	}
	if r.RedactHead(head, false) == got {
		t.Fatal("truncated=false must not drop anything")
	}
}
