package sim

import (
	"encoding/binary"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Simulated readings: utilisation, clocks, temperatures, power, energy,
// PCIe replays and NVLink traffic. They are deterministic but
// move: each read of a reading advances that reading by one step (as if one
// collection interval had passed), so a test that collects k times sees the
// same numbers every run and a demo sees live-looking graphs. ECC, remapped
// rows, retired pages and XIDs belong to faults.go; framebuffer memory is
// what the simulated processes and leaks hold (processes.go).

// counterState is one GPU's reading generator. It has its own lock (not
// Node.mu) because readings never change the layout.
type counterState struct {
	gpu int
	// memClockMHz is the HBM clock of the GPU's generation.
	memClockMHz uint32
	// powerBaseMW and powerPerUtilMW shape power = base + per*util.
	powerBaseMW, powerPerUtilMW uint32

	mu sync.Mutex
	// steps counts reads per reading kind.
	steps [numReadings]uint64
	// energyMJ, replays and nvlinkKiB are running totals (counters).
	energyMJ  uint64
	replays   int
	nvlinkKiB uint64
}

type readingKind int

const (
	readUtil readingKind = iota
	readClock
	readTemp
	readPower
	readEnergy
	readReplay
	readFields
	numReadings
)

// step returns the next step of kind k (1 on the first read).
func (s *counterState) step(k readingKind) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.steps[k]++
	return s.steps[k]
}

// util is the GPU utilisation (%) at step t: a triangle wave between 20
// and 80 whose phase differs per GPU, so GPUs never move in lockstep.
func (s *counterState) util(t uint64) uint32 {
	p := (t*7 + uint64(s.gpu)*13) % 120
	if p >= 60 {
		p = 119 - p
	}
	return 20 + uint32(p)
}

func (s *counterState) powerMW(t uint64) uint32 {
	return s.powerBaseMW + s.powerPerUtilMW*s.util(t)
}

func (s *counterState) temperature(t uint64) uint32 {
	return 32 + s.util(t)/3 + uint32(s.gpu%3)
}

