package profile

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dklesev/kpssh/apis/v1beta1"
	"github.com/dklesev/kpssh/internal/envelope"
)

func TestCheckExpiry(t *testing.T) {
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	manifest := func(phase string, notAfter time.Time) v1beta1.Signature {
		m, err := envelope.MarshalManifest(envelope.Manifest{Phase: phase, Profile: "p@1", ScriptSHA256: strings.Repeat("a", 64), IssuedAt: now.Add(-30 * 24 * time.Hour), NotAfter: notAfter})
		if err != nil {
			t.Fatal(err)
		}
		return v1beta1.Signature(string(m) + "-----BEGIN SSH SIGNATURE-----\nU1NIU0lH\n-----END SSH SIGNATURE-----\n")
	}
	prof := func(s *v1beta1.ProfileSignatures) *v1beta1.SSHJoinProfile {
		return &v1beta1.SSHJoinProfile{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: v1beta1.SSHJoinProfileSpec{Version: "1", Signatures: s}}
	}
	day := 24 * time.Hour
	for _, tc := range []struct {
		name       string
		sigs       *v1beta1.ProfileSignatures
		wantReason string
		wantIn     []string
		wantNext   time.Time
	}{
		{name: "unsigned"},
		{name: "v1 signatures carry no expiry", sigs: &v1beta1.ProfileSignatures{Leave: "-----BEGIN SSH SIGNATURE-----\nU1NIU0lH\n-----END SSH SIGNATURE-----\n"}},
		{name: "30 days out: quiet until the window opens", sigs: &v1beta1.ProfileSignatures{Leave: manifest("leave", now.Add(30*day))},
			wantNext: now.Add(16 * day)},
		{name: "13 days out", sigs: &v1beta1.ProfileSignatures{Leave: manifest("leave", now.Add(13*day)), Join: manifest("join", now.Add(20*day))},
			wantReason: ReasonSignaturesExpiring, wantIn: []string{"profile p@1: leave manifest expires 2026-12-14T00:00:00Z"}, wantNext: now.Add(6 * day)},
		{name: "one expired, one expiring", sigs: &v1beta1.ProfileSignatures{Leave: manifest("leave", now.Add(-day)), Join: manifest("join", now.Add(day))},
			wantReason: ReasonSignaturesExpired, wantIn: []string{"leave manifest expired 2026-11-30T00:00:00Z; join manifest expires 2026-12-02T00:00:00Z", "provisioned fallback leave"},
			wantNext: now.Add(day)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := CheckExpiry(prof(tc.sigs), now)
			if st.Reason != tc.wantReason || !st.Next.Equal(tc.wantNext) {
				t.Fatalf("reason %q next %v, want %q %v (%s)", st.Reason, st.Next, tc.wantReason, tc.wantNext, st.Message)
			}
			for _, s := range tc.wantIn {
				if !strings.Contains(st.Message, s) {
					t.Errorf("message %q lacks %q", st.Message, s)
				}
			}
			if tc.wantReason == "" && st.Message != "" {
				t.Errorf("message %q without a reason", st.Message)
			}
		})
	}
}
