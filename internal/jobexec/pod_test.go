package jobexec

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dklesev/kpssh/internal/engine"
)

type engineFunc func(context.Context, engine.Request) engine.Result

func (f engineFunc) Run(ctx context.Context, r engine.Request) engine.Result { return f(ctx, r) }

func TestPhaseRun(t *testing.T) {
	req := request()
	req.Key = ""
	in, err := EncodeInput(req)
	if err != nil {
		t.Fatal(err)
	}
	// Inputs of another's choosing under the inputs' name.
	forged := request()
	forged.Key, forged.Source.Script = "", "echo forged"
	other, err := EncodeInput(forged)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		input []byte
		// sum is the --input-sha256 (empty: the input's own, "-": none)
		sum      string
		args     []string
		newEng   func() (engine.Engine, error)
		exit     int
		outcome  engine.Outcome // from the termination message, through judge as the executor reads it
		msg      string
		gotInput bool
	}{
		{"succeeded", in, "", nil, nil, ExitSucceeded, engine.Succeeded, "", true},
		{"failed", in, "", nil, func() (engine.Engine, error) {
			return engineFunc(func(context.Context, engine.Request) engine.Result {
				return engine.Result{Outcome: engine.Failed, FailedTask: "kpssh join", RC: 4, ExitCode: 2, Message: "join failed", Touched: true}
			}), nil
		}, ExitFailed, engine.Failed, "join failed", true},
		{"bad input", []byte(`{"version":7}`), "", nil, nil, ExitUsage, engine.ConfigError, "input version 7", false},
		{"empty input", []byte{}, "", nil, nil, ExitUsage, engine.ConfigError, "is empty", false},
		{"no engine", in, "", nil, func() (engine.Engine, error) { return nil, errors.New("ansible-playbook not found") }, ExitUsage, engine.ConfigError, "ansible-playbook not found", false},
		{"stray argument", in, "", []string{"extra"}, nil, ExitUsage, "", "", false},
		{"tampered input", other, digest(in), nil, nil, ExitInputMismatch, engine.ConfigError,
			"refused the inputs Secret /kpssh-join-x, not the one written for Job kpssh-join-x: phase-run: refusing the inputs", false},
		{"no digest", in, "-", nil, nil, ExitUsage, engine.ConfigError, "--input-sha256 must be the 64 hex digits", false},
		{"bad digest", in, "abc", nil, nil, ExitUsage, engine.ConfigError, "--input-sha256 must be the 64 hex digits", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			inPath, term := filepath.Join(dir, "request.json"), filepath.Join(dir, "termination-log")
			if err := os.WriteFile(inPath, c.input, 0o400); err != nil {
				t.Fatal(err)
			}
			var got *engine.Request
			newEng := c.newEng
			if newEng == nil {
				newEng = func() (engine.Engine, error) {
					return engineFunc(func(_ context.Context, r engine.Request) engine.Result {
						got = &r
						return engine.Result{Outcome: engine.Succeeded, Touched: true}
					}), nil
				}
			} else {
				inner := newEng
				newEng = func() (engine.Engine, error) {
					e, err := inner()
					if err != nil {
						return nil, err
					}
					return engineFunc(func(ctx context.Context, r engine.Request) engine.Result { got = &r; return e.Run(ctx, r) }), nil
				}
			}
			var stdout, stderr bytes.Buffer
			args := []string{"--input", inPath, "--termination-log", term}
			switch c.sum {
			case "":
				args = append(args, "--"+DigestFlag, digest(c.input))
			case "-":
			default:
				args = append(args, "--"+DigestFlag, c.sum)
			}
			args = append(args, c.args...)
			code := PhaseRun(args, PhaseRunOptions{NewEngine: newEng, Stdout: &stdout, Stderr: &stderr})
			if code != c.exit {
				t.Fatalf("exit %d, want %d; stderr %s", code, c.exit, stderr.String())
			}
			if (got != nil) != c.gotInput {
				t.Fatalf("engine ran: %v", got != nil)
			}
			if got != nil {
				if got.Progress == nil {
					t.Fatal("the engine got no Progress: a long phase is silent in the pod's log")
				}
				r := *got
				r.Progress = nil
				if !reflect.DeepEqual(r, req) {
					t.Fatalf("engine got %+v\nwant %+v", r, req)
				}
			}
			if c.outcome == "" {
				return
			}
			msg, err := os.ReadFile(term)
			if err != nil {
				t.Fatal(err)
			}
			// What the executor makes of this container ending.
			st := judge(jobForTest(), []corev1.Pod{{Status: corev1.PodStatus{Phase: corev1.PodFailed, ContainerStatuses: []corev1.ContainerStatus{{Name: ContainerName,
				State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: int32(code), Reason: "Error", Message: string(msg)}}}}}}}, timeNow())
			if !st.done || st.res.Outcome != c.outcome || !strings.Contains(st.res.Message, c.msg) {
				t.Fatalf("executor reads %+v, want %s with %q", st.res, c.outcome, c.msg)
			}
			// Logs and the message never carry the inputs' secrets.
			for _, s := range []string{"0123456789abcdef", "sekret-value-123", fakeKey} {
				if strings.Contains(stdout.String()+stderr.String()+string(msg), s) {
					t.Fatalf("secret %q in the pod's output", s)
				}
			}
		})
	}
}

// Each task that ends is one line of the pod's log, in order with the
// run's own lines; started tasks are not (the end says all).
func TestPhaseRunLogsTasks(t *testing.T) {
	req := request()
	in, err := EncodeInput(req)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	inPath, term := filepath.Join(dir, "request.json"), filepath.Join(dir, "termination-log")
	if err := os.WriteFile(inPath, in, 0o400); err != nil {
		t.Fatal(err)
	}
	eng := engineFunc(func(_ context.Context, r engine.Request) engine.Result {
		for _, tp := range []engine.TaskProgress{
			{Internal: "connect", Task: "kpssh: connect", Status: "started"},
			{Internal: "connect", Task: "kpssh: connect", Status: "ok", Duration: 210 * time.Millisecond},
			{Task: `fetch "kubelet"`, Status: "started"},
			{Task: `fetch "kubelet"`, Status: "changed", Duration: 61234567 * time.Microsecond},
			{Task: "start kubelet", Status: "started"},
			{Task: "start kubelet", Status: "failed", Duration: time.Second},
		} {
			r.Progress(tp)
		}
		return engine.Result{Outcome: engine.Failed, FailedTask: "start kubelet", Touched: true}
	})
	var stdout, stderr bytes.Buffer
	code := PhaseRun([]string{"--input", inPath, "--termination-log", term, "--" + DigestFlag, digest(in)},
		PhaseRunOptions{NewEngine: func() (engine.Engine, error) { return eng, nil }, Stdout: &stdout, Stderr: &stderr})
	if code != ExitFailed {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	want := []string{
		`phase-run: join task "kpssh: connect" ok in 210ms`,
		`phase-run: join task "fetch \"kubelet\"" changed in 1m1.235s`,
		`phase-run: join task "start kubelet" failed in 1s`,
	}
	if len(lines) != len(want)+2 || !strings.HasPrefix(lines[0], "phase-run: join on ") || !strings.HasPrefix(lines[len(lines)-1], `{"phase":"join","result":`) {
		t.Fatalf("pod log:\n%s", stdout.String())
	}
	if !reflect.DeepEqual(lines[1:len(lines)-1], want) {
		t.Fatalf("task lines %q, want %q", lines[1:len(lines)-1], want)
	}
}

func jobForTest() *batchv1.Job {
	return &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "kpssh-join-x"}}
}

func timeNow() time.Time { return time.Now() }
