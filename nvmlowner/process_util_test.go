package nvmlowner

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner/nvmlapi"
	"github.com/gpu-node-agent/gpu-node-agent/sim"
)

// utilSample is one nvmlProcessUtilizationSample_t.
func utilSample(pid uint32, ts uint64, sm, mem uint32) nvml.ProcessUtilizationSample {
	return nvml.ProcessUtilizationSample{Pid: pid, TimeStamp: ts, SmUtil: sm, MemUtil: mem}
}

func util(sm, mem, enc, dec uint64) ProcessUtil {
	return ProcessUtil{SM: okMem(sm), Memory: okMem(mem), Encoder: okMem(enc), Decoder: okMem(dec)}
}

// TestReadProcessUtil: what each answer of GetProcessUtilization makes of
// the processes of a sample, over go-nvml's mock device. The first cases
// replay real samples: Syllo/nvtop issue #110 (2021-06-08), three
// consecutive reads of a GPU running PIDs 7044 and 7180 (18429 had just
// exited), each read's lastSeenTimeStamp the newest timestamp of the one
// before; the second read answered again the samples of the first.
func TestReadProcessUtil(t *testing.T) {
	const (
		ts1a = 1623157629331552 // PID 18429's sample
		ts1b = 1623157633175692 // PID 7044's
		ts1c = 1623157632005826 // PID 7180's
		ts3a = 1623157637687768
		ts3b = 1623157639191912
	)
	running := []Process{{PID: 7044, Compute: true}, {PID: 7180, Compute: true}}
	answer := func(s ...nvml.ProcessUtilizationSample) func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
		return func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) { return s, nvml.SUCCESS }
	}
	fail := func(ret nvml.Return) func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
		return func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) { return nil, ret }
	}
	for _, tc := range []struct {
		name      string
		procs     []Process
		read      Status // the lists' read status
		lastSeen  uint64
		answers   []func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return)
		wantCalls int
		want      []ProcessUtil
		wantRead  Value
		wantErr   string
		wantSeen  uint64
		wantLost  bool
	}{
		{name: "first read: a sample of an exited process is dropped",
			procs: running, read: OK,
			answers:   []func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return){answer(utilSample(18429, ts1a, 1, 0), utilSample(7044, ts1b, 12, 0), utilSample(7180, ts1c, 7, 0))},
			wantCalls: 1, want: []ProcessUtil{util(12, 0, 0, 0), util(7, 0, 0, 0)}, wantRead: Value{V: 2, Status: OK}, wantSeen: ts1b},
		{name: "samples not newer than lastSeen are dropped: both idle",
			procs: running, read: OK, lastSeen: ts1b,
			answers:   []func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return){answer(utilSample(7044, ts1b, 11, 0), utilSample(7180, ts1c, 9, 0))},
			wantCalls: 1, want: []ProcessUtil{util(0, 0, 0, 0), util(0, 0, 0, 0)}, wantRead: Value{Status: OK}, wantSeen: ts1b},
		{name: "the next window",
			procs: running, read: OK, lastSeen: ts1b,
			answers:   []func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return){answer(utilSample(7044, ts3a, 4, 0), utilSample(7180, ts3b, 16, 0))},
			wantCalls: 1, want: []ProcessUtil{util(4, 0, 0, 0), util(16, 0, 0, 0)}, wantRead: Value{V: 2, Status: OK}, wantSeen: ts3b},
		{name: "the newest valid sample of a process counts",
			procs: running, read: OK, lastSeen: ts1b,
			answers: []func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return){answer(utilSample(7044, ts3b, 30, 2), utilSample(7044, ts3a, 4, 0),
				nvml.ProcessUtilizationSample{Pid: 7180, TimeStamp: ts3a, SmUtil: 5, EncUtil: 7, DecUtil: 9})},
			wantCalls: 1, want: []ProcessUtil{util(30, 2, 0, 0), util(5, 0, 7, 9)}, wantRead: Value{V: 2, Status: OK}, wantSeen: ts3b},
		{name: "out of range (nvtop #110): failed, not 0; a valid sample wins",
			procs: running, read: OK, lastSeen: ts1b,
			answers: []func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return){answer(utilSample(7044, ts3a, 4294967295, 0),
				utilSample(7180, ts3a, 101, 0), utilSample(7180, ts3b, 16, 0))},
			wantCalls: 1, want: []ProcessUtil{{}, util(16, 0, 0, 0)}, wantRead: Value{V: 1, Status: OK}, wantSeen: ts3b},
		{name: "not found: nobody busy since lastSeen",
			procs: running, read: OK, lastSeen: ts1b,
			answers:   []func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return){fail(nvml.ERROR_NOT_FOUND)},
			wantCalls: 1, want: []ProcessUtil{util(0, 0, 0, 0), util(0, 0, 0, 0)}, wantRead: Value{Status: OK}, wantSeen: ts1b},
		{name: "not supported (MIG enabled, or before Maxwell): no data",
			procs: running, read: OK, lastSeen: ts1b,
			answers:   []func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return){fail(nvml.ERROR_NOT_SUPPORTED)},
			wantCalls: 1, want: []ProcessUtil{{}, {}}, wantRead: Value{Status: NotSupported}, wantSeen: ts1b},
		{name: "the buffer grew between go-nvml's two calls: retried once",
			procs: running, read: OK,
			answers:   []func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return){fail(nvml.ERROR_INSUFFICIENT_SIZE), answer(utilSample(7044, ts3a, 3, 1))},
			wantCalls: 2, want: []ProcessUtil{util(3, 1, 0, 0), util(0, 0, 0, 0)}, wantRead: Value{V: 1, Status: OK}, wantSeen: ts3a},
		{name: "insufficient size twice: failed",
			procs: running, read: OK, lastSeen: ts1b,
			answers:   []func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return){fail(nvml.ERROR_INSUFFICIENT_SIZE), fail(nvml.ERROR_INSUFFICIENT_SIZE)},
			wantCalls: 2, want: []ProcessUtil{{}, {}}, wantRead: Value{Status: Failed}, wantErr: "process utilization: ERROR_INSUFFICIENT_SIZE", wantSeen: ts1b},
		{name: "gpu lost",
			procs: running, read: OK, lastSeen: ts1b,
			answers:   []func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return){fail(nvml.ERROR_GPU_IS_LOST)},
			wantCalls: 1, want: []ProcessUtil{{}, {}}, wantRead: Value{Status: Failed}, wantErr: "ERROR_GPU_IS_LOST", wantSeen: ts1b, wantLost: true},
		{name: "a list failed: the processes it gave are still read",
			procs: running[:1], read: Failed,
			answers:   []func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return){answer(utilSample(7044, ts3a, 8, 0))},
			wantCalls: 1, want: []ProcessUtil{util(8, 0, 0, 0)}, wantRead: Value{V: 1, Status: OK}, wantSeen: ts3a},
		{name: "no process: not asked",
			read: OK, lastSeen: ts1b, wantSeen: ts1b},
		{name: "lists refused: not asked",
			read: NoPermission, lastSeen: ts1b, wantSeen: ts1b},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			dev := &mock.Device{GetProcessUtilizationFunc: func(lastSeen uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
				if lastSeen != tc.lastSeen {
					t.Errorf("asked with lastSeen %d, want %d", lastSeen, tc.lastSeen)
				}
				calls++
				if calls > len(tc.answers) {
					t.Fatalf("call %d, want %d", calls, len(tc.answers))
				}
				return tc.answers[calls-1](lastSeen)
			}}
			r := &Sample{Processes: append([]Process(nil), tc.procs...), ProcessesRead: Value{Status: tc.read}}
			lost := false
			seen := readProcessUtil(nvmlapi.WrapDevice(dev), r, tc.lastSeen, func(ret nvml.Return) nvml.Return {
				lost = lost || ret == nvml.ERROR_GPU_IS_LOST
				return ret
			})
			if calls != tc.wantCalls {
				t.Errorf("%d calls, want %d", calls, tc.wantCalls)
			}
			var got []ProcessUtil
			for _, p := range r.Processes {
				u := p.Util
				// A failed value's error is checked below; compare statuses.
				for _, v := range []*Value{&u.SM, &u.Memory, &u.Encoder, &u.Decoder} {
					if v.Status == Failed {
						if v.Err == nil || !strings.Contains(v.Err.Error(), "out of range") {
							t.Errorf("process %d: failed utilization without its reason: %v", p.PID, v.Err)
						}
						*v = Value{}
					}
				}
				got = append(got, u)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("utilization %+v, want %+v", got, tc.want)
			}
			gotRead := r.ProcessUtilRead
			if (tc.wantErr == "") != (gotRead.Err == nil) || (gotRead.Err != nil && !strings.Contains(gotRead.Err.Error(), tc.wantErr)) {
				t.Errorf("read error %v, want %q", gotRead.Err, tc.wantErr)
			}
			gotRead.Err = nil
			if gotRead != tc.wantRead {
				t.Errorf("read %+v, want %+v", gotRead, tc.wantRead)
			}
			if seen != tc.wantSeen {
				t.Errorf("next lastSeen %d, want %d", seen, tc.wantSeen)
			}
			if lost != tc.wantLost {
				t.Errorf("lost %v, want %v", lost, tc.wantLost)
			}
		})
	}
}

