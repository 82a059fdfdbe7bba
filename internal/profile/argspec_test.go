package profile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/engine"
)

// searchRoles is a RoleValidator that accepts every role and searches dirs.
type searchRoles struct{ roles, colls []string }

// ValidateRole: the role has every phase but verify (like the shipped roles).
func (searchRoles) ValidateRole(role string, ph engine.Phase) error {
	if ph == engine.PhaseVerify {
		return &engine.NoRolePhaseError{Role: role, Phase: ph}
	}
	return nil
}
func (s searchRoles) RolesPaths() []string       { return s.roles }
func (s searchRoles) CollectionsPaths() []string { return s.colls }

func writeRole(t *testing.T, root, name string, files map[string]string) {
	t.Helper()
	for rel, body := range files {
		p := filepath.Join(root, name, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

const specs = `argument_specs:
  join:
    options:
      r_minor: {type: str, required: true}
      r_dns: {type: str, required: true}
      r_fixed: {type: str, required: true}
      r_endpoint: {type: str, required: true}
      r_optional: {type: str}
`

const defaults = `r_minor: "{{ kpssh_vars.k8sMinor | default('') }}"
r_dns: "{{ kpssh_vars['clusterDNS'] | default('10.96.0.10', true) }}"
r_fixed: /etc/r
r_endpoint: "{{ kpssh.cluster_endpoint }}"
r_optional: "{{ kpssh_vars.nope }}"
`

func TestCheckArgumentSpecs(t *testing.T) {
	class := func(vars v1beta1.Vars) *v1beta1.SSHNodeClass {
		return &v1beta1.SSHNodeClass{ObjectMeta: metav1.ObjectMeta{Name: "nc"}, Spec: v1beta1.SSHNodeClassSpec{Vars: vars}}
	}
	cases := []struct {
		name      string
		files     map[string]string
		role      string
		vars      v1beta1.Vars
		profVars  v1beta1.Vars
		want      string // error substring; "" = ok
		wantNote  string
		collRoles bool // the role lives in a collection (FQCN)
	}{
		{name: "satisfied by the class", files: map[string]string{"meta/argument_specs.yml": specs, "defaults/main.yml": defaults}, vars: v1beta1.Vars{"k8sMinor": "1.36"}},
		{name: "satisfied by the profile's vars", files: map[string]string{"meta/argument_specs.yml": specs, "defaults/main.yml": defaults}, profVars: v1beta1.Vars{"k8sMinor": "1.36"}},
		{name: "missing var names the var and the entry point", files: map[string]string{"meta/argument_specs.yml": specs, "defaults/main.yml": defaults},
			want: "join: role r, entry point join (meta/argument_specs.yml): required option r_minor needs var k8sMinor (defaults/main.yml maps it from kpssh_vars.k8sMinor), which neither SSHNodeClass nc's vars nor SSHJoinProfile p's spec.ansible.vars set"},
		{name: "vars/main.yml defines it", files: map[string]string{"meta/argument_specs.yml": specs, "defaults/main.yml": defaults, "vars/main.yml": "r_minor: \"1.35\"\n"}},
		{name: "no definition", files: map[string]string{"meta/argument_specs.yml": "argument_specs:\n  install:\n    options:\n      r_x: {required: true}\n"},
			want: "install: role r, entry point install (meta/argument_specs.yml): required option r_x has no value"},
		{name: "leave maps a var", files: map[string]string{"meta/argument_specs.yml": "argument_specs:\n  leave:\n    options:\n      r_x: {required: true}\n", "defaults/main.yml": "r_x: \"{{ kpssh_vars.x }}\"\n"},
			vars: v1beta1.Vars{"x": "1"}, want: "leave renders with the empty context"},
		{name: "a template of other vars is a note", files: map[string]string{"meta/argument_specs.yml": "argument_specs:\n  join:\n    options:\n      r_x: {required: true}\n", "defaults/main.yml": "r_x: \"{{ other_var }}\"\n"},
			wantNote: "option r_x is the template"},
		{name: "meta/main.yml argument_specs", files: map[string]string{"meta/main.yml": "galaxy_info: {}\n" + specs, "defaults/main.yml": defaults},
			want: "entry point join (meta/main.yml): required option r_minor needs var k8sMinor"},
		{name: "no specs", files: map[string]string{"defaults/main.yml": defaults}},
		{name: "unparsable specs", files: map[string]string{"meta/argument_specs.yml": "argument_specs: [\n"}, want: "role r: argument specs: "},
		{name: "collection role", role: "ns.coll.r", collRoles: true, files: map[string]string{"meta/argument_specs.yml": specs, "defaults/main.yml": defaults},
			want: "role ns.coll.r, entry point join"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			sr := searchRoles{roles: []string{filepath.Join(root, "none"), root}}
			name := "r"
			if tc.role != "" {
				name = tc.role
			}
			if tc.collRoles {
				writeRole(t, filepath.Join(root, "ansible_collections/ns/coll/roles"), "r", tc.files)
				sr = searchRoles{colls: []string{filepath.Join(root, "none"), root}}
			} else {
				writeRole(t, root, name, tc.files)
			}
			p := role(name)
			p.Name = "p"
			p.Spec.Ansible.Vars = tc.profVars
			notes, err := CheckArgumentSpecs(p, class(tc.vars), sr)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("want ok, got %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("want an error containing %q, got %v", tc.want, err)
			}
			if tc.wantNote != "" && !strings.Contains(strings.Join(notes, "\n"), tc.wantNote) {
				t.Fatalf("notes %q lack %q", notes, tc.wantNote)
			}
			// CheckClass reports the same message as ProfileInvalid.
			if res := CheckClass(p, class(tc.vars), sr); tc.want != "" && (res.Reason != v1beta1.ReasonProfileInvalid || res.Message != err.Error()) {
				t.Fatalf("CheckClass = %s %q, want ProfileInvalid %q", res.Reason, res.Message, err)
			}
		})
	}
}

func TestCheckClass(t *testing.T) {
	nc := &v1beta1.SSHNodeClass{ObjectMeta: metav1.ObjectMeta{Name: "nc"}}
	slow := scripts("i", "j", "l", "")
	slow.Name = "slow"
	slow.Spec.Timeouts.Install = "14m"
	badSel := nc.DeepCopy()
	badSel.Spec.HostSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "a", Operator: "Bogus"}}}
	cases := []struct {
		name         string
		p            *v1beta1.SSHJoinProfile
		nc           *v1beta1.SSHNodeClass
		roles        RoleValidator
		reason, want string
		note         string
	}{
		{name: "valid scripts", p: scripts("i", "j", "l", ""), nc: nc},
		{name: "invalid profile", p: scripts("", "j", "l", ""), nc: nc, reason: v1beta1.ReasonProfileInvalid, want: "install: phase missing"},
		{name: "timeouts", p: slow, nc: nc, reason: v1beta1.ReasonTimeoutsExceedRegistration, want: "profile slow: timeouts install 14m + join 5m = 19m exceeds Karpenter's registration window of 15m"},
		{name: "selector", p: scripts("i", "j", "l", ""), nc: badSel, reason: v1beta1.ReasonSelectorError, want: "hostSelector: "},
		{name: "no class: specs not checked", p: role("r"), roles: searchRoles{}, note: "no node class given"},
		{name: "resolver without paths", p: role("r"), nc: nc, roles: &fakeRoles{errs: noVerify("r")}, note: "does not say where it searches"},
		// A verify phase runs inside the window too.
		{name: "verify with the default timeouts", p: with(scripts("i", "j", "l", ""), verifyScript("v")), nc: nc, reason: v1beta1.ReasonTimeoutsExceedRegistration,
			want: "profile p: timeouts install 10m + join 5m + verify 2m = 17m exceeds Karpenter's registration window of 15m; lower spec.timeouts.install, spec.timeouts.join or spec.timeouts.verify"},
		{name: "verify fits", p: with(scripts("i", "j", "l", ""), func(p *v1beta1.SSHJoinProfile) {
			p.Spec.Scripts.Verify, p.Spec.Timeouts.Install = "v", "8m"
		}), nc: nc},
		{name: "role with verify.yml", p: role("r"), nc: nc, roles: &fakeRoles{}, reason: v1beta1.ReasonTimeoutsExceedRegistration, want: "+ verify 2m = 17m"},
		{name: "role without verify.yml", p: role("r"), nc: nc, roles: &fakeRoles{errs: noVerify("r")}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res := CheckClass(tc.p, tc.nc, tc.roles)
			if res.Reason != tc.reason || !strings.Contains(res.Message, tc.want) {
				t.Fatalf("CheckClass = %q %q, want %q containing %q", res.Reason, res.Message, tc.reason, tc.want)
			}
			if tc.note != "" && !strings.Contains(strings.Join(res.Notes, "\n"), tc.note) {
				t.Fatalf("notes %q lack %q", res.Notes, tc.note)
			}
		})
	}
}
