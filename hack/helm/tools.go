//go:build tools

// Package tools pins the helm CLI; hack/helm.sh builds it from here.
package tools

import _ "helm.sh/helm/v3/cmd/helm"
