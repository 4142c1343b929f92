package metrics

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// XIDSource reports the last XID seen on a GPU; the health monitor, which
// owns the NVML event set, implements it. ok is false when no XID has been
// seen, which is reported as 0 as dcgm-exporter does.
type XIDSource interface {
	LastXID(uuid string) (xid uint64, ok bool)
}

const mib = 1 << 20

// reading holds one device's values; present marks the fields the device
// reported (a field it does not support stays absent, never 0).
type reading struct {
	values  [numFields]float64
	present [numFields]bool
}

func (r *reading) set(f field, v float64) {
	r.values[f] = v
	r.present[f] = true
}

// gpuResult is everything read from one physical GPU in one cycle: the GPU
// itself and the MIG devices the topology lists for it (same order).
type gpuResult struct {
	gpu  reading
	migs []reading
	// errs are the reads that failed for a reason other than
	// ERROR_NOT_SUPPORTED; any of them counts one collection error.
	errs []error
}

// readDevice is the per-call wrapper: it turns an NVML return code into
// "have a value" / "not supported" / "failed", and a panicking call (an
// unset mock func, a binding bug) into an error, so one bad call costs one
// field, not the device or the process.
func (res *gpuResult) read(what string, fn func() nvml.Return) (ok bool) {
	defer func() {
		if p := recover(); p != nil {
			res.errs = append(res.errs, fmt.Errorf("read %s: panic: %v", what, p))
			ok = false
		}
	}()
	ret := fn()
	switch {
	case ret == nvml.SUCCESS:
		return true
	case errors.Is(ret, nvml.ERROR_NOT_SUPPORTED):
		return false
	default:
		res.errs = append(res.errs, fmt.Errorf("read %s: %w", what, ret))
		return false
	}
}

// readGPU reads one GPU and its MIG devices. It is called on its own
// goroutine per GPU so a hung driver call only stalls that GPU.
func readGPU(lib nvml.Interface, g *topology.GPU, xids XIDSource) *gpuResult {
	res := &gpuResult{migs: make([]reading, len(g.MIG))}
	var dev nvml.Device
	if !res.read("device handle", func() (ret nvml.Return) {
		dev, ret = lib.DeviceGetHandleByUUID(g.UUID)
		return ret
	}) {
		if len(res.errs) == 0 {
			res.errs = append(res.errs, fmt.Errorf("read device handle: %w", nvml.ERROR_NOT_SUPPORTED))
		}
		return res
	}
	r := &res.gpu

	res.read("utilization", func() nvml.Return {
		u, ret := dev.GetUtilizationRates()
		if ret == nvml.SUCCESS {
			r.set(fieldGPUUtil, float64(u.Gpu))
			r.set(fieldMemCopyUtil, float64(u.Memory))
		}
		return ret
	})
	res.read("memory info", func() nvml.Return {
		m, ret := dev.GetMemoryInfo()
		if ret == nvml.SUCCESS {
			r.set(fieldFBUsed, float64(m.Used/mib))
			r.set(fieldFBFree, float64(m.Free/mib))
		}
		return ret
	})
	readUint32(res, "sm clock", fieldSMClock, func() (uint32, nvml.Return) { return dev.GetClockInfo(nvml.CLOCK_SM) })
	readUint32(res, "memory clock", fieldMemClock, func() (uint32, nvml.Return) { return dev.GetClockInfo(nvml.CLOCK_MEM) })
	readUint32(res, "gpu temperature", fieldGPUTemp, func() (uint32, nvml.Return) { return dev.GetTemperature(nvml.TEMPERATURE_GPU) })
	res.read("power usage", func() nvml.Return {
		mw, ret := dev.GetPowerUsage()
		if ret == nvml.SUCCESS {
			r.set(fieldPowerUsage, float64(mw)/1000) // NVML mW -> DCGM W
		}
		return ret
	})
	res.read("total energy", func() nvml.Return {
		mj, ret := dev.GetTotalEnergyConsumption()
		if ret == nvml.SUCCESS {
			r.set(fieldTotalEnergy, float64(mj))
		}
		return ret
	})
	res.read("pcie replay counter", func() nvml.Return {
		n, ret := dev.GetPcieReplayCounter()
		if ret == nvml.SUCCESS {
			r.set(fieldPCIeReplay, float64(n))
		}
		return ret
	})
	readFieldValues(res, dev)
	readECC(res, dev)
	readRetired(res, dev)
	res.read("remapped rows", func() nvml.Return {
		corr, unc, _, failed, ret := dev.GetRemappedRows()
		if ret == nvml.SUCCESS {
			r.set(fieldCorrectableRemapped, float64(corr))
			r.set(fieldUncorrectableRemapped, float64(unc))
			r.set(fieldRowRemapFailure, boolValue(failed))
		}
		return ret
	})
	if xids != nil {
		xid, _ := xids.LastXID(g.UUID)
		r.set(fieldXIDErrors, float64(xid))
	}

	for i := range g.MIG {
		readMIG(res, dev, &g.MIG[i], &res.migs[i])
	}
	return res
}

