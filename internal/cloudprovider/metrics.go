package cloudprovider

import (
	"github.com/prometheus/client_golang/prometheus"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Outcomes of Reboot calls (label values of kpssh_host_reboots_total).
const (
	RebootIssuedLabel = "issued"
	RebootFailedLabel = "failed"
	// RebootReplayed: the operation id was already recorded; nothing ran.
	RebootReplayed = "replayed"
	// RebootRefused: the host has not joined.
	RebootRefused = "refused"
)

var rebootsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "kpssh_host_reboots_total",
	Help: "Reboot calls by outcome (issued, failed, replayed: the operation was already recorded, refused).",
}, []string{"outcome"})

func init() {
	crmetrics.Registry.MustRegister(rebootsTotal)
	for _, o := range []string{RebootIssuedLabel, RebootFailedLabel, RebootReplayed, RebootRefused} {
		rebootsTotal.WithLabelValues(o)
	}
}
