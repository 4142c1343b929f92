# Preferred-allocation benchmarks: the agent's solver (topology/) next to
# NVIDIA go-gpuallocator v0.6.0's BestEffort policy (test/gpuallocator, its
# own module), on the same topologies and queries. Output is benchstat
# input; `benchstat -col /impl` puts the two allocators side by side with
# their ratio, and the score column shows both chose sets of equal score.

BENCH_COUNT       ?= 5
# go-gpuallocator needs ~4 s (size 2, 4) to ~50 s (size 3) per call at 16
# GPUs: those run once per count (-benchtime=1x), BENCH_SLOW_COUNT times.
BENCH_SLOW_COUNT  ?= 3
BENCH_OUT         ?= $(BIN_DIR)/bench-allocator.txt
BENCHSTAT_VERSION ?= v0.0.0-20260908200009-22c9c6c9d4da
BENCHSTAT         := $(GO) run golang.org/x/perf/cmd/benchstat@$(BENCHSTAT_VERSION)

.PHONY: bench-allocator bench-solver test-allocator

bench-allocator: ## side-by-side benchmark vs go-gpuallocator BestEffort (8 and 16 GPUs; ~10 min), benchstat table
	@mkdir -p $(BIN_DIR)
	cd test/gpuallocator && { \
		$(GO) test -run '^$$' -bench 'Allocators/topo=dgx1-volta/' -count $(BENCH_COUNT) . ; \
		$(GO) test -run '^$$' -bench 'Allocators/topo=dgx1v-x2/.*/.*/impl=ours' -count $(BENCH_COUNT) . ; \
		$(GO) test -run '^$$' -bench 'Allocators/topo=dgx1v-x2/.*/.*/impl=besteffort' -benchtime 1x -count $(BENCH_SLOW_COUNT) -timeout 60m . ; \
	} | tee $(CURDIR)/$(BENCH_OUT)
	$(BENCHSTAT) -col /impl $(BENCH_OUT)

bench-solver: ## the solver alone on every fixture (ns/op, CPU time, p99), benchstat-friendly
	$(GO) test -run '^$$' -bench Preferred -count $(BENCH_COUNT) ./topology

test-allocator: ## both allocators answer every benchmark query with sets of equal score (~1 min)
	cd test/gpuallocator && $(GO) test -count=1 -v -run 'TestSameScores|TestPairScoresAgree' -timeout 30m .
