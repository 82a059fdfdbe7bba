package host

import (
	"testing"

	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Every known label value of the zombie counter and the probe histogram is
// exported before its first event: the seed's increase(...[1h]) alert and
// the dashboard's error rate need a zero sample to see the first one.
func TestMetricsExportedBeforeFirstEvent(t *testing.T) {
	mfs, err := crmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]map[string]bool{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if got[mf.GetName()] == nil {
					got[mf.GetName()] = map[string]bool{}
				}
				got[mf.GetName()][l.GetName()+"="+l.GetValue()] = true
			}
		}
	}
	for _, c := range []struct{ metric, label string }{
		{"kpssh_host_zombie_actions_total", "action=" + ActionLeft},
		{"kpssh_host_zombie_actions_total", "action=" + ActionLeaveFailed},
		{"kpssh_host_zombie_actions_total", "action=" + ActionParkedForeign},
		{"kpssh_host_probe_duration_seconds", "outcome=" + ProbeSuccess},
		{"kpssh_host_probe_duration_seconds", "outcome=" + ProbeError},
	} {
		if !got[c.metric][c.label] {
			t.Errorf("%s{%s} not exported; have %v", c.metric, c.label, got[c.metric])
		}
	}
}
