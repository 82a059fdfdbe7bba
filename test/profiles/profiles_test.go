// Package profiles_test checks the shipped script profiles
// (examples/scripts/profile-*.yaml): they decode into SSHJoinProfile, pass
// the engine's pre-flight and the real CRD, and — through the phase engine,
// unchanged, against systemd-nspawn hosts — do what the seed's lifecycle
// contract says, with exactly the KPSSH_* environment it promises.
package profiles_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/engine"
	"github.com/dklesev/kpssh/test/hostenv"
	"github.com/dklesev/kpssh/test/testenv"
)

// env is the real kube-apiserver shared by this package's tests (nil under -short).
var env *testenv.Env

func TestMain(m *testing.M) { os.Exit(testenv.RunMain(m, &env)) }

// shipped lists the profiles this package covers: file → metadata.name.
var shipped = []struct{ file, name string }{
	{"profile-tls-bootstrap.yaml", "tls-bootstrap-script"},
	{"profile-nodeadm-ssm.yaml", "nodeadm-ssm-script"},
	{"profile-sbc.yaml", "sbc-script"},
}

func examplePath(t testing.TB, file string) string {
	t.Helper()
	root, err := hostenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "examples", "scripts", file)
}

// loadProfile decodes a shipped manifest strictly (an unknown or misspelt
// field is an error, as kubectl's strict field validation would make it).
func loadProfile(t testing.TB, file string) *v1beta1.SSHJoinProfile {
	t.Helper()
	b, err := os.ReadFile(examplePath(t, file))
	if err != nil {
		t.Fatal(err)
	}
	var p v1beta1.SSHJoinProfile
	if err := yaml.UnmarshalStrict(b, &p); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	if p.Spec.Scripts == nil {
		t.Fatalf("%s: no spec.scripts", file)
	}
	return &p
}

func scripts(p *v1beta1.SSHJoinProfile) map[engine.Phase]string {
	s := p.Spec.Scripts
	return map[engine.Phase]string{
		engine.PhaseInstall: string(s.Install), engine.PhaseJoin: string(s.Join),
		engine.PhaseLeave: string(s.Leave), engine.PhaseUninstall: string(s.Uninstall),
	}
}

var (
	versionRE  = regexp.MustCompile(`^[A-Za-z0-9._-]{1,63}$`)
	durationRE = regexp.MustCompile(`^([0-9]+(s|m|h))+$`)
	// a command switching xtrace on (not a comment mentioning it)
	xtraceRE = regexp.MustCompile(`(?m)^[ \t]*set[ \t]+(-[a-wyzA-Z]*x|-o[ \t]+xtrace)`)
)

