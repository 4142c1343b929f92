package nvmlowner

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"
	"reflect"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// The census's JSON: nvml.h's names for returns and enums, and NVML's
// structs as objects with nvml.h's field names.

// returnNames are nvml.h's nvmlReturn_t names without "NVML_". go-nvml's
// Return.String is nvmlErrorString's text once the real library is
// loaded ("Not Supported"), so the census names returns itself.
var returnNames = map[nvml.Return]string{
	nvml.SUCCESS:                         "SUCCESS",
	nvml.ERROR_UNINITIALIZED:             "ERROR_UNINITIALIZED",
	nvml.ERROR_INVALID_ARGUMENT:          "ERROR_INVALID_ARGUMENT",
	nvml.ERROR_NOT_SUPPORTED:             "ERROR_NOT_SUPPORTED",
	nvml.ERROR_NO_PERMISSION:             "ERROR_NO_PERMISSION",
	nvml.ERROR_ALREADY_INITIALIZED:       "ERROR_ALREADY_INITIALIZED",
	nvml.ERROR_NOT_FOUND:                 "ERROR_NOT_FOUND",
	nvml.ERROR_INSUFFICIENT_SIZE:         "ERROR_INSUFFICIENT_SIZE",
	nvml.ERROR_INSUFFICIENT_POWER:        "ERROR_INSUFFICIENT_POWER",
	nvml.ERROR_DRIVER_NOT_LOADED:         "ERROR_DRIVER_NOT_LOADED",
	nvml.ERROR_TIMEOUT:                   "ERROR_TIMEOUT",
	nvml.ERROR_IRQ_ISSUE:                 "ERROR_IRQ_ISSUE",
	nvml.ERROR_LIBRARY_NOT_FOUND:         "ERROR_LIBRARY_NOT_FOUND",
	nvml.ERROR_FUNCTION_NOT_FOUND:        "ERROR_FUNCTION_NOT_FOUND",
	nvml.ERROR_CORRUPTED_INFOROM:         "ERROR_CORRUPTED_INFOROM",
	nvml.ERROR_GPU_IS_LOST:               "ERROR_GPU_IS_LOST",
	nvml.ERROR_RESET_REQUIRED:            "ERROR_RESET_REQUIRED",
	nvml.ERROR_OPERATING_SYSTEM:          "ERROR_OPERATING_SYSTEM",
	nvml.ERROR_LIB_RM_VERSION_MISMATCH:   "ERROR_LIB_RM_VERSION_MISMATCH",
	nvml.ERROR_IN_USE:                    "ERROR_IN_USE",
	nvml.ERROR_MEMORY:                    "ERROR_MEMORY",
	nvml.ERROR_NO_DATA:                   "ERROR_NO_DATA",
	nvml.ERROR_VGPU_ECC_NOT_SUPPORTED:    "ERROR_VGPU_ECC_NOT_SUPPORTED",
	nvml.ERROR_INSUFFICIENT_RESOURCES:    "ERROR_INSUFFICIENT_RESOURCES",
	nvml.ERROR_FREQ_NOT_SUPPORTED:        "ERROR_FREQ_NOT_SUPPORTED",
	nvml.ERROR_ARGUMENT_VERSION_MISMATCH: "ERROR_ARGUMENT_VERSION_MISMATCH",
	nvml.ERROR_DEPRECATED:                "ERROR_DEPRECATED",
	nvml.ERROR_NOT_READY:                 "ERROR_NOT_READY",
	nvml.ERROR_GPU_NOT_FOUND:             "ERROR_GPU_NOT_FOUND",
	nvml.ERROR_INVALID_STATE:             "ERROR_INVALID_STATE",
	nvml.ERROR_RESET_TYPE_NOT_SUPPORTED:  "ERROR_RESET_TYPE_NOT_SUPPORTED",
	nvml.ERROR_UNKNOWN:                   "ERROR_UNKNOWN",
}

func returnName(r nvml.Return) string {
	if n, ok := returnNames[r]; ok {
		return n
	}
	return fmt.Sprintf("RETURN_%d", int32(r))
}

// named is an nvml.h enum value by name, or the number for one the table
// lacks.
func named[T comparable](names map[T]string, v T) any {
	if n, ok := names[v]; ok {
		return n
	}
	return v
}

// enableStateNames: nvml.h nvmlEnableState_t.
var enableStateNames = map[nvml.EnableState]string{
	nvml.FEATURE_DISABLED: "FEATURE_DISABLED",
	nvml.FEATURE_ENABLED:  "FEATURE_ENABLED",
}

