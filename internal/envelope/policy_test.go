package envelope

import (
	"bytes"
	"context"
	"os/exec"
	"reflect"
	"strings"
	"testing"
	"time"
)

const caDigest = "3b1f0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a"

func TestParseRule(t *testing.T) {
	cases := []struct {
		in   string
		want ParamRule
		err  string
	}{
		{"https://m.example/k8s", ParamRule{RuleValue, "https://m.example/k8s"}, ""},
		{"value:re:literal", ParamRule{RuleValue, "re:literal"}, ""},
		{"", ParamRule{RuleValue, ""}, ""},
		{"sha256:" + caDigest, ParamRule{RuleSHA256, caDigest}, ""},
		{"re:[a-z]+", ParamRule{RuleRE, "[a-z]+"}, ""},
		{"sha256:ABC", ParamRule{}, "64 lower-case hex"},
		{`re:\d+`, ParamRule{}, "POSIX"},
		{`re:[0-9]+\.x`, ParamRule{}, "bracket expressions"},
		{"re:(?i)x", ParamRule{}, "POSIX"},
		{"re:a)|(b", ParamRule{}, "POSIX"},
		{"a\nb", ParamRule{}, "newline"},
		{strings.Repeat("x", MaxRuleArg+1), ParamRule{}, "longer than"},
	}
	for _, c := range cases {
		got, err := ParseRule(c.in)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%q: want error %q, got %v", c.in, c.err, err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%q: got %+v, %v; want %+v", c.in, got, err, c.want)
		}
	}
}

func TestCheckParamPolicy(t *testing.T) {
	policy := map[string]ParamRule{
		"KPSSH_VAR_binarySource": {RuleValue, "https://m.example/k8s"},
		"KPSSH_CLUSTER_CA_B64":   {RuleSHA256, "2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae"}, // sha256("foo")
		"KPSSH_NODE_NAME":        {RuleRE, "[a-z0-9-]{1,63}"},
	}
	cases := []struct {
		name   string
		policy map[string]ParamRule
		params map[string]string
		want   string // "" = accepted; else a part of the error
	}{
		{"all good", policy, map[string]string{"KPSSH_VAR_binarySource": "https://m.example/k8s", "KPSSH_CLUSTER_CA_B64": "foo", "KPSSH_NODE_NAME": "n-1"}, ""},
		{"a rule for a param not sent", policy, map[string]string{"KPSSH_NODE_NAME": "n"}, ""},
		{"no policy: anything", nil, map[string]string{"KPSSH_VAR_binarySource": "http://evil"}, ""},
		{"rogue binarySource", policy, map[string]string{"KPSSH_VAR_binarySource": "http://10.0.0.1/evil"}, `KPSSH_VAR_binarySource does not satisfy the signed param policy (value "https://m.example/k8s")`},
		{"empty is a value too", policy, map[string]string{"KPSSH_VAR_binarySource": ""}, "KPSSH_VAR_binarySource"},
		{"rogue CA", policy, map[string]string{"KPSSH_CLUSTER_CA_B64": "bar"}, "KPSSH_CLUSTER_CA_B64 does not satisfy the signed param policy (sha256 2c26b46b68ff…)"},
		{"pattern is anchored", policy, map[string]string{"KPSSH_NODE_NAME": "n;rm -rf /"}, "KPSSH_NODE_NAME does not satisfy the signed param policy (re [a-z0-9-]{1,63})"},
		{"unknown name", policy, map[string]string{"KPSSH_VAR_extra": "x"}, "KPSSH_VAR_extra is not in the signed manifest's param policy"},
	}
	for _, c := range cases {
		err := CheckParamPolicy(c.policy, c.params)
		if (c.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%s: want %q, got %v", c.name, c.want, err)
		}
		if err != nil && strings.Contains(err.Error(), "evil") {
			t.Errorf("%s: the error shows the value: %v", c.name, err)
		}
	}
}

