package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/signal"
	"syscall"

	"github.com/gpu-node-agent/gpu-node-agent/agent"
	"github.com/gpu-node-agent/gpu-node-agent/preflight"
)

// runPreflight is "gpu-node-agent preflight [flags]": the preflight's
// items once, on the node (real NVML) or a simulated one (--simulate,
// --sim-faults), printed as a table. It takes the agent's flags, env and
// config file (the preflight, rdma and health.dcgmMode settings matter).
// Exit status: 0 passed, 1 an item failed (or the hardware could not be
// opened), 2 a bad configuration.
func runPreflight(args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	cfg, code, ok := validConfig("gpu-node-agent preflight", args, getenv, stderr)
	if !ok {
		return code
	}
	log := newLogger(stderr, cfg.LogFormat, cfg.LogLevel)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	hw, err := openHardware(&cfg, log)
	if err != nil {
		fmt.Fprintf(stderr, "gpu-node-agent preflight: %v\n", err)
		if errors.Is(err, errNoSimulator) {
			return 2
		}
		return 1
	}
	defer hw.Close()
	rep := agent.RunPreflight(ctx, cfg.agentConfig(hw.HostRoot()), hw, log)
	if err := preflight.WriteTable(stdout, rep); err != nil {
		fmt.Fprintf(stderr, "gpu-node-agent preflight: %v\n", err)
		return 1
	}
	if !rep.Passed() {
		return 1
	}
	return 0
}
