package sim

import (
	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner/nvmlapi"
)

// library and device are what NVML() hands out: the agent's NVML
// (nvmlapi.Library, nvmlapi.Device) and nothing more. A device calls its
// mock's XxxFunc fields directly instead of the mock methods, which append
// every call's arguments to a slice that is never trimmed (4 KiB per
// metrics scrape of an 8-GPU node, measured) and would grow an agent that
// runs for days on a simulated node without bound. Handles are values, so
// two handles of one device compare equal: a MIG device's handle carries
// its parent GPU's gate, a GPU's its own (calls.go), and both come only
// from n.handle and n.migHandle.
type (
	library struct{ n *Node }
	device  struct {
		m *mock.Device
		g *gpuGate
	}
	// nvmlSet carries a simulated event set through the mock's
	// RegisterEventsFunc, whose parameter is go-nvml's nvml.EventSet; its
	// methods are the set's, in go-nvml's types.
	nvmlSet struct{ es *eventSet }
)

var (
	_ nvmlapi.Library  = library{}
	_ nvmlapi.Device   = device{}
	_ nvmlapi.EventSet = (*eventSet)(nil)
	_ nvml.EventSet    = nvmlSet{}
)

// handle is the NVML handle of GPU i.
func (n *Node) handle(i int) nvmlapi.Device {
	return device{m: &n.devices[i].Device, g: n.gates[i]}
}

// migHandle is the NVML handle of MIG device m of GPU gpu.
func (n *Node) migHandle(gpu int, m *mock.Device) nvmlapi.Device {
	return device{m: m, g: n.gates[gpu]}
}

// indexOf finds the GPU behind a mock device; -1 if it is not one of this
// node's GPUs.
func (n *Node) indexOf(d nvml.Device) int {
	for i, dev := range n.devices {
		if d == nvml.Device(&dev.Device) || d == nvml.Device(dev) {
			return i
		}
	}
	return -1
}

// failing says whether an NVML failure is injected.
func (n *Node) failing() bool {
	fs := n.faults
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.nvmlFailed
}

// Init fails while an NVML failure is injected.
func (l library) Init() nvml.Return {
	l.n.calls.count(libInit)
	if l.n.failing() {
		return nvml.ERROR_UNKNOWN
	}
	return l.n.srv.InitFunc()
}

// Shutdown always succeeds, as go-nvml's mock server's.
func (l library) Shutdown() nvml.Return {
	l.n.calls.count(libShutdown)
	return l.n.srv.ShutdownFunc()
}

// DeviceGetCount counts the GPUs NVML lists (not the gpu-missing ones).
func (l library) DeviceGetCount() (int, nvml.Return) {
	l.n.calls.count(libDeviceGetCount)
	if l.n.failing() {
		return 0, nvml.ERROR_UNKNOWN
	}
	c, ret := l.n.srv.DeviceGetCountFunc()
	if ret == nvml.SUCCESS {
		c = l.n.listedCount()
	}
	return c, ret
}

