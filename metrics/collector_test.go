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
			collectNow(t, c)

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
			if err := testutil.GatherAndCompare(reg, f, FieldNames("")...); err != nil {
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
	collectNow(t, c)

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
	// It is visible as no data.
	nd := noDataSeries(t, reg)
	if !nd[mn.node.GPUs[2].UUID+"/pcie-replay/not-supported"] || nd[mn.node.GPUs[1].UUID+"/pcie-replay/not-supported"] {
		t.Errorf("nvml_field_unavailable series = %v, want GPU 2's pcie-replay (and not GPU 1's)", nd)
	}
	// H100 mocks report no retired pages: the field is absent for all.
	if got := series(t, reg, "DCGM_FI_DEV_RETIRED_SBE"); len(got) != 0 {
		t.Errorf("DCGM_FI_DEV_RETIRED_SBE served for %v, want omitted", got)
	}
}

// noDataSeries lists the gpu_node_agent_nvml_field_unavailable series as
// "device/field/reason".
func noDataSeries(t *testing.T, reg prometheus.Gatherer) map[string]bool {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	out := map[string]bool{}
	for _, mf := range mfs {
		if mf.GetName() != "gpu_node_agent_nvml_field_unavailable" {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			out[l["device"]+"/"+l["field"]+"/"+l["reason"]] = m.GetGauge().GetValue() == 1
		}
	}
	return out
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
			collectNow(t, c)

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

// TestSlowDeviceDoesNotBlockOthers: a GPU hung inside NVML times out in
// the sampler; the collector serves the other GPUs and counts one error
// per cycle for the hung one.
func TestSlowDeviceDoesNotBlockOthers(t *testing.T) {
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
	// The call timeout is ample for the healthy GPUs even under -race on
	// a loaded machine; only the hung GPU can miss it.
	c, reg := newTestCollectorTimeout(t, mn, Config{}, 2*time.Second)
	slowUUID := mn.node.GPUs[2].UUID

	// A cycle that hangs on GPU 2 finishes with the other GPUs.
	collectNow(t, c)
	<-entered
	util := series(t, reg, "DCGM_FI_DEV_GPU_UTIL")
	if len(util) != 3 || util[slowUUID] != 0 {
		t.Errorf("GPU_UTIL series by UUID = %v, want the 3 responsive GPUs", util)
	}
	if got := testutil.ToFloat64(c.errors.WithLabelValues(slowUUID)); got != 1 {
		t.Errorf("collection errors for slow GPU = %v, want 1", got)
	}

	// The next cycle does not start a second read of the still-hung GPU
	// and counts it again.
	collectNow(t, c)
	select {
	case <-entered:
		t.Error("a second reader was started on a GPU whose read is still running")
	default:
	}
	if got := testutil.ToFloat64(c.errors.WithLabelValues(slowUUID)); got != 2 {
		t.Errorf("collection errors for slow GPU = %v, want 2", got)
	}
	if n := testutil.CollectAndCount(c.errors); n != 1 {
		t.Errorf("collection error series = %d, want only the slow GPU's", n)
	}
}

// TestScrapeAndRefreshDuringHungCycleAnswerFromCache: while the sampler is
// stuck inside NVML, a scrape and a render both return, with the last
// complete cycle's readings.
func TestScrapeAndRefreshDuringHungCycleAnswerFromCache(t *testing.T) {
	mn := newMockNode(t, 4, nil)
	c, reg := newTestCollector(t, mn, Config{})
	collectNow(t, c)

	release := make(chan struct{})
	entered := make(chan struct{})
	mn.devs[2].GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
		close(entered)
		<-release
		return nvml.Utilization{Gpu: 99}, nvml.SUCCESS
	}
	done := make(chan struct{})
	go func() { c.sampler.SampleNow(context.Background()); close(done) }()
	<-entered
	// The cycle is now blocked inside NVML; neither path may be.
	c.Refresh(context.Background())
	if util := series(t, reg, "DCGM_FI_DEV_GPU_UTIL"); len(util) != 4 {
		t.Errorf("scrape during hung cycle: GPU_UTIL series = %v, want the 4 cached", util)
	}
	close(release)
	<-done
}

