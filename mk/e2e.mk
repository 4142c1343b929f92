# End-to-end tests (module test/, its own go.mod):
#   test/conformance  the agent binary against the kubelet's own device-manager
#                     and topology-manager code: k8s.io/kubernetes of the
#                     test module (v1.37.2) and, with the same test files,
#                     of test/conformance/kubelet134 (v1.34.4)
#   test/e2e          a real single-node cluster on loopback: Debian etcd and
#                     runc; containerd $(CONTAINERD_VERSION) built from the Go
#                     module proxy; kube-apiserver, controller-manager,
#                     scheduler and kubelet built from k8s.io/kubernetes; the
#                     agent image built from the Dockerfile (mk/image.mk).

# KUBE_VERSION must match k8s.io/kubernetes in test/kubebins/go.mod.
KUBE_VERSION ?= v1.37.2
# Keyed by version, so a version change never reuses old binaries; the
# rule below does not compare file dates with test/kubebins/go.mod, so
# binaries in a CACHE_DIR outside the clone are reused by a fresh clone
# (whose files are all newer than any binary).
KUBE_BIN_DIR ?= $(CACHE_DIR)/kube/$(KUBE_VERSION)
KUBE_BINS    := kube-apiserver kube-controller-manager kube-scheduler kubelet
KUBE_MINOR   := $(word 2,$(subst ., ,$(KUBE_VERSION)))
# Version stamps so the node reports kubeletVersion $(KUBE_VERSION), as a release build does.
KUBE_LDFLAGS := -s -w \
	-X k8s.io/component-base/version.gitVersion=$(KUBE_VERSION) \
	-X k8s.io/component-base/version.gitMajor=1 \
	-X k8s.io/component-base/version.gitMinor=$(KUBE_MINOR) \
	-X k8s.io/component-base/version.gitTreeState=clean
# containerd 2.x from the Go module proxy (Debian's is 1.6, which has no
# CDI and which Kubernetes 1.37 no longer supports); keyed by version too.
CONTAINERD_VERSION ?= v2.2.3
CONTAINERD_BIN_DIR ?= $(CACHE_DIR)/containerd/$(CONTAINERD_VERSION)
CONTAINERD_BINS    := containerd ctr containerd-shim-runc-v2
# The graph drivers that need cgo libraries or kernel modules this
# harness never uses (overlayfs is the snapshotter).
CONTAINERD_TAGS    := no_btrfs no_devmapper no_zfs
E2E_TIMEOUT  ?= 40m
# The real-apiserver tests of test/apiserver run side by side (each starts its
# own etcd and kube-apiserver and mostly waits on them).
E2E_PARALLEL ?= 4
# E2E_FLAGS are extra go test flags, e.g. E2E_FLAGS=-v for the measured numbers.
E2E_FLAGS    ?=
# Debian packages the cluster needs: etcd-server, runc, the CNI plugins (so
# the node reports NetworkReady), prometheus (scrape test), iproute2.
E2E_DEBS     := etcd-server runc containernetworking-plugins prometheus iproute2
# Recursive (=): IMAGE_ARCHIVE comes from mk/image.mk, read after this file.
E2E_ENV      = GPU_NODE_AGENT_BIN=$(CURDIR)/$(SIM_BIN) KUBE_BIN_DIR=$(KUBE_BIN_DIR) \
	CONTAINERD_BIN_DIR=$(CONTAINERD_BIN_DIR) GNA_AGENT_IMAGE_ARCHIVE=$(IMAGE_ARCHIVE)

.PHONY: kube-bins containerd-bins e2e-deps e2e-run e2e-conformance e2e-cluster demo-cluster

# The kube binaries are built from test/kubebins (its own go.mod: Kubernetes'
# own dependency versions), once; one at a time to keep memory use low.
$(KUBE_BIN_DIR)/%: | test/kubebins/go.mod test/kubebins/go.sum
	@mkdir -p $(KUBE_BIN_DIR)
	@echo "building $* $(KUBE_VERSION) (the first build takes several minutes)"
	cd test/kubebins && CGO_ENABLED=0 $(GO) build -ldflags '$(KUBE_LDFLAGS)' -o $@ k8s.io/kubernetes/cmd/$*

kube-bins: $(addprefix $(KUBE_BIN_DIR)/,$(KUBE_BINS)) ## build kube-apiserver, controller-manager, scheduler and kubelet into $(CACHE_DIR)/kube/<version>

# containerd, ctr and the runc shim at CONTAINERD_VERSION, with go install
# from the Go module proxy (containerd's own go.mod decides its
# dependencies), one at a time.
$(CONTAINERD_BIN_DIR)/%:
	@mkdir -p $(CONTAINERD_BIN_DIR)
	@echo "building $* $(CONTAINERD_VERSION)"
	GOBIN=$(CONTAINERD_BIN_DIR) $(GO) install -tags "$(CONTAINERD_TAGS)" \
		-ldflags '-s -w -X github.com/containerd/containerd/v2/version.Version=$(CONTAINERD_VERSION)' \
		github.com/containerd/containerd/v2/cmd/$*@$(CONTAINERD_VERSION)

containerd-bins: $(addprefix $(CONTAINERD_BIN_DIR)/,$(CONTAINERD_BINS)) ## build containerd, ctr and containerd-shim-runc-v2 into $(CACHE_DIR)/containerd/<version>

e2e-deps: ## install the Debian packages the e2e cluster needs, when missing
	@missing=""; \
	command -v etcd >/dev/null       || missing="$$missing etcd-server"; \
	command -v runc >/dev/null       || missing="$$missing runc"; \
	{ [ -x /usr/lib/cni/bridge ] || [ -x /opt/cni/bin/bridge ]; } || missing="$$missing containernetworking-plugins"; \
	command -v prometheus >/dev/null || missing="$$missing prometheus"; \
	command -v ip >/dev/null         || missing="$$missing iproute2"; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi

# Conformance runs with -race, with the unit tests of test/'s own tools
# (cmd/); the cluster tests need root (kubelet, runc).
# The same conformance tests run against two kubelets: test/ (its go.mod's
# k8s.io/kubernetes, the current one) and CONFORMANCE_OLD_KUBELET_DIR, a
# module of its own pinned to the older one whose test files are symlinks.
CONFORMANCE_OLD_KUBELET_DIR := test/conformance/kubelet134
e2e-conformance: build-sim ## the agent against the kubelet's device-manager code (1.37 and 1.34)
	cd test && $(E2E_ENV) $(GO) test -race -count=1 -timeout $(E2E_TIMEOUT) $(E2E_FLAGS) ./conformance/... ./internal/... ./cmd/...
	cd $(CONFORMANCE_OLD_KUBELET_DIR) && $(E2E_ENV) $(GO) test -race -count=1 -timeout $(E2E_TIMEOUT) $(E2E_FLAGS) ./...

e2e-cluster: build-sim kube-bins containerd-bins e2e-deps image-local ## scenarios on a real single-node cluster; the tainter on a real apiserver
	cd test && $(E2E_ENV) $(GO) test -count=1 -parallel $(E2E_PARALLEL) -timeout $(E2E_TIMEOUT) $(E2E_FLAGS) ./e2e/... ./apiserver/...

e2e-run: e2e-conformance e2e-cluster

demo-cluster: build-sim kube-bins containerd-bins e2e-deps image-local ## a real single-node cluster running the agent and a GPU pod, until Ctrl-C
	cd test && $(E2E_ENV) $(GO) run ./cmd/demo-cluster
