package envelope

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
)

// The param policy is the signed part of a v2 manifest that says which
// params may reach the script and what they may hold: without it the params
// (node-class vars, cluster endpoint and CA) are unsigned inputs that decide
// what runs. One line per name, after not-after, sorted by name:
//
//	param: KPSSH_VAR_binarySource value https://mirror.example/k8s
//	param: KPSSH_CLUSTER_CA_B64 sha256 3b1f…(64 hex of the value's bytes)
//	param: KPSSH_NODE_NAME re [a-z0-9.-]{1,253}
//
// A manifest with at least one rule declares a policy: every param sent must
// have a rule and satisfy it (unknown names are refused); a rule for a name
// that is not sent is fine. A manifest without rules keeps the old
// behaviour (names checked only) and is reported as a warning.

// Rule kinds.
const (
	RuleValue  = "value"  // the exact value
	RuleSHA256 = "sha256" // lower-case hex SHA-256 of the value's bytes
	RuleRE     = "re"     // POSIX ERE matching the whole value (grep -Ex)
)

// MaxRuleArg bounds one rule's argument (a pinned value or a pattern).
const MaxRuleArg = 1024

// ParamRule is one name's rule in a param policy.
type ParamRule struct {
	Kind string
	Arg  string
}

func (r ParamRule) String() string {
	switch r.Kind {
	case RuleSHA256:
		return "sha256 " + trunc(r.Arg, 12)
	case RuleValue:
		return fmt.Sprintf("value %q", trunc(r.Arg, 80))
	}
	return r.Kind + " " + trunc(r.Arg, 80)
}

// ParseRule reads a rule as `kpssh sign --param` takes it: "sha256:HEX",
// "re:PATTERN", "value:V" or a bare V (a fixed value).
func ParseRule(s string) (ParamRule, error) {
	r := ParamRule{Kind: RuleValue, Arg: s}
	for _, k := range []string{RuleValue, RuleSHA256, RuleRE} {
		if a, ok := strings.CutPrefix(s, k+":"); ok {
			r = ParamRule{Kind: k, Arg: a}
			break
		}
	}
	return r, r.check()
}

// anchored is how a pattern matches: the whole value, as grep -Ex does.
func anchored(re string) (*regexp.Regexp, error) { return regexp.CompilePOSIX("^(" + re + ")$") }

