package nvmlowner

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner/nvmlapi"
	"github.com/gpu-node-agent/gpu-node-agent/sim"
	"github.com/gpu-node-agent/gpu-node-agent/sim/simtest"
)

// censusMIG is GPU 0's MIG layout in the census tests.
var censusMIG = []string{"3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"}

// simCensusNode is a simulated DGX H100 with GPU 0 in MIG mode.
func simCensusNode(t *testing.T) *sim.Node {
	t.Helper()
	spec, err := sim.Profile("dgx-h100", sim.WithMIG(0, censusMIG...))
	if err != nil {
		t.Fatal(err)
	}
	node, err := sim.New(spec, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return node
}

// clearFault clears a simulator fault through its control endpoint.
func clearFault(t *testing.T, n *sim.Node, body string) {
	t.Helper()
	rec := httptest.NewRecorder()
	n.ControlHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodDelete, "/faults", strings.NewReader(body)))
	if rec.Code != http.StatusNoContent {
		t.Errorf("DELETE /faults %s: %d %s", body, rec.Code, rec.Body.String())
	}
}

// censusOf takes a census of lib and checks that it is JSON.
func censusOf(t *testing.T, lib Library, timeout time.Duration) *Census {
	t.Helper()
	o := New(lib, Config{CallTimeout: timeout}, nil)
	c, err := o.Census(context.Background(), CensusOptions{})
	if err != nil {
		t.Fatalf("census: %v", err)
	}
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatalf("census is not JSON: %v", err)
	}
	var back Census
	if err := json.Unmarshal(b, &back); err != nil || len(back.Devices) != len(c.Devices) {
		t.Fatalf("census does not read back: %v", err)
	}
	return c
}

// allCalls is every call of the census, wherever it is listed.
func allCalls(c *Census) []CensusCall {
	calls := append([]CensusCall(nil), c.Library...)
	for _, d := range c.Devices {
		calls = append(calls, d.Calls...)
	}
	for _, es := range c.Events {
		calls = append(calls, es.Calls...)
	}
	return calls
}

// find returns the calls of method on d.
func find(d CensusDevice, method string) []CensusCall {
	var out []CensusCall
	for _, c := range d.Calls {
		if c.Method == method {
			out = append(out, c)
		}
	}
	return out
}

// TestCensusCallsEveryMethod: every method of the nvmlapi interfaces, as
// reflection lists them, appears in a census of a simulated node, but the
// mutators, which never do, and no call names a method they lack. A
// method added to nvmlapi fails this test until the census calls it (or
// it is a mutator).
func TestCensusCallsEveryMethod(t *testing.T) {
	c := censusOf(t, simCensusNode(t).NVML(), 2*time.Second)
	want := map[string]bool{}
	for _, iface := range []struct {
		t      reflect.Type
		prefix string
	}{
		{reflect.TypeFor[nvmlapi.Library](), ""},
		{reflect.TypeFor[nvmlapi.Device](), ""},
		{reflect.TypeFor[nvmlapi.GpuInstance](), "GpuInstance."},
		{reflect.TypeFor[nvmlapi.ComputeInstance](), "ComputeInstance."},
		{reflect.TypeFor[nvmlapi.EventSet](), "EventSet."},
	} {
		for i := range iface.t.NumMethod() {
			want[iface.prefix+iface.t.Method(i).Name] = false
		}
	}
	for _, m := range CensusMutators {
		if _, ok := want[m]; !ok {
			t.Errorf("mutator %s is no nvmlapi method", m)
		}
		delete(want, m)
	}
	for _, call := range allCalls(c) {
		if slices.Contains(CensusMutators, call.Method) {
			t.Errorf("census calls the mutator %s", call.Method)
		}
		if _, ok := want[call.Method]; !ok {
			t.Errorf("census calls %q, which is no nvmlapi method", call.Method)
			continue
		}
		want[call.Method] = true
		if !call.answered() {
			t.Errorf("%s%v: %s %s, want an NVML answer on a healthy node", call.Method, call.Args, call.Ret, call.Error)
		}
	}
	for m, seen := range want {
		if !seen {
			t.Errorf("nvmlapi method %s never appears in the census", m)
		}
	}
}

