package engine

import (
	"sort"
	"strings"
	"unicode/utf8"
)

// MinRedactLen is the shortest value that is redacted: shorter values would
// shred ordinary output (and are too short to be a credential worth hiding).
const MinRedactLen = 8

// Mask replaces every redacted value.
const Mask = "***"

// Redactor scrubs secret values from text.
type Redactor struct {
	needles []string
	longest int
}

// NewRedactor builds a redactor for the given values. Each value of at least
// MinRedactLen bytes is scrubbed, together with the forms it takes in output
// we relay: shell single-quote escaping (set -x traces print ' as '\”) and
// JSON/YAML escaping; of a multi-line value, every line of at least
// MinRedactLen bytes (spaces trimmed) is scrubbed on its own too.
func NewRedactor(values ...string) *Redactor {
	seen := map[string]bool{}
	r := &Redactor{}
	add := func(v string) {
		if len(v) < MinRedactLen || seen[v] {
			return
		}
		seen[v] = true
		r.needles = append(r.needles, v)
		if len(v) > r.longest {
			r.longest = len(v)
		}
	}
	for _, v := range values {
		add(v)
		// A multi-line secret (a PEM key) is often printed a line at a
		// time: every line of MinRedactLen or more is a secret of its own.
		if strings.ContainsAny(v, "\n\r") {
			for _, l := range strings.FieldsFunc(v, func(r rune) bool { return r == '\n' || r == '\r' }) {
				add(strings.TrimSpace(l))
			}
		}
		if strings.ContainsAny(v, `'"\`+"\n\t\r") {
			add(strings.ReplaceAll(v, `'`, `'\''`))
			add(strings.ReplaceAll(v, `'`, `'"'"'`))
			add(jsonEscape(v))
		}
	}
	// Longest first: purely cosmetic (intervals are merged anyway).
	sort.Slice(r.needles, func(i, j int) bool { return len(r.needles[i]) > len(r.needles[j]) })
	return r
}

// redactorFor collects every secret of a request: the bootstrap token and
// its secret half, every Secrets value, every Request.Redact value.
func redactorFor(req Request) *Redactor {
	var vals []string
	if t := req.Context.BootstrapToken; t != "" {
		vals = append(vals, t)
		if i := strings.IndexByte(t, '.'); i >= 0 {
			vals = append(vals, t[i+1:])
		}
	}
	for _, v := range req.Context.Secrets {
		vals = append(vals, v)
	}
	vals = append(vals, req.Redact...)
	return NewRedactor(vals...)
}

func jsonEscape(s string) string {
	var b strings.Builder
	for _, c := range s {
		switch c {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		default:
			b.WriteRune(c)
		}
	}
	return b.String()
}

// Redact replaces every occurrence of every value with Mask. Occurrences
// that overlap (of one value, or of different values) are merged first, so
// no fragment of either survives.
func (r *Redactor) Redact(s string) string {
	if r == nil || len(r.needles) == 0 || s == "" {
		return s
	}
	type span struct{ a, b int }
	var spans []span
	for _, n := range r.needles {
		for off := 0; off <= len(s)-len(n); {
			i := strings.Index(s[off:], n)
			if i < 0 {
				break
			}
			spans = append(spans, span{off + i, off + i + len(n)})
			off += i + 1 // overlapping occurrences too
		}
	}
	if len(spans) == 0 {
		return s
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].a < spans[j].a })
	var b strings.Builder
	last := 0
	cur := spans[0]
	flush := func(sp span) {
		b.WriteString(s[last:sp.a])
		b.WriteString(Mask)
		last = sp.b
	}
	for _, sp := range spans[1:] {
		if sp.a <= cur.b { // overlapping or adjacent: merge
			if sp.b > cur.b {
				cur.b = sp.b
			}
			continue
		}
		flush(cur)
		cur = sp
	}
	flush(cur)
	b.WriteString(s[last:])
	return b.String()
}

// RedactTail redacts a tail of some longer output. When the tail was cut
// (truncated), a secret may straddle the cut and its remainder sit at the
// very start of the tail where no full match exists: the first longest-secret
// bytes are dropped (up to the next newline when that is close), then the
// rest is redacted.
func (r *Redactor) RedactTail(s string, truncated bool) string {
	if truncated && r != nil && r.longest > 0 && s != "" {
		cut := r.longest
		if cut > len(s) {
			cut = len(s)
		}
		if nl := strings.IndexByte(s, '\n'); nl >= 0 && nl < cut+256 && nl >= cut-1 {
			cut = nl + 1
		}
		for cut < len(s) && !utf8.RuneStart(s[cut]) {
			cut++
		}
		s = "…" + s[cut:]
	}
	return r.Redact(s)
}

// RedactHead redacts the start of some longer output (a diff, kept from
// its start): when it was cut (truncated), a secret may straddle the cut at
// its very end, so the last longest-secret bytes are dropped (back to the
// previous newline when that is close), then the rest is redacted.
func (r *Redactor) RedactHead(s string, truncated bool) string {
	if truncated && r != nil && r.longest > 0 && s != "" {
		end := len(s) - r.longest
		if end < 0 {
			end = 0
		}
		if nl := strings.LastIndexByte(s[:end], '\n'); nl >= 0 && nl > end-256 {
			end = nl + 1
		}
		for end > 0 && !utf8.RuneStart(s[end]) {
			end--
		}
		s = s[:end] + "…"
	}
	return r.Redact(s)
}

// headString keeps the first n bytes of s (on a rune boundary) and reports
// whether anything was dropped.
func headString(s string, n int) (string, bool) {
	if len(s) <= n {
		return s, false
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n], true
}

// tailString keeps the last n bytes of s (on a rune boundary) and reports
// whether anything was dropped.
func tailString(s string, n int) (string, bool) {
	if len(s) <= n {
		return s, false
	}
	i := len(s) - n
	for i < len(s) && !utf8.RuneStart(s[i]) {
		i++
	}
	return s[i:], true
}
