// Package envelope is the wire format between the controller and the
// Verified-mode shim on a host (kpssh-shim): what goes to the shim's stdin.
//
// v1 (the seed format) carries the phase, the params, the script and an
// SSHSIG over the script. v2 adds a signed manifest binding phase,
// profile@version, the script's SHA-256 and a validity window, so that an
// old signed script cannot be replayed, a join cannot be sent as leave and a
// profile cannot be rolled back; its signature covers the manifest instead
// of the script. A v2 manifest may also carry a param policy (policy.go):
// which params, with which values, the script may get. Every line is
// "key: value"; binary fields are single-line
// standard base64, so the POSIX sh shim can split the envelope with `read`.
//
// The package knows nothing of Kubernetes or Ansible.
package envelope

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"time"
)

// Limits the shim enforces too.
const (
	MaxScript    = 256 * 1024
	MaxSignature = 16 * 1024
	MaxParams    = 256 * 1024
	MaxManifest  = 16 * 1024
	// MaxEnvelope bounds a whole envelope (the shim reads at most this).
	MaxEnvelope = 1024 * 1024
	// TimeLayout is the only time format of manifests: fixed width UTC, so
	// the shim can compare times as strings.
	TimeLayout = "2006-01-02T15:04:05Z"
)

var (
	paramRE   = regexp.MustCompile(`^KPSSH_[A-Za-z0-9_]+$`)
	phaseRE   = regexp.MustCompile(`^(install|join|leave|uninstall|reboot|verify|check)$`)
	profileRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?@[A-Za-z0-9._-]{1,63}$`)
	sha256RE  = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// ValidParamName reports whether n may be a shim param (^KPSSH_[A-Za-z0-9_]+$).
func ValidParamName(n string) bool { return paramRE.MatchString(n) }

// ValidProfile reports whether s is "<profile>@<version>".
func ValidProfile(s string) bool { return profileRE.MatchString(s) }

// Envelope is one request to the shim.
type Envelope struct {
	// Version is 1 or 2.
	Version int
	Phase   string
	// Profile is "<name>@<version>" (v2 only; the shim checks it against the
	// manifest).
	Profile string
	// Params become the script's environment (KPSSH_* names only).
	Params map[string]string
	// Manifest is the exact signed manifest text (v2 only).
	Manifest []byte
	// Signature is the armored SSHSIG: over Script (v1), over Manifest (v2).
	Signature []byte
	// Script is the exact signed bytes the shim runs.
	Script []byte
}

// CheckParams validates names and values (no newline, no NUL: the shim
// splits params by line and exports each).
func CheckParams(p map[string]string) error {
	for _, k := range slices.Sorted(maps.Keys(p)) {
		if !ValidParamName(k) {
			return fmt.Errorf("param name %q is not KPSSH_[A-Za-z0-9_]+", trunc(k, 64))
		}
		if strings.ContainsAny(p[k], "\n\r\x00") {
			return fmt.Errorf("param %s: value holds a newline, carriage return or NUL", k)
		}
	}
	return nil
}

func encodeParams(p map[string]string) []byte {
	var b bytes.Buffer
	for _, k := range slices.Sorted(maps.Keys(p)) {
		b.WriteString(k + "=" + p[k] + "\n")
	}
	return b.Bytes()
}

// Marshal renders the envelope after checking every field.
func Marshal(e Envelope) ([]byte, error) {
	if err := e.check(); err != nil {
		return nil, err
	}
	b64 := base64.StdEncoding.EncodeToString
	var out bytes.Buffer
	fmt.Fprintf(&out, "kpssh-envelope: %d\n", e.Version)
	fmt.Fprintf(&out, "phase: %s\n", e.Phase)
	if e.Version == 2 {
		fmt.Fprintf(&out, "profile: %s\n", e.Profile)
	}
	fmt.Fprintf(&out, "params-b64: %s\n", b64(encodeParams(e.Params)))
	if e.Version == 2 {
		fmt.Fprintf(&out, "manifest-b64: %s\n", b64(e.Manifest))
	}
	fmt.Fprintf(&out, "sig-b64: %s\n", b64(e.Signature))
	fmt.Fprintf(&out, "script-b64: %s\n", b64(e.Script))
	if out.Len() > MaxEnvelope {
		return nil, fmt.Errorf("envelope is %d bytes, more than %d", out.Len(), MaxEnvelope)
	}
	return out.Bytes(), nil
}

func (e Envelope) check() error {
	if e.Version != 1 && e.Version != 2 {
		return fmt.Errorf("envelope version %d (want 1 or 2)", e.Version)
	}
	if !phaseRE.MatchString(e.Phase) {
		return fmt.Errorf("unknown phase %q", trunc(e.Phase, 32))
	}
	if err := CheckParams(e.Params); err != nil {
		return err
	}
	if len(encodeParams(e.Params)) > MaxParams {
		return fmt.Errorf("params are more than %d bytes", MaxParams)
	}
	if len(e.Script) == 0 || len(e.Script) > MaxScript {
		return fmt.Errorf("script is %d bytes (want 1–%d)", len(e.Script), MaxScript)
	}
	if len(e.Signature) == 0 || len(e.Signature) > MaxSignature {
		return fmt.Errorf("signature is %d bytes (want 1–%d)", len(e.Signature), MaxSignature)
	}
	switch e.Version {
	case 1:
		if e.Profile != "" || len(e.Manifest) != 0 {
			return errors.New("v1 envelope carries no profile or manifest")
		}
	case 2:
		if !ValidProfile(e.Profile) {
			return fmt.Errorf("profile %q is not <name>@<version>", trunc(e.Profile, 80))
		}
		if _, err := ParseManifest(e.Manifest); err != nil {
			return err
		}
	}
	return nil
}

// Parse reads an envelope strictly: the fields in order, each once, nothing
// else. It is the Go twin of the shim's parser (tests and tools).
func Parse(data []byte) (Envelope, error) {
	var e Envelope
	if len(data) > MaxEnvelope {
		return e, fmt.Errorf("envelope is more than %d bytes", MaxEnvelope)
	}
	if !bytes.HasSuffix(data, []byte("\n")) {
		return e, errors.New("envelope does not end with a newline")
	}
	lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	if len(lines) == 0 {
		return e, errors.New("empty envelope")
	}
	head, ok := field(lines[0], "kpssh-envelope")
	if !ok {
		return e, errors.New("not a kpssh envelope (first line must be kpssh-envelope: 1 or 2)")
	}
	switch head {
	case "1":
		e.Version = 1
	case "2":
		e.Version = 2
	default:
		return e, fmt.Errorf("envelope version %q (want 1 or 2)", trunc(head, 8))
	}
	keys := []string{"phase", "params-b64", "sig-b64", "script-b64"}
	if e.Version == 2 {
		keys = []string{"phase", "profile", "params-b64", "manifest-b64", "sig-b64", "script-b64"}
	}
	if len(lines) != len(keys)+1 {
		return e, fmt.Errorf("envelope v%d has %d lines, want %d", e.Version, len(lines), len(keys)+1)
	}
	vals := map[string]string{}
	for i, k := range keys {
		v, ok := field(lines[i+1], k)
		if !ok {
			return e, fmt.Errorf("envelope line %d: want %q", i+2, k+": …")
		}
		vals[k] = v
	}
	dec := func(k string, max int) ([]byte, error) {
		b, err := base64.StdEncoding.Strict().DecodeString(vals[k])
		if err != nil {
			return nil, fmt.Errorf("%s is not base64", k)
		}
		if len(b) > max {
			return nil, fmt.Errorf("%s is more than %d bytes", k, max)
		}
		return b, nil
	}
	var err error
	e.Phase, e.Profile = vals["phase"], vals["profile"]
	params, err := dec("params-b64", MaxParams)
	if err != nil {
		return e, err
	}
	if e.Params, err = decodeParams(params); err != nil {
		return e, err
	}
	if e.Signature, err = dec("sig-b64", MaxSignature); err != nil {
		return e, err
	}
	if e.Script, err = dec("script-b64", MaxScript); err != nil {
		return e, err
	}
	if e.Version == 2 {
		if e.Manifest, err = dec("manifest-b64", MaxManifest); err != nil {
			return e, err
		}
	}
	if err := e.check(); err != nil {
		return e, err
	}
	if e.Version == 2 {
		// as the shim: the params the signed policy allows (Marshal leaves
		// this to its caller, which may hold masked values)
		m, _ := ParseManifest(e.Manifest)
		if err := CheckParamPolicy(m.Params, e.Params); err != nil {
			return e, err
		}
	}
	return e, nil
}

func field(l, key string) (string, bool) {
	p := key + ": "
	if !strings.HasPrefix(l, p) {
		// an empty value may come without the trailing space
		if l == key+":" {
			return "", true
		}
		return "", false
	}
	return l[len(p):], true
}

func decodeParams(b []byte) (map[string]string, error) {
	out := map[string]string{}
	if len(b) == 0 {
		return out, nil
	}
	if !bytes.HasSuffix(b, []byte("\n")) {
		return nil, errors.New("params do not end with a newline")
	}
	for _, l := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		k, v, ok := strings.Cut(l, "=")
		if !ok {
			return nil, errors.New("param line without '='")
		}
		if _, dup := out[k]; dup {
			return nil, fmt.Errorf("param %s given twice", trunc(k, 64))
		}
		out[k] = v
	}
	return out, CheckParams(out)
}

// Manifest is the signed statement of envelope v2.
type Manifest struct {
	Phase        string
	Profile      string // <name>@<version>
	ScriptSHA256 string // lower-case hex
	IssuedAt     time.Time
	NotAfter     time.Time
	// Params is the param policy (see policy.go); empty: none declared.
	Params map[string]ParamRule
}

const manifestHead = "kpssh-manifest: 2"

// MarshalManifest renders the manifest text (the bytes that get signed).
func MarshalManifest(m Manifest) ([]byte, error) {
	if !phaseRE.MatchString(m.Phase) {
		return nil, fmt.Errorf("manifest: unknown phase %q", trunc(m.Phase, 32))
	}
	if !ValidProfile(m.Profile) {
		return nil, fmt.Errorf("manifest: profile %q is not <name>@<version>", trunc(m.Profile, 80))
	}
	if !sha256RE.MatchString(m.ScriptSHA256) {
		return nil, errors.New("manifest: script-sha256 is not 64 lower-case hex digits")
	}
	if m.IssuedAt.IsZero() || m.NotAfter.IsZero() || !m.NotAfter.After(m.IssuedAt) {
		return nil, errors.New("manifest: not-after must be after issued-at")
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s\nphase: %s\nprofile: %s\nscript-sha256: %s\nissued-at: %s\nnot-after: %s\n",
		manifestHead, m.Phase, m.Profile, m.ScriptSHA256, m.IssuedAt.UTC().Format(TimeLayout), m.NotAfter.UTC().Format(TimeLayout))
	if err := marshalPolicy(&b, m.Params); err != nil {
		return nil, err
	}
	if b.Len() > MaxManifest {
		return nil, fmt.Errorf("manifest is %d bytes, more than %d (fewer or shorter param rules)", b.Len(), MaxManifest)
	}
	return []byte(b.String()), nil
}

// ParseManifest reads a manifest strictly (the exact form MarshalManifest
// writes: re-marshalling gives the same bytes).
func ParseManifest(b []byte) (Manifest, error) {
	var m Manifest
	if len(b) == 0 || len(b) > MaxManifest {
		return m, errors.New("manifest: empty or too large")
	}
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	if !bytes.HasSuffix(b, []byte("\n")) || len(lines) < 6 || lines[0] != manifestHead {
		return m, errors.New("manifest: want the 6 lines kpssh-manifest: 2, phase, profile, script-sha256, issued-at, not-after (then param: lines)")
	}
	if len(lines) > 6 {
		m.Params = map[string]ParamRule{}
		for _, l := range lines[6:] {
			if err := parsePolicyLine(l, m.Params); err != nil {
				return m, err
			}
		}
	}
	vals := make([]string, 5)
	for i, k := range []string{"phase", "profile", "script-sha256", "issued-at", "not-after"} {
		v, ok := field(lines[i+1], k)
		if !ok {
			return m, fmt.Errorf("manifest line %d: want %q", i+2, k+": …")
		}
		vals[i] = v
	}
	m.Phase, m.Profile, m.ScriptSHA256 = vals[0], vals[1], vals[2]
	var err error
	if m.IssuedAt, err = time.Parse(TimeLayout, vals[3]); err != nil {
		return m, errors.New("manifest: issued-at is not YYYY-MM-DDTHH:MM:SSZ")
	}
	if m.NotAfter, err = time.Parse(TimeLayout, vals[4]); err != nil {
		return m, errors.New("manifest: not-after is not YYYY-MM-DDTHH:MM:SSZ")
	}
	again, err := MarshalManifest(m)
	if err != nil {
		return m, err
	}
	if !bytes.Equal(again, b) {
		return m, errors.New("manifest: not in canonical form")
	}
	return m, nil
}

// ScriptDigest is the manifest's script-sha256 of script.
func ScriptDigest(script []byte) string {
	d := sha256.Sum256(script)
	return hex.EncodeToString(d[:])
}

// CheckManifest checks a parsed manifest against what is about to run.
func CheckManifest(m Manifest, phase, profile string, script []byte, now time.Time) error {
	switch {
	case m.Phase != phase:
		return fmt.Errorf("manifest is for phase %s, not %s", m.Phase, phase)
	case m.Profile != profile:
		return fmt.Errorf("manifest is for %s, not %s", m.Profile, profile)
	case m.ScriptSHA256 != ScriptDigest(script):
		return errors.New("manifest's script-sha256 does not match the script")
	case !now.Before(m.NotAfter):
		return fmt.Errorf("manifest expired at %s", m.NotAfter.UTC().Format(TimeLayout))
	case now.Add(5 * time.Minute).Before(m.IssuedAt):
		return fmt.Errorf("manifest is issued in the future (%s)", m.IssuedAt.UTC().Format(TimeLayout))
	}
	return nil
}

// SignedField is the content of a profile's signatures.<phase>: an armored
// SSHSIG over the script (v1), or a manifest followed by an armored SSHSIG
// over that manifest (v2).
type SignedField struct {
	Manifest  []byte // nil for v1
	Signature []byte
}

// ParseSignedField splits a signatures.<phase> value.
func ParseSignedField(s string) (SignedField, error) {
	s = strings.ReplaceAll(s, "\r\n", "\n")
	s = strings.TrimLeft(s, " \t\n")
	if s == "" {
		return SignedField{}, errors.New("no signature")
	}
	if !strings.HasPrefix(s, manifestHead+"\n") {
		return SignedField{Signature: []byte(s)}, nil
	}
	i := strings.Index(s, "-----BEGIN SSH SIGNATURE-----")
	if i < 0 {
		return SignedField{}, errors.New("manifest without a signature after it")
	}
	return SignedField{Manifest: []byte(s[:i]), Signature: []byte(s[i:])}, nil
}

// FormatSignedField is the inverse of ParseSignedField.
func FormatSignedField(f SignedField) string {
	return string(f.Manifest) + string(f.Signature)
}

func trunc(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
