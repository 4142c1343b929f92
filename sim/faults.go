package sim

import (
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner/nvmlapi"
)

// Fault kinds accepted by POST/DELETE /faults.
const (
	FaultXID             = "xid"                   // XID Fault.XID on GPU (Fault.MIG, Fault.GI); GPU -1: an event without a device
	FaultECCDBE          = "ecc-dbe"               // volatile DBE count +1, a DBE event, recovery action GPU_RESET
	FaultRowRemapPending = "row-remap-pending"     // a remap waiting for a reset
	FaultRowRemapFailure = "row-remap-failure"     // out of spare rows
	FaultRetiredPending  = "retired-pages-pending" // a DBE page waiting for a reset to be retired
	FaultGPULost         = "gpu-lost"              // calls fail with ERROR_GPU_IS_LOST (and XID 79)
	FaultNVMLFailure     = "nvml-failure"          // the library fails: init, handles, event sets
	FaultNVLinkDown      = "nvlink-down"           // link Fault.Link inactive
	FaultPortDown        = "port-down"             // RDMA port Fault.NIC down (sim/nics.go)
	FaultNICFlap         = "nic-flap"              // RDMA port Fault.NIC goes down and up every Fault.Period (default 1s), link_downed +1 each time, until cleared (sim/nics.go)
	FaultNICErrors       = "nic-errors"            // symbol_error and port_rcv_errors of RDMA port Fault.NIC rise by Fault.Count (default 100) every Fault.Period (default 1s), until cleared (sim/nics.go)
	FaultGPUReset        = "gpu-reset"             // what a GPU reset (nvidia-smi -r) leaves; an action, not clearable (reset.go)
	FaultResetFail       = "reset-fail"            // the GPU's resets (ResetGPU) fail, exit status 255, until cleared (reset.go)
	FaultResetHang       = "reset-hang"            // the GPU's resets (ResetGPU) never end, until cleared (reset.go)
	FaultHang            = "hang"                  // every NVML call on the GPU blocks until cleared (calls.go)
	FaultGPUMissing      = "gpu-missing"           // on the PCI bus but not listed by NVML (missing.go)
	FaultFabricNotReady  = "fabric-not-ready"      // NVLink fabric registration in progress (fabric.go)
	FaultMIGCreateFails  = "mig-create-fails"      // Fault.Call (default CreateGpuInstanceWithPlacement) answers Fault.Ret (default ERROR_INSUFFICIENT_RESOURCES) (mig_make.go)
	FaultSXID            = "sxid"                  // NVSwitch SXid Fault.XID on link Fault.Link, fatal unless Fault.NonFatal; kernel log only, node-wide (kmsg.go)
	// The preflight's faults (preflight.go).
	FaultPCIeDegraded   = "pcie-degraded"        // PCIe link trained below its maximum: Fault.PCIeGen/PCIeWidth (default one generation down, half width)
	FaultECCDisabled    = "ecc-disabled"         // ECC mode off, current and pending
	FaultPersistenceOff = "persistence-disabled" // driver persistence mode off
	FaultThrottle       = "throttle"             // a clocks event reason active: Fault.Reason (default hw-slowdown)
	FaultOldDriver      = "old-driver"           // the driver reports Fault.DriverVersion (default DefaultOldDriver); node-wide
	FaultCommandFail    = "command-fail"         // the preflight's command exits Fault.ExitCode (default 1) without running; node-wide
	FaultCommandSlow    = "command-slow"         // the preflight's command starts Fault.Seconds late (default 3600: past any timeout); node-wide
)

// faultKinds lists the kinds, for the error naming them.
var faultKinds = []string{
	FaultXID, FaultECCDBE, FaultRowRemapPending, FaultRowRemapFailure, FaultRetiredPending, FaultGPULost,
	FaultNVMLFailure, FaultNVLinkDown, FaultPortDown, FaultNICFlap, FaultNICErrors, FaultGPUReset, FaultResetFail, FaultResetHang, FaultHang, FaultGPUMissing, FaultFabricNotReady,
	FaultMIGCreateFails, FaultSXID,
	FaultPCIeDegraded, FaultECCDisabled, FaultPersistenceOff, FaultThrottle, FaultOldDriver,
	FaultCommandFail, FaultCommandSlow,
}

