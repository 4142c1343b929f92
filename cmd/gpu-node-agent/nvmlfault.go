package main

import (
	"github.com/gpu-node-agent/gpu-node-agent/health"
)

// noteNVML runs the gpu-missing check after a discovery (err is its
// error): NVIDIA GPUs on the PCI bus that NVML does not list, fewer GPUs
// than health.expectedGPUs, or GPUs on the bus while NVML does not load
// make the node unfit (tainted, every device unhealthy) instead of quietly
// smaller or empty. The health monitor alone treats "no library, no GPUs"
// as a node without GPUs. In simulate mode the simulator's host root has
// the simulated GPUs on its bus, so the check runs there too.
func noteNVML(mon *health.Monitor, hw *hardware, err error) {
	onBus, busErr := health.GPUsOnPCI(hw.hostRoot)
	if busErr != nil && hw.log != nil {
		// Without the bus the check can only count against expectedGPUs.
		hw.log.Warn("gpu-missing check: cannot list the PCI bus", "err", busErr)
	}
	node := hw.lastNode()
	if err != nil {
		node = nil
	}
	mon.Observe(health.MissingGPUs(hw.health, onBus, node))
}
