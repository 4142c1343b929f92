package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
)

// Label names, spelled as dcgm-exporter spells them so existing dashboards
// and alerts keep working. Some are camelCase on purpose (see
// promlint_test.go for the compatibility exceptions).
const (
	labelGPU       = "gpu"
	labelUUID      = "UUID"
	labelPCIBusID  = "pci_bus_id"
	labelDevice    = "device"
	labelModelName = "modelName"
	labelHostname  = "Hostname"
	labelGIProfile = "GPU_I_PROFILE"
	labelGIID      = "GPU_I_ID"
	labelPod       = "pod"
	labelNamespace = "namespace"
	labelContainer = "container"
	// labelDriverVersion is how dcgm-exporter carries the
	// DCGM_FI_DRIVER_VERSION field of default-counters.csv (type "label"):
	// a label named after the field on every series.
	labelDriverVersion = "DCGM_FI_DRIVER_VERSION"
	numDeviceLabels    = 12
)

// deviceLabels is the label set of every DCGM_ metric. Whole GPUs carry
// empty MIG labels and unattributed devices empty pod labels: an empty
// label is the same as an absent one to Prometheus, and one label set per
// family is what a client_golang registry requires.
var deviceLabels = []string{
	labelGPU, labelUUID, labelPCIBusID, labelDevice, labelModelName, labelHostname,
	labelGIProfile, labelGIID, labelPod, labelNamespace, labelContainer, labelDriverVersion,
}

// field identifies one DCGM metric the collector serves.
type field int

// The fields served, in exposition order. Names, types and help strings
// follow dcgm-exporter's etc/default-counters.csv; the ECC and
// retired-page fields are commented out there by default and on here.
const (
	fieldSMClock field = iota
	fieldMemClock
	fieldMemoryTemp
	fieldGPUTemp
	fieldPowerUsage
	fieldTotalEnergy
	fieldPCIeReplay
	fieldGPUUtil
	fieldMemCopyUtil
	fieldEncUtil
	fieldDecUtil
	fieldXIDErrors
	fieldFBFree
	fieldFBUsed
	fieldFBReserved
	fieldECCSBEVol
	fieldECCDBEVol
	fieldECCSBEAgg
	fieldECCDBEAgg
	fieldRetiredSBE
	fieldRetiredDBE
	fieldRetiredPending
	fieldNVLinkBandwidth
	fieldVGPULicense
	fieldUncorrectableRemapped
	fieldCorrectableRemapped
	fieldRowRemapFailure
	fieldClocksEventReasons
	numFields
)

// fieldSpec is a field's exposition (name, type and help) and where its
// value comes from.
type fieldSpec struct {
	name string
	typ  prometheus.ValueType
	help string
	// src is the sampled reading shown; noSource for the XID metric,
	// which comes from Config.XIDs.
	src nvmlowner.Field
	// unit converts NVML's unit to DCGM's; nil keeps the value.
	unit func(uint64) float64
}

// noSource marks a field not read from an nvmlowner.Sample.
const noSource = nvmlowner.NumFields

// toMiB converts NVML's framebuffer bytes to DCGM's whole MiB.
func toMiB(b uint64) float64 { return float64(b / mib) }

// toWatts converts NVML's power in mW to DCGM's W.
func toWatts(mw uint64) float64 { return float64(mw) / 1000 }

