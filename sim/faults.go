package sim

import (
	"fmt"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Fault kinds accepted by POST/DELETE /faults.
const (
	FaultXID             = "xid"               // XID Fault.XID on GPU (or Fault.MIG)
	FaultECCDBE          = "ecc-dbe"           // volatile DBE count +1 and a DBE event
	FaultRowRemapPending = "row-remap-pending" // a remap waiting for a reset
	FaultRowRemapFailure = "row-remap-failure" // out of spare rows
	FaultRetiredPending  = "retired-pages-pending"
	FaultGPULost         = "gpu-lost"     // calls fail with ERROR_GPU_IS_LOST (and XID 79)
	FaultNVMLFailure     = "nvml-failure" // the library fails: init, handles, event sets
	FaultNVLinkDown      = "nvlink-down"  // link Fault.Link inactive
	FaultPortDown        = "port-down"    // RDMA port Fault.NIC down (sim/nics.go)
)

// faultState is the health-related state of a simulated node: ECC, row
// remapping, retired pages, NVML failure and the live NVML event sets. It
// has its own lock (not Node.mu) because faults never change the layout;
// GPU lost and NVLink state live in gpuState (Node.mu).
type faultState struct {
	mu          sync.Mutex
	nvmlFailed  bool
	failed      chan struct{} // closed while NVML is failed, to wake waiters
	gpus        []gpuFaults
	sets        map[*eventSet]struct{}
	undelivered int // events injected with no set registered (tests)
}

type gpuFaults struct {
	volatileDBE, aggregateDBE uint64
	remapPending, remapFail   bool
	retiredPending            bool
}

// installFaults gives every GPU healthy readings for what the health
// checks read (ECC on with zero counts, no remaps or retired pages, NVLink
// error counters at zero) and the node an NVML event set fed by injected
// faults. It wraps the library calls that an NVML failure breaks.
func (n *Node) installFaults() {
	fs := &faultState{gpus: make([]gpuFaults, len(n.devices)), sets: map[*eventSet]struct{}{}, failed: make(chan struct{})}
	n.faults = fs

	for i, d := range n.devices {
		read := func() (gpuFaults, bool) {
			fs.mu.Lock()
			defer fs.mu.Unlock()
			return fs.gpus[i], fs.nvmlFailed
		}
		d.GetEccModeFunc = func() (nvml.EnableState, nvml.EnableState, nvml.Return) {
			return nvml.FEATURE_ENABLED, nvml.FEATURE_ENABLED, nvml.SUCCESS
		}
		d.GetTotalEccErrorsFunc = func(t nvml.MemoryErrorType, c nvml.EccCounterType) (uint64, nvml.Return) {
			g, failed := read()
			switch {
			case failed:
				return 0, nvml.ERROR_UNKNOWN
			case t != nvml.MEMORY_ERROR_TYPE_UNCORRECTED:
				return 0, nvml.SUCCESS
			case c == nvml.VOLATILE_ECC:
				return g.volatileDBE, nvml.SUCCESS
			}
			return g.aggregateDBE, nvml.SUCCESS
		}
		d.GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) {
			g, failed := read()
			if failed {
				return 0, 0, false, false, nvml.ERROR_UNKNOWN
			}
			unc := 0
			if g.remapPending || g.remapFail {
				unc = 1
			}
			return 0, unc, g.remapPending, g.remapFail, nvml.SUCCESS
		}
		d.GetRetiredPagesPendingStatusFunc = func() (nvml.EnableState, nvml.Return) {
			g, failed := read()
			if failed {
				return 0, nvml.ERROR_UNKNOWN
			}
			if g.retiredPending {
				return nvml.FEATURE_ENABLED, nvml.SUCCESS
			}
			return nvml.FEATURE_DISABLED, nvml.SUCCESS
		}
		d.GetRetiredPagesFunc = func(nvml.PageRetirementCause) ([]uint64, nvml.Return) {
			if _, failed := read(); failed {
				return nil, nvml.ERROR_UNKNOWN
			}
			return nil, nvml.SUCCESS
		}
		links := len(n.gpus[i].links)
		d.GetNvLinkErrorCounterFunc = func(l int, _ nvml.NvLinkErrorCounter) (uint64, nvml.Return) {
			if l < 0 || l >= links {
				return 0, nvml.ERROR_INVALID_ARGUMENT
			}
			return 0, nvml.SUCCESS
		}
		d.RegisterEventsFunc = func(mask uint64, set nvml.EventSet) nvml.Return {
			es, ok := set.(*eventSet)
			if !ok {
				return nvml.ERROR_INVALID_ARGUMENT
			}
			fs.mu.Lock()
			defer fs.mu.Unlock()
			if fs.nvmlFailed {
				return nvml.ERROR_UNKNOWN
			}
			es.masks[i] |= mask & (nvml.EventTypeXidCriticalError | nvml.EventTypeSingleBitEccError | nvml.EventTypeDoubleBitEccError)
			return nvml.SUCCESS
		}
		d.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) {
			return nvml.EventTypeXidCriticalError | nvml.EventTypeSingleBitEccError | nvml.EventTypeDoubleBitEccError, nvml.SUCCESS
		}
	}

	s := n.srv
	s.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) {
		fs.mu.Lock()
		defer fs.mu.Unlock()
		if fs.nvmlFailed {
			return nil, nvml.ERROR_UNKNOWN
		}
		es := &eventSet{fs: fs, ch: make(chan nvml.EventData, 256), masks: map[int]uint64{}}
		fs.sets[es] = struct{}{}
		return es, nvml.SUCCESS
	}
	// An NVML failure breaks the library itself: wrap the calls everything
	// else starts from.
	failing := func() bool {
		fs.mu.Lock()
		defer fs.mu.Unlock()
		return fs.nvmlFailed
	}
	init, count := s.InitFunc, s.DeviceGetCountFunc
	byIndex, byUUID, byBus := s.DeviceGetHandleByIndexFunc, s.DeviceGetHandleByUUIDFunc, s.DeviceGetHandleByPciBusIdFunc
	s.InitFunc = func() nvml.Return {
		if failing() {
			return nvml.ERROR_UNKNOWN
		}
		return init()
	}
	s.DeviceGetCountFunc = func() (int, nvml.Return) {
		if failing() {
			return 0, nvml.ERROR_UNKNOWN
		}
		return count()
	}
	s.DeviceGetHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		if failing() {
			return nil, nvml.ERROR_UNKNOWN
		}
		return byIndex(i)
	}
	s.DeviceGetHandleByUUIDFunc = func(u string) (nvml.Device, nvml.Return) {
		if failing() {
			return nil, nvml.ERROR_UNKNOWN
		}
		return byUUID(u)
	}
	s.DeviceGetHandleByPciBusIdFunc = func(b string) (nvml.Device, nvml.Return) {
		if failing() {
			return nil, nvml.ERROR_UNKNOWN
		}
		return byBus(b)
	}
}

