package sim

import (
	"sync/atomic"
)

// callCounts counts the NVML calls made through a node's handles, by
// method: one atomic counter per method of nvmlapi.Library, nvmlapi.Device,
// nvmlapi.GpuInstance, nvmlapi.ComputeInstance and nvmlapi.EventSet
// (direct.go and mig_handles.go increment them), so counting costs an
// atomic add and its memory is fixed however long the agent runs.
type callCounts struct {
	lib [numLibCalls]atomic.Uint64
	dev [numDeviceCalls]atomic.Uint64
}

// The library calls, counted under go-nvml's nvml.Interface names (an
// event set's Wait and Free as EventSetWait and EventSetFree).
const (
	libInit = iota
	libShutdown
	libDeviceGetCount
	libDeviceGetHandleByIndex
	libDeviceGetHandleByUUID
	libEventSetCreate
	libEventSetWait
	libEventSetFree
	libSystemGetDriverVersion
	libSystemGetCudaDriverVersion
	libExtensions
	numLibCalls
)

var libCallNames = [numLibCalls]string{
	"Init", "Shutdown", "DeviceGetCount", "DeviceGetHandleByIndex", "DeviceGetHandleByUUID",
	"EventSetCreate", "EventSetWait", "EventSetFree", "SystemGetDriverVersion", "SystemGetCudaDriverVersion",
	"Extensions",
}

// The device calls, counted under their nvml.Device names.
const (
	devGetUUID = iota
	devGetPciInfo
	devGetName
	devGetMemoryInfo
	devGetMinorNumber
	devGetTopologyCommonAncestor
	devGetNvLinkState
	devGetNvLinkRemoteDeviceType
	devGetNvLinkRemotePciInfo
	devGetMigMode
	devGetMaxMigDeviceCount
	devGetMigDeviceHandleByIndex
	devGetGpuInstanceId
	devGetComputeInstanceId
	devGetAttributes
	devGetGpuInstanceById
	devGetGpuInstanceProfileInfo
	devRegisterEvents
	devGetUtilizationRates
	devGetClockInfo
	devGetTemperature
	devGetPowerUsage
	devGetTotalEnergyConsumption
	devGetPcieReplayCounter
	devGetFieldValues
	devGetEccMode
	devGetTotalEccErrors
	devGetRetiredPages
	devGetRetiredPagesPendingStatus
	devGetRemappedRows
	devGetGpuFabricInfo
	devGetNvLinkErrorCounter
	devGetCudaComputeCapability
	devGetEncoderUtilization
	devGetDecoderUtilization
	devGetMemoryInfoV2
	devGetGridLicensableFeatures
	devGetComputeRunningProcesses
	devGetGraphicsRunningProcesses
	devGetProcessUtilization
	devGetCurrPcieLinkGeneration
	devGetCurrPcieLinkWidth
	devGetMaxPcieLinkGeneration
	devGetMaxPcieLinkWidth
	devGetPersistenceMode
	devGetCurrentClocksEventReasons
	devGetCurrentClocksThrottleReasons
	devGetBrand
	devGetGpuInstancePossiblePlacements
	devCreateGpuInstanceWithPlacement
	devGetGpuInstances
	// The calls on GPU and compute instance handles, which pass their
	// GPU's gate too.
	giGetInfo
	giGetComputeInstanceProfileInfo
	giCreateComputeInstance
	giGetComputeInstanceById
	giDestroy
	ciGetInfo
	ciDestroy
	numDeviceCalls
)

