package health

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestMetricsLint runs promlint (what `promtool check metrics` runs) over
// every series the monitor exports (kubeapi lints the tainter's), with values present.
func TestMetricsLint(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	f := newFakeNVML(1)
	m, err := NewMonitor(Config{DCGMMode: DCGMOff}, ownerOf(f), discard(), reg)
	if err != nil {
		t.Fatal(err)
	}
	m.SetNode(f.node(false))
	attachSampler(t, m, f.node(false), time.Hour)
	m.Observe(Observation{DeviceID: "GPU-0", Check: CheckXID, Fatal: true, Event: true, Reason: "xid 79", XID: 79})
	m.Observe(Observation{DeviceID: "GPU-0", Check: CheckXID, Key: "x", Fatal: false, Reason: "xid 13", XID: 13})
	m.Observe(Observation{DeviceID: "GPU-0", Check: CheckXID, Key: "x", Cleared: true})
	m.pollOnce()
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
	want := `
# HELP gpu_node_agent_xid_errors_total XID errors reported by NVML (or DCGM), by device and XID.
# TYPE gpu_node_agent_xid_errors_total counter
gpu_node_agent_xid_errors_total{device="GPU-0",xid="13"} 1
gpu_node_agent_xid_errors_total{device="GPU-0",xid="79"} 1
# HELP gpu_node_agent_node_fit Whether every device on the node is healthy (1) or not (0).
# TYPE gpu_node_agent_node_fit gauge
gpu_node_agent_node_fit 0
# HELP gpu_node_agent_device_healthy Whether the device is healthy (1) or not (0), including its parent's and the node's health.
# TYPE gpu_node_agent_device_healthy gauge
gpu_node_agent_device_healthy{device="GPU-0",kind="gpu"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"gpu_node_agent_xid_errors_total", "gpu_node_agent_node_fit", "gpu_node_agent_device_healthy"); err != nil {
		t.Fatal(err)
	}
}

func counterValue(m *Monitor, device, xid string) float64 {
	return testutil.ToFloat64(m.metrics.xids.WithLabelValues(device, xid))
}
