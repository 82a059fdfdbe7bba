package jobexec

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/dklesev/kpssh/internal/engine"
)

// The pod side: `controller phase-run` (cmd/controller) reads the request
// from the mounted inputs Secret, checks it is the one the Job was made for
// (its SHA-256, given by the Job's command), runs it with the Local engine
// (the same code as executor local) and writes the redacted result as the
// container's termination message.

// Paths inside the phase pod.
const (
	InputDir        = "/var/run/kpssh/input"
	InputKey        = "request.json"
	TerminationLog  = "/dev/termination-log"
	PhaseRunCommand = "phase-run"
	// DigestFlag names the SHA-256 (hex) of the inputs the Job was made for.
	DigestFlag = "input-sha256"
)

// The phase container's environment: operator content paths (colon lists),
// the same settings the controller reads.
const (
	EnvRolesPath       = "KPSSH_ROLES_PATH"
	EnvCollectionsPath = "KPSSH_COLLECTIONS_PATH"
)

// Exit codes of PhaseRun.
const (
	ExitSucceeded = 0 // the phase succeeded
	ExitFailed    = 1 // it ran and did not succeed (the result says why)
	ExitUsage     = 2 // no result: bad usage or input
	// ExitInputMismatch: no result, the inputs are not the ones the Job was
	// made for (their SHA-256 differs from --input-sha256); nothing ran.
	ExitInputMismatch = 3
)

// PhaseRunOptions configure the pod side (tests point them elsewhere).
type PhaseRunOptions struct {
	// NewEngine builds the engine (nil: engine.New with the image's
	// collection and roles, no warm runner: a pod runs one phase).
	NewEngine func() (engine.Engine, error)
	Stdout    io.Writer
	Stderr    io.Writer
}

// PhaseRun is `controller phase-run [--input FILE] --input-sha256 HEX
// [--termination-log FILE]`. It returns the process exit status: 0 the phase
// succeeded, 1 it ran and did not (the termination message has the result),
// 2 no result (usage or unreadable input), 3 no result: the input's SHA-256
// is not the one given (the message says why in plain text).
func PhaseRun(args []string, o PhaseRunOptions) int {
	if o.Stdout == nil {
		o.Stdout = os.Stdout
	}
	if o.Stderr == nil {
		o.Stderr = os.Stderr
	}
	fs := flag.NewFlagSet(PhaseRunCommand, flag.ContinueOnError)
	fs.SetOutput(o.Stderr)
	input := fs.String("input", InputDir+"/"+InputKey, "the phase request (the inputs Secret, mounted read-only)")
	term := fs.String("termination-log", TerminationLog, "where the result goes (the container's terminationMessagePath)")
	want := fs.String(DigestFlag, "", "the SHA-256 (hex) of the inputs the Job was made for: other inputs are refused")
	if err := fs.Parse(args); err != nil {
		return ExitUsage
	}
	if fs.NArg() != 0 {
		fmt.Fprintf(o.Stderr, "phase-run: unexpected arguments %q\n", fs.Args())
		return ExitUsage
	}
	failWith := func(code int, err error) int {
		msg := "phase-run: " + err.Error()
		fmt.Fprintln(o.Stderr, msg)
		// Plain text: the controller reports it as the pod's failure.
		_ = os.WriteFile(*term, []byte(validPrefix(msg, MaxTerminationMessage)), 0o644)
		return code
	}
	fail := func(err error) int { return failWith(ExitUsage, err) }
	if !validDigest(*want) {
		return fail(fmt.Errorf("--%s must be the 64 hex digits of the inputs' SHA-256 (the Job's command gives it), not %q", DigestFlag, validPrefix(*want, 80)))
	}
	b, err := readBounded(*input, maxInput)
	if err != nil {
		return fail(err)
	}
	// Before anything reads them: inputs the controller did not write
	// (a Secret someone else created under the predictable name) never run.
	if got := digest(b); got != strings.ToLower(*want) {
		return failWith(ExitInputMismatch, fmt.Errorf("refusing the inputs: %s has sha256 %s, the Job was made for sha256 %s "+
			"(the inputs Secret is not the one the controller wrote for this Job); nothing ran", *input, got, strings.ToLower(*want)))
	}
	req, err := DecodeInput(b)
	if err != nil {
		return fail(err)
	}
	var eng engine.Engine
	if o.NewEngine != nil {
		eng, err = o.NewEngine()
	} else {
		eng, err = defaultEngine()
	}
	if err != nil {
		return fail(fmt.Errorf("phase engine: %w", err))
	}
	if c, ok := eng.(io.Closer); ok {
		defer c.Close()
	}
	// SIGTERM (Job deleted, pod evicted, activeDeadlineSeconds) ends the run
	// the way a timeout does: interrupted, killed, a TimedOut result.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	out := &lockedWriter{w: o.Stdout}
	fmt.Fprintf(out, "phase-run: %s on %s starting (timeout %s)\n", req.Phase, req.Conn.Address, req.Timeout)
	// Each task that ends, one line (names redacted by the engine, no
	// output): kubectl logs shows where a long phase is.
	req.Progress = func(tp engine.TaskProgress) {
		if tp.Status != "started" {
			fmt.Fprintln(out, taskLine(req.Phase, tp))
		}
	}
	res := eng.Run(ctx, req)
	msg := EncodeResult(res)
	if err := os.WriteFile(*term, msg, 0o644); err != nil {
		fmt.Fprintf(o.Stderr, "phase-run: writing the result to %s: %v\n", *term, err)
		return ExitUsage
	}
	// The same (redacted) result in the pod's log, for kubectl logs.
	line, _ := json.Marshal(struct {
		Phase  engine.Phase `json:"phase"`
		Result string       `json:"result"`
	}{req.Phase, string(msg)})
	fmt.Fprintln(out, string(line))
	if res.Outcome != engine.Succeeded {
		return ExitFailed
	}
	return ExitSucceeded
}

// taskLine is the pod log's line for a task that ended: phase, task
// (quoted: a name may hold anything), status and duration.
func taskLine(ph engine.Phase, tp engine.TaskProgress) string {
	task := tp.Task
	if task == "" {
		task = tp.Internal
	}
	return fmt.Sprintf("phase-run: %s task %q %s in %s", ph, task, tp.Status, tp.Duration.Round(time.Millisecond))
}

// lockedWriter serialises the progress lines (the engine's output
// goroutine) with the run's own.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func defaultEngine() (engine.Engine, error) {
	coll, err := engine.FindCollectionsPath()
	if err != nil {
		return nil, err
	}
	o := engine.Options{CollectionsPath: coll, NoWarmRunner: true, DefaultTimeout: engine.DefaultTimeout}
	if roles, err := engine.FindRolesPath(); err == nil {
		o.RolesPath = []string{roles}
	}
	// the operator content the Job mounts, searched after the shipped
	// content as in the controller (Options.RolesPath, CollectionsPaths)
	o.RolesPath = append(o.RolesPath, engine.SplitPaths(os.Getenv(EnvRolesPath))...)
	o.ExtraCollectionsPaths = engine.SplitPaths(os.Getenv(EnvCollectionsPath))
	return engine.New(o)
}

func validDigest(s string) bool {
	if len(s) != 64 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

func readBounded(path string, n int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading the input: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, n+1))
	if err != nil {
		return nil, fmt.Errorf("reading the input: %w", err)
	}
	if int64(len(b)) > n {
		return nil, fmt.Errorf("input %s is over %d bytes", path, n)
	}
	if len(b) == 0 {
		return nil, errors.New("input " + path + " is empty")
	}
	return b, nil
}
