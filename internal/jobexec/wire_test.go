package jobexec

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/dklesev/kpssh/internal/engine"
)

// fakeKey stands in for a private key (not key material: the values only
// have to be recognisable when they leak).
const fakeKey = "kpssh-test-private-key-material"

func fullRequest() engine.Request {
	return engine.Request{
		Phase: engine.PhaseJoin,
		Conn:  engine.Connection{Address: "10.0.0.5", Port: 2222, User: "ops", PrivateKey: []byte(fakeKey), HostKey: "ssh-ed25519 AAAAC3Nz"},
		Source: engine.Source{Script: "echo {{ .NodeName }}", Verified: &engine.Verified{ProvisionedLeave: true, Signature: "-----BEGIN SSH SIGNATURE-----", Profile: "p@2",
			TrustedSigners: []string{"ssh-ed25519 AAAA signer"}, ShimCommand: "sudo -n kpssh-shim"}},
		Context: engine.Context{ClusterEndpoint: "https://10.0.0.1:6443", ClusterCAB64: "Q0E=", BootstrapToken: "abcdef.0123456789abcdef",
			NodeName: "n1", ProviderID: "kpssh://ns/h1", HostAddress: "10.0.0.5", NodeAddress: "10.0.0.5", NodeLabels: "a=b", Taints: "t=:NoSchedule",
			Vars: map[string]string{"v": "it's \"x\""}, Secrets: map[string]string{"s": "sekret-value-123"}},
		Timeout: 90 * time.Second,
		Redact:  []string{"extra-redacted-value"},
		Key:     "ns/h1/join/uid",
	}
}

func TestInputRoundTrip(t *testing.T) {
	req := fullRequest()
	req.Check = true
	b, err := EncodeInput(req)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeInput(b)
	if err != nil {
		t.Fatal(err)
	}
	want := req
	want.Key = "" // names the Job; not part of the inputs
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, want)
	}
	// Every other field of the three structs survives: a field added to the
	// engine but not to the wire would be lost silently in a Job.
	for _, c := range []struct {
		typ  reflect.Type
		wire reflect.Type
		skip map[string]bool
	}{
		// Progress is the caller's callback: a Job's pod reports its own (its log).
		{reflect.TypeOf(engine.Request{}), reflect.TypeOf(wireInput{}), map[string]bool{"Key": true, "Progress": true}},
		{reflect.TypeOf(engine.Connection{}), reflect.TypeOf(wireConn{}), nil},
		{reflect.TypeOf(engine.Source{}), reflect.TypeOf(wireSource{}), nil},
		{reflect.TypeOf(engine.Context{}), reflect.TypeOf(wireContext{}), nil},
		{reflect.TypeOf(engine.Verified{}), reflect.TypeOf(wireVerified{}), map[string]bool{"Now": true}},
		{reflect.TypeOf(engine.Result{}), reflect.TypeOf(wireResult{}), map[string]bool{"Duration": true}},
	} {
		for i := 0; i < c.typ.NumField(); i++ {
			f := c.typ.Field(i)
			if _, ok := c.wire.FieldByName(f.Name); !ok && !c.skip[f.Name] {
				t.Errorf("%s.%s has no wire field", c.typ, f.Name)
			}
		}
	}
}

