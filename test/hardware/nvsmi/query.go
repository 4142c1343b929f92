package nvsmi

import (
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner/nvmlapi"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

const mib = 1 << 20

// Query answers `nvidia-smi -q -x` from lib, one NVML call per value as
// nvidia-smi makes them (it initialises and shuts lib down). What lib
// cannot answer is written as nvidia-smi writes it (notAnswered). Values
// the agent's NVML interface has no method for are N/A: the serial
// (nvmlDeviceGetSerial), the maximum clocks (nvmlDeviceGetMaxClockInfo) and
// the split of ECC errors by location (nvmlDeviceGetMemoryErrorCounter):
// the NVML totals stand in DRAM's elements and SRAM's are N/A.
func Query(lib nvmlapi.Library, now time.Time) (*Log, error) {
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("nvml init: %v", ret)
	}
	defer lib.Shutdown()
	l := &Log{Timestamp: now.Format(time.ANSIC), DriverVersion: NA, CUDAVersion: NA}
	if v, ret := lib.SystemGetDriverVersion(); ret == nvml.SUCCESS {
		l.DriverVersion = v
	}
	if v, ret := lib.SystemGetCudaDriverVersion(); ret == nvml.SUCCESS {
		l.CUDAVersion = CUDAVersion(v)
	}
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("nvml device count: %v", ret)
	}
	l.AttachedGPUs = strconv.Itoa(n)
	for i := range n {
		d, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("gpu %d: handle: %v", i, ret)
		}
		l.GPUs = append(l.GPUs, gpu(d))
	}
	return l, nil
}

// CUDAVersion formats nvmlSystemGetCudaDriverVersion (1000*major +
// 10*minor) as nvidia-smi does: 12080 is "12.8".
func CUDAVersion(v int) string { return fmt.Sprintf("%d.%d", v/1000, v%1000/10) }

// notAnswered is what nvidia-smi writes for a value NVML did not give.
func notAnswered(ret nvml.Return) string {
	switch ret {
	case nvml.ERROR_NO_PERMISSION:
		return "Insufficient Permissions"
	case nvml.ERROR_GPU_IS_LOST:
		return "GPU is lost"
	case nvml.ERROR_DEPRECATED:
		return "Requested functionality has been deprecated"
	case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_NOT_FOUND, nvml.ERROR_FUNCTION_NOT_FOUND:
		return NA
	}
	return "Unknown Error"
}

// text formats a value or says why there is none.
func text[T any](v T, ret nvml.Return, format func(T) string) string {
	if ret != nvml.SUCCESS {
		return notAnswered(ret)
	}
	return format(v)
}

// call makes one NVML call and formats its answer.
func call[T any](f func() (T, nvml.Return), format func(T) string) string {
	v, ret := f()
	return text(v, ret, format)
}

// str is a string answer, or why there is none.
func str(v string, ret nvml.Return) string {
	if ret != nvml.SUCCESS {
		return notAnswered(ret)
	}
	return v
}

func itoa[T ~int | ~uint32 | ~uint64](v T) string { return strconv.FormatUint(uint64(v), 10) }
func mibs(b uint64) string                        { return fmt.Sprintf("%d MiB", b/mib) }

func enabled(s nvml.EnableState) string {
	if s == nvml.FEATURE_ENABLED {
		return "Enabled"
	}
	return "Disabled"
}

func yesNo(b bool) string {
	if b {
		return "Yes"
	}
	return "No"
}

// cString is a C char array as a Go string.
func cString(a []int8) string {
	var sb strings.Builder
	for _, c := range a {
		if c == 0 {
			break
		}
		sb.WriteByte(byte(c))
	}
	return sb.String()
}

// BrandNames are nvidia-smi's product_brand strings by nvmlBrandType_t.
// "NVIDIA", "GeForce" and "Titan" are seen in real output; the rest follow
// nvml.h's names and are not confirmed.
var BrandNames = map[nvml.BrandType]string{
	nvml.BRAND_UNKNOWN: "Unknown", nvml.BRAND_QUADRO: "Quadro", nvml.BRAND_TESLA: "Tesla", nvml.BRAND_NVS: "NVS",
	nvml.BRAND_GRID: "Grid", nvml.BRAND_GEFORCE: "GeForce", nvml.BRAND_TITAN: "Titan",
	nvml.BRAND_NVIDIA_VAPPS: "NVIDIA Virtual Applications", nvml.BRAND_NVIDIA_VPC: "NVIDIA Virtual PC",
	nvml.BRAND_NVIDIA_VCS: "NVIDIA Virtual Compute Server", nvml.BRAND_NVIDIA_VWS: "NVIDIA RTX Virtual Workstation",
	nvml.BRAND_NVIDIA_CLOUD_GAMING: "NVIDIA Cloud Gaming", nvml.BRAND_QUADRO_RTX: "Quadro RTX",
	nvml.BRAND_NVIDIA_RTX: "NVIDIA RTX", nvml.BRAND_NVIDIA: "NVIDIA", nvml.BRAND_GEFORCE_RTX: "GeForce RTX",
	nvml.BRAND_TITAN_RTX: "Titan RTX",
}

