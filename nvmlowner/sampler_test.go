package nvmlowner

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner/nvmlapi"
	"github.com/gpu-node-agent/gpu-node-agent/sim"
	"github.com/gpu-node-agent/gpu-node-agent/sim/simtest"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

func simSampler(t testing.TB, profile string, opts ...sim.ProfileOption) (*sim.Node, *Owner, *Sampler, []Target) {
	t.Helper()
	spec, err := sim.Profile(profile, opts...)
	if err != nil {
		t.Fatal(err)
	}
	node, err := sim.New(spec, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	o := New(node.NVML(), Config{CallTimeout: 2 * time.Second}, nil)
	if err := o.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = o.Shutdown(context.Background()) })
	targets := TargetsOf(node.Spec())
	s := NewSampler(o, SamplerConfig{Interval: time.Hour})
	s.SetTargets(targets)
	return node, o, s, targets
}

func TestSamplerReadsEveryGPU(t *testing.T) {
	_, _, s, targets := simSampler(t, "dgx-h100", sim.WithMIG(1, "3g.40gb", "3g.40gb"))
	sub := s.Subscribe()
	snap := s.SampleNow(context.Background())
	select {
	case <-sub:
	default:
		t.Fatal("subscribers not signalled after a cycle")
	}
	if s.Latest() != snap || snap.Seq != 1 || snap.LibErr != nil {
		t.Fatalf("latest %p seq %d libErr %v", s.Latest(), snap.Seq, snap.LibErr)
	}
	if len(snap.Samples) != len(targets) {
		t.Fatalf("%d samples for %d targets", len(snap.Samples), len(targets))
	}
	for i, smp := range snap.Samples {
		if smp.UUID != targets[i].UUID || smp.Err != nil {
			t.Fatalf("sample %d: uuid %s err %v", i, smp.UUID, smp.Err)
		}
		for _, f := range []Field{FieldPowerUsage, FieldGPUTemp, FieldECCDBEVolatile, FieldFBTotal, FieldTotalEnergy} {
			if smp.Values[f].Status != OK {
				t.Errorf("gpu %d %s: status %d, want OK", i, f, smp.Values[f].Status)
			}
		}
		if len(smp.Links) != 18 {
			t.Errorf("gpu %d: %d nvlinks, want 18 (DGX H100)", i, len(smp.Links))
		}
		if len(smp.MIG) != len(targets[i].MIG) {
			t.Errorf("gpu %d: %d MIG samples, want %d", i, len(smp.MIG), len(targets[i].MIG))
		}
		for _, m := range smp.MIG {
			if m.FBUsed.Status != OK {
				t.Errorf("mig %s: fb used status %d", m.UUID, m.FBUsed.Status)
			}
		}
	}
	// GPU 1 has MIG on: NVML has no whole-GPU utilisation then.
	if st := snap.Samples[1].Values[FieldGPUUtil].Status; st != NotSupported {
		t.Errorf("MIG-enabled GPU utilisation status %d, want NotSupported", st)
	}
}

func TestSamplerLostGPU(t *testing.T) {
	node, _, s, _ := simSampler(t, "dgx-a100")
	simtest.Fault(t, node, http.MethodPost, `{"kind":"gpu-lost","gpu":2}`)
	snap := s.SampleNow(context.Background())
	for i, smp := range snap.Samples {
		if lost := smp.Lost(); lost != (i == 2) {
			t.Errorf("gpu %d: lost %v (err %v)", i, lost, smp.Err)
		}
	}
}

