package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpu-node-agent/gpu-node-agent/gpu"
	"github.com/gpu-node-agent/gpu-node-agent/health"
	"github.com/gpu-node-agent/gpu-node-agent/health/metrics"
	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
	"github.com/gpu-node-agent/gpu-node-agent/plugin"
	"github.com/gpu-node-agent/gpu-node-agent/rdma"
	"github.com/gpu-node-agent/gpu-node-agent/sim"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// agent is a configured agent, opened but not yet running.
type agent struct {
	cfg       Config
	log       *slog.Logger
	hw        *hardware
	nics      *nics
	reg       *prometheus.Registry
	mgr       *plugin.Manager
	mon       *health.Monitor
	collector *metrics.Collector
	sampler   *nvmlowner.Sampler
	watcher   *rdma.Watcher
	// node is nil unless a node name and tainting or labels are set.
	node *nodeObject
	rec  *reconciler
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
func openAgent(cfg Config, log *slog.Logger, stdout io.Writer) (_ *agent, err error) {
	hw, err := openHardware(&cfg, log)
	if err != nil {
		return nil, err
	}
	a := &agent{cfg: cfg, log: log, hw: hw}
	defer func() {
		if err != nil {
			a.close()
		}
	}()
	// One registry for everything: Go/process collectors, build info, the
	// plugin manager, health, the GPU collector and the tainter.
	a.reg = metrics.NewRegistry(version)
	a.mgr, err = plugin.NewManager(plugin.Options{
		Dir:        cfg.DevicePluginDir,
		Logger:     log.With("component", "plugin"),
		Registerer: a.reg,
	})
	if err != nil {
		return nil, fmt.Errorf("device-plugin manager: %w", err)
	}
	hcfg := cfg.healthConfig(hw.hostRoot)
	// Under --mig-strategy none the kubelet knows whole GPUs only: XIDs
	// tagged with a MIG instance go to the GPU.
	hcfg.MIGDevicesServed = cfg.MIGStrategy != gpu.MIGStrategyNone
	if a.mon, err = health.NewMonitor(hcfg, hw.owner, log.With("component", "health"), a.reg); err != nil {
		return nil, err
	}
	// One sampler reads every GPU counter once per interval for health
	// and metrics alike, on the NVML owner's per-GPU lanes.
	a.sampler = nvmlowner.NewSampler(hw.owner, nvmlowner.SamplerConfig{Interval: sampleInterval(cfg)})
	a.mon.SetSampler(a.sampler)
	if a.collector, err = newCollector(cfg, a.sampler, hw, a.mon, a.reg, log.With("component", "metrics")); err != nil {
		return nil, err
	}
	a.nics = openNICs(cfg.RDMA, hw, log.With("component", "rdma"))
	if a.watcher, err = a.nics.watcher(a.mon, log.With("component", "rdma")); err != nil {
		return nil, err
	}
	if err := a.nics.writeCDISpec(cfg.DeviceListStrategy); err != nil {
		return nil, err
	}
	if cfg.needsAPI() {
		a.node = newNodeObject(cfg, a.mon, a.reg, log.With("component", "node"))
	}

	// The GPU resources record what they allocate so that an RDMA
	// allocation for the same container can prefer the NICs next to it.
	recent := rdma.NewRecent(0)
	gcfg := cfg.gpuConfig(hw.hostRoot)
	gcfg.Recorder = recent
	sources := []source{{
		name: "gpu",
		build: func(n *topology.Node) ([]plugin.Resource, error) {
			if n == nil {
				return nil, nil
			}
			// The solver is built per discovery, not per request.
			return gpu.Resources(n, gcfg, a.mon, topology.NewAllocator(n))
		},
	}}
	if s := a.nics.source(a.mon, cfg.DeviceListStrategy == gpu.DeviceListCDICRI, recent); s != nil {
		sources = append(sources, *s)
	}
	onDiscover := []func(*topology.Node){a.mon.SetNode, a.collector.SetNode,
		func(n *topology.Node) { a.sampler.SetTargets(nvmlowner.TargetsOf(n)) }}
	if a.node != nil {
		onDiscover = append(onDiscover, a.node.setNode)
	}
	a.rec = &reconciler{
		log: log.With("component", "reconcile"),
		discover: func() (*topology.Node, error) {
			n, err := hw.discover()
			noteNVML(a.mon, hw, err)
			a.nics.addToNode(n)
			return n, err
		},
		onDiscover: onDiscover,
		sources:    sources,
		sync:       a.mgr.Sync,
		rescan:     cfg.RescanInterval.Duration,
		rediscover: []<-chan struct{}{hw.changed(), a.sampler.LayoutChanged()},
		// Health changes re-sync the plugin manager without rediscovery.
		resync: []<-chan struct{}{a.mon.Changes()},
	}
	if cfg.PrintInventory {
		a.rec.report = (&inventory{out: stdout, what: hw.what, fit: a.mon.NodeFit}).report
	}
	return a, nil
}

// close releases the hardware and the netlink handle.
func (a *agent) close() {
	if a.nics != nil {
		a.nics.close()
	}
	a.hw.close()
}

// run serves until ctx is done or a part fails, then closes the hardware.
func (a *agent) run(ctx context.Context) error {
	defer a.close()
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
	var srv *metrics.Server
	if cfg.MetricsAddress != "" {
		var err error
		srv, err = metrics.Listen(metrics.ServerConfig{Address: cfg.MetricsAddress, WebConfigFile: cfg.Metrics.WebConfigFile},
			a.reg, a.ready, log.With("component", "metrics"))
		if err != nil {
			return fmt.Errorf("metrics: %w", err)
		}
		log.Info("metrics endpoint listening", "addr", srv.Addr().String())
	}

	// Every long-running part gets the same ctx; the first to fail stops
	// the rest.
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	start := func(name string, f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("%s: %w", name, err))
				mu.Unlock()
				cancel()
			}
		}()
	}
	start("device-plugin manager", func() error { return a.mgr.Run(ctx) })
	start("reconcile", func() error { a.rec.run(ctx); return nil })
	start("health monitor", func() error { return a.mon.Run(ctx) })
	start("nvml sampler", func() error { return a.sampler.Run(ctx) })
	start("metrics collector", func() error { return a.collector.Run(ctx) })
	if a.watcher != nil {
		start("rdma watcher", func() error { return a.watcher.Run(ctx) })
	}
	if a.node != nil {
		start("node object", func() error { return a.node.run(ctx) })
	}
	if srv != nil {
		start("metrics", func() error { return srv.Serve(ctx) })
	}
	if a.hw.sim != nil && cfg.SimControlAddress != "" {
		start("simulator control", func() error {
			return sim.ServeControl(ctx, cfg.SimControlAddress, a.hw.sim.ControlHandler(), log.With("component", "sim"))
		})
	}
	wg.Wait()
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

// sampleInterval is the NVML sampling period: the shorter of the health
// poll and metrics intervals, so each counter is read once for both.
func sampleInterval(cfg Config) time.Duration {
	h := cfg.Health.PollInterval
	if h == 0 {
		h = health.Config{}.WithDefaults().PollInterval
	}
	if m := cfg.Metrics.Interval.Duration; m > 0 && m < h {
		return m
	}
	return h
}
