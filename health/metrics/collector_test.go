package metrics

import (
	"context"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"
)

var update = flag.Bool("update", false, "rewrite testdata/*.prom golden files")

// gather renders reg in the text exposition format.
func gather(t *testing.T, reg prometheus.Gatherer) string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	var b strings.Builder
	for _, mf := range mfs {
		if _, err := expfmt.MetricFamilyToText(&b, mf); err != nil {
			t.Fatalf("encode %s: %v", mf.GetName(), err)
		}
	}
	return b.String()
}

func TestGolden(t *testing.T) {
	tests := []struct {
		name   string
		gpus   int
		layout migLayout
		cfg    Config
		setup  func(*mockNode)
	}{
		{
			name: "dgx-h100",
			gpus: 8,
			cfg:  Config{XIDs: fakeXIDs{"GPU-00000000-0000-0000-0000-000000000003": 79}},
		},
		{
			name:   "dgx-h100-mig",
			gpus:   2,
			layout: migLayout{1: {"3g.40gb", "2g.20gb", "1g.10gb"}},
		},
		{
			name: "unsupported-fields",
			gpus: 2,
			setup: func(mn *mockNode) {
				// GPU 1 has no ECC, no NVLink counter and no memory sensor.
				d := mn.devs[1]
				d.GetTotalEccErrorsFunc = func(nvml.MemoryErrorType, nvml.EccCounterType) (uint64, nvml.Return) {
					return 0, nvml.ERROR_NOT_SUPPORTED
				}
				d.GetFieldValuesFunc = func(fvs []nvml.FieldValue) nvml.Return {
					for k := range fvs {
						fvs[k].NvmlReturn = uint32(nvml.ERROR_NOT_SUPPORTED)
					}
					return nvml.SUCCESS
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mn := newMockNode(t, tt.gpus, tt.layout)
			if tt.setup != nil {
				tt.setup(mn)
			}
			c, reg := newTestCollector(t, mn, tt.cfg)
			c.CollectNow(context.Background())

			golden := filepath.Join("testdata", tt.name+".prom")
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
			if err := testutil.GatherAndCompare(reg, f, FieldNames()...); err != nil {
				t.Error(err)
			}
		})
	}
}

// series counts the samples of one metric per UUID label.
func series(t *testing.T, reg prometheus.Gatherer, name string) map[string]int {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	out := map[string]int{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == labelUUID || (l.GetName() == "device" && !strings.HasPrefix(l.GetValue(), "nvidia")) {
					out[l.GetValue()]++
				}
			}
		}
	}
	return out
}

