package main

import (
	"context"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/gpu-node-agent/gpu-node-agent/agent"
	"github.com/gpu-node-agent/gpu-node-agent/metrics"
)

// runAgent opens the hardware and the agent and serves until ctx is done
// (or --exit-after passes), then stops every server (removing the sockets)
// and returns. It fails only on errors that leave nothing to serve: bad
// hardware settings or a server that can't start.
func runAgent(ctx context.Context, cfg Config, log *slog.Logger, stdout io.Writer) error {
	hw, err := openHardware(&cfg, log)
	if err != nil {
		return err
	}
	a, err := agent.Open(cfg.agentConfig(hw.HostRoot()), hw, log, stdout)
	if err != nil {
		return err
	}
	if cfg.ExitAfter.Duration > 0 {
		// Counted from here, not from process start, so that a slow
		// simulator start can't eat the whole run.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.ExitAfter.Duration)
		defer cancel()
	}
	// SIGHUP rescans the hardware at once.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				a.Rescan()
			}
		}
	}()
	return a.Run(ctx)
}

// agentConfig is the agent's configuration, for hardware whose host root
// is hostRoot (a simulated node's own directory when simulating).
func (c *Config) agentConfig(hostRoot string) agent.Config {
	return agent.Config{
		Version:              version,
		DevicePluginDir:      c.DevicePluginDir,
		GPU:                  c.gpuConfig(),
		RescanInterval:       c.RescanInterval.Duration,
		Health:               c.healthConfig(hostRoot),
		RDMA:                 c.RDMA,
		MetricsAddress:       c.MetricsAddress,
		MetricsWebConfigFile: c.Metrics.WebConfigFile,
		MetricsInterval:      c.Metrics.Interval.Duration,
		PodAttribution:       c.Metrics.PodAttribution,
		DCGMNames:            metrics.DCGMNames(c.Metrics.DCGMNames),
		Zombies:              c.Health.Zombies,
		NodeName:             c.NodeName,
		PodUID:               c.PodUID,
		Taint:                c.Taint.TaintConfig,
		NodeLabels:           c.NodeLabels,
		MoveAdvice:           c.Placement.MoveAdvice,
		Kubeconfig:           c.Kubeconfig,
		KubeClient:           c.kubeClient(),
		PrintInventory:       c.PrintInventory,
		DRA:                  c.DRA,
		Preflight:            c.Preflight.Config,
		Remediation:          c.Remediation.WithDefaults(),
	}
}
