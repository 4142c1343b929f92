package sim

import (
	"runtime"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

func scrapeOnce(lib nvml.Interface) {
	for i := 0; i < 8; i++ {
		d, _ := lib.DeviceGetHandleByIndex(i)
		_, _ = d.GetUUID()
		_, _ = d.GetMemoryInfo()
		_, _ = lib.DeviceGetTemperature(d, nvml.TEMPERATURE_GPU)
		_ = d.GetFieldValues(make([]nvml.FieldValue, 8))
		for l := 0; l < 18; l++ {
			_, _ = d.GetNvLinkState(l)
		}
		if m, ret := d.GetMigDeviceHandleByIndex(0); ret == nvml.SUCCESS {
			_, _ = m.GetMemoryInfo()
		}
	}
}

// TestNVMLCallsRetainNothing: an agent polls NVML forever, so the
// simulator must not keep anything per call (the go-nvml mocks record every
// call). Heap growth over many scrapes must stay far below what recording
// costs (about 4 KiB per scrape).
func TestNVMLCallsRetainNothing(t *testing.T) {
	n := newTestNode(t, "dgx-h100", WithMIG(0, "7g.80gb"))
	lib := n.NVML()
	for i := 0; i < 100; i++ {
		scrapeOnce(lib)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	const scrapes = 5000
	for i := 0; i < scrapes; i++ {
		scrapeOnce(lib)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	perScrape := (int64(after.HeapAlloc) - int64(before.HeapAlloc)) / scrapes
	t.Logf("heap growth per scrape of 8 GPUs: %d bytes", perScrape)
	if perScrape > 256 {
		t.Errorf("heap grows %d bytes per scrape; NVML calls are being retained", perScrape)
	}
	runtime.KeepAlive(n)
}

func TestHandlesCompareEqual(t *testing.T) {
	n := newTestNode(t, "dgx-h100", WithMIG(1, "3g.40gb", "3g.40gb"))
	lib := n.NVML()
	byIndex, _ := lib.DeviceGetHandleByIndex(1)
	byUUID, _ := lib.DeviceGetHandleByUUID(n.Spec().GPUs[1].UUID)
	byBus, _ := lib.DeviceGetHandleByPciBusId("00000000:" + n.Spec().GPUs[1].PCIBusID[5:])
	mig, _ := byIndex.GetMigDeviceHandleByIndex(1)
	parent, _ := mig.GetDeviceHandleFromMigDeviceHandle()
	if byIndex != byUUID || byIndex != byBus || byIndex != parent {
		t.Errorf("handles of one GPU differ: %v %v %v %v", byIndex, byUUID, byBus, parent)
	}
	migByUUID, _ := lib.DeviceGetHandleByUUID(n.Spec().GPUs[1].MIG[1].UUID)
	if migByUUID != mig {
		t.Errorf("MIG handle by UUID differs from the one by index")
	}
	other, _ := lib.DeviceGetHandleByIndex(5)
	if lvl, ret := byIndex.GetTopologyCommonAncestor(other); ret != nvml.SUCCESS || lvl != nvml.TOPOLOGY_SYSTEM {
		t.Errorf("GetTopologyCommonAncestor(1, 5) = %v, %v; want SYSTEM", lvl, ret)
	}
	if lvl, ret := lib.DeviceGetTopologyCommonAncestor(byIndex, other); ret != nvml.SUCCESS || lvl != nvml.TOPOLOGY_SYSTEM {
		t.Errorf("DeviceGetTopologyCommonAncestor(1, 5) = %v, %v; want SYSTEM", lvl, ret)
	}
}
