package cloudprovider

import (
	"testing"

	"github.com/dklesev/kpssh/internal/providers/leave"
)

// The Static providerID by which leave ties a Node to its host (the zombie
// guard, Delete, token GC) must be the one Create gives the join.
func TestStaticProviderIDIsTheCloudProvidersFormat(t *testing.T) {
	if got, want := leave.StaticProviderID(newHost("bm-07", "small")), ProviderID(ns, "bm-07"); got != want || got != "kpssh://kpssh-system/bm-07" {
		t.Fatalf("leave says %q, the cloud provider %q", got, want)
	}
}

func TestParseProviderID(t *testing.T) {
	for _, tc := range []struct {
		in       string
		ns, host string
		ok       bool
	}{
		{"kpssh://kpssh-system/h1", "kpssh-system", "h1", true},
		{"kpssh://pool/host-a.lab", "pool", "host-a.lab", true},
		{"kpssh://kpssh-system/", "", "", false},
		{"kpssh://kpssh-system", "", "", false},
		{"kpssh://Bad_NS/h1", "", "", false},
		{"kpssh://ns/h1/extra", "", "", false},
		{"eks-hybrid:///us-west-2/c/mi-0123", "", "", false},
		{"", "", "", false},
	} {
		ns, host, err := ParseProviderID(tc.in)
		if (err == nil) != tc.ok || ns != tc.ns || host != tc.host {
			t.Errorf("%q → %q %q %v", tc.in, ns, host, err)
		}
	}
	if ProviderID("kpssh-system", "h1") != "kpssh://kpssh-system/h1" {
		t.Fatal(ProviderID("kpssh-system", "h1"))
	}
}

func FuzzParseProviderID(f *testing.F) {
	f.Add("kpssh://kpssh-system/h1")
	f.Add("kpssh:///")
	f.Add("kpssh://a/b/c")
	f.Fuzz(func(t *testing.T, s string) {
		ns, host, err := ParseProviderID(s)
		if err != nil {
			return
		}
		if ProviderID(ns, host) != s {
			t.Fatalf("%q parsed to %q/%q which does not round-trip", s, ns, host)
		}
	})
}
