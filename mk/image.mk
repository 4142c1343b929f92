# The container image built from the Dockerfile without Docker and without
# a registry: Debian's buildah (vfs storage, chroot isolation) runs the
# Dockerfile's own steps on local base images made from Debian packages
# with mmdebstrap, the builder base carrying this machine's Go toolchain.
# The e2e cluster imports the result into its containerd and runs it.
#
#   make image-local   build $(LOCAL_IMAGE) and write $(IMAGE_ARCHIVE)
#   make image         the same Dockerfile with docker and the public bases

# IMAGE_CACHE_DIR holds the base root file systems and buildah's store
# (CACHE_DIR: .build/, or where CI keeps what outlives a clone).
IMAGE_CACHE_DIR ?= $(CACHE_DIR)
BUILDAH_DIR     ?= $(IMAGE_CACHE_DIR)/buildah
BUILDAH         := buildah --root $(BUILDAH_DIR)/storage --runroot $(BUILDAH_DIR)/run --storage-driver vfs
IMAGE_SUITE     ?= bookworm
BUILDER_DEBS    := gcc,libc6-dev,ca-certificates
GO_ROOT         := $(shell $(GO) env GOROOT)
GO_VERSION      := $(shell $(GO) env GOVERSION)
# The bases are cached under $(IMAGE_CACHE_DIR)/image-bases/<stamp>: the stamp hashes
# their recipe and the Go version, so a change of either makes new ones
# and nothing else rebuilds them (bump BASE_RECIPE to refresh the Debian
# packages).
BASE_RECIPE     = v1 suite=$(IMAGE_SUITE) runtime=minbase builder=minbase+$(BUILDER_DEBS)+$(GO_VERSION)
BASE_STAMP      := $(shell echo '$(BASE_RECIPE)' | sha256sum | cut -c1-12)
BASE_DIR        = $(IMAGE_CACHE_DIR)/image-bases/$(BASE_STAMP)
BUILDER_BASE    = localhost/gpu-node-agent-base/builder:$(BASE_STAMP)
RUNTIME_BASE    = localhost/gpu-node-agent-base/runtime:$(BASE_STAMP)
# What the e2e cluster runs: the simulator build (build tag `simulator`)
# under the name its DaemonSet uses (test/e2e/cluster.AgentImage).
LOCAL_IMAGE     ?= localhost/gpu-node-agent:e2e
IMAGE_GO_TAGS   ?= simulator
IMAGE_ARCHIVE   ?= $(CURDIR)/.build/image/gpu-node-agent-e2e.tar
BASE_PATH_ENV   := PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

.PHONY: image-deps image-bases image-local

image-deps: ## install mmdebstrap and buildah (Debian) when missing
	@missing=""; \
	command -v mmdebstrap >/dev/null || missing="$$missing mmdebstrap"; \
	command -v buildah >/dev/null    || missing="$$missing buildah"; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi

# Root file systems from Debian's mirror (written to a temporary name
# first, so an interrupted run is never taken for a finished one).
$(IMAGE_CACHE_DIR)/image-bases/%/runtime.tar: | image-deps
	@mkdir -p $(@D)
	@echo "making the runtime base ($(IMAGE_SUITE) minbase) with mmdebstrap"
	time mmdebstrap --quiet --format=tar --variant=minbase $(IMAGE_SUITE) $@.tmp
	mv $@.tmp $@

$(IMAGE_CACHE_DIR)/image-bases/%/builder.tar: | image-deps
	@mkdir -p $(@D)
	@echo "making the builder base ($(IMAGE_SUITE) minbase + $(BUILDER_DEBS)) with mmdebstrap"
	time mmdebstrap --quiet --format=tar --variant=minbase --include=$(BUILDER_DEBS) $(IMAGE_SUITE) $@.tmp
	mv $@.tmp $@

# image-bases commits both root file systems as images in buildah's store
# (once per stamp; the store lives in $(BUILDAH_DIR)); the builder gets
# this machine's Go toolchain at /usr/local/go and the golang image's
# GOPATH (/go).
image-bases: $(BASE_DIR)/runtime.tar $(BASE_DIR)/builder.tar | image-deps
	@if ! $(BUILDAH) inspect --type image $(RUNTIME_BASE) >/dev/null 2>&1; then \
		echo "importing $(RUNTIME_BASE)"; \
		c=$$($(BUILDAH) from scratch); \
		$(BUILDAH) add $$c $(BASE_DIR)/runtime.tar /; \
		$(BUILDAH) config --env $(BASE_PATH_ENV) $$c; \
		$(BUILDAH) commit --quiet --rm $$c $(RUNTIME_BASE) >/dev/null; \
	fi
	@if ! $(BUILDAH) inspect --type image $(BUILDER_BASE) >/dev/null 2>&1; then \
		echo "importing $(BUILDER_BASE) with $(GO_VERSION) from $(GO_ROOT)"; \
		c=$$($(BUILDAH) from scratch); \
		$(BUILDAH) add $$c $(BASE_DIR)/builder.tar /; \
		$(BUILDAH) copy --quiet $$c $(GO_ROOT) /usr/local/go; \
		$(BUILDAH) config --env GOPATH=/go --env GOCACHE=/root/.cache/go-build --env GOTOOLCHAIN=local \
			--env PATH=/go/bin:/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
			--workingdir /go $$c; \
		$(BUILDAH) commit --quiet --rm $$c $(BUILDER_BASE) >/dev/null; \
	fi

# The build mounts this machine's module and build caches, so a warm
# build compiles only what changed (and downloads nothing); the images of
# earlier builds are pruned, since vfs stores every layer in full. The
# Dockerfile's `go mod download` reads every go.mod in the module graph,
# more than the host's builds fetch (e.g. go-openapi/jsonpointer
# v0.19.6's): it runs here first, so the build inside needs no network
# (the chroot does not trust this machine's certificate authorities; a
# cold CI run failed there with "x509: certificate signed by unknown
# authority").
image-local: image-bases ## build the image from the Dockerfile with buildah on local Debian bases; write .build/image/gpu-node-agent-e2e.tar
	@mkdir -p $(dir $(IMAGE_ARCHIVE)) "$$($(GO) env GOMODCACHE)" "$$($(GO) env GOCACHE)"
	$(GO) mod download
	time $(BUILDAH) bud --quiet --isolation chroot --pull=never \
		--build-arg BUILDER_IMAGE=$(BUILDER_BASE) --build-arg RUNTIME_IMAGE=$(RUNTIME_BASE) \
		--build-arg VERSION=$(VERSION) --build-arg GO_TAGS="$(IMAGE_GO_TAGS)" \
		--volume "$$($(GO) env GOMODCACHE)":/go/pkg/mod \
		--volume "$$($(GO) env GOCACHE)":/root/.cache/go-build \
		--tag $(LOCAL_IMAGE) --file Dockerfile .
	rm -f $(IMAGE_ARCHIVE)
	$(BUILDAH) push --quiet $(LOCAL_IMAGE) docker-archive:$(IMAGE_ARCHIVE):$(LOCAL_IMAGE)
	@$(BUILDAH) rmi --prune >/dev/null 2>&1 || true
	@echo "image $(LOCAL_IMAGE) written to $(IMAGE_ARCHIVE)"
