package startuptaint

import (
	"github.com/prometheus/client_golang/prometheus"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// gateSeconds has no labels: taint keys are user-chosen and node names unbounded.
var gateSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
	Name:    "kpssh_node_startup_taint_gate_seconds",
	Help:    "Time from a Node's creation to the removal of a startup taint by its gate.",
	Buckets: []float64{5, 10, 20, 30, 60, 120, 180, 300, 600, 900, 1800, 3600},
})

func init() {
	crmetrics.Registry.MustRegister(gateSeconds)
}