func TestManifestPolicy(t *testing.T) {
	m := Manifest{Phase: "join", Profile: "tls@3", ScriptSHA256: ScriptDigest([]byte("x")), IssuedAt: t0, NotAfter: t0.Add(time.Hour),
		Params: map[string]ParamRule{"KPSSH_VAR_b": {RuleValue, "a b "}, "KPSSH_VAR_a": {RuleValue, ""}, "KPSSH_CLUSTER_CA_B64": {RuleSHA256, caDigest}}}
	b, err := MarshalManifest(m)
	if err != nil {
		t.Fatal(err)
	}
	want := "param: KPSSH_CLUSTER_CA_B64 sha256 " + caDigest + "\nparam: KPSSH_VAR_a value \nparam: KPSSH_VAR_b value a b \n"
	if !strings.HasSuffix(string(b), want) {
		t.Fatalf("manifest:\n%s\nwant it to end with\n%s", b, want)
	}
	got, err := ParseManifest(b)
	if err != nil || !reflect.DeepEqual(got, m) {
		t.Fatalf("round trip: %v\n got %#v\nwant %#v", err, got, m)
	}
	head := string(b[:bytes.Index(b, []byte("param: "))])
	for name, bad := range map[string]string{
		"unsorted":      head + "param: KPSSH_VAR_b value x\nparam: KPSSH_VAR_a value y\n",
		"twice":         head + "param: KPSSH_VAR_a value x\nparam: KPSSH_VAR_a value y\n",
		"unknown kind":  head + "param: KPSSH_VAR_a glob *\n",
		"no arg field":  head + "param: KPSSH_VAR_a value\n",
		"bad name":      head + "param: PATH value /tmp\n",
		"other line":    head + "comment: x\n",
		"secret pinned": head + "param: KPSSH_SECRET_CODE value s3cr3t\n",
		"bad pattern":   head + "param: KPSSH_VAR_a re (\n",
	} {
		if _, err := ParseManifest([]byte(bad)); err == nil {
			t.Errorf("%s: parsed", name)
		}
	}
	// Parse (the shim's Go twin) refuses params against the policy
	e := Envelope{Version: 2, Phase: "join", Profile: "tls@3", Manifest: b, Signature: []byte("sig"), Script: []byte("x"),
		Params: map[string]string{"KPSSH_VAR_a": "not empty"}}
	data, err := Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Parse(data); err == nil || !strings.Contains(err.Error(), "KPSSH_VAR_a does not satisfy") {
		t.Fatalf("parse against the policy: %v", err)
	}
	e.Params["KPSSH_VAR_a"] = ""
	if data, err = Marshal(e); err != nil {
		t.Fatal(err)
	}
	if _, err := Parse(data); err != nil {
		t.Fatalf("parse within the policy: %v", err)
	}
}

// TestRuleMatchesGrep: the shim matches re rules with the real grep -Ex (C
// locale); Go must agree on every accepted pattern.
func TestRuleMatchesGrep(t *testing.T) {
	patterns := []string{"[a-z0-9-]{1,63}", "(https://m[.]example/k8s)?", "a|b", "(a|)", "[[:digit:]]+[.][[:alpha:]]*", "x*", ".*", "[^/]+", "ab{2,3}c"}
	values := []string{"", "a", "b", "ab", "abbc", "abbbbc", "https://m.example/k8s", "https://mXexample/k8s", "12.ab", "12x", "n-1", "a/b", "x;y", "xxxxx"}
	for _, p := range patterns {
		r, err := ParseRule("re:" + p)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		for _, v := range values {
			if g, w := r.Match(v), grepMatch(t, p, v); g != w {
				t.Errorf("pattern %q value %q: Go %v, grep -Ex %v", p, v, g, w)
			}
		}
	}
}

func grepMatch(t testing.TB, pattern, value string) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := exec.CommandContext(ctx, "grep", "-Eqx", "-e", pattern)
	c.Env = []string{"LC_ALL=C"}
	c.Stdin = strings.NewReader(value + "\n")
	err := c.Run()
	if ee, ok := err.(*exec.ExitError); ok && ee.ExitCode() == 1 {
		return false
	}
	if err != nil {
		t.Fatalf("grep -Ex %q: %v", pattern, err)
	}
	return true
}

// FuzzRuleMatchesGrep: any pattern the Go side accepts matches printable
// ASCII values as grep -Ex does.
func FuzzRuleMatchesGrep(f *testing.F) {
	f.Add("[a-z]{1,3}", "ab")
	f.Add("(a|b)*c", "abac")
	f.Add("[[:space:]]?x", " x")
	f.Fuzz(func(t *testing.T, pattern, value string) {
		r, err := ParseRule("re:" + pattern)
		if err != nil || !printableASCII(pattern) || !printableASCII(value) {
			return
		}
		if g, w := r.Match(value), grepMatch(t, pattern, value); g != w {
			t.Fatalf("pattern %q value %q: Go %v, grep -Ex %v", pattern, value, g, w)
		}
	})
}

func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// FuzzParseManifest: a manifest that parses is canonical (it re-marshals to
// the same bytes) and every rule of its policy is valid; checking any params
// against it never panics.
func FuzzParseManifest(f *testing.F) {
	m := Manifest{Phase: "join", Profile: "tls@3", ScriptSHA256: ScriptDigest([]byte("x")), IssuedAt: t0, NotAfter: t0.Add(time.Hour)}
	plain, _ := MarshalManifest(m)
	m.Params = map[string]ParamRule{"KPSSH_CLUSTER_CA_B64": {RuleSHA256, caDigest}, "KPSSH_NODE_NAME": {RuleRE, "[a-z]{1,3}"}, "KPSSH_VAR_a": {RuleValue, "a b"}}
	withPolicy, _ := MarshalManifest(m)
	f.Add(plain, "KPSSH_NODE_NAME", "ab")
	f.Add(withPolicy, "KPSSH_VAR_a", "a b")
	f.Fuzz(func(t *testing.T, b []byte, name, value string) {
		m, err := ParseManifest(b)
		if err != nil {
			return
		}
		again, err := MarshalManifest(m)
		if err != nil || !bytes.Equal(again, b) {
			t.Fatalf("parsed manifest does not re-marshal to itself: %v", err)
		}
		for k, r := range m.Params {
			if err := CheckRule(k, r); err != nil {
				t.Fatalf("parsed rule %s is invalid: %v", k, err)
			}
		}
		_ = CheckParamPolicy(m.Params, map[string]string{name: value})
	})
}
