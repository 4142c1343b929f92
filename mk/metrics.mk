# Metrics: the Prometheus endpoint's tests (they run Debian's prometheus and
# promtool), its scrape benchmarks and an RSS/CPU soak of the built agent.

.PHONY: deps-prometheus test-metrics bench-metrics soak-metrics soak-dra

deps-prometheus: ## install Debian's prometheus (prometheus + promtool) when missing
	@if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then \
		echo "installing prometheus"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus; \
	fi

test-metrics: deps deps-prometheus ## go test -race metrics (real prometheus scrape included) and the simulator's counters
	$(GO) test -race -count=1 ./metrics/...
	$(GO) test -race -count=1 -run Counters ./sim

bench-metrics: deps ## scrape and collection benchmarks on a simulated dgx-h100 with 14 MIG devices (ns/op, B/op, allocs/op, p50/p99)
	$(GO) test -run '^$$' -bench . -benchtime 3s -count 1 ./metrics

# soak-metrics runs bin/gpu-node-agent-sim on a simulated dgx-h100 with 14 MIG
# devices, collecting every second and scraped every SOAK_SCRAPE seconds,
# for SOAK_SECONDS, sampling VmRSS and CPU time from /proc every second.
# It runs a copy of the binary, as measure-rss does (mk/measure.mk): the
# file the Go linker has just written maps with ~20 MB more resident pages.
SOAK_SECONDS ?= 600
SOAK_SCRAPE  ?= 15
SOAK_PORT    ?= 19400
SOAK_MIG     := 1g.10gb+1g.10gb+1g.10gb+1g.10gb+1g.10gb+1g.10gb+1g.10gb
SOAK_ARGS    ?= --metrics-interval 1s

soak-metrics: build-sim ## run the agent SOAK_SECONDS (default 600) and print max RSS and average CPU%
	@dir=$$(mktemp -d); cp $(SIM_BIN) "$$dir/agent"; \
	"$$dir/agent" demo --simulate "dgx-h100,mig=0:$(SOAK_MIG),mig=1:$(SOAK_MIG)" \
		--device-plugin-dir "$$dir" --metrics-address 127.0.0.1:$(SOAK_PORT) \
		--sim-control-address "" --log-level warn $(SOAK_ARGS) >"$$dir/agent.log" 2>&1 & \
	pid=$$!; trap 'kill $$pid 2>/dev/null; wait $$pid 2>/dev/null; rm -rf "$$dir"' EXIT; \
	hz=$$(getconf CLK_TCK); \
	for _ in $$(seq 50); do curl -sf -o /dev/null 127.0.0.1:$(SOAK_PORT)/metrics && break; sleep 0.2; done; \
	kill -0 $$pid 2>/dev/null || { echo "agent exited:"; cat "$$dir/agent.log"; exit 1; }; \
	ticks() { awk '{print $$14 + $$15}' /proc/$$pid/stat; }; \
	t0=$$(ticks); s0=$$(date +%s.%N); max=0; scrapes=0; \
	for i in $$(seq $(SOAK_SECONDS)); do \
		sleep 1; \
		kill -0 $$pid 2>/dev/null || { echo "agent exited after $$i s:"; cat "$$dir/agent.log"; exit 1; }; \
		rss=$$(awk '/^VmRSS:/ {print $$2}' /proc/$$pid/status); \
		[ "$$rss" -gt "$$max" ] && max=$$rss; \
		if [ $$((i % $(SOAK_SCRAPE))) -eq 0 ]; then \
			curl -sf -o /dev/null 127.0.0.1:$(SOAK_PORT)/metrics && scrapes=$$((scrapes+1)); \
		fi; \
	done; \
	t1=$$(ticks); s1=$$(date +%s.%N); \
	series=$$(curl -sf 127.0.0.1:$(SOAK_PORT)/metrics | grep -c '^DCGM_FI_' || true); \
	awk -v t=$$((t1 - t0)) -v hz=$$hz -v s0=$$s0 -v s1=$$s1 -v max=$$max -v rss=$$rss \
		-v n=$(SOAK_SECONDS) -v sc=$$scrapes -v series=$$series 'BEGIN { \
		printf "soak-metrics: %d s, collection every 1 s, %d scrapes, %d DCGM_ series per scrape\n", n, sc, series; \
		printf "  max RSS   %.1f MiB (last %.1f MiB)\n", max/1024, rss/1024; \
		printf "  avg CPU   %.2f%% of one core\n", 100 * (t/hz) / (s1 - s0) }'

# soak-dra is the same load with the DRA driver serving every device kind:
# etcd and kube-apiserver on loopback (no kubelet), the node's
# ResourceSlices published, the kubelet plugin's sockets up
# (test/cmd/drasoak).
soak-dra: build-sim kube-bins e2e-deps ## run the agent with DRA serving against a real apiserver for SOAK_SECONDS; print max RSS and average CPU%
	cd test && $(E2E_ENV) $(GO) run ./cmd/drasoak -bin $(CURDIR)/$(SIM_BIN) -duration $(SOAK_SECONDS)s -scrape $(SOAK_SCRAPE)s