// TestSamplerHungGPU: a GPU whose calls hang times out in its own sample;
// the other GPUs' samples are complete, and the cycle ends.
func TestSamplerHungGPU(t *testing.T) {
	f := newFakeLib()
	release := make(chan struct{})
	for uuid, d := range f.devs {
		sim.FillUnsupported(d)
		if uuid == "GPU-a" {
			d.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) { <-release; return nvml.Utilization{}, nvml.SUCCESS }
		} else {
			d.GetPowerUsageFunc = func() (uint32, nvml.Return) { return 300000, nvml.SUCCESS }
		}
	}
	defer close(release)
	o := New(nvmlapi.Wrap(f), Config{CallTimeout: 100 * time.Millisecond}, nil)
	s := NewSampler(o, SamplerConfig{})
	s.SetTargets([]Target{{UUID: "GPU-a"}, {UUID: "GPU-b"}})
	snap := s.SampleNow(context.Background())
	if !snap.Samples[0].TimedOut() {
		t.Errorf("hung GPU sample: err %v, want a timeout", snap.Samples[0].Err)
	}
	if b := snap.Samples[1]; b.Err != nil || b.Values[FieldPowerUsage] != (Value{V: 300000, Status: OK}) {
		t.Errorf("healthy GPU sample: err %v power %+v", b.Err, b.Values[FieldPowerUsage])
	}
	if st := snap.Samples[1].Values[FieldRemapPending].Status; st != NotSupported {
		t.Errorf("unsupported call: status %d, want NotSupported", st)
	}
	// The next cycle does not start a second read of the hung GPU.
	snap = s.SampleNow(context.Background())
	if !snap.Samples[0].TimedOut() || snap.Samples[1].Err != nil {
		t.Errorf("second cycle: %v / %v", snap.Samples[0].Err, snap.Samples[1].Err)
	}
}

func TestSamplerLibraryFailure(t *testing.T) {
	node, _, s, _ := simSampler(t, "dgx-a100")
	simtest.Fault(t, node, http.MethodPost, `{"kind":"nvml-failure"}`)
	snap := s.SampleNow(context.Background())
	if snap.LibErr == nil {
		t.Fatal("no library error while NVML fails")
	}
	for _, smp := range snap.Samples {
		if smp.Err == nil {
			t.Fatalf("sample %s has no error while the library fails", smp.UUID)
		}
	}
}

// TestSamplerMIGLayoutChanged: after a MIG reconfiguration the sampler has
// not been told of (a real node gives no signal), a MIG handle index holds
// another device: its readings must not carry the old UUID, and a
// rediscovery is asked for.
func TestSamplerMIGLayoutChanged(t *testing.T) {
	node, _, s, _ := simSampler(t, "dgx-h100", sim.WithMIG(1, "3g.40gb", "3g.40gb"))
	if snap := s.SampleNow(context.Background()); snap.Samples[1].MIGChanged {
		t.Fatal("layout reported changed before any change")
	}
	if err := node.SetMIGLayout(1, []string{"1g.10gb", "1g.10gb"}); err != nil {
		t.Fatal(err)
	}
	snap := s.SampleNow(context.Background())
	gpu1 := snap.Samples[1]
	if !gpu1.MIGChanged {
		t.Fatal("a new MIG layout not noticed")
	}
	for _, m := range gpu1.MIG {
		if m.FBUsed.Status == OK {
			t.Errorf("MIG %s still read after the layout changed", m.UUID)
		}
	}
	select {
	case <-s.LayoutChanged():
	default:
		t.Fatal("no rediscovery asked for")
	}
}

// TestSamplerBlackwellRecoveries: on Blackwell the DL error counters are
// NOT_SUPPORTED, and the NVLink5 recovery event count is read per link.
func TestSamplerBlackwellRecoveries(t *testing.T) {
	_, _, s, _ := simSampler(t, "dgx-b200")
	snap := s.SampleNow(context.Background())
	for _, smp := range snap.Samples {
		if len(smp.Links) != 18 {
			t.Fatalf("%s: %d links, want 18", smp.UUID, len(smp.Links))
		}
		for _, l := range smp.Links {
			if l.Counters[0].Status != NotSupported || l.Recoveries.Status != OK {
				t.Fatalf("%s link %d: DL counter status %d, recoveries status %d; want NotSupported and OK",
					smp.UUID, l.Link, l.Counters[0].Status, l.Recoveries.Status)
			}
		}
	}
}