func gpu(d nvmlapi.Device) GPU {
	var g GPU
	pci, pciRet := d.GetPciInfo()
	if pciRet == nvml.SUCCESS {
		g.ID = cString(pci.BusId[:])
	}
	g.ProductName = str(d.GetName())
	g.ProductBrand = call(d.GetBrand, func(b nvml.BrandType) string {
		if s, ok := BrandNames[b]; ok {
			return s
		}
		return "Unknown"
	})
	g.PersistenceMode = call(d.GetPersistenceMode, enabled)
	g.MIGMode, g.MIGDevices = migs(d)
	// nvmlapi has no GetSerial: the agent never reads the serial.
	g.Serial = NA
	g.UUID = str(d.GetUUID())
	g.MinorNumber = call(d.GetMinorNumber, itoa[int])
	g.PCI = pciOf(d, pci, pciRet)
	g.FBMemoryUsage = memory(d)
	g.ECCMode, g.ECCErrors = ecc(d)
	g.RetiredPages = retired(d)
	g.RemappedRows = remapped(d)
	g.Temperature.GPU = call(func() (uint32, nvml.Return) { return d.GetTemperature(nvml.TEMPERATURE_GPU) }, func(t uint32) string {
		return fmt.Sprintf("%d C", t)
	})
	g.Power = power(d)
	g.Clocks = clocks(d)
	// nvmlapi has no GetMaxClockInfo.
	g.MaxClocks = Clocks{Graphics: NA, SM: NA, Mem: NA, Video: NA}
	return g
}

func pciOf(d nvmlapi.Device, p nvml.PciInfo, ret nvml.Return) PCI {
	if ret != nvml.SUCCESS {
		na := notAnswered(ret)
		return PCI{Bus: na, Device: na, Domain: na, DeviceID: na, BusID: na, SubSystemID: na,
			Link: link(d), ReplayCounter: call(d.GetPcieReplayCounter, itoa[int])}
	}
	return PCI{
		Bus:           fmt.Sprintf("%02X", p.Bus),
		Device:        fmt.Sprintf("%02X", p.Device),
		Domain:        fmt.Sprintf("%04X", p.Domain),
		DeviceID:      fmt.Sprintf("%08X", p.PciDeviceId),
		BusID:         cString(p.BusId[:]),
		SubSystemID:   fmt.Sprintf("%08X", p.PciSubSystemId),
		Link:          link(d),
		ReplayCounter: call(d.GetPcieReplayCounter, itoa[int]),
	}
}

func link(d nvmlapi.Device) PCIeLink {
	width := func(w int) string { return fmt.Sprintf("%dx", w) }
	return PCIeLink{
		MaxGen:       call(d.GetMaxPcieLinkGeneration, itoa[int]),
		CurrentGen:   call(d.GetCurrPcieLinkGeneration, itoa[int]),
		MaxWidth:     call(d.GetMaxPcieLinkWidth, width),
		CurrentWidth: call(d.GetCurrPcieLinkWidth, width),
	}
}

// memory is nvidia-smi's R535+ reading (nvmlDeviceGetMemoryInfo_v2, which
// reports the driver's reservation apart from what is used), or the v1
// reading where v2 is not answered.
func memory(d nvmlapi.Device) Memory {
	if m, ret := d.GetMemoryInfo_v2(); ret == nvml.SUCCESS {
		return Memory{Total: mibs(m.Total), Reserved: mibs(m.Reserved), Used: mibs(m.Used), Free: mibs(m.Free)}
	}
	m, ret := d.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		na := notAnswered(ret)
		return Memory{Total: na, Reserved: na, Used: na, Free: na}
	}
	return Memory{Total: mibs(m.Total), Reserved: NA, Used: mibs(m.Used), Free: mibs(m.Free)}
}

