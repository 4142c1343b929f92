// Package nvmlapi is the part of NVML the agent calls: 69 methods of
// go-nvml's nvml.Interface, nvml.Device, nvml.GpuInstance,
// nvml.ComputeInstance and nvml.EventSet, with go-nvml's signatures except
// that handles are of these narrow types.
// The real library is go-nvml behind Wrap; the simulator (package sim)
// implements these interfaces and nothing more.
//
// It is a package of its own, below nvmlowner (which re-exports its types),
// so that the simulator can implement it while nvmlowner's own tests use
// the simulator.
package nvmlapi

import "github.com/NVIDIA/go-nvml/pkg/nvml"

// Library is the library-wide NVML calls the agent makes: lifecycle,
// device enumeration and event sets.
type Library interface {
	Init() nvml.Return
	Shutdown() nvml.Return
	DeviceGetCount() (int, nvml.Return)
	DeviceGetHandleByIndex(int) (Device, nvml.Return)
	DeviceGetHandleByUUID(string) (Device, nvml.Return)
	EventSetCreate() (EventSet, nvml.Return)
	// Versions, for the node labels and DCGM_FI_DRIVER_VERSION.
	SystemGetDriverVersion() (string, nvml.Return)
	SystemGetCudaDriverVersion() (int, nvml.Return)
	// Extensions looks symbols up in the loaded library (LookupSymbol),
	// so that a call a driver may lack is made only where it exists:
	// go-nvml links NVML's functions lazily, and calling one the driver
	// does not export crashes the process rather than returning
	// ERROR_FUNCTION_NOT_FOUND.
	Extensions() nvml.ExtendedInterface
}

// Device is the NVML calls the agent makes on a GPU or MIG device handle.
// Handles of one device compare equal (the event watcher finds an event's
// GPU by comparing handles).
type Device interface {
	// Identity and discovery.
	GetUUID() (string, nvml.Return)
	GetPciInfo() (nvml.PciInfo, nvml.Return)
	GetName() (string, nvml.Return)
	GetBrand() (nvml.BrandType, nvml.Return)
	GetMemoryInfo() (nvml.Memory, nvml.Return)
	GetMinorNumber() (int, nvml.Return)
	GetTopologyCommonAncestor(Device) (nvml.GpuTopologyLevel, nvml.Return)
	GetNvLinkState(int) (nvml.EnableState, nvml.Return)
	GetNvLinkRemoteDeviceType(int) (nvml.IntNvLinkDeviceType, nvml.Return)
	GetNvLinkRemotePciInfo(int) (nvml.PciInfo, nvml.Return)
	GetCudaComputeCapability() (int, int, nvml.Return)

	// MIG.
	GetMigMode() (int, int, nvml.Return)
	GetMaxMigDeviceCount() (int, nvml.Return)
	GetMigDeviceHandleByIndex(int) (Device, nvml.Return)
	GetGpuInstanceId() (int, nvml.Return)
	GetComputeInstanceId() (int, nvml.Return)
	GetAttributes() (nvml.DeviceAttributes, nvml.Return)
	GetGpuInstanceById(int) (GpuInstance, nvml.Return)
	GetGpuInstanceProfileInfo(int) (nvml.GpuInstanceProfileInfo, nvml.Return)

	// MIG devices made on demand: every placement of a GPU instance
	// profile (all of them, occupied or not: nvml.h), a GPU instance made
	// at one, and the GPU instances of a profile.
	GetGpuInstancePossiblePlacements(*nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstancePlacement, nvml.Return)
	CreateGpuInstanceWithPlacement(*nvml.GpuInstanceProfileInfo, *nvml.GpuInstancePlacement) (GpuInstance, nvml.Return)
	GetGpuInstances(*nvml.GpuInstanceProfileInfo) ([]GpuInstance, nvml.Return)

	// Events.
	RegisterEvents(uint64, EventSet) nvml.Return

	// Sampled readings.
	GetUtilizationRates() (nvml.Utilization, nvml.Return)
	GetClockInfo(nvml.ClockType) (uint32, nvml.Return)
	GetTemperature(nvml.TemperatureSensors) (uint32, nvml.Return)
	GetPowerUsage() (uint32, nvml.Return)
	GetTotalEnergyConsumption() (uint64, nvml.Return)
	GetPcieReplayCounter() (int, nvml.Return)
	GetFieldValues([]nvml.FieldValue) nvml.Return
	GetEccMode() (nvml.EnableState, nvml.EnableState, nvml.Return)
	GetTotalEccErrors(nvml.MemoryErrorType, nvml.EccCounterType) (uint64, nvml.Return)
	GetRetiredPages(nvml.PageRetirementCause) ([]uint64, nvml.Return)
	GetRetiredPagesPendingStatus() (nvml.EnableState, nvml.Return)
	GetRemappedRows() (int, int, bool, bool, nvml.Return)
	GetGpuFabricInfo() (nvml.GpuFabricInfo, nvml.Return)
	GetNvLinkErrorCounter(int, nvml.NvLinkErrorCounter) (uint64, nvml.Return)
	GetEncoderUtilization() (uint32, uint32, nvml.Return)
	GetDecoderUtilization() (uint32, uint32, nvml.Return)
	GetMemoryInfo_v2() (nvml.Memory_v2, nvml.Return)
	GetGridLicensableFeatures() (nvml.GridLicensableFeatures, nvml.Return)

	// Preflight readings (package preflight): the PCIe link as trained
	// and at its maximum, driver persistence, and why the clocks are
	// held down. ClocksEventReasons is the R535+ name of
	// ClocksThrottleReasons (nvml.h marks the latter deprecated); the
	// owner calls the old one only where the driver lacks the new one.
	GetCurrPcieLinkGeneration() (int, nvml.Return)
	GetCurrPcieLinkWidth() (int, nvml.Return)
	GetMaxPcieLinkGeneration() (int, nvml.Return)
	GetMaxPcieLinkWidth() (int, nvml.Return)
	GetPersistenceMode() (nvml.EnableState, nvml.Return)
	GetCurrentClocksEventReasons() (uint64, nvml.Return)
	GetCurrentClocksThrottleReasons() (uint64, nvml.Return)

	// The processes holding a context on the device (go-nvml calls the
	// _v3 functions, nvmlProcessInfo_t with GPU and compute instance IDs).
	GetComputeRunningProcesses() ([]nvml.ProcessInfo, nvml.Return)
	GetGraphicsRunningProcesses() ([]nvml.ProcessInfo, nvml.Return)
	// Per-process utilisation samples newer than a CPU timestamp in
	// microseconds (nvmlDeviceGetProcessUtilization; go-nvml sizes the
	// buffer with a first call). nvmlDeviceGetProcessesUtilizationInfo,
	// its successor, is not used: go-nvml v0.13.3-1's wrapper passes it
	// neither a buffer nor lastSeenTimeStamp, so it can only answer
	// INSUFFICIENT_SIZE while a process has samples.
	GetProcessUtilization(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return)
}

