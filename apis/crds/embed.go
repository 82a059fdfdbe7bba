// Package crds embeds the generated CustomResourceDefinitions (make generate)
// so tests and tools install exactly what is checked in.
package crds

import "embed"

// FS holds karpenter.dklesev.github.io_*.yaml.
//
//go:embed *.yaml
var FS embed.FS
