package demo

import (
	"strings"
	"testing"
)

const goodCycle = `=== scaling deployment/pause 0 → 2 (12:00:00 UTC)
  h1   claimed    +0.5s
=== timeline (seconds after the first scale command)
  h1    claimed +0.5s  install +1.0s (install took 16.6s)  join +17.5s (join took 5.5s)  registered +21.0s  ready +22.0s  leave +70.0s  available +75.5s (leave took 4.2s)
  h3    claimed +0.5s  install +1.0s (install took 16.0s)  join +17.0s (join took 6.0s)  registered +21.5s  ready +22.5s  leave +70.0s  available +76.0s (leave took 4.0s)

=== the demo stays up. Explore:
`

func TestParseTimeline(t *testing.T) {
	tl, err := ParseTimeline(goodCycle)
	if err != nil {
		t.Fatal(err)
	}
	if len(tl) != 2 || tl["h1"]["install"].Note != "(install took 16.6s)" || tl["h3"]["available"].At != 76 {
		t.Fatalf("parsed %+v", tl)
	}
	if bad := CheckColdCycle(tl, 2); len(bad) != 0 {
		t.Errorf("a good cycle flagged: %v", bad)
	}
}

func TestParseTimelineRejects(t *testing.T) {
	for _, tc := range []struct{ name, out, want string }{
		{"no section", "=== scaling deployment/pause 0 → 2\n", "no "},
		{"not a host", timelineHeader + "\n  node1  claimed +0.5s\n", "does not start with a host"},
		{"host twice", timelineHeader + "\n  h1  claimed +0.5s\n  h1  ready +1.0s\n", "printed twice"},
		{"event twice", timelineHeader + "\n  h1  claimed +0.5s  claimed +0.6s\n", "claimed printed twice"},
		{"unknown event", timelineHeader + "\n  h1  claimed +0.5s  exploded +0.6s\n", "unknown event"},
		{"garbage", timelineHeader + "\n  h1  claimed +0.5s  ???\n", "unreadable"},
		{"garbage between", timelineHeader + "\n  h1  claimed +0.5s xx ready +1.0s\n", "unreadable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseTimeline(tc.out)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestCheckColdCycle(t *testing.T) {
	for _, tc := range []struct {
		name, old, new string // goodCycle with old replaced by new (once)
		hosts          int
		want           string
	}{
		{"one host too many", "", "", 3, "2 hosts on the timeline, want 3"},
		{"missing install (a warm join)", "install +1.0s (install took 16.6s)  ", "", 2, "h1: no install"},
		{"missing ready", "ready +22.0s  ", "", 2, "h1: no ready"},
		{"left before ready", "leave +70.0s", "leave +10.0s", 2, "h1: ready (+22.0s) after leave (+10.0s)"},
		{"no duration", " (leave took 4.2s)", "", 2, `h1: available noted ""`},
		{"negative", "claimed +0.5s", "claimed +-0.5s", 2, "h1: claimed at -0.5s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tl, err := ParseTimeline(strings.Replace(goodCycle, tc.old, tc.new, 1))
			if err != nil {
				t.Fatal(err)
			}
			bad := CheckColdCycle(tl, tc.hosts)
			if !strings.Contains(strings.Join(bad, "\n"), tc.want) {
				t.Errorf("problems %q, want one containing %q", bad, tc.want)
			}
		})
	}
}
