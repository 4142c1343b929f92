package sim

import (
	"fmt"
	"reflect"
	"sync/atomic"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// What a GPU answers depends on its architecture and on who asks. This file
// narrows the behaviour faults.go and counters.go give every GPU to what the
// driver returns for each architecture, and models a caller without root.
//
// Sources:
//   - Page retirement: nvml.h says only "For Kepler or newer fully supported
//     devices" (nvmlDeviceGetRetiredPages, _v2, PendingStatus). NVIDIA's "GPU
//     Memory Error Management" guide (docs.nvidia.com/deploy/a100-gpu-mem-
//     error-mgmt, "Row Remapping") says row remapping, on Ampere and later,
//     "is a replacement for the page retirement scheme used in prior
//     generation GPUs"; Ampere and later GPUs answer NOT_SUPPORTED.
//   - Row remapping: nvml.h nvmlDeviceGetRemappedRows, "For Ampere or newer
//     fully supported devices", and NOT_SUPPORTED "If MIG is enabled" ("On
//     MIG-enabled GPUs with active instances, querying the number of
//     remapped rows is not supported").
//   - NVLink error counters: nvml.h marks the field values of the same
//     counters, NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY/_RECOVERY/_CRC (161-163),
//     "unsupported for Blackwell+. Please use
//     NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_*" (213-215, NVLink5 counters).
//   - Per-process utilisation: nvml.h nvmlDeviceGetProcessUtilization (and
//     nvmlDeviceGetProcessesUtilizationInfo), "For Maxwell or newer fully
//     supported devices"; MIG-enabled GPUs are refused in process_util.go.
//   - Privileges: see privilegedCalls and SetUnprivileged.

// Features whose support depends on the GPU architecture.
const (
	featureRetiredPages  = "retired-pages"         // nvmlDeviceGetRetiredPages*
	featureRowRemap      = "row-remap"             // nvmlDeviceGetRemappedRows
	featureNVLinkErrors  = "nvlink-error-counters" // nvmlDeviceGetNvLinkErrorCounter
	featureNVLink5Counts = "nvlink5-counters"      // NVML_FI_DEV_NVLINK_COUNT_*
	featureProcessUtil   = "process-utilization"   // nvmlDeviceGetProcessUtilization
)

// archState is the node-wide state of this file.
type archState struct {
	unprivileged atomic.Bool
}

// archSupports says whether a GPU of architecture arch answers feature. An
// unknown architecture (a snapshot of a model the simulator does not know)
// answers everything, as the simulator did before it modelled
// architectures: the snapshot cannot say what its GPU lacks.
func archSupports(arch nvml.DeviceArchitecture, feature string) bool {
	if arch == nvml.DEVICE_ARCH_UNKNOWN {
		return true
	}
	switch feature {
	case featureRetiredPages:
		return arch < nvml.DEVICE_ARCH_AMPERE
	case featureRowRemap:
		return arch >= nvml.DEVICE_ARCH_AMPERE
	case featureNVLinkErrors:
		return arch < nvml.DEVICE_ARCH_BLACKWELL
	case featureNVLink5Counts:
		return arch >= nvml.DEVICE_ARCH_BLACKWELL
	case featureProcessUtil:
		return arch >= nvml.DEVICE_ARCH_MAXWELL
	}
	return true
}

// archName is the architecture's name as NVIDIA spells it.
func archName(arch nvml.DeviceArchitecture) string {
	switch arch {
	case nvml.DEVICE_ARCH_KEPLER:
		return "Kepler"
	case nvml.DEVICE_ARCH_MAXWELL:
		return "Maxwell"
	case nvml.DEVICE_ARCH_PASCAL:
		return "Pascal"
	case nvml.DEVICE_ARCH_VOLTA:
		return "Volta"
	case nvml.DEVICE_ARCH_TURING:
		return "Turing"
	case nvml.DEVICE_ARCH_AMPERE:
		return "Ampere"
	case nvml.DEVICE_ARCH_ADA:
		return "Ada"
	case nvml.DEVICE_ARCH_HOPPER:
		return "Hopper"
	case nvml.DEVICE_ARCH_BLACKWELL:
		return "Blackwell"
	}
	return fmt.Sprintf("architecture %d", arch)
}

// supports says whether GPU gpu answers feature (one of the feature*
// constants); false for a GPU the node does not have.
func (n *Node) supports(gpu int, feature string) bool {
	if gpu < 0 || gpu >= len(n.gpus) {
		return false
	}
	return archSupports(n.gpus[gpu].cfg.Architecture, feature)
}

// faultKindFeature is the feature through which the agent sees a fault
// kind, for the kinds that some architectures cannot show.
var faultKindFeature = map[string]string{
	FaultRowRemapPending: featureRowRemap,
	FaultRowRemapFailure: featureRowRemap,
	FaultRetiredPending:  featureRetiredPages,
}

// checkFaultArch refuses a fault kind that GPU gpu's architecture cannot
// report (row remapping before Ampere, page retirement from Ampere on), so
// that a test injecting it learns at once that the agent could never see it.
// Fault injection (applyFault) calls it before changing any state.
func (n *Node) checkFaultArch(kind string, gpu int) error {
	feature, ok := faultKindFeature[kind]
	if !ok || gpu < 0 || gpu >= len(n.gpus) || n.supports(gpu, feature) {
		return nil
	}
	g := n.gpus[gpu]
	return fmt.Errorf("kind: fault %q on gpu %d: %s (%s) does not support %s; NVML answers NOT_SUPPORTED",
		kind, gpu, g.cfg.Name, archName(g.cfg.Architecture), feature)
}

// SetUnprivileged makes the node answer as NVML answers a caller without
// root (on) or with it (off, the default). Unprivileged, the calls nvml.h
// marks as requiring root or a privileged user (privilegedCalls) and
// GetMemoryInfo on a GPU with MIG enabled return ERROR_NO_PERMISSION. It may
// be called at any time; calls already under way answer as before.
func (n *Node) SetUnprivileged(on bool) {
	n.arch.unprivileged.Store(on)
	n.log.Info("simulated nvml caller privileges changed", "unprivileged", on)
}

// privilegedCall is a device call nvml.h says needs privileges, with the
// header's words (nvml.h line numbers of go-nvml v0.13.3-1's copy).
type privilegedCall struct {
	field string // the mock.Device field
	mig   bool   // a MIG call: a GPU without MIG answers NOT_SUPPORTED first
	why   string
}

// privilegedCalls are the device calls that fail with ERROR_NO_PERMISSION
// for an unprivileged caller. Calls whose documentation merely lists
// NO_PERMISSION among its returns without saying they require privileges
// (nvmlDeviceGetGpuInstanceProfileInfo, the GPU instance's GetInfo) are not
// here: nvidia-smi lists MIG profiles to any user. Nor are the retired-page
// calls, which nvml.h does not restrict. GPU and compute instance handles
// are only reachable through GetGpuInstances/GetGpuInstanceById, so their
// own privileged calls cannot be reached unprivileged and are not wrapped.
var privilegedCalls = []privilegedCall{
	{"GetGpuInstancesFunc", true, "13045 nvmlDeviceGetGpuInstances: Requires privileged user"},
	{"GetGpuInstanceByIdFunc", true, "13069 nvmlDeviceGetGpuInstanceById: Requires privileged user"},
	{"GetGpuInstancePossiblePlacementsFunc", true, "12926 nvmlDeviceGetGpuInstancePossiblePlacements_v2: Requires privileged user"},
	{"GetGpuInstanceRemainingCapacityFunc", true, "12951 nvmlDeviceGetGpuInstanceRemainingCapacity: Requires privileged user"},
	{"CreateGpuInstanceFunc", true, "12972 nvmlDeviceCreateGpuInstance: Requires privileged user"},
	{"CreateGpuInstanceWithPlacementFunc", true, "12997 nvmlDeviceCreateGpuInstanceWithPlacement: Requires privileged user"},
	{"SetMigModeFunc", true, "12775 nvmlDeviceSetMigMode: Requires root user"},
	{"SetPersistenceModeFunc", false, "8745 nvmlDeviceSetPersistenceMode: Requires root/admin permissions"},
	{"SetComputeModeFunc", false, "8781 nvmlDeviceSetComputeMode: Requires root/admin permissions"},
	{"SetEccModeFunc", false, "8817 nvmlDeviceSetEccMode: Requires root/admin permissions"},
	{"ClearEccErrorCountsFunc", false, "8848 nvmlDeviceClearEccErrorCounts: Requires root/admin permissions"},
	{"SetDriverModelFunc", false, "8880 nvmlDeviceSetDriverModel: Requires root/admin permissions"},
	{"SetGpuLockedClocksFunc", false, "8942 nvmlDeviceSetGpuLockedClocks: Requires root/admin permissions"},
	{"SetMemoryLockedClocksFunc", false, "8994 nvmlDeviceSetMemoryLockedClocks: Requires root/admin permissions"},
	{"SetDefaultAutoBoostedClocksEnabledFunc", false, "9091 nvmlDeviceSetDefaultAutoBoostedClocksEnabled: Requires root/admin permissions"},
	{"SetPowerManagementLimitFunc", false, "9181 nvmlDeviceSetPowerManagementLimit: Requires root/admin permissions"},
	{"SetPowerManagementLimit_v2Func", false, "8155 nvmlDeviceSetPowerManagementLimit_v2: Requires root/admin permissions"},
	{"SetGpuOperationModeFunc", false, "9210 nvmlDeviceSetGpuOperationMode: Requires root/admin permissions"},
	{"SetAPIRestrictionFunc", false, "9242 nvmlDeviceSetAPIRestriction: Requires root/admin permissions"},
	{"SetAccountingModeFunc", false, "9335 nvmlDeviceSetAccountingMode: Requires root/admin permissions"},
	{"ClearAccountingPidsFunc", false, "9367 nvmlDeviceClearAccountingPids: Requires root/admin permissions"},
	{"SetHostname_v1Func", false, "8643 nvmlDeviceSetHostname_v1: Requires root/admin permissions"},
	{"SetDramEncryptionModeFunc", false, "6856 nvmlDeviceSetDramEncryptionMode: Requires root/admin permissions"},
	{"SetRusdSettings_v1Func", false, "14499 nvmlDeviceSetRusdSettings_v1: Requires root/admin permissions"},
	{"SetClockOffsetsFunc", false, "6336 nvmlDeviceSetClockOffsets: Requires privileged user"},
	{"SetFanControlPolicyFunc", false, "9139 nvmlDeviceSetFanControlPolicy: Requires privileged user"},
}

// installArch narrows every GPU's answers to its architecture and installs
// the privilege checks. It runs after installFaults and installCounters and
// wraps what they installed, so fault injection keeps working wherever the
// call is supported. MIG devices need nothing from it: the calls it changes
// are parent-GPU calls (MIG device handles answer them NOT_SUPPORTED).
func (n *Node) installArch() {
	n.arch = &archState{}
	for i, d := range n.devices {
		g := n.gpus[i]
		arch := g.cfg.Architecture
		migActive := func() bool {
			n.mu.RLock()
			defer n.mu.RUnlock()
			return g.migEnabled && len(g.mig) > 0
		}

		if archSupports(arch, featureRetiredPages) {
			// _v2 adds a retirement timestamp per page (nvml.h: "supported
			// for Pascal and newer"); the simulator retires no pages, so the
			// timestamps follow GetRetiredPages' list.
			if pages := d.GetRetiredPagesFunc; pages != nil {
				d.GetRetiredPages_v2Func = func(c nvml.PageRetirementCause) ([]uint64, []uint64, nvml.Return) {
					addrs, ret := pages(c)
					if ret != nvml.SUCCESS {
						return nil, nil, ret
					}
					return addrs, make([]uint64, len(addrs)), nvml.SUCCESS
				}
			}
		} else {
			d.GetRetiredPagesFunc = func(nvml.PageRetirementCause) ([]uint64, nvml.Return) {
				return nil, nvml.ERROR_NOT_SUPPORTED
			}
			d.GetRetiredPages_v2Func = func(nvml.PageRetirementCause) ([]uint64, []uint64, nvml.Return) {
				return nil, nil, nvml.ERROR_NOT_SUPPORTED
			}
			d.GetRetiredPagesPendingStatusFunc = func() (nvml.EnableState, nvml.Return) {
				return nvml.FEATURE_DISABLED, nvml.ERROR_NOT_SUPPORTED
			}
		}

		switch remap := d.GetRemappedRowsFunc; {
		case !archSupports(arch, featureRowRemap):
			d.GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) {
				return 0, 0, false, false, nvml.ERROR_NOT_SUPPORTED
			}
		case remap != nil:
			d.GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) {
				if migActive() {
					return 0, 0, false, false, nvml.ERROR_NOT_SUPPORTED
				}
				return remap()
			}
		}

		if !archSupports(arch, featureNVLinkErrors) {
			d.GetNvLinkErrorCounterFunc = func(int, nvml.NvLinkErrorCounter) (uint64, nvml.Return) {
				return 0, nvml.ERROR_NOT_SUPPORTED
			}
		}
		n.installNVLinkErrorFields(i, &d.Device)

		if !archSupports(arch, featureProcessUtil) {
			d.GetProcessUtilizationFunc = func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
				return nil, nvml.ERROR_NOT_SUPPORTED
			}
		}

		// nvml.h nvmlDeviceGetMemoryInfo, nvmlDeviceGetMemoryInfo_v2,
		// nvmlDeviceGetComputeRunningProcesses_v3 and
		// nvmlDeviceGetGraphicsRunningProcesses_v3: "In MIG mode, if
		// device handle is provided, the API returns aggregate
		// information, only if the caller has appropriate privileges",
		// else NVML_ERROR_NO_PERMISSION (nvml.h lines 6678/6702,
		// 6722/6744, 7378/7394 and 7421/7437).
		aggregate := func() bool { return n.arch.unprivileged.Load() && migActive() }
		if mem := d.GetMemoryInfoFunc; mem != nil {
			d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
				if aggregate() {
					return nvml.Memory{}, nvml.ERROR_NO_PERMISSION
				}
				return mem()
			}
		}
		if mem := d.GetMemoryInfo_v2Func; mem != nil {
			d.GetMemoryInfo_v2Func = func() (nvml.Memory_v2, nvml.Return) {
				if aggregate() {
					return nvml.Memory_v2{}, nvml.ERROR_NO_PERMISSION
				}
				return mem()
			}
		}
		for _, f := range []*func() ([]nvml.ProcessInfo, nvml.Return){&d.GetComputeRunningProcessesFunc, &d.GetGraphicsRunningProcessesFunc} {
			if list := *f; list != nil {
				*f = func() ([]nvml.ProcessInfo, nvml.Return) {
					if aggregate() {
						return nil, nvml.ERROR_NO_PERMISSION
					}
					return list()
				}
			}
		}

		migCapable := n.spec.GPUs[i].MIGCapable
		for _, c := range privilegedCalls {
			applies := func() bool { return true }
			if c.mig {
				applies = func() bool { return migCapable }
			}
			n.requirePrivilege(&d.Device, c.field, applies)
		}
	}
}

