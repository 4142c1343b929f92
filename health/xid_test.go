package health

import (
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
	"github.com/gpu-node-agent/gpu-node-agent/sim/simtest"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// xidNode has a plain GPU-0 and GPU-1 in MIG mode: MIG-1-a (GI 1, CI 0),
// MIG-1-c (GI 1, CI 1) and MIG-1-b (GI 2, CI 0).
func xidNode() *topology.Node {
	return &topology.Node{GPUs: []topology.GPU{
		{Index: 0, UUID: "GPU-0"},
		{Index: 1, UUID: "GPU-1", MIGEnabled: true, MIG: []topology.MIGDevice{
			{UUID: "MIG-1-a", GPUInstance: 1, ComputeInstance: 0},
			{UUID: "MIG-1-c", GPUInstance: 1, ComputeInstance: 1},
			{UUID: "MIG-1-b", GPUInstance: 2, ComputeInstance: 0},
		}},
	}}
}

func xidEvent(uuid string, x uint64, gi, ci uint32) nvmlowner.Event {
	return nvmlowner.Event{UUID: uuid, Type: nvml.EventTypeXidCriticalError, Data: x, GPUInstance: gi, ComputeInstance: ci}
}

// TestXIDAttribution: which devices an event is charged to, and what it
// does to them (nvml.h, nvmlEventData_t).
func TestXIDAttribution(t *testing.T) {
	const none = noInstance
	dbe := nvmlowner.Event{UUID: "GPU-1", Type: nvml.EventTypeDoubleBitEccError, GPUInstance: 2, ComputeInstance: 0}
	sbe := nvmlowner.Event{UUID: "GPU-0", Type: nvml.EventTypeSingleBitEccError, GPUInstance: none, ComputeInstance: none}
	tests := []struct {
		name      string
		e         nvmlowner.Event
		migServed bool
		unhealthy []string // devices with a fault of their own
		counted   []string // devices whose xid counter rose
		held      bool     // the faults wait for a reset
	}{
		{"no identifiable device: every GPU", xidEvent("", 74, none, none), true,
			[]string{"GPU-0", "GPU-1"}, []string{"GPU-0", "GPU-1"}, false},
		{"GPU and compute instance: that MIG device", xidEvent("GPU-1", 74, 1, 1), true,
			[]string{"MIG-1-c"}, []string{"MIG-1-c"}, false},
		{"GPU instance only: every MIG device of it", xidEvent("GPU-1", 74, 1, none), true,
			[]string{"MIG-1-a", "MIG-1-c"}, []string{"MIG-1-a", "MIG-1-c"}, false},
		{"no instance: the GPU", xidEvent("GPU-1", 74, none, none), true,
			[]string{"GPU-1"}, []string{"GPU-1"}, false},
		{"reset-class XID on a MIG device: the whole GPU, held", xidEvent("GPU-1", 62, 1, 0), true,
			[]string{"GPU-1"}, []string{"GPU-1"}, true},
		{"reboot-class XID with a GPU instance: the whole GPU, held", xidEvent("GPU-1", 79, 2, none), true,
			[]string{"GPU-1"}, []string{"GPU-1"}, true},
		{"DBE event on a MIG device: the whole GPU, held", dbe, true,
			[]string{"GPU-1"}, nil, true},
		{"MIG devices not served: the GPU", xidEvent("GPU-1", 74, 2, 0), false,
			[]string{"GPU-1"}, []string{"GPU-1"}, false},
		{"instance of no MIG device: the GPU", xidEvent("GPU-1", 74, 7, 0), true,
			[]string{"GPU-1"}, []string{"GPU-1"}, false},
		{"application XID: counted, never fatal", xidEvent("GPU-0", 13, none, none), true,
			nil, []string{"GPU-0"}, false},
		{"application XID on a MIG device: counted there", xidEvent("GPU-1", 31, 2, 0), true,
			nil, []string{"MIG-1-b"}, false},
		{"single-bit ECC event: counted only", sbe, true, nil, nil, false},
		{"GPU not in the node model: ignored", xidEvent("GPU-9", 79, none, none), true, nil, nil, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, err := NewMonitor(Config{DCGMMode: DCGMOff, MIGDevicesServed: tc.migServed}, ownerOf(newFakeNVML(0)), discard(), nil)
			if err != nil {
				t.Fatal(err)
			}
			m.SetNode(xidNode())
			w := newXIDWatcher(m)
			w.handle(tc.e)

			m.mu.Lock()
			var unhealthy []string
			for id, s := range m.states {
				if !s.healthy {
					unhealthy = append(unhealthy, id)
					for key, c := range s.causes {
						if c.held != tc.held {
							t.Errorf("%s cause %s held = %v, want %v", id, key, c.held, tc.held)
						}
					}
				}
			}
			m.mu.Unlock()
			slices.Sort(unhealthy)
			if want := slices.Sorted(slices.Values(tc.unhealthy)); !slices.Equal(unhealthy, want) {
				t.Errorf("unhealthy %v, want %v", unhealthy, want)
			}
			var counted []string
			for _, id := range []string{"GPU-0", "GPU-1", "MIG-1-a", "MIG-1-b", "MIG-1-c", "GPU-9"} {
				if testutil.ToFloat64(m.metrics.xids.WithLabelValues(id, strconv.FormatUint(tc.e.Data, 10))) > 0 {
					counted = append(counted, id)
				}
			}
			if want := slices.Sorted(slices.Values(tc.counted)); !slices.Equal(counted, want) {
				t.Errorf("counted on %v, want %v", counted, want)
			}
			// A MIG device's XID is its parent's last XID too.
			parents := map[string]string{"GPU-0": "GPU-0", "GPU-1": "GPU-1", "MIG-1-a": "GPU-1", "MIG-1-b": "GPU-1", "MIG-1-c": "GPU-1"}
			for _, id := range tc.counted {
				parent := parents[id]
				if x, ok := m.LastXID(parent); !ok || x != tc.e.Data {
					t.Errorf("LastXID(%s) = %d, %v; want %d", parent, x, ok, tc.e.Data)
				}
			}
			// Every MIG device of an unhealthy GPU is unhealthy with it.
			if slices.Contains(tc.unhealthy, "GPU-1") {
				for _, id := range []string{"MIG-1-a", "MIG-1-b", "MIG-1-c"} {
					if m.Healthy(id) {
						t.Errorf("%s healthy under an unhealthy GPU-1", id)
					}
				}
			}
		})
	}
}

