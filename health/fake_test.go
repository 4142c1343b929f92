package health

import (
	"fmt"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/gpu-node-agent/gpu-node-agent/sim"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// fakeGPU is the mutable state behind one mock device. The mock's funcs are
// installed once and read this state under fakeNVML.mu, so tests change
// readings without racing the checks.
type fakeGPU struct {
	uuid           string
	lost           bool
	eccDisabled    bool
	volatileDBE    uint64
	aggregateSBE   uint64
	retiredPending bool
	retired        int
	remapPending   bool
	remapFailure   bool
	links          []bool // NVLink up, by link
	linkErrors     []uint64
	noEvents       bool // RegisterEvents returns NOT_SUPPORTED
	dev            *mock.Device
}

// fakeNVML is an nvml.Interface over mock devices with an event set fed by
// a channel.
type fakeNVML struct {
	*mock.Interface
	mu       sync.Mutex
	gpus     []*fakeGPU
	events   chan nvml.EventData
	initRet  nvml.Return
	countRet nvml.Return
	waitRet  nvml.Return // returned by Wait instead of events when set
	creates  int         // EventSetCreate calls
	made     int         // event sets the default EventSetCreate made
	// registers counts RegisterEvents calls by GPU, whatever they answer.
	registers map[string]int
}

func newFakeNVML(n int) *fakeNVML {
	f := &fakeNVML{Interface: &mock.Interface{}, events: make(chan nvml.EventData, 64),
		initRet: nvml.SUCCESS, countRet: nvml.SUCCESS, waitRet: nvml.SUCCESS, registers: map[string]int{}}
	for i := range n {
		g := &fakeGPU{uuid: fmt.Sprintf("GPU-%d", i), links: []bool{true, true}, linkErrors: []uint64{0, 0}}
		g.dev = f.newDevice(g)
		f.gpus = append(f.gpus, g)
	}
	f.InitFunc = func() nvml.Return { f.mu.Lock(); defer f.mu.Unlock(); return f.initRet }
	f.ShutdownFunc = func() nvml.Return { return nvml.SUCCESS }
	f.DeviceGetCountFunc = func() (int, nvml.Return) {
		f.mu.Lock()
		defer f.mu.Unlock()
		return len(f.gpus), f.countRet
	}
	f.DeviceGetHandleByUUIDFunc = func(uuid string) (nvml.Device, nvml.Return) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.countRet != nvml.SUCCESS {
			return nil, f.countRet
		}
		for _, g := range f.gpus {
			if g.uuid == uuid {
				return g.dev, nvml.SUCCESS
			}
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
	f.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) {
		f.mu.Lock()
		f.creates++
		f.made++
		f.mu.Unlock()
		return &mock.EventSet{
			FreeFunc: func() nvml.Return { return nvml.SUCCESS },
			WaitFunc: func(ms uint32) (nvml.EventData, nvml.Return) {
				f.mu.Lock()
				ret := f.waitRet
				f.mu.Unlock()
				if ret != nvml.SUCCESS {
					time.Sleep(time.Millisecond)
					return nvml.EventData{}, ret
				}
				select {
				case e := <-f.events:
					return e, nvml.SUCCESS
				case <-time.After(time.Duration(ms) * time.Millisecond):
					return nvml.EventData{}, nvml.ERROR_TIMEOUT
				}
			},
		}, nvml.SUCCESS
	}
	return f
}

func (f *fakeNVML) newDevice(g *fakeGPU) *mock.Device {
	d := &mock.Device{}
	lock := func() func() { f.mu.Lock(); return f.mu.Unlock }
	lostOr := func(ret nvml.Return) nvml.Return {
		if g.lost {
			return nvml.ERROR_GPU_IS_LOST
		}
		return ret
	}
	d.GetUUIDFunc = func() (string, nvml.Return) { defer lock()(); return g.uuid, lostOr(nvml.SUCCESS) }
	d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) { defer lock()(); return nvml.Memory{}, lostOr(nvml.SUCCESS) }
	d.RegisterEventsFunc = func(uint64, nvml.EventSet) nvml.Return {
		defer lock()()
		f.registers[g.uuid]++
		if g.noEvents {
			return nvml.ERROR_NOT_SUPPORTED
		}
		return lostOr(nvml.SUCCESS)
	}
	d.GetEccModeFunc = func() (nvml.EnableState, nvml.EnableState, nvml.Return) {
		defer lock()()
		if g.eccDisabled {
			return nvml.FEATURE_DISABLED, nvml.FEATURE_DISABLED, lostOr(nvml.SUCCESS)
		}
		return nvml.FEATURE_ENABLED, nvml.FEATURE_ENABLED, lostOr(nvml.SUCCESS)
	}
	d.GetTotalEccErrorsFunc = func(t nvml.MemoryErrorType, c nvml.EccCounterType) (uint64, nvml.Return) {
		defer lock()()
		switch {
		case t == nvml.MEMORY_ERROR_TYPE_UNCORRECTED && c == nvml.VOLATILE_ECC:
			return g.volatileDBE, lostOr(nvml.SUCCESS)
		case t == nvml.MEMORY_ERROR_TYPE_CORRECTED && c == nvml.AGGREGATE_ECC:
			return g.aggregateSBE, lostOr(nvml.SUCCESS)
		}
		return 0, lostOr(nvml.SUCCESS)
	}
	d.GetRetiredPagesPendingStatusFunc = func() (nvml.EnableState, nvml.Return) {
		defer lock()()
		if g.retiredPending {
			return nvml.FEATURE_ENABLED, lostOr(nvml.SUCCESS)
		}
		return nvml.FEATURE_DISABLED, lostOr(nvml.SUCCESS)
	}
	d.GetRetiredPagesFunc = func(c nvml.PageRetirementCause) ([]uint64, nvml.Return) {
		defer lock()()
		if c == nvml.PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR {
			return make([]uint64, g.retired), lostOr(nvml.SUCCESS)
		}
		return nil, lostOr(nvml.SUCCESS)
	}
	d.GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) {
		defer lock()()
		return 0, 0, g.remapPending, g.remapFailure, lostOr(nvml.SUCCESS)
	}
	d.GetNvLinkStateFunc = func(link int) (nvml.EnableState, nvml.Return) {
		defer lock()()
		if link >= len(g.links) {
			return 0, nvml.ERROR_INVALID_ARGUMENT
		}
		if g.links[link] {
			return nvml.FEATURE_ENABLED, lostOr(nvml.SUCCESS)
		}
		return nvml.FEATURE_DISABLED, lostOr(nvml.SUCCESS)
	}
	d.GetNvLinkErrorCounterFunc = func(link int, c nvml.NvLinkErrorCounter) (uint64, nvml.Return) {
		defer lock()()
		if c == nvml.NVLINK_ERROR_DL_REPLAY {
			return g.linkErrors[link], lostOr(nvml.SUCCESS)
		}
		return 0, lostOr(nvml.SUCCESS)
	}
	sim.FillUnsupported(d)
	return d
}

// set changes fake state under the lock.
func (f *fakeNVML) set(fn func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn()
}

// node is the topology of the fake, with MIG devices on GPU 1 when mig.
func (f *fakeNVML) node(mig bool) *topology.Node {
	n := &topology.Node{}
	for i, g := range f.gpus {
		gpu := topology.GPU{Index: i, UUID: g.uuid}
		if mig && i == 1 {
			gpu.MIGEnabled = true
			gpu.MIG = []topology.MIGDevice{
				{UUID: "MIG-1-a", GPUInstance: 1, ComputeInstance: 0},
				{UUID: "MIG-1-b", GPUInstance: 2, ComputeInstance: 0},
			}
		}
		n.GPUs = append(n.GPUs, gpu)
	}
	return n
}

func (f *fakeNVML) xid(i int, xid uint64) {
	f.events <- nvml.EventData{Device: f.gpus[i].dev, EventType: nvml.EventTypeXidCriticalError,
		EventData: xid, GpuInstanceId: noInstance, ComputeInstanceId: noInstance}
}
