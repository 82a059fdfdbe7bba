package demo

import (
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// Events of a host's line in the demo's timeline, in the order they happen
// on a cold join and leave.
var Events = []string{"claimed", "install", "join", "registered", "ready", "leave", "available"}

// Event is one first sighting the demo printed: seconds after the first
// scale command, and its note ("(install took 16.6s)").
type Event struct {
	At   float64
	Note string
}

const timelineHeader = "=== timeline (seconds after the first scale command)"

var (
	hostField = regexp.MustCompile(`^h[0-9]+$`)
	eventRe   = regexp.MustCompile(`\s([a-z]+) \+(-?[0-9]+\.[0-9])s( \([^)]*\))?`)
)

// ParseTimeline reads the timeline section of the demo's output: one line
// per host ("  h1    claimed +0.5s  install +2.0s (install took 1.4s) …")
// up to the first blank line. It fails on a missing section, a line it cannot
// read, an unknown or repeated event, a host printed twice.
func ParseTimeline(out string) (map[string]map[string]Event, error) {
	i := strings.Index(out, timelineHeader)
	if i < 0 {
		return nil, fmt.Errorf("no %q in the output", timelineHeader)
	}
	known := map[string]bool{}
	for _, e := range Events {
		known[e] = true
	}
	tl := map[string]map[string]Event{}
	for _, line := range strings.Split(out[i+len(timelineHeader):], "\n")[1:] {
		if strings.TrimSpace(line) == "" {
			break
		}
		f := strings.Fields(line)
		if !hostField.MatchString(f[0]) {
			return nil, fmt.Errorf("timeline line %q does not start with a host", line)
		}
		if tl[f[0]] != nil {
			return nil, fmt.Errorf("host %s printed twice", f[0])
		}
		rest := line[strings.Index(line, f[0])+len(f[0]):]
		ev := map[string]Event{}
		ms := eventRe.FindAllStringSubmatchIndex(rest, -1)
		read := 0
		for _, m := range ms {
			if strings.TrimSpace(rest[read:m[0]]) != "" {
				return nil, fmt.Errorf("%s: unreadable %q", f[0], rest[read:m[0]])
			}
			read = m[1]
			what := rest[m[2]:m[3]]
			if !known[what] {
				return nil, fmt.Errorf("%s: unknown event %q", f[0], what)
			}
			if _, dup := ev[what]; dup {
				return nil, fmt.Errorf("%s: event %s printed twice", f[0], what)
			}
			at, err := strconv.ParseFloat(rest[m[4]:m[5]], 64)
			if err != nil {
				return nil, fmt.Errorf("%s %s: %w", f[0], what, err)
			}
			e := Event{At: at}
			if m[6] >= 0 {
				e.Note = strings.TrimSpace(rest[m[6]:m[7]])
			}
			ev[what] = e
		}
		if strings.TrimSpace(rest[read:]) != "" {
			return nil, fmt.Errorf("%s: unreadable %q", f[0], rest[read:])
		}
		tl[f[0]] = ev
	}
	return tl, nil
}

// order: event a is seen no later than b on every host (a first sighting;
// the demo polls twice a second, so only the order of causes is checked).
var order = [][2]string{
	{"claimed", "install"}, {"install", "join"}, {"claimed", "registered"},
	{"registered", "ready"}, {"ready", "leave"}, {"leave", "available"},
}

// CheckColdCycle lists what is wrong with a timeline of a cold scale cycle
// 0 → want → 0: exactly want hosts, each with every event once, in causal
// order, non-negative, the install, join and leave durations noted.
func CheckColdCycle(tl map[string]map[string]Event, want int) []string {
	var bad []string
	if len(tl) != want {
		bad = append(bad, fmt.Sprintf("%d hosts on the timeline, want %d", len(tl), want))
	}
	hosts := make([]string, 0, len(tl))
	for h := range tl {
		hosts = append(hosts, h)
	}
	sort.Strings(hosts)
	notes := map[string]string{"install": "(install took ", "join": "(join took ", "available": "(leave took "}
	for _, h := range hosts {
		ev := tl[h]
		for _, e := range Events {
			got, ok := ev[e]
			switch {
			case !ok:
				bad = append(bad, fmt.Sprintf("%s: no %s", h, e))
			case got.At < 0:
				bad = append(bad, fmt.Sprintf("%s: %s at %.1fs", h, e, got.At))
			case notes[e] != "" && !strings.HasPrefix(got.Note, notes[e]):
				bad = append(bad, fmt.Sprintf("%s: %s noted %q, want %q…", h, e, got.Note, notes[e]))
			}
		}
		for _, o := range order {
			a, okA := ev[o[0]]
			b, okB := ev[o[1]]
			if okA && okB && a.At > b.At {
				bad = append(bad, fmt.Sprintf("%s: %s (+%.1fs) after %s (+%.1fs)", h, o[0], a.At, o[1], b.At))
			}
		}
	}
	return bad
}