// DeviceGetHandleByIndex sees only the GPUs NVML lists (nvml.h
// nvmlDeviceGetHandleByIndex_v2: INVALID_ARGUMENT "if index is invalid"),
// and hangs with a hung GPU.
func (l library) DeviceGetHandleByIndex(i int) (nvmlapi.Device, nvml.Return) {
	n := l.n
	n.calls.count(libDeviceGetHandleByIndex)
	if n.failing() {
		return nil, nvml.ERROR_UNKNOWN
	}
	gpu, ok := n.gpuAtListedIndex(i)
	if !ok {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	return n.resolved(n.handle(gpu), nvml.ERROR_INVALID_ARGUMENT)
}

// DeviceGetHandleByUUID finds a GPU or MIG device NVML lists (nvml.h
// nvmlDeviceGetHandleByUUID: NOT_FOUND "if device doesn't exist"), and
// hangs with a hung GPU.
func (l library) DeviceGetHandleByUUID(uuid string) (nvmlapi.Device, nvml.Return) {
	n := l.n
	n.calls.count(libDeviceGetHandleByUUID)
	if n.failing() {
		return nil, nvml.ERROR_UNKNOWN
	}
	d := n.byUUID(uuid)
	if d == nil {
		return nil, nvml.ERROR_NOT_FOUND
	}
	return n.resolved(d, nvml.ERROR_NOT_FOUND)
}

// SystemGetDriverVersion answers the simulated driver's version (New:
// R570, or an old-driver fault's); it fails while an NVML failure is
// injected.
func (l library) SystemGetDriverVersion() (string, nvml.Return) {
	l.n.calls.count(libSystemGetDriverVersion)
	if l.n.failing() {
		return "", nvml.ERROR_UNKNOWN
	}
	if v := l.n.driverVersion(); v != "" {
		return v, nvml.SUCCESS
	}
	return l.n.srv.SystemGetDriverVersionFunc()
}

// SystemGetCudaDriverVersion answers the CUDA version of the simulated
// driver (nvml.h: "1000 * major + 10 * minor"); it fails while an NVML
// failure is injected.
func (l library) SystemGetCudaDriverVersion() (int, nvml.Return) {
	l.n.calls.count(libSystemGetCudaDriverVersion)
	if l.n.failing() {
		return 0, nvml.ERROR_UNKNOWN
	}
	return l.n.srv.SystemGetCudaDriverVersionFunc()
}

// Extensions answers LookupSymbol as the simulated driver's library would
// (preflight.go): every symbol the agent calls, except those newer than an
// old-driver fault's version.
func (l library) Extensions() nvml.ExtendedInterface {
	l.n.calls.count(libExtensions)
	return symbols(l)
}

func (n *Node) byUUID(uuid string) nvmlapi.Device {
	for i, d := range n.devices {
		if d.UUID == uuid {
			return n.handle(i)
		}
	}
	n.mu.RLock()
	defer n.mu.RUnlock()
	for _, g := range n.gpus {
		for _, m := range g.mig {
			if m.info.UUID == uuid {
				return n.migHandle(g.index, m.dev)
			}
		}
	}
	return nil
}

// resolved finishes a handle lookup that found d: a GPU that NVML does not
// list is notFound, and a hung GPU (or a MIG device of one) holds the
// lookup until the hang is cleared.
func (n *Node) resolved(d nvmlapi.Device, notFound nvml.Return) (nvmlapi.Device, nvml.Return) {
	dd := d.(device)
	if !n.isListed(dd.g.gpu) {
		return nil, notFound
	}
	dd.g.wait()
	return d, nvml.SUCCESS
}

// EventSetCreate creates an event set fed by injected faults (faults.go).
func (l library) EventSetCreate() (nvmlapi.EventSet, nvml.Return) {
	n := l.n
	n.calls.count(libEventSetCreate)
	fs := n.faults
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.nvmlFailed {
		return nil, nvml.ERROR_UNKNOWN
	}
	es := &eventSet{fs: fs, calls: n.calls, ch: make(chan nvmlapi.EventData, 256), masks: map[int]uint64{}}
	fs.sets[es] = struct{}{}
	return es, nvml.SUCCESS
}

func (s nvmlSet) Free() nvml.Return { return s.es.free() }

func (s nvmlSet) Wait(timeoutms uint32) (nvml.EventData, nvml.Return) {
	e, ret := s.es.wait(timeoutms)
	var dev nvml.Device
	if d, ok := e.Device.(device); ok {
		dev = d.m
	}
	return nvml.EventData{Device: dev, EventType: e.EventType, EventData: e.EventData,
		GpuInstanceId: e.GpuInstanceId, ComputeInstanceId: e.ComputeInstanceId}, ret
}

// The device calls: each passes the GPU's gate (counted, held while the
// GPU hangs) and calls the mock's function.

func (d device) GetUUID() (string, nvml.Return) {
	d.g.enter(devGetUUID)
	return d.m.GetUUIDFunc()
}

func (d device) GetPciInfo() (nvml.PciInfo, nvml.Return) {
	d.g.enter(devGetPciInfo)
	return d.m.GetPciInfoFunc()
}

func (d device) GetName() (string, nvml.Return) {
	d.g.enter(devGetName)
	return d.m.GetNameFunc()
}

// GetBrand is the profile's brand (go-nvml's mock server sets it from the
// GPU's config; nvml.h nvmlDeviceGetBrand).
func (d device) GetBrand() (nvml.BrandType, nvml.Return) {
	d.g.enter(devGetBrand)
	return d.m.GetBrandFunc()
}

func (d device) GetMemoryInfo() (nvml.Memory, nvml.Return) {
	d.g.enter(devGetMemoryInfo)
	return d.m.GetMemoryInfoFunc()
}

func (d device) GetMinorNumber() (int, nvml.Return) {
	d.g.enter(devGetMinorNumber)
	return d.m.GetMinorNumberFunc()
}

// GetTopologyCommonAncestor hands the mock the other handle's mock device;
// a handle of another library is no device of this one (nvml.h:
// INVALID_ARGUMENT "if device1 or device2 is invalid").
func (d device) GetTopologyCommonAncestor(other nvmlapi.Device) (nvml.GpuTopologyLevel, nvml.Return) {
	d.g.enter(devGetTopologyCommonAncestor)
	var o nvml.Device
	if od, ok := other.(device); ok {
		o = od.m
	}
	return d.m.GetTopologyCommonAncestorFunc(o)
}

func (d device) GetNvLinkState(l int) (nvml.EnableState, nvml.Return) {
	d.g.enter(devGetNvLinkState)
	return d.m.GetNvLinkStateFunc(l)
}

func (d device) GetNvLinkRemoteDeviceType(l int) (nvml.IntNvLinkDeviceType, nvml.Return) {
	d.g.enter(devGetNvLinkRemoteDeviceType)
	return d.m.GetNvLinkRemoteDeviceTypeFunc(l)
}

func (d device) GetNvLinkRemotePciInfo(l int) (nvml.PciInfo, nvml.Return) {
	d.g.enter(devGetNvLinkRemotePciInfo)
	return d.m.GetNvLinkRemotePciInfoFunc(l)
}

func (d device) GetMigMode() (int, int, nvml.Return) {
	d.g.enter(devGetMigMode)
	return d.m.GetMigModeFunc()
}

func (d device) GetMaxMigDeviceCount() (int, nvml.Return) {
	d.g.enter(devGetMaxMigDeviceCount)
	return d.m.GetMaxMigDeviceCountFunc()
}

// GetMigDeviceHandleByIndex wraps the MIG device's mock (mig_devices.go)
// in a handle that shares this GPU's gate.
func (d device) GetMigDeviceHandleByIndex(i int) (nvmlapi.Device, nvml.Return) {
	d.g.enter(devGetMigDeviceHandleByIndex)
	m, ret := d.m.GetMigDeviceHandleByIndexFunc(i)
	md, ok := m.(*mock.Device)
	if !ok || md == nil {
		return nil, ret
	}
	return device{m: md, g: d.g}, ret
}

func (d device) GetGpuInstanceId() (int, nvml.Return) {
	d.g.enter(devGetGpuInstanceId)
	return d.m.GetGpuInstanceIdFunc()
}

func (d device) GetComputeInstanceId() (int, nvml.Return) {
	d.g.enter(devGetComputeInstanceId)
	return d.m.GetComputeInstanceIdFunc()
}

func (d device) GetAttributes() (nvml.DeviceAttributes, nvml.Return) {
	d.g.enter(devGetAttributes)
	return d.m.GetAttributesFunc()
}

// GetGpuInstanceById wraps the simulator's GPU instance (mig_devices.go)
// in a handle that shares this GPU's gate (mig_handles.go).
func (d device) GetGpuInstanceById(id int) (nvmlapi.GpuInstance, nvml.Return) {
	d.g.enter(devGetGpuInstanceById)
	gi, ret := d.m.GetGpuInstanceByIdFunc(id)
	return giHandleOf(gi, d.g), ret
}

func (d device) GetGpuInstanceProfileInfo(p int) (nvml.GpuInstanceProfileInfo, nvml.Return) {
	d.g.enter(devGetGpuInstanceProfileInfo)
	return d.m.GetGpuInstanceProfileInfoFunc(p)
}

func (d device) GetGpuInstancePossiblePlacements(info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstancePlacement, nvml.Return) {
	d.g.enter(devGetGpuInstancePossiblePlacements)
	return d.m.GetGpuInstancePossiblePlacementsFunc(info)
}

// CreateGpuInstanceWithPlacement makes a GPU instance (mig_make.go) and
// hands back its handle.
func (d device) CreateGpuInstanceWithPlacement(info *nvml.GpuInstanceProfileInfo, at *nvml.GpuInstancePlacement) (nvmlapi.GpuInstance, nvml.Return) {
	d.g.enter(devCreateGpuInstanceWithPlacement)
	gi, ret := d.m.CreateGpuInstanceWithPlacementFunc(info, at)
	return giHandleOf(gi, d.g), ret
}

func (d device) GetGpuInstances(info *nvml.GpuInstanceProfileInfo) ([]nvmlapi.GpuInstance, nvml.Return) {
	d.g.enter(devGetGpuInstances)
	gis, ret := d.m.GetGpuInstancesFunc(info)
	if gis == nil {
		return nil, ret
	}
	out := make([]nvmlapi.GpuInstance, 0, len(gis))
	for _, gi := range gis {
		if h := giHandleOf(gi, d.g); h != nil {
			out = append(out, h)
		}
	}
	return out, ret
}

// RegisterEvents hands the mock the simulated set (faults.go); a set of
// another library is invalid (nvml.h nvmlDeviceRegisterEvents:
// INVALID_ARGUMENT "if eventTypes is invalid or set is NULL").
func (d device) RegisterEvents(mask uint64, set nvmlapi.EventSet) nvml.Return {
	d.g.enter(devRegisterEvents)
	var s nvml.EventSet
	if es, ok := set.(*eventSet); ok && es != nil {
		s = nvmlSet{es}
	}
	return d.m.RegisterEventsFunc(mask, s)
}

func (d device) GetUtilizationRates() (nvml.Utilization, nvml.Return) {
	d.g.enter(devGetUtilizationRates)
	return d.m.GetUtilizationRatesFunc()
}

func (d device) GetClockInfo(t nvml.ClockType) (uint32, nvml.Return) {
	d.g.enter(devGetClockInfo)
	return d.m.GetClockInfoFunc(t)
}

func (d device) GetTemperature(s nvml.TemperatureSensors) (uint32, nvml.Return) {
	d.g.enter(devGetTemperature)
	return d.m.GetTemperatureFunc(s)
}

func (d device) GetPowerUsage() (uint32, nvml.Return) {
	d.g.enter(devGetPowerUsage)
	return d.m.GetPowerUsageFunc()
}

func (d device) GetTotalEnergyConsumption() (uint64, nvml.Return) {
	d.g.enter(devGetTotalEnergyConsumption)
	return d.m.GetTotalEnergyConsumptionFunc()
}

func (d device) GetPcieReplayCounter() (int, nvml.Return) {
	d.g.enter(devGetPcieReplayCounter)
	return d.m.GetPcieReplayCounterFunc()
}

func (d device) GetFieldValues(v []nvml.FieldValue) nvml.Return {
	d.g.enter(devGetFieldValues)
	return d.m.GetFieldValuesFunc(v)
}

func (d device) GetEccMode() (nvml.EnableState, nvml.EnableState, nvml.Return) {
	d.g.enter(devGetEccMode)
	return d.m.GetEccModeFunc()
}

func (d device) GetTotalEccErrors(t nvml.MemoryErrorType, c nvml.EccCounterType) (uint64, nvml.Return) {
	d.g.enter(devGetTotalEccErrors)
	return d.m.GetTotalEccErrorsFunc(t, c)
}

func (d device) GetRetiredPages(c nvml.PageRetirementCause) ([]uint64, nvml.Return) {
	d.g.enter(devGetRetiredPages)
	return d.m.GetRetiredPagesFunc(c)
}

func (d device) GetRetiredPagesPendingStatus() (nvml.EnableState, nvml.Return) {
	d.g.enter(devGetRetiredPagesPendingStatus)
	return d.m.GetRetiredPagesPendingStatusFunc()
}

func (d device) GetRemappedRows() (int, int, bool, bool, nvml.Return) {
	d.g.enter(devGetRemappedRows)
	return d.m.GetRemappedRowsFunc()
}

func (d device) GetGpuFabricInfo() (nvml.GpuFabricInfo, nvml.Return) {
	d.g.enter(devGetGpuFabricInfo)
	return d.m.GetGpuFabricInfoFunc()
}

func (d device) GetNvLinkErrorCounter(l int, c nvml.NvLinkErrorCounter) (uint64, nvml.Return) {
	d.g.enter(devGetNvLinkErrorCounter)
	return d.m.GetNvLinkErrorCounterFunc(l, c)
}

// GetCudaComputeCapability answers go-nvml's mock configuration of the
// model (9.0 for H100, 8.0 for A100).
func (d device) GetCudaComputeCapability() (int, int, nvml.Return) {
	d.g.enter(devGetCudaComputeCapability)
	return d.m.GetCudaComputeCapabilityFunc()
}

func (d device) GetEncoderUtilization() (uint32, uint32, nvml.Return) {
	d.g.enter(devGetEncoderUtilization)
	return d.m.GetEncoderUtilizationFunc()
}

func (d device) GetDecoderUtilization() (uint32, uint32, nvml.Return) {
	d.g.enter(devGetDecoderUtilization)
	return d.m.GetDecoderUtilizationFunc()
}

func (d device) GetMemoryInfo_v2() (nvml.Memory_v2, nvml.Return) {
	d.g.enter(devGetMemoryInfoV2)
	return d.m.GetMemoryInfo_v2Func()
}

func (d device) GetGridLicensableFeatures() (nvml.GridLicensableFeatures, nvml.Return) {
	d.g.enter(devGetGridLicensableFeatures)
	return d.m.GetGridLicensableFeaturesFunc()
}

// GetComputeRunningProcesses answers the processes with a compute context
// (processes.go).
func (d device) GetComputeRunningProcesses() ([]nvml.ProcessInfo, nvml.Return) {
	d.g.enter(devGetComputeRunningProcesses)
	return d.m.GetComputeRunningProcessesFunc()
}

// GetGraphicsRunningProcesses answers the processes with a graphics context
// (processes.go).
func (d device) GetGraphicsRunningProcesses() ([]nvml.ProcessInfo, nvml.Return) {
	d.g.enter(devGetGraphicsRunningProcesses)
	return d.m.GetGraphicsRunningProcessesFunc()
}

// GetProcessUtilization answers per-process utilisation samples
// (process_util.go).
func (d device) GetProcessUtilization(lastSeen uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
	d.g.enter(devGetProcessUtilization)
	return d.m.GetProcessUtilizationFunc(lastSeen)
}

// The preflight readings (preflight.go).

func (d device) GetCurrPcieLinkGeneration() (int, nvml.Return) {
	d.g.enter(devGetCurrPcieLinkGeneration)
	return d.m.GetCurrPcieLinkGenerationFunc()
}

func (d device) GetCurrPcieLinkWidth() (int, nvml.Return) {
	d.g.enter(devGetCurrPcieLinkWidth)
	return d.m.GetCurrPcieLinkWidthFunc()
}

func (d device) GetMaxPcieLinkGeneration() (int, nvml.Return) {
	d.g.enter(devGetMaxPcieLinkGeneration)
	return d.m.GetMaxPcieLinkGenerationFunc()
}

func (d device) GetMaxPcieLinkWidth() (int, nvml.Return) {
	d.g.enter(devGetMaxPcieLinkWidth)
	return d.m.GetMaxPcieLinkWidthFunc()
}

func (d device) GetPersistenceMode() (nvml.EnableState, nvml.Return) {
	d.g.enter(devGetPersistenceMode)
	return d.m.GetPersistenceModeFunc()
}

func (d device) GetCurrentClocksEventReasons() (uint64, nvml.Return) {
	d.g.enter(devGetCurrentClocksEventReasons)
	return d.m.GetCurrentClocksEventReasonsFunc()
}

func (d device) GetCurrentClocksThrottleReasons() (uint64, nvml.Return) {
	d.g.enter(devGetCurrentClocksThrottleReasons)
	return d.m.GetCurrentClocksThrottleReasonsFunc()
}
