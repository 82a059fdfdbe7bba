package envelope

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

func manifest(t testing.TB, phase string, script []byte) []byte {
	t.Helper()
	m, err := MarshalManifest(Manifest{Phase: phase, Profile: "tls@3", ScriptSHA256: ScriptDigest(script), IssuedAt: t0, NotAfter: t0.Add(24 * time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestRoundTrip(t *testing.T) {
	script := []byte("#!/bin/bash\nset -euo pipefail\necho 'x'\n")
	sig := []byte("-----BEGIN SSH SIGNATURE-----\nAAAA\n-----END SSH SIGNATURE-----\n")
	cases := []Envelope{
		{Version: 1, Phase: "join", Params: map[string]string{"KPSSH_NODE_NAME": "n1", "KPSSH_TAINTS": "a=b:NoExecute", "KPSSH_EMPTY": ""}, Signature: sig, Script: script},
		{Version: 1, Phase: "leave", Params: map[string]string{}, Signature: sig, Script: script},
		{Version: 2, Phase: "install", Profile: "tls@3", Params: map[string]string{"KPSSH_VAR_x": "= spaces ' \" $(x)"}, Manifest: manifest(t, "install", script), Signature: sig, Script: script},
	}
	for _, e := range cases {
		data, err := Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Parse(data)
		if err != nil {
			t.Fatalf("parse: %v\n%s", err, data)
		}
		if !reflect.DeepEqual(got, e) {
			t.Fatalf("round trip:\n got %#v\nwant %#v", got, e)
		}
		if !strings.HasPrefix(string(data), "kpssh-envelope: ") {
			t.Fatal("no header")
		}
	}
}

func TestMarshalRejects(t *testing.T) {
	script := []byte("true\n")
	sig := []byte("sig")
	good := Envelope{Version: 1, Phase: "join", Signature: sig, Script: script}
	cases := []struct {
		name string
		mod  func(*Envelope)
		want string
	}{
		{"version", func(e *Envelope) { e.Version = 3 }, "version"},
		{"phase", func(e *Envelope) { e.Phase = "bogus" }, "unknown phase"},
		{"unprefixed param", func(e *Envelope) { e.Params = map[string]string{"PATH": "/tmp"} }, "not KPSSH_"},
		{"BASH_ENV", func(e *Envelope) { e.Params = map[string]string{"BASH_ENV": "/tmp/x"} }, "not KPSSH_"},
		{"bare prefix", func(e *Envelope) { e.Params = map[string]string{"KPSSH_": "x"} }, "not KPSSH_"},
		{"dash", func(e *Envelope) { e.Params = map[string]string{"KPSSH_A-B": "x"} }, "not KPSSH_"},
		{"newline", func(e *Envelope) { e.Params = map[string]string{"KPSSH_A": "x\ny"} }, "newline"},
		{"NUL", func(e *Envelope) { e.Params = map[string]string{"KPSSH_A": "x\x00"} }, "NUL"},
		{"no script", func(e *Envelope) { e.Script = nil }, "script"},
		{"huge script", func(e *Envelope) { e.Script = make([]byte, MaxScript+1) }, "script"},
		{"no sig", func(e *Envelope) { e.Signature = nil }, "signature"},
		{"v1 manifest", func(e *Envelope) { e.Manifest = []byte("x") }, "v1"},
		{"v2 profile", func(e *Envelope) { e.Version = 2; e.Profile = "NoVersion" }, "profile"},
		{"v2 manifest", func(e *Envelope) { e.Version = 2; e.Profile = "p@1"; e.Manifest = []byte("nope\n") }, "manifest"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := good
			c.mod(&e)
			_, err := Marshal(e)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("want error with %q, got %v", c.want, err)
			}
		})
	}
}

func TestParseRejects(t *testing.T) {
	good, err := Marshal(Envelope{Version: 1, Phase: "join", Signature: []byte("s"), Script: []byte("true\n"), Params: map[string]string{"KPSSH_A": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(good), "\n")
	cases := []struct{ name, in, want string }{
		{"raw script", "#!/bin/bash\nrm -rf /\n", "not a kpssh envelope"},
		{"empty", "", "newline"},
		{"no final newline", strings.TrimSuffix(string(good), "\n"), "newline"},
		{"extra line", string(good) + "x: y\n", "lines"},
		{"swapped lines", strings.Join([]string{lines[0], lines[2], lines[1], lines[3], lines[4], ""}, "\n"), "want"},
		{"bad base64", strings.Replace(string(good), "script-b64: ", "script-b64: !", 1), "base64"},
		{"bad param", strings.Replace(string(good), lines[2], "params-b64: UEFUSD0vdG1wCg==", 1), "not KPSSH_"}, // PATH=/tmp
		{"dup param", strings.Replace(string(good), lines[2], "params-b64: S1BTU0hfQT0xCktQU1NIX0E9Mgo=", 1), "twice"},
		{"v9", strings.Replace(string(good), "kpssh-envelope: 1", "kpssh-envelope: 9", 1), "version"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse([]byte(c.in))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("want error with %q, got %v", c.want, err)
			}
		})
	}
}

func TestManifest(t *testing.T) {
	script := []byte("set -euo pipefail\n")
	m := manifest(t, "join", script)
	pm, err := ParseManifest(m)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, phase, profile string
		script               []byte
		now                  time.Time
		want                 string
	}{
		{"ok", "join", "tls@3", script, t0.Add(time.Hour), ""},
		{"join as leave", "leave", "tls@3", script, t0.Add(time.Hour), "phase join"},
		{"rollback", "join", "tls@2", script, t0.Add(time.Hour), "tls@3"},
		{"tampered", "join", "tls@3", append(script, '#'), t0.Add(time.Hour), "sha256"},
		{"expired", "join", "tls@3", script, t0.Add(25 * time.Hour), "expired"},
		{"future", "join", "tls@3", script, t0.Add(-time.Hour), "future"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := CheckManifest(pm, c.phase, c.profile, c.script, c.now)
			if (c.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.want)) {
				t.Fatalf("want %q, got %v", c.want, err)
			}
		})
	}
	for _, bad := range [][]byte{
		bytes.Replace(m, []byte("Z\n"), []byte("+00:00\n"), 1),
		bytes.Replace(m, []byte("phase: join"), []byte("phase: bogus"), 1),
		append(m, "extra: 1\n"...),
		bytes.TrimSuffix(m, []byte("\n")),
		bytes.Replace(m, []byte("kpssh-manifest: 2"), []byte("kpssh-manifest: 1"), 1),
	} {
		if _, err := ParseManifest(bad); err == nil {
			t.Errorf("bad manifest parsed:\n%s", bad)
		}
	}
}

