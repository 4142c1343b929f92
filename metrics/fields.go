package metrics

import (
	"fmt"
	"math"

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
	// labelDriverVersionCurrent is DCGM 4.6's name of that field
	// (go-dcgm v1.4611.0 dcgm_fields.h: DCGM_FI_DRIVER_VERSION is a
	// deprecated alias of DCGM_FI_SYSTEM_DRIVER_VERSION), the label's
	// name when metrics.dcgmNames is current.
	labelDriverVersionCurrent = "DCGM_FI_SYSTEM_DRIVER_VERSION"
	// The DRA claim labels, as dcgm-exporter 4.5.3-4.8.2 spells them
	// (internal/pkg/transformation/const.go draClaimName ...
	// draDeviceName, set in kubernetes.go from the pod-resources List's
	// dynamic resources): set on the series of a device a DRA claim of
	// our driver holds, empty otherwise.
	labelDRAClaimName      = "dra_claim_name"
	labelDRAClaimNamespace = "dra_claim_namespace"
	labelDRADriverName     = "dra_driver_name"
	labelDRAPoolName       = "dra_pool_name"
	labelDRADeviceName     = "dra_device_name"
	numDeviceLabels        = 17
)

// deviceLabels is the label set of every DCGM_ metric; the DRA labels
// only with Config.DRALabels. Whole GPUs carry empty MIG labels,
// unattributed devices empty pod labels and devices no DRA claim holds
// empty DRA labels: an empty label is the same as an absent one to
// Prometheus, and one label set per family is what a client_golang
// registry requires.
var deviceLabels = []string{
	labelGPU, labelUUID, labelPCIBusID, labelDevice, labelModelName, labelHostname,
	labelGIProfile, labelGIID, labelPod, labelNamespace, labelContainer, labelDriverVersion,
	labelDRAClaimName, labelDRAClaimNamespace, labelDRADriverName, labelDRAPoolName, labelDRADeviceName,
}

// numPlainLabels are the device labels before the DRA ones.
const numPlainLabels = 12

// deviceLabelNames is deviceLabels as served in mode n, with or without
// the DRA labels: the driver version label takes DCGM 4.6's name in mode
// current.
func deviceLabelNames(n DCGMNames, dra bool) []string {
	l := append([]string(nil), deviceLabels...)
	if !dra {
		l = l[:numPlainLabels]
	}
	if n == DCGMNamesCurrent {
		l[11] = labelDriverVersionCurrent
	}
	return l
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
	fieldRecoveryAction
	// The NVLink5 fields, from every link's Link.NVLink5 reading.
	fieldNVLinkEffectiveErrors
	fieldNVLinkEffectiveBER
	fieldNVLinkSymbolErrors
	fieldNVLinkSymbolBER
	fieldNVLinkFECHistory0 // 16 bins, 0-15
	numFields              = fieldNVLinkFECHistory0 + 16
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
	// current is the field's DCGM 4.6 name where it differs from name
	// (go-dcgm v1.4611.0 pkg/dcgm/dcgm_fields.h, the deprecated block:
	// "#define <name> <current>"); "" where DCGM kept the name.
	current string
	// link, for an NVLink5 field, is the per-link reading it is made of
	// (src is then noSource); aggMax takes the worst link rather than
	// the sum.
	link   nvmlowner.NVLink5Field
	aggMax bool
}

// fromLinks says whether field f is made of per-link readings.
func fromLinks(f field) bool { return f >= fieldNVLinkEffectiveErrors }

// noSource marks a field not read from an nvmlowner.Sample.
const noSource = nvmlowner.NumFields

// toMiB converts NVML's framebuffer bytes to DCGM's whole MiB.
func toMiB(b uint64) float64 { return float64(b / mib) }

// toWatts converts NVML's power in mW to DCGM's W.
func toWatts(mw uint64) float64 { return float64(mw) / 1000 }

// spec is the fieldSpec of a field read from one sampled reading.
func spec(name string, typ prometheus.ValueType, help string, src nvmlowner.Field, unit func(uint64) float64) fieldSpec {
	return fieldSpec{name: name, typ: typ, help: help, src: src, unit: unit}
}

