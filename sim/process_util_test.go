package sim

import (
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	clocktesting "k8s.io/utils/clock/testing"
)

// utilNode is newProcNode (GPU 1 in MIG mode) whose utilisation samples
// follow a fake clock.
func utilNode(t *testing.T) (*Node, *clocktesting.FakeClock) {
	t.Helper()
	n := newProcNode(t)
	clk := clocktesting.NewFakeClock(time.Date(2026, 5, 4, 10, 0, 0, 0, time.UTC))
	n.SetUtilizationClock(clk.Now)
	return n, clk
}

func us(t time.Time) uint64 { return uint64(t.UnixMicro()) }

// TestProcessUtilization: what GetProcessUtilization answers, as nvml.h
// describes it, for one GPU whose processes' utilisation changes over a
// fake clock.
func TestProcessUtilization(t *testing.T) {
	n, clk := utilNode(t)
	lib := n.NVML()
	gpu0, _ := lib.DeviceGetHandleByIndex(0)
	busy := mustStart(t, n, ProcessSpec{GPU: 0, MemoryMiB: 100, Kind: ProcessPod,
		ProcessUtilization: ProcessUtilization{SMUtil: 40, MemUtil: 10, DecUtil: 5}})
	idle := mustStart(t, n, ProcessSpec{GPU: 0, MemoryMiB: 100, Kind: ProcessPod})
	other := mustStart(t, n, ProcessSpec{GPU: 2, MemoryMiB: 100, Kind: ProcessPod, ProcessUtilization: ProcessUtilization{SMUtil: 90}})

	sample := func(pid uint32, at time.Time, sm, mem, enc, dec uint32) nvml.ProcessUtilizationSample {
		return nvml.ProcessUtilizationSample{Pid: pid, TimeStamp: us(at), SmUtil: sm, MemUtil: mem, EncUtil: enc, DecUtil: dec}
	}
	check := func(what string, lastSeen uint64, want []nvml.ProcessUtilizationSample, wantRet nvml.Return) {
		t.Helper()
		got, ret := gpu0.GetProcessUtilization(lastSeen)
		if ret != wantRet || !reflect.DeepEqual(got, want) {
			t.Errorf("%s: %+v %v, want %+v %v", what, got, ret, want, wantRet)
		}
	}

	clk.Step(10 * time.Second)
	t1 := clk.Now()
	// The idle process had no non-zero utilisation: no sample for it.
	check("all buffered samples", 0, []nvml.ProcessUtilizationSample{sample(busy, t1, 40, 10, 0, 5)}, nvml.SUCCESS)
	if err := n.SetProcessUtilization(busy, ProcessUtilization{SMUtil: 80}); err != nil {
		t.Fatal(err)
	}
	if err := n.SetProcessUtilization(idle, ProcessUtilization{EncUtil: 30}); err != nil {
		t.Fatal(err)
	}
	clk.Step(10 * time.Second)
	t2 := clk.Now()
	check("since the last read", us(t1), []nvml.ProcessUtilizationSample{sample(busy, t2, 80, 0, 0, 0), sample(idle, t2, 0, 0, 30, 0)}, nvml.SUCCESS)
	// Over the whole buffer (20 s): the first 10 s at 40, the next at 80.
	check("the whole buffer", 0, []nvml.ProcessUtilizationSample{sample(busy, t2, 60, 5, 0, 2), sample(idle, t2, 0, 0, 15, 0)}, nvml.SUCCESS)
	check("nothing newer than now", us(t2), nil, nvml.ERROR_NOT_FOUND)

	// Everyone idle: no sample since the last read, NOT_FOUND.
	for _, pid := range []uint32{busy, idle} {
		if err := n.SetProcessUtilization(pid, ProcessUtilization{}); err != nil {
			t.Fatal(err)
		}
	}
	clk.Step(10 * time.Second)
	t3 := clk.Now()
	check("all idle since the last read", us(t2), nil, nvml.ERROR_NOT_FOUND)
	// A process that started within the window averages over its own
	// life only.
	clk.Step(-5 * time.Second)
	late := mustStart(t, n, ProcessSpec{GPU: 0, MemoryMiB: 100, Kind: ProcessPod, ProcessUtilization: ProcessUtilization{SMUtil: 50}})
	clk.Step(5 * time.Second)
	check("a process started within the window", us(t2), []nvml.ProcessUtilizationSample{sample(late, t3, 50, 0, 0, 0)}, nvml.SUCCESS)
	// The window 20 s back still holds the first 10 s of busy at 80.
	check("the buffer", 0, []nvml.ProcessUtilizationSample{sample(busy, t3, 40, 0, 0, 0), sample(idle, t3, 0, 0, 15, 0),
		sample(late, t3, 50, 0, 0, 0)}, nvml.SUCCESS)

	// A process that ended has no samples; one on another GPU is that
	// GPU's.
	if err := n.StopProcess(late); err != nil {
		t.Fatal(err)
	}
	check("after the process ended", us(t2), nil, nvml.ERROR_NOT_FOUND)
	gpu2, _ := lib.DeviceGetHandleByIndex(2)
	if got, ret := gpu2.GetProcessUtilization(0); ret != nvml.SUCCESS || len(got) != 1 || got[0].Pid != other || got[0].SmUtil != 90 {
		t.Errorf("gpu 2: %+v %v, want process %d at 90%%", got, ret, other)
	}
	if got := n.NVMLCalls()["GetProcessUtilization"]; got != 9 {
		t.Errorf("GetProcessUtilization counted %d times, want 9", got)
	}

	// nvml.h: "On MIG-enabled GPUs, querying process utilization is not
	// currently supported"; a MIG device handle has no such call either.
	migProc := mustStart(t, n, ProcessSpec{GPU: 1, MIG: migUUID(t, n, 1, 0), MemoryMiB: 100, Kind: ProcessPod,
		ProcessUtilization: ProcessUtilization{SMUtil: 70}})
	gpu1, _ := lib.DeviceGetHandleByIndex(1)
	if got, ret := gpu1.GetProcessUtilization(0); ret != nvml.ERROR_NOT_SUPPORTED || got != nil {
		t.Errorf("MIG-enabled gpu 1 (process %d at 70%%): %+v %v, want NOT_SUPPORTED", migProc, got, ret)
	}
	mig, _ := gpu1.GetMigDeviceHandleByIndex(0)
	if _, ret := mig.GetProcessUtilization(0); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("MIG device handle: %v, want NOT_SUPPORTED", ret)
	}

	// A lost GPU answers GPU_IS_LOST.
	if err := n.injectFault(Fault{Kind: FaultGPULost, GPU: 2}); err != nil {
		t.Fatal(err)
	}
	if _, ret := gpu2.GetProcessUtilization(0); ret != nvml.ERROR_GPU_IS_LOST {
		t.Errorf("lost gpu 2: %v, want GPU_IS_LOST", ret)
	}
}