// TestReadMIGProcessMemory: a MIG process's memory the parent's list does
// not give comes from its MIG device's list; one call per such device.
func TestReadMIGProcessMemory(t *testing.T) {
	const na = 0xFFFFFFFFFFFFFFFF
	calls := map[string]int{}
	list := func(uuid string, ret nvml.Return, ps ...nvml.ProcessInfo) Device {
		return nvmlapi.WrapDevice(&mock.Device{GetComputeRunningProcessesFunc: func() ([]nvml.ProcessInfo, nvml.Return) {
			calls[uuid]++
			return ps, ret
		}})
	}
	migs := map[string]Device{
		"MIG-a": list("MIG-a", nvml.SUCCESS, onInstance(10, 3*mib, 1, 0), onInstance(11, na, 1, 0)),
		"MIG-b": list("MIG-b", nvml.SUCCESS, onInstance(20, 5*mib, 2, 0)),
		"MIG-c": list("MIG-c", nvml.ERROR_UNKNOWN),
	}
	na2 := Value{Status: NotSupported}
	r := &Sample{Processes: []Process{
		{PID: 10, MIG: "MIG-a", UsedMemory: na2}, {PID: 11, MIG: "MIG-a", UsedMemory: na2},
		{PID: 20, MIG: "MIG-b", UsedMemory: okMem(mib)}, // known already: not asked
		{PID: 30, MIG: "MIG-c", UsedMemory: na2},
		{PID: 40, MIG: "MIG-gone", UsedMemory: na2}, // no handle this cycle
		{PID: 50, UsedMemory: okMem(2 * mib)},
	}}
	readMIGProcessMemory(migs, r, func(ret nvml.Return) nvml.Return { return ret })
	want := []Value{okMem(3 * mib), na2, okMem(mib), na2, na2, okMem(2 * mib)}
	for i, p := range r.Processes {
		if p.UsedMemory != want[i] {
			t.Errorf("process %d on %q: memory %+v, want %+v", p.PID, p.MIG, p.UsedMemory, want[i])
		}
	}
	if !reflect.DeepEqual(calls, map[string]int{"MIG-a": 1, "MIG-c": 1}) {
		t.Errorf("calls %v, want one on MIG-a and MIG-c", calls)
	}
}