func TestUnsupportedFieldIsOmittedNotZero(t *testing.T) {
	mn := newMockNode(t, 3, nil)
	mn.devs[2].GetPcieReplayCounterFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
	c, reg := newTestCollector(t, mn, Config{})
	c.CollectNow(context.Background())

	got := series(t, reg, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER")
	for i, want := range []int{1, 1, 0} {
		if got[mn.node.GPUs[i].UUID] != want {
			t.Errorf("GPU %d: %d PCIe replay series, want %d", i, got[mn.node.GPUs[i].UUID], want)
		}
	}
	// Not supported is not a failure.
	if n := testutil.CollectAndCount(c.errors); n != 0 {
		t.Errorf("collection errors recorded for an unsupported field: %d series", n)
	}
	// H100 mocks report no retired pages: the field is absent for all.
	if got := series(t, reg, "DCGM_FI_DEV_RETIRED_SBE"); len(got) != 0 {
		t.Errorf("DCGM_FI_DEV_RETIRED_SBE served for %v, want omitted", got)
	}
}

func TestFailingDeviceDoesNotHideOthers(t *testing.T) {
	tests := []struct {
		name   string
		break_ func(mn *mockNode)
		// wantTemp is whether the broken GPU still reports its temperature.
		wantTemp bool
	}{
		{
			name: "gpu lost",
			break_: func(mn *mockNode) {
				mn.devs[1].GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) {
					return 0, nvml.ERROR_GPU_IS_LOST
				}
			},
		},
		{
			name: "handle lookup fails",
			break_: func(mn *mockNode) {
				lookup := mn.lib.DeviceGetHandleByUUIDFunc
				mn.lib.DeviceGetHandleByUUIDFunc = func(uuid string) (nvml.Device, nvml.Return) {
					if uuid == mn.node.GPUs[1].UUID {
						return nil, nvml.ERROR_UNKNOWN
					}
					return lookup(uuid)
				}
			},
		},
		{
			name: "unimplemented call panics",
			break_: func(mn *mockNode) {
				mn.devs[1].GetTemperatureFunc = nil // mock panics when called
			},
		},
		{
			name: "other field fails",
			break_: func(mn *mockNode) {
				mn.devs[1].GetPowerUsageFunc = func() (uint32, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
			},
			wantTemp: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mn := newMockNode(t, 3, nil)
			tt.break_(mn)
			c, reg := newTestCollector(t, mn, Config{})
			c.CollectNow(context.Background())

			temps := series(t, reg, "DCGM_FI_DEV_GPU_TEMP")
			for _, i := range []int{0, 2} {
				if temps[mn.node.GPUs[i].UUID] != 1 {
					t.Errorf("healthy GPU %d lost its readings: %v", i, temps)
				}
			}
			if got := temps[mn.node.GPUs[1].UUID] == 1; got != tt.wantTemp {
				t.Errorf("broken GPU temperature served = %v, want %v", got, tt.wantTemp)
			}
			if got := testutil.ToFloat64(c.errors.WithLabelValues(mn.node.GPUs[1].UUID)); got != 1 {
				t.Errorf("collection errors for broken GPU = %v, want 1", got)
			}
			if n := testutil.CollectAndCount(c.errors); n != 1 {
				t.Errorf("collection error series = %d, want only the broken GPU", n)
			}
		})
	}
}

func TestSlowDeviceDoesNotBlockOthersOrTheScrape(t *testing.T) {
	mn := newMockNode(t, 4, nil)
	release := make(chan struct{})
	entered := make(chan struct{}, 4)
	slow := mn.devs[2]
	slow.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
		entered <- struct{}{}
		<-release // a hung driver call
		return nvml.Utilization{Gpu: 99}, nvml.SUCCESS
	}
	defer close(release)
	// The timeout is ample for the healthy GPUs even under -race on a
	// loaded machine; only the hung GPU can miss it.
	c, reg := newTestCollector(t, mn, Config{DeviceTimeout: time.Second})
	slowUUID := mn.node.GPUs[2].UUID

	// A collection cycle that hangs on GPU 2 finishes with the other GPUs.
	c.CollectNow(context.Background())
	<-entered
	util := series(t, reg, "DCGM_FI_DEV_GPU_UTIL")
	if len(util) != 3 || util[slowUUID] != 0 {
		t.Errorf("GPU_UTIL series by UUID = %v, want the 3 responsive GPUs", util)
	}
	if got := testutil.ToFloat64(c.errors.WithLabelValues(slowUUID)); got != 1 {
		t.Errorf("collection errors for slow GPU = %v, want 1", got)
	}

	// The next cycle skips the still-hung GPU instead of piling up readers.
	c.CollectNow(context.Background())
	select {
	case <-entered:
		t.Error("a second reader was started on a GPU whose read is still running")
	default:
	}
	if got := testutil.ToFloat64(c.errors.WithLabelValues(slowUUID)); got != 2 {
		t.Errorf("collection errors for slow GPU = %v, want 2", got)
	}

}