// eventSet is a simulated NVML event set: injected events for the GPUs
// and types registered on it arrive on ch.
type eventSet struct {
	fs    *faultState
	ch    chan nvml.EventData
	masks map[int]uint64 // GPU index -> registered event types; fs.mu
}

// Wait returns the next event, ERROR_TIMEOUT after timeoutms, or
// ERROR_UNKNOWN while NVML is failed.
func (es *eventSet) Wait(timeoutms uint32) (nvml.EventData, nvml.Return) {
	es.fs.mu.Lock()
	failed, failedCh := es.fs.nvmlFailed, es.fs.failed
	es.fs.mu.Unlock()
	if failed {
		return nvml.EventData{}, nvml.ERROR_UNKNOWN
	}
	t := time.NewTimer(time.Duration(timeoutms) * time.Millisecond)
	defer t.Stop()
	select {
	case e := <-es.ch:
		return e, nvml.SUCCESS
	case <-failedCh:
		return nvml.EventData{}, nvml.ERROR_UNKNOWN
	case <-t.C:
		return nvml.EventData{}, nvml.ERROR_TIMEOUT
	}
}

// Free unregisters the set.
func (es *eventSet) Free() nvml.Return {
	es.fs.mu.Lock()
	defer es.fs.mu.Unlock()
	delete(es.fs.sets, es)
	return nvml.SUCCESS
}

var _ nvml.EventSet = (*eventSet)(nil)

// deliver sends an event of type typ for GPU gpu to every set registered
// for it; a full set drops it, as NVML's queue would.
func (n *Node) deliver(fs *faultState, gpu int, typ, data uint64, gi, ci uint32) {
	e := nvml.EventData{Device: n.handle(gpu), EventType: typ, EventData: data, GpuInstanceId: gi, ComputeInstanceId: ci}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	sent := false
	for es := range fs.sets {
		if es.masks[gpu]&typ == 0 {
			continue
		}
		select {
		case es.ch <- e:
			sent = true
		default:
			n.log.Warn("simulated event set full; event dropped", "gpu", gpu, "type", typ)
		}
	}
	if !sent {
		fs.undelivered++
		n.log.Debug("simulated nvml event with no event set registered", "gpu", gpu, "type", typ, "data", data)
	}
}

