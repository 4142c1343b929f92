# NVML calls per minute a running agent makes at steady state, counted by
# the simulator (GET /calls on its control endpoint). test/cmd/nvmlcalls
# starts the agent, reads the counts at NVML_CALLS_WARMUP seconds (start-up
# and the first discovery left out) and at NVML_CALLS_SECONDS, prints the
# difference per minute, in total and for the NVML_CALLS_TOP most called
# methods, and stops the agent. Intervals are the agent's defaults (health
# poll and metrics sample 10s) with rescans every 30s.

NVML_CALLS_SECONDS  ?= 300
NVML_CALLS_WARMUP   ?= 60
NVML_CALLS_TOP      ?= 10
NVML_CALLS_SIMULATE ?= dgx-h100,mig=0:3g.40gb+2g.20gb+1g.10gb+1g.10gb,mig=1:1g.10gb+1g.10gb+1g.10gb+1g.10gb+1g.10gb+1g.10gb+1g.10gb
NVML_CALLS_FLAGS    ?= --mig-strategy mixed --taint-mode off --node-labels=false --rescan-interval 30s

.PHONY: measure-nvml-calls

measure-nvml-calls: build-sim ## NVML calls/min of the running agent at steady state on simulated DGX H100 with MIG (NVML_CALLS_SECONDS, default 300)
	cd test && $(GO) run ./cmd/nvmlcalls -agent $(abspath $(SIM_BIN)) \
		-warmup $(NVML_CALLS_WARMUP)s -duration $(NVML_CALLS_SECONDS)s -top $(NVML_CALLS_TOP) -- \
		--simulate '$(NVML_CALLS_SIMULATE)' $(NVML_CALLS_FLAGS)
