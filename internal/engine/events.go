package engine

import (
	"bytes"
	"encoding/json"
	"sync/atomic"
	"time"
)

// Event is one line of the kpssh_events stdout callback
// (playbooks/collections/ansible_collections/dklesev/kpssh/plugins/callback/kpssh_events.py).
type Event struct {
	V     int    `json:"v"`
	Event string `json:"event"` // start play task ok failed unreachable skipped no_hosts no_hosts_remaining stats
	Name  string `json:"name,omitempty"`
	Task  string `json:"task,omitempty"`
	Host  string `json:"host,omitempty"`
	// Internal marks the engine's own tasks ("connect", "script").
	Internal        string `json:"internal,omitempty"`
	Handler         bool   `json:"handler,omitempty"`
	Changed         bool   `json:"changed,omitempty"`
	IgnoreErrors    bool   `json:"ignore_errors,omitempty"`
	Censored        bool   `json:"censored,omitempty"`
	RC              *int   `json:"rc,omitempty"`
	Msg             string `json:"msg,omitempty"`
	MsgTruncated    bool   `json:"msg_truncated,omitempty"`
	Stdout          string `json:"stdout,omitempty"`
	StdoutTruncated bool   `json:"stdout_truncated,omitempty"`
	Stderr          string `json:"stderr,omitempty"`
	StderrTruncated bool   `json:"stderr_truncated,omitempty"`
	Exception       string `json:"exception,omitempty"`
	// Diff (ok events of changed tasks, with --diff) is the task's rendered diff.
	Diff          string `json:"diff,omitempty"`
	DiffTruncated bool   `json:"diff_truncated,omitempty"`
	Hosts         int    `json:"hosts,omitempty"`
	// AnsibleVersion (start) is the ansible-core version that runs the playbook.
	AnsibleVersion string `json:"ansible_version,omitempty"`
	Totals         *Stats `json:"totals,omitempty"`
}

// Stats are the playbook's final per-host counters, summed.
type Stats struct {
	OK          int `json:"ok"`
	Changed     int `json:"changed"`
	Failures    int `json:"failures"`
	Unreachable int `json:"unreachable"`
	Skipped     int `json:"skipped"`
	Rescued     int `json:"rescued"`
	Ignored     int `json:"ignored"`
}

// Internal task markers (task var kpssh_internal).
const (
	internalConnect = "connect"
	internalScript  = "script"
)

// EventVersion is the stream version this parser understands.
const EventVersion = 1

// ParseEventLine decodes one line of the stream. Lines that are not a JSON
// object of our version with an event name (warnings, junk) are ignored.
func ParseEventLine(line []byte) (Event, bool) {
	line = bytes.TrimSpace(line)
	if len(line) < 2 || line[0] != '{' {
		return Event{}, false
	}
	var ev Event
	if err := json.Unmarshal(line, &ev); err != nil || ev.V != EventVersion || ev.Event == "" {
		return Event{}, false
	}
	return ev, true
}

// Summary is what a run's event stream says.
type Summary struct {
	Started bool // the playbook loaded and started (parse errors happen before)
	// AnsibleVersion is the ansible-core version the start event named.
	AnsibleVersion string
	Plays          int
	// LastTask is the most recently started task (the one running at a timeout).
	LastTask         string
	LastTaskInternal string
	// Reached: the host answered an authenticated session (the connect check
	// succeeded, or any task produced a result on it).
	Reached bool
	// Failed is the first non-ignored task failure, Unreachable the first
	// unreachable result.
	Failed      *Event
	Unreachable *Event
	Stats       *Stats
	// Changed are the ok events of the profile's changed tasks (not the
	// engine's own), at most MaxChanges.
	Changed []Event
	OKs     int
	Events  int
	Ignored int // lines that were not events
}

