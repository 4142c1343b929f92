package nvmlapi

import "github.com/NVIDIA/go-nvml/pkg/nvml"

// Wrap adapts go-nvml's library (nvml.New() in production) to Library.
// Every method forwards to the one of the same name; handles (devices, GPU
// and compute instances) and event sets are wrapped on the way out and
// unwrapped on the way in, so one device's handles still compare equal.
func Wrap(lib nvml.Interface) Library { return library{lib} }

type (
	library         struct{ l nvml.Interface }
	device          struct{ d nvml.Device }
	gpuInstance     struct{ gi nvml.GpuInstance }
	computeInstance struct{ ci nvml.ComputeInstance }
	eventSet        struct{ s nvml.EventSet }
)

var (
	_ Library         = library{}
	_ Device          = device{}
	_ GpuInstance     = gpuInstance{}
	_ ComputeInstance = computeInstance{}
	_ EventSet        = eventSet{}
)

// WrapDevice adapts one go-nvml handle, as Wrap's library hands it out (so
// it compares equal to those); a nil handle stays nil, so callers' nil
// checks work.
func WrapDevice(d nvml.Device) Device {
	if d == nil {
		return nil
	}
	return device{d}
}

// wrapGpuInstance adapts one go-nvml GPU instance; nil stays nil.
func wrapGpuInstance(gi nvml.GpuInstance) GpuInstance {
	if gi == nil {
		return nil
	}
	return gpuInstance{gi}
}

// wrapComputeInstance adapts one go-nvml compute instance; nil stays nil.
func wrapComputeInstance(ci nvml.ComputeInstance) ComputeInstance {
	if ci == nil {
		return nil
	}
	return computeInstance{ci}
}

func (l library) Init() nvml.Return                  { return l.l.Init() }
func (l library) Shutdown() nvml.Return              { return l.l.Shutdown() }
func (l library) DeviceGetCount() (int, nvml.Return) { return l.l.DeviceGetCount() }

func (l library) SystemGetDriverVersion() (string, nvml.Return) { return l.l.SystemGetDriverVersion() }

func (l library) SystemGetCudaDriverVersion() (int, nvml.Return) {
	return l.l.SystemGetCudaDriverVersion()
}

func (l library) Extensions() nvml.ExtendedInterface { return l.l.Extensions() }

func (l library) DeviceGetHandleByIndex(i int) (Device, nvml.Return) {
	d, ret := l.l.DeviceGetHandleByIndex(i)
	return WrapDevice(d), ret
}

func (l library) DeviceGetHandleByUUID(uuid string) (Device, nvml.Return) {
	d, ret := l.l.DeviceGetHandleByUUID(uuid)
	return WrapDevice(d), ret
}

func (l library) EventSetCreate() (EventSet, nvml.Return) {
	s, ret := l.l.EventSetCreate()
	if s == nil {
		return nil, ret
	}
	return eventSet{s}, ret
}

func (s eventSet) Free() nvml.Return { return s.s.Free() }

func (s eventSet) Wait(timeoutms uint32) (EventData, nvml.Return) {
	e, ret := s.s.Wait(timeoutms)
	return EventData{
		Device:            WrapDevice(e.Device),
		EventType:         e.EventType,
		EventData:         e.EventData,
		GpuInstanceId:     e.GpuInstanceId,
		ComputeInstanceId: e.ComputeInstanceId,
	}, ret
}

func (d device) GetUUID() (string, nvml.Return)                 { return d.d.GetUUID() }
func (d device) GetPciInfo() (nvml.PciInfo, nvml.Return)        { return d.d.GetPciInfo() }
func (d device) GetName() (string, nvml.Return)                 { return d.d.GetName() }
func (d device) GetBrand() (nvml.BrandType, nvml.Return)        { return d.d.GetBrand() }
func (d device) GetMemoryInfo() (nvml.Memory, nvml.Return)      { return d.d.GetMemoryInfo() }
func (d device) GetMinorNumber() (int, nvml.Return)             { return d.d.GetMinorNumber() }
func (d device) GetMigMode() (int, int, nvml.Return)            { return d.d.GetMigMode() }
func (d device) GetMaxMigDeviceCount() (int, nvml.Return)       { return d.d.GetMaxMigDeviceCount() }
func (d device) GetGpuInstanceId() (int, nvml.Return)           { return d.d.GetGpuInstanceId() }
func (d device) GetComputeInstanceId() (int, nvml.Return)       { return d.d.GetComputeInstanceId() }
func (d device) GetPowerUsage() (uint32, nvml.Return)           { return d.d.GetPowerUsage() }
func (d device) GetPcieReplayCounter() (int, nvml.Return)       { return d.d.GetPcieReplayCounter() }
func (d device) GetFieldValues(v []nvml.FieldValue) nvml.Return { return d.d.GetFieldValues(v) }

