//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/controllers/host"
	driftctl "github.com/dklesev/kpssh/internal/controllers/host/drift"
	"github.com/dklesev/kpssh/internal/engine"
	"github.com/dklesev/kpssh/test/testenv"
)

// promServer is our own prometheus process (Debian's package): its own
// config scraping the world's controller every second, its TSDB in a temp
// dir, a free loopback port; killed by process group and reaped at cleanup.
// The package's system service, where a systemd starts it, is not used.
type promServer struct {
	url  string // http://127.0.0.1:port
	dir  string // config dir: rules/*.yaml are its rule files
	log  string
	cmd  *exec.Cmd
	done chan struct{}
}

func startPrometheus(t testing.TB, logDir, target string) *promServer {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatalf("prometheus not found (Debian package prometheus; make deps installs it): %v", err)
	}
	dir := t.TempDir()
	cfg := filepath.Join(dir, "prometheus.yml")
	// 1 s scrapes: the seed's rate()/increase() queries need two samples.
	// The namespace label is the one a ServiceMonitor's scrape sets: the
	// chart's alerts select the release's namespace by it.
	conf := fmt.Sprintf(`global: {scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}
rule_files: [rules/*.yaml]
scrape_configs:
- job_name: kpssh
  static_configs: [{targets: [%q], labels: {namespace: %q}}]
`, target, promNamespace)
	if err := os.WriteFile(cfg, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	p := &promServer{url: "http://127.0.0.1:" + testenv.MustFreePort(t), dir: dir, log: filepath.Join(logDir, "prometheus.log")}
	f, err := os.OpenFile(p.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p.cmd = exec.Command(bin, "--config.file="+cfg, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+strings.TrimPrefix(p.url, "http://"), "--storage.tsdb.retention.time=1d")
	p.cmd.Dir = dir
	p.cmd.Stdout, p.cmd.Stderr = f, f
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p.done = make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(p.stop)
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if _, err := p.get("/-/ready", nil); err == nil {
			return p
		} else if time.Now().After(deadline) {
			t.Fatalf("prometheus not ready after 2m: %v (log %s)", err, p.log)
		}
		select {
		case <-p.done:
			t.Fatalf("prometheus exited at start: %v (log %s)", p.cmd.ProcessState, p.log)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func (p *promServer) stop() {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

func (p *promServer) get(path string, q url.Values) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	u := p.url + path
	if q != nil {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return body, fmt.Errorf("GET %s: %s: %s", path, resp.Status, tail(string(body), 500))
	}
	return body, nil
}

// sample is one series of an instant vector: its labels and value.
type sample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

func (s sample) value() string { v, _ := s.Value[1].(string); return v }

// query evaluates expr now (Prometheus' /api/v1/query); a PromQL error is
// an error.
func (p *promServer) query(expr string) ([]sample, error) {
	body, err := p.get("/api/v1/query", url.Values{"query": {expr}})
	if err != nil {
		return nil, err
	}
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string          `json:"resultType"`
			Result     json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("query %s: %w", expr, err)
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("query %s: %s", expr, r.Error)
	}
	if r.Data.ResultType != "vector" {
		return nil, fmt.Errorf("query %s: result type %s, want vector", expr, r.Data.ResultType)
	}
	var out []sample
	return out, json.Unmarshal(r.Data.Result, &out)
}

// series lists the label sets of every series matching a selector
// (/api/v1/series over the last hour).
func (p *promServer) series(match string) ([]map[string]string, error) {
	q := url.Values{"match[]": {match}, "start": {fmt.Sprint(time.Now().Add(-time.Hour).Unix())}}
	body, err := p.get("/api/v1/series", q)
	if err != nil {
		return nil, err
	}
	var r struct {
		Status string              `json:"status"`
		Data   []map[string]string `json:"data"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, err
	}
	return r.Data, nil
}

// specMetrics are SPEC §8's kpssh metrics with their labels and the label
// values the product may emit (nil: any non-empty value). series is what
// Prometheus stores (a histogram as _count/_bucket/_sum).
var specMetrics = []struct {
	name, series string
	labels       map[string][]string
}{
	{"kpssh_pool_hosts", "kpssh_pool_hosts", map[string][]string{"state": strs(host.AllStates), "class": nil}},
	{"kpssh_host_probe_duration_seconds", "kpssh_host_probe_duration_seconds_count", map[string][]string{"outcome": {"success", "error"}}},
	{"kpssh_instance_phase_duration_seconds", "kpssh_instance_phase_duration_seconds_count", map[string][]string{
		"phase": strs(engine.Phases),
		"outcome": {string(engine.Succeeded), string(engine.Failed), string(engine.TimedOut), string(engine.ConfigError),
			string(engine.Rejected)},
		"profile": nil}},
	{"kpssh_host_last_probe_timestamp_seconds", "kpssh_host_last_probe_timestamp_seconds", map[string][]string{"host": nil, "class": nil}},
	{"kpssh_host_zombie_actions_total", "kpssh_host_zombie_actions_total", map[string][]string{
		"action": {host.ActionLeft, host.ActionLeaveFailed, host.ActionParkedForeign}}},
	{"kpssh_node_startup_taint_gate_seconds", "kpssh_node_startup_taint_gate_seconds_count", nil},
	{"kpssh_instance_shim_rejections_total", "kpssh_instance_shim_rejections_total", map[string][]string{
		"phase":  strs(engine.Phases),
		"reason": {"SignatureRejected", "BadParam", "MalformedEnvelope", "UnknownPhase"}}},
	// every outcome's series exists from the start; the per-class check
	// counter appears with a class's first check (the HostDrift scenario
	// checks it)
	{"kpssh_host_drift_check_duration_seconds", "kpssh_host_drift_check_duration_seconds_count", map[string][]string{"outcome": driftctl.Outcomes}},
}

// strs is the label values of a list of typed names.
func strs[T ~string](in []T) []string {
	out := make([]string, 0, len(in))
	for _, v := range in {
		out = append(out, string(v))
	}
	return out
}

// seedQueries are the seed operations.md's four starting points, verbatim.
var seedQueries = []string{
	`sum by (class) (kpssh_pool_hosts{state="Available"})`,
	`histogram_quantile(0.95, sum by (le) (rate(kpssh_instance_phase_duration_seconds_bucket{phase="join"}[15m])))`,
	`sum(kpssh_pool_hosts{state="Unhealthy"})`,
	`increase(kpssh_host_zombie_actions_total[1h])`,
}

// metrics: Prometheus has scraped the controller through the whole run
// (one target across its restarts); the seed's queries return series, every
// SPEC §8 metric is there with its labels, and the chart's Grafana dashboard
// uses only metrics that exist. Run alone it first joins and leaves once so
// the phase histogram has samples.
func metrics(w *world, st *state) {
	p := w.prom
	w.eventually("prometheus scraping the controller (up == 1)", 2*time.Minute, func() (bool, string) {
		r, err := p.query(`up{job="kpssh"}`)
		if err != nil {
			return false, err.Error()
		}
		return len(r) == 1 && r[0].value() == "1", fmt.Sprintf("%v", r)
	})
	// One target across controller restarts: the scraped process changed.
	if w.ctrl.runs > 1 {
		r, err := p.query(`changes(process_start_time_seconds{job="kpssh"}[1h])`)
		if err != nil || len(r) != 1 || r[0].value() == "0" {
			w.t.Errorf("controller started %d times, Prometheus saw no restart on its one target: %v %v", w.ctrl.runs, r, err)
		} else {
			w.t.Logf("controller started %d times; restarts seen on the one scrape target: %s", w.ctrl.runs, r[0].value())
		}
	}
	// Over a window, not the instant: a controller restarted since the last
	// join exports no join series yet, while the seed's rate(...[15m]) still
	// sees the old process's samples.
	if r, err := p.query(`count_over_time(kpssh_instance_phase_duration_seconds_count{phase="join"}[10m])`); err != nil || len(r) == 0 {
		w.t.Logf("no join recorded yet (%v): one join and leave first", err)
		w.scale(1)
		w.joined("")
		w.scale(0)
		w.allLeft("metrics: the join's leave done")
	}

	for _, q := range seedQueries {
		w.eventually("series for "+q, 2*time.Minute, func() (bool, string) {
			r, err := p.query(q)
			if err != nil {
				return false, err.Error()
			}
			return len(r) > 0, "no series"
		})
	}
	// Behaviour, not just presence: the pool gauge agrees with the API.
	// Per class: the world has 2 small hosts and 1 large one.
	for class, n := range map[string]string{"small": "2", "large": "1"} {
		w.eventually("kpssh_pool_hosts: "+n+" "+class+" hosts Available", time.Minute, func() (bool, string) {
			r, err := p.query(`kpssh_pool_hosts{state="Available",class="` + class + `"}`)
			if err != nil {
				return false, err.Error()
			}
			return len(r) == 1 && r[0].value() == n, fmt.Sprintf("%v", r)
		})
		// They have a probe time, and a recent one (PROBE_INTERVAL is 3s).
		w.eventually("kpssh_host_last_probe_timestamp_seconds: "+n+" "+class+" hosts probed in the last 5m", time.Minute, func() (bool, string) {
			r, err := p.query(`count(time() - kpssh_host_last_probe_timestamp_seconds{class="` + class + `"} < 300) >= ` + n)
			if err != nil {
				return false, err.Error()
			}
			return len(r) == 1, fmt.Sprintf("%v", r)
		})
	}
	if r, err := p.query(`sum(max_over_time(kpssh_instance_phase_duration_seconds_count{phase="join",outcome="Succeeded"}[1h]))`); err != nil || len(r) != 1 || r[0].value() == "0" {
		w.t.Errorf("succeeded joins: %v %v, want ≥ 1", r, err)
	}

	for _, m := range specMetrics {
		ls, err := p.series(m.series)
		if err != nil {
			w.t.Errorf("%s: %v", m.name, err)
			continue
		}
		if len(ls) == 0 {
			w.t.Errorf("%s: not exported (no series %s)", m.name, m.series)
			continue
		}
		for _, l := range ls {
			for name, allowed := range m.labels {
				v := l[name]
				if v == "" || (allowed != nil && !slices.Contains(allowed, v)) {
					w.t.Errorf("%s: series %v: label %s=%q, want one of %v", m.name, l, name, v, allowed)
				}
			}
			for name := range l {
				if _, ok := m.labels[name]; !ok && !slices.Contains([]string{"__name__", "job", "instance", "namespace", "le"}, name) {
					w.t.Errorf("%s: unexpected label %s in %v (SPEC §8 names %v)", m.name, name, l, slices.Sorted(maps.Keys(m.labels)))
				}
			}
		}
		w.t.Logf("%s: %d series", m.name, len(ls))
	}

	exprs := dashboardExprs(w)
	if len(exprs) == 0 {
		w.t.Fatal("dashboard: no panel expressions found")
	}
	// Grafana substitutes the variables; here as a user picking this install
	// (namespace, job) and all classes would. The pool's panels show it, and
	// another install's namespace selects none of its series.
	picked := strings.NewReplacer("$namespace", promNamespace, "$job", "kpssh", "$class", ".*")
	other := strings.NewReplacer("$namespace", "other", "$job", "kpssh", "$class", ".*")
	seen := map[string]bool{}
	for _, e := range exprs {
		r, err := p.query(picked.Replace(e))
		if err != nil { // Prometheus parses it
			w.t.Errorf("dashboard expression does not evaluate: %v", err)
		}
		if strings.Contains(e, "kpssh_pool_hosts{") {
			if len(r) == 0 {
				w.t.Errorf("dashboard expression %q: no series for namespace %s, job kpssh", e, promNamespace)
			}
			if r, err := p.query(other.Replace(e)); err != nil || len(r) != 0 {
				w.t.Errorf("dashboard expression %q for namespace other: %v %v, want no series", e, r, err)
			}
		}
		names := promqlMetricNames(e)
		if len(names) == 0 {
			w.t.Errorf("dashboard expression %q names no metric", e)
		}
		for _, n := range names {
			if seen[n] {
				continue
			}
			seen[n] = true
			ls, err := p.series(n)
			if err != nil || len(ls) == 0 {
				w.t.Errorf("dashboard uses metric %s, which the controller does not export (%v)", n, err)
			}
		}
	}
	w.t.Logf("dashboard: %d expressions over %d metrics, all exported", len(exprs), len(seen))
	alerts(w)
}

// promNamespace is the release namespace the e2e's scrape labels its series
// with and the chart's rules are rendered for.
const promNamespace = "kpssh"

// alerts loads the chart's PrometheusRule into the real Prometheus and
// makes one of its conditions: every host of class small parked, so none is
// Available. KpsshPoolExhausted is quiet before, fires, and resolves once
// the hosts are handed back. The `for` durations are shortened by the
// chart's own values; the expressions are as shipped.
func alerts(w *world) {
	p := w.prom
	out := helmTemplate(w, "templates/prometheusrule.yaml", "prometheusRule.enabled=true,prometheusRule.poolExhaustedFor=3s,prometheusRule.unhealthyFor=3s")
	var pr struct {
		Spec map[string]any `json:"spec"`
	}
	if err := yaml.Unmarshal(out, &pr); err != nil || pr.Spec == nil {
		w.t.Fatalf("PrometheusRule: %v\n%s", err, out)
	}
	rules, err := yaml.Marshal(pr.Spec)
	if err != nil {
		w.t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(p.dir, "rules"), 0o700); err != nil {
		w.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(p.dir, "rules", "kpssh.yaml"), rules, 0o600); err != nil {
		w.t.Fatal(err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil { // reload: rules included
		w.t.Fatal(err)
	}
	// Every rule loaded and evaluated without error.
	w.eventually("the chart's 5 alerting rules loaded and evaluated (health ok)", time.Minute, func() (bool, string) {
		body, err := p.get("/api/v1/rules", url.Values{"type": {"alert"}})
		if err != nil {
			return false, err.Error()
		}
		var r struct {
			Data struct {
				Groups []struct {
					Name  string `json:"name"`
					Rules []struct {
						Name      string `json:"name"`
						Health    string `json:"health"`
						LastError string `json:"lastError"`
					} `json:"rules"`
				} `json:"groups"`
			} `json:"data"`
		}
		if err := json.Unmarshal(body, &r); err != nil {
			return false, err.Error()
		}
		ok := 0
		for _, g := range r.Data.Groups {
			for _, rule := range g.Rules {
				if rule.Health == "ok" {
					ok++
				} else if rule.LastError != "" {
					w.t.Fatalf("rule %s: %s", rule.Name, rule.LastError)
				}
			}
		}
		return ok == 5, string(body)
	})
	firing := func() (bool, string) {
		r, err := p.query(`ALERTS{alertname="KpsshPoolExhausted",alertstate="firing",class="small",severity="warning"}`)
		if err != nil {
			return false, err.Error()
		}
		return len(r) == 1, fmt.Sprintf("%v", r)
	}
	if on, got := firing(); on {
		w.t.Fatalf("KpsshPoolExhausted firing with hosts Available: %s", got)
	}
	var small []string
	for _, h := range w.sshHosts() {
		if h.Labels[v1beta1.LabelHostClass] == "small" {
			small = append(small, h.Name)
		}
	}
	if len(small) == 0 {
		w.t.Fatal("no host of class small")
	}
	park := func(v string) {
		for _, n := range small {
			w.mustKubectl("-n", poolNS, "annotate", "--overwrite", "sshhost", n, "karpenter.dklesev.github.io/maintenance"+v)
		}
	}
	park("=true")
	w.eventually("KpsshPoolExhausted firing for class small (all parked)", 2*time.Minute, firing)
	park("-")
	w.allLeft("alerts: hosts handed back")
	w.eventually("KpsshPoolExhausted resolved", 2*time.Minute, func() (bool, string) {
		on, got := firing()
		return !on, got
	})
	w.t.Logf("KpsshPoolExhausted: quiet, fired with %d hosts parked, resolved", len(small))
}

// helmTemplate renders one template of the chart (helm template, as
// installed, release kpssh in namespace kpssh) with extra --set values.
func helmTemplate(w *world, template, set string) []byte {
	w.t.Helper()
	out, err := w.helm(3*time.Minute, "template", "kpssh", filepath.Join(w.repo, "charts/kpssh"), "--namespace", promNamespace,
		"--set", set, "--show-only", template)
	if err != nil {
		w.t.Fatalf("helm template %s: %v", template, err)
	}
	return out
}

// helm runs the chart tool ($HELM, else hack/helm.sh's) with a throwaway
// home, against the world's cluster; err holds its stderr.
func (w *world) helm(timeout time.Duration, args ...string) ([]byte, error) {
	w.t.Helper()
	helm := os.Getenv("HELM")
	if helm == "" {
		out, err := script(context.Background(), w.repo, nil, 30*time.Minute, "helm.sh")
		if err != nil {
			w.t.Fatal(err)
		}
		helm = out
	}
	home := w.t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c := exec.CommandContext(ctx, helm, args...)
	c.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + home, "HELM_CACHE_HOME=" + home, "HELM_CONFIG_HOME=" + home,
		"HELM_DATA_HOME=" + home, "KUBECONFIG=" + w.kubeconfig}
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	c.Cancel = func() error { return syscall.Kill(-c.Process.Pid, syscall.SIGKILL) }
	c.WaitDelay = 10 * time.Second
	var o, e bytes.Buffer
	c.Stdout, c.Stderr = &o, &e
	if err := c.Run(); err != nil {
		return nil, fmt.Errorf("helm %s: %w: %s", args[0], err, tail(e.String(), 2000))
	}
	return o.Bytes(), nil
}

// dashboardExprs renders the chart's dashboard ConfigMap and returns every
// panel target's expr.
func dashboardExprs(w *world) []string {
	w.t.Helper()
	out := helmTemplate(w, "templates/dashboard.yaml", "dashboard.enabled=true")
	cm := &corev1.ConfigMap{}
	if err := yaml.Unmarshal(out, cm); err != nil {
		w.t.Fatalf("dashboard ConfigMap: %v", err)
	}
	var exprs []string
	for k, v := range cm.Data {
		if !strings.HasSuffix(k, ".json") {
			continue
		}
		var d any
		if err := json.Unmarshal([]byte(v), &d); err != nil {
			w.t.Fatalf("dashboard %s: %v", k, err)
		}
		exprs = append(exprs, collectExprs(d)...)
	}
	return exprs
}

// collectExprs walks a dashboard JSON for "expr" strings (panel targets,
// rows' nested panels alike).
func collectExprs(v any) []string {
	var out []string
	switch x := v.(type) {
	case map[string]any:
		if e, ok := x["expr"].(string); ok && e != "" {
			out = append(out, e)
		}
		for _, k := range slices.Sorted(maps.Keys(x)) {
			if k != "expr" {
				out = append(out, collectExprs(x[k])...)
			}
		}
	case []any:
		for _, e := range x {
			out = append(out, collectExprs(e)...)
		}
	}
	return out
}

var (
	promStrings  = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'`)
	promBraces   = regexp.MustCompile(`\{[^{}]*\}|\[[^\[\]]*\]`)
	promGrouping = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)`)
	promIdent    = regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*`)
	promKeywords = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true,
		"group_right": true, "bool": true, "and": true, "or": true, "unless": true, "offset": true, "inf": true, "nan": true}
)

