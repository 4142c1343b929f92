# Measurements quoted in docs/performance.md.

RSS_PROFILE ?= dgx-h100
RSS_WAIT    ?= 5

.PHONY: measure-rss measure-rss-real measure-rss-floor measure-devices measure-served measure-fault

# The demo command wires everything: health monitor, GPU metrics collector
# and endpoint, RDMA (rdma/ib from the demo config) and mixed MIG. Like
# measure-rss-real below, it runs a copy of the binary.
measure-rss: build-sim ## agent RSS $(RSS_WAIT)s after start on simulated $(RSS_PROFILE), everything wired (no kubelet)
	@dir=$$(mktemp -d); cp $(SIM_BIN) "$$dir/agent"; \
	"$$dir/agent" demo --simulate '$(RSS_PROFILE)' --device-plugin-dir "$$dir" --metrics-address 127.0.0.1:0 \
		--sim-control-address 127.0.0.1:0 --log-level error >/dev/null 2>&1 & pid=$$!; \
	sleep $(RSS_WAIT); \
	echo "simulate=$(RSS_PROFILE) after $(RSS_WAIT)s: $$(grep -E '^(VmRSS|VmHWM)' /proc/$$pid/status | tr -s ' \t' ' ' | paste -sd' ')"; \
	kill $$pid; wait $$pid || true; rm -rf "$$dir"

# The product binary in real mode on this machine (no GPU: NVML does not
# load), idle RSS_WAIT seconds after start; RSS_BIN compares another build.
# It runs a copy: the file the Go linker writes maps with ~20 MB more
# resident file pages (RssFile) than the same bytes written by cp, which is
# how an image or a package installs it. RSS_ARGS are the arguments, where
# $$dir is the copy's fresh directory; another program measured the same
# way takes its own, e.g. NVIDIA's device plugin:
#   make measure-rss-real RSS_BIN=nvidia-device-plugin \
#     RSS_ARGS='--fail-on-init-error=false --kubelet-socket $$dir/kubelet.sock'
RSS_BIN ?= $(BIN)
RSS_ARGS ?= --device-plugin-dir "$$dir" --metrics-address 127.0.0.1:0 --node-name "" --state-dir "$$dir/state" --log-level error
measure-rss-real: build ## product agent RSS $(RSS_WAIT)s after start in real mode (no GPU here), no kubelet
	@dir=$$(mktemp -d); cp $(RSS_BIN) "$$dir/agent"; \
	"$$dir/agent" $(RSS_ARGS) >/dev/null 2>&1 & pid=$$!; \
	sleep $(RSS_WAIT); \
	echo "real mode after $(RSS_WAIT)s: $$(grep -E '^(VmRSS|VmHWM|RssAnon|RssFile)' /proc/$$pid/status | tr -s ' \t' ' ' | paste -sd' ')"; \
	kill $$pid; wait $$pid || true; rm -rf "$$dir"

# The floor under measure-rss-real: a program that only links the
# product's direct dependencies (each package the agent's own packages
# import, blank-imported: their init code and what it reaches, nothing of
# ours) and sleeps. Built and run as measure-rss-real builds and runs the
# product (stripped, a copy), so the two subtract.
RSS_FLOOR_DIR := .build/rssfloor
MODULE         = $(shell $(GO) list -m)
measure-rss-floor: deps ## RSS $(RSS_WAIT)s after start of a program linking only the product's direct dependencies
	@mkdir -p $(RSS_FLOOR_DIR); \
	{ echo 'package main'; echo 'import ('; \
	  $(GO) list -tags '$(PRODUCT_TAGS)' -deps -f '{{with .Module}}{{if eq .Path "$(MODULE)"}}{{join $$.Imports "\n"}}{{end}}{{end}}' ./cmd/gpu-node-agent \
	    | grep -v -E '^($(MODULE)(/|$$)|C$$|unsafe$$)' | sort -u | sed 's/.*/\t_ "&"/'; \
	  echo '	"time"'; echo ')'; echo 'func main() { time.Sleep(time.Hour) }'; } > $(RSS_FLOOR_DIR)/main.go; \
	$(GO) build -trimpath -tags '$(PRODUCT_TAGS)' -gcflags '$(PRODUCT_GCFLAGS)' -ldflags '-s -w' -o $(RSS_FLOOR_DIR)/floor ./$(RSS_FLOOR_DIR); \
	dir=$$(mktemp -d); cp $(RSS_FLOOR_DIR)/floor "$$dir/floor"; "$$dir/floor" & pid=$$!; \
	sleep $(RSS_WAIT); \
	echo "dependencies only after $(RSS_WAIT)s: $$(grep -E '^(VmRSS|VmHWM|RssAnon|RssFile)' /proc/$$pid/status | tr -s ' \t' ' ' | paste -sd' ') binary $$(stat -c %s $(RSS_FLOOR_DIR)/floor)"; \
	kill $$pid; wait $$pid || true; rm -rf "$$dir"

