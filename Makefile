# gpu-node-agent — build, test and demo. `make help` lists the targets.
# Topic-specific targets (e2e, chart, ...) live in mk/<topic>.mk.

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := build

GO      ?= go
BIN_DIR ?= bin
BIN     := $(BIN_DIR)/gpu-node-agent
# SIM_BIN is the agent built with the simulator (-tags simulator): --simulate,
# the demo and the simulator's control endpoint. The product binary (BIN)
# has none of it.
SIM_BIN := $(BIN_DIR)/gpu-node-agent-sim
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)
# PRODUCT_TAGS are build tags of every agent binary: grpcnotrace is gRPC's
# own tag to leave out its golang.org/x/net/trace request tracing, which
# the agent never serves (the Dockerfile sets the same).
PRODUCT_TAGS := grpcnotrace
# PRODUCT_GCFLAGS are compiler flags of every agent binary: k8s.io/api's
# generated code (protobuf and deep-copy methods of every type of core/v1,
# resource/v1 and coordination/v1, kept whole because each package's
# SchemeBuilder names them all: 2 MB of text) is compiled without inlining.
# The agent runs it only when it reads or writes an API object: decoding a
# 50-image Node costs no time this machine can resolve, encoding one about
# 2 microseconds more (`make measure-api-codec`), and the binary is 0.5 MB
# and the idle agent's RSS 0.35 MB smaller (docs/performance.md). The
# Dockerfile sets the same (check-dockerfile).
PRODUCT_GCFLAGS := k8s.io/api/...=-l
IMAGE   ?= gpu-node-agent:$(VERSION)
# CACHE_DIR holds what is slow to make and keyed by version: the kube and
# containerd binaries, the image bases (mk/e2e.mk, mk/image.mk). .ci/run
# points it outside the clone, so a fresh clone reuses them.
CACHE_DIR ?= $(CURDIR)/.build
STATICCHECK_VERSION ?= v0.8.2

# go-nvml is cgo; its headers use deprecated declarations that would warn
# on every build.
export CGO_ENABLED := 1
export CGO_CFLAGS  ?= -Wno-deprecated-declarations

.PHONY: help deps build build-sim test test-no-sim check-dockerfile check-no-sim check-layers vet fmt-check lint demo e2e image clean

help: ## list targets
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | sort | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

deps: ## install the C toolchain cgo needs when it is missing (Debian)
	@if ! command -v gcc >/dev/null; then \
		echo "installing gcc and libc headers for cgo"; \
		apt-get update -qq && apt-get install -y -qq gcc libc6-dev; \
	fi

# The product is stripped of DWARF and the symbol table (-s -w), as the
# Dockerfile builds it: Go's own pclntab stays, so panics and pprof are
# still symbolised.
build: deps ## build bin/gpu-node-agent (the product: no simulator, stripped)
	$(GO) build -trimpath -tags '$(PRODUCT_TAGS)' -gcflags '$(PRODUCT_GCFLAGS)' -ldflags '-s -w $(LDFLAGS)' -o $(BIN) ./cmd/gpu-node-agent

build-sim: deps ## build bin/gpu-node-agent-sim (with the simulator: --simulate, demo; for the demo, tests and e2e)
	$(GO) build -trimpath -tags 'simulator $(PRODUCT_TAGS)' -gcflags '$(PRODUCT_GCFLAGS)' -ldflags '$(LDFLAGS)' -o $(SIM_BIN) ./cmd/gpu-node-agent

vet: deps ## go vet the root module, with and without the simulator tag
	$(GO) vet -trimpath -tags '$(PRODUCT_TAGS)' ./...
	$(GO) vet -trimpath -tags 'simulator $(PRODUCT_TAGS)' ./...

