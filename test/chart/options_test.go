package chart

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	coreoptions "sigs.k8s.io/karpenter/pkg/operator/options"
)

// TestOptions renders the pod and metadata options of the chart (the ones
// Karpenter's own chart has) and checks what lands in the objects.
func TestOptions(t *testing.T) {
	w := setup(t)
	deployment := func(t *testing.T, objs []*unstructured.Unstructured) *appsv1.Deployment {
		t.Helper()
		return convert[appsv1.Deployment](t, find(objs, "Deployment", "kpssh", ""))
	}
	for _, tc := range []struct {
		name  string
		args  []string
		check func(t *testing.T, objs []*unstructured.Unstructured)
	}{
		{"defaults", nil, func(t *testing.T, objs []*unstructured.Unstructured) {
			spec := deployment(t, objs).Spec.Template.Spec
			if spec.PriorityClassName != "system-cluster-critical" || spec.HostNetwork || spec.DNSPolicy != corev1.DNSClusterFirst || len(spec.TopologySpreadConstraints) != 0 || len(spec.Volumes) != 4 {
				t.Errorf("defaults: priority %q hostNetwork %v dns %q spread %v volumes %d", spec.PriorityClassName, spec.HostNetwork, spec.DNSPolicy, spec.TopologySpreadConstraints, len(spec.Volumes))
			}
			for _, o := range objs {
				a := o.GetAnnotations()
				// Karpenter core's CRDs: controller-gen's version, and kept on uninstall.
				if o.GetKind() == "CustomResourceDefinition" && len(a) == 2 && a[keep] == "keep" && a["controller-gen.kubebuilder.io/version"] != "" {
					continue
				}
				if len(a) != 0 {
					t.Errorf("defaults: %s %s has annotations %v", o.GetKind(), o.GetName(), a)
				}
			}
		}},
		// Every object of the chart (every optional one on) carries the
		// additional labels and annotations; an object's own annotations win.
		{"additional labels and annotations", append(slices.Clone(allOn), "--set", "additionalLabels.team=pool,additionalAnnotations.owner=ops,additionalAnnotations.shared=chart,service.annotations.shared=service"),
			func(t *testing.T, objs []*unstructured.Unstructured) {
				for _, o := range objs {
					want := "chart"
					if o.GetKind() == "Service" {
						want = "service"
					}
					if o.GetLabels()["team"] != "pool" || o.GetAnnotations()["owner"] != "ops" || o.GetAnnotations()["shared"] != want {
						t.Errorf("%s %s: labels %v annotations %v", o.GetKind(), o.GetName(), o.GetLabels(), o.GetAnnotations())
					}
				}
			}},
		{"fullnameOverride", []string{"--set", "fullnameOverride=pool-ctl,nameOverride=ignored"}, func(t *testing.T, objs []*unstructured.Unstructured) {
			for _, o := range objs {
				// A CRD's name is its plural and group.
				if o.GetKind() != "CustomResourceDefinition" && !strings.HasPrefix(o.GetName(), "pool-ctl") {
					t.Errorf("%s %s: not named after fullnameOverride", o.GetKind(), o.GetName())
				}
			}
			d := deployment(t, objs)
			if d.Spec.Template.Spec.ServiceAccountName != "pool-ctl" || d.Spec.Selector.MatchLabels["app.kubernetes.io/name"] != "ignored" {
				t.Errorf("service account %q selector %v", d.Spec.Template.Spec.ServiceAccountName, d.Spec.Selector.MatchLabels)
			}
		}},
		{"nameOverride", []string{"--set", "nameOverride=pool"}, func(t *testing.T, objs []*unstructured.Unstructured) {
			if d := deployment(t, objs); d.Name != "kpssh-pool" || d.Labels["app.kubernetes.io/name"] != "pool" {
				t.Errorf("name %q labels %v", d.Name, d.Labels)
			}
		}},
		{"pod options", []string{"--set", "hostNetwork=true,priorityClassName=,strategy.type=RollingUpdate,strategy.rollingUpdate.maxUnavailable=1,strategy.rollingUpdate.maxSurge=0," +
			"podSecurityContext.runAsUser=1000,podSecurityContext.runAsNonRoot=true",
			"--set-json", `topologySpreadConstraints=[{"maxSkew":1,"topologyKey":"kubernetes.io/hostname","whenUnsatisfiable":"ScheduleAnyway"},{"maxSkew":2,"topologyKey":"rack","whenUnsatisfiable":"DoNotSchedule","labelSelector":{"matchLabels":{"app":"other"}}}]`,
			"--set-json", `extraVolumes=[{"name":"roles","configMap":{"name":"site-roles"}}]`,
			"--set-json", `extraVolumeMounts=[{"name":"roles","mountPath":"/etc/kpssh/roles","readOnly":true}]`},
			func(t *testing.T, objs []*unstructured.Unstructured) {
				d := deployment(t, objs)
				spec := d.Spec.Template.Spec
				if !spec.HostNetwork || spec.DNSPolicy != corev1.DNSClusterFirstWithHostNet || spec.PriorityClassName != "" {
					t.Errorf("hostNetwork %v dns %q priority %q", spec.HostNetwork, spec.DNSPolicy, spec.PriorityClassName)
				}
				if d.Spec.Strategy.Type != appsv1.RollingUpdateDeploymentStrategyType || d.Spec.Strategy.RollingUpdate == nil || d.Spec.Strategy.RollingUpdate.MaxSurge.IntValue() != 0 {
					t.Errorf("strategy %+v", d.Spec.Strategy)
				}
				if psc := spec.SecurityContext; psc == nil || psc.RunAsUser == nil || *psc.RunAsUser != 1000 || psc.FSGroup == nil {
					t.Errorf("podSecurityContext (a --set merges into the default) %+v", psc)
				}
				tsc := spec.TopologySpreadConstraints
				if len(tsc) != 2 || tsc[0].LabelSelector == nil || tsc[0].LabelSelector.MatchLabels["app.kubernetes.io/instance"] != "kpssh" ||
					tsc[1].LabelSelector.MatchLabels["app"] != "other" || len(tsc[1].LabelSelector.MatchLabels) != 1 {
					t.Errorf("topologySpreadConstraints %+v", tsc)
				}
				c := spec.Containers[0]
				if v := spec.Volumes[len(spec.Volumes)-1]; v.Name != "roles" || v.ConfigMap == nil || v.ConfigMap.Name != "site-roles" {
					t.Errorf("extra volume %+v", v)
				}
				if m := c.VolumeMounts[len(c.VolumeMounts)-1]; m.Name != "roles" || m.MountPath != "/etc/kpssh/roles" || !m.ReadOnly {
					t.Errorf("extra mount %+v", m)
				}
			}},
		{"dnsPolicy", []string{"--set", "hostNetwork=true,dnsPolicy=Default"}, func(t *testing.T, objs []*unstructured.Unstructured) {
			if p := deployment(t, objs).Spec.Template.Spec.DNSPolicy; p != corev1.DNSDefault {
				t.Errorf("dnsPolicy %q", p)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.check(t, w.template(t, tc.args...)) })
	}
}

// TestSchemaFeatureGates: the schema offers exactly Karpenter core's
// feature gates (a gate core drops or adds shows here on a bump).
func TestSchemaFeatureGates(t *testing.T) {
	w := setup(t)
	b, err := os.ReadFile(filepath.Join(w.chart, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Properties struct {
			Settings struct {
				Properties struct {
					FeatureGates struct {
						Properties map[string]any `json:"properties"`
					} `json:"featureGates"`
				} `json:"properties"`
			} `json:"settings"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(b, &schema); err != nil {
		t.Fatal(err)
	}
	var got, want []string
	for g := range schema.Properties.Settings.Properties.FeatureGates.Properties {
		got = append(got, g)
	}
	for _, g := range coreoptions.KarpenterFeatureGates {
		want = append(want, g.Name)
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("schema settings.featureGates %v, Karpenter core's %v", got, want)
	}
}

// TestSubchart renders kpssh as the dependency of a throwaway parent chart
// that sets global values (the schema must allow them) and kpssh's own.
func TestSubchart(t *testing.T) {
	w := setup(t)
	parent := t.TempDir()
	if err := os.CopyFS(filepath.Join(parent, "charts", "kpssh"), os.DirFS(w.chart)); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"Chart.yaml":  "apiVersion: v2\nname: platform\nversion: 1.0.0\ndependencies:\n  - name: kpssh\n    version: \">=0.0.0-0\"\n",
		"values.yaml": "global:\n  imageRegistry: reg.example\n  storageClass: fast\nkpssh:\n  poolNamespace: pool\n  additionalLabels:\n    parent: platform\n",
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(parent, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, extra := range [][]string{nil, {"--set", "global.extra=1,kpssh.global.own=x"}} {
		args := append([]string{"lint", "--strict", parent, "--kube-version", kubeVersion}, extra...)
		if out, stderr, code := w.run(t, args...); code != 0 {
			t.Errorf("helm lint of the parent %q: exit %d\n%s%s", extra, code, out, stderr)
		}
		objs := w.templateOf(t, parent, extra...)
		d := find(objs, "Deployment", "kpssh", "")
		if d == nil || d.GetName() != "kpssh" || d.GetLabels()["parent"] != "platform" || find(objs, "Role", "pool", "kpssh") == nil {
			t.Errorf("subchart %q: Deployment %v, objects %v", extra, d, kinds(objs))
		}
	}
	// The subchart's schema still refuses unknown keys of its own.
	if _, stderr, code := w.run(t, "template", "kpssh", parent, "--set", "kpssh.typo=1"); code == 0 || !strings.Contains(stderr, "additional properties 'typo' not allowed") {
		t.Errorf("kpssh.typo in the parent: exit %d, %s", code, stderr)
	}
}
