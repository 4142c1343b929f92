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

// TestDeviceUnhealthyByCause: gpu_node_agent_device_unhealthy has one
// series per cause of each unhealthy device (its own causes: the node's
// are under device "node", never copied to every GPU), with the cause's
// check, short code and action, and loses them when the device recovers.
func TestDeviceUnhealthyByCause(t *testing.T) {
	h := start(t, newFakeNVML(2), false, nil)
	h.m.Observe(Observation{DeviceID: "GPU-0", Check: CheckXID, Key: "xid 79", Fatal: true, Event: true, Reason: "xid 79 (reboot)", XID: 79})
	h.m.Observe(Observation{DeviceID: "GPU-0", Kind: KindGPU, Check: CheckRemap, Key: "failure", Fatal: true, Reason: "row remapping failure"})
	h.m.Observe(Observation{DeviceID: "GPU-0", Kind: KindGPU, Check: CheckDCGM, Key: "policy xid", Fatal: true, Event: true, Reason: "dcgm: xid 95", XID: 95})
	h.m.Observe(Observation{DeviceID: "GPU-1", Kind: KindGPU, Check: CheckNVLink, Key: "link 3", Fatal: true, Reason: "nvlink 3 down"})
	h.m.Observe(Observation{DeviceID: NodeID, Check: CheckNVML, Key: "poll", Fatal: true, Reason: "nvml: ERROR_UNKNOWN"})
	h.m.Observe(Observation{DeviceID: "mlx5_0", Kind: KindNIC, Check: "rdma-port", Fatal: true, Reason: "port down"})
	const head = `
# HELP gpu_node_agent_device_unhealthy 1 for each cause that keeps an unhealthy device unhealthy, until the device recovers: its own causes only (a MIG device's parent GPU and the node report theirs; the node's are under device "node"), active, held until a reset or waiting out the recovery period; check is the health check, cause its short code (as in the device taint, e.g. xid-79, row-remap-failure, nvlink-link-3), action what it asks of an operator: reset-gpu, reboot, check-nvlink, restart-app, rma or investigate.
# TYPE gpu_node_agent_device_unhealthy gauge
`
	want := head + `gpu_node_agent_device_unhealthy{action="check-nvlink",cause="nvlink-link-3",check="nvlink",device="GPU-1",kind="gpu"} 1
gpu_node_agent_device_unhealthy{action="investigate",cause="nvml-poll",check="nvml",device="node",kind="node"} 1
gpu_node_agent_device_unhealthy{action="investigate",cause="rdma-port",check="rdma-port",device="mlx5_0",kind="nic"} 1
gpu_node_agent_device_unhealthy{action="reboot",cause="xid-79",check="xid",device="GPU-0",kind="gpu"} 1
gpu_node_agent_device_unhealthy{action="reset-gpu",cause="dcgm-policy-xid",check="dcgm",device="GPU-0",kind="gpu"} 1
gpu_node_agent_device_unhealthy{action="rma",cause="row-remap-failure",check="row-remap",device="GPU-0",kind="gpu"} 1
`
	if err := testutil.GatherAndCompare(h.reg, strings.NewReader(want), "gpu_node_agent_device_unhealthy"); err != nil {
		t.Fatal(err)
	}

	// The link comes back, NVML answers, the port is up: each device
	// keeps its cause while it waits out the recovery period, then loses
	// it. GPU-0's causes are held (XIDs 79 and 95) or still reported.
	h.m.Observe(Observation{DeviceID: "GPU-1", Kind: KindGPU, Check: CheckNVLink, Key: "link 3", Cleared: true})
	h.m.Observe(Observation{DeviceID: NodeID, Check: CheckNVML, Key: "poll", Cleared: true})
	h.m.Observe(Observation{DeviceID: "mlx5_0", Kind: KindNIC, Check: "rdma-port", Cleared: true})
	if n := testutil.CollectAndCount(h.m.metrics.unhealthy); n != 6 {
		t.Errorf("%d device_unhealthy series while recovering, want all 6", n)
	}
	h.step(t, h.m.cfg.RecoveryPeriod)
	want = head + `gpu_node_agent_device_unhealthy{action="reboot",cause="xid-79",check="xid",device="GPU-0",kind="gpu"} 1
gpu_node_agent_device_unhealthy{action="reset-gpu",cause="dcgm-policy-xid",check="dcgm",device="GPU-0",kind="gpu"} 1
gpu_node_agent_device_unhealthy{action="rma",cause="row-remap-failure",check="row-remap",device="GPU-0",kind="gpu"} 1
`
	if err := testutil.GatherAndCompare(h.reg, strings.NewReader(want), "gpu_node_agent_device_unhealthy"); err != nil {
		t.Fatal(err)
	}

	// A GPU that leaves the node takes its series with it.
	n := h.f.node(false)
	n.GPUs = n.GPUs[1:]
	h.m.SetNode(n)
	if n := testutil.CollectAndCount(h.m.metrics.unhealthy); n != 0 {
		t.Errorf("%d device_unhealthy series after GPU-0 left, want 0", n)
	}
}