// brandNames: nvml.h nvmlBrandType_t (NVML_BRAND_NVIDIA_VGAMING is
// NVML_BRAND_NVIDIA_CLOUD_GAMING's other name).
var brandNames = map[nvml.BrandType]string{
	nvml.BRAND_UNKNOWN:             "BRAND_UNKNOWN",
	nvml.BRAND_QUADRO:              "BRAND_QUADRO",
	nvml.BRAND_TESLA:               "BRAND_TESLA",
	nvml.BRAND_NVS:                 "BRAND_NVS",
	nvml.BRAND_GRID:                "BRAND_GRID",
	nvml.BRAND_GEFORCE:             "BRAND_GEFORCE",
	nvml.BRAND_TITAN:               "BRAND_TITAN",
	nvml.BRAND_NVIDIA_VAPPS:        "BRAND_NVIDIA_VAPPS",
	nvml.BRAND_NVIDIA_VPC:          "BRAND_NVIDIA_VPC",
	nvml.BRAND_NVIDIA_VCS:          "BRAND_NVIDIA_VCS",
	nvml.BRAND_NVIDIA_VWS:          "BRAND_NVIDIA_VWS",
	nvml.BRAND_NVIDIA_CLOUD_GAMING: "BRAND_NVIDIA_CLOUD_GAMING",
	nvml.BRAND_QUADRO_RTX:          "BRAND_QUADRO_RTX",
	nvml.BRAND_NVIDIA_RTX:          "BRAND_NVIDIA_RTX",
	nvml.BRAND_NVIDIA:              "BRAND_NVIDIA",
	nvml.BRAND_GEFORCE_RTX:         "BRAND_GEFORCE_RTX",
	nvml.BRAND_TITAN_RTX:           "BRAND_TITAN_RTX",
}

// topologyLevelNames: nvml.h nvmlGpuTopologyLevel_t.
var topologyLevelNames = map[nvml.GpuTopologyLevel]string{
	nvml.TOPOLOGY_INTERNAL:   "TOPOLOGY_INTERNAL",
	nvml.TOPOLOGY_SINGLE:     "TOPOLOGY_SINGLE",
	nvml.TOPOLOGY_MULTIPLE:   "TOPOLOGY_MULTIPLE",
	nvml.TOPOLOGY_HOSTBRIDGE: "TOPOLOGY_HOSTBRIDGE",
	nvml.TOPOLOGY_NODE:       "TOPOLOGY_NODE",
	nvml.TOPOLOGY_SYSTEM:     "TOPOLOGY_SYSTEM",
}

// nvLinkDeviceTypeNames: nvml.h nvmlIntNvLinkDeviceType_t.
var nvLinkDeviceTypeNames = map[nvml.IntNvLinkDeviceType]string{
	nvml.NVLINK_DEVICE_TYPE_GPU:     "NVLINK_DEVICE_TYPE_GPU",
	nvml.NVLINK_DEVICE_TYPE_IBMNPU:  "NVLINK_DEVICE_TYPE_IBMNPU",
	nvml.NVLINK_DEVICE_TYPE_SWITCH:  "NVLINK_DEVICE_TYPE_SWITCH",
	nvml.NVLINK_DEVICE_TYPE_UNKNOWN: "NVLINK_DEVICE_TYPE_UNKNOWN",
}

// fabricStateNames: nvml.h NVML_GPU_FABRIC_STATE_*.
var fabricStateNames = map[uint8]string{
	nvml.GPU_FABRIC_STATE_NOT_SUPPORTED: "GPU_FABRIC_STATE_NOT_SUPPORTED",
	nvml.GPU_FABRIC_STATE_NOT_STARTED:   "GPU_FABRIC_STATE_NOT_STARTED",
	nvml.GPU_FABRIC_STATE_IN_PROGRESS:   "GPU_FABRIC_STATE_IN_PROGRESS",
	nvml.GPU_FABRIC_STATE_COMPLETED:     "GPU_FABRIC_STATE_COMPLETED",
}