// TestShippedProfiles is the static half: no host, no apiserver.
func TestShippedProfiles(t *testing.T) {
	for _, sp := range shipped {
		t.Run(sp.name, func(t *testing.T) {
			p := loadProfile(t, sp.file)
			if p.APIVersion != v1beta1.SchemeGroupVersion.String() || p.Kind != "SSHJoinProfile" || p.Name != sp.name {
				t.Fatalf("got %s %s %q, want %s SSHJoinProfile %q", p.APIVersion, p.Kind, p.Name, v1beta1.SchemeGroupVersion, sp.name)
			}
			if !versionRE.MatchString(p.Spec.Version) {
				t.Errorf("spec.version %q does not match %s", p.Spec.Version, versionRE)
			}
			if p.Spec.Ansible != nil || p.Spec.Signatures != nil {
				t.Error("a scripts profile must set neither ansible nor signatures")
			}
			// Install + join must fit Karpenter's 15-minute registration window.
			var window time.Duration
			for name, d := range map[string]v1beta1.Duration{"install": p.Spec.Timeouts.Install, "join": p.Spec.Timeouts.Join, "leave": p.Spec.Timeouts.Leave} {
				if !durationRE.MatchString(string(d)) {
					t.Errorf("timeouts.%s %q does not match %s", name, d, durationRE)
					continue
				}
				v, err := time.ParseDuration(string(d))
				if err != nil {
					t.Errorf("timeouts.%s: %v", name, err)
				}
				if name != "leave" {
					window += v
				}
			}
			if window > 15*time.Minute {
				t.Errorf("install + join timeouts are %v, more than the 15-minute registration window", window)
			}
			for phase, body := range scripts(p) {
				if strings.TrimSpace(body) == "" {
					t.Errorf("%s: empty script", phase)
					continue
				}
				if len(body) > v1beta1.MaxScriptBytes {
					t.Errorf("%s: %d bytes, more than %d", phase, len(body), v1beta1.MaxScriptBytes)
				}
				if err := engine.Validate(phase, engine.Source{Script: body}); err != nil {
					t.Errorf("engine.Validate(%s): %v", phase, err)
				}
				// All variability arrives as KPSSH_* env, never {{ … }}: the
				// same bytes run by hand (`env KPSSH_…=… bash -s`) and can be
				// signed for Verified hosts as they are.
				if strings.Contains(body, "{{") {
					t.Errorf("%s: uses Go template actions; the shipped profiles read KPSSH_* env only", phase)
				}
				bashSyntax(t, phase, body)
			}
			leave := string(p.Spec.Scripts.Leave)
			for _, bad := range []string{"KPSSH_VAR_", "KPSSH_SECRET_", "KPSSH_BOOTSTRAP_TOKEN", "KPSSH_CLUSTER_", "KPSSH_NODE_NAME", "KPSSH_PROVIDER_ID"} {
				if strings.Contains(leave, bad) {
					t.Errorf("leave reads %s, which leave never gets", bad)
				}
			}
			if !strings.Contains(leave, "systemctl disable --now") {
				t.Error("leave does not `systemctl disable --now` (the warm-pool invariant must survive a reboot)")
			}
			// xtrace prints expanded values: no `set -x` may come before the
			// last line that touches a secret.
			for phase, body := range scripts(p) {
				lastSecret := strings.LastIndex(body, "KPSSH_SECRET_")
				if tok := strings.LastIndex(body, "KPSSH_BOOTSTRAP_TOKEN"); tok > lastSecret {
					lastSecret = tok
				}
				if loc := xtraceRE.FindStringIndex(body); loc != nil && loc[0] < lastSecret {
					t.Errorf("%s: xtrace is switched on (byte %d) before a secret is used (byte %d)", phase, loc[0], lastSecret)
				}
			}
		})
	}
}

// bashSyntax runs `bash -n` over what the engine would send: the strict
// preamble and the script.
func bashSyntax(t *testing.T, phase engine.Phase, body string) {
	t.Helper()
	pre, err := engine.Preamble(map[string]string{"KPSSH_HOST_ADDRESS": "192.0.2.1"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-n")
	cmd.Stdin = strings.NewReader(pre + body)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("%s: bash -n: %v\n%s", phase, err, out)
	}
}

// TestShippedProfilesAcceptedByAPIServer creates the manifests as they are
// (unstructured: what `kubectl apply -f` sends) in the real apiserver with
// our CRDs, and checks the scripts come back byte for byte.
func TestShippedProfilesAcceptedByAPIServer(t *testing.T) {
	if env == nil {
		t.Skip("-short: needs the real kube-apiserver")
	}
	ctx := context.Background()
	for _, sp := range shipped {
		t.Run(sp.name, func(t *testing.T) {
			b, err := os.ReadFile(examplePath(t, sp.file))
			if err != nil {
				t.Fatal(err)
			}
			var obj map[string]any
			if err := yaml.Unmarshal(b, &obj); err != nil {
				t.Fatal(err)
			}
			u := &unstructured.Unstructured{Object: obj}
			if err := env.Client.Create(ctx, u); err != nil {
				t.Fatalf("apiserver rejected %s: %v", sp.file, err)
			}
			t.Cleanup(func() { _ = env.Client.Delete(context.Background(), u) })
			var got v1beta1.SSHJoinProfile
			if err := env.Client.Get(ctx, client.ObjectKey{Name: sp.name}, &got); err != nil {
				t.Fatal(err)
			}
			want := loadProfile(t, sp.file)
			if want.Spec.Timeouts.Reboot == "" { // the file leaves it to the CRD's default
				want.Spec.Timeouts.Reboot = "2m"
			}
			if want.Spec.Timeouts.Verify == "" {
				want.Spec.Timeouts.Verify = "2m"
			}
			for phase, body := range scripts(want) {
				if scripts(&got)[phase] != body {
					t.Errorf("%s script changed on the way through the apiserver", phase)
				}
			}
			if got.Spec.Version != want.Spec.Version || got.Spec.Timeouts != want.Spec.Timeouts {
				t.Errorf("stored version/timeouts %q/%+v, want %q/%+v", got.Spec.Version, got.Spec.Timeouts, want.Spec.Version, want.Spec.Timeouts)
			}
		})
	}
}