func (d device) GetNvLinkState(l int) (nvml.EnableState, nvml.Return) { return d.d.GetNvLinkState(l) }

func (d device) GetNvLinkRemoteDeviceType(l int) (nvml.IntNvLinkDeviceType, nvml.Return) {
	return d.d.GetNvLinkRemoteDeviceType(l)
}

func (d device) GetNvLinkRemotePciInfo(l int) (nvml.PciInfo, nvml.Return) {
	return d.d.GetNvLinkRemotePciInfo(l)
}

// GetTopologyCommonAncestor unwraps other; a handle that did not come from
// this adapter is not a device of this library (nvml.h: INVALID_ARGUMENT
// "if device1 or device2 is invalid").
func (d device) GetTopologyCommonAncestor(other Device) (nvml.GpuTopologyLevel, nvml.Return) {
	o, ok := other.(device)
	if !ok {
		return 0, nvml.ERROR_INVALID_ARGUMENT
	}
	return d.d.GetTopologyCommonAncestor(o.d)
}

func (d device) GetMigDeviceHandleByIndex(i int) (Device, nvml.Return) {
	m, ret := d.d.GetMigDeviceHandleByIndex(i)
	return WrapDevice(m), ret
}

func (d device) GetAttributes() (nvml.DeviceAttributes, nvml.Return) { return d.d.GetAttributes() }

func (d device) GetGpuInstanceById(id int) (GpuInstance, nvml.Return) {
	gi, ret := d.d.GetGpuInstanceById(id)
	return wrapGpuInstance(gi), ret
}

func (d device) GetGpuInstanceProfileInfo(p int) (nvml.GpuInstanceProfileInfo, nvml.Return) {
	return d.d.GetGpuInstanceProfileInfo(p)
}

func (d device) GetGpuInstancePossiblePlacements(info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstancePlacement, nvml.Return) {
	return d.d.GetGpuInstancePossiblePlacements(info)
}

func (d device) CreateGpuInstanceWithPlacement(info *nvml.GpuInstanceProfileInfo, at *nvml.GpuInstancePlacement) (GpuInstance, nvml.Return) {
	gi, ret := d.d.CreateGpuInstanceWithPlacement(info, at)
	return wrapGpuInstance(gi), ret
}

// GetGpuInstances wraps each instance. go-nvml sizes its buffer by
// info.InstanceCount and indexes its first element: callers pass the info
// of a profile that allows at least one instance.
func (d device) GetGpuInstances(info *nvml.GpuInstanceProfileInfo) ([]GpuInstance, nvml.Return) {
	gis, ret := d.d.GetGpuInstances(info)
	if gis == nil {
		return nil, ret
	}
	out := make([]GpuInstance, len(gis))
	for i, gi := range gis {
		out[i] = wrapGpuInstance(gi)
	}
	return out, ret
}

func (g gpuInstance) GetInfo() (nvml.GpuInstanceInfo, nvml.Return) { return g.gi.GetInfo() }
func (g gpuInstance) Destroy() nvml.Return                         { return g.gi.Destroy() }

func (g gpuInstance) GetComputeInstanceProfileInfo(profile, engProfile int) (nvml.ComputeInstanceProfileInfo, nvml.Return) {
	return g.gi.GetComputeInstanceProfileInfo(profile, engProfile)
}

func (g gpuInstance) CreateComputeInstance(info *nvml.ComputeInstanceProfileInfo) (ComputeInstance, nvml.Return) {
	ci, ret := g.gi.CreateComputeInstance(info)
	return wrapComputeInstance(ci), ret
}

func (g gpuInstance) GetComputeInstanceById(id int) (ComputeInstance, nvml.Return) {
	ci, ret := g.gi.GetComputeInstanceById(id)
	return wrapComputeInstance(ci), ret
}

func (c computeInstance) Destroy() nvml.Return { return c.ci.Destroy() }

// GetInfo wraps the info's MIG device and GPU instance, so the device
// compares equal to its handle from GetMigDeviceHandleByIndex.
func (c computeInstance) GetInfo() (ComputeInstanceInfo, nvml.Return) {
	info, ret := c.ci.GetInfo()
	return ComputeInstanceInfo{
		Device:      WrapDevice(info.Device),
		GpuInstance: wrapGpuInstance(info.GpuInstance),
		Id:          info.Id,
		ProfileId:   info.ProfileId,
		Placement:   info.Placement,
	}, ret
}

