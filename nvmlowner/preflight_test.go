package nvmlowner

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner/nvmlapi"
	"github.com/gpu-node-agent/gpu-node-agent/sim"
	"github.com/gpu-node-agent/gpu-node-agent/sim/simtest"
)

func uuidsOf(targets []Target) []string {
	out := make([]string, len(targets))
	for i, t := range targets {
		out[i] = t.UUID
	}
	return out
}

func ok(v uint64) Value { return Value{V: v, Status: OK} }

func TestReadPreflightHealthyH100(t *testing.T) {
	node, o, _, targets := simSampler(t, "dgx-h100", sim.WithMIG(1, "3g.40gb", "3g.40gb"))
	got := o.ReadPreflight(context.Background(), uuidsOf(targets))
	if len(got) != 8 {
		t.Fatalf("%d samples", len(got))
	}
	for i, s := range got {
		if s.UUID != targets[i].UUID || s.Err != nil {
			t.Fatalf("gpu %d: uuid %s err %v", i, s.UUID, s.Err)
		}
		for name, tc := range map[string]struct{ got, want Value }{
			"pcie gen":        {s.PCIeGen, ok(5)},
			"pcie width":      {s.PCIeWidth, ok(16)},
			"pcie max gen":    {s.PCIeMaxGen, ok(5)},
			"pcie max width":  {s.PCIeMaxWidth, ok(16)},
			"persistence":     {s.Persistence, ok(1)},
			"ecc current":     {s.ECCCurrent, ok(1)},
			"ecc pending":     {s.ECCPending, ok(1)},
			"reasons":         {s.ClocksEventReasons, ok(0)},
			"retired pending": {s.RetiredPending, Value{Status: NotSupported}}, // Hopper: row remapping instead
			"fabric state":    {s.FabricState, ok(nvml.GPU_FABRIC_STATE_COMPLETED)},
			"fabric status":   {s.FabricStatus, ok(uint64(nvml.SUCCESS))},
		} {
			if tc.got != tc.want {
				t.Errorf("gpu %d %s = %+v, want %+v", i, name, tc.got, tc.want)
			}
		}
		wantRemap := ok(0)
		if i == 1 {
			// nvml.h nvmlDeviceGetRemappedRows: NOT_SUPPORTED "If MIG is enabled".
			wantRemap = Value{Status: NotSupported}
		}
		if s.RemapPending != wantRemap || s.RemapFailure != wantRemap {
			t.Errorf("gpu %d remap = %+v / %+v, want %+v", i, s.RemapPending, s.RemapFailure, wantRemap)
		}
		if len(s.NVLinks) != 18 {
			t.Errorf("gpu %d: %d nvlinks, want 18", i, len(s.NVLinks))
		}
		for _, l := range s.NVLinks {
			if l.Up != ok(1) {
				t.Errorf("gpu %d nvlink %d: %+v", i, l.Link, l.Up)
			}
		}
	}
	// One lookup of the event reasons symbol, and the new call on R570.
	calls := node.NVMLCalls()
	if calls["Extensions"] != 1 || calls["GetCurrentClocksEventReasons"] != 8 || calls["GetCurrentClocksThrottleReasons"] != 0 {
		t.Errorf("calls: Extensions %d, event reasons %d, throttle reasons %d", calls["Extensions"],
			calls["GetCurrentClocksEventReasons"], calls["GetCurrentClocksThrottleReasons"])
	}
}

