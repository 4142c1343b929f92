package preflight

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics exports the latest preflight results: Set renders a Report into
// const metrics once, and a scrape replays them (it never waits on a run).
// Nothing is exported before the first Set, so a node whose preflight is
// off has no preflight series.
type Metrics struct {
	passed, item, failed, lastRun *prometheus.Desc
	rendered                      atomic.Pointer[[]prometheus.Metric]
}

// NewMetrics returns the preflight's series, registered on reg (nil: not
// registered).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		passed: prometheus.NewDesc("gpu_node_agent_preflight_passed",
			"Whether the node's latest preflight results (the last full run, with the GPUs a periodic re-check read since) all passed (1) or not (0).",
			nil, nil),
		item: prometheus.NewDesc("gpu_node_agent_preflight_item",
			"A preflight item's verdict over all its targets: 1 passed, 0 failed; absent while the item is skipped (disabled, not supported, nothing configured).",
			[]string{"item"}, nil),
		failed: prometheus.NewDesc("gpu_node_agent_preflight_failed",
			"1 for each device (GPU UUID, RDMA port, or empty for the node) that failed a preflight item.",
			[]string{"item", "device"}, nil),
		lastRun: prometheus.NewDesc("gpu_node_agent_preflight_last_run_timestamp_seconds",
			"When the latest preflight run (full, or a periodic re-check of idle GPUs) finished, in seconds since the Unix epoch.",
			nil, nil),
	}
	if reg != nil {
		if err := reg.Register(m); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Set makes rep the exported results; finished is when the run that
// produced (or last updated) it ended.
func (m *Metrics) Set(rep *Report) {
	out := []prometheus.Metric{
		prometheus.MustNewConstMetric(m.passed, prometheus.GaugeValue, boolValue(rep.Passed())),
		prometheus.MustNewConstMetric(m.lastRun, prometheus.GaugeValue, float64(rep.Finished.UnixNano())/1e9),
	}
	for _, item := range Items {
		switch rep.ItemStatus(item) {
		case Pass:
			out = append(out, prometheus.MustNewConstMetric(m.item, prometheus.GaugeValue, 1, item))
		case Fail:
			out = append(out, prometheus.MustNewConstMetric(m.item, prometheus.GaugeValue, 0, item))
		}
	}
	seen := map[[2]string]bool{}
	for _, r := range rep.Failed() {
		k := [2]string{r.Item, r.Device}
		if seen[k] {
			continue // several failed DCGM tests of one GPU
		}
		seen[k] = true
		out = append(out, prometheus.MustNewConstMetric(m.failed, prometheus.GaugeValue, 1, r.Item, r.Device))
	}
	m.rendered.Store(&out)
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.passed, m.item, m.failed, m.lastRun} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	if p := m.rendered.Load(); p != nil {
		for _, x := range *p {
			ch <- x
		}
	}
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
