package sim

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner/nvmlapi"
)

func newFaultNode(t *testing.T, opts ...ProfileOption) *Node {
	t.Helper()
	spec, err := Profile("dgx-h100", opts...)
	if err != nil {
		t.Fatal(err)
	}
	n, err := New(spec, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// fault sends a fault through the control API, as the demo does.
func fault(t *testing.T, n *Node, method, body string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	n.ControlHandler().ServeHTTP(rec, httptest.NewRequest(method, "/faults", strings.NewReader(body)))
	return rec.Code, rec.Body.String()
}

func mustFault(t *testing.T, n *Node, method, body string) {
	t.Helper()
	if code, msg := fault(t, n, method, body); code != http.StatusNoContent {
		t.Fatalf("%s /faults %s: %d %s", method, body, code, msg)
	}
}

// eventSetOn creates an event set with every health event registered on
// GPU gpu.
func eventSetOn(t *testing.T, lib nvmlapi.Library, gpu int) nvmlapi.EventSet {
	t.Helper()
	set, ret := lib.EventSetCreate()
	if ret != nvml.SUCCESS {
		t.Fatalf("EventSetCreate: %v", ret)
	}
	t.Cleanup(func() { set.Free() })
	dev, ret := lib.DeviceGetHandleByIndex(gpu)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if ret := dev.RegisterEvents(nvml.EventTypeXidCriticalError|nvml.EventTypeDoubleBitEccError, set); ret != nvml.SUCCESS {
		t.Fatalf("RegisterEvents: %v", ret)
	}
	return set
}

func TestFaultHealthyDefaults(t *testing.T) {
	n := newFaultNode(t)
	dev, _ := n.NVML().DeviceGetHandleByIndex(3)
	if mode, _, ret := dev.GetEccMode(); ret != nvml.SUCCESS || mode != nvml.FEATURE_ENABLED {
		t.Fatalf("ecc mode %v %v", mode, ret)
	}
	if c, ret := dev.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC); ret != nvml.SUCCESS || c != 0 {
		t.Fatalf("volatile dbe %d %v", c, ret)
	}
	if _, _, pending, failed, ret := dev.GetRemappedRows(); ret != nvml.SUCCESS || pending || failed {
		t.Fatalf("remapped rows pending=%v failed=%v %v", pending, failed, ret)
	}
	// Hopper replaced page retirement with row remapping (arch.go).
	if st, ret := dev.GetRetiredPagesPendingStatus(); ret != nvml.ERROR_NOT_SUPPORTED || st != nvml.FEATURE_DISABLED {
		t.Fatalf("retired pending %v %v", st, ret)
	}
	if c, ret := dev.GetNvLinkErrorCounter(0, nvml.NVLINK_ERROR_DL_REPLAY); ret != nvml.SUCCESS || c != 0 {
		t.Fatalf("nvlink errors %d %v", c, ret)
	}
	if st, ret := dev.GetNvLinkState(0); ret != nvml.SUCCESS || st != nvml.FEATURE_ENABLED {
		t.Fatalf("nvlink 0 %v %v", st, ret)
	}
}

func TestFaultReadings(t *testing.T) {
	tests := []struct {
		name  string
		fault string
		// bad reports whether the fault is visible through NVML on GPU 2.
		bad func(lib nvmlapi.Library, dev nvmlapi.Device) bool
		// profile is the node's profile when not dgx-h100.
		profile string
	}{
		{"ecc-dbe", `{"kind":"ecc-dbe","gpu":2}`, func(_ nvmlapi.Library, d nvmlapi.Device) bool {
			c, _ := d.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC)
			return c == 1
		}, ""},
		{"row-remap-pending", `{"kind":"row-remap-pending","gpu":2}`, func(_ nvmlapi.Library, d nvmlapi.Device) bool {
			_, _, p, _, _ := d.GetRemappedRows()
			return p
		}, ""},
		{"row-remap-failure", `{"kind":"row-remap-failure","gpu":2}`, func(_ nvmlapi.Library, d nvmlapi.Device) bool {
			_, _, _, f, _ := d.GetRemappedRows()
			return f
		}, ""},
		{"retired-pages-pending", `{"kind":"retired-pages-pending","gpu":2}`, func(_ nvmlapi.Library, d nvmlapi.Device) bool {
			s, _ := d.GetRetiredPagesPendingStatus()
			return s == nvml.FEATURE_ENABLED
		}, "dgx-1v"}, // page retirement is pre-Ampere (arch.go)
		{"gpu-lost", `{"kind":"gpu-lost","gpu":2}`, func(_ nvmlapi.Library, d nvmlapi.Device) bool {
			_, ret := d.GetMemoryInfo()
			return ret == nvml.ERROR_GPU_IS_LOST
		}, ""},
		{"nvlink-down", `{"kind":"nvlink-down","gpu":2,"link":5}`, func(_ nvmlapi.Library, d nvmlapi.Device) bool {
			s, _ := d.GetNvLinkState(5)
			return s == nvml.FEATURE_DISABLED
		}, ""},
		{"nvml-failure", `{"kind":"nvml-failure","gpu":0}`, func(lib nvmlapi.Library, _ nvmlapi.Device) bool {
			_, ret := lib.DeviceGetCount()
			_, ret2 := lib.EventSetCreate()
			return ret == nvml.ERROR_UNKNOWN && ret2 == nvml.ERROR_UNKNOWN && lib.Init() == nvml.ERROR_UNKNOWN
		}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			profile := tc.profile
			if profile == "" {
				profile = "dgx-h100"
			}
			n := newTestNode(t, profile)
			lib := n.NVML()
			dev, _ := lib.DeviceGetHandleByIndex(2)
			if tc.bad(lib, dev) {
				t.Fatal("fault visible before injection")
			}
			mustFault(t, n, "POST", tc.fault)
			if !tc.bad(lib, dev) {
				t.Fatal("fault not visible after injection")
			}
			mustFault(t, n, "DELETE", tc.fault)
			if tc.bad(lib, dev) {
				t.Fatal("fault still visible after clearing")
			}
		})
	}
}

