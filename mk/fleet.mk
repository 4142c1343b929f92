# Fleet simulation (test/cmd/fleetsim): the agents' load on a real
# kube-apiserver and the fleet safeguard at scale, on loopback.
#   level 1: FLEET_N agents' API side in one process (steady state, then
#            FLEET_R mass faults of 30% of the fleet and their recovery)
#   level 2: FLEET_PROCS real agent processes in simulate mode, a GPU loss
#            injected into 20 of them at once, FLEET_R2 times
# The markdown report is printed and written to FLEET_OUT; the command
# exits non-zero if more Nodes than the safeguard's limit were tainted.

FLEET_N     ?= 1000
FLEET_R     ?= 3
FLEET_PROCS ?= 40
FLEET_R2    ?= 3
FLEET_OUT   ?= $(CURDIR)/.build/fleet-sim.md
# FLEET_ARGS are extra fleetsim flags, e.g. FLEET_ARGS='-steady 5m -resync 30s'.
FLEET_ARGS  ?=

.PHONY: fleet-sim

fleet-sim: build-sim kube-bins e2e-deps ## fleet simulation: 1000 in-process agents + 40 agent processes against a real apiserver (report in .build/fleet-sim.md)
	@mkdir -p $(dir $(FLEET_OUT))
	cd test && $(E2E_ENV) $(GO) run ./cmd/fleetsim -n $(FLEET_N) -r $(FLEET_R) -procs $(FLEET_PROCS) -r2 $(FLEET_R2) \
		-out $(FLEET_OUT) $(FLEET_ARGS)
