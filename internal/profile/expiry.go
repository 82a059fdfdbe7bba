package profile

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/engine"
	"github.com/dklesev/kpssh/internal/envelope"
)

// ExpiryWarning is how long before a signed manifest's not-after the node
// class says so (`kpssh sign --manifest` signs for 30 days by default):
// time to re-sign before launches on Verified hosts are refused and leave
// falls back to the hosts' provisioned fallback leave.
const ExpiryWarning = 14 * 24 * time.Hour

// Expiry is the not-after of one phase's v2 manifest.
type Expiry struct {
	Phase    engine.Phase
	NotAfter time.Time
}

// Expiries lists the not-after of p's v2 manifests, soonest first (v1
// signatures have none; unparsable ones are the signature check's errors).
func Expiries(p *v1beta1.SSHJoinProfile) []Expiry {
	if p == nil || p.Spec.Signatures == nil {
		return nil
	}
	var out []Expiry
	for _, ph := range engine.Phases {
		f, err := envelope.ParseSignedField(string(Signature(p, ph)))
		if err != nil || f.Manifest == nil {
			continue
		}
		if m, err := envelope.ParseManifest(f.Manifest); err == nil {
			out = append(out, Expiry{Phase: ph, NotAfter: m.NotAfter.UTC()})
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].NotAfter.Before(out[j].NotAfter) })
	return out
}

// ExpiryStatus is what a node class says about its profile's manifests at
// a time: Reason "" when none expires within ExpiryWarning, else Expiring
// or (one has) Expired with Message naming each phase and its date. Next
// is when the answer changes (zero: never).
type ExpiryStatus struct {
	Reason, Message string
	Next            time.Time
}

// Reasons of the node class condition SignaturesExpiring.
const (
	ReasonSignaturesExpiring = "Expiring"
	ReasonSignaturesExpired  = "Expired"
)

// CheckExpiry reports p's manifests that expire before now+ExpiryWarning.
func CheckExpiry(p *v1beta1.SSHJoinProfile, now time.Time) ExpiryStatus {
	var st ExpiryStatus
	var parts []string
	later := func(t time.Time) {
		if t.After(now) && (st.Next.IsZero() || t.Before(st.Next)) {
			st.Next = t
		}
	}
	for _, e := range Expiries(p) {
		at := e.NotAfter.Format(time.RFC3339)
		switch {
		case !now.Before(e.NotAfter):
			st.Reason = ReasonSignaturesExpired
			parts = append(parts, fmt.Sprintf("%s manifest expired %s", e.Phase, at))
		case now.Add(ExpiryWarning).After(e.NotAfter):
			if st.Reason == "" {
				st.Reason = ReasonSignaturesExpiring
			}
			parts = append(parts, fmt.Sprintf("%s manifest expires %s", e.Phase, at))
			later(e.NotAfter)
		default:
			later(e.NotAfter.Add(-ExpiryWarning))
		}
	}
	if st.Reason != "" {
		st.Message = fmt.Sprintf("profile %s: %s. Re-sign (kpssh sign --manifest) and apply it: on Verified hosts an expired install, join, verify or reboot is refused before anything connects, and an expired leave runs the host's provisioned fallback leave instead",
			p.Marker(), strings.Join(parts, "; "))
	}
	return st
}
