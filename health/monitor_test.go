package health

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clocktesting "k8s.io/utils/clock/testing"
)

var t0 = time.Date(2026, 11, 22, 3, 0, 0, 0, time.UTC)

type harness struct {
	f   *fakeNVML
	m   *Monitor
	clk *clocktesting.FakeClock
	reg *prometheus.Registry
}

// start runs a monitor over f on a fake clock. Polls are driven by the
// test (poll), so PollInterval is a day.
func start(t *testing.T, f *fakeNVML, mig bool, dcgm DCGM) *harness {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := NewMonitor(Config{PollInterval: 24 * time.Hour, MaxRecoveryPeriod: 48 * time.Hour, DCGMMode: DCGMOff,
		MIGDevicesServed: mig}, ownerOf(f), discard(), reg)
	if err != nil {
		t.Fatal(err)
	}
	m.cfg.eventWait = 10 * time.Millisecond
	if dcgm != nil {
		m.cfg.DCGMMode = DCGMAuto
		m.SetDCGM(dcgm)
	}
	clk := clocktesting.NewFakeClock(t0)
	m.clock = clk
	m.SetNode(f.node(mig))
	attachSampler(t, m, f.node(mig), 24*time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := m.Run(ctx); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
	h := &harness{f: f, m: m, clk: clk, reg: reg}
	// The event set is registered once the watcher has reported NVML
	// fine. Every GPU's registration is awaited too: one still to come
	// would look its GPU up again, and fail, once a test breaks NVML.
	h.waitFor(t, "event set created", func() bool { f.mu.Lock(); defer f.mu.Unlock(); return f.creates > 0 })
	h.waitFor(t, "every GPU registered on the event set", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.made == 0 {
			return true // a test's own EventSetCreate made none
		}
		for _, g := range f.gpus {
			if f.registers[g.uuid] == 0 {
				return false
			}
		}
		return true
	})
	return h
}

// waitFor waits (in real time) for an asynchronous effect; a sync helper,
// not a timing assertion.
func (h *harness) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s; snapshot %+v", what, h.m.Snapshot())
		}
		time.Sleep(time.Millisecond)
	}
}

// step advances the fake clock and lets the recovery timer run.
func (h *harness) step(t *testing.T, d time.Duration) {
	t.Helper()
	h.clk.Step(d)
	h.m.evaluate()
}

func (h *harness) healthy(ids ...string) map[string]bool {
	out := map[string]bool{}
	for _, id := range ids {
		out[id] = h.m.Healthy(id)
	}
	return out
}

