package molecule_test

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/dklesev/kpssh/internal/cli"
	"github.com/dklesev/kpssh/test/hostenv"
)

// TestNewRoleScenario: the molecule scenario `kpssh new-role` writes passes
// the harness as written, on a Debian 12 and a Debian 13 host: every step
// of its sequence runs (none skipped for want of a playbook), idempotence
// included, and no step prints the made-up token's secret half.
func TestNewRoleScenario(t *testing.T) {
	dir := t.TempDir()
	if _, err := cli.NewRole(dir, "my_role"); err != nil {
		t.Fatalf("kpssh new-role my_role: %v", err)
	}
	sc, err := loadScenario(filepath.Join(dir, "my_role", "molecule", "default"))
	if err != nil {
		t.Fatalf("the generated scenario does not load: %v", err)
	}
	if sc.role != "my_role" || sc.name != "default" {
		t.Fatalf("scenario %s/%s", sc.role, sc.name)
	}
	runOnReleases(t, []*scenario{sc}, true)
}

// TestMoleculeRole runs the scenarios of an author's role, wherever it is
// (KPSSH_MOLECULE_ROLE, or make molecule-role ROLE=DIR), through the
// harness on a Debian 12 and a Debian 13 test host: the step of the author's
// loop that molecule would run. Without KPSSH_MOLECULE_ROLE it has nothing
// to run and says so.
func TestMoleculeRole(t *testing.T) {
	role := os.Getenv("KPSSH_MOLECULE_ROLE")
	if role == "" {
		t.Skip("no role given: KPSSH_MOLECULE_ROLE=<role dir> (make molecule-role ROLE=<role dir>)")
	}
	dirs, err := filepath.Glob(filepath.Join(role, "molecule", "*", "molecule.yml"))
	if err != nil || len(dirs) == 0 {
		t.Fatalf("no molecule/<scenario>/molecule.yml under %s (%v)", role, err)
	}
	sort.SliceStable(dirs, func(i, j int) bool {
		return filepath.Base(filepath.Dir(dirs[i])) == "default" && filepath.Base(filepath.Dir(dirs[j])) != "default"
	})
	var scs []*scenario
	for _, d := range dirs {
		sc, err := loadScenario(filepath.Dir(d))
		if err != nil {
			t.Fatal(err)
		}
		scs = append(scs, sc)
	}
	runOnReleases(t, scs, false)
}

// runOnReleases runs the scenarios, default first, on a Debian 12 and a
// Debian 13 host (a subtest each), every step logged. strict: a step of
// the sequence without its playbook is an error, and syntax, converge,
// idempotence and verify must all have run.
func runOnReleases(t *testing.T, scs []*scenario, strict bool) {
	w := hostenv.UpWith(t, 2, hostenv.Options{Releases: []string{hostenv.Bookworm, hostenv.Trixie}})
	inv := w.Inventory()
	r, err := newRunner(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.close)
	for i, rel := range []string{hostenv.Bookworm, hostenv.Trixie} {
		t.Run(rel, func(t *testing.T) {
			h := w.Host(i)
			tg := target{address: h.Address, port: h.Port, user: h.User, key: inv.ClientKey, knownHosts: inv.KnownHosts}
			for _, sc := range scs {
				ran := map[string]bool{}
				for _, s := range r.run(context.Background(), sc, tg) {
					switch {
					case s.err != nil:
						t.Errorf("%s %s/%s: %v", sc.role, sc.name, s.step, s.err)
					case s.skipped && strict:
						t.Errorf("%s skipped: the generated scenario has no playbook for a step of its own sequence", s.step)
					case s.skipped:
						t.Logf("%s %s/%s: nothing to run", sc.role, sc.name, s.step)
					default:
						ran[s.step] = true
						t.Logf("%s %s/%s passed in %v", sc.role, sc.name, s.step, s.duration.Round(time.Millisecond))
					}
				}
				if !strict {
					continue
				}
				for _, want := range []string{"syntax", "converge", "idempotence", "verify"} {
					if !ran[want] {
						t.Errorf("step %s did not pass (ran %v)", want, ran)
					}
				}
			}
		})
	}
}
