package host

import (
	"github.com/prometheus/client_golang/prometheus"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Zombie guard actions (label values of kpssh_host_zombie_actions_total).
const (
	ActionParkedForeign = "parked_foreign"
	ActionLeft          = "left"
	ActionLeaveFailed   = "leave_failed"
)

var (
	probeDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "kpssh_host_probe_duration_seconds",
		Help:    "Duration of host probes by outcome (success, error).",
		Buckets: []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15, 30},
	}, []string{"outcome"})
	zombieActions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kpssh_host_zombie_actions_total",
		Help: "Zombie guard actions on unclaimed hosts with an active kubelet (any increase is a profile bug).",
	}, []string{"action"})
)

func init() {
	crmetrics.Registry.MustRegister(probeDuration, zombieActions)
}