func TestMonitorPolledFaults(t *testing.T) {
	tests := []struct {
		name         string
		inject, fix  func(g *fakeGPU)
		reason       string
		clearsByPoll bool
	}{
		{"ecc dbe", func(g *fakeGPU) { g.volatileDBE = 1 }, func(g *fakeGPU) { g.volatileDBE = 0 }, "ecc", true},
		{"row remap pending", func(g *fakeGPU) { g.remapPending = true }, func(g *fakeGPU) { g.remapPending = false }, "row-remap", true},
		{"row remap failure", func(g *fakeGPU) { g.remapFailure = true }, func(g *fakeGPU) { g.remapFailure = false }, "row-remap", true},
		{"retired pages pending", func(g *fakeGPU) { g.retiredPending = true }, func(g *fakeGPU) { g.retiredPending = false }, "retired-pages", true},
		{"nvlink down", func(g *fakeGPU) { g.links[0] = false }, func(g *fakeGPU) { g.links[0] = true }, "nvlink", true},
		{"gpu lost", func(g *fakeGPU) { g.lost = true }, func(g *fakeGPU) { g.lost = false }, "gpu-lost", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := start(t, newFakeNVML(2), false, nil)
			h.m.pollOnce()
			h.f.set(func() { tc.inject(h.f.gpus[0]) })
			h.m.pollOnce()
			if got := h.healthy("GPU-0", "GPU-1"); got["GPU-0"] || !got["GPU-1"] {
				t.Fatalf("after fault: %v, want GPU-0 unhealthy only", got)
			}
			if f := h.m.Fitness(); f.Fit || f.Reason != tc.reason || f.NodeWide || len(f.Devices) != 1 {
				t.Fatalf("fitness %+v, want unfit for %s on GPU-0", f, tc.reason)
			}
			// Still faulty long after: an active cause never recovers.
			h.step(t, 2*time.Hour)
			h.m.pollOnce()
			if h.m.Healthy("GPU-0") {
				t.Fatal("recovered while the fault was still present")
			}
			h.f.set(func() { tc.fix(h.f.gpus[0]) })
			h.m.pollOnce()
			h.step(t, 4*time.Minute)
			if h.m.Healthy("GPU-0") {
				t.Fatal("recovered before the recovery period")
			}
			h.step(t, time.Minute)
			if !h.m.Healthy("GPU-0") {
				t.Fatalf("not recovered after the period: %+v", h.m.Status("GPU-0"))
			}
			if fit, reasons := h.m.NodeFit(); !fit {
				t.Fatalf("node unfit after recovery: %v", reasons)
			}
			if got := testutil.ToFloat64(h.m.metrics.transitions.WithLabelValues("GPU-0", "healthy")); got != 1 {
				t.Fatalf("transitions to healthy = %v, want 1", got)
			}
		})
	}
}

func TestMonitorXIDEvents(t *testing.T) {
	tests := []struct {
		name    string
		xid     uint64
		healthy bool
		held    bool // reset class: unhealthy until reset evidence
	}{
		{"reboot-class xid 79 held", 79, false, true},
		{"reset-class xid 48 held", 48, false, true},
		{"nvlink xid in range 144-150 recovers", 147, false, false},
		{"application xid 13 only counted", 13, true, false},
		{"application xid 109 only counted", 109, true, false},
		{"informational xid 94 only counted", 94, true, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := start(t, newFakeNVML(2), false, nil)
			h.f.xid(0, tc.xid)
			counted := h.m.metrics.xids.WithLabelValues("GPU-0", strconv.FormatUint(tc.xid, 10))
			h.waitFor(t, "xid counted", func() bool { return testutil.ToFloat64(counted) == 1 })
			if got := h.m.Healthy("GPU-0"); got != tc.healthy {
				t.Fatalf("Healthy = %v, want %v", got, tc.healthy)
			}
			if !h.m.Healthy("GPU-1") {
				t.Fatal("GPU-1 unhealthy from GPU-0's xid")
			}
			if tc.healthy {
				return
			}
			st := h.m.Status("GPU-0")
			if len(st.Reasons) != 1 || !strings.HasPrefix(st.Reasons[0], "xid ") {
				t.Fatalf("reasons %q", st.Reasons)
			}
			if want := "xid-" + strconv.FormatUint(tc.xid, 10); !slices.Equal(st.Causes, []string{want}) || st.NodeWide {
				t.Fatalf("causes %q node-wide %v, want [%s] and not node-wide", st.Causes, st.NodeWide, want)
			}
			if tc.held {
				h.step(t, 5*time.Minute)
				if h.m.Healthy("GPU-0") {
					t.Fatal("reset-class xid recovered without a reset")
				}
				h.m.Observe(Observation{DeviceID: "GPU-0", Reset: true, Reason: "test reset"})
			}
			h.step(t, 5*time.Minute)
			if !h.m.Healthy("GPU-0") {
				t.Fatal("xid fault did not recover after the recovery period")
			}
		})
	}
}

