package main

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpu-node-agent/gpu-node-agent/health"
	"github.com/gpu-node-agent/gpu-node-agent/health/metrics"
	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
)

// newCollector builds the dcgm-exporter compatible GPU collector on reg,
// serving the readings of sampler s (the NVML owner's; it calls no NVML
// itself, and metrics.deviceTimeout is ignored). Its XID metric comes from
// the health monitor, which owns the NVML event set (two event sets would
// each see only some of the events).
func newCollector(cfg Config, s *nvmlowner.Sampler, hw *hardware, mon *health.Monitor, reg prometheus.Registerer, log *slog.Logger) (*metrics.Collector, error) {
	mc := metrics.Config{Hostname: cfg.NodeName}
	if mc.Hostname == "" {
		mc.Hostname, _ = os.Hostname()
	}
	if cfg.Metrics.PodAttribution {
		mc.PodResourcesSocket = metrics.PodResourcesSocketPath(hw.hostRoot)
	}
	mc.XIDs = mon
	c, err := metrics.NewCollector(s, mc, reg, log)
	if err != nil {
		return nil, fmt.Errorf("metrics collector: %w", err)
	}
	return c, nil
}

// ready is /readyz: ready once devices were discovered and every served
// resource is registered with the kubelet (or nothing is served). A node
// whose NVML cannot load is not ready, so the failure shows on the pod.
func (a *agent) ready() error {
	st := a.rec.current()
	if err := st.errs["discovery"]; err != nil {
		return fmt.Errorf("device discovery failed: %w", err)
	}
	registered := a.mgr.Registered()
	for _, r := range st.resources {
		if !registered[r.Name()] {
			return fmt.Errorf("%s is not registered with the kubelet", r.Name())
		}
	}
	return nil
}
