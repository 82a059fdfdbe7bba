package phase

import (
	"github.com/prometheus/client_golang/prometheus"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// PhaseDuration is kpssh_instance_phase_duration_seconds{phase,outcome}:
// every phase run on a host, whatever the caller (create, delete, zombie
// guard). Outcome is the engine's (Succeeded, Failed, TimedOut, ConfigError, Rejected).
var PhaseDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
	Namespace: "kpssh",
	Subsystem: "instance",
	Name:      "phase_duration_seconds",
	Help:      "Duration of join-profile phases run on hosts, by phase and outcome.",
	Buckets:   []float64{0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 900},
}, []string{"phase", "outcome"})

func init() { crmetrics.Registry.MustRegister(PhaseDuration) }