// noInstance is NVML's GPU/compute instance ID for events not tied to a
// MIG device.
const noInstance = 0xFFFFFFFF

// migInstance finds the GPU/compute instance IDs of MIG device uuid on gpu.
func (n *Node) migInstance(gpu int, uuid string) (uint32, uint32, error) {
	if uuid == "" {
		return noInstance, noInstance, nil
	}
	for _, m := range n.Spec().GPUs[gpu].MIG {
		if m.UUID == uuid {
			return uint32(m.GPUInstance), uint32(m.ComputeInstance), nil
		}
	}
	return 0, 0, fmt.Errorf("mig: no MIG device %q on gpu %d", uuid, gpu)
}

func (n *Node) injectFault(f Fault) error {
	return n.applyFault(f, true)
}

func (n *Node) clearFault(f Fault) error {
	return n.applyFault(f, false)
}

// applyFault injects (on) or clears (!on) f. Clearing an XID does nothing:
// an XID is an event, and the agent recovers from it on its own.
func (n *Node) applyFault(f Fault, on bool) error {
	fs := n.faults
	if fs == nil {
		return fmt.Errorf("fault %s: simulator has no fault state", f.Kind)
	}
	if f.GPU < 0 || f.GPU >= len(n.devices) {
		return fmt.Errorf("gpu: no such gpu %d (node has %d)", f.GPU, len(n.devices))
	}
	gpu := f.GPU
	setGPU := func(fn func(g *gpuFaults)) {
		fs.mu.Lock()
		fn(&fs.gpus[gpu])
		fs.mu.Unlock()
	}
	switch f.Kind {
	case FaultXID:
		if f.XID == 0 {
			return fmt.Errorf("xid: required for fault kind %q", f.Kind)
		}
		gi, ci, err := n.migInstance(gpu, f.MIG)
		if err != nil {
			return err
		}
		if on {
			n.deliver(fs, gpu, nvml.EventTypeXidCriticalError, f.XID, gi, ci)
		}
	case FaultECCDBE:
		gi, ci, err := n.migInstance(gpu, f.MIG)
		if err != nil {
			return err
		}
		if on {
			setGPU(func(g *gpuFaults) { g.volatileDBE++; g.aggregateDBE++ })
			n.deliver(fs, gpu, nvml.EventTypeDoubleBitEccError, 0, gi, ci)
		} else {
			// Clearing is a GPU reset: the volatile count starts again.
			setGPU(func(g *gpuFaults) { g.volatileDBE = 0 })
		}
	case FaultRowRemapPending:
		setGPU(func(g *gpuFaults) { g.remapPending = on })
	case FaultRowRemapFailure:
		setGPU(func(g *gpuFaults) { g.remapFail = on })
	case FaultRetiredPending:
		setGPU(func(g *gpuFaults) { g.retiredPending = on })
	case FaultGPULost:
		if err := n.setGPULost(gpu, on); err != nil {
			return err
		}
		if on {
			// A GPU falling off the bus is reported as XID 79.
			n.deliver(fs, gpu, nvml.EventTypeXidCriticalError, 79, noInstance, noInstance)
		}
	case FaultNVMLFailure:
		fs.mu.Lock()
		if on && !fs.nvmlFailed {
			close(fs.failed)
		} else if !on && fs.nvmlFailed {
			fs.failed = make(chan struct{})
		}
		fs.nvmlFailed = on
		fs.mu.Unlock()
	case FaultNVLinkDown:
		return n.setNVLinkDown(gpu, f.Link, on)
	case FaultPortDown:
		if f.NIC == "" {
			return fmt.Errorf("nic: required for fault kind %q", f.Kind)
		}
		return n.setPortState(f.NIC, !on)
	default:
		return fmt.Errorf("kind: unsupported fault kind %q (supported: %s, %s, %s, %s, %s, %s, %s, %s, %s)", f.Kind,
			FaultXID, FaultECCDBE, FaultRowRemapPending, FaultRowRemapFailure, FaultRetiredPending, FaultGPULost, FaultNVMLFailure, FaultNVLinkDown, FaultPortDown)
	}
	state := "injected"
	if !on {
		state = "cleared"
	}
	n.log.Info("simulated fault "+state, "kind", f.Kind, "gpu", gpu, "xid", f.XID, "link", f.Link, "mig", f.MIG)
	return nil
}
