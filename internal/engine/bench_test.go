package engine

import (
	"bytes"
	"context"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/dklesev/kpssh/internal/sshx"
)

// benchMinSamples is the least number of samples per variant, whatever
// -benchtime says: medians of fewer are noise on a shared 2-core machine.
const benchMinSamples = 5

// BenchmarkScriptPhase is the issue-4 benchmark: one script phase through
// the engine against raw SSH exec of the same script on the same host, side
// by side in one run. Every round runs each variant once, in a random order
// (load drifts hit all of them alike); a b.Loop iteration is one round and
// rounds are topped up to benchMinSamples. It reports the median of each
// variant, the engine's overhead over raw SSH and the ratio:
//
//	raw-gossh   Go x/crypto/ssh: sshx.Dial + Run("bash -s"), a fresh connection
//	raw-ssh     the ssh client binary: ssh … 'bash -s' < script, a fresh connection
//	engine       Run with the defaults (render, files, ansible-playbook through
//	             the pre-warmed runner, the script task with the connect check
//	             inside it, ControlPersist teardown, run-directory removal)
//	no-warm      the same without the warm runner (cold ansible-playbook)
//	no-fastexit  the warm runner exits through Python's own shutdown
//	no-merge     the connect check as a task of its own
//	no-cfg       the ansible.cfg of before (callbacks_enabled =, smart
//	             transport, host_group_vars)
//	no-sigterm   `ssh -O exit` before the ControlPersist master is signalled
//	original     all of them off: the engine as it was
//
// Before every sample the engine variants' warm runners are waited for, so
// no warm-up competes with a measurement.
//
//	go test -run '^$' -bench ScriptPhase -benchtime 5x ./internal/engine/
func BenchmarkScriptPhase(b *testing.B) {
	w := upWorld(b, 1)
	coll, err := FindCollectionsPath()
	if err != nil {
		b.Fatal(err)
	}
	h := w.Host(0)
	conn := w.conn(0)
	script := "echo hello from {{ .NodeName }}\nuname -r >/dev/null\ntest -n \"$KPSSH_SECRET_APIKEY\"\n"
	req := Request{Phase: PhaseJoin, Conn: conn, Source: Source{Script: script}, Context: joinContext(h), Timeout: time.Minute}
	ctx := context.Background()

	// the raw variants' input: the same preamble + rendered body
	body, err := renderScript(PhaseJoin, script, req.Context)
	if err != nil {
		b.Fatal(err)
	}
	pre, err := Preamble(Env(PhaseJoin, phaseContext(PhaseJoin, req.Context), true))
	if err != nil {
		b.Fatal(err)
	}
	full := pre + body
	target := sshx.Target{Address: conn.Address, Port: conn.Port, User: "root", PrivateKey: conn.PrivateKey, ExpectedFingerprint: h.Fingerprint}
	wantOut := "hello from node-h1"

	type variant struct {
		name string
		run  func() error
		eng  *Local
	}
	engine := func(name string, mod func(*Options)) variant {
		o := Options{AnsiblePlaybook: playbookBin(b), CollectionsPath: coll}
		if mod != nil {
			mod(&o)
		}
		e, err := New(o)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = e.Close() })
		return variant{name: name, eng: e, run: func() error {
			if r := e.Run(ctx, req); r.Outcome != Succeeded {
				return fmt.Errorf("%s: %+v", name, r)
			}
			return nil
		}}
	}
	variants := []variant{
		{name: "raw-gossh", run: func() error {
			c, err := sshx.Dial(ctx, target)
			if err != nil {
				return err
			}
			defer c.Close()
			res, err := c.Run(ctx, "bash -s", strings.NewReader(full))
			if err != nil || !strings.Contains(res.Stdout, wantOut) {
				return fmt.Errorf("go ssh: %v %q", err, res.Stdout)
			}
			return nil
		}},
		{name: "raw-ssh", run: func() error {
			cctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			c := exec.CommandContext(cctx, "ssh", append(w.SSHArgs(0, "-o", "ControlMaster=no", "-o", "ControlPath=none"), "bash -s")...)
			c.Stdin = strings.NewReader(full)
			var out bytes.Buffer
			c.Stdout = &out
			if err := c.Run(); err != nil || !strings.Contains(out.String(), wantOut) {
				return fmt.Errorf("ssh: %v %q", err, out.String())
			}
			return nil
		}},
		engine("engine", nil),
		engine("no-warm", func(o *Options) { o.NoWarmRunner = true }),
		engine("no-fastexit", func(o *Options) { o.slowExit = true }),
		engine("no-merge", func(o *Options) { o.separateConnect = true }),
		engine("no-cfg", func(o *Options) { o.legacyConfig = true }),
		engine("no-sigterm", func(o *Options) { o.legacyCleanup = true }),
		engine("original", func(o *Options) {
			o.NoWarmRunner, o.separateConnect, o.legacyConfig, o.legacyCleanup = true, true, true, true
		}),
	}
	quiet := func() {
		for _, v := range variants {
			if v.eng != nil && !v.eng.opts.NoWarmRunner {
				wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
				err := v.eng.waitWarm(wctx)
				cancel()
				if err != nil {
					b.Fatalf("%s: warm runner: %v", v.name, err)
				}
			}
		}
	}
	bv := make([]benchVariant, len(variants))
	for i, v := range variants {
		bv[i] = benchVariant{v.name, v.run}
	}
	load0 := loadavg()
	med, line, rounds := benchRounds(b, bv, quiet)
	load1 := loadavg()
	eng, raw := med["engine"], med["raw-gossh"]
	for _, v := range variants {
		b.ReportMetric(med[v.name], "ms/"+v.name)
	}
	b.ReportMetric(eng-raw, "ms-overhead")
	b.ReportMetric(eng/raw, "x-ratio")
	b.ReportMetric(0, "ns/op") // a round of all variants: meaningless
	b.Logf("medians of %d samples (ms):%s", rounds, line)
	b.Logf("engine %.0f ms vs raw %.0f ms (Go ssh; ssh client %.0f ms): overhead %.0f ms, %.1fx", eng, raw, med["raw-ssh"], eng-raw, eng/raw)
	b.Logf("what each technique buys (variant without it minus engine): warm runner %.0f ms, fast exit %.0f ms, connect check in the script task %.0f ms, ansible.cfg %.0f ms, SIGTERM instead of ssh -O exit %.0f ms; original engine %.0f ms (%.0f ms overhead)",
		med["no-warm"]-eng, med["no-fastexit"]-eng, med["no-merge"]-eng, med["no-cfg"]-eng, med["no-sigterm"]-eng, med["original"], med["original"]-raw)
	b.Logf("loadavg before: %s; after: %s", load0, load1)
}

