package engine

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dklesev/kpssh/internal/sshx"
)

// BenchmarkScriptPhase measures one script phase through ansible-playbook on
// a real host (render, ansible-playbook with the connect check and the
// script task, ControlPersist teardown, run directory removal) and, in the
// same run, the baseline: the same rendered script over Go x/crypto/ssh
// (sshx.Dial + Run "bash -s", a fresh connection each time, as a phase would
// have).
//
//	go test -run '^$' -bench ScriptPhase -benchtime 5x ./internal/engine/
func BenchmarkScriptPhase(b *testing.B) {
	w := upWorld(b, 1)
	coll, err := FindCollectionsPath()
	if err != nil {
		b.Fatal(err)
	}
	e, err := New(Options{AnsiblePlaybook: "/usr/bin/ansible-playbook", CollectionsPath: coll})
	if err != nil {
		b.Fatal(err)
	}
	h := w.Host(0)
	conn := w.conn(0)
	script := "echo hello from {{ .NodeName }}\nuname -r >/dev/null\ntest -n \"$KPSSH_SECRET_APIKEY\"\n"
	req := Request{Phase: PhaseJoin, Conn: conn, Source: Source{Script: script}, Context: joinContext(h), Timeout: time.Minute}
	ctx := context.Background()

	// the baseline's input: the same preamble + rendered body
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

	// warm both paths (page cache, sshd) outside the measurement
	if r := e.Run(ctx, req); r.Outcome != Succeeded {
		b.Fatalf("warm-up: %+v", r)
	}
	var ansible, gossh time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		r := e.Run(ctx, req)
		ansible += time.Since(t0)
		if r.Outcome != Succeeded {
			b.Fatalf("ansible run: %+v", r)
		}

		t0 = time.Now()
		c, err := sshx.Dial(ctx, target)
		if err != nil {
			b.Fatal(err)
		}
		res, err := c.Run(ctx, "bash -s", strings.NewReader(full))
		c.Close()
		gossh += time.Since(t0)
		if err != nil || !strings.Contains(res.Stdout, "hello from node-h1") {
			b.Fatalf("go ssh: %v %q", err, res.Stdout)
		}
	}
	b.StopTimer()
	n := float64(b.N)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / n }
	b.ReportMetric(ms(ansible), "ms/phase-ansible")
	b.ReportMetric(ms(gossh), "ms/phase-gossh")
	b.ReportMetric(float64(ansible)/float64(gossh), "x-slower")
	b.ReportMetric(0, "ns/op") // the two figures above are the result
}
