package phase

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/klog/v2"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/engine"
	"github.com/dklesev/kpssh/internal/providers/hostkey"
	"github.com/dklesev/kpssh/internal/providers/pool"
	"github.com/dklesev/kpssh/internal/sshx/sshtest"
)

// scriptEngine plays a run: script gets the request (its Progress) and
// returns the result when the run is to end.
type scriptEngine func(ctx context.Context, req engine.Request) engine.Result

func (f scriptEngine) Run(ctx context.Context, req engine.Request) engine.Result { return f(ctx, req) }

// countingWriter is the pool's narrow setter, counted: every Update that
// returned is announced on done (its error), and none may start once the
// test closes the door (after the run's outcome came back).
type countingWriter struct {
	w      StatusWriter
	done   chan error
	closed atomic.Bool
	late   atomic.Int32
	calls  atomic.Int32
}

func (c *countingWriter) Update(ctx context.Context, name string, cl pool.Claim, mutate func(*v1beta1.SSHHost)) (*v1beta1.SSHHost, error) {
	if c.closed.Load() {
		c.late.Add(1)
	}
	c.calls.Add(1)
	h, err := c.w.Update(ctx, name, cl, mutate)
	c.done <- err
	return h, err
}

// progressWorld: one claimed host in a fake API server, the real pool's
// setter over it, a Runner whose engine the test scripts, a fake clock.
type progressWorld struct {
	t      *testing.T
	c      client.WithWatch
	pool   *pool.Pool
	w      *countingWriter
	clk    *clocktesting.FakeClock
	r      *Runner
	claim  pool.Claim
	logs   *logLines
	ctx    context.Context
	extern func(ctx context.Context, c client.Client) // a concurrent writer, before the first progress patch
}

type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) add(prefix, args string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, args)
}

func (l *logLines) all() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

func newProgressWorld(t *testing.T) *progressWorld {
	t.Helper()
	_, pem := sshtest.NewKey(t)
	pw := &progressWorld{t: t, clk: clocktesting.NewFakeClock(time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)),
		claim: pool.Claim{Name: "claim-1", UID: "uid-1"}, logs: &logLines{}}
	h := host("SHA256:x")
	h.Status.ClaimRef = &v1beta1.ClaimRef{Name: pw.claim.Name, UID: pw.claim.UID}
	h.Status.State = v1beta1.HostClaimed
	var once sync.Once
	pw.c = fake.NewClientBuilder().WithScheme(scheme.Scheme).WithStatusSubresource(&v1beta1.SSHHost{}).
		WithObjects(h, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "pool", Name: "key"}, Data: map[string][]byte{"privateKey": pem}}).
		WithInterceptorFuncs(interceptor.Funcs{SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			if pw.extern != nil {
				once.Do(func() { pw.extern(ctx, c) })
			}
			return c.SubResource(sub).Patch(ctx, obj, patch, opts...)
		}}).Build()
	pw.pool = pool.New(pw.c, pw.c, "pool")
	pw.w = &countingWriter{w: pw.pool, done: make(chan error, 16)}
	pw.r = New(nil, hostkey.New(pw.c), &recorder{})
	pw.r.HostKey = func(context.Context, engine.Connection, string) (string, error) { return "ssh-ed25519 AAAAkey", nil }
	pw.r.Status, pw.r.Clock, pw.r.Now = pw.w, pw.clk, pw.clk.Now
	pw.r.ProgressInterval = 5 * time.Second
	// As the callers' contexts carry it (the host controller's reconcile,
	// the cloud provider's withHost).
	pw.ctx = log.IntoContext(context.Background(), funcr.New(pw.logs.add, funcr.Options{Verbosity: 1}).WithValues("SSHHost", klog.KObj(h)))
	return pw
}

