package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os/signal"
	"slices"
	"syscall"

	"github.com/gpu-node-agent/gpu-node-agent/agent"
	"github.com/gpu-node-agent/gpu-node-agent/health"
	"github.com/gpu-node-agent/gpu-node-agent/preflight"
	"github.com/gpu-node-agent/gpu-node-agent/rdma"
)

// runPreflight is "gpu-node-agent preflight [flags]": the preflight's
// items once, on the node (real NVML) or a simulated one (--simulate,
// --sim-faults), printed as a table. It takes the agent's flags, env and
// config file (the preflight, rdma and health.dcgmMode settings matter).
// Exit status: 0 passed, 1 an item failed (or the hardware could not be
// opened), 2 a bad configuration.
func runPreflight(args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	cfg, err := loadConfig(args, getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "gpu-node-agent preflight: %v\n", err)
		return 2
	}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintf(stderr, "gpu-node-agent preflight: invalid configuration:\n%v\n", err)
		return 2
	}
	log := newLogger(stderr, cfg.LogFormat, cfg.LogLevel)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	rep, err := preflightOnce(ctx, &cfg, log)
	if err != nil {
		fmt.Fprintf(stderr, "gpu-node-agent preflight: %v\n", err)
		if errors.Is(err, errNoSimulator) {
			return 2
		}
		return 1
	}
	if err := preflight.WriteTable(stdout, rep); err != nil {
		fmt.Fprintf(stderr, "gpu-node-agent preflight: %v\n", err)
		return 1
	}
	if !rep.Passed() {
		return 1
	}
	return 0
}

// preflightOnce opens the hardware cfg names, gathers the preflight's
// inputs (a discovery now, the PCI bus, the RDMA devices, DCGM) and runs
// every item once.
func preflightOnce(ctx context.Context, cfg *Config, log *slog.Logger) (*preflight.Report, error) {
	hw, err := openHardware(cfg, log)
	if err != nil {
		return nil, err
	}
	defer hw.Close()
	in := preflight.Inputs{RDMAResources: cfg.RDMA.Resources}
	in.Node, in.NodeErr = hw.Discover()
	if in.Node != nil {
		in.Owner = hw.Owner()
	}
	in.BusGPUs, in.BusErr = health.GPUsOnPCI(hw.HostRoot())
	s, simulated := hw.(agent.Simulator)
	simulated = simulated && s.Simulated()
	if len(cfg.RDMA.Resources) > 0 {
		nics := rdma.OpenNICs(cfg.RDMA, rdma.NICsOptions{Root: hw.HostRoot(), Simulated: simulated, Logger: log})
		defer nics.Close()
		in.RDMADevices, in.RDMAErr = nics.Devices(), nics.Err()
	}
	switch {
	case simulated:
		// A host's DCGM would test the host's GPUs, not the simulated ones.
		in.DCGMErr = errors.New("a simulated node has no DCGM")
	case !slices.Contains(cfg.Preflight.DisabledItems, preflight.ItemDCGM):
		d, err := health.OpenDCGMDiag(cfg.healthConfig(hw.HostRoot()), log)
		if err != nil {
			in.DCGMErr = err
		} else {
			defer d.Close()
			in.DCGM = d
		}
	}
	return preflight.New(cfg.Preflight.Config, log).Run(ctx, in), nil
}
