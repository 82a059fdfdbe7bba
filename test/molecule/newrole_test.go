package molecule_test

import (
	"context"
	"path/filepath"
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
			ran := map[string]bool{}
			for _, s := range r.run(context.Background(), sc, tg) {
				switch {
				case s.err != nil:
					t.Errorf("%s: %v", s.step, s.err)
				case s.skipped:
					t.Errorf("%s skipped: the generated scenario has no playbook for a step of its own sequence", s.step)
				default:
					ran[s.step] = true
					t.Logf("%s passed in %v", s.step, s.duration.Round(time.Millisecond))
				}
			}
			for _, want := range []string{"syntax", "converge", "idempotence", "verify"} {
				if !ran[want] {
					t.Errorf("step %s did not pass (ran %v)", want, ran)
				}
			}
		})
	}
}
