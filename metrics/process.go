package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/procfs"
)

// processCollector serves the standard process_* metrics the agent's own
// cost is watched by (CPU, RSS, open fds, start time) from one read of
// /proc/self/stat and one of /proc/self/fd. client_golang's process
// collector also reads limits, status and /proc/self/net/netstat on every
// scrape, which was half the cost of a whole scrape; on a node agent whose
// scrape budget is a few milliseconds that is not worth it.
type processCollector struct {
	proc                     procfs.Proc
	startTime                float64
	cpu, rss, vsize, fds, st *prometheus.Desc
}

// newProcessCollector returns the collector, or nil where /proc is not
// readable (then the process_* metrics are simply absent).
func newProcessCollector() prometheus.Collector {
	p, err := procfs.Self()
	if err != nil {
		return nil
	}
	stat, err := p.Stat()
	if err != nil {
		return nil
	}
	// Fixed for the process's life: computed once (it needs /proc/stat).
	start, err := stat.StartTime()
	if err != nil {
		return nil
	}
	return &processCollector{
		proc:      p,
		startTime: start,
		cpu:       prometheus.NewDesc("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.", nil, nil),
		rss:       prometheus.NewDesc("process_resident_memory_bytes", "Resident memory size in bytes.", nil, nil),
		vsize:     prometheus.NewDesc("process_virtual_memory_bytes", "Virtual memory size in bytes.", nil, nil),
		fds:       prometheus.NewDesc("process_open_fds", "Number of open file descriptors.", nil, nil),
		st:        prometheus.NewDesc("process_start_time_seconds", "Start time of the process since unix epoch in seconds.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *processCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.cpu, c.rss, c.vsize, c.fds, c.st} {
		ch <- d
	}
}

// Collect implements prometheus.Collector; a failed read drops its metrics
// from this scrape only.
func (c *processCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(c.st, prometheus.GaugeValue, c.startTime)
	if stat, err := c.proc.Stat(); err == nil {
		ch <- prometheus.MustNewConstMetric(c.cpu, prometheus.CounterValue, stat.CPUTime())
		ch <- prometheus.MustNewConstMetric(c.rss, prometheus.GaugeValue, float64(stat.ResidentMemory()))
		ch <- prometheus.MustNewConstMetric(c.vsize, prometheus.GaugeValue, float64(stat.VirtualMemory()))
	}
	if n, err := c.proc.FileDescriptorsLen(); err == nil {
		ch <- prometheus.MustNewConstMetric(c.fds, prometheus.GaugeValue, float64(n))
	}
}
