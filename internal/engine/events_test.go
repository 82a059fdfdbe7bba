package engine

import (
	"reflect"
	"testing"
	"time"
)

// FuzzParseEvents: any byte stream, split anywhere, parses without panicking
// to the same summary as the whole stream, and the summary is consistent.
func FuzzParseEvents(f *testing.F) {
	f.Add([]byte(sampleStream), uint8(7))
	f.Add([]byte(`{"event":"failed","v":1,"rc":-1,"task":"x","ignore_errors":false}`), uint8(1))
	f.Add([]byte(`{"event":"stats","v":1,"totals":null}`+"\n"+`{"event":"unreachable","v":1,"internal":"connect"}`), uint8(3))
	f.Add([]byte("{\"event\":\"ok\",\"v\":1}\r\n{\"v\":1}\n{}\n{\"event\":\"start\",\"v\":1.5}\n\xff\xfe{"), uint8(2))
	f.Fuzz(func(t *testing.T, data []byte, chunk uint8) {
		whole := ParseEvents(data)
		w := &eventWriter{}
		step := int(chunk) + 1
		for i := 0; i < len(data); i += step {
			end := i + step
			if end > len(data) {
				end = len(data)
			}
			n, err := w.Write(data[i:end])
			if err != nil || n != end-i {
				t.Fatalf("Write returned %d, %v", n, err)
			}
		}
		w.Close()
		if !reflect.DeepEqual(whole, w.sum) {
			t.Fatalf("chunked summary differs:\n%+v\n%+v", w.sum, whole)
		}
		if whole.Failed != nil && (whole.Failed.Event != "failed" || whole.Failed.IgnoreErrors) {
			t.Fatalf("Failed holds %+v", whole.Failed)
		}
		if whole.Unreachable != nil && whole.Unreachable.Event != "unreachable" {
			t.Fatalf("Unreachable holds %+v", whole.Unreachable)
		}
		if whole.Failed != nil && !whole.Reached {
			t.Fatal("a failed task result without Reached")
		}
		if whole.Events < 0 || whole.Ignored < 0 || whole.OKs > whole.Events {
			t.Fatalf("counts %+v", whole)
		}
		// decide must cope with whatever the stream said
		for _, code := range []int{0, 1, 2, 4, 99, 250, -1} {
			r := decide(facts{exitCode: code, sum: whole}, NewRedactor("fuzzsecret"))
			switch r.Outcome {
			case Succeeded, Failed, TimedOut, ConfigError:
			default:
				t.Fatalf("outcome %q", r.Outcome)
			}
			if r.Outcome == Succeeded && code != 0 {
				t.Fatalf("exit %d mapped to Succeeded", code)
			}
			if r.Outcome == ConfigError && r.Touched {
				t.Fatal("ConfigError with Touched")
			}
		}
	})
}

// The progress a phase reports: each task when it starts and when it ends,
// with its duration; names redacted; nothing but task, status and time.
func TestProgressTracker(t *testing.T) {
	secret := "s3cr3t-canary-value"
	var got []TaskProgress
	tr := time.Unix(0, 0)
	pt := &progressTracker{cb: func(p TaskProgress) { got = append(got, p) }, red: NewRedactor(secret), now: func() time.Time { return tr }}
	for _, step := range []struct {
		ev      Event
		advance time.Duration
	}{
		{Event{Event: "start"}, 0},
		{Event{Event: "play", Name: "p"}, 0},
		{Event{Event: "task", Task: "write " + secret}, 0},
		{Event{Event: "ok", Task: "write " + secret, Changed: true, Msg: secret}, 250 * time.Millisecond},
		{Event{Event: "task", Task: "check", Internal: "connect"}, 0},
		{Event{Event: "ok", Task: "check"}, 40 * time.Millisecond},
		{Event{Event: "task", Task: "fail"}, 0},
		{Event{Event: "failed", Task: "fail", Stderr: secret}, time.Second},
		{Event{Event: "stats"}, 0},
	} {
		tr = tr.Add(step.advance)
		pt.event(step.ev)
	}
	want := []TaskProgress{
		{Task: "write " + Mask, Status: "started"},
		{Task: "write " + Mask, Status: "changed", Duration: 250 * time.Millisecond},
		{Task: "check", Internal: "connect", Status: "started"},
		{Task: "check", Status: "ok", Duration: 40 * time.Millisecond},
		{Task: "fail", Status: "started"},
		{Task: "fail", Status: "failed", Duration: time.Second},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("progress:\n got %+v\nwant %+v", got, want)
	}
	if newProgress(nil, nil) != nil {
		t.Fatal("no callback: the engine must not track progress")
	}
}
