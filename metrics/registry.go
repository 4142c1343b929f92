package metrics

import (
	"runtime"

	"github.com/prometheus/client_golang/prometheus"
)

// NewRegistry returns the registry the agent serves: Go runtime metrics,
// the process_* metrics (CPU, RSS, fds, start time) and
// gpu_node_agent_build_info. Every package registers its own metrics on it
// (the collector, health, plugin).
func NewRegistry(version string) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	// collectors.NewGoCollector only calls prometheus.NewGoCollector, and
	// package collectors links database/sql for its DBStatsCollector, whose
	// init costs the idle agent about 0.1 MB of resident binary (README).
	//lint:ignore SA1019 the same collector, without database/sql
	reg.MustRegister(prometheus.NewGoCollector(), NewBuildInfo(version))
	if pc := newProcessCollector(); pc != nil {
		reg.MustRegister(pc)
	}
	return reg
}

// NewBuildInfo returns the gpu_node_agent_build_info gauge (always 1) with
// the agent's version and the Go version it was built with.
func NewBuildInfo(version string) prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "gpu_node_agent_build_info",
		Help:        "Build information of the running agent; the value is always 1.",
		ConstLabels: prometheus.Labels{"version": version, "goversion": runtime.Version()},
	})
	g.Set(1)
	return g
}