// TestXIDEventsNotSupported: an event set NVML cannot create
// (NOT_SUPPORTED) is no data, counted, and no fault of the node.
func TestXIDEventsNotSupported(t *testing.T) {
	f := newFakeNVML(2)
	f.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) {
		f.set(func() { f.creates++ })
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	h := start(t, f, false, nil)
	counter := h.m.metrics.noData.WithLabelValues("", nvmlowner.CallEventSetCreate)
	h.waitFor(t, "no data counted", func() bool { return testutil.ToFloat64(counter) >= 1 })
	if fit, reasons := h.m.NodeFit(); !fit {
		t.Fatalf("node unfit without NVML events: %v", reasons)
	}
	if h.m.Listening() {
		t.Fatal("listening without an event set")
	}
}

// TestXIDRescansLoseNothing: 1,000 rescans of an unchanged node while XIDs
// are injected: the event set is created once and every XID is counted.
func TestXIDRescansLoseNothing(t *testing.T) {
	node, m := simMonitor(t, time.Minute, nil)
	spec := node.Spec()
	var (
		wg       sync.WaitGroup
		injected atomic.Bool
		rescans  atomic.Int64
	)
	wg.Go(func() {
		// At least 1,000 rescans, and rescans all the while XIDs arrive.
		for i := 0; i < 1000 || !injected.Load(); i++ {
			m.SetNode(node.Spec())
			rescans.Add(1)
		}
	})
	const bursts, burst = 10, 40 // each burst stays below the simulator's 256-event queue
	want := map[string]float64{}
	for b := range bursts {
		for i := range burst {
			g := (b + i) % len(spec.GPUs)
			simtest.Fault(t, node, "POST", `{"kind":"xid","gpu":`+strconv.Itoa(g)+`,"xid":13}`)
			want[spec.GPUs[g].UUID]++
		}
		waitUntil(t, "burst counted", func() bool { return xidCounts(m, spec, 13, want) })
	}
	injected.Store(true)
	wg.Wait()
	if !xidCounts(m, spec, 13, want) {
		t.Fatalf("XIDs lost over %d rescans", rescans.Load())
	}
	if got := node.NVMLCalls()["EventSetCreate"]; got != 1 {
		t.Errorf("EventSetCreate called %d times over %d rescans, want 1", got, rescans.Load())
	}
	t.Logf("%d XIDs counted over %d rescans", bursts*burst, rescans.Load())
}

// xidCounts says whether every GPU's counter of xid x equals want.
func xidCounts(m *Monitor, spec *topology.Node, x uint64, want map[string]float64) bool {
	for _, g := range spec.GPUs {
		if testutil.ToFloat64(m.metrics.xids.WithLabelValues(g.UUID, strconv.FormatUint(x, 10))) != want[g.UUID] {
			return false
		}
	}
	return true
}

// TestSimXIDAttribution: events as the simulator raises them, through the
// whole path (event set, owner, watcher, monitor).
func TestSimXIDAttribution(t *testing.T) {
	tests := []struct {
		name      string
		fault     string
		unhealthy func(spec *topology.Node) []string
	}{
		{"without a device: every GPU", `{"kind":"xid","gpu":-1,"xid":74}`, func(spec *topology.Node) []string {
			var out []string
			for _, g := range spec.GPUs {
				out = append(out, g.UUID)
			}
			return out
		}},
		{"GPU instance only: its MIG devices", `{"kind":"xid","gpu":1,"xid":74,"gi":GI}`, func(spec *topology.Node) []string {
			return []string{spec.GPUs[1].MIG[0].UUID}
		}},
		{"reset-class XID on a MIG device: the GPU", `{"kind":"xid","gpu":1,"xid":62,"mig":"MIG0"}`, func(spec *topology.Node) []string {
			return []string{spec.GPUs[1].UUID}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			node, m := simMonitor(t, time.Hour, nil)
			spec := node.Spec()
			mig0 := spec.GPUs[1].MIG[0]
			body := strings.NewReplacer("MIG0", mig0.UUID, "GI", strconv.Itoa(mig0.GPUInstance)).Replace(tc.fault)
			simtest.Fault(t, node, "POST", body)
			want := tc.unhealthy(spec)
			waitUntil(t, "devices unhealthy", func() bool {
				for _, id := range want {
					if m.Healthy(id) {
						return false
					}
				}
				return true
			})
			m.mu.Lock()
			var own []string
			for id, s := range m.states {
				if !s.healthy {
					own = append(own, id)
				}
			}
			m.mu.Unlock()
			slices.Sort(own)
			if slices.Sort(want); !slices.Equal(own, want) {
				t.Errorf("devices with a fault of their own %v, want %v", own, want)
			}
		})
	}
}
