package sim

import (
	"encoding/binary"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

func newCountersNode(t *testing.T) *Node {
	t.Helper()
	spec, err := Profile("dgx-h100", WithMIG(0, "3g.40gb", "2g.20gb", "1g.10gb"))
	if err != nil {
		t.Fatal(err)
	}
	n, err := New(spec, t.TempDir(), nil)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return n
}

// reads is one pass of the calls the metrics collector makes.
type reads struct {
	util    nvml.Utilization
	utilRet nvml.Return
	mem     nvml.Memory
	sm, hbm uint32
	temp    uint32
	powerMW uint32
	energy  uint64
	replay  int
	memTemp uint64
	nvlink  uint64
	migMem  nvml.Memory
}

func readOnce(t *testing.T, n *Node, gpu int) reads {
	t.Helper()
	d := n.Device(gpu)
	var r reads
	r.util, r.utilRet = d.GetUtilizationRates()
	r.mem, _ = d.GetMemoryInfo()
	r.sm, _ = d.GetClockInfo(nvml.CLOCK_SM)
	r.hbm, _ = d.GetClockInfo(nvml.CLOCK_MEM)
	r.temp, _ = d.GetTemperature(nvml.TEMPERATURE_GPU)
	r.powerMW, _ = d.GetPowerUsage()
	r.energy, _ = d.GetTotalEnergyConsumption()
	r.replay, _ = d.GetPcieReplayCounter()
	fvs := []nvml.FieldValue{{FieldId: nvml.FI_DEV_MEMORY_TEMP}, {FieldId: nvml.FI_DEV_NVLINK_BANDWIDTH_C0_TOTAL}, {FieldId: nvml.FI_DEV_ECC_CURRENT}}
	if ret := d.GetFieldValues(fvs); ret != nvml.SUCCESS {
		t.Fatalf("GetFieldValues: %v", ret)
	}
	for _, fv := range fvs[:2] {
		if nvml.Return(fv.NvmlReturn) != nvml.SUCCESS {
			t.Fatalf("field %d: %v", fv.FieldId, nvml.Return(fv.NvmlReturn))
		}
	}
	if nvml.Return(fvs[2].NvmlReturn) != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("unmodelled field %d: %v, want ERROR_NOT_SUPPORTED", fvs[2].FieldId, nvml.Return(fvs[2].NvmlReturn))
	}
	r.memTemp = binary.NativeEndian.Uint64(fvs[0].Value[:])
	r.nvlink = binary.NativeEndian.Uint64(fvs[1].Value[:])
	if mig, ret := d.GetMigDeviceHandleByIndex(0); ret == nvml.SUCCESS {
		r.migMem, _ = mig.GetMemoryInfo()
	}
	return r
}

func TestCountersAreDeterministic(t *testing.T) {
	a, b := newCountersNode(t), newCountersNode(t)
	for step := range 5 {
		for gpu := range 8 {
			if ra, rb := readOnce(t, a, gpu), readOnce(t, b, gpu); ra != rb {
				t.Fatalf("step %d gpu %d: two identical nodes disagree:\n%+v\n%+v", step, gpu, ra, rb)
			}
		}
	}
}

func TestCountersMoveAndStayPlausible(t *testing.T) {
	n := newCountersNode(t)
	const steps = 60
	for gpu := range 8 {
		seenUtil := map[uint32]bool{}
		prev := readOnce(t, n, gpu)
		for range steps {
			r := readOnce(t, n, gpu)
			if r.energy <= prev.energy {
				t.Errorf("gpu %d: energy went from %d to %d mJ, want increasing", gpu, prev.energy, r.energy)
			}
			if r.replay < prev.replay || r.nvlink < prev.nvlink {
				t.Errorf("gpu %d: a counter went backwards: replay %d->%d nvlink %d->%d", gpu, prev.replay, r.replay, prev.nvlink, r.nvlink)
			}
			// Used counts the driver's reserved memory (nvmlMemory_t).
			if r.mem.Used+r.mem.Free != r.mem.Total || r.mem.Used != r.mem.Total>>8 {
				t.Errorf("gpu %d: idle memory %+v inconsistent", gpu, r.mem)
			}
			if r.temp < 30 || r.temp > 90 || r.memTemp <= uint64(r.temp) {
				t.Errorf("gpu %d: temperatures gpu %d memory %d implausible", gpu, r.temp, r.memTemp)
			}
			if r.powerMW < 70000 || r.powerMW > 700000 {
				t.Errorf("gpu %d: power %d mW outside an H100's range", gpu, r.powerMW)
			}
			if r.sm > 1980 || r.hbm != 2619 {
				t.Errorf("gpu %d: clocks sm %d mem %d implausible for an H100", gpu, r.sm, r.hbm)
			}
			if r.nvlink == 0 {
				t.Errorf("gpu %d: no NVLink traffic on an NVSwitch node", gpu)
			}
			seenUtil[r.util.Gpu] = true
			prev = r
		}
		switch gpu {
		case 0: // MIG on: no whole-GPU utilisation; an idle MIG device's memory is free (processes_test.go)
			if prev.utilRet != nvml.ERROR_NOT_SUPPORTED {
				t.Errorf("gpu 0 (MIG): utilization ret %v, want ERROR_NOT_SUPPORTED", prev.utilRet)
			}
			if m := prev.migMem; m.Total == 0 || m.Used != 0 || m.Used+m.Free != m.Total {
				t.Errorf("gpu 0 MIG 0 memory %+v implausible", m)
			}
		default:
			if len(seenUtil) < 10 {
				t.Errorf("gpu %d: utilisation took only %d values over %d steps, want it to move", gpu, len(seenUtil), steps)
			}
			for u := range seenUtil {
				if u < 20 || u > 80 {
					t.Errorf("gpu %d: utilisation %d outside 20..80", gpu, u)
				}
			}
		}
	}
	if readOnce(t, n, 0).replay == 0 {
		t.Error("gpu 0 saw no PCIe replay in a minute of steps; the counter never moves")
	}
}
