package sim

import (
	"encoding/json"
	"net/http/httptest"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

func TestNVMLCalls(t *testing.T) {
	n := newFaultNode(t, WithMIG(1, "3g.40gb", "3g.40gb"))
	lib := n.NVML()
	set := eventSetOn(t, lib, 0) // EventSetCreate, DeviceGetHandleByIndex, RegisterEvents
	for range 2 {
		lib.DeviceGetCount()
	}
	dev, _ := lib.DeviceGetHandleByIndex(1)
	for range 3 {
		dev.GetUUID()
	}
	mig, _ := dev.GetMigDeviceHandleByIndex(0)
	mig.GetMemoryInfo()
	mig.GetUUID()
	set.Wait(1)
	set.Wait(1)
	mockOf(dev).GetBoardPartNumber() // not the agent's NVML: not counted

	want := map[string]uint64{
		"EventSetCreate":            1,
		"DeviceGetHandleByIndex":    2,
		"RegisterEvents":            1,
		"DeviceGetCount":            2,
		"GetUUID":                   4,
		"GetMigDeviceHandleByIndex": 1,
		"GetMemoryInfo":             1,
		"EventSetWait":              2,
	}
	got := n.NVMLCalls()
	for name, w := range want {
		if got[name] != w {
			t.Errorf("%s counted %d times, want %d", name, got[name], w)
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("%s counted %d times, never called", name, got[name])
		}
	}

	rec := httptest.NewRecorder()
	n.ControlHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/calls", nil))
	var served map[string]uint64
	if err := json.Unmarshal(rec.Body.Bytes(), &served); err != nil {
		t.Fatalf("GET /calls: %v: %s", err, rec.Body.String())
	}
	if served["GetUUID"] != 4 || served["DeviceGetCount"] != 2 {
		t.Errorf("GET /calls = %v", served)
	}
}

// BenchmarkDeviceCall is the cost of one counted device call.
func BenchmarkDeviceCall(b *testing.B) {
	spec, err := Profile("dgx-h100")
	if err != nil {
		b.Fatal(err)
	}
	n, err := New(spec, b.TempDir(), nil)
	if err != nil {
		b.Fatal(err)
	}
	dev, _ := n.NVML().DeviceGetHandleByIndex(0)
	for b.Loop() {
		if _, ret := dev.GetUUID(); ret != nvml.SUCCESS {
			b.Fatal(ret)
		}
	}
}