// benchVariant is one way of doing the thing a benchmark measures.
type benchVariant struct {
	name string
	run  func() error
}

// benchRounds runs every variant once (warming every path: page cache, sshd,
// warm runners), then rounds of every variant once in a random order (load
// drifts hit all alike), quiet() before each sample: one round per b.Loop
// iteration, topped up to benchMinSamples. It returns each variant's median
// in ms, them as a " name=ms" line, and the number of rounds.
func benchRounds(b *testing.B, variants []benchVariant, quiet func()) (map[string]float64, string, int) {
	b.Helper()
	for _, v := range variants {
		if err := v.run(); err != nil {
			b.Fatal(err)
		}
	}
	samples := map[string][]time.Duration{}
	rng := rand.New(rand.NewSource(time.Now().UnixNano()))
	round := func() {
		for _, i := range rng.Perm(len(variants)) {
			v := variants[i]
			quiet()
			t0 := time.Now()
			err := v.run()
			samples[v.name] = append(samples[v.name], time.Since(t0))
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	rounds := 0
	for b.Loop() {
		round()
		rounds++
	}
	for ; rounds < benchMinSamples; rounds++ {
		round()
	}
	med := map[string]float64{}
	var line strings.Builder
	for _, v := range variants {
		med[v.name] = medianMS(samples[v.name])
		fmt.Fprintf(&line, " %s=%.0f", v.name, med[v.name])
	}
	return med, line.String(), rounds
}

func medianMS(d []time.Duration) float64 {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return float64(m.Microseconds()) / 1000
}

func loadavg() string {
	data, _ := os.ReadFile("/proc/loadavg")
	return strings.TrimSpace(string(data))
}

// BenchmarkTaskOverhead is what one Ansible task costs a role phase: an
// N-task no-op role (N = 1, 10, 30 `ansible.builtin.command: /bin/true`,
// changed_when false) run through the engine (linear strategy, and mitogen's
// mitogen_linear: Options.MitogenStrategyPath), against N `true` commands
// over raw SSH (Go x/crypto/ssh: one connection, one session each) on the
// same host, in one run. Per-task cost is the slope between N = 1 and
// N = 30, so the fixed cost of a run (ansible start, connect) drops out; it
// reports ms per task for both paths and their difference (the overhead a
// task adds over the SSH round trip it needs anyway).
//
//	go test -run '^$' -bench TaskOverhead -benchtime 5x ./internal/engine/
func BenchmarkTaskOverhead(b *testing.B) {
	w := upWorld(b, 1)
	coll, err := FindCollectionsPath()
	if err != nil {
		b.Fatal(err)
	}
	h := w.Host(0)
	conn := w.conn(0)
	ns := []int{1, 10, 30}
	roles := b.TempDir()
	for _, n := range ns {
		var tasks strings.Builder
		tasks.WriteString("---\n")
		for i := range n {
			fmt.Fprintf(&tasks, "- name: No-op %d\n  ansible.builtin.command: /bin/true\n  changed_when: false\n", i)
		}
		dir := fmt.Sprintf("%s/kpssh_bench_noop_%d/tasks", roles, n)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(dir+"/join.yml", []byte(tasks.String()), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	newEngine := func(mitogen string) *Local {
		e, err := New(Options{AnsiblePlaybook: playbookBin(b), CollectionsPath: coll, RolesPath: []string{roles}, MitogenStrategyPath: mitogen})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = e.Close() })
		return e
	}
	engines := map[string]*Local{"role": newEngine(""), "mitogen": newEngine(DefaultMitogenStrategyPath)}
	ctx := context.Background()
	target := sshx.Target{Address: conn.Address, Port: conn.Port, User: "root", PrivateKey: conn.PrivateKey, ExpectedFingerprint: h.Fingerprint}

	var variants []benchVariant
	for _, n := range ns {
		req := Request{Phase: PhaseJoin, Conn: conn, Source: Source{Role: fmt.Sprintf("kpssh_bench_noop_%d", n)}, Context: joinContext(h), Timeout: 5 * time.Minute}
		for _, name := range []string{"role", "mitogen"} {
			e := engines[name]
			variants = append(variants, benchVariant{fmt.Sprintf("%s-%d", name, n), func() error {
				if r := e.Run(ctx, req); r.Outcome != Succeeded {
					return fmt.Errorf("%s: role of %d tasks: %+v", name, n, r)
				}
				return nil
			}})
		}
		variants = append(variants, benchVariant{fmt.Sprintf("ssh-%d", n), func() error {
			c, err := sshx.Dial(ctx, target)
			if err != nil {
				return err
			}
			defer c.Close()
			for range n {
				if _, err := c.Run(ctx, "true", nil); err != nil {
					return err
				}
			}
			return nil
		}})
	}
	load0 := loadavg()
	med, line, rounds := benchRounds(b, variants, func() { quietEngines(b, engines) })
	perTask := func(prefix string) float64 { return (med[prefix+"-30"] - med[prefix+"-1"]) / 29 }
	role, mito, raw := perTask("role"), perTask("mitogen"), perTask("ssh")
	b.ReportMetric(role, "ms/task-role")
	b.ReportMetric(mito, "ms/task-mitogen")
	b.ReportMetric(raw, "ms/task-ssh")
	b.ReportMetric(role-raw, "ms/task-overhead")
	b.ReportMetric(mito-raw, "ms/task-overhead-mitogen")
	b.ReportMetric(0, "ns/op") // a round of all variants: meaningless
	b.Logf("medians of %d samples (ms):%s", rounds, line)
	b.Logf("per task (slope N=1→30): role %.1f ms (mitogen %.1f ms) vs raw SSH %.1f ms: overhead %.1f ms per task (mitogen %.1f ms; target ≤ 60 ms idle)",
		role, mito, raw, role-raw, mito-raw)
	b.Logf("fixed cost of a 1-task role: %.0f ms (mitogen %.0f ms) vs %.0f ms over raw SSH; mitogen pays off from %.0f tasks",
		med["role-1"], med["mitogen-1"], med["ssh-1"], (med["mitogen-1"]-med["role-1"])/max(role-mito, 1e-3)+1)
	b.Logf("loadavg before: %s; after: %s", load0, loadavg())
}

// BenchmarkPrebuild: what the idle runner's module payloads built ahead
// (PREBUILD in the runner) save a role phase that runs three distinct
// modules (dklesev.kpssh.files, stat, command; the shipped join runs one,
// its probe being sh); baseline: the same engine with runners that build
// nothing ahead, same host, same run, random order.
func BenchmarkPrebuild(b *testing.B) {
	w := upWorld(b, 1)
	coll, err := FindCollectionsPath()
	if err != nil {
		b.Fatal(err)
	}
	roles := b.TempDir()
	dir := roles + "/kpssh_bench_modules/tasks"
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	tasks := `---
- name: Write
  dklesev.kpssh.files:
    files:
      - {path: /tmp/kpssh-bench-prebuild, content: "x\n", mode: "0644"}
- name: Stat
  ansible.builtin.stat:
    path: /etc/hostname
- name: Command
  ansible.builtin.command: /bin/true
  changed_when: false
`
	if err := os.WriteFile(dir+"/join.yml", []byte(tasks), 0o644); err != nil {
		b.Fatal(err)
	}
	engines := map[string]*Local{}
	for name, noPrebuild := range map[string]bool{"prebuilt": false, "no-prebuild": true} {
		e, err := New(Options{AnsiblePlaybook: playbookBin(b), CollectionsPath: coll, RolesPath: []string{roles}, noPrebuild: noPrebuild})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = e.Close() })
		engines[name] = e
	}
	ctx := context.Background()
	h := w.Host(0)
	req := Request{Phase: PhaseJoin, Conn: w.conn(0), Source: Source{Role: "kpssh_bench_modules"}, Context: joinContext(h), Timeout: 5 * time.Minute}
	var variants []benchVariant
	for name, e := range engines {
		variants = append(variants, benchVariant{name, func() error {
			if r := e.Run(ctx, req); r.Outcome != Succeeded {
				return fmt.Errorf("%s: %+v", name, r)
			}
			return nil
		}})
	}
	load0 := loadavg()
	med, line, rounds := benchRounds(b, variants, func() { quietEngines(b, engines) })
	b.ReportMetric(med["prebuilt"], "ms/prebuilt")
	b.ReportMetric(med["no-prebuild"], "ms/no-prebuild")
	b.ReportMetric(med["no-prebuild"]-med["prebuilt"], "ms-saved")
	b.ReportMetric(0, "ns/op")
	b.Logf("medians of %d samples (ms):%s", rounds, line)
	b.Logf("a 3-module role phase: %.0f ms with payloads built ahead vs %.0f ms without (%.0f ms saved, ratio %.2f)",
		med["prebuilt"], med["no-prebuild"], med["no-prebuild"]-med["prebuilt"], med["prebuilt"]/med["no-prebuild"])
	b.Logf("loadavg before: %s; after: %s", load0, loadavg())
}

// quietEngines waits until every engine's warm runner is ready and, where
// it builds payloads ahead, has built them all: a round starts from idle
// runners, as a controller's phases do when they are minutes apart.
func quietEngines(b *testing.B, engines map[string]*Local) {
	for name, e := range engines {
		wctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		err := e.waitWarm(wctx)
		cancel()
		if err != nil {
			b.Fatalf("%s: warm runner: %v", name, err)
		}
		if !e.opts.noPrebuild {
			waitPrebuilt(b, e.warmDirs()[0], 2*time.Minute)
		}
	}
}
