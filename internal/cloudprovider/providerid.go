package cloudprovider

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/dklesev/kpssh/apis/v1beta1"
)

const providerIDPrefix = v1beta1.ProviderIDScheme + "://"

// ProviderID is the Static-mode providerID of a host: kpssh://<namespace>/<host>.
func ProviderID(namespace, host string) string {
	return providerIDPrefix + namespace + "/" + host
}

// ParseProviderID splits a kpssh:// providerID; anything else is an error
// (an Adopt-mode node carries its mechanism's own providerID).
func ParseProviderID(id string) (namespace, host string, err error) {
	rest, ok := strings.CutPrefix(id, providerIDPrefix)
	if !ok {
		return "", "", fmt.Errorf("providerID %q does not start with %s", id, providerIDPrefix)
	}
	namespace, host, ok = strings.Cut(rest, "/")
	if !ok || len(validation.IsDNS1123Label(namespace)) > 0 || len(validation.IsDNS1123Subdomain(host)) > 0 {
		return "", "", fmt.Errorf("providerID %q is not %s<namespace>/<host>", id, providerIDPrefix)
	}
	return namespace, host, nil
}
