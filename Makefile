# fabricxfer — operator and node agent that move GPU memory between inference pods.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

BIN_DIR ?= $(CURDIR)/bin
export KUBEBUILDER_ASSETS ?= $(BIN_DIR)
export PATH := $(BIN_DIR):$(PATH)
GO ?= go
GOTEST_FLAGS ?= -count=1 -timeout 20m
CONTROLLER_GEN := $(BIN_DIR)/controller-gen
STATICCHECK := $(BIN_DIR)/staticcheck
# go-nvml's cgo preamble calls NVML functions NVIDIA marked deprecated; gcc would warn about each one.
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations

.PHONY: help
help: ## List the targets
	@awk 'BEGIN {FS = ":.*##"} /^[a-zA-Z0-9_.-]+:.*##/ {printf "  \033[36m%-14s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: tools
tools: ## Build the pinned kube-apiserver, kubectl, etcd, helm, controller-gen, protoc plugins and staticcheck (~9 min cold, 0 s warm)
	BIN_DIR=$(BIN_DIR) hack/tools.sh

$(CONTROLLER_GEN):
	BIN_DIR=$(BIN_DIR) hack/tools.sh controller-gen

$(STATICCHECK):
	BIN_DIR=$(BIN_DIR) hack/tools.sh staticcheck

.PHONY: manifests
manifests: $(CONTROLLER_GEN) ## Generate CRDs and the operator's RBAC from the API markers
	$(CONTROLLER_GEN) crd paths=./api/... output:crd:artifacts:config=config/crd/bases
	$(CONTROLLER_GEN) rbac:roleName=fabricxfer-operator paths=./controllers/... output:rbac:artifacts:config=config/rbac
	hack/gen-chart.sh

.PHONY: generate
generate: $(CONTROLLER_GEN) ## Generate deepcopy code and the gRPC/protobuf code
	$(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt paths=./api/...
	BIN_DIR=$(BIN_DIR) hack/gen-proto.sh

.PHONY: dist
dist: manifests ## Render dist/install.yaml, the one-file kubectl install
	hack/gen-install.sh > dist/install.yaml

.PHONY: verify
verify: manifests generate dist $(STATICCHECK) ## Fail when generated files are stale, Go files are not gofmt'ed, vet or staticcheck (staticcheck.conf) find something, or a source file lacks the license header
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }
	@git diff --exit-code -- api config dist charts client api/proto || { echo "generated files are stale: run make manifests generate dist and commit"; exit 1; }
	hack/license.sh
	CGO_ENABLED=0 $(GO) vet ./...
	$(STATICCHECK) ./...
	hack/chart-test.sh

.PHONY: chart-test
chart-test: ## Lint the chart, compare helm template with the golden files, check the values schema
	hack/chart-test.sh

.PHONY: chart-install-test
chart-install-test: tools build ## helm install/uninstall and kubectl apply of dist/install.yaml on a throwaway control plane
	OPERATOR_BIN=$(BIN_DIR)/operator hack/chart-install-test.sh

.PHONY: build
build: ## Build operator, agent, xferctl (also as the kubectl plugin kubectl-fabricxfer), xferbench and the demo's kubelet stand-in into bin/
	$(GO) build -o $(BIN_DIR)/ ./cmd/... ./hack/drakubelet ./hack/nodecert
	@# kubectl completes "kubectl fabricxfer ..." by running kubectl_complete-fabricxfer with the words typed.
	printf '#!/bin/sh\nexec kubectl-fabricxfer __complete "$$@"\n' >$(BIN_DIR)/kubectl_complete-fabricxfer
	chmod +x $(BIN_DIR)/kubectl_complete-fabricxfer

.PHONY: deps
deps: ## Install the Debian packages make test needs beside Go, gcc, git, make and python3 (as root; otherwise name them)
	hack/deps.sh

.PHONY: test
test: deps tools verify ## Run every test, including envtest suites on a real kube-apiserver + etcd and the end-to-end test
	$(GO) test $(GOTEST_FLAGS) ./...
	$(MAKE) fuzz-short
	$(MAKE) e2e

.PHONY: unit
unit: ## Run the Go tests only (needs make tools for the envtest suites)
	$(GO) test $(GOTEST_FLAGS) ./...

.PHONY: e2e
e2e: tools build ## End-to-end: demo as a test, failure tests, helm install/uninstall and kubectl apply of dist/install.yaml, a 60 s soak
	hack/e2e.sh
	hack/failure.sh
	OPERATOR_BIN=$(BIN_DIR)/operator hack/chart-install-test.sh
	SOAK_PREBUILT=1 BIN_DIR=$(BIN_DIR) hack/soak.sh $(SOAK_SHORT)

.PHONY: failure
failure: tools build ## Failure tests: operator SIGKILLed mid-reconcile and mid-finalizer, leader failover, API server restart
	hack/failure.sh

VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
IMAGE_REGISTRY ?= ghcr.io/fabricxfer
.PHONY: images
images: ## OCI images of operator and agent for linux/amd64 and linux/arm64 into bin/images, without a container engine
	@command -v aarch64-linux-gnu-gcc >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  { echo "[images] installing gcc-aarch64-linux-gnu for the arm64 agent"; apt-get update -qq; \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gcc-aarch64-linux-gnu libc6-dev-arm64-cross >/dev/null; }; } || true
	$(GO) run ./hack/images -out $(BIN_DIR)/images -version $(VERSION) -registry $(IMAGE_REGISTRY) -epoch $$(git log -1 --format=%ct 2>/dev/null || echo 0)

.PHONY: demo
demo: tools build ## Start a local control plane, operator and three agents, apply a pool and move bytes
	hack/demo.sh up

.PHONY: demo-down
demo-down: ## Stop everything make demo started
	hack/demo.sh down

N ?= 100
RUNS ?= 1
.PHONY: scale
scale: tools ## Simulate N agents against a local control plane and measure the operator (make scale N=1000 RUNS=3)
	go build -o $(BIN_DIR)/ ./cmd/operator
	BIN_DIR=$(BIN_DIR) RUNS=$(RUNS) hack/scale.sh $(N)

DURATION ?= 10m
SOAK_SHORT ?= 60s
.PHONY: soak
soak: tools ## Transfers under agent restarts and pool churn for DURATION (default 10m); fails on lost or hung transfers and on memory, goroutine or fd growth
	BIN_DIR=$(BIN_DIR) hack/soak.sh $(DURATION)

.PHONY: fuzz
fuzz: ## Run each fuzz target for FUZZTIME (default 20s)
	hack/fuzz.sh $${FUZZTIME:-20s}

FUZZ_SHORT ?= 2s
.PHONY: fuzz-short
fuzz-short: ## Run every fuzz target for FUZZ_SHORT (default 2s; part of make test)
	hack/fuzz.sh $(FUZZ_SHORT)