func TestScrapeDuringHungCollectionAnswersFromCache(t *testing.T) {
	mn := newMockNode(t, 4, nil)
	c, reg := newTestCollector(t, mn, Config{Interval: time.Hour, DeviceTimeout: time.Hour})
	c.CollectNow(context.Background())

	release := make(chan struct{})
	entered := make(chan struct{})
	mn.devs[2].GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
		close(entered)
		<-release
		return nvml.Utilization{Gpu: 99}, nvml.SUCCESS
	}
	done := make(chan struct{})
	go func() { c.CollectNow(context.Background()); close(done) }()
	<-entered
	// The collection is now blocked inside NVML; the scrape must not be.
	if util := series(t, reg, "DCGM_FI_DEV_GPU_UTIL"); len(util) != 4 {
		t.Errorf("scrape during hung collection: GPU_UTIL series = %v, want the 4 cached", util)
	}
	close(release)
	<-done
}

func TestSetNodeReplacesDevices(t *testing.T) {
	mn := newMockNode(t, 4, nil)
	c, reg := newTestCollector(t, mn, Config{})
	c.CollectNow(context.Background())
	if n := len(series(t, reg, "DCGM_FI_DEV_GPU_TEMP")); n != 4 {
		t.Fatalf("GPU_TEMP series = %d, want 4", n)
	}
	smaller := *mn.node
	smaller.GPUs = smaller.GPUs[:2]
	c.SetNode(&smaller)
	c.CollectNow(context.Background())
	if n := len(series(t, reg, "DCGM_FI_DEV_GPU_TEMP")); n != 2 {
		t.Errorf("GPU_TEMP series after SetNode = %d, want 2", n)
	}
}

// TestSetNodeForgetsGoneGPUs: a GPU that leaves the node (SetNode, then the
// next collection) takes its busy flag, failing mark and collection-error
// series with it; the GPUs that stay keep theirs.
func TestSetNodeForgetsGoneGPUs(t *testing.T) {
	mn := newMockNode(t, 3, nil)
	for _, i := range []int{1, 2} {
		mn.devs[i].GetPowerUsageFunc = func() (uint32, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
	}
	c, _ := newTestCollector(t, mn, Config{})
	c.CollectNow(context.Background())
	gone, kept := mn.node.GPUs[2].UUID, mn.node.GPUs[1].UUID
	if n := testutil.CollectAndCount(c.errors); n != 2 {
		t.Fatalf("collection error series = %d, want 2 (GPUs 1 and 2)", n)
	}

	smaller := *mn.node
	smaller.GPUs = smaller.GPUs[:2]
	c.SetNode(&smaller)
	c.CollectNow(context.Background())

	c.collect.Lock()
	defer c.collect.Unlock()
	if _, ok := c.busy[gone]; ok {
		t.Errorf("busy flag kept for gone GPU %s", gone)
	}
	if c.failing[gone] {
		t.Errorf("failing mark kept for gone GPU %s", gone)
	}
	if len(c.busy) != 2 || !c.failing[kept] {
		t.Errorf("busy %v, failing %v: want GPUs 0 and 1 kept, GPU 1 still failing", c.busy, c.failing)
	}
	if n := testutil.CollectAndCount(c.errors); n != 1 {
		t.Errorf("collection error series after SetNode = %d, want only GPU 1's", n)
	}
	if got := testutil.ToFloat64(c.errors.WithLabelValues(kept)); got != 2 {
		t.Errorf("collection errors for GPU 1 = %v, want 2 (one per collection)", got)
	}
}

func TestRunCollectsUntilCancelled(t *testing.T) {
	mn := newMockNode(t, 2, nil)
	c, reg := newTestCollector(t, mn, Config{Interval: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	// Run collects at once; wait for the first snapshot via the histogram.
	for testutil.CollectAndCount(c.duration) == 0 || histogramCount(t, reg) == 0 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if n := len(series(t, reg, "DCGM_FI_DEV_GPU_TEMP")); n != 2 {
		t.Errorf("GPU_TEMP series = %d, want 2", n)
	}
}

func histogramCount(t *testing.T, reg prometheus.Gatherer) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "gpu_node_agent_collection_duration_seconds" {
			return mf.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	return 0
}
