# Measurements quoted in the README and issue notes.

RSS_PROFILE ?= dgx-h100
RSS_WAIT    ?= 5

.PHONY: measure-rss measure-devices

measure-rss: build ## agent RSS $(RSS_WAIT)s after start on simulated $(RSS_PROFILE) (no kubelet)
	@dir=$$(mktemp -d); \
	$(BIN) --simulate '$(RSS_PROFILE)' --device-plugin-dir "$$dir" --metrics-address 127.0.0.1:0 \
		--sim-control-address 127.0.0.1:0 --log-level error 2>/dev/null & pid=$$!; \
	sleep $(RSS_WAIT); \
	echo "simulate=$(RSS_PROFILE) after $(RSS_WAIT)s: $$(grep -E '^(VmRSS|VmHWM)' /proc/$$pid/status | tr -s ' \t' ' ' | paste -sd' ')"; \
	kill $$pid; wait $$pid || true; rm -rf "$$dir"

measure-devices: ## table of devices served per simulator profile, MIG layout and strategy
	$(GO) test -count=1 -v -run 'TestResourcesOnSimProfiles$$' ./gpu | sed -n '/devices served per profile/,/^--- /p'

.PHONY: measure-allocate measure-mig-change

measure-allocate: ## gpu Allocate cost per device-list strategy (ns/op)
	$(GO) test -count=1 -run '^$$' -bench 'BenchmarkAllocate$$' -benchtime 2000x ./gpu

measure-mig-change: ## MIG change on the running agent to the ListAndWatch update: p50/p99 over 100 changes
	$(GO) test -count=1 -run '^$$' -bench MIGChangeToListAndWatch -benchtime 100x ./cmd/gpu-node-agent
