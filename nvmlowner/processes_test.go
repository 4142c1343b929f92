package nvmlowner

import (
	"context"
	"errors"
	"net/http"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner/nvmlapi"
	"github.com/gpu-node-agent/gpu-node-agent/sim"
	"github.com/gpu-node-agent/gpu-node-agent/sim/simtest"
)

const mib = 1 << 20

func startProc(t *testing.T, n *sim.Node, spec sim.ProcessSpec) uint32 {
	t.Helper()
	pid, err := n.StartProcess(spec)
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

func okMem(b uint64) Value { return Value{V: b, Status: OK} }

// TestSamplerReadsProcesses: on a simulated DGX H100 with MIG on GPU 1,
// each sample holds its GPU's processes, one per PID and device, with MIG
// processes named by their MIG device's UUID; the memory readings count
// what the processes hold.
func TestSamplerReadsProcesses(t *testing.T) {
	node, _, s, targets := simSampler(t, "dgx-h100", sim.WithMIG(1, "3g.40gb", "3g.40gb"))
	mig := targets[1].MIG[1]
	comp := startProc(t, node, sim.ProcessSpec{GPU: 0, MemoryMiB: 1000, Kind: sim.ProcessPod})
	both := startProc(t, node, sim.ProcessSpec{GPU: 0, MemoryMiB: 500, Kind: sim.ProcessHost, Compute: true, Graphics: true})
	gfx := startProc(t, node, sim.ProcessSpec{GPU: 0, MemoryMiB: 300, Kind: sim.ProcessHost, Graphics: true})
	onMIG := startProc(t, node, sim.ProcessSpec{GPU: 1, MIG: mig.UUID, MemoryMiB: 2000, Kind: sim.ProcessPod})
	if err := node.SetLeakedMemory(2, "", 700); err != nil {
		t.Fatal(err)
	}
	before := node.NVMLCalls()
	snap := s.SampleNow(context.Background())
	after := node.NVMLCalls()
	for call, want := range map[string]uint64{
		// One per GPU, and one on the MIG device whose process's memory
		// the parent's list does not give.
		"GetComputeRunningProcesses":  9,
		"GetGraphicsRunningProcesses": 8,
		// One per GPU with a process (GPUs 0 and 1).
		"GetProcessUtilization": 2,
	} {
		if got := after[call] - before[call]; got != want {
			t.Errorf("%s: %d calls in a cycle, want %d", call, got, want)
		}
	}

	g0 := snap.Samples[0]
	// The processes are idle: no utilisation sample, 0.
	idle := ProcessUtil{SM: okMem(0), Memory: okMem(0), Encoder: okMem(0), Decoder: okMem(0)}
	want0 := []Process{
		{PID: comp, UsedMemory: okMem(1000 * mib), Compute: true, Util: idle},
		{PID: both, UsedMemory: okMem(500 * mib), Compute: true, Graphics: true, Util: idle},
		{PID: gfx, UsedMemory: okMem(300 * mib), Graphics: true, Util: idle},
	}
	if g0.Err != nil || g0.ProcessesRead != (Value{V: 3, Status: OK}) || !reflect.DeepEqual(g0.Processes, want0) {
		t.Errorf("gpu 0: err %v read %+v processes %+v; want %+v", g0.Err, g0.ProcessesRead, g0.Processes, want0)
	}
	if g0.ProcessUtilRead != (Value{Status: OK}) {
		t.Errorf("gpu 0: utilization read %+v, want OK with no sample", g0.ProcessUtilRead)
	}
	// GetMemoryInfo's used is reserved + allocated (nvmlMemory_t);
	// GetMemoryInfo_v2's reserved is read alongside.
	if used, res := g0.Get(FieldFBUsed), g0.Get(FieldFBReserved); used.Status != OK || res.Status != OK || used.V-res.V != 1800*mib {
		t.Errorf("gpu 0 fb used %+v reserved %+v, want 1800 MiB allocated", used, res)
	}

	g1 := snap.Samples[1]
	// The parent's list gives a MIG process's memory as not available;
	// the MIG device's own list gives it.
	want1 := []Process{{PID: onMIG, MIG: mig.UUID, UsedMemory: okMem(2000 * mib), Compute: true}}
	if g1.ProcessesRead.Status != OK || !reflect.DeepEqual(g1.Processes, want1) || g1.MIGChanged {
		t.Errorf("gpu 1 (MIG): read %+v processes %+v changed %v; want %+v", g1.ProcessesRead, g1.Processes, g1.MIGChanged, want1)
	}
	if g1.ProcessUtilRead.Status != NotSupported {
		t.Errorf("gpu 1 (MIG): utilization read %+v, want NotSupported (nvml.h: not on MIG-enabled GPUs)", g1.ProcessUtilRead)
	}
	if m := g1.MIG[1]; m.UUID != mig.UUID || m.FBUsed != okMem(2000*mib) {
		t.Errorf("MIG device %s fb used %+v, want 2000 MiB", m.UUID, m.FBUsed)
	}

	g2 := snap.Samples[2]
	if g2.ProcessesRead != (Value{Status: OK}) || len(g2.Processes) != 0 {
		t.Errorf("gpu 2: read %+v processes %+v, want none", g2.ProcessesRead, g2.Processes)
	}
	if used, res := g2.Get(FieldFBUsed), g2.Get(FieldFBReserved); used.V-res.V != 700*mib {
		t.Errorf("gpu 2 with a 700 MiB leak: fb used %+v reserved %+v", used, res)
	}

	node.SetUnprivileged(true)
	snap = s.SampleNow(context.Background())
	if r := snap.Samples[1].ProcessesRead; r.Status != NoPermission || !r.NoData() || snap.Samples[1].Err != nil {
		t.Errorf("unprivileged, MIG gpu: read %+v err %v, want NoPermission and the sample kept", r, snap.Samples[1].Err)
	}
	if r := snap.Samples[0].ProcessesRead; r.Status != OK {
		t.Errorf("unprivileged, gpu 0: read %+v, want OK", r)
	}
	node.SetUnprivileged(false)

	for _, pid := range []uint32{comp, both} {
		if err := node.SignalProcess(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	}
	simtest.Fault(t, node, http.MethodPost, `{"kind":"gpu-lost","gpu":1}`)
	snap = s.SampleNow(context.Background())
	if g := snap.Samples[0]; len(g.Processes) != 1 || g.Processes[0].PID != gfx {
		t.Errorf("gpu 0 after two kills: %+v, want only %d", g.Processes, gfx)
	}
	if g := snap.Samples[1]; !g.Lost() || g.Processes != nil || g.ProcessesRead != (Value{}) {
		t.Errorf("lost gpu 1: lost %v processes %+v read %+v, want a lost sample without processes", g.Lost(), g.Processes, g.ProcessesRead)
	}
}

func infos(ps ...nvml.ProcessInfo) func() ([]nvml.ProcessInfo, nvml.Return) {
	return func() ([]nvml.ProcessInfo, nvml.Return) { return ps, nvml.SUCCESS }
}

func fails(ret nvml.Return) func() ([]nvml.ProcessInfo, nvml.Return) {
	return func() ([]nvml.ProcessInfo, nvml.Return) { return nil, ret }
}

// whole is a process on a GPU without MIG (nvml.h: instance IDs
// 0xFFFFFFFF).
func whole(pid uint32, mem uint64) nvml.ProcessInfo {
	return nvml.ProcessInfo{Pid: pid, UsedGpuMemory: mem, GpuInstanceId: 0xFFFFFFFF, ComputeInstanceId: 0xFFFFFFFF}
}

func onInstance(pid uint32, mem uint64, gi, ci uint32) nvml.ProcessInfo {
	return nvml.ProcessInfo{Pid: pid, UsedGpuMemory: mem, GpuInstanceId: gi, ComputeInstanceId: ci}
}

// TestReadProcesses: what each pair of list answers makes of a sample, over
// go-nvml's mock device.
func TestReadProcesses(t *testing.T) {
	const na = 0xFFFFFFFFFFFFFFFF // NVML_VALUE_NOT_AVAILABLE
	migTargets := []MIGTarget{
		{UUID: "MIG-a", Index: 0, GPUInstance: 1, ComputeInstance: 0},
		{UUID: "MIG-b", Index: 1, GPUInstance: 2, ComputeInstance: 0},
	}
	for _, tc := range []struct {
		name              string
		compute, graphics func() ([]nvml.ProcessInfo, nvml.Return)
		mig               []MIGTarget
		migChanged        bool // set by the MIG reads before
		want              []Process
		wantRead          Status
		wantErr           string
		wantChanged       bool
		wantLost          bool
	}{
		{name: "compute and graphics, one process on both",
			compute: infos(whole(20, 5*mib), whole(10, 7*mib)), graphics: infos(whole(10, 7*mib), whole(30, mib)),
			want: []Process{
				{PID: 10, UsedMemory: okMem(7 * mib), Compute: true, Graphics: true},
				{PID: 20, UsedMemory: okMem(5 * mib), Compute: true},
				{PID: 30, UsedMemory: okMem(mib), Graphics: true},
			}, wantRead: OK},
		{name: "memory not available",
			compute: infos(whole(10, na)), graphics: infos(),
			want: []Process{{PID: 10, UsedMemory: Value{Status: NotSupported}, Compute: true}}, wantRead: OK},
		{name: "memory known on one list only",
			compute: infos(whole(10, na)), graphics: infos(whole(10, 3*mib)),
			want: []Process{{PID: 10, UsedMemory: okMem(3 * mib), Compute: true, Graphics: true}}, wantRead: OK},
		{name: "no graphics on this product",
			compute: infos(whole(10, mib)), graphics: fails(nvml.ERROR_NOT_SUPPORTED),
			want: []Process{{PID: 10, UsedMemory: okMem(mib), Compute: true}}, wantRead: OK},
		{name: "compute list fails alone",
			compute: fails(nvml.ERROR_UNKNOWN), graphics: infos(whole(30, mib)),
			want: []Process{{PID: 30, UsedMemory: okMem(mib), Graphics: true}}, wantRead: Failed, wantErr: "compute processes: ERROR_UNKNOWN"},
		{name: "graphics list fails alone",
			compute: infos(whole(10, mib)), graphics: fails(nvml.ERROR_UNKNOWN),
			want: []Process{{PID: 10, UsedMemory: okMem(mib), Compute: true}}, wantRead: Failed, wantErr: "graphics processes: ERROR_UNKNOWN"},
		{name: "graphics refused",
			compute: infos(whole(10, mib)), graphics: fails(nvml.ERROR_NO_PERMISSION),
			want: []Process{{PID: 10, UsedMemory: okMem(mib), Compute: true}}, wantRead: NoPermission},
		{name: "both refused (unprivileged, MIG on)",
			compute: fails(nvml.ERROR_NO_PERMISSION), graphics: fails(nvml.ERROR_NO_PERMISSION), mig: migTargets,
			wantRead: NoPermission},
		{name: "not supported",
			compute: fails(nvml.ERROR_NOT_SUPPORTED), graphics: fails(nvml.ERROR_NOT_SUPPORTED), wantRead: NotSupported},
		{name: "not supported and failing",
			compute: fails(nvml.ERROR_NOT_SUPPORTED), graphics: fails(nvml.ERROR_UNKNOWN), wantRead: Failed, wantErr: "graphics processes"},
		{name: "mig processes by instance",
			compute: infos(onInstance(10, na, 2, 0), onInstance(11, na, 1, 0)), graphics: infos(), mig: migTargets,
			want: []Process{
				{PID: 11, MIG: "MIG-a", UsedMemory: Value{Status: NotSupported}, Compute: true},
				{PID: 10, MIG: "MIG-b", UsedMemory: Value{Status: NotSupported}, Compute: true},
			}, wantRead: OK},
		{name: "one pid on two mig devices",
			compute: infos(onInstance(10, mib, 1, 0), onInstance(10, 2*mib, 2, 0)), graphics: infos(), mig: migTargets,
			want: []Process{
				{PID: 10, MIG: "MIG-a", UsedMemory: okMem(mib), Compute: true},
				{PID: 10, MIG: "MIG-b", UsedMemory: okMem(2 * mib), Compute: true},
			}, wantRead: OK},
		{name: "unknown instance: the layout changed",
			compute: infos(onInstance(10, na, 1, 0), onInstance(12, na, 5, 0)), graphics: infos(), mig: migTargets,
			want:     []Process{{PID: 10, MIG: "MIG-a", UsedMemory: Value{Status: NotSupported}, Compute: true}},
			wantRead: Failed, wantErr: "process 12: gpu instance 5 compute instance 0", wantChanged: true},
		{name: "mig layout changed before the lists",
			compute: infos(onInstance(10, na, 1, 0)), graphics: infos(), mig: migTargets, migChanged: true,
			want:     []Process{{PID: 10, MIG: "MIG-a", UsedMemory: Value{Status: NotSupported}, Compute: true}},
			wantRead: Failed, wantErr: "mig layout changed", wantChanged: true},
		{name: "instance ids on a gpu without MIG are ignored",
			compute: infos(onInstance(10, mib, 0, 0)), graphics: infos(),
			want: []Process{{PID: 10, UsedMemory: okMem(mib), Compute: true}}, wantRead: OK},
		{name: "no processes",
			compute: infos(), graphics: infos(), wantRead: OK},
		{name: "gpu lost",
			compute: fails(nvml.ERROR_GPU_IS_LOST), graphics: fails(nvml.ERROR_GPU_IS_LOST), wantRead: Failed, wantErr: "ERROR_GPU_IS_LOST", wantLost: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dev := &mock.Device{GetComputeRunningProcessesFunc: tc.compute, GetGraphicsRunningProcessesFunc: tc.graphics}
			r := &Sample{MIGChanged: tc.migChanged}
			lost := false
			readProcesses(nvmlapi.WrapDevice(dev), Target{UUID: "GPU-a", MIG: tc.mig}, r, func(ret nvml.Return) nvml.Return {
				if ret == nvml.ERROR_GPU_IS_LOST {
					lost = true
				}
				return ret
			})
			if !reflect.DeepEqual(r.Processes, tc.want) {
				t.Errorf("processes %+v, want %+v", r.Processes, tc.want)
			}
			if got := r.ProcessesRead; got.Status != tc.wantRead || (tc.wantErr == "") != (got.Err == nil) ||
				(got.Err != nil && !strings.Contains(got.Err.Error(), tc.wantErr)) {
				t.Errorf("read %+v, want status %d with error %q", got, tc.wantRead, tc.wantErr)
			}
			if got := r.ProcessesRead; got.Status == OK && got.V != uint64(len(tc.want)) {
				t.Errorf("read.V %d, want the %d processes", got.V, len(tc.want))
			}
			if r.MIGChanged != tc.wantChanged {
				t.Errorf("MIGChanged %v, want %v", r.MIGChanged, tc.wantChanged)
			}
			if lost != tc.wantLost {
				t.Errorf("lost %v, want %v", lost, tc.wantLost)
			}
		})
	}
}

// TestSamplerProcessListFailsAlone: a process list that fails fails only
// itself: the GPU's sample and its other readings stand, and the next GPU
// is read as usual.
func TestSamplerProcessListFailsAlone(t *testing.T) {
	f := newFakeLib()
	for uuid, d := range f.devs {
		if uuid == "GPU-a" {
			d.GetComputeRunningProcessesFunc = fails(nvml.ERROR_UNKNOWN)
		} else {
			d.GetComputeRunningProcessesFunc = infos(whole(42, mib))
		}
		d.GetGraphicsRunningProcessesFunc = infos()
		d.GetPowerUsageFunc = func() (uint32, nvml.Return) { return 250000, nvml.SUCCESS }
		sim.FillUnsupported(d)
	}
	o := New(nvmlapi.Wrap(f), Config{CallTimeout: 5 * time.Second}, nil)
	s := NewSampler(o, SamplerConfig{})
	s.SetTargets([]Target{{UUID: "GPU-a"}, {UUID: "GPU-b"}})
	snap := s.SampleNow(context.Background())
	a, b := snap.Samples[0], snap.Samples[1]
	if a.Err != nil || a.Lost() || a.Values[FieldPowerUsage] != okMem(250000) {
		t.Errorf("gpu a: err %v power %+v; a failed list must not fail the sample", a.Err, a.Values[FieldPowerUsage])
	}
	if a.ProcessesRead.Status != Failed || !errors.Is(a.ProcessesRead.Err, nvml.ERROR_UNKNOWN) {
		t.Errorf("gpu a: processes read %+v, want Failed wrapping ERROR_UNKNOWN", a.ProcessesRead)
	}
	if b.ProcessesRead.Status != OK || len(b.Processes) != 1 || b.Processes[0].PID != 42 {
		t.Errorf("gpu b: read %+v processes %+v", b.ProcessesRead, b.Processes)
	}
}