func ecc(d nvmlapi.Device) (ECCMode, ECCErrors) {
	cur, pend, ret := d.GetEccMode()
	mode := ECCMode{Current: text(cur, ret, enabled), Pending: text(pend, ret, enabled)}
	counts := func(c nvml.EccCounterType) ECCCounts {
		total := func(t nvml.MemoryErrorType) string {
			return call(func() (uint64, nvml.Return) { return d.GetTotalEccErrors(t, c) }, itoa[uint64])
		}
		e := ECCCounts{
			SRAMCorrectable:         NA,
			SRAMUncorrectableParity: NA,
			SRAMUncorrectableSECDED: NA,
			DRAMCorrectable:         total(nvml.MEMORY_ERROR_TYPE_CORRECTED),
			DRAMUncorrectable:       total(nvml.MEMORY_ERROR_TYPE_UNCORRECTED),
		}
		if c == nvml.AGGREGATE_ECC {
			e.SRAMThresholdExceeded = NA
		}
		return e
	}
	return mode, ECCErrors{Volatile: counts(nvml.VOLATILE_ECC), Aggregate: counts(nvml.AGGREGATE_ECC)}
}

func retired(d nvmlapi.Device) Retired {
	cause := func(c nvml.PageRetirementCause) RetiredCause {
		pages, ret := d.GetRetiredPages(c)
		if ret != nvml.SUCCESS {
			na := notAnswered(ret)
			return RetiredCause{Count: na, PageList: PageList{Text: na}}
		}
		rc := RetiredCause{Count: strconv.Itoa(len(pages))}
		for _, p := range pages {
			rc.PageList.Addresses = append(rc.PageList.Addresses, fmt.Sprintf("0x%016x", p))
		}
		return rc
	}
	pending := call(d.GetRetiredPagesPendingStatus, func(s nvml.EnableState) string { return yesNo(s == nvml.FEATURE_ENABLED) })
	return Retired{
		MultipleSingleBit: cause(nvml.PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS),
		DoubleBit:         cause(nvml.PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR),
		PendingBlacklist:  pending,
		Pending:           pending,
	}
}

func remapped(d nvmlapi.Device) Remapped {
	corr, unc, pending, failed, ret := d.GetRemappedRows()
	if ret != nvml.SUCCESS {
		na := notAnswered(ret)
		return Remapped{Corr: na, Unc: na, Pending: na, Failure: na}
	}
	return Remapped{Corr: strconv.Itoa(corr), Unc: strconv.Itoa(unc), Pending: yesNo(pending), Failure: yesNo(failed)}
}

// power is R575's readings: average_power_draw is nvmlDeviceGetPowerUsage
// (nvml.h: on Ampere and newer, except GA100, averaged over one second),
// instant_power_draw the NVML_FI_DEV_POWER_INSTANT field.
func power(d nvmlapi.Device) Power {
	watts := func(mw uint32) string { return fmt.Sprintf("%.2f W", float64(mw)/1000) }
	p := Power{AveragePowerDraw: call(d.GetPowerUsage, watts), InstantPowerDraw: NA}
	fv := []nvml.FieldValue{{FieldId: nvml.FI_DEV_POWER_INSTANT}}
	if d.GetFieldValues(fv) == nvml.SUCCESS {
		if ret := nvml.Return(fv[0].NvmlReturn); ret != nvml.SUCCESS {
			p.InstantPowerDraw = notAnswered(ret)
		} else if nvml.ValueType(fv[0].ValueType) == nvml.VALUE_TYPE_UNSIGNED_INT {
			p.InstantPowerDraw = watts(binary.NativeEndian.Uint32(fv[0].Value[:4]))
		}
	}
	return p
}

func clocks(d nvmlapi.Device) Clocks {
	clock := func(t nvml.ClockType) string {
		return call(func() (uint32, nvml.Return) { return d.GetClockInfo(t) }, func(v uint32) string { return fmt.Sprintf("%d MHz", v) })
	}
	return Clocks{Graphics: clock(nvml.CLOCK_GRAPHICS), SM: clock(nvml.CLOCK_SM), Mem: clock(nvml.CLOCK_MEM), Video: clock(nvml.CLOCK_VIDEO)}
}

