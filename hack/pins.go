//go:build tools

// Package hack pins the dependency set of TESTBED §1 (karpenter's own pins)
// until the code that uses each module lands, so `go mod tidy` cannot drift
// controller-runtime to v0.25 or k8s.io to v0.37.
package hack

import (
	_ "github.com/apenella/go-ansible/v2/pkg/playbook"
	_ "github.com/awslabs/operatorpkg/status"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "golang.org/x/crypto/ssh"
	_ "gopkg.in/yaml.v3"
	_ "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	_ "sigs.k8s.io/controller-runtime"
	_ "sigs.k8s.io/karpenter/pkg/apis/v1"
)
