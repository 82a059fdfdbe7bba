// Package molecule_test runs the shipped roles' molecule scenarios
// (test/molecule/<role>/molecule/<scenario>) with the project's harness
// against systemd-nspawn hosts with real systemd, checks that the harness
// catches a broken role, and lints roles/ and playbooks/ with ansible-lint.
//
//	make molecule                                  # the scenarios, verbose
//	go test -run TestMolecule -v ./test/molecule/  # the same
package molecule_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dklesev/kpssh/test/hostenv"
)

// tally counts scenario outcomes for the "N passed, N failed" line.
type tally struct {
	mu             sync.Mutex
	passed, failed []string
}

func (t *tally) add(name string, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if ok {
		t.passed = append(t.passed, name)
	} else {
		t.failed = append(t.failed, name)
	}
}

func (t *tally) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := fmt.Sprintf("%d passed, %d failed", len(t.passed), len(t.failed))
	if len(t.failed) > 0 {
		s += " (" + strings.Join(t.failed, ", ") + ")"
	}
	return s
}

// TestMolecule runs every scenario on both Debian releases: a bookworm and a
// trixie host per role, all in
// parallel, each role's scenarios in turn on its host (default first), plus
// the broken-role fixtures and a run of tls_bootstrap through the phase
// engine, each on a host of its own.
func TestMolecule(t *testing.T) {
	dirs, err := findScenarios(".")
	if err != nil {
		t.Fatal(err)
	}
	byRole := map[string][]*scenario{}
	var roles []string
	for _, d := range dirs {
		sc, err := loadScenario(d)
		if err != nil {
			t.Fatal(err)
		}
		if byRole[sc.role] == nil {
			roles = append(roles, sc.role)
		}
		byRole[sc.role] = append(byRole[sc.role], sc)
	}
	// Every profile role (a role with a join phase) under roles/ has at
	// least the default and leave scenarios.
	joins, err := filepath.Glob("../../roles/*/tasks/join.yml")
	if err != nil || len(joins) == 0 {
		t.Fatalf("no profile roles under roles/ (%v)", err)
	}
	for _, j := range joins {
		want := filepath.Base(filepath.Dir(filepath.Dir(j)))
		var names []string
		for _, sc := range byRole[want] {
			names = append(names, sc.name)
		}
		if !contains(names, "default") || !contains(names, "leave") {
			t.Errorf("role %s: want molecule scenarios default and leave under test/molecule/%s/molecule/, have %v", want, want, names)
		}
	}
	broken := brokenScenarios(t)

	// Every role's scenarios run on a Debian 12 and a Debian 13 host (hosts
	// 2i and 2i+1); the last two hosts are bookworm.
	releases := []string{}
	for range roles {
		releases = append(releases, hostenv.Bookworm, hostenv.Trixie)
	}
	releases = append(releases, hostenv.Bookworm)
	w := hostenv.UpWith(t, 2*len(roles)+2, hostenv.Options{Releases: releases})
	inv := w.Inventory()
	targetFor := func(t *testing.T, i int) target {
		h := w.Host(i)
		ww := w.WithT(t)
		return target{address: h.Address, port: h.Port, user: h.User, key: inv.ClientKey, knownHosts: inv.KnownHosts,
			reboot: func() { ww.Reboot(i) }}
	}
	r, err := newRunner(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.close) // before the TempDir goes (cleanups run last-in first-out)
	var tl tally
	t.Run("scenarios", func(t *testing.T) {
		for i, role := range roles {
			for j, rel := range []string{hostenv.Bookworm, hostenv.Trixie} {
				t.Run(role+"/"+rel, func(t *testing.T) {
					t.Parallel()
					tg := targetFor(t, 2*i+j)
					if got := w.Host(2*i + j).Release; got != rel {
						t.Fatalf("host %d is %q, want %s", 2*i+j, got, rel)
					}
					for _, sc := range byRole[role] {
						ok := t.Run(sc.name, func(t *testing.T) {
							for _, s := range r.run(context.Background(), sc, tg) {
								if s.err != nil {
									t.Errorf("%s/%s on %s: %v", role, sc.name, rel, s.err)
								} else if s.skipped {
									t.Logf("%s/%s on %s: %s skipped (no playbook)", role, sc.name, rel, s.step)
								} else {
									t.Logf("%s/%s on %s: %s passed in %v", role, sc.name, rel, s.step, s.duration.Round(time.Millisecond))
								}
							}
						})
						tl.add(role+"/"+sc.name+"@"+rel, ok)
					}
				})
			}
		}
		// The last host: the harness's own test, then the role through the
		// phase engine itself.
		t.Run("broken-role", func(t *testing.T) {
			t.Parallel()
			checkBroken(t, r, broken, targetFor(t, 2*len(roles)))
		})
		t.Run("engine", func(t *testing.T) {
			t.Parallel()
			tg := targetFor(t, 2*len(roles)+1)
			for _, sc := range byRole["tls_bootstrap"] {
				if sc.name == "default" {
					if out, err := r.playbook(context.Background(), sc, tg, "prepare.yml"); err != nil {
						t.Fatal(playbookErr("prepare", out, err))
					}
				}
			}
			testEngineRuns(t, w.WithT(t), 2*len(roles)+1)
		})
	})
	t.Logf("molecule scenarios: %s", tl.String())
	fmt.Printf("molecule scenarios: %s\n", tl.String())
}

// brokenCase is a fixture scenario the harness must fail, at a step, with a
// message naming the task.
type brokenCase struct {
	sc            *scenario
	step          string
	wantInMessage []string
}

func brokenScenarios(t *testing.T) []brokenCase {
	t.Helper()
	load := func(name string) *scenario {
		sc, err := loadScenario(filepath.Join("testdata", "broken", "molecule", name))
		if err != nil {
			t.Fatal(err)
		}
		return sc
	}
	return []brokenCase{
		{load("nonidempotent"), "idempotence", []string{`kpssh_broken : Stamp the time (changes on every run)`, "second converge changed 1 task"}},
		{load("missing_var"), "converge", []string{`task "kpssh_broken : Check var k8sMinor"`, "var k8sMinor is required"}},
		{load("checkunsafe"), "check", []string{"kpssh_broken : Write the marker where the command said", "would change 1 task(s)"}},
		{load("ran_nothing"), "converge", []string{"converge ran no task on the host"}},
	}
}

func checkBroken(t *testing.T, r *runner, cases []brokenCase, tg target) {
	for _, c := range cases {
		res := r.run(context.Background(), c.sc, tg)
		last := res[len(res)-1]
		if last.err == nil {
			t.Errorf("broken scenario %s passed every step; want %s to fail", c.sc.name, c.step)
			continue
		}
		if last.step != c.step {
			t.Errorf("broken scenario %s failed at %s, want %s: %v", c.sc.name, last.step, c.step, last.err)
			continue
		}
		for _, w := range c.wantInMessage {
			if !strings.Contains(last.err.Error(), w) {
				t.Errorf("broken scenario %s: the %s error does not name %q:\n%v", c.sc.name, c.step, w, last.err)
			}
		}
		t.Logf("broken scenario %s fails as it must: %v", c.sc.name, last.err)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