func TestDecodeInputRefuses(t *testing.T) {
	good, _ := EncodeInput(fullRequest())
	var m map[string]any
	_ = json.Unmarshal(good, &m)
	with := func(k string, v any) []byte {
		c := map[string]any{}
		for a, b := range m {
			c[a] = b
		}
		c[k] = v
		b, _ := json.Marshal(c)
		return b
	}
	cases := []struct {
		name string
		in   []byte
		want string
	}{
		{"empty", nil, "not a kpssh phase request"},
		{"not json", []byte("phase: join"), "not a kpssh phase request"},
		{"version", with("version", 2), "input version 2"},
		{"phase", with("phase", "bogus"), `phase "bogus"`},
		{"unknown field", with("surprise", 1), "unknown field"},
		{"negative timeout", with("timeoutNs", -1), "negative"},
		{"trailing", append(append([]byte{}, good...), []byte(" {}")...), "trailing"},
		{"huge", make([]byte, maxInput+1), "over the"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := DecodeInput(c.in)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err %v, want it to contain %q", err, c.want)
			}
			// Errors never quote the inputs' secrets.
			for _, s := range []string{"sekret-value-123", "0123456789abcdef", fakeKey} {
				if strings.Contains(err.Error(), s) {
					t.Fatalf("error quotes a secret: %v", err)
				}
			}
		})
	}
	if _, err := EncodeInput(engine.Request{Phase: "bogus"}); err == nil {
		t.Error("EncodeInput took an unknown phase")
	}
}

func TestResultRoundTripAndBound(t *testing.T) {
	cases := []engine.Result{
		{Outcome: engine.Succeeded, Duration: 1500 * time.Millisecond, ExitCode: 0, Touched: true},
		{Outcome: engine.Failed, FailedTask: "kpssh join", RC: 3, ExitCode: 2, Message: "boom", Touched: true},
		{Outcome: engine.TimedOut, ExitCode: -1, Message: strings.Repeat("x", engine.MaxMessage)},
		// Control characters escape to six bytes each: 2 KiB of them is 12 KiB of JSON.
		{Outcome: engine.Failed, FailedTask: strings.Repeat("\x01", 3000), Message: strings.Repeat("\x02é", 2000), ExitCode: 2},
		{Outcome: engine.ConfigError, ExitCode: -1, Message: strings.Repeat("ü", 5000)},
	}
	for i, r := range cases {
		b := EncodeResult(r)
		if len(b) > MaxTerminationMessage {
			t.Fatalf("case %d: %d bytes", i, len(b))
		}
		got, err := ParseResult(string(b))
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		if got.Outcome != r.Outcome || got.RC != r.RC || got.ExitCode != r.ExitCode || got.Touched != r.Touched || got.Duration != r.Duration.Truncate(time.Millisecond) {
			t.Errorf("case %d: got %+v want %+v", i, got, r)
		}
		if len(r.Message)+len(r.FailedTask) < 1000 && (got.Message != r.Message || got.FailedTask != r.FailedTask) {
			t.Errorf("case %d: a short result was cut: %+v", i, got)
		}
		if !utf8.ValidString(got.Message) || !utf8.ValidString(got.FailedTask) {
			t.Errorf("case %d: cut inside a rune", i)
		}
		if len(r.Message) > 3000 && !strings.Contains(got.Message, " … ") {
			t.Errorf("case %d: a cut message does not say so", i)
		}
	}
}

// A check's changed tasks come back: whole when they fit; past the bound
// the diffs go first, then tasks, never the last one (the verdict).
func TestResultChanges(t *testing.T) {
	small := engine.Result{Outcome: engine.Succeeded, Touched: true, Changes: []engine.Change{
		{Task: "join: Write the kubelet configuration", Diff: "--- /var/lib/kubelet/config.yaml\n+maxPods: 110"}, {Task: "join: units", Censored: true}}}
	got, err := ParseResult(string(EncodeResult(small)))
	if err != nil || !reflect.DeepEqual(got.Changes, small.Changes) {
		t.Fatalf("small: %+v %v", got.Changes, err)
	}
	var many []engine.Change
	for i := 0; i < engine.MaxChanges; i++ {
		many = append(many, engine.Change{Task: strings.Repeat("t", 300), Diff: strings.Repeat("\x01", engine.MaxDiff)})
	}
	b := EncodeResult(engine.Result{Outcome: engine.Succeeded, Touched: true, Message: strings.Repeat("m", 2000), Changes: many})
	if len(b) > MaxTerminationMessage {
		t.Fatalf("%d bytes", len(b))
	}
	got, err = ParseResult(string(b))
	if err != nil || len(got.Changes) == 0 || got.Outcome != engine.Succeeded {
		t.Fatalf("many: %d changes, %v", len(got.Changes), err)
	}
	for _, c := range got.Changes {
		if c.Diff != "" {
			t.Fatalf("a diff survived where the tasks did not fit: %d changes", len(got.Changes))
		}
	}
	over := `{"v":1,"outcome":"Succeeded","exitCode":0,"changes":[` + strings.TrimSuffix(strings.Repeat(`{"task":"t"},`, engine.MaxChanges+1), ",") + `]}`
	if _, err := ParseResult(over); !errors.Is(err, ErrNoResult) {
		t.Fatalf("%d changes accepted: %v", engine.MaxChanges+1, err)
	}
}