func (pw *progressWorld) host() *v1beta1.SSHHost {
	pw.t.Helper()
	h := &v1beta1.SSHHost{}
	if err := pw.c.Get(context.Background(), client.ObjectKey{Namespace: "pool", Name: "h1"}, h); err != nil {
		pw.t.Fatal(err)
	}
	return h
}

// step moves the clock once the progress goroutine waits on its timer
// (else a timer armed after the step would miss it).
func (pw *progressWorld) step(d time.Duration) {
	pw.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !pw.clk.HasWaiters() {
		if time.Now().After(deadline) {
			pw.t.Fatal("the progress writer never armed its timer")
		}
		time.Sleep(time.Millisecond)
	}
	pw.clk.Step(d)
}

// wrote waits for the next progress write and returns the host after it.
func (pw *progressWorld) wrote() *v1beta1.SSHHost {
	pw.t.Helper()
	select {
	case err := <-pw.w.done:
		if err != nil {
			pw.t.Fatalf("progress write: %v", err)
		}
	case <-time.After(10 * time.Second):
		pw.t.Fatal("no progress write")
	}
	return pw.host()
}

// quiet asserts that no progress write happens (the throttle holds).
func (pw *progressWorld) quiet(what string) {
	pw.t.Helper()
	select {
	case err := <-pw.w.done:
		pw.t.Fatalf("%s: a progress write happened (err %v): %+v", what, err, pw.host().Status.LastPhase)
	case <-time.After(150 * time.Millisecond):
	}
}

// final is the caller's end-of-phase write (as create.go does it).
func (pw *progressWorld) final(out Outcome) {
	pw.t.Helper()
	pw.w.closed.Store(true)
	if _, err := pw.pool.Update(context.Background(), "h1", pw.claim, func(h *v1beta1.SSHHost) { h.Status.LastPhase = out.LastPhase }); err != nil {
		pw.t.Fatal(err)
	}
}

func started(task string) engine.TaskProgress {
	return engine.TaskProgress{Task: task, Status: "started"}
}

func mustRunning(t *testing.T, h *v1beta1.SSHHost, task string, start time.Time, ran time.Duration) {
	t.Helper()
	lp := h.Status.LastPhase
	if lp == nil || lp.Result != v1beta1.PhaseRunning || lp.Phase != v1beta1.PhaseInstall || lp.CurrentTask != task ||
		!lp.StartedAt.Time.Equal(start.Truncate(time.Second)) || lp.Duration.Duration != ran {
		t.Fatalf("lastPhase %+v, want install Running at %q since %s, %s in", lp, task, start, ran)
	}
}