# What brings the binary's pages in: the product (its symbol table kept, for
# perf to name frames; -s moves no section) run as measure-rss-real runs it,
# under `perf record -e page-faults`, each fault on its file-backed sections
# sorted by section and by what ran (runtime start, package init, the agent,
# stack growth, the rest). Each fault maps a whole 64 KiB fault-around window.
RSS_FAULTS_BIN := .build/rssfaults/agent
measure-rss-faults: deps deps-perf ## page faults on the idle product agent's binary by section and by what ran (perf)
	@mkdir -p $(dir $(RSS_FAULTS_BIN)); \
	$(GO) build -trimpath -tags '$(PRODUCT_TAGS)' -gcflags '$(PRODUCT_GCFLAGS)' -ldflags '-w $(LDFLAGS)' -o $(RSS_FAULTS_BIN) ./cmd/gpu-node-agent; \
	dir=$$(mktemp -d); trap 'rm -rf "$$dir"' EXIT; \
	cd test && $(GO) run ./cmd/rssfaults -bin $(abspath $(RSS_FAULTS_BIN)) -duration $(RSS_WAIT)s -- \
		--device-plugin-dir "$$dir" --metrics-address 127.0.0.1:0 --node-name "" --state-dir "$$dir/state" --log-level error

# What PRODUCT_GCFLAGS cost: the Node protobuf benchmark (kubeapi) with
# k8s.io/api inlined as Go does by default and as the product builds it:
# two test binaries, run alternately API_CODEC_COUNT times (20,000
# operations a run); the median of each.
API_CODEC_COUNT ?= 10
API_CODEC_DIR   := .build/apicodec
measure-api-codec: deps ## Node protobuf decode/encode time with Go's default inlining and with the product's PRODUCT_GCFLAGS
	@mkdir -p $(API_CODEC_DIR); \
	$(GO) test -c -trimpath -tags '$(PRODUCT_TAGS)' -o $(API_CODEC_DIR)/default.test ./kubeapi; \
	$(GO) test -c -trimpath -tags '$(PRODUCT_TAGS)' -gcflags '$(PRODUCT_GCFLAGS)' -o $(API_CODEC_DIR)/product.test ./kubeapi; \
	for i in $$(seq $(API_CODEC_COUNT)); do for v in default product; do \
		$(API_CODEC_DIR)/$$v.test -test.run '^$$' -test.bench NodeProtobuf -test.benchtime 20000x | sed -n "s/^Benchmark/$$v Benchmark/p"; \
	done; done | sort -k2,2 -k1,1 -k4,4n | awk '{k = $$2 " " $$1; v[k, ++n[k]] = $$4} \
		END {for (k in n) printf "%-40s median %6.0f ns/op, %6.0f-%6.0f (%d runs)\n", k, v[k, int((n[k] + 1) / 2)], v[k, 1], v[k, n[k]], n[k]}' | sort

.PHONY: deps-perf measure-rss-faults measure-api-codec
deps-perf: ## install perf (Debian's linux-perf) when missing
	@if ! command -v perf >/dev/null; then \
		echo "installing linux-perf"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq linux-perf; \
	fi

measure-devices: ## table of devices served per simulator profile, MIG layout and strategy
	$(GO) test -count=1 -v -run 'TestResourcesOnSimProfiles$$' ./gpu | sed -n '/devices served per profile/,/^--- /p'

SERVED_PROFILES   ?= dgx-1v dgx-2 dgx-a100 dgx-b200 dgx-h100 dgx-h200 gb200-nvl72 pcie-8gpu
SERVED_STRATEGIES ?= none single mixed
SERVED_MIG        ?= dgx-h100,mig=0:3g.40gb+2g.20gb+1g.10gb+1g.10gb,mig=1:1g.10gb+1g.10gb+1g.10gb+1g.10gb+1g.10gb+1g.10gb+1g.10gb

measure-served: build-sim ## what the running agent serves (GPU, MIG, rdma/ib) per profile and MIG strategy, from its inventory
	@for p in $(SERVED_PROFILES) '$(SERVED_MIG)'; do for s in $(SERVED_STRATEGIES); do \
		echo "--- $$p --mig-strategy $$s"; \
		$(SIM_BIN) demo --simulate "$$p" --mig-strategy $$s --exit-after 2s --metrics-address "" \
			--sim-control-address "" --log-level error 2>/dev/null \
			| awk '/^=== /{n++; t=1; next} n==1 && t && /^$$/{t=0} n==1 && t{print "  " $$0} n==1 && /^NOT SERVED/{p=1} n==1 && p{print "  " $$0}'; \
	done; done

measure-fault: ## XID injected into the simulator to Unhealthy on an open ListAndWatch: p50/p99 over 100 faults
	$(GO) test -count=1 -run '^$$' -bench FaultToListAndWatch -benchtime 100x ./agent

.PHONY: measure-allocate measure-mig-change

measure-allocate: ## gpu Allocate cost per device-list strategy (ns/op)
	$(GO) test -count=1 -run '^$$' -bench 'BenchmarkAllocate$$' -benchtime 2000x ./gpu

measure-mig-change: ## MIG change on the running agent to the ListAndWatch update: p50/p99 over 100 changes
	$(GO) test -count=1 -run '^$$' -bench MIGChangeToListAndWatch -benchtime 100x ./agent

.PHONY: measure-hang
measure-hang: ## a hung GPU: time to Unhealthy, and other GPUs' XIDs to ListAndWatch meanwhile (p50/p99 over 24)
	$(GO) test -count=1 -run '^$$' -bench XIDWhileGPUHangs -benchtime 24x ./agent
