//go:build !simulator

package main

import (
	"fmt"
	"io"
	"log/slog"

	"github.com/gpu-node-agent/gpu-node-agent/agent"
)

// defaultSimControlAddress is --sim-control-address's default: none, as
// there is no simulator to control.
const defaultSimControlAddress = ""

// validateSimulate refuses every simulator setting: this binary has none
// (gpu-node-agent-sim, built with -tags simulator, has).
func (c *Config) validateSimulate(add func(name, format string, a ...any)) {
	if c.Simulate != "" {
		add("simulate", "%w", errNoSimulator)
	}
	if c.SimControlAddress != "" {
		add("sim-control-address", "%w", errNoSimulator)
	}
	if c.SimFaults != "" {
		add("sim-faults", "%w", errNoSimulator)
	}
}

// openHardware opens the real NVML; Validate has refused --simulate.
func openHardware(cfg *Config, log *slog.Logger) (agent.Hardware, error) {
	if cfg.Simulate != "" {
		return nil, fmt.Errorf("simulate: %w", errNoSimulator)
	}
	return openNVML(cfg, log), nil
}

// runDemo runs a simulated node: not in this binary.
func runDemo(_ []string, _, stderr io.Writer, _ func(string) string) int {
	fmt.Fprintf(stderr, "gpu-node-agent demo: %v\n", errNoSimulator)
	return 2
}
