package metrics

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner/nvmlapi"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// mockNode is a DGX H100 from go-nvml's mock server with fixed UUIDs and
// fixed readings, and the topology.Node describing it. MIG devices are
// plain mock devices returned by their parent's GetMigDeviceHandleByIndex.
type mockNode struct {
	lib  *server.Server
	node *topology.Node
	devs []*server.Device
}

// migLayout lists, per GPU index, the MIG profiles configured on it.
type migLayout map[int][]string

var migMemMiB = map[string]uint64{"1g.10gb": 9856, "2g.20gb": 19968, "3g.40gb": 40192, "4g.40gb": 40192, "7g.80gb": 80896}

func newMockNode(tb testing.TB, gpus int, layout migLayout) *mockNode {
	tb.Helper()
	lib := dgxh100.New()
	lib.Devices = lib.Devices[:gpus]
	mn := &mockNode{lib: lib, node: &topology.Node{Host: topology.Host{DriverVersion: "570.172.08", CUDADriverVersion: 12080}}}
	for i, d := range lib.Devices {
		dev := d.(*server.Device)
		dev.UUID = fmt.Sprintf("GPU-00000000-0000-0000-0000-%012d", i)
		setReadings(dev, i)
		g := topology.GPU{
			Index: i, UUID: dev.UUID, PCIBusID: dev.PciBusID, Minor: dev.Minor,
			Model: dev.Config.Name, MemoryMiB: dev.Config.MemoryMB, MIGCapable: true,
		}
		var migs []nvml.Device
		for j, profile := range layout[i] {
			m := topology.MIGDevice{
				UUID:        fmt.Sprintf("MIG-00000000-0000-0000-%04d-%012d", i, j),
				Profile:     profile,
				GPUInstance: j + 1, ComputeInstance: 0, Index: j,
				MemoryMiB: migMemMiB[profile],
			}
			g.MIGEnabled = true
			g.MIG = append(g.MIG, m)
			used := uint64(64+j*512) * mib
			total := m.MemoryMiB * mib
			uuid := m.UUID
			migs = append(migs, &mock.Device{
				// The sampler checks that the MIG index still holds
				// the device discovery saw.
				GetUUIDFunc: func() (string, nvml.Return) { return uuid, nvml.SUCCESS },
				GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) {
					return nvml.Memory{Total: total, Used: used, Free: total - used}, nvml.SUCCESS
				},
			})
		}
		dev.GetMigDeviceHandleByIndexFunc = func(n int) (nvml.Device, nvml.Return) {
			if n < 0 || n >= len(migs) {
				return nil, nvml.ERROR_INVALID_ARGUMENT
			}
			return migs[n], nvml.SUCCESS
		}
		if g.MIGEnabled {
			// MIG mode: NVML reports no whole-GPU utilisation.
			dev.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
				return nvml.Utilization{}, nvml.ERROR_NOT_SUPPORTED
			}
		}
		mn.node.GPUs = append(mn.node.GPUs, g)
		mn.devs = append(mn.devs, dev)
	}
	return mn
}

