package molecule_test

import (
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/dklesev/kpssh/apis/v1beta1"
)

var (
	scriptVarRE = regexp.MustCompile(`KPSSH_VAR_([A-Za-z_][A-Za-z0-9_]*)`)
	roleVarRE   = regexp.MustCompile(`kpssh_vars(?:\.([A-Za-z_]\w*)|\[\s*['"]([A-Za-z_]\w*)['"]\s*\])`)
)

// TestRolesReadTheScriptsVars: each role reads exactly the node class vars
// its script twin reads, so a node class switches between them by
// joinProfileRef alone. sbc builds on tls_bootstrap and reads its vars
// except cgroupDriver, which the sbc script fixes to systemd (the role
// overrides it).
func TestRolesReadTheScriptsVars(t *testing.T) {
	for _, c := range []struct {
		script string
		roles  []string
		extra  []string // read by the role(s), deliberately unused by the script
	}{
		{"profile-tls-bootstrap.yaml", []string{"tls_bootstrap"}, nil},
		{"profile-nodeadm-ssm.yaml", []string{"nodeadm_ssm"}, nil},
		{"profile-sbc.yaml", []string{"sbc", "tls_bootstrap"}, []string{"cgroupDriver"}},
	} {
		t.Run(c.roles[0], func(t *testing.T) {
			raw, err := os.ReadFile(filepath.Join("..", "..", "examples", "scripts", c.script))
			if err != nil {
				t.Fatal(err)
			}
			var p v1beta1.SSHJoinProfile
			if err := yaml.UnmarshalStrict(raw, &p); err != nil || p.Spec.Scripts == nil {
				t.Fatalf("%s: %v", c.script, err)
			}
			s := p.Spec.Scripts
			want := map[string]bool{}
			for _, body := range []v1beta1.Script{s.Install, s.Join, s.Leave, s.Uninstall} {
				for _, m := range scriptVarRE.FindAllStringSubmatch(string(body), -1) {
					want[m[1]] = true
				}
			}
			for _, e := range c.extra {
				want[e] = true
			}
			got := map[string]bool{}
			for _, r := range c.roles {
				err := filepath.WalkDir(filepath.Join("..", "..", "roles", r), func(path string, d os.DirEntry, err error) error {
					if err != nil || d.IsDir() || !(strings.HasSuffix(path, ".yml") || strings.HasSuffix(path, ".j2")) {
						return err
					}
					b, err := os.ReadFile(path)
					if err != nil {
						return err
					}
					for _, m := range roleVarRE.FindAllStringSubmatch(string(b), -1) {
						got[m[1]+m[2]] = true
					}
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
			}
			if len(want) < 3 {
				t.Fatalf("%s: found only %v: the scan is broken", c.script, keys(want))
			}
			if g, w := keys(got), keys(want); strings.Join(g, " ") != strings.Join(w, " ") {
				t.Errorf("roles %v read vars %v, the script %s reads %v", c.roles, g, c.script, w)
			}
		})
	}
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