// installNVLinkErrorFields answers the NVLink error field values of GPU i
// per link (ScopeId): the DL counters (161-163) before Blackwell and the
// NVLink5 link recovery counters (213-215) from Blackwell on, all zero
// since the simulator injects no NVLink errors. Other fields keep the
// answers counters.go gives. The NVLink5 error, BER and FEC history
// counters (219-222, 235-250) answer like the recovery counters:
// dcgm_fields.h (go-dcgm v1.4611.0) marks DCGM's fields over them "NVLink5+
// only ... Not supported on NVLink4 and earlier".
func (n *Node) installNVLinkErrorFields(i int, d *mock.Device) {
	g := n.gpus[i]
	links := uint32(len(g.links))
	prev := d.GetFieldValuesFunc
	if prev == nil || links == 0 {
		return
	}
	dl := archSupports(g.cfg.Architecture, featureNVLinkErrors)
	nvlink5 := archSupports(g.cfg.Architecture, featureNVLink5Counts)
	d.GetFieldValuesFunc = func(fvs []nvml.FieldValue) nvml.Return {
		if ret := prev(fvs); ret != nvml.SUCCESS {
			return ret
		}
		for k := range fvs {
			fv := &fvs[k]
			var ok bool
			switch fv.FieldId {
			case nvml.FI_DEV_NVLINK_ERROR_DL_REPLAY, nvml.FI_DEV_NVLINK_ERROR_DL_RECOVERY, nvml.FI_DEV_NVLINK_ERROR_DL_CRC:
				ok = dl
			case nvml.FI_DEV_NVLINK_COUNT_LINK_RECOVERY_SUCCESSFUL_EVENTS, nvml.FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS,
				nvml.FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS:
				ok = nvlink5
			case nvml.FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS, nvml.FI_DEV_NVLINK_COUNT_EFFECTIVE_BER,
				nvml.FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS, nvml.FI_DEV_NVLINK_COUNT_SYMBOL_BER:
				// NVLink5 error counters and BERs (219-222); a BER of 0
				// (mantissa and exponent 0) for links without errors.
				ok = nvlink5
			default:
				if !nvlinkFECHistory(fv.FieldId) {
					continue
				}
				ok = nvlink5
			}
			switch {
			case !ok:
				fv.NvmlReturn = uint32(nvml.ERROR_NOT_SUPPORTED)
			case fv.ScopeId >= links:
				fv.NvmlReturn = uint32(nvml.ERROR_INVALID_ARGUMENT)
			default:
				setFieldUint(fv, 0)
			}
		}
		return nvml.SUCCESS
	}
}

