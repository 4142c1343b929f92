package main

import (
	"errors"
	"log/slog"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
)

// errNoSimulator is what --simulate, --sim-control-address and demo say in
// the product binary, which is built without the simulator.
var errNoSimulator = errors.New("this binary has no simulator; use gpu-node-agent-sim")

// openNVML is the real hardware: NVML under the host root. A library that
// fails to load is not an error: it is logged and discovery keeps failing
// (no GPU resources) until it loads.
func openNVML(cfg *Config, log *slog.Logger) *nvmlowner.Hardware {
	owner := nvmlowner.New(nvmlowner.Real(), nvmlowner.Config{CallTimeout: cfg.NVMLCallTimeout.Duration}, log.With("component", "nvml"))
	return nvmlowner.NewHardware(owner, cfg.HostRoot, log)
}