func TestParseResultRefuses(t *testing.T) {
	for _, msg := range []string{
		"", "   ", "phase-run: reading the input: open x: no such file",
		`{"v":2,"outcome":"Succeeded","exitCode":0}`,
		`{"v":1,"outcome":"Exploded","exitCode":0}`,
		`{"v":1,"outcome":"Succeeded","exitCode":0,"extra":1}`,
		`{"v":1,"outcome":"Succeeded","exitCode":0} {}`,
		`{"v":1,"outcome":"Succeeded","exitCode":0,"durationMs":-5}`,
		`{"v":1,"outcome":"Succeeded","exitCode":"0"}`,
		`{"v":1,"outcome":"Succeeded","exitCode":0,"message":"` + strings.Repeat("a", 5000) + `"}`,
	} {
		if r, err := ParseResult(msg); err == nil || !errors.Is(err, ErrNoResult) {
			t.Errorf("%.60q: %+v, %v", msg, r, err)
		}
	}
}

// FuzzParseResult: the parser of what a pod (or anything writing to its
// termination log) says never panics, and what it accepts re-encodes to
// itself.
func FuzzParseResult(f *testing.F) {
	f.Add(string(EncodeResult(engine.Result{Outcome: engine.Failed, FailedTask: "t", RC: 1, ExitCode: 2, Message: "m", Touched: true})))
	f.Add(`{"v":1,"outcome":"Succeeded","exitCode":0}`)
	f.Add("phase-run: bad")
	f.Add(`{"v":1,"outcome":"TimedOut","exitCode":-1,"durationMs":9223372036854775807}`)
	f.Fuzz(func(t *testing.T, msg string) {
		r, err := ParseResult(msg)
		if err != nil {
			if !errors.Is(err, ErrNoResult) {
				t.Fatalf("error not ErrNoResult: %v", err)
			}
			return
		}
		again, err := ParseResult(string(EncodeResult(r)))
		if err != nil {
			t.Fatalf("accepted %q, its re-encoding is refused: %v", msg, err)
		}
		if !reflect.DeepEqual(again, r) {
			t.Fatalf("re-encoding changed %+v to %+v", r, again)
		}
	})
}

// FuzzDecodeInput: whatever lands in the inputs Secret, the pod side never
// panics, and an accepted request re-encodes to the same request.
func FuzzDecodeInput(f *testing.F) {
	b, _ := EncodeInput(fullRequest())
	f.Add(b)
	f.Add([]byte(`{"version":1,"phase":"leave","conn":{"address":"h","privateKey":null,"hostKey":""},"source":{},"context":{},"timeoutNs":0}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		req, err := DecodeInput(in)
		if err != nil {
			return
		}
		b, err := EncodeInput(req)
		if err != nil {
			t.Fatalf("accepted input does not re-encode: %v", err)
		}
		again, err := DecodeInput(b)
		if err != nil || !reflect.DeepEqual(again, req) {
			t.Fatalf("re-decode: %v\n%+v\n%+v", err, again, req)
		}
	})
}
