package v1beta1_test

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/dklesev/kpssh/apis/v1beta1"
)

// Label values: readable when they fit, a digest when not; a valid label
// value either way, and two different inputs never share one.
func TestLabelValues(t *testing.T) {
	long := strings.Repeat("n", 60)
	for _, tc := range []struct {
		name, got, want string
	}{
		{"host", v1beta1.HostLabelValue("kpssh-system", "h1"), "kpssh-system.h1"},
		{"host, too long", v1beta1.HostLabelValue("kpssh-system", long), "sha256-"},
		{"reservation", v1beta1.ReservationID("pool", "small"), "pool_small"},
		{"reservation, dotted names", v1beta1.ReservationID("a.b", "c"), "a.b_c"},
		{"reservation, the other split", v1beta1.ReservationID("a", "b.c"), "a_b.c"},
		{"reservation, too long", v1beta1.ReservationID(long, "small"), "sha256-"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.want == "sha256-" {
				if !strings.HasPrefix(tc.got, "sha256-") || len(tc.got) != 63 {
					t.Errorf("%q, want sha256- and 56 hex digits", tc.got)
				}
			} else if tc.got != tc.want {
				t.Errorf("%q, want %q", tc.got, tc.want)
			}
			if errs := validation.IsValidLabelValue(tc.got); len(errs) > 0 {
				t.Errorf("%q is no label value: %v", tc.got, errs)
			}
		})
	}
	if a, b := v1beta1.ReservationID(long, "a"), v1beta1.ReservationID(long, "b"); a == b {
		t.Errorf("two classes share reservation %q", a)
	}
}