// A long phase shows in lastPhase: nothing for a short while (a quick
// phase costs no write), then Running at the task it is at, at most one
// write per interval with the latest task (those between are skipped),
// none when nothing changed; each ended task is logged at V(1). Then the
// caller's final write wins and nothing comes after it.
func TestProgressThrottledAndFinalWins(t *testing.T) {
	pw := newProgressWorld(t)
	start := pw.clk.Now()
	pw.r.Engine = scriptEngine(func(ctx context.Context, req engine.Request) engine.Result {
		p := req.Progress
		p(engine.TaskProgress{Internal: "connect", Status: "started"})
		p(engine.TaskProgress{Internal: "connect", Status: "ok", Duration: 120 * time.Millisecond})
		p(started("fetch kubelet"))
		pw.step(4 * time.Second)
		pw.quiet("before the first interval")
		pw.step(time.Second)
		mustRunning(t, pw.wrote(), "fetch kubelet", start, 5*time.Second)

		p(engine.TaskProgress{Task: "fetch kubelet", Status: "changed", Duration: 6 * time.Second})
		p(started("unpack"))
		p(engine.TaskProgress{Task: "unpack", Status: "ok", Duration: time.Second})
		p(started("write kubelet config"))
		pw.step(2 * time.Second)
		pw.quiet("within the interval")
		pw.step(3 * time.Second)
		mustRunning(t, pw.wrote(), "write kubelet config", start, 10*time.Second)

		pw.step(5 * time.Second)
		pw.quiet("nothing new")
		p(engine.TaskProgress{Task: "write kubelet config", Status: "changed", Duration: 7 * time.Second})
		return engine.Result{Outcome: engine.Succeeded, Duration: 16 * time.Second}
	})
	out := pw.r.Run(pw.ctx, pw.host(), testProfile(), engine.PhaseInstall, engine.Context{}, nil)
	if !out.OK() {
		t.Fatalf("outcome %+v", out)
	}
	pw.final(out)
	pw.clk.Step(time.Minute) // no timer left to fire
	pw.quiet("after the final write")
	if lp := pw.host().Status.LastPhase; lp.Result != v1beta1.PhaseSucceeded || lp.CurrentTask != "" || lp.Duration.Duration != 16*time.Second {
		t.Fatalf("final lastPhase %+v", lp)
	}
	if n, late := pw.w.calls.Load(), pw.w.late.Load(); n != 2 || late != 0 {
		t.Fatalf("%d progress writes (%d after the outcome), want 2 and 0", n, late)
	}
	logs := pw.logs.all()
	for _, want := range []string{`"task"="connect" "status"="ok" "duration"="120ms"`, `"task"="fetch kubelet" "status"="changed" "duration"="6s"`,
		`"task"="unpack" "status"="ok"`, `"task"="write kubelet config" "status"="changed" "duration"="7s"`, `"phase"="install"`} {
		if !strings.Contains(logs, want) {
			t.Errorf("log lacks %s:\n%s", want, logs)
		}
	}
	for _, l := range strings.Split(logs, "\n") {
		if n := strings.Count(l, `"SSHHost"=`); n != 1 {
			t.Errorf("the host key %d times (one spelling, once): %s", n, l)
		}
	}
	if strings.Contains(logs, `"status"="started"`) {
		t.Errorf("started tasks logged (ended ones only):\n%s", logs)
	}
}

// A run that ends while a progress write is in flight: the outcome comes
// back only after that write has ended (cancelled), so the caller's final
// write is the last one and no progress write follows it.
func TestProgressInFlightWriteEndsBeforeOutcome(t *testing.T) {
	pw := newProgressWorld(t)
	entered, returned := make(chan struct{}), atomic.Bool{}
	blocking := &blockingWriter{entered: entered, returned: &returned}
	pw.r.Status = blocking
	pw.r.Engine = scriptEngine(func(ctx context.Context, req engine.Request) engine.Result {
		req.Progress(started("slow task"))
		pw.step(5 * time.Second)
		<-entered // the write hangs in the API call
		return engine.Result{Outcome: engine.Failed, FailedTask: "slow task", Duration: 6 * time.Second}
	})
	out := pw.r.Run(pw.ctx, pw.host(), testProfile(), engine.PhaseInstall, engine.Context{}, nil)
	if !returned.Load() {
		t.Fatal("Run returned while its progress write was still in flight")
	}
	pw.final(out)
	pw.clk.Step(time.Minute) // no timer left to fire
	if n := blocking.calls.Load(); n != 1 {
		t.Fatalf("%d progress writes, want the one cancelled", n)
	}
	if lp := pw.host().Status.LastPhase; lp.Result != v1beta1.PhaseFailed || lp.FailedTask != "slow task" {
		t.Fatalf("final lastPhase %+v", lp)
	}
}

type blockingWriter struct {
	entered  chan struct{}
	returned *atomic.Bool
	calls    atomic.Int32
}

func (b *blockingWriter) Update(ctx context.Context, _ string, _ pool.Claim, _ func(*v1beta1.SSHHost)) (*v1beta1.SSHHost, error) {
	if b.calls.Add(1) > 1 {
		return nil, errors.New("a second progress write")
	}
	close(b.entered)
	<-ctx.Done()
	b.returned.Store(true)
	return nil, ctx.Err()
}

