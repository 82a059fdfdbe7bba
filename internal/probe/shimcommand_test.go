package probe_test

import (
	"strings"
	"testing"

	"github.com/dklesev/kpssh/internal/probe"
)

func TestCommand(t *testing.T) {
	for _, tc := range []struct {
		name        string
		verified    bool
		shimCommand string
		want        string // the command line; "" = refused
	}{
		{"raw host", false, "", "raw"},
		{"raw host ignores shimCommand", false, "kpssh-shim; reboot", "raw"},
		{"default shim", true, "", "kpssh-shim probe"},
		{"shim by name", true, "kpssh-shim", "kpssh-shim probe"},
		{"absolute path", true, "/usr/local/bin/kpssh-shim", "/usr/local/bin/kpssh-shim probe"},
		{"sudo with a flag", true, "sudo -n /usr/local/sbin/kpssh-shim", "sudo -n /usr/local/sbin/kpssh-shim probe"},
		{"every allowed character", true, "env A_b=1,2+3@x /opt/kpssh-1.2/kpssh-shim", "env A_b=1,2+3@x /opt/kpssh-1.2/kpssh-shim probe"},
		{"1024 characters", true, strings.Repeat("a", 1024), strings.Repeat("a", 1024) + " probe"},
		{"1025 characters", true, strings.Repeat("a", 1025), ""},
		{"semicolon", true, "/usr/local/bin/kpssh-shim; touch /tmp/pwned", ""},
		{"semicolon without space", true, "kpssh-shim;id", ""},
		{"command substitution", true, "$(touch /tmp/pwned)/usr/local/bin/kpssh-shim", ""},
		{"variable", true, "$HOME/kpssh-shim", ""},
		{"backticks", true, "`touch /tmp/pwned`kpssh-shim", ""},
		{"newline", true, "kpssh-shim\ntouch /tmp/pwned", ""},
		{"carriage return", true, "kpssh-shim\rid", ""},
		{"tab", true, "sudo\tkpssh-shim", ""},
		{"and", true, "kpssh-shim probe && touch /tmp/pwned", ""},
		{"or", true, "false || touch /tmp/pwned", ""},
		{"pipe", true, "kpssh-shim | sh", ""},
		{"background", true, "touch /tmp/pwned & kpssh-shim", ""},
		{"redirect", true, "kpssh-shim >/etc/passwd", ""},
		{"input redirect", true, "kpssh-shim </etc/shadow", ""},
		{"single quote", true, "kpssh-shim 'x", ""},
		{"double quote", true, `kpssh-shim "x`, ""},
		{"backslash", true, `kpssh-shim \`, ""},
		{"glob", true, "/usr/*/kpssh-shim", ""},
		{"question mark", true, "/usr/local/bin/kpssh-shi?", ""},
		{"brackets", true, "/usr/local/bin/kpssh-shi[m]", ""},
		{"braces", true, "{touch,/tmp/pwned}", ""},
		{"tilde", true, "~/kpssh-shim", ""},
		{"comment", true, "kpssh-shim #", ""},
		{"history bang", true, "kpssh-shim !!", ""},
		{"parentheses", true, "(touch /tmp/pwned)", ""},
		{"NUL", true, "kpssh-shim\x00", ""},
		{"non-ASCII hyphen", true, "kpssh‐shim", ""},
		{"leading space", true, " kpssh-shim", ""},
		{"trailing space", true, "kpssh-shim ", ""},
		{"two spaces", true, "sudo  kpssh-shim", ""},
		{"only spaces", true, "   ", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := probe.Command(tc.verified, tc.shimCommand)
			if tc.want == "raw" {
				raw, _ := probe.Command(false, "")
				tc.want = raw
			}
			switch {
			case tc.want == "" && err == nil:
				t.Fatalf("accepted %q as %q", tc.shimCommand, got)
			case tc.want == "" && (!strings.Contains(err.Error(), "spec.shimCommand") || got != ""):
				t.Fatalf("refusal %q (command %q) does not name spec.shimCommand", err, got)
			case tc.want != "" && (err != nil || got != tc.want):
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// plainCommandLine is the rule written out byte by byte, independent of
// probe.ShimCommandPattern: empty, or ≤1024 bytes of words of
// [A-Za-z0-9/._+=,@-] joined by single spaces.
func plainCommandLine(s string) bool {
	if len(s) > probe.MaxShimCommand {
		return false
	}
	if s == "" {
		return true
	}
	for _, w := range strings.Split(s, " ") {
		if w == "" {
			return false
		}
		for i := 0; i < len(w); i++ {
			c := w[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("/._+=,@-", c) >= 0) {
				return false
			}
		}
	}
	return true
}

func FuzzCommand(f *testing.F) {
	for _, s := range []string{"", "kpssh-shim", "sudo -n /usr/local/sbin/kpssh-shim", "kpssh-shim; id", "$(id)", "`id`", "a\nb", "a  b", " a", "a ", "é"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		cmd, err := probe.Command(true, s)
		if want := plainCommandLine(s); (err == nil) != want {
			t.Fatalf("Command(%q): %q, %v; the rule says accept=%v", s, cmd, err, want)
		}
		if err != nil {
			if cmd != "" || !strings.Contains(err.Error(), "spec.shimCommand") {
				t.Fatalf("Command(%q) refused with %q but returned %q", s, err, cmd)
			}
			return
		}
		shim := s
		if shim == "" {
			shim = "kpssh-shim"
		}
		if cmd != shim+" probe" {
			t.Fatalf("Command(%q) = %q", s, cmd)
		}
	})
}