func TestMonitorMIG(t *testing.T) {
	h := start(t, newFakeNVML(2), true, nil)
	h.f.events <- nvml.EventData{Device: h.f.gpus[1].dev, EventType: nvml.EventTypeXidCriticalError, EventData: 94, GpuInstanceId: 2, ComputeInstanceId: 0}
	// 74 (NVLink class) is fatal without needing a reset, so it stays
	// with the MIG device that reported it.
	h.f.events <- nvml.EventData{Device: h.f.gpus[1].dev, EventType: nvml.EventTypeXidCriticalError, EventData: 74, GpuInstanceId: 1, ComputeInstanceId: 0}
	h.waitFor(t, "MIG-1-a unhealthy", func() bool { return !h.m.Healthy("MIG-1-a") })
	if got := h.healthy("GPU-1", "MIG-1-b"); !got["GPU-1"] || !got["MIG-1-b"] {
		t.Fatalf("a MIG device's xid spread: %v", got)
	}
	if got := testutil.ToFloat64(h.m.metrics.xids.WithLabelValues("MIG-1-b", "94")); got != 1 {
		t.Fatalf("MIG-1-b xid 94 count = %v", got)
	}
	// The parent reports its MIG devices' latest XID (74 came last).
	if x, ok := h.m.LastXID("GPU-1"); !ok || x != 74 {
		t.Fatalf("LastXID(GPU-1) = %d, %v; want 74", x, ok)
	}
	if _, ok := h.m.LastXID("GPU-0"); ok {
		t.Fatal("LastXID(GPU-0) reported an XID it never had")
	}
	// A fault of the parent takes every MIG device on it.
	h.f.set(func() { h.f.gpus[1].remapPending = true })
	h.m.pollOnce()
	if got := h.healthy("GPU-1", "MIG-1-a", "MIG-1-b", "GPU-0"); got["GPU-1"] || got["MIG-1-a"] || got["MIG-1-b"] || !got["GPU-0"] {
		t.Fatalf("after parent fault: %v", got)
	}
	st := h.m.Status("MIG-1-b")
	if st.Kind != KindMIG || len(st.Reasons) != 1 || !strings.HasPrefix(st.Reasons[0], "GPU-1: row remapping pending") {
		t.Fatalf("MIG-1-b status %+v", st)
	}
	// The MIG device's own XID 74 and its parent's cause, as codes.
	if st := h.m.Status("MIG-1-a"); len(st.Causes) != 2 || st.Causes[0] != "xid-74" || st.NodeWide {
		t.Fatalf("MIG-1-a causes %q node-wide %v", st.Causes, st.NodeWide)
	}
	// An event without instance IDs belongs to the parent.
	h.f.xid(0, 79)
	h.waitFor(t, "GPU-0 unhealthy", func() bool { return !h.m.Healthy("GPU-0") })
}

func TestMonitorNVMLFailure(t *testing.T) {
	tests := []struct {
		name   string
		break_ func(f *fakeNVML)
		fix    func(f *fakeNVML)
		poll   bool
	}{
		{"event wait fails", func(f *fakeNVML) { f.waitRet = nvml.ERROR_UNKNOWN }, func(f *fakeNVML) { f.waitRet = nvml.SUCCESS }, false},
		{"device count fails", func(f *fakeNVML) { f.countRet = nvml.ERROR_UNKNOWN }, func(f *fakeNVML) { f.countRet = nvml.SUCCESS }, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := start(t, newFakeNVML(2), true, nil)
			changes := h.m.Changes()
			drain(changes)
			h.f.set(func() { tc.break_(h.f) })
			if tc.poll {
				h.m.pollOnce()
			}
			h.waitFor(t, "node unfit", func() bool { fit, _ := h.m.NodeFit(); return !fit })
			<-changes
			for id, ok := range h.healthy("GPU-0", "GPU-1", "MIG-1-a", "MIG-1-b") {
				if ok {
					t.Errorf("%s healthy while NVML fails", id)
				}
			}
			if f := h.m.Fitness(); !f.NodeWide || f.Reason != "nvml" {
				t.Fatalf("fitness %+v, want node-wide nvml", f)
			}
			if st := h.m.Status("MIG-1-a"); !st.NodeWide || !slices.ContainsFunc(st.Causes, func(c string) bool { return strings.HasPrefix(c, "nvml-") }) {
				t.Fatalf("MIG-1-a status %+v, want a node-wide nvml cause", st)
			}
			if !h.m.Healthy("some-nic") {
				t.Fatal("an unrelated device went unhealthy with NVML")
			}
			h.f.set(func() { tc.fix(h.f) })
			h.m.pollOnce()
			h.waitFor(t, "nvml cause cleared", func() bool {
				if !tc.poll {
					// The event set is kept across rescans: a failing
					// one is rebuilt after the retry delay (a poll
					// interval, a day here), not by SetNode.
					h.clk.Step(time.Hour)
				}
				h.m.mu.Lock()
				defer h.m.mu.Unlock()
				for _, c := range h.m.states[NodeID].causes {
					if c.active {
						return false
					}
				}
				return true
			})
			h.step(t, 5*time.Minute)
			if fit, reasons := h.m.NodeFit(); !fit || !h.m.Healthy("MIG-1-a") {
				t.Fatalf("not recovered: %v", reasons)
			}
			if got := testutil.ToFloat64(h.m.metrics.nodeFit); got != 1 {
				t.Fatalf("node_fit = %v", got)
			}
		})
	}
}