func TestCensusSimulatedH100(t *testing.T) {
	node := simCensusNode(t)
	lib := node.NVML()
	c := censusOf(t, lib, 2*time.Second)

	if c.DeviceCount != 8 || c.DriverVersion == "" || c.CUDADriverVersion == 0 {
		t.Errorf("device count %d, driver %q, CUDA %d", c.DeviceCount, c.DriverVersion, c.CUDADriverVersion)
	}
	if got := []string{c.Library[0].Method, c.Library[len(c.Library)-1].Method}; got[0] != "Init" || got[1] != "Shutdown" {
		t.Errorf("library calls start with %s and end with %s, want Init ... Shutdown", got[0], got[1])
	}
	var gpus []CensusDevice
	migs := map[int][]CensusDevice{}
	for _, d := range c.Devices {
		if d.Parent == nil {
			gpus = append(gpus, d)
		} else {
			migs[*d.Parent] = append(migs[*d.Parent], d)
		}
	}
	if len(gpus) != 8 {
		t.Fatalf("%d GPUs, want 8", len(gpus))
	}

	// GPU 0: its UUID and memory as the library answers them directly.
	dev0, ret := lib.DeviceGetHandleByIndex(0)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	uuid, _ := dev0.GetUUID()
	mem, _ := dev0.GetMemoryInfo()
	if gpus[0].Index != 0 || gpus[0].UUID != uuid {
		t.Errorf("GPU 0: index %d uuid %q, want 0 %q", gpus[0].Index, gpus[0].UUID, uuid)
	}
	if m := find(gpus[0], "GetMemoryInfo"); len(m) != 1 || m[0].Value.(map[string]any)["total"] != mem.Total {
		t.Errorf("GPU 0 GetMemoryInfo: %+v, want total %d", m, mem.Total)
	}
	if h := find(gpus[0], "DeviceGetHandleByUUID"); len(h) != 1 || !reflect.DeepEqual(h[0].Value, map[string]any{"sameHandle": true}) {
		t.Errorf("GPU 0 DeviceGetHandleByUUID: %+v", h)
	}

	// MIG devices follow their GPU, with their instances.
	if len(migs[0]) != len(censusMIG) || len(migs) != 1 {
		t.Fatalf("MIG devices by parent: %d on GPU 0, %d parents; want %d on GPU 0 alone", len(migs[0]), len(migs), len(censusMIG))
	}
	migUUIDs := map[string]bool{}
	for i, m := range migs[0] {
		if c.Devices[1+i].UUID != m.UUID || !strings.HasPrefix(m.UUID, "MIG-") || m.GPUInstance == nil || m.ComputeInstance == nil {
			t.Errorf("MIG device %d: %+v, want it after GPU 0 with a MIG UUID and its instances", i, m)
		}
		migUUIDs[m.UUID] = true
		if len(find(m, "GetTotalEccErrors")) != 4 || len(find(m, "GetNvLinkState")) == 0 {
			t.Errorf("MIG device %d lacks the per-device calls", i)
		}
	}
	for _, m := range node.Spec().GPUs[0].MIG {
		if !migUUIDs[m.UUID] {
			t.Errorf("MIG device %s missing from the census", m.UUID)
		}
	}
	if gi := find(gpus[0], "GpuInstance.GetInfo"); len(gi) != len(censusMIG) {
		t.Errorf("GPU 0: %d GpuInstance.GetInfo calls, want one per MIG device's GPU instance", len(gi))
	}

	// NVLinks: 18 up on an H100, link 18 answers INVALID_ARGUMENT and
	// ends the loop; five error counters on each.
	for _, g := range gpus {
		states := find(g, "GetNvLinkState")
		if len(states) != 19 || !states[18].is(nvml.ERROR_INVALID_ARGUMENT) {
			t.Errorf("GPU %d: %d GetNvLinkState calls, want 18 and the INVALID_ARGUMENT of link 18", g.Index, len(states))
			continue
		}
		for _, s := range states[:18] {
			if s.Value != "FEATURE_ENABLED" {
				t.Errorf("GPU %d link %v: %v", g.Index, s.Args, s.Value)
			}
		}
		if n := len(find(g, "GetNvLinkErrorCounter")); n != 18*len(nvLinkErrorCounters) {
			t.Errorf("GPU %d: %d GetNvLinkErrorCounter calls, want %d", g.Index, n, 18*len(nvLinkErrorCounters))
		}
		if n := len(find(g, "GetTopologyCommonAncestor")); n != 7 {
			t.Errorf("GPU %d: %d GetTopologyCommonAncestor calls, want 7", g.Index, n)
		}
	}

	// Events: one set per event type and the agent's, waited on once.
	if len(c.Events) != len(censusEventTypes)+1 {
		t.Fatalf("%d event sets", len(c.Events))
	}
	agent := c.Events[len(c.Events)-1]
	if agent.Mask != EventTypes {
		t.Errorf("last event set mask %#x, want the agent's %#x", agent.Mask, EventTypes)
	}
	var waits, registered int
	for _, call := range agent.Calls {
		switch call.Method {
		case "EventSet.Wait":
			waits++
			if !call.is(nvml.ERROR_TIMEOUT) {
				t.Errorf("Wait on a quiet node: %s", call.Ret)
			}
		case "RegisterEvents":
			if call.is(nvml.SUCCESS) {
				registered++
			}
		}
	}
	if waits != 1 || registered != 8 {
		t.Errorf("agent's event set: %d waits, %d GPUs registered; want 1 and 8", waits, registered)
	}
}