// decodeBER decodes an NVLink BER reading: nvml.h (go-nvml v0.13.3-1)
// packs it as "Bit [0:7]: BER Exponent value, Bit [8:11]: BER MANTISSA
// value" (NVML_NVLINK_ERROR_COUNTER_BER_GET); the value is read as
// mantissa·10^-exponent, a bit error rate's usual notation.
func decodeBER(raw uint64) float64 {
	mantissa := float64((raw >> 8) & 0xf)
	exponent := float64(raw & 0xff)
	return mantissa * math.Pow(10, -exponent)
}

var fieldSpecs = buildFieldSpecs()

func buildFieldSpecs() [numFields]fieldSpec {
	specs := [numFields]fieldSpec{
		fieldSMClock:               spec("DCGM_FI_DEV_SM_CLOCK", prometheus.GaugeValue, "SM clock frequency (in MHz).", nvmlowner.FieldSMClock, nil),
		fieldMemClock:              spec("DCGM_FI_DEV_MEM_CLOCK", prometheus.GaugeValue, "Memory clock frequency (in MHz).", nvmlowner.FieldMemClock, nil),
		fieldMemoryTemp:            spec("DCGM_FI_DEV_MEMORY_TEMP", prometheus.GaugeValue, "Memory temperature (in C).", nvmlowner.FieldMemTemp, nil),
		fieldGPUTemp:               spec("DCGM_FI_DEV_GPU_TEMP", prometheus.GaugeValue, "GPU temperature (in C).", nvmlowner.FieldGPUTemp, nil),
		fieldPowerUsage:            spec("DCGM_FI_DEV_POWER_USAGE", prometheus.GaugeValue, "Power draw (in W).", nvmlowner.FieldPowerUsage, toWatts),
		fieldTotalEnergy:           spec("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", prometheus.CounterValue, "Total energy consumption since boot (in mJ).", nvmlowner.FieldTotalEnergy, nil),
		fieldPCIeReplay:            spec("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", prometheus.CounterValue, "Total number of PCIe retries.", nvmlowner.FieldPCIeReplay, nil),
		fieldGPUUtil:               spec("DCGM_FI_DEV_GPU_UTIL", prometheus.GaugeValue, "GPU utilization (in %).", nvmlowner.FieldGPUUtil, nil),
		fieldMemCopyUtil:           spec("DCGM_FI_DEV_MEM_COPY_UTIL", prometheus.GaugeValue, "Memory utilization (in %).", nvmlowner.FieldMemCopyUtil, nil),
		fieldEncUtil:               spec("DCGM_FI_DEV_ENC_UTIL", prometheus.GaugeValue, "Encoder utilization (in %).", nvmlowner.FieldEncUtil, nil),
		fieldDecUtil:               spec("DCGM_FI_DEV_DEC_UTIL", prometheus.GaugeValue, "Decoder utilization (in %).", nvmlowner.FieldDecUtil, nil),
		fieldXIDErrors:             spec("DCGM_FI_DEV_XID_ERRORS", prometheus.GaugeValue, "Value of the last XID error encountered.", noSource, nil),
		fieldFBFree:                spec("DCGM_FI_DEV_FB_FREE", prometheus.GaugeValue, "Framebuffer memory free (in MiB).", nvmlowner.FieldFBFree, toMiB),
		fieldFBUsed:                spec("DCGM_FI_DEV_FB_USED", prometheus.GaugeValue, "Framebuffer memory used (in MiB).", nvmlowner.FieldFBUsed, toMiB),
		fieldFBReserved:            spec("DCGM_FI_DEV_FB_RESERVED", prometheus.GaugeValue, "Framebuffer memory reserved (in MiB).", nvmlowner.FieldFBReserved, toMiB),
		fieldECCSBEVol:             spec("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", prometheus.CounterValue, "Total number of single-bit volatile ECC errors.", nvmlowner.FieldECCSBEVolatile, nil),
		fieldECCDBEVol:             spec("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", prometheus.CounterValue, "Total number of double-bit volatile ECC errors.", nvmlowner.FieldECCDBEVolatile, nil),
		fieldECCSBEAgg:             spec("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", prometheus.CounterValue, "Total number of single-bit persistent ECC errors.", nvmlowner.FieldECCSBEAggregate, nil),
		fieldECCDBEAgg:             spec("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", prometheus.CounterValue, "Total number of double-bit persistent ECC errors.", nvmlowner.FieldECCDBEAggregate, nil),
		fieldRetiredSBE:            spec("DCGM_FI_DEV_RETIRED_SBE", prometheus.CounterValue, "Total number of retired pages due to single-bit errors.", nvmlowner.FieldRetiredSBE, nil),
		fieldRetiredDBE:            spec("DCGM_FI_DEV_RETIRED_DBE", prometheus.CounterValue, "Total number of retired pages due to double-bit errors.", nvmlowner.FieldRetiredDBE, nil),
		fieldRetiredPending:        spec("DCGM_FI_DEV_RETIRED_PENDING", prometheus.CounterValue, "Total number of pages pending retirement.", nvmlowner.FieldRetiredPending, nil),
		fieldNVLinkBandwidth:       spec("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", prometheus.CounterValue, "Total number of NVLink bandwidth counters for all lanes.", nvmlowner.FieldNVLinkBandwidth, nil),
		fieldVGPULicense:           spec("DCGM_FI_DEV_VGPU_LICENSE_STATUS", prometheus.GaugeValue, "vGPU License status", nvmlowner.FieldVGPULicense, nil),
		fieldUncorrectableRemapped: spec("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", prometheus.CounterValue, "Number of remapped rows for uncorrectable errors.", nvmlowner.FieldRemapUncorrectable, nil),
		fieldCorrectableRemapped:   spec("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", prometheus.CounterValue, "Number of remapped rows for correctable errors.", nvmlowner.FieldRemapCorrectable, nil),
		fieldRowRemapFailure:       spec("DCGM_FI_DEV_ROW_REMAP_FAILURE", prometheus.GaugeValue, "Whether remapping of rows has failed.", nvmlowner.FieldRemapFailure, nil),
		// Not in default-counters.csv: DCGM field 112 (dcgm_fields.h; the
		// deprecated DCGM_FI_DEV_CLOCK_THROTTLE_REASONS is the same ID), the
		// bits of nvml.h's nvmlClocksEventReason*, which the thermal and power
		// alerts test.
		fieldClocksEventReasons: spec("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", prometheus.GaugeValue, "Current clock event reasons (bitmask of DCGM_CLOCKS_EVENT_REASON_*).", nvmlowner.FieldClocksEventReasons, nil),
		// Not in default-counters.csv: NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
		// (nvml.h), DCGM field 1523, the sampler's reading the health
		// checks judge.
		fieldRecoveryAction: spec("DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION", prometheus.GaugeValue,
			"GPU recovery action (nvmlDeviceGpuRecoveryAction_t: 0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset, 5 recover IMEX domain).",
			nvmlowner.FieldRecoveryAction, nil),
		// DCGM fields 1214-1219 and 1404-1419: "NVLink5+ only. Returns
		// aggregate value across all links" (dcgm_fields.h). Counters
		// are summed over the links, BERs the worst link's.
		fieldNVLinkEffectiveErrors: {name: "DCGM_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS", typ: prometheus.CounterValue,
			help: "Sum of the number of errors in each NVLink packet, all links.", link: nvmlowner.NVLink5EffectiveErrors},
		fieldNVLinkEffectiveBER: {name: "DCGM_FI_DEV_NVLINK_COUNT_EFFECTIVE_BER_FLOAT", typ: prometheus.GaugeValue,
			help: "Effective BER for effective errors, worst link.", link: nvmlowner.NVLink5EffectiveBER, aggMax: true, unit: decodeBER},
		fieldNVLinkSymbolErrors: {name: "DCGM_FI_DEV_NVLINK_COUNT_RX_SYMBOL_ERRORS", typ: prometheus.CounterValue,
			help: "Number of errors in rx symbols, all links.", link: nvmlowner.NVLink5SymbolErrors},
		fieldNVLinkSymbolBER: {name: "DCGM_FI_DEV_NVLINK_COUNT_SYMBOL_BER_FLOAT", typ: prometheus.GaugeValue,
			help: "BER for symbol errors, worst link.", link: nvmlowner.NVLink5SymbolBER, aggMax: true, unit: decodeBER},
	}
	for b := range 16 {
		specs[fieldNVLinkFECHistory0+field(b)] = fieldSpec{
			name: fmt.Sprintf("DCGM_FI_DEV_NVLINK_COUNT_FEC_HISTORY_%d", b), typ: prometheus.CounterValue,
			help:    fmt.Sprintf("Count of symbol errors that are corrected - bin %d, all links.", b),
			current: fmt.Sprintf("DCGM_FI_DEV_NVLINK_FEC_HISTORY_%d_TOTAL", b),
			link:    nvmlowner.NVLink5FECHistory0 + nvmlowner.NVLink5Field(b),
		}
	}
	for f := fieldNVLinkEffectiveErrors; f < numFields; f++ {
		specs[f].src = noSource
	}
	// DCGM 4.6's names (go-dcgm v1.4611.0 pkg/dcgm/dcgm_fields.h,
	// deprecated block); each is the same field ID, so the same value.
	for f, name := range map[field]string{
		fieldMemoryTemp:            "DCGM_FI_DEV_MEMORY_TEMP_CELSIUS",
		fieldGPUTemp:               "DCGM_FI_DEV_GPU_TEMP_CELSIUS",
		fieldPowerUsage:            "DCGM_FI_DEV_BOARD_POWER_WATTS",
		fieldPCIeReplay:            "DCGM_FI_DEV_PCIE_REPLAY_TOTAL",
		fieldGPUUtil:               "DCGM_FI_DEV_GPU_UTIL_RATIO",
		fieldXIDErrors:             "DCGM_FI_DEV_XID_ERROR",
		fieldRetiredSBE:            "DCGM_FI_DEV_PAGE_RETIRED_SBE_TOTAL",
		fieldRetiredDBE:            "DCGM_FI_DEV_PAGE_RETIRED_DBE_TOTAL",
		fieldRetiredPending:        "DCGM_FI_DEV_PAGE_RETIRED_PENDING",
		fieldNVLinkBandwidth:       "DCGM_FI_DEV_NVLINK_THROUGHPUT_TOTAL",
		fieldUncorrectableRemapped: "DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL",
		fieldCorrectableRemapped:   "DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL",
		fieldRowRemapFailure:       "DCGM_FI_DEV_ROW_REMAP_FAILED",
		fieldRecoveryAction:        "DCGM_FI_DEV_GPU_RECOVERY_ACTION",
		fieldNVLinkEffectiveErrors: "DCGM_FI_DEV_NVLINK_EFFECTIVE_ERROR_TOTAL",
		fieldNVLinkEffectiveBER:    "DCGM_FI_DEV_NVLINK_EFFECTIVE_BER_RATIO",
		fieldNVLinkSymbolErrors:    "DCGM_FI_DEV_NVLINK_RX_SYMBOL_ERROR_TOTAL",
		fieldNVLinkSymbolBER:       "DCGM_FI_DEV_NVLINK_SYMBOL_BER_RATIO",
	} {
		specs[f].current = name
	}
	return specs
}

// linkValue aggregates field f (fromLinks) over s's links that were
// asked for it: the sum, or the worst link's for aggMax. ok is false
// when no link was asked or one did not answer (NOT_SUPPORTED included):
// a partial sum would read as a counter reset.
func linkValue(f field, links []nvmlowner.Link) (float64, bool) {
	spec := fieldSpecs[f]
	var v float64
	asked := false
	for _, l := range links {
		r := l.NVLink5[spec.link]
		if r.Status == nvmlowner.Absent {
			continue
		}
		if r.Status != nvmlowner.OK {
			return 0, false
		}
		x := float64(r.V)
		if spec.unit != nil {
			x = spec.unit(r.V)
		}
		switch {
		case !asked:
			v = x
		case spec.aggMax:
			v = math.Max(v, x)
		default:
			v += x
		}
		asked = true
	}
	return v, asked
}
