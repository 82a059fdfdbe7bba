package host

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/dklesev/kpssh/apis/v1beta1"
)

// Zombie guard actions (label values of kpssh_host_zombie_actions_total).
const (
	ActionParkedForeign = "parked_foreign"
	ActionLeft          = "left"
	ActionLeaveFailed   = "leave_failed"
)

// Probe outcomes (label values of kpssh_host_probe_duration_seconds).
const (
	ProbeSuccess = "success"
	ProbeError   = "error"
)

// Reboot watch outcomes (label values of kpssh_host_reboot_seconds).
const (
	RebootReturned = "returned"
	RebootLost     = "lost"
)

var (
	rebootSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "kpssh_host_reboot_seconds",
		Help:    "Time from a reboot's request to the host seen back (returned) or given up on (lost).",
		Buckets: []float64{5, 10, 20, 30, 60, 120, 300, 600, 900, 1800},
	}, []string{"outcome"})
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
	crmetrics.Registry.MustRegister(probeDuration, zombieActions, rebootSeconds)
	// Every known label value exists from the start at zero: increase() and
	// rate() need a sample before the first event, or the first zombie
	// action after a (re)start is invisible to the seed's alert query and the
	// dashboard's probe-failure rate is "no data" instead of 0.
	for _, a := range []string{ActionParkedForeign, ActionLeft, ActionLeaveFailed} {
		zombieActions.WithLabelValues(a)
	}
	for _, o := range []string{ProbeSuccess, ProbeError} {
		probeDuration.WithLabelValues(o)
	}
	for _, o := range []string{RebootReturned, RebootLost} {
		rebootSeconds.WithLabelValues(o)
	}
}

// poolCollector computes kpssh_pool_hosts{state,class} and
// kpssh_host_last_probe_timestamp_seconds{host,class} on scrape from the informer
// cache, so the gauges are never stale (a deleted host's series goes with
// it) and cost nothing between scrapes. Every state is emitted per known
// class (zeros included) so `sum by (class)
// (kpssh_pool_hosts{state="Available"})` works on an exhausted class. The
// per-host series are bounded by the SSHHosts the operator created; a host
// never probed has none.
type poolCollector struct {
	reader    client.Reader
	namespace string
	desc      *prometheus.Desc
	lastProbe *prometheus.Desc
}

// NewPoolCollector returns the pool collector for a pool namespace.
func NewPoolCollector(r client.Reader, namespace string) prometheus.Collector {
	return &poolCollector{reader: r, namespace: namespace,
		desc: prometheus.NewDesc("kpssh_pool_hosts", "Hosts in the pool by state and host class.", []string{"state", "class"}, nil),
		lastProbe: prometheus.NewDesc("kpssh_host_last_probe_timestamp_seconds",
			"Unix time of each host's last probe (status.lastProbeTime), by SSHHost name and host class.", []string{"host", "class"}, nil)}
}

func (p *poolCollector) Describe(ch chan<- *prometheus.Desc) { ch <- p.desc; ch <- p.lastProbe }

func (p *poolCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// Read only: the cache's hosts uncopied (a deep copy of the pool per
	// scrape was most of the controller's garbage at 5,000 hosts when
	// scraped every few seconds).
	list := &v1beta1.SSHHostList{}
	if err := p.reader.List(ctx, list, client.InNamespace(p.namespace), client.UnsafeDisableDeepCopy); err != nil {
		ch <- prometheus.NewInvalidMetric(p.desc, err)
		ch <- prometheus.NewInvalidMetric(p.lastProbe, err)
		return
	}
	counts := map[string]map[v1beta1.HostState]int{}
	for i := range list.Items {
		h := &list.Items[i]
		cls := h.Class()
		if counts[cls] == nil {
			counts[cls] = map[v1beta1.HostState]int{}
		}
		counts[cls][h.CurrentState()]++
		if t := h.Status.LastProbeTime; t != nil {
			ch <- prometheus.MustNewConstMetric(p.lastProbe, prometheus.GaugeValue, float64(t.Unix()), h.Name, cls)
		}
	}
	for cls, byState := range counts {
		for _, st := range AllStates {
			ch <- prometheus.MustNewConstMetric(p.desc, prometheus.GaugeValue, float64(byState[st]), string(st), cls)
		}
	}
}

// AllStates lists every host state in lifecycle order.
var AllStates = []v1beta1.HostState{v1beta1.HostPending, v1beta1.HostAvailable, v1beta1.HostClaimed,
	v1beta1.HostInUse, v1beta1.HostUnhealthy, v1beta1.HostLeaving, v1beta1.HostMaintenance}