fmt-check: ## fail when any Go file (all modules) needs gofmt
	@out=$$(gofmt -l $$(git ls-files --cached --others --exclude-standard '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

# -trimpath (here and in vet) keeps the source directory out of what go
# test compiles, so a fresh clone (as CI makes) reuses the build cache
# instead of compiling every package of the module again with -race (no
# test reads its own source path).
test: vet fmt-check check-dockerfile check-no-sim check-layers deps-prometheus test-alerts ## go vet, gofmt check, the Dockerfile-flags, no-simulator and import-layer checks, the alerting rules' promtool tests, and go test -race for the root module with the simulator tag, then cmd/ without it (the metrics test scrapes with a real prometheus)
	$(GO) test -race -trimpath -tags 'simulator $(PRODUCT_TAGS)' ./...
	$(MAKE) --no-print-directory test-no-sim

test-no-sim: deps ## go test -race cmd/gpu-node-agent as the product is built (no simulator tag)
	$(GO) test -race -trimpath -tags '$(PRODUCT_TAGS)' ./cmd/gpu-node-agent

# The Dockerfile builds the product with the Makefile's flags: each of
# PRODUCT_TAGS and PRODUCT_GCFLAGS on its go build line.
check-dockerfile: ## fail if the Dockerfile's go build lacks a PRODUCT_TAGS tag or PRODUCT_GCFLAGS
	@line=$$(grep -E '^RUN go build ' Dockerfile); \
	for t in $(PRODUCT_TAGS); do \
		echo "$$line" | grep -qE -- "-tags \"([^\"]* )?$$t[ \"]" || { echo "check-dockerfile: Dockerfile's go build lacks build tag $$t: $$line"; exit 1; }; \
	done; \
	echo "$$line" | grep -qF -- '-gcflags "$(PRODUCT_GCFLAGS)"' || { echo "check-dockerfile: Dockerfile's go build lacks -gcflags \"$(PRODUCT_GCFLAGS)\": $$line"; exit 1; }; \
	echo "check-dockerfile: the Dockerfile builds with PRODUCT_TAGS ($(PRODUCT_TAGS)) and PRODUCT_GCFLAGS ($(PRODUCT_GCFLAGS))"

# The product binary must not link the simulator or go-nvml's mocks.
NO_SIM_PKGS := github.com/gpu-node-agent/gpu-node-agent/sim github.com/gpu-node-agent/gpu-node-agent/agent/simhw github.com/NVIDIA/go-nvml/pkg/nvml/mock
check-no-sim: ## fail if bin/gpu-node-agent (no tag) depends on the simulator or go-nvml's mocks
	@deps=$$($(GO) list -tags '$(PRODUCT_TAGS)' -deps ./cmd/gpu-node-agent); \
	bad=$$(for p in $(NO_SIM_PKGS); do echo "$$deps" | grep -E "^$$p(/|$$)" || true; done); \
	if [ -n "$$bad" ]; then echo "gpu-node-agent (no simulator tag) depends on:"; echo "$$bad"; exit 1; fi; \
	echo "check-no-sim: gpu-node-agent links no simulator package"

# The import directions docs/architecture.md gives (its ```layers block),
# over the product build's imports; the checker has its own tests.
check-layers: ## fail, naming the import, if a package imports against docs/architecture.md's layers
	cd test && $(GO) test -count=1 ./cmd/checklayers && $(GO) run ./cmd/checklayers -root .. -doc ../docs/architecture.md

lint: vet fmt-check ## vet, gofmt and staticcheck (built through the Go module proxy)
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) -tags 'simulator $(PRODUCT_TAGS)' ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) -tags '$(PRODUCT_TAGS)' ./cmd/...

# DEMO_ARGS are agent flags, e.g. DEMO_ARGS=--exit-after=10s for a bounded run.
demo: build-sim ## run the agent on a simulated DGX H100 with MIG and print what it serves (Ctrl-C stops)
	$(SIM_BIN) demo $(DEMO_ARGS)

# The e2e body (conformance against the kubelet's own code, single-node
# cluster) is defined by mk/e2e.mk as e2e-run.
e2e: e2e-run ## end-to-end tests against real kubelet code (see mk/e2e.mk)

image: ## build the container image (needs docker)
	docker build --build-arg VERSION=$(VERSION) -t $(IMAGE) .

clean: ## remove build output
	rm -rf $(BIN_DIR)

include $(wildcard mk/*.mk)