func TestSignedField(t *testing.T) {
	sig := "-----BEGIN SSH SIGNATURE-----\nAAAA\n-----END SSH SIGNATURE-----\n"
	f, err := ParseSignedField(sig)
	if err != nil || f.Manifest != nil || string(f.Signature) != sig {
		t.Fatalf("v1 field: %+v %v", f, err)
	}
	m := manifest(t, "join", []byte("x"))
	f, err = ParseSignedField(string(m) + sig)
	if err != nil || !bytes.Equal(f.Manifest, m) || string(f.Signature) != sig {
		t.Fatalf("v2 field: %+v %v", f, err)
	}
	if FormatSignedField(f) != string(m)+sig {
		t.Fatal("format is not the inverse")
	}
	if _, err := ParseSignedField(string(m)); err == nil {
		t.Fatal("manifest without signature parsed")
	}
	if _, err := ParseSignedField("  \n"); err == nil {
		t.Fatal("empty field parsed")
	}
}

// FuzzParse: whatever Parse accepts marshals back to the same bytes.
func FuzzParse(f *testing.F) {
	script := []byte("true\n")
	for _, e := range []Envelope{
		{Version: 1, Phase: "join", Signature: []byte("s"), Script: script, Params: map[string]string{"KPSSH_A": "1"}},
		{Version: 2, Phase: "join", Profile: "tls@3", Manifest: manifest(f, "join", script), Signature: []byte("s"), Script: script},
	} {
		d, _ := Marshal(e)
		f.Add(d)
	}
	f.Add([]byte("kpssh-envelope: 1\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		e, err := Parse(in)
		if err != nil {
			return
		}
		out, err := Marshal(e)
		if err != nil {
			t.Fatalf("parsed envelope does not marshal: %v", err)
		}
		if !bytes.Equal(out, bytes.Replace(in, []byte(":\n"), []byte(": \n"), -1)) {
			t.Fatalf("not canonical:\n in %q\nout %q", in, out)
		}
	})
}

// FuzzMarshal: any envelope Marshal accepts parses back equal.
func FuzzMarshal(f *testing.F) {
	f.Add("join", "KPSSH_A", "v", []byte("true\n"), []byte("sig"))
	f.Add("leave", "PATH", "/tmp", []byte("x"), []byte("s"))
	f.Fuzz(func(t *testing.T, phase, name, val string, script, sig []byte) {
		e := Envelope{Version: 1, Phase: phase, Params: map[string]string{name: val}, Script: script, Signature: sig}
		d, err := Marshal(e)
		if err != nil {
			return
		}
		got, err := Parse(d)
		if err != nil {
			t.Fatalf("marshalled envelope does not parse: %v", err)
		}
		if !reflect.DeepEqual(got, e) {
			t.Fatalf("round trip differs")
		}
	})
}
