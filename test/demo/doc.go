// Package demo runs the README's main command: `make demo` (hack/demo.sh)
// brings up its world, scales the pause Deployment 0 → 2 → 0 and prints the
// timeline; the test checks that timeline and the cluster, then `make
// demo-down` must leave nothing on the machine. It runs under its own
// KPSSH_DEMO_NAME, so a developer's demo keeps running beside it.
// Run: go test -tags e2e ./test/demo/ (a line of make test).
//
// The test carries the build tag e2e (it needs root, nspawn hosts, the
// Kubernetes binaries and the runner image); the timeline parser's tests run
// everywhere.
package demo
