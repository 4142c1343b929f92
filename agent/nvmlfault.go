package agent

import (
	"log/slog"

	"github.com/gpu-node-agent/gpu-node-agent/health"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// noteNVML runs the gpu-missing check after a discovery (err is its
// error, last the hardware's last discovered node): NVIDIA GPUs on the PCI
// bus under hostRoot that NVML does not list, fewer GPUs than
// health.expectedGPUs, or GPUs on the bus while NVML does not load make
// the node unfit (tainted, every device unhealthy) instead of quietly
// smaller or empty. The health monitor alone treats "no library, no GPUs"
// as a node without GPUs. A simulated node has its GPUs on its own host
// root's bus, so the check runs there too. It returns the observation.
func noteNVML(mon *health.Monitor, cfg health.Config, hostRoot string, last *topology.Node, err error, log *slog.Logger) health.Observation {
	onBus, busErr := health.GPUsOnPCI(hostRoot)
	if busErr != nil && log != nil {
		// Without the bus the check can only count against expectedGPUs.
		log.Warn("gpu-missing check: cannot list the PCI bus", "err", busErr)
	}
	if err != nil {
		last = nil
	}
	o := health.MissingGPUs(cfg, onBus, last)
	mon.Observe(o)
	return o
}