// promqlMetricNames returns the metric names a PromQL expression selects:
// identifiers outside strings, label matchers, ranges and grouping clauses
// that are not functions, aggregations or keywords. Enough for dashboard
// expressions (no __name__ matchers, no template variables in names).
func promqlMetricNames(expr string) []string {
	s := promStrings.ReplaceAllString(expr, " ")
	for {
		n := promBraces.ReplaceAllString(s, " ")
		if n == s {
			break
		}
		s = n
	}
	s = promGrouping.ReplaceAllString(s, " ")
	var out []string
	for _, loc := range promIdent.FindAllStringIndex(s, -1) {
		id := s[loc[0]:loc[1]]
		if promKeywords[strings.ToLower(id)] || (loc[0] > 0 && (s[loc[0]-1] >= '0' && s[loc[0]-1] <= '9' || s[loc[0]-1] == '.')) {
			continue // a keyword, or a number's suffix like 5m / 1e3
		}
		if rest := strings.TrimLeft(s[loc[1]:], " \t\n"); strings.HasPrefix(rest, "(") {
			continue // a function or an aggregation
		}
		if !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	return out
}

func TestPromQLMetricNames(t *testing.T) {
	for _, c := range []struct {
		expr string
		want []string
	}{
		{`sum by (class) (kpssh_pool_hosts{state="Available"})`, []string{"kpssh_pool_hosts"}},
		{`histogram_quantile(0.95, sum by (le) (rate(kpssh_instance_phase_duration_seconds_bucket{phase="join"}[15m])))`, []string{"kpssh_instance_phase_duration_seconds_bucket"}},
		{`sum(rate(kpssh_host_probe_duration_seconds_count{outcome="error"}[5m]))`, []string{"kpssh_host_probe_duration_seconds_count"}},
		{`increase(kpssh_host_zombie_actions_total[1h]) > 0`, []string{"kpssh_host_zombie_actions_total"}},
		{`a_total / ignoring(x) group_left b_info offset 5m`, []string{"a_total", "b_info"}},
		{`sum without (le) (rate(x_bucket{l=~"a|b(c)"}[1m])) * 1e3 + count(up == bool 1)`, []string{"x_bucket", "up"}},
		{`karpenter_nodes_total{nodepool="$pool"} and on (node) kube_node_info`, []string{"karpenter_nodes_total", "kube_node_info"}},
		{`1 + 2`, nil},
	} {
		if got := promqlMetricNames(c.expr); !slices.Equal(got, c.want) {
			t.Errorf("promqlMetricNames(%q) = %v, want %v", c.expr, got, c.want)
		}
	}
}