// setReadings gives device i fixed, distinct readings for every NVML call
// the sampler makes. H100s have row remapping, not page retirement, so
// the retired-page calls answer ERROR_NOT_SUPPORTED as real H100s do.
func setReadings(d *server.Device, i int) {
	u := uint32(i)
	d.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
		return nvml.Utilization{Gpu: 10 + u, Memory: 5 + u}, nvml.SUCCESS
	}
	d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
		total := d.Config.MemoryMB * mib
		used := uint64(1024*(i+1)) * mib
		return nvml.Memory{Total: total, Used: used, Free: total - used}, nvml.SUCCESS
	}
	d.GetClockInfoFunc = func(t nvml.ClockType) (uint32, nvml.Return) {
		switch t {
		case nvml.CLOCK_SM:
			return 1980 - 10*u, nvml.SUCCESS
		case nvml.CLOCK_MEM:
			return 2619, nvml.SUCCESS
		}
		return 0, nvml.ERROR_INVALID_ARGUMENT
	}
	d.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) { return 40 + u, nvml.SUCCESS }
	d.GetPowerUsageFunc = func() (uint32, nvml.Return) { return 100500 + 1000*u, nvml.SUCCESS }
	d.GetTotalEnergyConsumptionFunc = func() (uint64, nvml.Return) { return 123456789 + uint64(i), nvml.SUCCESS }
	d.GetPcieReplayCounterFunc = func() (int, nvml.Return) { return i, nvml.SUCCESS }
	// Idle GPUs report GpuIdle; GPU 1 is held at its power cap.
	reasons := uint64(nvml.ClocksEventReasonGpuIdle)
	if i == 1 {
		reasons = nvml.ClocksEventReasonSwPowerCap
	}
	d.GetCurrentClocksEventReasonsFunc = func() (uint64, nvml.Return) { return reasons, nvml.SUCCESS }
	d.GetCurrentClocksThrottleReasonsFunc = d.GetCurrentClocksEventReasonsFunc
	d.GetFieldValuesFunc = func(fvs []nvml.FieldValue) nvml.Return {
		for k := range fvs {
			switch fvs[k].FieldId {
			case nvml.FI_DEV_MEMORY_TEMP:
				setFieldUint(&fvs[k], uint64(50+i))
			case nvml.FI_DEV_NVLINK_BANDWIDTH_C0_TOTAL:
				setFieldUint(&fvs[k], uint64(1000000*(i+1)))
			default:
				fvs[k].NvmlReturn = uint32(nvml.ERROR_NOT_SUPPORTED)
			}
		}
		return nvml.SUCCESS
	}
	d.GetTotalEccErrorsFunc = func(t nvml.MemoryErrorType, c nvml.EccCounterType) (uint64, nvml.Return) {
		return uint64(i)*10 + uint64(t)*2 + uint64(c), nvml.SUCCESS
	}
	d.GetRetiredPagesFunc = func(nvml.PageRetirementCause) ([]uint64, nvml.Return) { return nil, nvml.ERROR_NOT_SUPPORTED }
	d.GetRetiredPagesPendingStatusFunc = func() (nvml.EnableState, nvml.Return) {
		return nvml.FEATURE_DISABLED, nvml.ERROR_NOT_SUPPORTED
	}
	d.GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) { return i % 3, i % 2, false, i == 7, nvml.SUCCESS }
	d.GetEncoderUtilizationFunc = func() (uint32, uint32, nvml.Return) { return u / 10, 166667, nvml.SUCCESS }
	d.GetDecoderUtilizationFunc = func() (uint32, uint32, nvml.Return) { return u / 5, 166667, nvml.SUCCESS }
	d.GetMemoryInfo_v2Func = func() (nvml.Memory_v2, nvml.Return) {
		return nvml.Memory_v2{Total: 80 << 30, Reserved: 583 * mib}, nvml.SUCCESS
	}
	d.GetGridLicensableFeaturesFunc = func() (nvml.GridLicensableFeatures, nvml.Return) {
		return nvml.GridLicensableFeatures{}, nvml.SUCCESS
	}
	// Read by the sampler for health, not served as DCGM metrics.
	d.GetEccModeFunc = func() (nvml.EnableState, nvml.EnableState, nvml.Return) {
		return nvml.FEATURE_ENABLED, nvml.FEATURE_ENABLED, nvml.SUCCESS
	}
	d.GetGpuFabricInfoFunc = func() (nvml.GpuFabricInfo, nvml.Return) {
		return nvml.GpuFabricInfo{State: nvml.GPU_FABRIC_STATE_COMPLETED}, nvml.SUCCESS
	}
	d.GetNvLinkStateFunc = func(int) (nvml.EnableState, nvml.Return) { return nvml.FEATURE_DISABLED, nvml.ERROR_NOT_SUPPORTED }
	// No processes (read by the sampler for the usage tracker).
	noProcesses := func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.SUCCESS }
	d.GetComputeRunningProcessesFunc = noProcesses
	d.GetGraphicsRunningProcessesFunc = noProcesses
}