func TestFaultEvents(t *testing.T) {
	tests := []struct {
		name     string
		opts     []ProfileOption
		fault    string
		wantType uint64
		wantData uint64
		mig      bool // event carries the MIG device's instance IDs
	}{
		{"xid", nil, `{"kind":"xid","gpu":1,"xid":48}`, nvml.EventTypeXidCriticalError, 48, false},
		{"xid on a MIG device", []ProfileOption{WithMIG(1, "3g.40gb", "3g.40gb")}, `{"kind":"xid","gpu":1,"xid":62,"mig":"MIGUUID"}`, nvml.EventTypeXidCriticalError, 62, true},
		{"ecc-dbe", nil, `{"kind":"ecc-dbe","gpu":1}`, nvml.EventTypeDoubleBitEccError, 0, false},
		{"gpu-lost reports xid 79", nil, `{"kind":"gpu-lost","gpu":1}`, nvml.EventTypeXidCriticalError, 79, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := newFaultNode(t, tc.opts...)
			lib := n.NVML()
			other := eventSetOn(t, lib, 0)
			set := eventSetOn(t, lib, 1)
			body := tc.fault
			var mig = n.Spec().GPUs[1].MIG
			if tc.mig {
				body = strings.Replace(body, "MIGUUID", mig[1].UUID, 1)
			}
			mustFault(t, n, "POST", body)
			e, ret := set.Wait(1000)
			if ret != nvml.SUCCESS {
				t.Fatalf("Wait: %v", ret)
			}
			if e.EventType != tc.wantType || e.EventData != tc.wantData || e.Device != n.handle(1) {
				t.Fatalf("event %+v", e)
			}
			gi, ci := uint32(noInstance), uint32(noInstance)
			if tc.mig {
				gi, ci = uint32(mig[1].GPUInstance), uint32(mig[1].ComputeInstance)
			}
			if e.GpuInstanceId != gi || e.ComputeInstanceId != ci {
				t.Fatalf("instance ids %d/%d, want %d/%d", e.GpuInstanceId, e.ComputeInstanceId, gi, ci)
			}
			if _, ret := other.Wait(10); ret != nvml.ERROR_TIMEOUT {
				t.Fatalf("GPU 0's set got GPU 1's event: %v", ret)
			}
		})
	}
}

