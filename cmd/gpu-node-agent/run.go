package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpu-node-agent/gpu-node-agent/gpu"
	"github.com/gpu-node-agent/gpu-node-agent/plugin"
	"github.com/gpu-node-agent/gpu-node-agent/sim"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// allHealthy is a TEMPORARY default HealthView that calls every device
// healthy, used only until package health is wired in here (the lead
// replaces it with the health monitor). Lost GPUs and a failing NVML are
// still never served as healthy: see gpu.Resources and hardware.discover.
type allHealthy struct{}

func (allHealthy) Healthy(string) bool { return true }

// agent is a configured agent, opened but not yet running.
type agent struct {
	cfg Config
	log *slog.Logger
	hw  *hardware
	reg *prometheus.Registry
	mgr *plugin.Manager
	rec *reconciler
}

// runAgent serves until ctx is done, then stops every server (removing the
// sockets) and returns. It fails only on errors that leave nothing to
// serve: bad hardware settings or a server that can't start.
func runAgent(ctx context.Context, cfg Config, log *slog.Logger, stdout io.Writer) error {
	a, err := openAgent(cfg, log, stdout)
	if err != nil {
		return err
	}
	return a.run(ctx)
}

// openAgent opens the hardware and builds every part; nothing is served
// until run. On error everything opened is closed again.
func openAgent(cfg Config, log *slog.Logger, stdout io.Writer) (*agent, error) {
	hw, err := openHardware(&cfg, log)
	if err != nil {
		return nil, err
	}
	reg := prometheus.NewRegistry()
	mgr, err := plugin.NewManager(plugin.Options{
		Dir:        cfg.DevicePluginDir,
		Logger:     log.With("component", "plugin"),
		Registerer: reg,
	})
	if err != nil {
		hw.close()
		return nil, fmt.Errorf("device-plugin manager: %w", err)
	}

	gcfg := cfg.gpuConfig(hw.hostRoot)
	var health gpu.HealthView = allHealthy{}
	rec := &reconciler{
		log:      log.With("component", "reconcile"),
		discover: hw.discover,
		sources: []source{{
			name: "gpu",
			build: func(n *topology.Node) ([]plugin.Resource, error) {
				if n == nil {
					return nil, nil
				}
				return gpu.Resources(n, gcfg, health, topology.NewAllocator(n))
			},
		}},
		sync:       mgr.Sync,
		rescan:     cfg.RescanInterval.Duration,
		rediscover: []<-chan struct{}{hw.changed()},
	}
	if cfg.PrintInventory {
		rec.report = (&inventory{out: stdout, what: hw.what}).report
	}
	return &agent{cfg: cfg, log: log, hw: hw, reg: reg, mgr: mgr, rec: rec}, nil
}

// run serves until ctx is done or a part fails, then closes the hardware.
func (a *agent) run(ctx context.Context) error {
	defer a.hw.close()
	cfg, log := a.cfg, a.log
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if cfg.ExitAfter.Duration > 0 {
		// Counted from here, not from process start, so that a slow
		// simulator start can't eat the whole run.
		ctx, cancel = context.WithTimeout(ctx, cfg.ExitAfter.Duration)
		defer cancel()
	}

	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	a.rec.rediscover = append(a.rec.rediscover, signals(ctx, hup))

	log.Info("gpu-node-agent starting", "version", version, "hardware", a.hw.what, "hostRoot", a.hw.hostRoot,
		"devicePluginDir", cfg.DevicePluginDir, "migStrategy", cfg.MIGStrategy, "deviceListStrategy", cfg.DeviceListStrategy)

	// Listen before anything is served, so a port in use fails the start.
	var metricsLn net.Listener
	if cfg.MetricsAddress != "" {
		ln, err := listenMetrics(cfg.MetricsAddress)
		if err != nil {
			return err
		}
		metricsLn = ln
	}

	// Every long-running part gets the same ctx; the first to fail stops
	// the rest.
	var wg sync.WaitGroup
	errc := make(chan error, 4)
	start := func(name string, f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(); err != nil {
				errc <- fmt.Errorf("%s: %w", name, err)
				cancel()
			}
		}()
	}
	start("device-plugin manager", func() error { return a.mgr.Run(ctx) })
	start("reconcile", func() error { a.rec.run(ctx); return nil })
	if metricsLn != nil {
		start("metrics", func() error { return serveMetrics(ctx, metricsLn, a.reg, log) })
	}
	if a.hw.sim != nil && cfg.SimControlAddress != "" {
		start("simulator control", func() error {
			return sim.ServeControl(ctx, cfg.SimControlAddress, a.hw.sim.ControlHandler(), log.With("component", "sim"))
		})
	}
	wg.Wait()
	close(errc)
	var errs []error
	for err := range errc {
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		log.Info("gpu-node-agent stopped")
	}
	return errors.Join(errs...)
}

// signals turns OS signals into change signals until ctx is done.
func signals(ctx context.Context, in <-chan os.Signal) <-chan struct{} {
	out := make(chan struct{}, 1)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-in:
				select {
				case out <- struct{}{}:
				default:
				}
			}
		}
	}()
	return out
}