var deviceCallNames = [numDeviceCalls]string{
	"GetUUID", "GetPciInfo", "GetName", "GetMemoryInfo", "GetMinorNumber", "GetTopologyCommonAncestor",
	"GetNvLinkState", "GetNvLinkRemoteDeviceType", "GetNvLinkRemotePciInfo",
	"GetMigMode", "GetMaxMigDeviceCount", "GetMigDeviceHandleByIndex", "GetGpuInstanceId",
	"GetComputeInstanceId", "GetAttributes", "GetGpuInstanceById", "GetGpuInstanceProfileInfo",
	"RegisterEvents",
	"GetUtilizationRates", "GetClockInfo", "GetTemperature", "GetPowerUsage", "GetTotalEnergyConsumption",
	"GetPcieReplayCounter", "GetFieldValues", "GetEccMode", "GetTotalEccErrors", "GetRetiredPages",
	"GetRetiredPagesPendingStatus", "GetRemappedRows", "GetGpuFabricInfo", "GetNvLinkErrorCounter",
	"GetCudaComputeCapability", "GetEncoderUtilization", "GetDecoderUtilization", "GetMemoryInfo_v2",
	"GetGridLicensableFeatures", "GetComputeRunningProcesses", "GetGraphicsRunningProcesses", "GetProcessUtilization",
	"GetCurrPcieLinkGeneration", "GetCurrPcieLinkWidth", "GetMaxPcieLinkGeneration", "GetMaxPcieLinkWidth",
	"GetPersistenceMode", "GetCurrentClocksEventReasons", "GetCurrentClocksThrottleReasons", "GetBrand",
	"GetGpuInstancePossiblePlacements", "CreateGpuInstanceWithPlacement", "GetGpuInstances",
	"GpuInstanceGetInfo", "GpuInstanceGetComputeInstanceProfileInfo", "GpuInstanceCreateComputeInstance",
	"GpuInstanceGetComputeInstanceById", "GpuInstanceDestroy", "ComputeInstanceGetInfo", "ComputeInstanceDestroy",
}

// count counts one call of library method k (an index into libCallNames).
func (c *callCounts) count(k int) {
	if c != nil {
		c.lib[k].Add(1)
	}
}

// gpuGate is what every call on a GPU's handles (the GPU's and its MIG
// devices') passes: it counts the call and, while the GPU is hung, holds it
// until the hang is cleared. It is shared by all handles of the GPU, so
// handles stay comparable values.
type gpuGate struct {
	calls *callCounts
	// gpu is the simulator's index of the GPU; -1 for the NULL device of
	// events NVML raises without one.
	gpu  int
	hang atomic.Pointer[hangRelease]
	// held counts the calls waiting on a hang now, so tests can tell a
	// call is held rather than merely slow.
	held atomic.Int32
}

// hangRelease is closed when a hang is cleared.
type hangRelease struct{ ch chan struct{} }

// enter counts one call of device method k (an index into deviceCallNames)
// and waits while the GPU is hung.
func (g *gpuGate) enter(k int) {
	if g == nil {
		return
	}
	g.calls.dev[k].Add(1)
	g.wait()
}

// wait blocks while the GPU is hung. It holds no lock while it waits: a
// hung call must not stop the control endpoint from clearing the hang, nor
// other GPUs' calls.
func (g *gpuGate) wait() {
	if g == nil {
		return
	}
	if h := g.hang.Load(); h != nil {
		g.held.Add(1)
		<-h.ch
		g.held.Add(-1)
	}
}

// setHang hangs the GPU (on) or releases it and every call held (off).
// Hanging a hung GPU or releasing a running one changes nothing.
func (g *gpuGate) setHang(on bool) {
	if on {
		g.hang.CompareAndSwap(nil, &hangRelease{ch: make(chan struct{})})
		return
	}
	if h := g.hang.Swap(nil); h != nil {
		close(h.ch)
	}
}

// NVMLCalls returns how many calls the agent has made into the simulated
// NVML since New, by method name, for measurements: library calls under
// their nvml.Interface names (DeviceGetCount, EventSetWait, ...), device
// calls, of GPUs and MIG devices alike, under their nvml.Device names
// (GetUUID, GetMemoryInfo, ...), and GPU and compute instance calls under
// their nvml.Interface names (GpuInstanceGetInfo, ComputeInstanceDestroy,
// ...). Methods never called are left out.
func (n *Node) NVMLCalls() map[string]uint64 {
	out := map[string]uint64{}
	for k := range n.calls.lib {
		if v := n.calls.lib[k].Load(); v > 0 {
			out[libCallNames[k]] += v
		}
	}
	for k := range n.calls.dev {
		if v := n.calls.dev[k].Load(); v > 0 {
			out[deviceCallNames[k]] += v
		}
	}
	return out
}
