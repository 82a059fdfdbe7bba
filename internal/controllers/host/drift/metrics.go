package drift

import (
	"github.com/prometheus/client_golang/prometheus"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/dklesev/kpssh/apis/v1beta1"
)

// Check outcomes (label values): the HostDriftResult in snake case.
const (
	OutcomeInSync      = "in_sync"
	OutcomeDrifted     = "drifted"
	OutcomeUnreachable = "unreachable"
	OutcomeFailed      = "failed"
	OutcomeUnsupported = "unsupported"
)

// Outcomes lists every outcome label value.
var Outcomes = []string{OutcomeInSync, OutcomeDrifted, OutcomeUnreachable, OutcomeFailed, OutcomeUnsupported}

var (
	// checksTotal is kpssh_host_drift_checks_total{class,outcome}: class
	// is the host class (one per instance type, bounded by the pool).
	checksTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kpssh_host_drift_checks_total",
		Help: "Drift checks of joined hosts by host class and outcome (in_sync, drifted, unreachable, failed, unsupported).",
	}, []string{"class", "outcome"})
	checkSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "kpssh_host_drift_check_duration_seconds",
		Help:    "Duration of drift checks of joined hosts by outcome.",
		Buckets: []float64{0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600},
	}, []string{"outcome"})
)

func init() {
	crmetrics.Registry.MustRegister(checksTotal, checkSeconds)
	for _, o := range Outcomes {
		checkSeconds.WithLabelValues(o)
	}
}

// countCheck counts one check; a class's series start at 0 for every
// outcome with its first check (increase() sees the first drift).
func countCheck(class, o string) {
	for _, x := range Outcomes {
		checksTotal.WithLabelValues(class, x)
	}
	checksTotal.WithLabelValues(class, o).Inc()
}

func outcome(r v1beta1.HostDriftResult) string {
	switch r {
	case v1beta1.DriftInSync:
		return OutcomeInSync
	case v1beta1.DriftDrifted:
		return OutcomeDrifted
	case v1beta1.DriftUnreachable:
		return OutcomeUnreachable
	case v1beta1.DriftUnsupported:
		return OutcomeUnsupported
	}
	return OutcomeFailed
}