// Add folds one event into the summary.
func (s *Summary) Add(ev Event) {
	s.Events++
	switch ev.Event {
	case "start":
		s.Started = true
		s.AnsibleVersion = ev.AnsibleVersion
	case "play":
		s.Plays++
	case "task":
		s.LastTask, s.LastTaskInternal = ev.Task, ev.Internal
	case "ok":
		s.OKs++
		s.Reached = true
		if ev.Changed && ev.Internal == "" && len(s.Changed) < MaxChanges {
			s.Changed = append(s.Changed, ev)
		}
	case "failed":
		s.Reached = true
		if !ev.IgnoreErrors && s.Failed == nil {
			e := ev
			s.Failed = &e
		}
	case "unreachable":
		if ev.Internal != internalConnect {
			// a later task: the connect check had reached the host
			s.Reached = true
		}
		if s.Unreachable == nil {
			e := ev
			s.Unreachable = &e
		}
	case "stats":
		if ev.Totals != nil {
			st := *ev.Totals
			s.Stats = &st
		}
	}
}

// maxEventLine bounds one stream line; longer lines are dropped.
const maxEventLine = 1 << 20

// eventWriter is the ansible-playbook stdout sink: it splits lines, parses
// events into a Summary and keeps nothing else. Written by one goroutine
// (exec's copier); read after Wait. onEvent may be set while a warm runner
// idles (its copier is running), hence atomic.
type eventWriter struct {
	sum      Summary
	buf      []byte
	skipping bool // inside an over-long line
	onEvent  atomic.Pointer[func(Event)]
}

// TaskProgress is a task of a running phase as it starts ("started") and
// ends ("ok", "changed", "failed", "unreachable", "skipped", with how long
// it took since it started). Task is redacted; no output or message is
// ever carried (they may hold what redaction cannot know).
type TaskProgress struct {
	Task     string
	Internal string // the engine's own tasks: "connect", "script", …
	Status   string
	Duration time.Duration
}

// progressTracker turns the event stream into TaskProgress calls. Only
// the event goroutine uses it.
type progressTracker struct {
	cb    func(TaskProgress)
	red   *Redactor
	now   func() time.Time
	start time.Time
}

func newProgress(cb func(TaskProgress), red *Redactor) func(Event) {
	if cb == nil {
		return nil
	}
	p := &progressTracker{cb: cb, red: red, now: time.Now}
	return p.event
}

func (p *progressTracker) event(ev Event) {
	tp := TaskProgress{Task: p.red.Redact(ev.Task), Internal: ev.Internal, Status: ev.Event}
	switch ev.Event {
	case "task":
		p.start = p.now()
		tp.Status = "started"
	case "ok", "failed", "unreachable", "skipped":
		if ev.Event == "ok" && ev.Changed {
			tp.Status = "changed"
		}
		if !p.start.IsZero() {
			tp.Duration = p.now().Sub(p.start)
		}
	default:
		return
	}
	p.cb(tp)
}

func (w *eventWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			if !w.skipping {
				if len(w.buf)+len(p) > maxEventLine {
					w.buf, w.skipping = w.buf[:0], true
					w.sum.Ignored++
				} else {
					w.buf = append(w.buf, p...)
				}
			}
			break
		}
		if w.skipping {
			w.skipping = false
		} else if len(w.buf)+i > maxEventLine {
			w.sum.Ignored++
		} else {
			w.line(append(w.buf, p[:i]...))
		}
		w.buf = w.buf[:0]
		p = p[i+1:]
	}
	return n, nil
}

// Close flushes a last line without a newline.
func (w *eventWriter) Close() {
	if len(w.buf) > 0 && !w.skipping {
		w.line(w.buf)
	}
	w.buf, w.skipping = nil, false
}

func (w *eventWriter) line(l []byte) {
	if len(bytes.TrimSpace(l)) == 0 {
		return
	}
	ev, ok := ParseEventLine(l)
	if !ok {
		w.sum.Ignored++
		return
	}
	w.sum.Add(ev)
	if f := w.onEvent.Load(); f != nil {
		(*f)(ev)
	}
}

// ParseEvents parses a whole stream (tests, tools).
func ParseEvents(data []byte) Summary {
	w := &eventWriter{}
	_, _ = w.Write(data)
	w.Close()
	return w.sum
}

// setOnEvent sets (nil: clears) the function every parsed event goes to.
func (w *eventWriter) setOnEvent(f func(Event)) {
	if f == nil {
		w.onEvent.Store(nil)
		return
	}
	w.onEvent.Store(&f)
}