// gpuInstanceProfileNames: nvml.h NVML_GPU_INSTANCE_PROFILE_*, below
// NVML_GPU_INSTANCE_PROFILE_COUNT.
var gpuInstanceProfileNames = map[int]string{
	nvml.GPU_INSTANCE_PROFILE_1_SLICE:        "GPU_INSTANCE_PROFILE_1_SLICE",
	nvml.GPU_INSTANCE_PROFILE_2_SLICE:        "GPU_INSTANCE_PROFILE_2_SLICE",
	nvml.GPU_INSTANCE_PROFILE_3_SLICE:        "GPU_INSTANCE_PROFILE_3_SLICE",
	nvml.GPU_INSTANCE_PROFILE_4_SLICE:        "GPU_INSTANCE_PROFILE_4_SLICE",
	nvml.GPU_INSTANCE_PROFILE_7_SLICE:        "GPU_INSTANCE_PROFILE_7_SLICE",
	nvml.GPU_INSTANCE_PROFILE_8_SLICE:        "GPU_INSTANCE_PROFILE_8_SLICE",
	nvml.GPU_INSTANCE_PROFILE_6_SLICE:        "GPU_INSTANCE_PROFILE_6_SLICE",
	nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1:   "GPU_INSTANCE_PROFILE_1_SLICE_REV1",
	nvml.GPU_INSTANCE_PROFILE_2_SLICE_REV1:   "GPU_INSTANCE_PROFILE_2_SLICE_REV1",
	nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2:   "GPU_INSTANCE_PROFILE_1_SLICE_REV2",
	nvml.GPU_INSTANCE_PROFILE_1_SLICE_GFX:    "GPU_INSTANCE_PROFILE_1_SLICE_GFX",
	nvml.GPU_INSTANCE_PROFILE_2_SLICE_GFX:    "GPU_INSTANCE_PROFILE_2_SLICE_GFX",
	nvml.GPU_INSTANCE_PROFILE_4_SLICE_GFX:    "GPU_INSTANCE_PROFILE_4_SLICE_GFX",
	nvml.GPU_INSTANCE_PROFILE_1_SLICE_NO_ME:  "GPU_INSTANCE_PROFILE_1_SLICE_NO_ME",
	nvml.GPU_INSTANCE_PROFILE_2_SLICE_NO_ME:  "GPU_INSTANCE_PROFILE_2_SLICE_NO_ME",
	nvml.GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME: "GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME",
	nvml.GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME: "GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME",
	nvml.GPU_INSTANCE_PROFILE_3_SLICE_GFX:    "GPU_INSTANCE_PROFILE_3_SLICE_GFX",
}

func gpuInstanceProfileName(p int) any { return named(gpuInstanceProfileNames, p) }

// computeInstanceProfileNames: nvml.h's NVML_COMPUTE_INSTANCE_PROFILE_*
// values below NVML_COMPUTE_INSTANCE_PROFILE_COUNT.
var computeInstanceProfileNames = map[int]string{
	nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE:      "COMPUTE_INSTANCE_PROFILE_1_SLICE",
	nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE:      "COMPUTE_INSTANCE_PROFILE_2_SLICE",
	nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE:      "COMPUTE_INSTANCE_PROFILE_3_SLICE",
	nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE:      "COMPUTE_INSTANCE_PROFILE_4_SLICE",
	nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE:      "COMPUTE_INSTANCE_PROFILE_7_SLICE",
	nvml.COMPUTE_INSTANCE_PROFILE_8_SLICE:      "COMPUTE_INSTANCE_PROFILE_8_SLICE",
	nvml.COMPUTE_INSTANCE_PROFILE_6_SLICE:      "COMPUTE_INSTANCE_PROFILE_6_SLICE",
	nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE_REV1: "COMPUTE_INSTANCE_PROFILE_1_SLICE_REV1",
	nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE_NVL:  "COMPUTE_INSTANCE_PROFILE_7_SLICE_NVL",
}

func computeInstanceProfileName(p int) any { return named(computeInstanceProfileNames, p) }

// eventTypeNames: nvml.h's nvmlEventType* bits.
var eventTypeNames = []struct {
	name string
	bit  uint64
}{
	{"EventTypeSingleBitEccError", nvml.EventTypeSingleBitEccError},
	{"EventTypeDoubleBitEccError", nvml.EventTypeDoubleBitEccError},
	{"EventTypePState", nvml.EventTypePState},
	{"EventTypeXidCriticalError", nvml.EventTypeXidCriticalError},
	{"EventTypeClock", nvml.EventTypeClock},
	{"EventTypePowerSourceChange", nvml.EventTypePowerSourceChange},
	{"EventMigConfigChange", nvml.EventMigConfigChange},
	{"EventTypeSingleBitEccErrorStorm", nvml.EventTypeSingleBitEccErrorStorm},
	{"EventTypeDramRetirementEvent", nvml.EventTypeDramRetirementEvent},
	{"EventTypeDramRetirementFailure", nvml.EventTypeDramRetirementFailure},
	{"EventTypeNonFatalPoisonError", nvml.EventTypeNonFatalPoisonError},
	{"EventTypeFatalPoisonError", nvml.EventTypeFatalPoisonError},
	{"EventTypeGpuUnavailableError", nvml.EventTypeGpuUnavailableError},
	{"EventTypeGpuRecoveryAction", nvml.EventTypeGpuRecoveryAction},
}

