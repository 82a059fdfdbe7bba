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

.PHONY: collection node-assets runner-bin test-prereqs all build bin soak generate chart-crds helm chart images deps k8s-bins rootfs runner-image controller-image test test-unit test-crd test-hosts test-cross molecule molecule-role bench demo demo-down e2e clean-world

all: build

build:
	go build ./...

## bin: the controller and the kpssh CLI into bin/ (kpssh version: git describe and commit)
KPSSH_VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo unknown)
KPSSH_COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
bin:
	go build -ldflags "-X github.com/dklesev/kpssh/internal/cli.version=$(KPSSH_VERSION) -X github.com/dklesev/kpssh/internal/cli.commit=$(KPSSH_COMMIT)" \
	  -o bin/ ./cmd/controller ./cmd/kpssh
	ln -sf kpssh bin/kubectl-kpssh           # kubectl finds it as the plugin `kubectl kpssh`
	ln -sf kpssh bin/kubectl_complete-kpssh  # and completes `kubectl kpssh …` through it

$(CONTROLLER_GEN):
	GOBIN=$(dir $@) go install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_GEN_VERSION)

## generate: deepcopy and CRD YAML from apis/ (checked in)
generate: $(CONTROLLER_GEN)
	$(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt paths=./apis/... \
	  crd output:crd:artifacts:config=apis/crds
	$(MAKE) chart-crds

## chart-crds: the chart's CRDs: apis/crds into crds/ (Helm installs them once),
## Karpenter core's into karpenter-crds/ (templates, karpenterCRDs.install); a test fails on drift
chart-crds:
	rm -f charts/kpssh/crds/*.yaml charts/kpssh/karpenter-crds/*.yaml
	cp apis/crds/*.yaml charts/kpssh/crds/
	cp $$(go list -m -f '{{.Dir}}' sigs.k8s.io/karpenter)/pkg/apis/crds/*.yaml charts/kpssh/karpenter-crds/
	chmod 0644 charts/kpssh/crds/*.yaml charts/kpssh/karpenter-crds/*.yaml

## helm: the helm CLI built from the Go module proxy (cached; prints its path)
helm:
	@hack/helm.sh

## chart: lint the chart with every optional object on
chart:
	$$(hack/helm.sh) lint --strict charts/kpssh --kube-version 1.36.3 \
	  --set serviceMonitor.enabled=true,prometheusRule.enabled=true,networkPolicy.enabled=true,podDisruptionBudget.enabled=true,dashboard.enabled=true \
	  --set executor=job,tokenSecretPolicy.enabled=true,hostNetwork=true,dnsPolicy=ClusterFirstWithHostNet \
	  --set nameOverride=kpssh,fullnameOverride=kpssh,additionalLabels.team=platform,additionalAnnotations.owner=platform,global.registry=reg.example \
	  --set settings.batchMaxDuration=20s,settings.featureGates.NodeRepair=true,strategy.type=RollingUpdate \
	  --set-json 'topologySpreadConstraints=[{"maxSkew":1,"topologyKey":"kubernetes.io/hostname","whenUnsatisfiable":"ScheduleAnyway"}]' \
	  --set-json 'extraVolumes=[{"name":"roles","emptyDir":{}}]' --set-json 'extraVolumeMounts=[{"name":"roles","mountPath":"/roles"}]' \
	  --set-json 'content.roles=[{"name":"site_join","files":{"tasks/join.yml":"- ansible.builtin.meta: noop\n"}}]' \
	  --set-json 'content.images=[{"name":"acme","reference":"reg.example/acme:1"},{"name":"old","reference":"reg.example/acme:0","copy":true}]'

## deps: apt packages the tests and the test world need (idempotent)
deps:
	hack/deps.sh

## k8s-bins: kube-apiserver, etcd, kcm, scheduler, kubelet built from the module proxy (cached)
k8s-bins:
	@hack/k8s-bins.sh >/dev/null

## rootfs: the test-host images, Debian 12 and Debian 13 (cached)
rootfs:
	@hack/rootfs.sh >/dev/null
	@hack/rootfs.sh trixie >/dev/null

## runner-image: the runner image, built here with buildah from a debootstrapped base (cached; prints its ref)
runner-image: deps
	@hack/runner-image.sh

## runner-bin: the runner image's own ansible-playbook, ansible-lint, ... as a
## bin dir (bubblewrap over the image's root; prints it). Every test and the
## demo put it first on PATH: what ships is what is tested.
runner-bin: deps
	@hack/runner-image.sh --bin | tail -n 1
RUNNER_PATH = PATH=$$(hack/runner-image.sh --bin | tail -n 1):$$PATH

## collection: the dklesev.kpssh collection tarball (roles included), built by the
## runner image's ansible-galaxy into bin/collection/ (prints its path)
collection: deps
	@$(RUNNER_PATH) hack/collection.sh | tail -n 1

## controller-image: the runner image plus the controller image on top of it (prints the controller's ref)
controller-image: deps
	@hack/runner-image.sh --controller

## images: runner + controller images. IMAGE_BUILDER=docker|podman|buildah builds the two
## Dockerfiles with that tool as $(IMAGE_REPO)/kpssh-{runner,controller}:$(IMAGE_TAG) (the
## controller's compiles itself in a golang build stage); unset, the registry-free build
## here (hack/runner-image.sh --controller)
IMAGE_BUILDER ?=
IMAGE_REPO ?= localhost
IMAGE_TAG ?= dev
images:
ifeq ($(IMAGE_BUILDER),)
	@$(MAKE) --no-print-directory controller-image
else
	$(if $(filter buildah,$(IMAGE_BUILDER)),buildah bud,$(IMAGE_BUILDER) build) -f images/runner/Dockerfile -t $(IMAGE_REPO)/kpssh-runner:$(IMAGE_TAG) .
	$(if $(filter buildah,$(IMAGE_BUILDER)),buildah bud,$(IMAGE_BUILDER) build) -f images/controller/Dockerfile \
	  --build-arg RUNNER=$(IMAGE_REPO)/kpssh-runner:$(IMAGE_TAG) -t $(IMAGE_REPO)/kpssh-controller:$(IMAGE_TAG) .
endif

## node-assets: the node binaries mirror the e2e hosts install from (cached)
node-assets:
	@hack/node-assets.sh >/dev/null

## test-prereqs: every cached build the tests use, built side by side (the
## k8s build is CPU-bound, the debootstraps wait on the network)
test-prereqs: deps
	$(MAKE) --no-print-directory -j6 k8s-bins rootfs controller-image runner-bin node-assets helm $(CONTROLLER_GEN) >/dev/null

## test: everything CI runs (the e2e scenarios and make demo's test, build tag
## e2e, run beside the other packages). go test starts packages in the order
## given: the longest first (TEST_FIRST), so the e2e does not wait behind the
## alphabet.
TEST_FIRST = ./test/e2e ./internal/engine ./test/demo ./test/molecule ./internal/providers/pool ./test/hostenv
test: test-prereqs
	$(RUNNER_PATH) KUBEBUILDER_ASSETS=$$(hack/k8s-bins.sh) CONTROLLER_GEN=$(CONTROLLER_GEN) HELM=$$(hack/helm.sh) \
	  KPSSH_ENGINE_SOAK_RUNS=$${KPSSH_ENGINE_SOAK_RUNS:-100} \
	  go test $(GO_TEST_FLAGS) -tags e2e -timeout 60m $(TEST_FIRST) ./...

## soak: the engine's full 1,000-run soak (zombies, orphans, leftover run dirs)
soak: deps rootfs
	$(RUNNER_PATH) KPSSH_ENGINE_SOAK_RUNS=1000 go test $(GO_TEST_FLAGS) -timeout 90m -run TestSoakPhaseRuns -v ./internal/engine/

## test-unit: the fast tests (no apiserver, no hosts)
test-unit:
	go test $(GO_TEST_FLAGS) -short ./...

## test-crd: the CRD validation suite against the real kube-apiserver
test-crd: k8s-bins
	KUBEBUILDER_ASSETS=$$(hack/k8s-bins.sh) go test $(GO_TEST_FLAGS) -v ./apis/...

## molecule: the shipped roles' molecule scenarios (harness over nspawn hosts) and ansible-lint
molecule: deps rootfs
	$(RUNNER_PATH) go test $(GO_TEST_FLAGS) -timeout 30m -run 'TestMolecule|TestAnsibleLint' -v ./test/molecule/

## test-hosts: the nspawn host world tests
# The harness on an author's role, wherever it is: make molecule-role ROLE=~/roles/web_node
molecule-role: deps rootfs
	@test -n "$(ROLE)" || { echo "usage: make molecule-role ROLE=<role dir>" >&2; exit 2; }
	$(RUNNER_PATH) KPSSH_MOLECULE_ROLE=$(abspath $(ROLE)) go test $(GO_TEST_FLAGS) -timeout 30m -run TestMoleculeRole -v ./test/molecule/

## test-cross: the controller Dockerfile's build stage cross-compiled for
## linux/arm64 (not in make test: cold, it compiles every package again)
test-cross: deps
	go test $(GO_TEST_FLAGS) -tags cross -timeout 90m -run TestImageCrossBuild -v ./images/controller/

test-hosts: deps rootfs
	$(RUNNER_PATH) go test $(GO_TEST_FLAGS) -v ./test/hostenv/

## bench: every benchmark, each printing its figure and its same-run baseline;
## then the e2e join timelines (test/e2e/bench_test.go: one world, its own runs, so 1x)
bench: deps k8s-bins rootfs
	$(RUNNER_PATH) KUBEBUILDER_ASSETS=$$(hack/k8s-bins.sh) go test -run '^$$' -bench . -benchtime 3x -timeout 60m ./...
	$(RUNNER_PATH) go test -tags e2e -run '^$$' -bench JoinTimeline -benchtime 1x -timeout 60m ./test/e2e/

## demo: local control plane + hosts + controller + a workload scaling up and down
demo: deps
	hack/demo.sh

## demo-down: tear the demo down
demo-down:
	hack/demo.sh down

## e2e: the end-to-end scenarios (real control plane, kubelets on nspawn hosts)
e2e: deps k8s-bins rootfs
	$(RUNNER_PATH) go test $(GO_TEST_FLAGS) -tags e2e -timeout 45m -v ./test/e2e/