// nvlinkFECHistory says whether id is one of the 16 NVLink FEC history
// bins, NVML_FI_DEV_NVLINK_COUNT_FEC_HISTORY_0..15 (235-250).
func nvlinkFECHistory(id uint32) bool {
	return id >= nvml.FI_DEV_NVLINK_COUNT_FEC_HISTORY_0 && id <= nvml.FI_DEV_NVLINK_COUNT_FEC_HISTORY_15
}

var noPermission = reflect.ValueOf(nvml.ERROR_NO_PERMISSION)

// requirePrivilege wraps the mock call field of d so that it fails with
// ERROR_NO_PERMISSION (in every nvml.Return result, as SetMigMode's
// activation status too) while the node is unprivileged and applies says
// the check is reached. An unset call otherwise answers NOT_SUPPORTED, as
// fillUnsupported would have made it.
func (n *Node) requirePrivilege(d *mock.Device, field string, applies func() bool) {
	f := reflect.ValueOf(d).Elem().FieldByName(field)
	if !f.IsValid() || f.Kind() != reflect.Func {
		panic(fmt.Sprintf("sim: mock.Device has no call %s", field))
	}
	ft := f.Type()
	var inner reflect.Value
	if !f.IsNil() {
		inner = reflect.ValueOf(f.Interface())
	}
	f.Set(reflect.MakeFunc(ft, func(args []reflect.Value) []reflect.Value {
		if n.arch.unprivileged.Load() && applies() {
			out := zeroResults(ft, nvml.ERROR_NO_PERMISSION)
			for k := range out {
				if ft.Out(k) == returnType {
					out[k] = noPermission
				}
			}
			return out
		}
		if !inner.IsValid() {
			return zeroResults(ft, nvml.ERROR_NOT_SUPPORTED)
		}
		if ft.IsVariadic() {
			return inner.CallSlice(args)
		}
		return inner.Call(args)
	}))
}