// TestSamplerProcessUtilization: through the simulator, each cycle reads
// the utilisation since the previous one (lastSeenTimeStamp carried per
// GPU): a process at 40% that drops to 10% reads 10% the next cycle, where
// a read of the whole buffer would say 25%.
func TestSamplerProcessUtilization(t *testing.T) {
	node, _, s, _ := simSampler(t, "dgx-h100", sim.WithMIG(1, "3g.40gb"))
	clk := clocktesting.NewFakeClock(time.Date(2026, 5, 4, 10, 0, 0, 0, time.UTC))
	node.SetUtilizationClock(clk.Now)
	busy := startProc(t, node, sim.ProcessSpec{GPU: 0, MemoryMiB: 1000, Kind: sim.ProcessPod,
		ProcessUtilization: sim.ProcessUtilization{SMUtil: 40, MemUtil: 12}})
	idle := startProc(t, node, sim.ProcessSpec{GPU: 0, MemoryMiB: 500, Kind: sim.ProcessPod})
	onMIG := startProc(t, node, sim.ProcessSpec{GPU: 1, MIG: node.Spec().GPUs[1].MIG[0].UUID, MemoryMiB: 700, Kind: sim.ProcessPod,
		ProcessUtilization: sim.ProcessUtilization{SMUtil: 90}})

	utilOf := func(snap *Snapshot, gpu int, pid uint32) ProcessUtil {
		t.Helper()
		for _, p := range snap.Samples[gpu].Processes {
			if p.PID == pid {
				return p.Util
			}
		}
		t.Fatalf("gpu %d: no process %d in %+v", gpu, pid, snap.Samples[gpu].Processes)
		return ProcessUtil{}
	}
	clk.Step(10 * time.Second)
	snap := s.SampleNow(context.Background())
	if got := utilOf(snap, 0, busy); got != util(40, 12, 0, 0) {
		t.Errorf("cycle 1, busy: %+v, want sm 40 mem 12", got)
	}
	if got := utilOf(snap, 0, idle); got != util(0, 0, 0, 0) {
		t.Errorf("cycle 1, idle: %+v, want 0", got)
	}
	if err := node.SetProcessUtilization(busy, sim.ProcessUtilization{SMUtil: 10}); err != nil {
		t.Fatal(err)
	}
	clk.Step(10 * time.Second)
	snap = s.SampleNow(context.Background())
	if got := utilOf(snap, 0, busy); got != util(10, 0, 0, 0) {
		t.Errorf("cycle 2, busy after dropping to 10%%: %+v, want sm 10 (the window since cycle 1)", got)
	}
	// NVML has no per-process utilisation on a MIG-enabled GPU; the
	// process's memory comes from its MIG device.
	if r := snap.Samples[1].ProcessUtilRead; r.Status != NotSupported {
		t.Errorf("MIG gpu: utilization read %+v, want NotSupported", r)
	}
	if p := snap.Samples[1].Processes; len(p) != 1 || p[0].PID != onMIG || p[0].UsedMemory != okMem(700*mib) {
		t.Errorf("MIG gpu processes %+v, want %d holding 700 MiB", p, onMIG)
	}
	// Every process idle since cycle 2: NOT_FOUND, all 0.
	if err := node.SetProcessUtilization(busy, sim.ProcessUtilization{}); err != nil {
		t.Fatal(err)
	}
	clk.Step(10 * time.Second)
	snap = s.SampleNow(context.Background())
	if got, r := utilOf(snap, 0, busy), snap.Samples[0].ProcessUtilRead; got != util(0, 0, 0, 0) || r != (Value{Status: OK}) {
		t.Errorf("cycle 3, idle: %+v read %+v, want 0 and OK", got, r)
	}
}
