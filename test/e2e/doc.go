// Package e2e proves kpssh end to end: the controller binary built from this
// repo (Karpenter core + the SSH provider) runs as a process against a real
// control plane (hack/controlplane.sh: etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler), and real kubelets TLS-bootstrap
// on nspawn hosts (hack/hosts.sh) that install containerd, runc, the CNI
// plugins and the kubelet from a local mirror (hack/node-assets.sh).
// Run: go test -tags e2e ./test/e2e/ (make e2e).
//
// The tests carry the build tag e2e, so `go test ./...` alone does not run
// them; make test runs them with their own line.
package e2e
