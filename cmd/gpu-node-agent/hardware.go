package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-node-agent/gpu-node-agent/health"
	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
	"github.com/gpu-node-agent/gpu-node-agent/sim"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// hardware is where devices are discovered: real NVML or a simulated node.
type hardware struct {
	log      *slog.Logger
	hostRoot string
	// what names the hardware for people: "NVML" or "simulated dgx-h100".
	what string
	// sim is the simulated node, nil on real hardware.
	sim *sim.Node

	mu sync.Mutex
	// owner is the only NVML caller: per-GPU lanes, bounded calls;
	// discovery, the sampler and the event set all call through it.
	owner *nvmlowner.Owner
	// ready says Init succeeded; until then every discovery retries it, so
	// a driver that loads after the agent is picked up by a rescan.
	ready bool
	// warned keeps a failing NVML to one error line, not one per rescan.
	warned bool
	// disc discovers through owner. Created once NVML is initialised.
	disc *nvmlowner.Discoverer
	// last is the last discovered node (nil until one succeeds, and after
	// a failed discovery): the links of the next discovery start from it,
	// and the gpu-missing check compares with it.
	last *topology.Node
	// health configures the gpu-missing check (expected GPUs, disabled).
	health health.Config

	cleanup []func()
}

// openHardware opens what cfg says. With --simulate and the default
// host root, the simulated tree goes into a new temporary directory that
// close removes. Errors here are configuration errors (a bad profile or
// snapshot); a real NVML that fails to load is not one: it is logged and
// discovery keeps failing (no GPU resources) until it loads.
func openHardware(cfg *Config, log *slog.Logger) (*hardware, error) {
	ocfg := nvmlowner.Config{CallTimeout: cfg.NVMLCallTimeout.Duration}
	if cfg.Simulate == "" {
		h := nvmlHardware(nvml.New(), ocfg, cfg.HostRoot, log)
		h.health = cfg.Health.Config
		return h, nil
	}

	spec, err := parseSimulate(cfg.Simulate)
	if err != nil {
		return nil, fmt.Errorf("simulate: %w", err)
	}
	// Build the model first: a bad profile or layout fails before any
	// directory is created.
	model, err := spec.node()
	if err != nil {
		return nil, err
	}
	h := &hardware{log: log, what: "simulated " + spec.String(), health: cfg.Health.Config}
	root := cfg.HostRoot
	if root == "/" {
		// Never write a simulated /sys and /dev over the real ones.
		if root, err = os.MkdirTemp("", "gpu-node-agent-sim-"); err != nil {
			return nil, fmt.Errorf("simulate: host root: %w", err)
		}
		h.cleanup = append(h.cleanup, func() { os.RemoveAll(root) })
	} else if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, fmt.Errorf("simulate: host root: %w", err)
	}
	node, err := sim.New(model, root, log.With("component", "sim"))
	if err != nil {
		h.close()
		return nil, err
	}
	h.sim, h.hostRoot, h.ready = node, root, true
	h.owner = nvmlowner.New(node.NVML(), ocfg, log.With("component", "nvml"))
	if err := h.owner.Init(context.Background()); err != nil {
		h.close()
		return nil, fmt.Errorf("simulate: %w", err)
	}
	h.cleanup = append(h.cleanup, h.shutdown)
	return h, nil
}

// nvmlHardware is real hardware behind lib (nvml.New() outside tests).
func nvmlHardware(lib nvml.Interface, cfg nvmlowner.Config, hostRoot string, log *slog.Logger) *hardware {
	h := &hardware{log: log, hostRoot: hostRoot, what: "NVML",
		owner: nvmlowner.New(lib, cfg, log.With("component", "nvml"))}
	h.mu.Lock()
	h.initLocked()
	h.mu.Unlock()
	return h
}

// initLocked loads and initialises NVML, bounded by the call timeout;
// h.mu must be held.
func (h *hardware) initLocked() {
	if h.ready {
		return
	}
	if err := h.owner.Init(context.Background()); err != nil {
		// Not a silent empty node: this is an error and no GPU is served.
		if !h.warned {
			h.log.Error("NVML unavailable: serving no GPU resources until it loads", "err", err)
			h.warned = true
		} else {
			h.log.Debug("NVML still unavailable", "err", err)
		}
		return
	}
	h.ready = true
	h.cleanup = append(h.cleanup, h.shutdown)
	h.log.Info("NVML initialised")
}

// shutdown balances the successful Init (bounded: a hung driver does not
// hold up the agent's exit).
func (h *hardware) shutdown() {
	if err := h.owner.Shutdown(context.Background()); err != nil {
		h.log.Warn("NVML shutdown failed", "err", err)
	}
}

// errNVMLUnavailable is returned by discover while NVML cannot be loaded.
var errNVMLUnavailable = errors.New("nvml unavailable")

// discover reads the node's current topology through the owner: every
// call bounded by the call timeout (a hung GPU comes back Lost,
// "nvml-timeout: <call>"), the links reused from the last discovery while
// the GPU set is unchanged.
func (h *hardware) discover() (*topology.Node, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.initLocked()
	if !h.ready {
		h.last = nil
		return nil, errNVMLUnavailable
	}
	if h.disc == nil {
		h.disc = nvmlowner.NewDiscoverer(h.owner, h.hostRoot, h.log.With("component", "discovery"))
	}
	n, err := h.disc.Discover(context.Background(), h.last)
	if err != nil {
		h.last = nil
		return nil, fmt.Errorf("discover: %w", err)
	}
	h.last = n
	return n, nil
}

// lastNode is the last discovered node, nil if the last discovery failed.
func (h *hardware) lastNode() *topology.Node {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.last
}

// changed is signalled when the simulated layout changes; nil (never) on
// real hardware, which is rescanned on a timer and SIGHUP instead.
func (h *hardware) changed() <-chan struct{} {
	if h.sim == nil {
		return nil
	}
	return h.sim.Changed()
}

// close shuts NVML down and removes a temporary host root, in reverse.
func (h *hardware) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i := len(h.cleanup) - 1; i >= 0; i-- {
		h.cleanup[i]()
	}
	h.cleanup = nil
}