// TestSetNodeRelabelsWithoutResampling: the topology decides what is
// served; a sample of a GPU no longer in the node is dropped at the next
// render, with no new sampling cycle.
func TestSetNodeRelabelsWithoutResampling(t *testing.T) {
	mn := newMockNode(t, 4, nil)
	c, reg := newTestCollector(t, mn, Config{})
	collectNow(t, c)
	if n := len(series(t, reg, "DCGM_FI_DEV_GPU_TEMP")); n != 4 {
		t.Fatalf("GPU_TEMP series = %d, want 4", n)
	}
	smaller := *mn.node
	smaller.GPUs = smaller.GPUs[:2]
	c.SetNode(&smaller)
	c.Refresh(context.Background())
	if n := len(series(t, reg, "DCGM_FI_DEV_GPU_TEMP")); n != 2 {
		t.Errorf("GPU_TEMP series after SetNode = %d, want 2", n)
	}
}

// TestSetNodeForgetsGoneGPUs: a GPU that leaves the node (SetNode, then the
// next render) takes its failing mark and collection-error series with it;
// the GPUs that stay keep theirs, and a re-render of the same sampling
// cycle counts no second error.
func TestSetNodeForgetsGoneGPUs(t *testing.T) {
	mn := newMockNode(t, 3, nil)
	for _, i := range []int{1, 2} {
		mn.devs[i].GetPowerUsageFunc = func() (uint32, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
	}
	c, _ := newTestCollector(t, mn, Config{})
	collectNow(t, c)
	gone, kept := mn.node.GPUs[2].UUID, mn.node.GPUs[1].UUID
	if n := testutil.CollectAndCount(c.errors); n != 2 {
		t.Fatalf("collection error series = %d, want 2 (GPUs 1 and 2)", n)
	}

	smaller := *mn.node
	smaller.GPUs = smaller.GPUs[:2]
	c.SetNode(&smaller)
	c.Refresh(context.Background()) // same cycle, new topology
	if got := testutil.ToFloat64(c.errors.WithLabelValues(kept)); got != 1 {
		t.Errorf("collection errors for GPU 1 after re-rendering the same cycle = %v, want 1", got)
	}
	collectNow(t, c)

	c.mu.Lock()
	defer c.mu.Unlock()
	if c.failing[gone] || c.errSeries[gone] {
		t.Errorf("state kept for gone GPU %s: failing %v, errSeries %v", gone, c.failing, c.errSeries)
	}
	if !c.failing[kept] || !c.errSeries[kept] {
		t.Errorf("failing %v, errSeries %v: want GPU 1 still failing", c.failing, c.errSeries)
	}
	if n := testutil.CollectAndCount(c.errors); n != 1 {
		t.Errorf("collection error series after SetNode = %d, want only GPU 1's", n)
	}
	if got := testutil.ToFloat64(c.errors.WithLabelValues(kept)); got != 2 {
		t.Errorf("collection errors for GPU 1 = %v, want 2 (one per cycle)", got)
	}
}

// TestRunRendersAfterEachCycleAndSetNode runs the collector as the agent
// does: it renders when the sampler publishes a cycle and when the node
// changes, and stops with its context.
func TestRunRendersAfterEachCycleAndSetNode(t *testing.T) {
	mn := newMockNode(t, 2, nil)
	c, reg := newTestCollector(t, mn, Config{})
	rendered := make(chan struct{})
	c.rendered = func() { rendered <- struct{}{} }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	// waitFor waits for renders until temps GPU_TEMP series are served.
	waitFor := func(temps int) {
		t.Helper()
		timeout := time.After(time.Minute) // a deadlock guard, not a timing assertion
		for {
			select {
			case <-rendered:
			case <-timeout:
				t.Fatalf("no render with %d GPU_TEMP series", temps)
			}
			if len(series(t, reg, "DCGM_FI_DEV_GPU_TEMP")) == temps {
				return
			}
		}
	}
	<-rendered // at start: nothing sampled yet
	if n := len(series(t, reg, "DCGM_FI_DEV_GPU_TEMP")); n != 0 {
		t.Errorf("GPU_TEMP series before the first cycle = %d, want 0", n)
	}
	c.sampler.SampleNow(ctx)
	waitFor(2)
	smaller := *mn.node
	smaller.GPUs = smaller.GPUs[:1]
	c.SetNode(&smaller)
	waitFor(1)

	cancel()
	// Drain a render racing with the cancellation.
	for {
		select {
		case <-rendered:
			continue
		case err := <-done:
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
		}
		break
	}
}
