# Hardware check kit (test/hardware/README.md): prebuilt binaries and one
# script that captures, read-only, what a lent GPU machine and the agent on
# it say, within 5 minutes.
#
# The kit directory is what travels to the GPU machine (its `carry` path):
# the device machine takes 64 MiB of carried files, so the product binary
# travels gzipped and the simulator binary (only for runs here) stays in
# HWKIT_BIN_DIR. Both are built by `make build` / `make build-sim` into
# HWKIT_BIN_DIR rather than bin/, which a running e2e may be using.

HWKIT_DIR       ?= .build/hwkit
HWKIT_BIN_DIR   ?= .build/hwkit-bin
HW_CAPTURE_DIR  ?= .build/hwcapture
# CAPTURE_OUT is where `make hw-check` writes its capture (emptied first).
CAPTURE_OUT     ?= $(HW_CAPTURE_DIR)/real
HW_SIM_CAPTURE  ?= $(HW_CAPTURE_DIR)/sim
HW_SIM_PROFILE  ?= dgx-h100
HW_SIM_SECONDS  ?= 20
# HWKIT_MAX_BYTES is what the device machine carries (64 MiB).
HWKIT_MAX_BYTES := 67108864
# CAPTURE is the capture `make hw-compare` reads; EXPLAINED, if set, a file
# of known disagreements (hwcompare --explained).
CAPTURE         ?=
EXPLAINED       ?=
HWCOMPARE_FLAGS  = $(if $(EXPLAINED),--explained $(abspath $(EXPLAINED)))

.PHONY: hw-kit hw-tools hw-check hw-check-sim hw-compare

hw-kit: ## build the hardware check kit into .build/hwkit and print how to run it on a GPU machine
	$(MAKE) --no-print-directory build build-sim BIN_DIR=$(HWKIT_BIN_DIR)
	rm -rf $(HWKIT_DIR)
	mkdir -p $(HWKIT_DIR)
	gzip -6 -n -c $(HWKIT_BIN_DIR)/gpu-node-agent > $(HWKIT_DIR)/gpu-node-agent.gz
	cd test && CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o $(abspath $(HWKIT_DIR))/hwkubelet ./hardware/cmd/hwkubelet
	install -m 0755 test/hardware/hw-check.sh $(HWKIT_DIR)/hw-check.sh
	@{ \
		echo "kit-built: $$(date -u +%Y-%m-%dT%H:%M:%SZ)"; \
		echo "git-describe: $(VERSION)"; \
		echo "go: $$($(GO) env GOVERSION)"; \
		echo "built-on-glibc: $$(ldd --version 2>/dev/null | head -n1)"; \
		echo "agent-needs-glibc: $$(grep -aoE 'GLIBC_[0-9]+\.[0-9]+' $(HWKIT_BIN_DIR)/gpu-node-agent | sort -uV | tail -n1) (the highest GLIBC_ symbol version gpu-node-agent links)"; \
		echo; \
		echo "--- go version -m gpu-node-agent"; \
		$(GO) version -m $(HWKIT_BIN_DIR)/gpu-node-agent; \
		echo "--- go version -m hwkubelet"; \
		$(GO) version -m $(HWKIT_DIR)/hwkubelet; \
	} > $(HWKIT_DIR)/versions.txt
	@size=$$(du -sb $(HWKIT_DIR) | cut -f1); \
	if [ "$$size" -gt $(HWKIT_MAX_BYTES) ]; then echo "hw-kit: $(HWKIT_DIR) is $$size bytes, over the device machine's 64 MiB carry limit"; exit 1; fi; \
	echo; \
	echo "hw-kit: $(HWKIT_DIR) ($$size bytes; agent $(VERSION), $$(grep '^agent-needs-glibc' $(HWKIT_DIR)/versions.txt | cut -d' ' -f2))"; \
	echo "  carry: $(HWKIT_DIR)"; \
	echo "  run:   bash $(HWKIT_DIR)/hw-check.sh --kit $(HWKIT_DIR) --out \"\$$OUT/capture\""

hw-check: hw-kit ## run the kit here in real mode (no GPU: it records what is unavailable); CAPTURE_OUT=DIR
	rm -rf $(CAPTURE_OUT)
	bash $(HWKIT_DIR)/hw-check.sh --kit $(HWKIT_DIR) --out $(CAPTURE_OUT)
	@echo "hw-check: $(CAPTURE_OUT): $$(tail -n2 $(CAPTURE_OUT)/kit.txt | tr '\n' ' ')"

# The tools that stay here: simsmi (nvidia-smi on a simulated node) and
# hwcompare, into HWKIT_BIN_DIR, not the carried kit.
hw-tools: ## build simsmi and hwcompare into .build/hwkit-bin (they do not travel with the kit)
	mkdir -p $(HWKIT_BIN_DIR)
	cd test && $(GO) build -trimpath -o $(abspath $(HWKIT_BIN_DIR))/simsmi ./hardware/cmd/simsmi
	cd test && $(GO) build -trimpath -o $(abspath $(HWKIT_BIN_DIR))/hwcompare ./hardware/cmd/hwcompare

hw-check-sim: hw-kit hw-tools ## run the kit on a simulated DGX H100 (the sim binary stands in for the driver, simsmi for nvidia-smi), check the capture's shape, replay it and the committed captures, and hold the agent's view against nvidia-smi's
	rm -rf $(HW_SIM_CAPTURE)
	bash $(HWKIT_DIR)/hw-check.sh --kit $(HWKIT_DIR) --out $(HW_SIM_CAPTURE) \
		--simulate $(HW_SIM_PROFILE) --sim-bin $(HWKIT_BIN_DIR)/gpu-node-agent-sim --sim-smi $(HWKIT_BIN_DIR)/simsmi \
		--agent-seconds $(HW_SIM_SECONDS)
	cd test && GNA_HW_CAPTURE=$(abspath $(HW_SIM_CAPTURE)) $(GO) test -race -trimpath -count=1 ./hardware/...
	$(HWKIT_BIN_DIR)/hwcompare $(HWCOMPARE_FLAGS) $(HW_SIM_CAPTURE)

hw-compare: hw-tools ## hold a capture's agent view against its nvidia-smi references: CAPTURE=DIR [EXPLAINED=FILE]
	@test -n "$(CAPTURE)" || { echo "usage: make hw-compare CAPTURE=DIR [EXPLAINED=FILE]" >&2; exit 2; }
	$(HWKIT_BIN_DIR)/hwcompare $(HWCOMPARE_FLAGS) $(CAPTURE)
