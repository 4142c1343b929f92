# End-to-end tests (module test/, its own go.mod):
#   test/conformance  the agent binary against the kubelet's own device-manager
#                     code (k8s.io/kubernetes $(KUBE_VERSION))
#   test/e2e          a real single-node cluster on loopback: Debian etcd,
#                     containerd and runc; kube-apiserver, controller-manager,
#                     scheduler and kubelet built from k8s.io/kubernetes.

KUBE_VERSION ?= v1.34.4
KUBE_BIN_DIR ?= $(CURDIR)/.build/kube
KUBE_BINS    := kube-apiserver kube-controller-manager kube-scheduler kubelet
# Version stamps so the node reports kubeletVersion v1.34.4, as a release build does.
KUBE_LDFLAGS := -s -w \
	-X k8s.io/component-base/version.gitVersion=$(KUBE_VERSION) \
	-X k8s.io/component-base/version.gitMajor=1 \
	-X k8s.io/component-base/version.gitMinor=34 \
	-X k8s.io/component-base/version.gitTreeState=clean
E2E_TIMEOUT  ?= 40m
# E2E_FLAGS are extra go test flags, e.g. E2E_FLAGS=-v for the measured numbers.
E2E_FLAGS    ?=
# Debian packages the cluster needs: etcd-server, containerd, runc, the CNI
# plugins (so the node reports NetworkReady), prometheus (scrape test),
# iproute2.
E2E_DEBS     := etcd-server containerd runc containernetworking-plugins prometheus iproute2
E2E_ENV      := GPU_NODE_AGENT_BIN=$(CURDIR)/$(BIN) KUBE_BIN_DIR=$(KUBE_BIN_DIR)

.PHONY: kube-bins e2e-deps e2e-run e2e-conformance e2e-cluster demo-cluster

# The kube binaries are built from test/kubebins (its own go.mod: Kubernetes'
# own dependency versions), once; one at a time to keep memory use low.
$(KUBE_BIN_DIR)/%: test/kubebins/go.mod test/kubebins/go.sum
	@mkdir -p $(KUBE_BIN_DIR)
	@echo "building $* $(KUBE_VERSION) (the first build takes several minutes)"
	cd test/kubebins && CGO_ENABLED=0 $(GO) build -ldflags '$(KUBE_LDFLAGS)' -o $@ k8s.io/kubernetes/cmd/$*

kube-bins: $(addprefix $(KUBE_BIN_DIR)/,$(KUBE_BINS)) ## build kube-apiserver, controller-manager, scheduler and kubelet into .build/kube

e2e-deps: ## install the Debian packages the e2e cluster needs, when missing
	@missing=""; \
	command -v etcd >/dev/null       || missing="$$missing etcd-server"; \
	command -v containerd >/dev/null || missing="$$missing containerd"; \
	command -v runc >/dev/null       || missing="$$missing runc"; \
	{ [ -x /usr/lib/cni/bridge ] || [ -x /opt/cni/bin/bridge ]; } || missing="$$missing containernetworking-plugins"; \
	command -v prometheus >/dev/null || missing="$$missing prometheus"; \
	command -v ip >/dev/null         || missing="$$missing iproute2"; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi

# Conformance runs with -race; the cluster tests need root (kubelet, runc).
e2e-conformance: build ## the agent against the kubelet's device-manager code
	cd test && $(E2E_ENV) $(GO) test -race -count=1 -timeout $(E2E_TIMEOUT) $(E2E_FLAGS) ./conformance/... ./internal/...

e2e-cluster: build kube-bins e2e-deps ## scenarios on a real single-node cluster; the tainter on a real apiserver
	cd test && $(E2E_ENV) $(GO) test -count=1 -timeout $(E2E_TIMEOUT) $(E2E_FLAGS) ./e2e/... ./health/...

e2e-run: e2e-conformance e2e-cluster

demo-cluster: build kube-bins e2e-deps ## a real single-node cluster running the agent and a GPU pod, until Ctrl-C
	cd test && $(E2E_ENV) $(GO) run ./cmd/demo-cluster