func TestReadPreflightFaults(t *testing.T) {
	node, o, _, targets := simSampler(t, "dgx-a100")
	for _, f := range []string{
		`{"kind":"pcie-degraded","gpu":0,"pcieGen":3,"pcieWidth":8}`,
		`{"kind":"ecc-disabled","gpu":1}`,
		`{"kind":"persistence-disabled","gpu":2}`,
		`{"kind":"throttle","gpu":3,"reason":"hw-thermal-slowdown"}`,
		`{"kind":"row-remap-pending","gpu":4}`,
		`{"kind":"nvlink-down","gpu":5,"link":7}`,
		`{"kind":"gpu-lost","gpu":6}`,
		`{"kind":"old-driver","driverVersion":"525.147.05"}`,
	} {
		simtest.Fault(t, node, http.MethodPost, f)
	}
	got := o.ReadPreflight(context.Background(), uuidsOf(targets))
	if g := got[0]; g.PCIeGen != ok(3) || g.PCIeWidth != ok(8) || g.PCIeMaxGen != ok(4) || g.PCIeMaxWidth != ok(16) {
		t.Errorf("degraded link: %+v %+v of %+v %+v", g.PCIeGen, g.PCIeWidth, g.PCIeMaxGen, g.PCIeMaxWidth)
	}
	if g := got[1]; g.ECCCurrent != ok(0) || g.ECCPending != ok(0) {
		t.Errorf("ecc: %+v / %+v", g.ECCCurrent, g.ECCPending)
	}
	if g := got[2]; g.Persistence != ok(0) {
		t.Errorf("persistence: %+v", g.Persistence)
	}
	if g := got[3]; g.ClocksEventReasons != ok(nvml.ClocksThrottleReasonHwThermalSlowdown) {
		t.Errorf("reasons: %+v", g.ClocksEventReasons)
	}
	if g := got[4]; g.RemapPending != ok(1) || g.RemapFailure != ok(0) {
		t.Errorf("remap: %+v / %+v", g.RemapPending, g.RemapFailure)
	}
	if g := got[5]; len(g.NVLinks) != 12 || g.NVLinks[7].Up != ok(0) || g.NVLinks[6].Up != ok(1) {
		t.Errorf("links: %+v", g.NVLinks)
	}
	if g := got[6]; !g.Lost() || g.PCIeGen.Status != Absent {
		t.Errorf("lost gpu: err %v, gen %+v", g.Err, g.PCIeGen)
	}
	if g := got[7]; g.Err != nil || g.PCIeGen != ok(4) {
		t.Errorf("healthy gpu: err %v, gen %+v", g.Err, g.PCIeGen)
	}
	// R525 lacks nvmlDeviceGetCurrentClocksEventReasons: the deprecated
	// name is read instead, never the missing one.
	calls := node.NVMLCalls()
	if calls["GetCurrentClocksEventReasons"] != 0 || calls["GetCurrentClocksThrottleReasons"] != 8 {
		t.Errorf("event reasons %d, throttle reasons %d, want 0 and 8", calls["GetCurrentClocksEventReasons"], calls["GetCurrentClocksThrottleReasons"])
	}
}

// TestReadPreflightHungGPU: a GPU whose calls hang times out alone; the
// others are read in full.
func TestReadPreflightHungGPU(t *testing.T) {
	f := newFakeLib()
	release := make(chan struct{})
	for uuid, d := range f.devs {
		sim.FillUnsupported(d)
		if uuid == "GPU-a" {
			d.GetCurrPcieLinkGenerationFunc = func() (int, nvml.Return) { <-release; return 5, nvml.SUCCESS }
		} else {
			d.GetCurrPcieLinkGenerationFunc = func() (int, nvml.Return) { return 4, nvml.SUCCESS }
		}
	}
	defer close(release)
	o := New(nvmlapi.Wrap(f), Config{CallTimeout: 100 * time.Millisecond}, nil)
	got := o.ReadPreflight(context.Background(), []string{"GPU-a", "GPU-b"})
	if !got[0].TimedOut() {
		t.Errorf("hung GPU: err %v, want a timeout", got[0].Err)
	}
	if b := got[1]; b.Err != nil || b.PCIeGen != ok(4) || b.Persistence.Status != NotSupported || len(b.NVLinks) != 0 {
		t.Errorf("healthy GPU: err %v gen %+v persistence %+v links %d", b.Err, b.PCIeGen, b.Persistence, len(b.NVLinks))
	}
}