// installCounters gives every GPU moving readings. It runs after
// installFaults, so a field-values handler installed there is kept and only
// its unknown fields are ours.
func (n *Node) installCounters() {
	for i, d := range n.devices {
		g := n.gpus[i]
		s := &counterState{
			gpu:            i,
			memClockMHz:    2619,
			powerBaseMW:    70000,
			powerPerUtilMW: 7000,
		}
		if g.cfg.Architecture == nvml.DEVICE_ARCH_AMPERE {
			s.memClockMHz, s.powerBaseMW, s.powerPerUtilMW = 1593, 55000, 4500
		}
		// Energy since boot: as if the GPU had idled for a day.
		s.energyMJ = uint64(s.powerBaseMW) * 86400
		migEnabled := func() bool {
			n.mu.RLock()
			defer n.mu.RUnlock()
			return g.migEnabled
		}
		nvlinks := uint64(len(g.links))

		d.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
			// With MIG on, NVML has no whole-GPU utilisation.
			if migEnabled() {
				return nvml.Utilization{}, nvml.ERROR_NOT_SUPPORTED
			}
			u := s.util(s.step(readUtil))
			return nvml.Utilization{Gpu: u, Memory: u / 2}, nvml.SUCCESS
		}
		// nvml.h nvmlDeviceGetEncoderUtilization/DecoderUtilization: "For
		// Kepler or newer fully supported devices", and "On MIG-enabled
		// GPUs, querying encoder/decoder utilization is not currently
		// supported". The simulated workloads decode video (a data loader)
		// and never encode. The sampling period is NVML's usual ~167 ms.
		d.GetEncoderUtilizationFunc = func() (uint32, uint32, nvml.Return) {
			if migEnabled() {
				return 0, 0, nvml.ERROR_NOT_SUPPORTED
			}
			return 0, 166667, nvml.SUCCESS
		}
		d.GetDecoderUtilizationFunc = func() (uint32, uint32, nvml.Return) {
			if migEnabled() {
				return 0, 0, nvml.ERROR_NOT_SUPPORTED
			}
			return s.util(s.step(readUtil)) / 4, 166667, nvml.SUCCESS
		}
		// nvml.h nvmlDeviceGetGridLicensableFeatures_v4 documents only
		// SUCCESS, INVALID_ARGUMENT and UNKNOWN: a bare-metal GPU answers
		// with isGridLicenseSupported 0 and no licensable feature.
		d.GetGridLicensableFeaturesFunc = func() (nvml.GridLicensableFeatures, nvml.Return) {
			return nvml.GridLicensableFeatures{}, nvml.SUCCESS
		}
		d.GetClockInfoFunc = func(t nvml.ClockType) (uint32, nvml.Return) {
			switch t {
			case nvml.CLOCK_SM, nvml.CLOCK_GRAPHICS:
				return 1100 + 11*s.util(s.step(readClock)), nvml.SUCCESS // 1320..1980 MHz
			case nvml.CLOCK_MEM:
				return s.memClockMHz, nvml.SUCCESS
			}
			return 0, nvml.ERROR_NOT_SUPPORTED
		}
		d.GetTemperatureFunc = func(sensor nvml.TemperatureSensors) (uint32, nvml.Return) {
			if sensor != nvml.TEMPERATURE_GPU {
				return 0, nvml.ERROR_NOT_SUPPORTED
			}
			return s.temperature(s.step(readTemp)), nvml.SUCCESS
		}
		d.GetPowerUsageFunc = func() (uint32, nvml.Return) {
			return s.powerMW(s.step(readPower)), nvml.SUCCESS
		}
		d.GetTotalEnergyConsumptionFunc = func() (uint64, nvml.Return) {
			t := s.step(readEnergy)
			s.mu.Lock()
			defer s.mu.Unlock()
			s.energyMJ += uint64(s.powerMW(t)) // mW over one 1 s step = mJ
			return s.energyMJ, nvml.SUCCESS
		}
		d.GetPcieReplayCounterFunc = func() (int, nvml.Return) {
			t := s.step(readReplay)
			s.mu.Lock()
			defer s.mu.Unlock()
			// A rare retry on every third GPU, as marginal risers do.
			if s.gpu%3 == 0 && t%30 == 0 {
				s.replays++
			}
			return s.replays, nvml.SUCCESS
		}
		prevFields := d.GetFieldValuesFunc
		d.GetFieldValuesFunc = func(fvs []nvml.FieldValue) nvml.Return {
			if prevFields != nil {
				if ret := prevFields(fvs); ret != nvml.SUCCESS {
					return ret
				}
			} else {
				for k := range fvs {
					fvs[k].NvmlReturn = uint32(nvml.ERROR_NOT_SUPPORTED)
				}
			}
			t := s.step(readFields)
			for k := range fvs {
				switch fvs[k].FieldId {
				case nvml.FI_DEV_MEMORY_TEMP:
					setFieldUint(&fvs[k], uint64(s.temperature(t)+6))
				case nvml.FI_DEV_NVLINK_BANDWIDTH_C0_TOTAL:
					if nvlinks == 0 {
						continue
					}
					s.mu.Lock()
					// Each link moves util% of ~25 GB/s, in KiB.
					s.nvlinkKiB += nvlinks * uint64(s.util(t)) * 250 * 1000 / 1024 * 1000
					v := s.nvlinkKiB
					s.mu.Unlock()
					setFieldUint(&fvs[k], v)
				}
			}
			return nvml.SUCCESS
		}
	}
}

// setFieldUint stores v as an unsigned long long field value, in the
// native byte order of the C union NVML fills.
func setFieldUint(fv *nvml.FieldValue, v uint64) {
	fv.ValueType = uint32(nvml.VALUE_TYPE_UNSIGNED_LONG_LONG)
	fv.NvmlReturn = uint32(nvml.SUCCESS)
	binary.NativeEndian.PutUint64(fv.Value[:], v)
}