// migs reads the MIG mode and, in MIG mode, the MIG devices by index
// (nvmlDeviceGetMigDeviceHandleByIndex below GetMaxMigDeviceCount).
func migs(d nvmlapi.Device) (MIGMode, MIGDevices) {
	cur, pend, ret := d.GetMigMode()
	mode := MIGMode{Current: text(cur, ret, migMode), Pending: text(pend, ret, migMode)}
	none := MIGDevices{None: "None"}
	if ret != nvml.SUCCESS || cur != nvml.DEVICE_MIG_ENABLE {
		return mode, none
	}
	n, ret := d.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return mode, none
	}
	var out MIGDevices
	for i := range n {
		md, ret := d.GetMigDeviceHandleByIndex(i)
		if ret != nvml.SUCCESS || md == nil {
			continue
		}
		m := MIGDevice{
			Index:             strconv.Itoa(i),
			GPUInstanceID:     call(md.GetGpuInstanceId, itoa[int]),
			ComputeInstanceID: call(md.GetComputeInstanceId, itoa[int]),
			FBMemoryUsage:     memory(md),
		}
		attrs, ret := md.GetAttributes()
		m.Attributes = MIGAttributes{
			Multiprocessors: text(attrs.MultiprocessorCount, ret, itoa[uint32]),
			CopyEngines:     text(attrs.SharedCopyEngineCount, ret, itoa[uint32]),
			Encoders:        text(attrs.SharedEncoderCount, ret, itoa[uint32]),
			Decoders:        text(attrs.SharedDecoderCount, ret, itoa[uint32]),
			OFAs:            text(attrs.SharedOfaCount, ret, itoa[uint32]),
			JPEGs:           text(attrs.SharedJpegCount, ret, itoa[uint32]),
		}
		out.Devices = append(out.Devices, m)
	}
	if len(out.Devices) == 0 {
		return mode, none
	}
	return mode, out
}

func migMode(m int) string {
	if m == nvml.DEVICE_MIG_ENABLE {
		return "Enabled"
	}
	return "Disabled"
}

// List answers `nvidia-smi -L`: one line per GPU and, indented, one per
// MIG device with its profile name.
func List(lib nvmlapi.Library) (string, error) {
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return "", fmt.Errorf("nvml init: %v", ret)
	}
	defer lib.Shutdown()
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return "", fmt.Errorf("nvml device count: %v", ret)
	}
	var sb strings.Builder
	for i := range n {
		d, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return "", fmt.Errorf("gpu %d: handle: %v", i, ret)
		}
		fmt.Fprintf(&sb, "GPU %d: %s (UUID: %s)\n", i, str(d.GetName()), str(d.GetUUID()))
		cur, _, ret := d.GetMigMode()
		if ret != nvml.SUCCESS || cur != nvml.DEVICE_MIG_ENABLE {
			continue
		}
		count, ret := d.GetMaxMigDeviceCount()
		if ret != nvml.SUCCESS {
			continue
		}
		var parentMem uint64
		if m, ret := d.GetMemoryInfo(); ret == nvml.SUCCESS {
			parentMem = m.Total
		}
		for j := range count {
			md, ret := d.GetMigDeviceHandleByIndex(j)
			if ret != nvml.SUCCESS || md == nil {
				continue
			}
			fmt.Fprintf(&sb, "  MIG %-11s Device %2d: (UUID: %s)\n", migProfile(d, md, parentMem), j, str(md.GetUUID()))
		}
	}
	return sb.String(), nil
}

// migProfile names a MIG device's profile as the agent does
// (nvmlowner's migDevice): the GPU instance's profile ID matched against
// the parent's profiles, then topology.MIGProfileNameOf.
func migProfile(parent, md nvmlapi.Device, parentMem uint64) string {
	gi, ret := md.GetGpuInstanceId()
	if ret != nvml.SUCCESS {
		return notAnswered(ret)
	}
	attrs, ret := md.GetAttributes()
	if ret != nvml.SUCCESS {
		return notAnswered(ret)
	}
	inst, ret := parent.GetGpuInstanceById(gi)
	if ret != nvml.SUCCESS || inst == nil {
		return notAnswered(ret)
	}
	info, ret := inst.GetInfo()
	if ret != nvml.SUCCESS {
		return notAnswered(ret)
	}
	for p := range nvml.GPU_INSTANCE_PROFILE_COUNT {
		pi, ret := parent.GetGpuInstanceProfileInfo(p)
		if ret != nvml.SUCCESS || pi.Id != info.ProfileId {
			continue
		}
		name, err := topology.MIGProfileNameOf(p, int(attrs.GpuInstanceSliceCount), int(attrs.ComputeInstanceSliceCount), attrs.MemorySizeMB, parentMem)
		if err != nil {
			return "Unknown"
		}
		return name
	}
	return "Unknown"
}
