package nvmlowner

import (
	"encoding/binary"
	"errors"
	"math"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Field identifies one per-GPU reading of a Sample.
type Field int

// The fields a sample reads. Health checks and the metrics collector both
// read them from the same Sample, so each counter is read once per interval.
const (
	FieldGPUUtil            Field = iota // GetUtilizationRates().Gpu, %
	FieldMemCopyUtil                     // GetUtilizationRates().Memory, %
	FieldFBUsed                          // GetMemoryInfo().Used, bytes
	FieldFBFree                          // GetMemoryInfo().Free, bytes
	FieldFBTotal                         // GetMemoryInfo().Total, bytes
	FieldSMClock                         // GetClockInfo(CLOCK_SM), MHz
	FieldMemClock                        // GetClockInfo(CLOCK_MEM), MHz
	FieldGPUTemp                         // GetTemperature(TEMPERATURE_GPU), C
	FieldMemTemp                         // field value FI_DEV_MEMORY_TEMP, C
	FieldPowerUsage                      // GetPowerUsage(), mW
	FieldTotalEnergy                     // GetTotalEnergyConsumption(), mJ since the driver was last reloaded
	FieldPCIeReplay                      // GetPcieReplayCounter()
	FieldNVLinkBandwidth                 // field value FI_DEV_NVLINK_BANDWIDTH_C0_TOTAL, KiB
	FieldRecoveryAction                  // field value FI_DEV_GET_GPU_RECOVERY_ACTION (nvml.GPU_RECOVERY_ACTION_*)
	FieldECCMode                         // GetEccMode() current: 1 enabled, 0 disabled
	FieldECCSBEVolatile                  // GetTotalEccErrors(CORRECTED, VOLATILE_ECC)
	FieldECCDBEVolatile                  // GetTotalEccErrors(UNCORRECTED, VOLATILE_ECC)
	FieldECCSBEAggregate                 // GetTotalEccErrors(CORRECTED, AGGREGATE_ECC)
	FieldECCDBEAggregate                 // GetTotalEccErrors(UNCORRECTED, AGGREGATE_ECC)
	FieldRetiredSBE                      // len(GetRetiredPages(MULTIPLE_SINGLE_BIT_ECC_ERRORS))
	FieldRetiredDBE                      // len(GetRetiredPages(DOUBLE_BIT_ECC_ERROR))
	FieldRetiredPending                  // GetRetiredPagesPendingStatus(): 1 pending
	FieldRemapCorrectable                // GetRemappedRows() corrRows
	FieldRemapUncorrectable              // GetRemappedRows() uncRows
	FieldRemapPending                    // GetRemappedRows() isPending: 1 pending
	FieldRemapFailure                    // GetRemappedRows() failureOccurred: 1 failed
	FieldFabricState                     // GetGpuFabricInfo().State (nvml.GPU_FABRIC_STATE_*)
	FieldFabricStatus                    // GetGpuFabricInfo().Status (an nvml.Return)
	FieldEncUtil                         // GetEncoderUtilization(), %
	FieldDecUtil                         // GetDecoderUtilization(), %
	FieldFBReserved                      // GetMemoryInfo_v2().Reserved, bytes
	FieldVGPULicense                     // GetGridLicensableFeatures(): 1 a licensable feature is licensed
	FieldClocksEventReasons              // GetCurrentClocksEventReasons() (GetCurrentClocksThrottleReasons before R535): nvmlClocksEventReason* bits
	NumFields
)

var fieldNames = [NumFields]string{
	FieldGPUUtil: "gpu-util", FieldMemCopyUtil: "mem-copy-util", FieldFBUsed: "fb-used", FieldFBFree: "fb-free",
	FieldFBTotal: "fb-total", FieldSMClock: "sm-clock", FieldMemClock: "mem-clock", FieldGPUTemp: "gpu-temp",
	FieldMemTemp: "memory-temp", FieldPowerUsage: "power-usage", FieldTotalEnergy: "total-energy",
	FieldPCIeReplay: "pcie-replay", FieldNVLinkBandwidth: "nvlink-bandwidth", FieldRecoveryAction: "recovery-action",
	FieldECCMode: "ecc-mode", FieldECCSBEVolatile: "ecc-sbe-volatile", FieldECCDBEVolatile: "ecc-dbe-volatile",
	FieldECCSBEAggregate: "ecc-sbe-aggregate", FieldECCDBEAggregate: "ecc-dbe-aggregate",
	FieldRetiredSBE: "retired-sbe", FieldRetiredDBE: "retired-dbe", FieldRetiredPending: "retired-pending",
	FieldRemapCorrectable: "remap-correctable", FieldRemapUncorrectable: "remap-uncorrectable",
	FieldRemapPending: "remap-pending", FieldRemapFailure: "remap-failure",
	FieldFabricState: "fabric-state", FieldFabricStatus: "fabric-status",
	FieldEncUtil: "enc-util", FieldDecUtil: "dec-util", FieldFBReserved: "fb-reserved", FieldVGPULicense: "vgpu-license",
	FieldClocksEventReasons: "clocks-event-reasons",
}

// String is the field's name as used in logs and the no-data metric.
func (f Field) String() string {
	if f < 0 || f >= NumFields {
		return "unknown"
	}
	return fieldNames[f]
}

// Status says whether a reading has a value.
type Status uint8

// Reading statuses. NotSupported and NoPermission are "no data" for that
// device, never a fault (nvml.h: NVML_ERROR_NOT_SUPPORTED "the requested
// operation is not available on target device", NVML_ERROR_NO_PERMISSION
// "the current user does not have permission for operation").
const (
	Absent       Status = iota // not read (the GPU's read failed or timed out)
	OK                         // Value holds the reading
	NotSupported               // NVML answered ERROR_NOT_SUPPORTED (or FUNCTION_NOT_FOUND)
	NoPermission               // NVML answered ERROR_NO_PERMISSION
	Failed                     // any other error; Err says which
)

// Value is one reading.
type Value struct {
	V      uint64
	Status Status
	// Err is the NVML error when Status is Failed.
	Err error
}

// NoData reports whether the device does not give this reading at all
// (not supported, or not permitted for this process).
func (v Value) NoData() bool { return v.Status == NotSupported || v.Status == NoPermission }

// Link is one NVLink of a GPU. Counters holds DL_REPLAY, DL_RECOVERY,
// DL_CRC_FLIT and DL_CRC_DATA in that order; each may be NotSupported on
// its own (Blackwell returns NOT_SUPPORTED for them).
type Link struct {
	Link     int
	Up       Value // GetNvLinkState: 1 FEATURE_ENABLED, 0 disabled
	Counters [4]Value
	// Recoveries is the link's NVLink5 recovery event count (field
	// FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS, scope = link), read where
	// the DL counters are not supported: nvml.h says those fields are
	// "unsupported for Blackwell+. Please use
	// NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_*".
	Recoveries Value
	// NVLink5 are the link's NVLink5 error and FEC counters, by
	// NVLink5Fields, read with Recoveries (same links, same call).
	// dcgm_fields.h (go-dcgm v1.4611.0) marks DCGM's fields over them
	// "NVLink5+ only ... Not supported on NVLink4 and earlier"; a driver
	// answering NOT_SUPPORTED leaves them NotSupported.
	NVLink5 [NumNVLink5]Value
}

// NVLink5Field indexes Link.NVLink5.
type NVLink5Field int

// The NVLink5 link counters read, each a field value scoped by link
// (nvml.h, go-nvml v0.13.3-1: "NVLink counter field id 201-225" and
// "235-250 ... Link ID needs to be specified in the scopeId field").
const (
	NVLink5EffectiveErrors NVLink5Field = iota // NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS (219)
	NVLink5EffectiveBER                        // NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_BER (220): bits 0-7 exponent, 8-11 mantissa
	NVLink5SymbolErrors                        // NVML_FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS (221)
	NVLink5SymbolBER                           // NVML_FI_DEV_NVLINK_COUNT_SYMBOL_BER (222): bits 0-7 exponent, 8-11 mantissa
	NVLink5FECHistory0                         // NVML_FI_DEV_NVLINK_COUNT_FEC_HISTORY_0..15 (235-250), in order
	NumNVLink5             = NVLink5FECHistory0 + 16
)

// NVLink5FieldID is the NVML field ID of f.
func NVLink5FieldID(f NVLink5Field) uint32 {
	switch f {
	case NVLink5EffectiveErrors:
		return nvml.FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS
	case NVLink5EffectiveBER:
		return nvml.FI_DEV_NVLINK_COUNT_EFFECTIVE_BER
	case NVLink5SymbolErrors:
		return nvml.FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS
	case NVLink5SymbolBER:
		return nvml.FI_DEV_NVLINK_COUNT_SYMBOL_BER
	}
	return nvml.FI_DEV_NVLINK_COUNT_FEC_HISTORY_0 + uint32(f-NVLink5FECHistory0)
}

// NVLinkCounters are the NVLink error counters a Link carries, in order.
var NVLinkCounters = [4]nvml.NvLinkErrorCounter{
	nvml.NVLINK_ERROR_DL_REPLAY, nvml.NVLINK_ERROR_DL_RECOVERY, nvml.NVLINK_ERROR_DL_CRC_FLIT, nvml.NVLINK_ERROR_DL_CRC_DATA,
}

// MIGSample is one MIG device's readings (NVML reports little per MIG
// device: framebuffer is what users chart per instance).
type MIGSample struct {
	UUID   string
	FBUsed Value
	FBFree Value
}

// Sample is everything read from one GPU in one sampling cycle.
type Sample struct {
	UUID string
	Time time.Time
	// Err is set when the GPU could not be read at all: its handle lookup
	// or a call failed with ERROR_GPU_IS_LOST / ERROR_NOT_FOUND, or the
	// read did not finish within the call timeout (errors.Is ErrTimeout).
	// Values are then Absent.
	Err    error
	Values [NumFields]Value
	// Links are the GPU's NVLinks that exist (GetNvLinkState did not
	// answer NOT_SUPPORTED / INVALID_ARGUMENT), by link number.
	Links []Link
	// MIG are the MIG devices asked for, in the order asked.
	MIG []MIGSample
	// MIGChanged is set when a MIG handle index no longer holds the MIG
	// device asked for: the layout changed and wants a rediscovery.
	MIGChanged bool
	// Processes are the processes with a context on the GPU or on one of
	// its MIG devices (GetComputeRunningProcesses and
	// GetGraphicsRunningProcesses), one entry per PID and device.
	// ProcessesRead says whether the lists were read: OK (V is then the
	// number of Processes), or NotSupported / NoPermission ("no data": no
	// process may be judged from it), or Failed (Err says which list; the
	// Processes of the other list are kept, but the picture is incomplete).
	// Processes are sorted by MIG, then PID.
	Processes     []Process
	ProcessesRead Value
	// ProcessUtilRead says whether the processes' utilisation was read
	// (nvmlDeviceGetProcessUtilization, asked only of a GPU with a
	// process): OK (V is the number of samples used; each Process's Util
	// holds its reading), NotSupported / NoPermission (no data: before
	// Maxwell, or MIG enabled), Failed, or Absent (not asked: no process
	// listed, or the lists were not read).
	ProcessUtilRead Value
}

// Process is one process holding a context on a GPU or MIG device.
type Process struct {
	PID uint32
	// MIG is the UUID of the MIG device the process runs on ("" for the
	// whole GPU).
	MIG string
	// UsedMemory is the device memory the process holds, in bytes; NoData
	// when NVML reports NVML_VALUE_NOT_AVAILABLE for it.
	UsedMemory Value
	// Compute and Graphics say which lists the process is on (both for a
	// process with a compute and a graphics context).
	Compute, Graphics bool
	// Util is the process's utilisation since the GPU's previous read,
	// when Sample.ProcessUtilRead is OK.
	Util ProcessUtil
}

// ProcessUtil is one process's share of a GPU's engines over the window
// NVML's samples cover (nvmlProcessUtilizationSample_t), each in percent
// of the time: SM (3D/compute), frame-buffer memory (the memory
// controller, as DCGM_FI_DEV_MEM_COPY_UTIL is for the whole GPU), video
// encoder, video decoder. A process NVML gave no sample for was idle (0):
// nvml.h returns a sample only for a process "that had some non-zero
// utilization during the last sample period". A sample out of range (over
// 100, as nvtop issue #110 saw from real drivers) is Failed.
type ProcessUtil struct {
	SM, Memory, Encoder, Decoder Value
}

// Get returns field f.
func (s *Sample) Get(f Field) Value { return s.Values[f] }

// Lost reports whether the sample failed because the GPU is lost (fallen
// off the bus) or no longer known to NVML.
func (s *Sample) Lost() bool {
	return errors.Is(s.Err, nvml.ERROR_GPU_IS_LOST) || errors.Is(s.Err, nvml.ERROR_NOT_FOUND)
}

// TimedOut reports whether the GPU did not answer within the call timeout.
func (s *Sample) TimedOut() bool { return errors.Is(s.Err, ErrTimeout) }

// valueOf turns an NVML return into a Value.
func valueOf(v uint64, ret nvml.Return) Value {
	switch ret {
	case nvml.SUCCESS:
		return Value{V: v, Status: OK}
	case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_FUNCTION_NOT_FOUND:
		return Value{Status: NotSupported}
	case nvml.ERROR_NO_PERMISSION:
		return Value{Status: NoPermission}
	}
	return Value{Status: Failed, Err: ret}
}

func boolValue(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// fieldUint decodes an NVML field value (a C union in native byte order)
// as an unsigned integer; doubles are rounded and negative values clamp
// to 0 (none of the fields read here is signed).
func fieldUint(fv nvml.FieldValue) (uint64, bool) {
	b := fv.Value[:]
	switch nvml.ValueType(fv.ValueType) {
	case nvml.VALUE_TYPE_DOUBLE:
		f := math.Float64frombits(binary.NativeEndian.Uint64(b))
		if f < 0 || math.IsNaN(f) {
			return 0, true
		}
		return uint64(math.Round(f)), true
	case nvml.VALUE_TYPE_UNSIGNED_INT:
		return uint64(binary.NativeEndian.Uint32(b)), true
	case nvml.VALUE_TYPE_UNSIGNED_LONG, nvml.VALUE_TYPE_UNSIGNED_LONG_LONG:
		return binary.NativeEndian.Uint64(b), true
	case nvml.VALUE_TYPE_SIGNED_LONG_LONG:
		return uint64(max(int64(binary.NativeEndian.Uint64(b)), 0)), true
	case nvml.VALUE_TYPE_SIGNED_INT:
		return uint64(max(int32(binary.NativeEndian.Uint32(b)), 0)), true
	case nvml.VALUE_TYPE_UNSIGNED_SHORT:
		return uint64(binary.NativeEndian.Uint16(b)), true
	}
	return 0, false
}
