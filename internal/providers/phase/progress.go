package phase

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/engine"
	"github.com/dklesev/kpssh/internal/providers/pool"
)

// DefaultProgressInterval paces the status writes of a running phase: the
// first no sooner than this after the phase starts (a short phase costs
// none), then at most one per interval, the latest task winning.
const DefaultProgressInterval = 5 * time.Second

// progressWriteTimeout bounds one progress write, its conflict retries
// included.
const progressWriteTimeout = 10 * time.Second

// StatusWriter is the pool's narrow setter (*pool.Pool): mutate is applied
// to a fresh read and written as a compare-and-swap, retried on conflict
// only while the claim holds the host (pool.ErrClaimLost once it does not).
type StatusWriter interface {
	Update(ctx context.Context, name string, c pool.Claim, mutate func(*v1beta1.SSHHost)) (*v1beta1.SSHHost, error)
}

// progress follows one phase run: it logs each task that ended and, on a
// claimed host, keeps status.lastPhase at Running with the current task.
// observe runs on the engine's output goroutine and never blocks; the
// writes happen on progress's own goroutine, which stop ends before the
// run's outcome is returned, so the caller's final lastPhase write comes
// after the last progress write.
type progress struct {
	log      logr.Logger
	phase    engine.Phase
	start    time.Time
	clk      clock.Clock
	interval time.Duration

	mu   sync.Mutex
	task string
	seq  uint64 // bumped by every started task; 1 = the run itself
	kick chan struct{}

	stopped atomic.Bool
	halt    chan struct{}
	done    chan struct{}
	cancel  context.CancelFunc
}

func (r *Runner) newProgress(ctx context.Context, h *v1beta1.SSHHost, ph engine.Phase, start time.Time) *progress {
	p := &progress{
		// The host is on ctx's logger already ("SSHHost"), put there by
		// the caller: the host controller's reconcile, the cloud provider.
		log:   log.FromContext(ctx).WithValues("phase", ph),
		phase: ph, start: start, clk: r.Clock, interval: r.ProgressInterval,
		seq: 1, kick: make(chan struct{}, 1),
	}
	if p.clk == nil {
		p.clk = clock.RealClock{}
	}
	if p.interval <= 0 {
		p.interval = DefaultProgressInterval
	}
	// Only under a claim: the narrow setter's fence. An unclaimed host's
	// phase (the zombie guard's leave) is logged, not recorded.
	ref := h.Status.ClaimRef
	if r.Status == nil || ref == nil || ref.UID == "" {
		return p
	}
	wctx, cancel := context.WithCancel(ctx)
	p.halt, p.done, p.cancel = make(chan struct{}), make(chan struct{}), cancel
	// The first write's timer starts with the run, not with the goroutine.
	go p.loop(wctx, p.clk.NewTimer(p.interval), r.Status, h.Name, pool.Claim{Name: ref.Name, UID: ref.UID})
	return p
}

// observe is engine.Request.Progress.
func (p *progress) observe(tp engine.TaskProgress) {
	task := tp.Task
	if task == "" {
		task = tp.Internal
	}
	if tp.Status == "started" {
		p.mu.Lock()
		p.task = task
		p.seq++
		p.mu.Unlock()
		select {
		case p.kick <- struct{}{}:
		default:
		}
		return
	}
	p.log.V(1).Info("phase task ended", "task", task, "status", tp.Status, "duration", tp.Duration.Round(time.Millisecond))
}

// stop ends the writes: none starts after it, and one in flight is
// cancelled and waited for. Idempotent.
func (p *progress) stop() {
	if p.stopped.Swap(true) || p.halt == nil {
		return
	}
	close(p.halt)
	p.cancel()
	<-p.done
}

func (p *progress) current() (uint64, string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seq, p.task
}

func (p *progress) loop(ctx context.Context, t clock.Timer, w StatusWriter, host string, c pool.Claim) {
	defer close(p.done)
	defer t.Stop()
	var written uint64
	for {
		select {
		case <-p.halt:
			return
		case <-t.C():
		}
		for {
			seq, _ := p.current()
			if seq != written {
				break
			}
			select {
			case <-p.halt:
				return
			case <-p.kick:
			}
		}
		seq, task := p.current()
		wctx, cancel := context.WithTimeout(ctx, progressWriteTimeout)
		_, err := w.Update(wctx, host, c, p.running(task))
		cancel()
		switch {
		case err == nil:
			written = seq
		case errors.Is(err, pool.ErrClaimLost):
			return // the claim went: nothing of this run is the host's any more
		case ctx.Err() == nil:
			// Tried again after the interval.
			p.log.V(1).Info("recording the running phase", "error", err.Error())
		}
		t.Reset(p.interval)
	}
}

// running is the progress write: lastPhase Running at task, unless the
// record there must stay (Overwritable) or the run has ended.
func (p *progress) running(task string) func(*v1beta1.SSHHost) {
	return func(h *v1beta1.SSHHost) {
		if p.stopped.Load() || !Overwritable(h.Status.LastPhase, p.phase, p.start) {
			return
		}
		h.Status.LastPhase = &v1beta1.LastPhase{
			Phase: v1beta1.Phase(p.phase), Result: v1beta1.PhaseRunning,
			StartedAt:   metav1.NewTime(p.start),
			Duration:    metav1.Duration{Duration: p.clk.Since(p.start).Round(time.Second)},
			CurrentTask: Truncate(task, 1024),
		}
	}
}

// Overwritable reports whether a Running record of phase ph started at
// start may replace lp: a Running record may go, an earlier run's end may
// go, but the end of this run (the same phase, started in the same second
// or later: the API keeps seconds) or of any later one stays.
func Overwritable(lp *v1beta1.LastPhase, ph engine.Phase, start time.Time) bool {
	if lp == nil || lp.Result == v1beta1.PhaseRunning {
		return true
	}
	s := start.Truncate(time.Second)
	if lp.StartedAt.Time.Before(s) {
		return true
	}
	return lp.Phase != v1beta1.Phase(ph) && !lp.StartedAt.Time.After(s)
}