// TestProcessUtilizationRefused: a utilisation is a percentage; an unknown
// process is ESRCH.
func TestProcessUtilizationRefused(t *testing.T) {
	n, _ := utilNode(t)
	if _, err := n.StartProcess(ProcessSpec{GPU: 0, MemoryMiB: 1, Kind: ProcessPod, ProcessUtilization: ProcessUtilization{MemUtil: 101}}); err == nil ||
		!strings.Contains(err.Error(), "memUtil: 101") {
		t.Errorf("start with memUtil 101: %v, want an error naming memUtil", err)
	}
	pid := mustStart(t, n, ProcessSpec{GPU: 0, MemoryMiB: 1, Kind: ProcessPod})
	if err := n.SetProcessUtilization(pid, ProcessUtilization{DecUtil: 200}); err == nil || !strings.Contains(err.Error(), "decUtil: 200") {
		t.Errorf("decUtil 200: %v, want an error naming decUtil", err)
	}
	if err := n.SetProcessUtilization(pid+1, ProcessUtilization{SMUtil: 1}); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("unknown pid: %v, want ESRCH", err)
	}
}

// TestProcessUtilizationArch: Maxwell and newer answer; every built-in
// profile's GPUs are newer, and answer NOT_SUPPORTED once MIG is on.
func TestProcessUtilizationArch(t *testing.T) {
	if archSupports(nvml.DEVICE_ARCH_KEPLER, featureProcessUtil) || !archSupports(nvml.DEVICE_ARCH_MAXWELL, featureProcessUtil) {
		t.Error("process utilization: want Maxwell and newer only (nvml.h)")
	}
	for _, tc := range archCases {
		t.Run(tc.profile, func(t *testing.T) {
			n := newArchNode(t, tc.profile)
			dev, _ := n.NVML().DeviceGetHandleByIndex(0)
			if _, ret := dev.GetProcessUtilization(0); ret != nvml.ERROR_NOT_FOUND {
				t.Errorf("%s without processes: %v, want NOT_FOUND (supported, no sample)", archName(tc.arch), ret)
			}
			if len(migProfilesOf(profiles[tc.profile].gpu)) == 0 {
				return
			}
			n = newArchNode(t, tc.profile, migOnGPU0(t, tc.profile))
			dev, _ = n.NVML().DeviceGetHandleByIndex(0)
			if _, ret := dev.GetProcessUtilization(0); ret != nvml.ERROR_NOT_SUPPORTED {
				t.Errorf("MIG on: %v, want NOT_SUPPORTED", ret)
			}
		})
	}
}