func (r ParamRule) check() error {
	if len(r.Arg) > MaxRuleArg || strings.ContainsAny(r.Arg, "\n\r\x00") {
		return fmt.Errorf("argument longer than %d bytes or holding a newline, carriage return or NUL", MaxRuleArg)
	}
	switch r.Kind {
	case RuleValue:
	case RuleSHA256:
		if !sha256RE.MatchString(r.Arg) {
			return errors.New("sha256 wants 64 lower-case hex digits")
		}
	case RuleRE:
		// POSIX ERE only: the shim matches with grep -Ex, so Perl syntax
		// (\d, (?i), …) that Go would accept and grep read differently is
		// refused here.
		if _, err := regexp.CompilePOSIX(r.Arg); err != nil {
			return fmt.Errorf("re is not a POSIX extended regular expression: %v", err)
		}
		// compiled alone first: "a)|(b" would escape the anchoring below
		if _, err := anchored(r.Arg); err != nil {
			return fmt.Errorf("re is not a POSIX extended regular expression: %v", err)
		}
		if !boundsOK(r.Arg) {
			return errors.New("re: a { outside a bracket expression must start a bound {n}, {n,} or {n,m} (Go reads others literally, grep refuses them)")
		}
		if strings.Contains(r.Arg, `\`) {
			return errors.New(`re: write escapes as bracket expressions ([.] not \.): GNU grep and Go read backslash escapes differently`)
		}
	default:
		return fmt.Errorf("rule kind %q (want value, sha256 or re)", trunc(r.Kind, 16))
	}
	return nil
}

// CheckRule validates one rule of a policy for name.
func CheckRule(name string, r ParamRule) error {
	if !ValidParamName(name) {
		return fmt.Errorf("param policy: name %q is not KPSSH_[A-Za-z0-9_]+", trunc(name, 64))
	}
	if r.Kind == RuleValue && r.Arg != "" && secretName(name) {
		// the manifest is public (it sits in the profile): pin secrets by digest
		return fmt.Errorf("param policy: %s is secret: pin it with sha256 or re, not value", name)
	}
	if err := r.check(); err != nil {
		return fmt.Errorf("param policy: %s: %w", name, err)
	}
	return nil
}

func secretName(n string) bool {
	return strings.HasPrefix(n, "KPSSH_SECRET_") || n == "KPSSH_BOOTSTRAP_TOKEN"
}

// Match reports whether v satisfies the rule.
func (r ParamRule) Match(v string) bool {
	switch r.Kind {
	case RuleValue:
		return v == r.Arg
	case RuleSHA256:
		d := sha256.Sum256([]byte(v))
		return hex.EncodeToString(d[:]) == r.Arg
	case RuleRE:
		re, err := anchored(r.Arg)
		return err == nil && re.MatchString(v)
	}
	return false
}

// CheckParamPolicy checks params against a manifest's policy (nil or empty:
// no policy, nothing to check). Errors name the param and the rule, never the
// value (it may be a secret).
func CheckParamPolicy(policy map[string]ParamRule, params map[string]string) error {
	if len(policy) == 0 {
		return nil
	}
	for _, k := range slices.Sorted(maps.Keys(params)) {
		r, ok := policy[k]
		if !ok {
			return fmt.Errorf("param %s is not in the signed manifest's param policy (unknown params are refused)", trunc(k, 64))
		}
		if !r.Match(params[k]) {
			return fmt.Errorf("param %s does not satisfy the signed param policy (%s)", k, r)
		}
	}
	return nil
}

func marshalPolicy(b *strings.Builder, p map[string]ParamRule) error {
	for _, k := range slices.Sorted(maps.Keys(p)) {
		if err := CheckRule(k, p[k]); err != nil {
			return fmt.Errorf("manifest: %w", err)
		}
		fmt.Fprintf(b, "param: %s %s %s\n", k, p[k].Kind, p[k].Arg)
	}
	return nil
}

// parsePolicyLine reads "param: NAME KIND ARG" (ARG may be empty or hold
// spaces).
func parsePolicyLine(l string, into map[string]ParamRule) error {
	rest, ok := strings.CutPrefix(l, "param: ")
	if !ok {
		return errors.New("manifest: after not-after only param: lines")
	}
	name, rest, ok1 := strings.Cut(rest, " ")
	kind, arg, ok2 := strings.Cut(rest, " ")
	if !ok1 || !ok2 {
		return errors.New("manifest: param line is not param: NAME KIND ARG")
	}
	if _, dup := into[name]; dup {
		return fmt.Errorf("manifest: param %s has two rules", trunc(name, 64))
	}
	into[name] = ParamRule{Kind: kind, Arg: arg}
	return nil
}

var boundRE = regexp.MustCompile(`^\{[0-9]+(,[0-9]*)?\}`)

// boundsOK reports whether every { outside a bracket expression starts a
// bound.
func boundsOK(re string) bool {
	for i := 0; i < len(re); i++ {
		switch re[i] {
		case '[':
			i = bracketEnd(re, i)
		case '{':
			if !boundRE.MatchString(re[i:]) {
				return false
			}
		}
	}
	return true
}

// bracketEnd is the index of the ] closing the bracket expression at i (a
// leading ^ and ] are literal; [:class:], [.x.] and [=x=] are skipped).
func bracketEnd(re string, i int) int {
	j := i + 1
	if j < len(re) && re[j] == '^' {
		j++
	}
	if j < len(re) && re[j] == ']' {
		j++
	}
	for ; j < len(re) && re[j] != ']'; j++ {
		if re[j] == '[' && j+1 < len(re) && strings.IndexByte(":.=", re[j+1]) >= 0 {
			if k := strings.Index(re[j+2:], string(re[j+1])+"]"); k >= 0 {
				j += k + 3
			}
		}
	}
	return j
}