// TestCensusOldDriver: a driver without nvmlDeviceGetCurrentClocksEventReasons
// (R535) is not asked for it: go-nvml would exit the process.
func TestCensusOldDriver(t *testing.T) {
	node := simCensusNode(t)
	simtest.Fault(t, node, http.MethodPost, `{"kind":"old-driver"}`)
	c := censusOf(t, node.NVML(), 2*time.Second)
	for _, call := range c.Library {
		if call.Method == "Extensions" && call.Value.(map[string]any)[eventReasonsSymbol] == true {
			t.Errorf("Extensions: %v, want %s absent", call.Value, eventReasonsSymbol)
		}
	}
	for _, d := range c.Devices {
		r := find(d, "GetCurrentClocksEventReasons")
		if len(r) != 1 || r[0].Ret != CensusNotCalled {
			t.Errorf("device %d: GetCurrentClocksEventReasons %+v, want not called", d.Index, r)
		}
	}
}

// TestCensusInitFails: a library that cannot be initialised is the one
// error, with the Init call recorded.
func TestCensusInitFails(t *testing.T) {
	node := simCensusNode(t)
	simtest.Fault(t, node, http.MethodPost, `{"kind":"nvml-failure"}`)
	c, err := New(node.NVML(), Config{}, nil).Census(context.Background(), CensusOptions{})
	if err == nil || !strings.Contains(err.Error(), "ERROR_UNKNOWN") {
		t.Fatalf("err %v, want the Init failure", err)
	}
	if len(c.Library) != 1 || c.Library[0].Method != "Init" || len(c.Devices) != 0 {
		t.Errorf("census after a failed Init: %+v", c)
	}
}