// TestGoNVMLProcessUtilizationBuffer: the sizing call and the fill, as
// go-nvml drives them.
func TestGoNVMLProcessUtilizationBuffer(t *testing.T) {
	all := []nvml.ProcessUtilizationSample{{Pid: 1, SmUtil: 5}, {Pid: 2, SmUtil: 6}}
	var calls []int
	got, ret := goNVMLProcessUtilization(func(buf []nvml.ProcessUtilizationSample, count *uint32) nvml.Return {
		calls = append(calls, len(buf))
		return processUtilizationCall(all, buf, count)
	})
	if ret != nvml.SUCCESS || !reflect.DeepEqual(got, all) || !reflect.DeepEqual(calls, []int{0, 2}) {
		t.Errorf("got %+v %v after calls with buffers %v; want both samples after a NULL and a 2-entry call", got, ret, calls)
	}
	if got, ret := goNVMLProcessUtilization(func(buf []nvml.ProcessUtilizationSample, count *uint32) nvml.Return {
		return processUtilizationCall(nil, buf, count)
	}); ret != nvml.ERROR_NOT_FOUND || got != nil {
		t.Errorf("no samples: %+v %v, want NOT_FOUND", got, ret)
	}
	if ret := processUtilizationCall(all, nil, nil); ret != nvml.ERROR_INVALID_ARGUMENT {
		t.Errorf("NULL count: %v, want INVALID_ARGUMENT", ret)
	}
}

func TestControlProcessUtilization(t *testing.T) {
	n, clk := utilNode(t)
	code, body := control(t, n, "POST", "/processes", `{"gpu":0,"memoryMiB":64,"kind":"pod","smUtil":25,"encUtil":3}`)
	if code != http.StatusOK {
		t.Fatalf("POST /processes: %d %s", code, body)
	}
	pid := FirstPID
	if p := n.Processes()[0]; p.SMUtil != 25 || p.EncUtil != 3 {
		t.Errorf("process %+v, want smUtil 25 encUtil 3", p)
	}
	path := "/processes/" + fmt.Sprint(pid) + "/utilization"
	for _, tc := range []struct {
		name, path, body string
		wantCode         int
		wantBody         string
	}{
		{"set", path, `{"smUtil":60,"memUtil":20}`, 204, ""},
		{"over 100", path, `{"smUtil":101}`, 400, "smUtil: 101"},
		{"unknown field", path, `{"sm":1}`, 400, `unknown field "sm"`},
		{"unknown process", "/processes/" + fmt.Sprint(pid+7) + "/utilization", `{"smUtil":1}`, 404, "no such simulated process"},
		{"bad pid", "/processes/x/utilization", `{}`, 400, "pid:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body := control(t, n, "POST", tc.path, tc.body)
			if code != tc.wantCode || !strings.Contains(body, tc.wantBody) {
				t.Errorf("%d %q, want %d with %q", code, body, tc.wantCode, tc.wantBody)
			}
		})
	}
	if p := n.Processes()[0]; p.ProcessUtilization != (ProcessUtilization{SMUtil: 60, MemUtil: 20}) {
		t.Errorf("after POST: %+v", p.ProcessUtilization)
	}
	before := clk.Now()
	clk.Step(time.Second)
	dev, _ := n.NVML().DeviceGetHandleByIndex(0)
	if got, ret := dev.GetProcessUtilization(us(before)); ret != nvml.SUCCESS || len(got) != 1 || got[0].SmUtil != 60 || got[0].MemUtil != 20 {
		t.Errorf("after POST: %+v %v, want sm 60 mem 20", got, ret)
	}
}