// GpuInstance is the calls the agent makes on a MIG GPU instance: its
// info (to tell the instance's profile and placement), and making and
// destroying it with the compute instance that spans it. go-nvml's
// nvml.GpuInstance returns its compute instances as nvml.ComputeInstance,
// so Wrap wraps it.
type GpuInstance interface {
	GetInfo() (nvml.GpuInstanceInfo, nvml.Return)
	GetComputeInstanceProfileInfo(profile, engProfile int) (nvml.ComputeInstanceProfileInfo, nvml.Return)
	CreateComputeInstance(*nvml.ComputeInstanceProfileInfo) (ComputeInstance, nvml.Return)
	GetComputeInstanceById(int) (ComputeInstance, nvml.Return)
	Destroy() nvml.Return
}

// ComputeInstance is a MIG compute instance: its info (the MIG device it
// is) and its destruction.
type ComputeInstance interface {
	GetInfo() (ComputeInstanceInfo, nvml.Return)
	Destroy() nvml.Return
}

// ComputeInstanceInfo is nvml.ComputeInstanceInfo (nvml.h,
// nvmlComputeInstanceInfo_t) with the MIG device and the GPU instance as
// handles of this package.
type ComputeInstanceInfo struct {
	// Device is the compute instance's MIG device.
	Device      Device
	GpuInstance GpuInstance
	Id          uint32
	ProfileId   uint32
	Placement   nvml.ComputeInstancePlacement
}

// EventSet is an NVML event set.
type EventSet interface {
	Wait(timeoutms uint32) (EventData, nvml.Return)
	Free() nvml.Return
}

// EventData is nvml.EventData (nvml.h, nvmlEventData_t) with the device as
// a Device handle.
type EventData struct {
	Device            Device
	EventType         uint64
	EventData         uint64
	GpuInstanceId     uint32
	ComputeInstanceId uint32
}