func readUint32(res *gpuResult, what string, f field, fn func() (uint32, nvml.Return)) {
	res.read(what, func() nvml.Return {
		v, ret := fn()
		if ret == nvml.SUCCESS {
			res.gpu.set(f, float64(v))
		}
		return ret
	})
}

// readFieldValues reads what NVML exposes only as field values, in one
// call: memory temperature and the NVLink bandwidth counter. Each field
// carries its own return code, so one unsupported field drops only itself.
func readFieldValues(res *gpuResult, dev nvml.Device) {
	fvs := []nvml.FieldValue{
		{FieldId: nvml.FI_DEV_MEMORY_TEMP},
		{FieldId: nvml.FI_DEV_NVLINK_BANDWIDTH_C0_TOTAL},
	}
	targets := []field{fieldMemoryTemp, fieldNVLinkBandwidth}
	if !res.read("field values", func() nvml.Return { return dev.GetFieldValues(fvs) }) {
		return
	}
	for i, fv := range fvs {
		ret := nvml.Return(fv.NvmlReturn)
		switch {
		case ret == nvml.SUCCESS:
			if v, ok := fieldValue(fv); ok {
				res.gpu.set(targets[i], v)
			}
		case errors.Is(ret, nvml.ERROR_NOT_SUPPORTED):
		default:
			res.errs = append(res.errs, fmt.Errorf("read field %d: %w", fv.FieldId, ret))
		}
	}
}

// fieldValue decodes an NVML field value (a C union in native byte order).
func fieldValue(fv nvml.FieldValue) (float64, bool) {
	b := fv.Value[:]
	switch nvml.ValueType(fv.ValueType) {
	case nvml.VALUE_TYPE_DOUBLE:
		return math.Float64frombits(binary.NativeEndian.Uint64(b)), true
	case nvml.VALUE_TYPE_UNSIGNED_INT:
		return float64(binary.NativeEndian.Uint32(b)), true
	case nvml.VALUE_TYPE_UNSIGNED_LONG, nvml.VALUE_TYPE_UNSIGNED_LONG_LONG:
		return float64(binary.NativeEndian.Uint64(b)), true
	case nvml.VALUE_TYPE_SIGNED_LONG_LONG:
		return float64(int64(binary.NativeEndian.Uint64(b))), true
	case nvml.VALUE_TYPE_SIGNED_INT:
		return float64(int32(binary.NativeEndian.Uint32(b))), true
	case nvml.VALUE_TYPE_UNSIGNED_SHORT:
		return float64(binary.NativeEndian.Uint16(b)), true
	}
	return 0, false
}

func readECC(res *gpuResult, dev nvml.Device) {
	for _, e := range []struct {
		what    string
		f       field
		errType nvml.MemoryErrorType
		counter nvml.EccCounterType
	}{
		{"ecc sbe volatile", fieldECCSBEVol, nvml.MEMORY_ERROR_TYPE_CORRECTED, nvml.VOLATILE_ECC},
		{"ecc dbe volatile", fieldECCDBEVol, nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC},
		{"ecc sbe aggregate", fieldECCSBEAgg, nvml.MEMORY_ERROR_TYPE_CORRECTED, nvml.AGGREGATE_ECC},
		{"ecc dbe aggregate", fieldECCDBEAgg, nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.AGGREGATE_ECC},
	} {
		res.read(e.what, func() nvml.Return {
			n, ret := dev.GetTotalEccErrors(e.errType, e.counter)
			if ret == nvml.SUCCESS {
				res.gpu.set(e.f, float64(n))
			}
			return ret
		})
	}
}

func readRetired(res *gpuResult, dev nvml.Device) {
	for _, p := range []struct {
		what  string
		f     field
		cause nvml.PageRetirementCause
	}{
		{"retired pages sbe", fieldRetiredSBE, nvml.PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS},
		{"retired pages dbe", fieldRetiredDBE, nvml.PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR},
	} {
		res.read(p.what, func() nvml.Return {
			pages, ret := dev.GetRetiredPages(p.cause)
			if ret == nvml.SUCCESS {
				res.gpu.set(p.f, float64(len(pages)))
			}
			return ret
		})
	}
	res.read("retired pages pending", func() nvml.Return {
		st, ret := dev.GetRetiredPagesPendingStatus()
		if ret == nvml.SUCCESS {
			res.gpu.set(fieldRetiredPending, boolValue(st == nvml.FEATURE_ENABLED))
		}
		return ret
	})
}

// readMIG reads one MIG device through its parent's MIG handle index.
// NVML reports little per MIG device (utilisation and clocks are
// per-GPU); framebuffer is what dcgm-exporter users chart per instance.
func readMIG(res *gpuResult, parent nvml.Device, m *topology.MIGDevice, r *reading) {
	var mig nvml.Device
	if !res.read("mig "+m.UUID+" handle", func() (ret nvml.Return) {
		mig, ret = parent.GetMigDeviceHandleByIndex(m.Index)
		return ret
	}) {
		return
	}
	res.read("mig "+m.UUID+" memory info", func() nvml.Return {
		mem, ret := mig.GetMemoryInfo()
		if ret == nvml.SUCCESS {
			r.set(fieldFBUsed, float64(mem.Used/mib))
			r.set(fieldFBFree, float64(mem.Free/mib))
		}
		return ret
	})
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