func drain(ch <-chan struct{}) {
	select {
	case <-ch:
	default:
	}
}

func TestMonitorExternalAndDCGM(t *testing.T) {
	fd := &fakeDCGM{obs: make(chan Observation, 1)}
	h := start(t, newFakeNVML(1), false, fd)
	h.m.Observe(Observation{DeviceID: "mlx5_0", Kind: KindNIC, Check: "rdma-port", Fatal: true, Reason: "port down"})
	if h.m.Healthy("mlx5_0") || h.m.Status("mlx5_0").Kind != KindNIC {
		t.Fatalf("nic status %+v", h.m.Status("mlx5_0"))
	}
	if fit, reasons := h.m.NodeFit(); fit || len(reasons) != 1 || reasons[0] != "mlx5_0: port down" {
		t.Fatalf("NodeFit = %v %q", fit, reasons)
	}
	fd.obs <- Observation{DeviceID: "GPU-0", Kind: KindGPU, Key: "health 0x10", Fatal: true, Reason: "dcgm: memory"}
	h.waitFor(t, "dcgm fault", func() bool { return !h.m.Healthy("GPU-0") })
	if got := h.m.Status("GPU-0").Reasons; len(got) != 1 || got[0] != "dcgm: memory" {
		t.Fatalf("reasons %q", got)
	}
	if f := h.m.Fitness(); f.Reason != "multiple" || len(f.Devices) != 2 {
		t.Fatalf("fitness %+v", f)
	}
}

type fakeDCGM struct{ obs chan Observation }

func (d *fakeDCGM) Watch(ctx context.Context, emit func(Observation)) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case o := <-d.obs:
			emit(o)
		}
	}
}

func (d *fakeDCGM) Close() {}

func TestMonitorSetNodeDropsGoneDevices(t *testing.T) {
	h := start(t, newFakeNVML(2), true, nil)
	h.m.Observe(Observation{DeviceID: "MIG-1-a", Check: CheckXID, Fatal: true, Reason: "xid 62"})
	if h.m.Healthy("MIG-1-a") {
		t.Fatal("MIG-1-a healthy after fatal")
	}
	h.m.SetNode(h.f.node(false))
	if _, ok := h.m.Snapshot()["MIG-1-a"]; ok {
		t.Fatal("gone MIG device still in snapshot")
	}
	if fit, _ := h.m.NodeFit(); !fit {
		t.Fatal("node unfit from a device that no longer exists")
	}
}

