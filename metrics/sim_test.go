package metrics

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gpu-node-agent/gpu-node-agent/sim"
)

// simFields are the DCGM fields sim/counters.go simulates; the golden
// file pins only these, so fault simulation (ECC, remapping, XID) can
// evolve without touching it.
var simFields = []string{
	"DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_GPU_TEMP",
	"DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
	"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED",
	"DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL", "DCGM_FI_DEV_FB_RESERVED",
	"DCGM_FI_DEV_VGPU_LICENSE_STATUS",
}

// newSimCollector builds a simulated dgx-h100 with 14 MIG devices (seven
// 1g.10gb on each of GPUs 0 and 1) and a collector on it.
func newSimCollector(tb testing.TB, reg prometheus.Registerer) (*Collector, *sim.Node) {
	tb.Helper()
	seven := slices.Repeat([]string{"1g.10gb"}, 7)
	spec, err := sim.Profile("dgx-h100", sim.WithMIG(0, seven...), sim.WithMIG(1, seven...))
	if err != nil {
		tb.Fatal(err)
	}
	node, err := sim.New(spec, tb.TempDir(), nil)
	if err != nil {
		tb.Fatalf("sim.New: %v", err)
	}
	c, err := NewCollector(newLibSampler(tb, node.NVML(), node.Spec(), patientTimeout), Config{Hostname: "sim-node"}, reg, testLogger(tb))
	if err != nil {
		tb.Fatal(err)
	}
	c.SetNode(node.Spec())
	return c, node
}

func TestGoldenSimulatedNode(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	c, node := newSimCollector(t, reg)
	if got := len(node.Spec().GPUs[0].MIG) + len(node.Spec().GPUs[1].MIG); got != 14 {
		t.Fatalf("simulated MIG devices = %d, want 14", got)
	}
	// Two cycles: the readings must come from the second step, proving
	// they move and the snapshot is replaced.
	collectNow(t, c)
	collectNow(t, c)

	golden := filepath.Join("testdata", "sim-dgx-h100-mig.prom")
	if *update {
		if err := os.WriteFile(golden, []byte(gather(t, reg)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.Open(golden)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := testutil.GatherAndCompare(reg, f, simFields...); err != nil {
		t.Error(err)
	}
	// 8 GPUs + 14 MIG devices each report framebuffer.
	if n := testutil.CollectAndCount(c, "DCGM_FI_DEV_FB_USED"); n != 22 {
		t.Errorf("DCGM_FI_DEV_FB_USED series = %d, want 22", n)
	}
}
