package health

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// monitorMetrics are the monitor's own series.
type monitorMetrics struct {
	healthy      *prometheus.GaugeVec
	unhealthy    *prometheus.GaugeVec
	transitions  *prometheus.CounterVec
	observations *prometheus.CounterVec
	xids         *prometheus.CounterVec
	noData       *prometheus.CounterVec
	nodeFit      prometheus.Gauge
}

func newMonitorMetrics(reg prometheus.Registerer) (*monitorMetrics, error) {
	m := &monitorMetrics{
		healthy: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpu_node_agent_device_healthy",
			Help: "Whether the device is healthy (1) or not (0), including its parent's and the node's health.",
		}, []string{"device", "kind"}),
		unhealthy: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpu_node_agent_device_unhealthy",
			Help: "1 for each cause that keeps an unhealthy device unhealthy, until the device recovers: " +
				"its own causes only (a MIG device's parent GPU and the node report theirs; the node's are under device \"node\"), " +
				"active, held until a reset or waiting out the recovery period; " +
				"check is the health check, cause its short code (as in the device taint, e.g. xid-79, row-remap-failure, nvlink-link-3), " +
				"action what it asks of an operator: reset-gpu, reboot, check-nvlink, restart-app, rma or investigate.",
		}, []string{"device", "kind", "check", "cause", "action"}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpu_node_agent_health_transitions_total",
			Help: "Health state transitions of a device, by the state entered.",
		}, []string{"device", "to"}),
		observations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpu_node_agent_fault_observations_total",
			Help: "Fault observations (fatal or counted-only) by check and device kind.",
		}, []string{"check", "kind"}),
		xids: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpu_node_agent_xid_errors_total",
			Help: "XID errors reported by NVML (or DCGM), by device and XID.",
		}, []string{"device", "xid"}),
		noData: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpu_node_agent_no_data_total",
			Help: "NVML answers of NOT_SUPPORTED (no data, never a fault), by device (empty for library-wide calls) and field or call.",
		}, []string{"device", "field"}),
		nodeFit: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gpu_node_agent_node_fit",
			Help: "Whether every device on the node is healthy (1) or not (0).",
		}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.healthy, m.unhealthy, m.transitions, m.observations, m.xids, m.noData, m.nodeFit} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *monitorMetrics) observed(o Observation, kind string) {
	if o.XID != 0 {
		m.xids.WithLabelValues(o.DeviceID, strconv.FormatUint(o.XID, 10)).Inc()
	}
	if !o.Cleared {
		m.observations.WithLabelValues(o.Check, kind).Inc()
	}
}

// forget deletes the per-device series of a device that has left the node
// (device_healthy is kept in step by Monitor.publishLocked).
func (m *monitorMetrics) forget(id string) {
	m.transitions.DeletePartialMatch(prometheus.Labels{"device": id})
	m.xids.DeletePartialMatch(prometheus.Labels{"device": id})
}

// unhealthySeries is one series of gpu_node_agent_device_unhealthy.
type unhealthySeries struct {
	device, kind, check, cause, action string
}

func (u unhealthySeries) values() []string {
	return []string{u.device, u.kind, u.check, u.cause, u.action}
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