// eventTypesName names a mask by its bits, "A|B"; nvmlEventTypeAll by
// its own name.
func eventTypesName(mask uint64) string {
	if mask == nvml.EventTypeAll {
		return "EventTypeAll"
	}
	var names []string
	for _, t := range eventTypeNames {
		if mask&t.bit != 0 {
			names = append(names, t.name)
			mask &^= t.bit
		}
	}
	if mask != 0 || len(names) == 0 {
		names = append(names, fmt.Sprintf("0x%x", mask))
	}
	return strings.Join(names, "|")
}

// fieldIDNames: the nvml.h NVML_FI_DEV_* field IDs the agent reads.
var fieldIDNames = map[uint32]string{
	nvml.FI_DEV_MEMORY_TEMP:                       "FI_DEV_MEMORY_TEMP",
	nvml.FI_DEV_NVLINK_BANDWIDTH_C0_TOTAL:         "FI_DEV_NVLINK_BANDWIDTH_C0_TOTAL",
	nvml.FI_DEV_GET_GPU_RECOVERY_ACTION:           "FI_DEV_GET_GPU_RECOVERY_ACTION",
	nvml.FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS: "FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS",
}

// valueTypeNames: nvml.h nvmlValueType_t.
var valueTypeNames = map[nvml.ValueType]string{
	nvml.VALUE_TYPE_DOUBLE:             "VALUE_TYPE_DOUBLE",
	nvml.VALUE_TYPE_UNSIGNED_INT:       "VALUE_TYPE_UNSIGNED_INT",
	nvml.VALUE_TYPE_UNSIGNED_LONG:      "VALUE_TYPE_UNSIGNED_LONG",
	nvml.VALUE_TYPE_UNSIGNED_LONG_LONG: "VALUE_TYPE_UNSIGNED_LONG_LONG",
	nvml.VALUE_TYPE_SIGNED_LONG_LONG:   "VALUE_TYPE_SIGNED_LONG_LONG",
	nvml.VALUE_TYPE_SIGNED_INT:         "VALUE_TYPE_SIGNED_INT",
	nvml.VALUE_TYPE_UNSIGNED_SHORT:     "VALUE_TYPE_UNSIGNED_SHORT",
}

// fieldArgs is GetFieldValues' argument: the field IDs and scopes asked.
func fieldArgs(fvs []nvml.FieldValue) []any {
	out := make([]any, len(fvs))
	for i, fv := range fvs {
		out[i] = map[string]any{"fieldId": named(fieldIDNames, fv.FieldId), "scopeId": fv.ScopeId}
	}
	return out
}

// fieldValuesJSON is each field as GetFieldValues filled it in: its own
// return (nvmlFieldValue_t.nvmlReturn) and, where that is SUCCESS, its
// value decoded by valueType.
func fieldValuesJSON(fvs []nvml.FieldValue) []any {
	out := make([]any, len(fvs))
	for i, fv := range fvs {
		ret := nvml.Return(fv.NvmlReturn)
		m := map[string]any{
			"fieldId":     named(fieldIDNames, fv.FieldId),
			"scopeId":     fv.ScopeId,
			"nvmlReturn":  returnName(ret),
			"timestamp":   fv.Timestamp,
			"latencyUsec": fv.LatencyUsec,
		}
		if ret == nvml.SUCCESS {
			m["valueType"] = named(valueTypeNames, nvml.ValueType(fv.ValueType))
			m["value"] = fieldValue(fv)
		}
		out[i] = m
	}
	return out
}

