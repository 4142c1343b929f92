package sim

import (
	"runtime"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner/nvmlapi"
)

// mockOf is the mock device behind handle d: all of nvml.Device, for tests of
// the calls the agent does not make (nvmlapi.Device has only those it
// does). Its calls pass neither the GPU's gate nor the counters.
func mockOf(d nvmlapi.Device) *mock.Device { return d.(device).m }

func scrapeOnce(lib nvmlapi.Library) {
	for i := 0; i < 8; i++ {
		d, _ := lib.DeviceGetHandleByIndex(i)
		_, _ = d.GetUUID()
		_, _ = d.GetMemoryInfo()
		_, _ = d.GetTemperature(nvml.TEMPERATURE_GPU)
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
	mig, _ := byIndex.GetMigDeviceHandleByIndex(1)
	if byIndex != byUUID {
		t.Errorf("handles of one GPU differ: %v %v", byIndex, byUUID)
	}
	if parent, _ := mockOf(mig).GetDeviceHandleFromMigDeviceHandle(); parent != nvml.Device(mockOf(byIndex)) {
		t.Errorf("MIG device's parent %v, want the GPU's device %v", parent, mockOf(byIndex))
	}
	migByUUID, _ := lib.DeviceGetHandleByUUID(n.Spec().GPUs[1].MIG[1].UUID)
	if migByUUID != mig {
		t.Errorf("MIG handle by UUID differs from the one by index")
	}
	other, _ := lib.DeviceGetHandleByIndex(5)
	if lvl, ret := byIndex.GetTopologyCommonAncestor(other); ret != nvml.SUCCESS || lvl != nvml.TOPOLOGY_SYSTEM {
		t.Errorf("GetTopologyCommonAncestor(1, 5) = %v, %v; want SYSTEM", lvl, ret)
	}
}