// RegisterEvents unwraps set; a set that did not come from this adapter is
// not one of this library's (nvml.h nvmlDeviceRegisterEvents:
// INVALID_ARGUMENT "if eventTypes is invalid or set is NULL").
func (d device) RegisterEvents(mask uint64, set EventSet) nvml.Return {
	s, ok := set.(eventSet)
	if !ok {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	return d.d.RegisterEvents(mask, s.s)
}

func (d device) GetUtilizationRates() (nvml.Utilization, nvml.Return) {
	return d.d.GetUtilizationRates()
}

func (d device) GetClockInfo(t nvml.ClockType) (uint32, nvml.Return) { return d.d.GetClockInfo(t) }

func (d device) GetTemperature(s nvml.TemperatureSensors) (uint32, nvml.Return) {
	return d.d.GetTemperature(s)
}

func (d device) GetTotalEnergyConsumption() (uint64, nvml.Return) {
	return d.d.GetTotalEnergyConsumption()
}

func (d device) GetEccMode() (nvml.EnableState, nvml.EnableState, nvml.Return) {
	return d.d.GetEccMode()
}

func (d device) GetTotalEccErrors(t nvml.MemoryErrorType, c nvml.EccCounterType) (uint64, nvml.Return) {
	return d.d.GetTotalEccErrors(t, c)
}

func (d device) GetRetiredPages(c nvml.PageRetirementCause) ([]uint64, nvml.Return) {
	return d.d.GetRetiredPages(c)
}

func (d device) GetRetiredPagesPendingStatus() (nvml.EnableState, nvml.Return) {
	return d.d.GetRetiredPagesPendingStatus()
}

func (d device) GetRemappedRows() (int, int, bool, bool, nvml.Return) { return d.d.GetRemappedRows() }

func (d device) GetGpuFabricInfo() (nvml.GpuFabricInfo, nvml.Return) { return d.d.GetGpuFabricInfo() }

func (d device) GetNvLinkErrorCounter(l int, c nvml.NvLinkErrorCounter) (uint64, nvml.Return) {
	return d.d.GetNvLinkErrorCounter(l, c)
}

func (d device) GetCudaComputeCapability() (int, int, nvml.Return) {
	return d.d.GetCudaComputeCapability()
}

func (d device) GetEncoderUtilization() (uint32, uint32, nvml.Return) {
	return d.d.GetEncoderUtilization()
}

func (d device) GetDecoderUtilization() (uint32, uint32, nvml.Return) {
	return d.d.GetDecoderUtilization()
}

func (d device) GetMemoryInfo_v2() (nvml.Memory_v2, nvml.Return) { return d.d.GetMemoryInfo_v2() }

func (d device) GetGridLicensableFeatures() (nvml.GridLicensableFeatures, nvml.Return) {
	return d.d.GetGridLicensableFeatures()
}

func (d device) GetCurrPcieLinkGeneration() (int, nvml.Return) {
	return d.d.GetCurrPcieLinkGeneration()
}
func (d device) GetCurrPcieLinkWidth() (int, nvml.Return)     { return d.d.GetCurrPcieLinkWidth() }
func (d device) GetMaxPcieLinkGeneration() (int, nvml.Return) { return d.d.GetMaxPcieLinkGeneration() }
func (d device) GetMaxPcieLinkWidth() (int, nvml.Return)      { return d.d.GetMaxPcieLinkWidth() }

func (d device) GetPersistenceMode() (nvml.EnableState, nvml.Return) { return d.d.GetPersistenceMode() }

func (d device) GetCurrentClocksEventReasons() (uint64, nvml.Return) {
	return d.d.GetCurrentClocksEventReasons()
}

func (d device) GetCurrentClocksThrottleReasons() (uint64, nvml.Return) {
	return d.d.GetCurrentClocksThrottleReasons()
}

func (d device) GetComputeRunningProcesses() ([]nvml.ProcessInfo, nvml.Return) {
	return d.d.GetComputeRunningProcesses()
}

func (d device) GetGraphicsRunningProcesses() ([]nvml.ProcessInfo, nvml.Return) {
	return d.d.GetGraphicsRunningProcesses()
}

func (d device) GetProcessUtilization(lastSeen uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
	return d.d.GetProcessUtilization(lastSeen)
}
