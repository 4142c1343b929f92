package preflight

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestMetrics: nothing before the first report; then the verdict, one
// series per judged item (none for a skipped one), one per failed device
// (a device failing several DCGM tests once), promlint-clean.
func TestMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := testutil.GatherAndCount(reg); err != nil || n != 0 {
		t.Fatalf("%d series before any run (err %v)", n, err)
	}
	m.Set(&Report{Finished: time.Unix(1700000000, 500_000_000), Results: []Result{
		{Item: ItemGPUCount, Target: "node", Status: Pass},
		{Item: ItemPCIe, Target: "GPU 0", Device: "GPU-0", Status: Pass},
		{Item: ItemPCIe, Target: "GPU 3", Device: "GPU-3", Status: Fail},
		{Item: ItemDCGM, Target: "GPU 3", Device: "GPU-3", Status: Fail, Detail: "memory"},
		{Item: ItemDCGM, Target: "GPU 3", Device: "GPU-3", Status: Fail, Detail: "pcie"},
		{Item: ItemCommand, Target: "node", Status: Fail},
		{Item: ItemRetiredPages, Target: "GPU 0", Device: "GPU-0", Status: Skipped},
	}})
	want := `
# HELP gpu_node_agent_preflight_failed 1 for each device (GPU UUID, RDMA port, or empty for the node) that failed a preflight item.
# TYPE gpu_node_agent_preflight_failed gauge
gpu_node_agent_preflight_failed{device="",item="command"} 1
gpu_node_agent_preflight_failed{device="GPU-3",item="dcgm-diag"} 1
gpu_node_agent_preflight_failed{device="GPU-3",item="pcie-link"} 1
# HELP gpu_node_agent_preflight_item A preflight item's verdict over all its targets: 1 passed, 0 failed; absent while the item is skipped (disabled, not supported, nothing configured).
# TYPE gpu_node_agent_preflight_item gauge
gpu_node_agent_preflight_item{item="command"} 0
gpu_node_agent_preflight_item{item="dcgm-diag"} 0
gpu_node_agent_preflight_item{item="gpu-count"} 1
gpu_node_agent_preflight_item{item="pcie-link"} 0
# HELP gpu_node_agent_preflight_last_run_timestamp_seconds When the latest preflight run (full, or a periodic re-check of idle GPUs) finished, in seconds since the Unix epoch.
# TYPE gpu_node_agent_preflight_last_run_timestamp_seconds gauge
gpu_node_agent_preflight_last_run_timestamp_seconds 1.7000000005e+09
# HELP gpu_node_agent_preflight_passed Whether the node's latest preflight results (the last full run, with the GPUs a periodic re-check read since) all passed (1) or not (0).
# TYPE gpu_node_agent_preflight_passed gauge
gpu_node_agent_preflight_passed 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil || len(problems) > 0 {
		t.Errorf("promlint: %v %v", problems, err)
	}
}
