package chart

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// TestPrometheusRule renders the chart's PrometheusRule and runs
// Prometheus's own promtool on it: the rules parse (check rules), and each
// alert fires on the series it is for, stays quiet before its `for`, and
// ignores another release's namespace (test rules, testdata/alerts_test.yaml).
func TestPrometheusRule(t *testing.T) {
	w := setup(t)
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool (Debian package prometheus, hack/deps.sh): %v", err)
	}
	if def := find(w.template(t), "PrometheusRule", "*", ""); def != nil {
		t.Fatal("PrometheusRule rendered with prometheusRule.enabled unset")
	}
	objs := w.template(t, "--set", "prometheusRule.enabled=true,prometheusRule.labels.release=prom")
	pr := find(objs, "PrometheusRule", "kpssh", "kpssh")
	if pr == nil {
		t.Fatalf("no PrometheusRule kpssh/kpssh: %v", kinds(objs))
	}
	if pr.GetLabels()["release"] != "prom" || pr.GetLabels()["app.kubernetes.io/name"] == "" {
		t.Errorf("labels %v", pr.GetLabels())
	}
	spec, err := yaml.Marshal(pr.Object["spec"])
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), spec, 0o644); err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile(filepath.Join("testdata", "alerts_test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "alerts_test.yaml"), tests, 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, promtool, args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("promtool %s: %v\n%s\nrules:\n%s", strings.Join(args, " "), err, out, spec)
		}
		return string(out)
	}
	if out := run("check", "rules", "rules.yaml"); !strings.Contains(out, "SUCCESS: 5 rules found") {
		t.Errorf("promtool check rules:\n%s", out)
	}
	run("test", "rules", "alerts_test.yaml")

	// A duration Prometheus would refuse is refused by the chart's schema.
	_, stderr, code := w.run(t, "template", "kpssh", w.chart, "--kube-version", kubeVersion, "--set", "prometheusRule.enabled=true,prometheusRule.unhealthyFor=1.5m")
	if code == 0 || !strings.Contains(stderr, "unhealthyFor") {
		t.Errorf("unhealthyFor=1.5m: exit %d\n%s", code, stderr)
	}
}