// A concurrent writer between the progress write's read and its patch: a
// 409, read again, written again — both writes kept (a CAS, never
// last-write-wins). A claim lost meanwhile stops the writes for the run.
func TestProgressConflicts(t *testing.T) {
	t.Run("conflict: read again, both kept", func(t *testing.T) {
		pw := newProgressWorld(t)
		probed := metav1.NewTime(time.Date(2026, 12, 5, 9, 0, 0, 0, time.UTC))
		conflicts := 0
		pw.extern = func(ctx context.Context, c client.Client) {
			h := pw.host()
			h.Status.LastProbeTime = &probed
			if err := c.Status().Update(ctx, h); err != nil {
				t.Errorf("concurrent write: %v", err)
			}
			conflicts++
		}
		pw.r.Engine = scriptEngine(func(ctx context.Context, req engine.Request) engine.Result {
			req.Progress(started("a"))
			pw.step(5 * time.Second)
			h := pw.wrote()
			mustRunning(t, h, "a", pw.clk.Now().Add(-5*time.Second), 5*time.Second)
			if h.Status.LastProbeTime == nil || !h.Status.LastProbeTime.Equal(&probed) {
				t.Errorf("the concurrent write was overwritten: lastProbeTime %v", h.Status.LastProbeTime)
			}
			return engine.Result{Outcome: engine.Succeeded}
		})
		pw.r.Run(pw.ctx, pw.host(), testProfile(), engine.PhaseInstall, engine.Context{}, nil)
		if conflicts != 1 {
			t.Fatalf("no conflict was made (%d)", conflicts)
		}
	})
	t.Run("claim lost: no more writes", func(t *testing.T) {
		pw := newProgressWorld(t)
		pw.extern = func(ctx context.Context, c client.Client) {
			h := pw.host()
			pool.Released(h, v1beta1.HostPending, "stale claim", metav1.Now())
			if err := c.Status().Update(ctx, h); err != nil {
				t.Errorf("concurrent release: %v", err)
			}
		}
		pw.r.Engine = scriptEngine(func(ctx context.Context, req engine.Request) engine.Result {
			req.Progress(started("a"))
			pw.step(5 * time.Second)
			select {
			case err := <-pw.w.done:
				if !errors.Is(err, pool.ErrClaimLost) {
					t.Errorf("write after the release: %v, want ErrClaimLost", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("no progress write")
			}
			req.Progress(started("b"))
			time.Sleep(50 * time.Millisecond)
			if pw.clk.HasWaiters() {
				t.Error("the writer still waits to write for a claim it lost")
			}
			return engine.Result{Outcome: engine.Succeeded}
		})
		pw.r.Run(pw.ctx, pw.host(), testProfile(), engine.PhaseInstall, engine.Context{}, nil)
		if h := pw.host(); h.Status.LastPhase != nil || h.Status.ClaimRef != nil || pw.w.calls.Load() != 1 {
			t.Fatalf("after a lost claim: lastPhase %+v claim %+v, %d writes", h.Status.LastPhase, h.Status.ClaimRef, pw.w.calls.Load())
		}
	})
	t.Run("API error: tried again at the next interval", func(t *testing.T) {
		pw := newProgressWorld(t)
		fails := 1
		pw.r.Status = writerFunc(func(ctx context.Context, name string, c pool.Claim, m func(*v1beta1.SSHHost)) (*v1beta1.SSHHost, error) {
			if fails > 0 {
				fails--
				pw.w.done <- apierrors.NewServiceUnavailable("etcd leader change")
				return nil, apierrors.NewServiceUnavailable("etcd leader change")
			}
			return pw.w.Update(ctx, name, c, m)
		})
		pw.r.Engine = scriptEngine(func(ctx context.Context, req engine.Request) engine.Result {
			req.Progress(started("a"))
			pw.step(5 * time.Second)
			if err := <-pw.w.done; !apierrors.IsServiceUnavailable(err) {
				t.Errorf("first write: %v", err)
			}
			pw.step(5 * time.Second)
			mustRunning(t, pw.wrote(), "a", pw.clk.Now().Add(-10*time.Second), 10*time.Second)
			return engine.Result{Outcome: engine.Succeeded}
		})
		pw.r.Run(pw.ctx, pw.host(), testProfile(), engine.PhaseInstall, engine.Context{}, nil)
	})
}

type writerFunc func(ctx context.Context, name string, c pool.Claim, m func(*v1beta1.SSHHost)) (*v1beta1.SSHHost, error)

func (f writerFunc) Update(ctx context.Context, name string, c pool.Claim, m func(*v1beta1.SSHHost)) (*v1beta1.SSHHost, error) {
	return f(ctx, name, c, m)
}

// An unclaimed host (the zombie guard's leave) gets no status write: the
// narrow setters act only under a claim. Its tasks are still logged.
func TestProgressUnclaimedOnlyLogs(t *testing.T) {
	pw := newProgressWorld(t)
	h := pw.host()
	h.Status.ClaimRef = nil
	pw.r.Engine = scriptEngine(func(ctx context.Context, req engine.Request) engine.Result {
		req.Progress(started("stop kubelet"))
		if pw.clk.HasWaiters() {
			t.Error("a progress timer for an unclaimed host")
		}
		req.Progress(engine.TaskProgress{Task: "stop kubelet", Status: "changed", Duration: time.Second})
		return engine.Result{Outcome: engine.Succeeded}
	})
	pw.r.Run(pw.ctx, h, testProfile(), engine.PhaseLeave, engine.Context{}, nil)
	if n := pw.w.calls.Load(); n != 0 {
		t.Fatalf("%d status writes for an unclaimed host", n)
	}
	if !strings.Contains(pw.logs.all(), `"task"="stop kubelet" "status"="changed"`) {
		t.Fatalf("leave's task not logged:\n%s", pw.logs.all())
	}
}

// Which records a progress write may replace: never this run's end (nor
// a later one's), whatever the order the writes arrive in.
func TestOverwritable(t *testing.T) {
	start := time.Date(2026, 12, 5, 10, 0, 0, 700e6, time.UTC) // the API keeps seconds
	at := func(d time.Duration) metav1.Time { return metav1.NewTime(start.Truncate(time.Second).Add(d)) }
	rec := func(ph v1beta1.Phase, r v1beta1.PhaseResult, t metav1.Time) *v1beta1.LastPhase {
		return &v1beta1.LastPhase{Phase: ph, Result: r, StartedAt: t}
	}
	for _, tc := range []struct {
		name string
		lp   *v1beta1.LastPhase
		want bool
	}{
		{"none yet (a fresh claim)", nil, true},
		{"this run's earlier progress", rec(v1beta1.PhaseInstall, v1beta1.PhaseRunning, at(0)), true},
		{"an earlier run's end", rec(v1beta1.PhaseLeave, v1beta1.PhaseSucceeded, at(-time.Hour)), true},
		{"the same phase's earlier end", rec(v1beta1.PhaseInstall, v1beta1.PhaseFailed, at(-time.Second)), true},
		{"this run's end", rec(v1beta1.PhaseInstall, v1beta1.PhaseSucceeded, at(0)), false},
		{"this run's end, failed", rec(v1beta1.PhaseInstall, v1beta1.PhaseFailed, at(0)), false},
		{"a later phase's end", rec(v1beta1.PhaseJoin, v1beta1.PhaseSucceeded, at(2*time.Second)), false},
		{"another phase ended, started the same second", rec(v1beta1.PhaseLeave, v1beta1.PhaseSucceeded, at(0)), true},
	} {
		if got := Overwritable(tc.lp, engine.PhaseInstall, start); got != tc.want {
			t.Errorf("%s: Overwritable %v, want %v", tc.name, got, tc.want)
		}
	}
}