// TestMonitorWaitGPULost: EventSet.Wait failing because one GPU is lost is
// that GPU's problem (the gpu-lost check), not a node-wide NVML failure:
// the set is rebuilt at once (the new one registered before the old one
// is freed), and a set that keeps failing is retried after a poll interval.
func TestMonitorWaitGPULost(t *testing.T) {
	h := start(t, newFakeNVML(2), false, nil)
	h.waitFor(t, "events registered", h.m.Listening)
	h.f.set(func() { h.f.waitRet = nvml.ERROR_GPU_IS_LOST })
	h.waitFor(t, "event set rebuilt", func() bool { h.f.mu.Lock(); defer h.f.mu.Unlock(); return h.f.creates >= 2 })
	if fit, reasons := h.m.NodeFit(); !fit {
		t.Fatalf("node unfit from a lost GPU's event wait: %v", reasons)
	}
	h.f.set(func() { h.f.waitRet = nvml.SUCCESS })
	// The watcher's retry delay is a poll interval (a day here).
	h.waitFor(t, "events registered again", func() bool { h.clk.Step(time.Hour); return h.m.Listening() })
	if fit, reasons := h.m.NodeFit(); !fit {
		t.Fatalf("node unfit after a lost GPU's event wait: %v", reasons)
	}
}

// seriesDevices lists the device label of every series of metric name.
func seriesDevices(t *testing.T, reg *prometheus.Registry, name string) []string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, s := range mf.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "device" && !slices.Contains(out, l.GetValue()) {
					out = append(out, l.GetValue())
				}
			}
		}
	}
	slices.Sort(out)
	return out
}

// TestMonitorSetNodePrunesGoneDevices: after a MIG reconfiguration (and a
// GPU leaving), the old IDs keep neither their last XID nor any
// per-device series; devices still present and NICs keep theirs.
func TestMonitorSetNodePrunesGoneDevices(t *testing.T) {
	h := start(t, newFakeNVML(2), true, nil)
	h.m.Observe(Observation{DeviceID: "MIG-1-a", Check: CheckXID, Fatal: true, Event: true, Reason: "xid 62", XID: 62})
	h.m.Observe(Observation{DeviceID: "GPU-0", Check: CheckXID, Key: "x", Reason: "xid 13", XID: 13})
	h.m.Observe(Observation{DeviceID: "mlx5_0", Kind: KindNIC, Check: "port", Fatal: true, Reason: "port down"})
	perDevice := []string{
		"gpu_node_agent_device_healthy",
		"gpu_node_agent_health_transitions_total",
		"gpu_node_agent_xid_errors_total",
	}
	for _, name := range perDevice {
		if got := seriesDevices(t, h.reg, name); !slices.Contains(got, "MIG-1-a") {
			t.Fatalf("%s devices %v before reconfiguration, want MIG-1-a among them", name, got)
		}
	}

	// MIG devices gone, and GPU-0 gone too.
	n := h.f.node(false)
	n.GPUs = n.GPUs[1:]
	h.m.SetNode(n)

	for _, id := range []string{"MIG-1-a", "GPU-0"} {
		if x, ok := h.m.LastXID(id); ok {
			t.Errorf("LastXID(%s) = %d after it left the node", id, x)
		}
		for _, name := range perDevice {
			if got := seriesDevices(t, h.reg, name); slices.Contains(got, id) {
				t.Errorf("%s still has series for gone device %s: %v", name, id, got)
			}
		}
	}
	if x, ok := h.m.LastXID("GPU-1"); !ok || x != 62 {
		t.Errorf("LastXID(GPU-1) = %d, %v; want its MIG device's 62 kept", x, ok)
	}
	if got := seriesDevices(t, h.reg, "gpu_node_agent_device_healthy"); !slices.Contains(got, "GPU-1") || !slices.Contains(got, "mlx5_0") {
		t.Errorf("device_healthy devices %v, want GPU-1 and the NIC kept", got)
	}
	if h.m.Healthy("mlx5_0") {
		t.Error("NIC state dropped by SetNode; external sources own it")
	}
}