// noDevice is Fault.GPU for an event NVML raises without a device.
const noDevice = -1

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
	// remappedUnc counts rows remapped (for uncorrectable errors) by past
	// resets: a pending remap becomes a remapped row.
	remappedUnc    int
	retiredPending bool
	// retiredPages are the DBE pages retired by past resets.
	retiredPages []uint64
	// recovery is FI_DEV_GET_GPU_RECOVERY_ACTION.
	recovery       nvml.DeviceGpuRecoveryAction
	fabricNotReady bool
	// resetFail and resetHang are the outcome of the GPU's resets.
	resetFail, resetHang bool
	// migCreate is a mig-create-fails fault, nil without one.
	migCreate *migFault
}

// pageAddress is the hardware address the simulator gives the k-th page
// retired on a GPU.
func pageAddress(k int) uint64 { return 0x7f000 + uint64(k)*0x1000 }

// installFaults gives every GPU healthy readings for what the health
// checks read (ECC on with zero counts, no remaps or retired pages, NVLink
// error counters at zero) and the node an NVML event set fed by injected
// faults. The library calls that an NVML failure breaks are in direct.go.
func (n *Node) installFaults() {
	fs := &faultState{gpus: make([]gpuFaults, len(n.devices)), sets: map[*eventSet]struct{}{}, failed: make(chan struct{})}
	n.faults = fs
	// go-nvml's nvmlEventData.convert (event_set.go) wraps whatever handle
	// NVML put in the event, so an event without a device carries a non-nil
	// Device around a NULL nvmlDevice_t, on which every call fails with
	// ERROR_INVALID_ARGUMENT (nvml.h: "if device is invalid").
	null := &mock.Device{}
	fillWith(null, nvml.ERROR_INVALID_ARGUMENT)
	n.nullDevice = device{m: null, g: &gpuGate{calls: n.calls, gpu: noDevice}}

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
			unc := g.remappedUnc
			if g.remapPending || (g.remapFail && unc == 0) {
				unc++
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
		// nvml.h nvmlDeviceGetRetiredPages_v2: "Returns the list of retired
		// pages by source, including pages that are pending retirement".
		d.GetRetiredPagesFunc = func(cause nvml.PageRetirementCause) ([]uint64, nvml.Return) {
			g, failed := read()
			switch {
			case failed:
				return nil, nvml.ERROR_UNKNOWN
			case cause >= nvml.PAGE_RETIREMENT_CAUSE_COUNT:
				return nil, nvml.ERROR_INVALID_ARGUMENT
			case cause != nvml.PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR:
				return nil, nvml.SUCCESS
			}
			pages := slices.Clone(g.retiredPages)
			if g.retiredPending {
				pages = append(pages, pageAddress(len(pages)))
			}
			return pages, nvml.SUCCESS
		}
		// Field values answered here: the GPU recovery action. Everything
		// else is NOT_SUPPORTED until counters.go (and arch.go) fill in
		// theirs; they chain onto this handler.
		d.GetFieldValuesFunc = func(fvs []nvml.FieldValue) nvml.Return {
			g, failed := read()
			if failed {
				return nvml.ERROR_UNKNOWN
			}
			for k := range fvs {
				if fvs[k].FieldId == nvml.FI_DEV_GET_GPU_RECOVERY_ACTION {
					setFieldUint32(&fvs[k], uint32(g.recovery))
					continue
				}
				fvs[k].NvmlReturn = uint32(nvml.ERROR_NOT_SUPPORTED)
			}
			return nvml.SUCCESS
		}
		// NVML indexes the GPUs it lists: after a GPU it does not list
		// (gpu-missing) the indexes move down.
		getIndex := d.GetIndexFunc
		d.GetIndexFunc = func() (int, nvml.Return) {
			if _, ret := getIndex(); ret != nvml.SUCCESS {
				return 0, ret
			}
			return n.listedIndex(i), nvml.SUCCESS
		}
		links := len(n.gpus[i].links)
		d.GetNvLinkErrorCounterFunc = func(l int, _ nvml.NvLinkErrorCounter) (uint64, nvml.Return) {
			if l < 0 || l >= links {
				return 0, nvml.ERROR_INVALID_ARGUMENT
			}
			return 0, nvml.SUCCESS
		}
		d.RegisterEventsFunc = func(mask uint64, set nvml.EventSet) nvml.Return {
			s, ok := set.(nvmlSet)
			if !ok {
				return nvml.ERROR_INVALID_ARGUMENT
			}
			es := s.es
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
}

// setFieldUint32 stores v as an unsigned int field value.
func setFieldUint32(fv *nvml.FieldValue, v uint32) {
	fv.ValueType = uint32(nvml.VALUE_TYPE_UNSIGNED_INT)
	fv.NvmlReturn = uint32(nvml.SUCCESS)
	clear(fv.Value[:])
	binary.NativeEndian.PutUint32(fv.Value[:], v)
}

// eventSet is a simulated NVML event set: injected events for the GPUs
// and types registered on it arrive on ch.
type eventSet struct {
	fs    *faultState
	calls *callCounts
	ch    chan nvmlapi.EventData
	masks map[int]uint64 // GPU index -> registered event types; fs.mu
}

// Wait returns the next event, ERROR_TIMEOUT after timeoutms, or
// ERROR_UNKNOWN while NVML is failed. A hung GPU does not hold it: the
// event set is the library's, not a GPU's.
func (es *eventSet) Wait(timeoutms uint32) (nvmlapi.EventData, nvml.Return) {
	es.calls.count(libEventSetWait)
	return es.wait(timeoutms)
}

func (es *eventSet) wait(timeoutms uint32) (nvmlapi.EventData, nvml.Return) {
	es.fs.mu.Lock()
	failed, failedCh := es.fs.nvmlFailed, es.fs.failed
	es.fs.mu.Unlock()
	if failed {
		return nvmlapi.EventData{}, nvml.ERROR_UNKNOWN
	}
	t := time.NewTimer(time.Duration(timeoutms) * time.Millisecond)
	defer t.Stop()
	select {
	case e := <-es.ch:
		return e, nvml.SUCCESS
	case <-failedCh:
		return nvmlapi.EventData{}, nvml.ERROR_UNKNOWN
	case <-t.C:
		return nvmlapi.EventData{}, nvml.ERROR_TIMEOUT
	}
}

// Free unregisters the set.
func (es *eventSet) Free() nvml.Return {
	es.calls.count(libEventSetFree)
	return es.free()
}

func (es *eventSet) free() nvml.Return {
	es.fs.mu.Lock()
	defer es.fs.mu.Unlock()
	delete(es.fs.sets, es)
	return nvml.SUCCESS
}

// registered says whether the set takes events of type typ for gpu (for
// noDevice: on any GPU). Caller holds fs.mu.
func (es *eventSet) registered(gpu int, typ uint64) bool {
	if gpu != noDevice {
		return es.masks[gpu]&typ != 0
	}
	for _, m := range es.masks {
		if m&typ != 0 {
			return true
		}
	}
	return false
}

// deliver sends an event of type typ for GPU gpu to every set registered
// for it; a full set drops it, as NVML's queue would. An event without a
// device (gpu noDevice) goes to every set registered for typ on any GPU,
// with the NULL device.
func (n *Node) deliver(fs *faultState, gpu int, typ, data uint64, gi, ci uint32) {
	if gpu != noDevice {
		if h := n.gates[gpu].hang.Load(); h != nil {
			// A hung GPU's events wait for the hang to end, as its
			// calls do: while NVML hangs only the kernel log (kmsg.go)
			// tells, which is why NVSentinel and node-problem-detector
			// read it.
			go func() {
				<-h.ch
				n.deliver(fs, gpu, typ, data, gi, ci)
			}()
			return
		}
	}
	dev := n.nullDevice
	if gpu != noDevice {
		dev = n.handle(gpu)
	}
	e := nvmlapi.EventData{Device: dev, EventType: typ, EventData: data, GpuInstanceId: gi, ComputeInstanceId: ci}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	sent := false
	for es := range fs.sets {
		if !es.registered(gpu, typ) {
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

// eventInstance is the GPU and compute instance IDs an event of fault f
// carries. nvml.h (nvmlEventData_t) fills gpuInstanceId when an XID "is
// attributable to a GPU instance" and computeInstanceId when it is
// attributable to a compute instance, each 0xFFFFFFFF otherwise: f.MIG tags
// the event with both IDs of that MIG device, f.GI with a GPU instance only.
func (n *Node) eventInstance(f Fault) (uint32, uint32, error) {
	switch {
	case f.MIG != "" && f.GI != nil:
		return 0, 0, fmt.Errorf("gi: give mig or gi, not both")
	case f.MIG != "":
		for _, m := range n.gpuSpec(f.GPU).MIG {
			if m.UUID == f.MIG {
				return uint32(m.GPUInstance), uint32(m.ComputeInstance), nil
			}
		}
		return 0, 0, fmt.Errorf("mig: no MIG device %q on gpu %d", f.MIG, f.GPU)
	case f.GI != nil:
		for _, m := range n.gpuSpec(f.GPU).MIG {
			if uint32(m.GPUInstance) == *f.GI {
				return *f.GI, noInstance, nil
			}
		}
		return 0, 0, fmt.Errorf("gi: no GPU instance %d on gpu %d", *f.GI, f.GPU)
	}
	return noInstance, noInstance, nil
}

// resetClassXIDs are the XIDs after which the driver asks for a GPU reset
// (FI_DEV_GET_GPU_RECOVERY_ACTION reads GPU_RESET), per NVIDIA's XID
// catalog (docs.nvidia.com/deploy/xid-errors): 48 double-bit ECC error, 79
// GPU fallen off the bus, 95 uncontained ECC error, 119 GSP RPC timeout,
// 120 GSP error.
var resetClassXIDs = []uint64{48, 79, 95, 119, 120}

// checkFaultTarget checks the GPU (and MIG instance) fault f names: GPU -1
// (no device) only for an XID, and then with neither mig nor gi.
func (n *Node) checkFaultTarget(f Fault) error {
	if f.Kind == FaultSXID {
		return nil // the node's NVSwitch, not a GPU
	}
	if f.GPU == noDevice && f.Kind == FaultXID {
		if f.MIG != "" || f.GI != nil {
			return fmt.Errorf("gpu: -1 (an event without a device) cannot name a MIG device or GPU instance")
		}
		return nil
	}
	if f.GPU < 0 || f.GPU >= len(n.gpus) {
		return fmt.Errorf("gpu: no such gpu %d (node has %d)", f.GPU, len(n.gpus))
	}
	if f.GI != nil && f.Kind != FaultXID && f.Kind != FaultECCDBE {
		return fmt.Errorf("gi: only for kinds %s and %s", FaultXID, FaultECCDBE)
	}
	return nil
}

// InjectFault injects f as POST /faults does; the simulator build of the
// agent uses it for --sim-faults, faults present before NVML is first
// initialised (a driver that fails from boot on).
func (n *Node) InjectFault(f Fault) error {
	return n.injectFault(f)
}

// ClearFault clears f as DELETE /faults does.
func (n *Node) ClearFault(f Fault) error { return n.clearFault(f) }

func (n *Node) injectFault(f Fault) error {
	return n.applyFault(f, true)
}

func (n *Node) clearFault(f Fault) error {
	return n.applyFault(f, false)
}

// applyFault injects (on) or clears (!on) f. Clearing an XID does nothing:
// an XID is an event, and the agent recovers from it on its own. The
// recovery action a fault raises stays until a gpu-reset, or the DELETE of
// ecc-dbe or gpu-lost, which stand for the reset that ends them.
func (n *Node) applyFault(f Fault, on bool) error {
	fs := n.faults
	if fs == nil {
		return fmt.Errorf("fault %s: simulator has no fault state", f.Kind)
	}
	if err := n.checkFaultTarget(f); err != nil {
		return err
	}
	if on {
		if err := n.checkFaultArch(f.Kind, f.GPU); err != nil {
			return err
		}
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
		gi, ci := uint32(noInstance), uint32(noInstance)
		if gpu != noDevice {
			var err error
			if gi, ci, err = n.eventInstance(f); err != nil {
				return err
			}
		}
		if on {
			if gpu != noDevice && slices.Contains(resetClassXIDs, f.XID) {
				setGPU(func(g *gpuFaults) { g.recovery = nvml.GPU_RECOVERY_ACTION_GPU_RESET })
			}
			n.deliver(fs, gpu, nvml.EventTypeXidCriticalError, f.XID, gi, ci)
			if gpu != noDevice {
				n.logKmsg(xidLine(n.gpus[gpu].busID, f.XID, gi, ci))
			}
		}
	case FaultECCDBE:
		gi, ci, err := n.eventInstance(f)
		if err != nil {
			return err
		}
		if on {
			setGPU(func(g *gpuFaults) {
				g.volatileDBE++
				g.aggregateDBE++
				g.recovery = nvml.GPU_RECOVERY_ACTION_GPU_RESET
			})
			n.deliver(fs, gpu, nvml.EventTypeDoubleBitEccError, 0, gi, ci)
		} else {
			// Clearing is a GPU reset: the volatile count starts again.
			setGPU(func(g *gpuFaults) {
				g.volatileDBE = 0
				g.recovery = nvml.GPU_RECOVERY_ACTION_NONE
			})
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
			setGPU(func(g *gpuFaults) { g.recovery = nvml.GPU_RECOVERY_ACTION_GPU_RESET })
			// A GPU falling off the bus is reported as XID 79, and in the
			// kernel log by the driver's own message too.
			n.deliver(fs, gpu, nvml.EventTypeXidCriticalError, 79, noInstance, noInstance)
			n.logKmsg(fallenOffBusMessage(n.gpus[gpu].busID), xidLine(n.gpus[gpu].busID, 79, noInstance, noInstance))
		} else {
			setGPU(func(g *gpuFaults) { g.recovery = nvml.GPU_RECOVERY_ACTION_NONE })
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
	case FaultNICFlap, FaultNICErrors:
		if f.NIC == "" {
			return fmt.Errorf("nic: required for fault kind %q", f.Kind)
		}
		if on {
			return n.startNICFault(f)
		}
		return n.stopNICFault(f)
	case FaultGPUReset:
		if !on {
			return fmt.Errorf("kind: %s is an instantaneous action (a GPU reset); there is nothing to clear", f.Kind)
		}
		if err := n.resetIdleGPU(gpu); err != nil {
			return err
		}
	case FaultResetFail:
		setGPU(func(g *gpuFaults) { g.resetFail = on })
	case FaultResetHang:
		setGPU(func(g *gpuFaults) { g.resetHang = on })
	case FaultHang:
		n.gates[gpu].setHang(on)
	case FaultGPUMissing:
		n.setGPUMissing(gpu, on)
	case FaultPCIeDegraded, FaultECCDisabled, FaultPersistenceOff, FaultThrottle, FaultOldDriver, FaultCommandFail, FaultCommandSlow:
		if err := n.applyPreflightFault(f, on); err != nil {
			return err
		}
	case FaultMIGCreateFails:
		if !n.gpus[gpu].migCapable {
			g := n.gpus[gpu]
			return fmt.Errorf("kind: fault %q on gpu %d: %s does not support MIG", f.Kind, gpu, g.cfg.Name)
		}
		var mf *migFault
		if on {
			var err error
			if mf, err = parseMIGFault(f); err != nil {
				return err
			}
		}
		setGPU(func(g *gpuFaults) { g.migCreate = mf })
	case FaultSXID:
		if on {
			if err := n.injectSXID(f); err != nil {
				return err
			}
		}
	case FaultFabricNotReady:
		if g := n.gpus[gpu]; g.fabric == nil {
			return fmt.Errorf("kind: fault %q on gpu %d: %s is not on an NVSwitch fabric; GetGpuFabricInfo answers NOT_SUPPORTED", f.Kind, gpu, g.cfg.Name)
		}
		setGPU(func(g *gpuFaults) { g.fabricNotReady = on })
	default:
		return fmt.Errorf("kind: unsupported fault kind %q (supported: %s)", f.Kind, strings.Join(faultKinds, ", "))
	}
	state := "injected"
	if !on {
		state = "cleared"
	}
	gi := -1
	if f.GI != nil {
		gi = int(*f.GI)
	}
	n.log.Info("simulated fault "+state, "kind", f.Kind, "gpu", gpu, "xid", f.XID, "link", f.Link, "mig", f.MIG, "gi", gi)
	return nil
}

// migFaultReturns are the returns a "mig-create-fails" fault may give, by
// nvml.h's name without "NVML_": those nvml.h lists for
// nvmlDeviceCreateGpuInstanceWithPlacement and
// nvmlGpuInstanceCreateComputeInstance, and ERROR_UNKNOWN.
var migFaultReturns = map[string]nvml.Return{
	"ERROR_INSUFFICIENT_RESOURCES": nvml.ERROR_INSUFFICIENT_RESOURCES,
	"ERROR_NO_PERMISSION":          nvml.ERROR_NO_PERMISSION,
	"ERROR_NOT_SUPPORTED":          nvml.ERROR_NOT_SUPPORTED,
	"ERROR_INVALID_ARGUMENT":       nvml.ERROR_INVALID_ARGUMENT,
	"ERROR_UNINITIALIZED":          nvml.ERROR_UNINITIALIZED,
	"ERROR_UNKNOWN":                nvml.ERROR_UNKNOWN,
}

// parseMIGFault reads a "mig-create-fails" fault's call and return.
func parseMIGFault(f Fault) (*migFault, error) {
	mf := &migFault{call: f.Call, ret: nvml.ERROR_INSUFFICIENT_RESOURCES}
	switch f.Call {
	case "":
		mf.call = callCreateGpuInstance
	case callCreateGpuInstance, callCreateComputeInstance:
	default:
		return nil, fmt.Errorf("call: %q is not %s or %s", f.Call, callCreateGpuInstance, callCreateComputeInstance)
	}
	if f.Ret != "" {
		r, ok := migFaultReturns[f.Ret]
		if !ok {
			names := make([]string, 0, len(migFaultReturns))
			for name := range migFaultReturns {
				names = append(names, name)
			}
			slices.Sort(names)
			return nil, fmt.Errorf("ret: %q is not one of %s", f.Ret, strings.Join(names, ", "))
		}
		mf.ret = r
	}
	return mf, nil
}