// fieldValue decodes nvmlFieldValue_t.value (a union) by its valueType.
func fieldValue(fv nvml.FieldValue) any {
	b := fv.Value[:]
	switch nvml.ValueType(fv.ValueType) {
	case nvml.VALUE_TYPE_DOUBLE:
		f := math.Float64frombits(binary.NativeEndian.Uint64(b))
		if math.IsNaN(f) || math.IsInf(f, 0) {
			// JSON has no NaN or infinity.
			return fmt.Sprint(f)
		}
		return f
	case nvml.VALUE_TYPE_UNSIGNED_INT:
		return binary.NativeEndian.Uint32(b)
	case nvml.VALUE_TYPE_UNSIGNED_LONG, nvml.VALUE_TYPE_UNSIGNED_LONG_LONG:
		return binary.NativeEndian.Uint64(b)
	case nvml.VALUE_TYPE_SIGNED_LONG_LONG:
		return int64(binary.NativeEndian.Uint64(b))
	case nvml.VALUE_TYPE_SIGNED_INT:
		return int32(binary.NativeEndian.Uint32(b))
	case nvml.VALUE_TYPE_UNSIGNED_SHORT:
		return binary.NativeEndian.Uint16(b)
	}
	return hex.EncodeToString(b)
}

// eventJSON is one event from EventSet.Wait, its device as the GPU index
// whose handle it equals (nil for none: a NULL device concerns every GPU).
func eventJSON(e EventData, gpus []*gpuCensus) map[string]any {
	var dev any
	for _, g := range gpus {
		if e.Device != nil && g.handle != nil && e.Device == g.handle {
			dev = g.index
		}
	}
	return map[string]any{
		"device":            dev,
		"eventType":         eventTypesName(e.EventType),
		"eventData":         e.EventData,
		"gpuInstanceId":     e.GpuInstanceId,
		"computeInstanceId": e.ComputeInstanceId,
	}
}

// jsonValue is v as the census records it: nvml.h enums by name, NVML's
// structs as objects keyed by nvml.h's field names (lowerCamelCase, as
// nvml.h spells them), C strings as strings; handles and padding left
// out.
func jsonValue(v any) any {
	switch x := v.(type) {
	case nil:
		return nil
	case nvml.Return:
		return returnName(x)
	case nvml.EnableState:
		return named(enableStateNames, x)
	case nvml.BrandType:
		return named(brandNames, x)
	case nvml.GpuTopologyLevel:
		return named(topologyLevelNames, x)
	case nvml.IntNvLinkDeviceType:
		return named(nvLinkDeviceTypeNames, x)
	case nvml.GpuFabricInfo:
		// nvml.h nvmlGpuFabricInfo_t: status is an nvmlReturn_t, state
		// an nvmlGpuFabricState_t.
		return map[string]any{
			"clusterUuid": uuidString(x.ClusterUuid),
			"status":      returnName(nvml.Return(x.Status)),
			"cliqueId":    x.CliqueId,
			"state":       named(fabricStateNames, x.State),
		}
	}
	return reflectValue(reflect.ValueOf(v))
}

func reflectValue(rv reflect.Value) any {
	switch rv.Kind() {
	case reflect.Struct:
		m := map[string]any{}
		t := rv.Type()
		for i := range t.NumField() {
			f := t.Field(i)
			if !f.IsExported() || strings.HasPrefix(f.Name, "Pad_cgo") || f.Type.Kind() == reflect.Interface {
				continue
			}
			m[lowerFirst(f.Name)] = jsonValue(rv.Field(i).Interface())
		}
		return m
	case reflect.Array, reflect.Slice:
		switch rv.Type().Elem().Kind() {
		case reflect.Int8:
			var sb strings.Builder
			for i := range rv.Len() {
				c := rv.Index(i).Int()
				if c == 0 {
					break
				}
				sb.WriteByte(byte(c))
			}
			return sb.String()
		case reflect.Uint8:
			b := make([]byte, rv.Len())
			for i := range b {
				b[i] = byte(rv.Index(i).Uint())
			}
			return hex.EncodeToString(b)
		}
		out := make([]any, rv.Len())
		for i := range out {
			out[i] = jsonValue(rv.Index(i).Interface())
		}
		return out
	case reflect.Map:
		m := map[string]any{}
		for it := rv.MapRange(); it.Next(); {
			m[fmt.Sprint(it.Key().Interface())] = jsonValue(it.Value().Interface())
		}
		return m
	}
	return rv.Interface()
}

// lowerFirst turns a go-nvml field name back into nvml.h's: "BusIdLegacy"
// is busIdLegacy.
func lowerFirst(s string) string {
	r, n := utf8.DecodeRuneInString(s)
	return string(unicode.ToLower(r)) + s[n:]
}

// uuidString formats a 16-byte UUID as 8-4-4-4-12 hex digits.
func uuidString(b [16]uint8) string {
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}
