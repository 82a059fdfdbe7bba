package phase

import (
	"github.com/prometheus/client_golang/prometheus"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/engine"
)

// PhaseDuration is kpssh_instance_phase_duration_seconds{phase,outcome,profile}:
// every phase run on a host, whatever the caller (create, delete, zombie
// guard). Outcome is the engine's (Succeeded, Failed, TimedOut, ConfigError,
// Rejected); profile the SSHJoinProfile's name (bounded by the profiles;
// leave without one uses its fallback's, kpssh-fallback-leave).
var PhaseDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
	Namespace: "kpssh",
	Subsystem: "instance",
	Name:      "phase_duration_seconds",
	Help:      "Duration of join-profile phases run on hosts, by phase, outcome and join profile.",
	Buckets:   []float64{0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 900},
}, []string{"phase", "outcome", "profile"})

// ShimRejections is kpssh_instance_shim_rejections_total{phase,reason}:
// phases a Verified host's shim refused (reason: SignatureRejected,
// BadParam, MalformedEnvelope, UnknownPhase — the SSHHost's ShimRejected
// condition reasons). Every series exists from start at 0, so increase()
// sees the first one.
var ShimRejections = prometheus.NewCounterVec(prometheus.CounterOpts{
	Namespace: "kpssh",
	Subsystem: "instance",
	Name:      "shim_rejections_total",
	Help:      "Phases refused by a Verified host's shim, by phase and reason.",
}, []string{"phase", "reason"})

func init() {
	crmetrics.Registry.MustRegister(PhaseDuration, ShimRejections)
	for _, ph := range engine.Phases {
		for rc := int32(engine.ShimBadSignature); rc <= engine.ShimUnknownPhase; rc++ {
			ShimRejections.WithLabelValues(string(ph), v1beta1.ShimRejectionReason(rc))
		}
	}
}