// TestCensusCancelled: a census whose context has ended makes no call.
func TestCensusCancelled(t *testing.T) {
	node := simCensusNode(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	c, err := New(node.NVML(), Config{}, nil).Census(ctx, CensusOptions{})
	if err == nil || !strings.Contains(err.Error(), CensusCancelled) || len(c.Library) != 1 {
		t.Fatalf("err %v, library calls %+v; want Init cancelled", err, c.Library)
	}
}

// hangLibrary hangs GPU index's GetMemoryInfo until release is closed:
// a GPU that stops answering in the middle of the census.
type hangLibrary struct {
	Library
	index   int
	uuid    string
	release chan struct{}
}

type hangDevice struct {
	Device
	release chan struct{}
}

func (d hangDevice) GetMemoryInfo() (nvml.Memory, nvml.Return) {
	<-d.release
	return d.Device.GetMemoryInfo()
}

func (l hangLibrary) DeviceGetHandleByIndex(i int) (Device, nvml.Return) {
	d, ret := l.Library.DeviceGetHandleByIndex(i)
	if i == l.index && d != nil {
		d = hangDevice{d, l.release}
	}
	return d, ret
}

func (l hangLibrary) DeviceGetHandleByUUID(uuid string) (Device, nvml.Return) {
	d, ret := l.Library.DeviceGetHandleByUUID(uuid)
	if uuid == l.uuid && d != nil {
		d = hangDevice{d, l.release}
	}
	return d, ret
}

// TestCensusHungGPU: a GPU that hangs (from the start: the simulator's
// hang fault holds even its handle lookup; or in the middle of the
// census) costs its own calls one timeout: the hung call is recorded as
// CALL_TIMEOUT, the GPU's later calls are not made, and every other GPU's
// census completes.
func TestCensusHungGPU(t *testing.T) {
	const timeout = time.Second
	tests := []struct {
		name string
		gpu  int
		// lib hangs GPU gpu of node.
		lib func(t *testing.T, node *sim.Node) Library
		// hung is the call that times out.
		hung string
	}{
		{
			name: "hang fault", gpu: 3, hung: "DeviceGetHandleByIndex",
			lib: func(t *testing.T, node *sim.Node) Library {
				simtest.Fault(t, node, http.MethodPost, `{"kind":"hang","gpu":3}`)
				t.Cleanup(func() { clearFault(t, node, `{"kind":"hang","gpu":3}`) })
				return node.NVML()
			},
		},
		{
			name: "hang mid-census", gpu: 5, hung: "GetMemoryInfo",
			lib: func(t *testing.T, node *sim.Node) Library {
				release := make(chan struct{})
				t.Cleanup(func() { close(release) })
				return hangLibrary{Library: node.NVML(), index: 5, uuid: node.Spec().GPUs[5].UUID, release: release}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			node := simCensusNode(t)
			c := censusOf(t, tc.lib(t, node), timeout)
			if c.DeviceCount != 8 {
				t.Fatalf("device count %d", c.DeviceCount)
			}
			for _, d := range c.Devices {
				parent := d.Index
				if d.Parent != nil {
					parent = *d.Parent
				}
				timeouts, notCalled := 0, 0
				for _, call := range d.Calls {
					switch call.Ret {
					case CensusCallTimeout:
						timeouts++
						if call.Method != tc.hung {
							t.Errorf("GPU %d: %s timed out, want %s", d.Index, call.Method, tc.hung)
						}
					case CensusNotCalled:
						notCalled++
					}
				}
				switch {
				case parent != tc.gpu:
					if timeouts != 0 || len(find(d, "GetProcessUtilization")) != 1 {
						t.Errorf("device %d (GPU %d): %d timeouts, census complete: %v", d.Index, parent, timeouts, len(find(d, "GetProcessUtilization")) == 1)
					}
				case timeouts != 1:
					t.Errorf("hung GPU %d: %d timeouts, want 1", d.Index, timeouts)
				case tc.hung == "GetMemoryInfo" && notCalled == 0:
					t.Errorf("hung GPU %d: no call left out after the timeout", d.Index)
				}
			}
			for _, es := range c.Events {
				for _, call := range es.Calls {
					switch {
					case call.Method != "RegisterEvents":
						if call.Ret == CensusCallTimeout || call.Ret == CensusNotCalled {
							t.Errorf("event set %s: %s %s", es.EventTypes, call.Method, call.Ret)
						}
					case *call.Device == tc.gpu && call.Ret != CensusNotCalled:
						t.Errorf("event set %s: RegisterEvents on the hung GPU %s, want not called", es.EventTypes, call.Ret)
					case *call.Device != tc.gpu && !call.is(nvml.SUCCESS):
						t.Errorf("event set %s: RegisterEvents on GPU %d %s", es.EventTypes, *call.Device, call.Ret)
					}
				}
			}
		})
	}
}

func TestCensusValues(t *testing.T) {
	var pci nvml.PciInfo
	copy(pci.BusId[:], []int8{'0', '0', '0', '0', '0', '0', '0', '0', ':', '1', '3', ':', '0', '0', '.', '0'})
	pci.Bus = 0x13
	tests := []struct {
		name string
		in   any
		want string
	}{
		{"return", nvml.ERROR_NO_PERMISSION, `"ERROR_NO_PERMISSION"`},
		{"unknown return", nvml.Return(77), `"RETURN_77"`},
		{"enable state", nvml.FEATURE_ENABLED, `"FEATURE_ENABLED"`},
		{"topology level", nvml.TOPOLOGY_NODE, `"TOPOLOGY_NODE"`},
		{"nvlink device type", nvml.NVLINK_DEVICE_TYPE_SWITCH, `"NVLINK_DEVICE_TYPE_SWITCH"`},
		{"brand", nvml.BRAND_NVIDIA, `"BRAND_NVIDIA"`},
		{"c strings", pci, `{"bus":19,"busId":"00000000:13:00.0","busIdLegacy":"","device":0,"domain":0,"pciDeviceId":0,"pciSubSystemId":0}`},
		{"fabric", nvml.GpuFabricInfo{ClusterUuid: [16]uint8{0xab, 15: 1}, Status: uint32(nvml.ERROR_NOT_READY), State: nvml.GPU_FABRIC_STATE_IN_PROGRESS},
			`{"cliqueId":0,"clusterUuid":"ab000000-0000-0000-0000-000000000001","state":"GPU_FABRIC_STATE_IN_PROGRESS","status":"ERROR_NOT_READY"}`},
		{"gpu instance info without its handle", nvml.GpuInstanceInfo{Id: 3, ProfileId: 19}, `{"id":3,"placement":{"size":0,"start":0},"profileId":19}`},
		{"processes", []nvml.ProcessInfo{{Pid: 7, UsedGpuMemory: 1 << 20}}, `[{"computeInstanceId":0,"gpuInstanceId":0,"pid":7,"usedGpuMemory":1048576}]`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := json.Marshal(jsonValue(tc.in))
			if err != nil || string(b) != tc.want {
				t.Errorf("got %s (%v), want %s", b, err, tc.want)
			}
		})
	}
}

func TestCensusEventTypesName(t *testing.T) {
	for mask, want := range map[uint64]string{
		EventTypes:                  "EventTypeSingleBitEccError|EventTypeDoubleBitEccError|EventTypeXidCriticalError",
		nvml.EventTypeAll:           "EventTypeAll",
		nvml.EventMigConfigChange:   "EventMigConfigChange",
		nvml.EventTypeClock | 1<<40: "EventTypeClock|0x10000000000",
		0:                           "0x0",
	} {
		if got := eventTypesName(mask); got != want {
			t.Errorf("eventTypesName(%#x) = %q, want %q", mask, got, want)
		}
	}
}