var fieldSpecs = [numFields]fieldSpec{
	fieldSMClock:               {"DCGM_FI_DEV_SM_CLOCK", prometheus.GaugeValue, "SM clock frequency (in MHz).", nvmlowner.FieldSMClock, nil},
	fieldMemClock:              {"DCGM_FI_DEV_MEM_CLOCK", prometheus.GaugeValue, "Memory clock frequency (in MHz).", nvmlowner.FieldMemClock, nil},
	fieldMemoryTemp:            {"DCGM_FI_DEV_MEMORY_TEMP", prometheus.GaugeValue, "Memory temperature (in C).", nvmlowner.FieldMemTemp, nil},
	fieldGPUTemp:               {"DCGM_FI_DEV_GPU_TEMP", prometheus.GaugeValue, "GPU temperature (in C).", nvmlowner.FieldGPUTemp, nil},
	fieldPowerUsage:            {"DCGM_FI_DEV_POWER_USAGE", prometheus.GaugeValue, "Power draw (in W).", nvmlowner.FieldPowerUsage, toWatts},
	fieldTotalEnergy:           {"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", prometheus.CounterValue, "Total energy consumption since boot (in mJ).", nvmlowner.FieldTotalEnergy, nil},
	fieldPCIeReplay:            {"DCGM_FI_DEV_PCIE_REPLAY_COUNTER", prometheus.CounterValue, "Total number of PCIe retries.", nvmlowner.FieldPCIeReplay, nil},
	fieldGPUUtil:               {"DCGM_FI_DEV_GPU_UTIL", prometheus.GaugeValue, "GPU utilization (in %).", nvmlowner.FieldGPUUtil, nil},
	fieldMemCopyUtil:           {"DCGM_FI_DEV_MEM_COPY_UTIL", prometheus.GaugeValue, "Memory utilization (in %).", nvmlowner.FieldMemCopyUtil, nil},
	fieldEncUtil:               {"DCGM_FI_DEV_ENC_UTIL", prometheus.GaugeValue, "Encoder utilization (in %).", nvmlowner.FieldEncUtil, nil},
	fieldDecUtil:               {"DCGM_FI_DEV_DEC_UTIL", prometheus.GaugeValue, "Decoder utilization (in %).", nvmlowner.FieldDecUtil, nil},
	fieldXIDErrors:             {"DCGM_FI_DEV_XID_ERRORS", prometheus.GaugeValue, "Value of the last XID error encountered.", noSource, nil},
	fieldFBFree:                {"DCGM_FI_DEV_FB_FREE", prometheus.GaugeValue, "Framebuffer memory free (in MiB).", nvmlowner.FieldFBFree, toMiB},
	fieldFBUsed:                {"DCGM_FI_DEV_FB_USED", prometheus.GaugeValue, "Framebuffer memory used (in MiB).", nvmlowner.FieldFBUsed, toMiB},
	fieldFBReserved:            {"DCGM_FI_DEV_FB_RESERVED", prometheus.GaugeValue, "Framebuffer memory reserved (in MiB).", nvmlowner.FieldFBReserved, toMiB},
	fieldECCSBEVol:             {"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", prometheus.CounterValue, "Total number of single-bit volatile ECC errors.", nvmlowner.FieldECCSBEVolatile, nil},
	fieldECCDBEVol:             {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", prometheus.CounterValue, "Total number of double-bit volatile ECC errors.", nvmlowner.FieldECCDBEVolatile, nil},
	fieldECCSBEAgg:             {"DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", prometheus.CounterValue, "Total number of single-bit persistent ECC errors.", nvmlowner.FieldECCSBEAggregate, nil},
	fieldECCDBEAgg:             {"DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", prometheus.CounterValue, "Total number of double-bit persistent ECC errors.", nvmlowner.FieldECCDBEAggregate, nil},
	fieldRetiredSBE:            {"DCGM_FI_DEV_RETIRED_SBE", prometheus.CounterValue, "Total number of retired pages due to single-bit errors.", nvmlowner.FieldRetiredSBE, nil},
	fieldRetiredDBE:            {"DCGM_FI_DEV_RETIRED_DBE", prometheus.CounterValue, "Total number of retired pages due to double-bit errors.", nvmlowner.FieldRetiredDBE, nil},
	fieldRetiredPending:        {"DCGM_FI_DEV_RETIRED_PENDING", prometheus.CounterValue, "Total number of pages pending retirement.", nvmlowner.FieldRetiredPending, nil},
	fieldNVLinkBandwidth:       {"DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", prometheus.CounterValue, "Total number of NVLink bandwidth counters for all lanes.", nvmlowner.FieldNVLinkBandwidth, nil},
	fieldVGPULicense:           {"DCGM_FI_DEV_VGPU_LICENSE_STATUS", prometheus.GaugeValue, "vGPU License status", nvmlowner.FieldVGPULicense, nil},
	fieldUncorrectableRemapped: {"DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", prometheus.CounterValue, "Number of remapped rows for uncorrectable errors.", nvmlowner.FieldRemapUncorrectable, nil},
	fieldCorrectableRemapped:   {"DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", prometheus.CounterValue, "Number of remapped rows for correctable errors.", nvmlowner.FieldRemapCorrectable, nil},
	fieldRowRemapFailure:       {"DCGM_FI_DEV_ROW_REMAP_FAILURE", prometheus.GaugeValue, "Whether remapping of rows has failed.", nvmlowner.FieldRemapFailure, nil},
	// Not in default-counters.csv: DCGM field 112 (dcgm_fields.h; the
	// deprecated DCGM_FI_DEV_CLOCK_THROTTLE_REASONS is the same ID), the
	// bits of nvml.h's nvmlClocksEventReason*, which the thermal and power
	// alerts test.
	fieldClocksEventReasons: {"DCGM_FI_DEV_CLOCKS_EVENT_REASONS", prometheus.GaugeValue, "Current clock event reasons (bitmask of DCGM_CLOCKS_EVENT_REASON_*).", nvmlowner.FieldClocksEventReasons, nil},
}

// FieldNames returns the names of the DCGM metrics this package can serve,
// in exposition order. A GPU that does not support a field omits it.
func FieldNames() []string {
	names := make([]string, numFields)
	for i, s := range fieldSpecs {
		names[i] = s.name
	}
	return names
}

// newFieldDescs builds one Desc per field with the device label set.
func newFieldDescs() [numFields]*prometheus.Desc {
	var descs [numFields]*prometheus.Desc
	for i, s := range fieldSpecs {
		descs[i] = prometheus.NewDesc(s.name, s.help, deviceLabels, nil)
	}
	return descs
}