func TestNVMLFailureWakesWaiters(t *testing.T) {
	n := newFaultNode(t)
	set := eventSetOn(t, n.NVML(), 0)
	done := make(chan nvml.Return)
	go func() {
		_, ret := set.Wait(60_000)
		done <- ret
	}()
	time.Sleep(10 * time.Millisecond) // let the waiter block (not an assertion)
	mustFault(t, n, "POST", `{"kind":"nvml-failure","gpu":0}`)
	if ret := <-done; ret != nvml.ERROR_UNKNOWN {
		t.Fatalf("blocked Wait returned %v, want ERROR_UNKNOWN", ret)
	}
	mustFault(t, n, "DELETE", `{"kind":"nvml-failure","gpu":0}`)
	if _, ret := set.Wait(1); ret != nvml.ERROR_TIMEOUT {
		t.Fatalf("Wait after clearing: %v", ret)
	}
}

func TestFaultErrors(t *testing.T) {
	tests := []struct {
		name, body, want string
	}{
		{"unknown kind", `{"kind":"melted","gpu":0}`, "unsupported fault kind"},
		{"xid without code", `{"kind":"xid","gpu":0}`, "xid: required"},
		{"unknown mig", `{"kind":"xid","gpu":0,"xid":62,"mig":"MIG-nope"}`, "no MIG device"},
		{"no such link", `{"kind":"nvlink-down","gpu":0,"link":99}`, "no such link"},
	}
	n := newFaultNode(t)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, msg := fault(t, n, "POST", tc.body)
			if code != http.StatusBadRequest || !strings.Contains(msg, tc.want) {
				t.Fatalf("got %d %q, want 400 containing %q", code, msg, tc.want)
			}
		})
	}
}

func TestFaultEventAttribution(t *testing.T) {
	tests := []struct {
		name string
		// body is the fault; GI is replaced by a GPU instance ID of GPU 1.
		body   string
		noDev  bool // the event carries NVML's NULL device
		wantGI bool // GpuInstanceId is that GPU instance's
	}{
		{"no device", `{"kind":"xid","gpu":-1,"xid":79}`, true, false},
		{"gpu instance only", `{"kind":"xid","gpu":1,"xid":43,"gi":GI}`, false, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := newFaultNode(t, WithMIG(1, "3g.40gb", "3g.40gb"))
			lib := n.NVML()
			set := eventSetOn(t, lib, 1)
			gi := n.Spec().GPUs[1].MIG[1].GPUInstance
			mustFault(t, n, "POST", strings.Replace(tc.body, "GI", strconv.Itoa(gi), 1))
			e, ret := set.Wait(10_000)
			if ret != nvml.SUCCESS {
				t.Fatalf("Wait: %v", ret)
			}
			if e.Device == nil {
				t.Fatal("event without a Device; go-nvml always sets one")
			}
			if tc.noDev {
				// go-nvml wraps NVML's NULL handle: every call on it fails.
				if _, ret := e.Device.GetUUID(); ret != nvml.ERROR_INVALID_ARGUMENT {
					t.Errorf("GetUUID of the event's device: %v, want ERROR_INVALID_ARGUMENT", ret)
				}
				if _, ret := e.Device.GetMemoryInfo(); ret != nvml.ERROR_INVALID_ARGUMENT {
					t.Errorf("GetMemoryInfo of the event's device: %v, want ERROR_INVALID_ARGUMENT", ret)
				}
			} else if e.Device != n.handle(1) {
				t.Errorf("event device %v, want gpu 1", e.Device)
			}
			wantGI := uint32(noInstance)
			if tc.wantGI {
				wantGI = uint32(gi)
			}
			if e.GpuInstanceId != wantGI || e.ComputeInstanceId != noInstance {
				t.Errorf("instance ids %d/%d, want %d/%d", e.GpuInstanceId, e.ComputeInstanceId, wantGI, uint32(noInstance))
			}
		})
	}
}

func TestFaultAttributionErrors(t *testing.T) {
	tests := []struct {
		name, body, want string
	}{
		{"unknown gpu instance", `{"kind":"xid","gpu":1,"xid":43,"gi":99}`, "no GPU instance 99"},
		{"mig and gi", `{"kind":"xid","gpu":1,"xid":43,"gi":1,"mig":"MIG-x"}`, "not both"},
		{"no device for ecc", `{"kind":"ecc-dbe","gpu":-1}`, "no such gpu -1"},
	}
	n := newFaultNode(t, WithMIG(1, "3g.40gb", "3g.40gb"))
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, msg := fault(t, n, "POST", tc.body)
			if code != http.StatusBadRequest || !strings.Contains(msg, tc.want) {
				t.Fatalf("got %d %q, want 400 containing %q", code, msg, tc.want)
			}
		})
	}
}