func setFieldUint(fv *nvml.FieldValue, v uint64) {
	fv.ValueType = uint32(nvml.VALUE_TYPE_UNSIGNED_LONG_LONG)
	fv.NvmlReturn = uint32(nvml.SUCCESS)
	for b := range 8 {
		fv.Value[b] = byte(v >> (8 * b)) // little-endian, as on amd64/arm64
	}
}

// fakeXIDs is an XIDSource with fixed last XIDs.
type fakeXIDs map[string]uint64

func (f fakeXIDs) LastXID(uuid string) (uint64, bool) {
	x, ok := f[uuid]
	return x, ok
}

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// testLogger logs to the test's output, so a failed read explains itself.
func testLogger(tb testing.TB) *slog.Logger { return slog.New(slog.NewTextHandler(tb.Output(), nil)) }

// patientTimeout is the NVML call timeout of tests that don't test
// timeouts: no loaded CI machine can hit it, so what they assert never
// depends on how fast the machine is.
const patientTimeout = time.Minute

// newSampler initialises lib (go-nvml's mocks, as the real library through
// nvmlapi.Wrap) through an NVML owner with call timeout callTimeout and
// returns a sampler targeting node's GPUs and MIG devices. Tests drive it
// with SampleNow, never Run, so cycles are deterministic.
func newSampler(tb testing.TB, lib nvml.Interface, node *topology.Node, callTimeout time.Duration) *nvmlowner.Sampler {
	tb.Helper()
	return newLibSampler(tb, nvmlapi.Wrap(lib), node, callTimeout)
}

// newLibSampler is newSampler over the agent's NVML interface (a simulated
// node's).
func newLibSampler(tb testing.TB, lib nvmlowner.Library, node *topology.Node, callTimeout time.Duration) *nvmlowner.Sampler {
	tb.Helper()
	owner := nvmlowner.New(lib, nvmlowner.Config{CallTimeout: callTimeout}, discardLogger())
	if err := owner.Init(context.Background()); err != nil {
		tb.Fatalf("nvml init: %v", err)
	}
	s := nvmlowner.NewSampler(owner, nvmlowner.SamplerConfig{Interval: time.Hour})
	s.SetTargets(nvmlowner.TargetsOf(node))
	return s
}

// newTestCollector registers a collector for mn, over a sampler with a
// patient call timeout, on a fresh registry.
func newTestCollector(tb testing.TB, mn *mockNode, cfg Config) (*Collector, *prometheus.Registry) {
	tb.Helper()
	return newTestCollectorTimeout(tb, mn, cfg, patientTimeout)
}

// newTestCollectorTimeout is newTestCollector with the NVML call timeout
// callTimeout.
func newTestCollectorTimeout(tb testing.TB, mn *mockNode, cfg Config, callTimeout time.Duration) (*Collector, *prometheus.Registry) {
	tb.Helper()
	reg := prometheus.NewRegistry()
	if cfg.Hostname == "" {
		cfg.Hostname = "node-1"
	}
	c, err := NewCollector(newSampler(tb, mn.lib, mn.node, callTimeout), cfg, reg, testLogger(tb))
	if err != nil {
		tb.Fatalf("NewCollector: %v", err)
	}
	c.SetNode(mn.node)
	return c, reg
}

// collectNow runs one sampling cycle and renders it.
func collectNow(tb testing.TB, c *Collector) {
	tb.Helper()
	if c.sampler.SampleNow(context.Background()) == nil {
		tb.Fatal("sampling cycle did not complete")
	}
	c.Refresh(context.Background())
}