// TestSamplerSnapshotsInOrder: a consumer of Snapshots sees every cycle in
// order while it keeps up, and the newest ones when it falls behind.
func TestSamplerSnapshotsInOrder(t *testing.T) {
	_, _, s, _ := simSampler(t, "pcie-8gpu")
	q := s.Snapshots(3)
	for range 5 {
		s.SampleNow(context.Background())
	}
	var seqs []uint64
	for range 3 {
		seqs = append(seqs, (<-q).Seq)
	}
	if fmt.Sprint(seqs) != "[3 4 5]" {
		t.Fatalf("a consumer 2 behind got %v, want the newest three [3 4 5]", seqs)
	}
	s.SampleNow(context.Background())
	if got := (<-q).Seq; got != 6 {
		t.Fatalf("next snapshot %d, want 6", got)
	}
}

func TestTargetsOf(t *testing.T) {
	n := &topology.Node{GPUs: []topology.GPU{
		{UUID: "GPU-a"},
		{UUID: "GPU-b", MIGEnabled: true, MIG: []topology.MIGDevice{
			{UUID: "MIG-b0", Index: 0, GPUInstance: 1}, {UUID: "MIG-b2", Index: 2, GPUInstance: 7, ComputeInstance: 1}}},
	}}
	got := TargetsOf(n)
	want := []Target{
		{UUID: "GPU-a"},
		{UUID: "GPU-b", MIG: []MIGTarget{{UUID: "MIG-b0", Index: 0, GPUInstance: 1}, {UUID: "MIG-b2", Index: 2, GPUInstance: 7, ComputeInstance: 1}}},
	}
	if !slices.EqualFunc(got, want, func(a, b Target) bool {
		return a.UUID == b.UUID && slices.Equal(a.MIG, b.MIG)
	}) {
		t.Errorf("TargetsOf = %+v, want %+v", got, want)
	}
	if got := TargetsOf(nil); got != nil {
		t.Errorf("TargetsOf(nil) = %+v, want nil", got)
	}
}

// TestSamplerReadsClocksEventReasons: every sample carries the GPU's clocks
// event reasons (nvml.h nvmlDeviceGetCurrentClocksEventReasons, a bitmask
// of nvmlClocksEventReason*), through the R535 call where the driver
// exports it and the deprecated throttle-reasons call where it does not
// (calling a symbol the driver lacks would end the process).
func TestSamplerReadsClocksEventReasons(t *testing.T) {
	for _, tc := range []struct {
		name          string
		faults        []string
		event, legacy uint64 // calls of each per cycle
	}{
		{"R570", nil, 8, 0},
		{"R525 lacks the R535 call", []string{`{"kind":"old-driver","driverVersion":"525.147.05"}`}, 0, 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node, _, s, _ := simSampler(t, "dgx-h100")
			simtest.Fault(t, node, http.MethodPost, `{"kind":"throttle","gpu":2,"reason":"hw-thermal-slowdown"}`)
			simtest.Fault(t, node, http.MethodPost, `{"kind":"throttle","gpu":2,"reason":"sw-power-cap"}`)
			for _, f := range tc.faults {
				simtest.Fault(t, node, http.MethodPost, f)
			}
			before := node.NVMLCalls()
			snap := s.SampleNow(context.Background())
			after := node.NVMLCalls()
			for i, smp := range snap.Samples {
				want := ok(0)
				if i == 2 {
					want = ok(nvml.ClocksThrottleReasonHwThermalSlowdown | nvml.ClocksEventReasonSwPowerCap)
				}
				if got := smp.Values[FieldClocksEventReasons]; got != want {
					t.Errorf("gpu %d clocks event reasons %+v, want %+v", i, got, want)
				}
			}
			event := after["GetCurrentClocksEventReasons"] - before["GetCurrentClocksEventReasons"]
			legacy := after["GetCurrentClocksThrottleReasons"] - before["GetCurrentClocksThrottleReasons"]
			if event != tc.event || legacy != tc.legacy {
				t.Errorf("event reasons calls %d, throttle reasons calls %d; want %d and %d", event, legacy, tc.event, tc.legacy)
			}
		})
	}
}
