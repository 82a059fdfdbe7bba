# Every target runs with the toolchain karpenter v1.15 needs (TESTBED §1).
export GOTOOLCHAIN := go1.27.3
export GOFLAGS := -buildvcs=false
SHELL := /bin/bash

ROOT := $(abspath .)
KPSSH_CACHE ?= $(ROOT)/.cache
export KPSSH_CACHE
CONTROLLER_GEN_VERSION := v0.21.0
CONTROLLER_GEN := $(ROOT)/bin/tools/controller-gen-$(CONTROLLER_GEN_VERSION)/controller-gen
GO_TEST_FLAGS ?= -count=1

.PHONY: all build bin soak generate verify-generate deps k8s-bins rootfs runner-image controller-image test test-unit test-crd test-hosts molecule bench demo clean-world

all: build

build:
	go build ./...

## bin: the controller and the kpssh CLI into bin/
bin:
	go build -o bin/ ./cmd/controller ./cmd/kpssh

$(CONTROLLER_GEN):
	GOBIN=$(dir $@) go install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_GEN_VERSION)

## generate: deepcopy and CRD YAML from apis/ (checked in)
generate: $(CONTROLLER_GEN)
	$(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt paths=./apis/... \
	  crd output:crd:artifacts:config=apis/crds

## deps: apt packages the tests and the test world need (idempotent)
deps:
	hack/deps.sh

## k8s-bins: kube-apiserver, etcd, kcm, scheduler, kubelet built from the module proxy (cached)
k8s-bins:
	@hack/k8s-bins.sh >/dev/null

## rootfs: the test-host image (cached)
rootfs:
	@hack/rootfs.sh >/dev/null

## runner-image: the runner image, built here with buildah from a debootstrapped base (cached; prints its ref)
runner-image: deps
	@hack/runner-image.sh

## controller-image: the runner image plus the controller image on top of it (prints the controller's ref)
controller-image: deps
	@hack/runner-image.sh --controller

## test: everything CI runs
test: deps k8s-bins rootfs runner-image $(CONTROLLER_GEN)
	KUBEBUILDER_ASSETS=$$(hack/k8s-bins.sh) CONTROLLER_GEN=$(CONTROLLER_GEN) \
	  KPSSH_ENGINE_SOAK_RUNS=$${KPSSH_ENGINE_SOAK_RUNS:-200} \
	  go test $(GO_TEST_FLAGS) -timeout 40m ./...

## soak: the engine's full 1,000-run soak (zombies, orphans, leftover run dirs)
soak: deps rootfs
	KPSSH_ENGINE_SOAK_RUNS=1000 go test $(GO_TEST_FLAGS) -timeout 90m -run TestSoakPhaseRuns -v ./internal/engine/

## test-unit: the fast tests (no apiserver, no hosts)
test-unit:
	go test $(GO_TEST_FLAGS) -short ./...

## test-crd: the CRD validation suite against the real kube-apiserver
test-crd: k8s-bins
	KUBEBUILDER_ASSETS=$$(hack/k8s-bins.sh) go test $(GO_TEST_FLAGS) -v ./apis/...

## molecule: the shipped roles' molecule scenarios (harness over nspawn hosts) and ansible-lint
molecule: deps rootfs
	go test $(GO_TEST_FLAGS) -timeout 30m -run 'TestMolecule|TestAnsibleLint' -v ./test/molecule/

## test-hosts: the nspawn host world tests
test-hosts: deps rootfs
	go test $(GO_TEST_FLAGS) -v ./test/hostenv/

## bench: every benchmark, each printing its figure and its same-run baseline
bench: deps k8s-bins rootfs
	KUBEBUILDER_ASSETS=$$(hack/k8s-bins.sh) go test -run '^$$' -bench . -benchtime 3x -timeout 30m ./...

## demo: local control plane + hosts + controller + a workload scaling up and down
demo:
	hack/demo.sh
