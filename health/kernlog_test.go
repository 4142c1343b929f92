package health

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/sys/unix"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpu-node-agent/gpu-node-agent/kernlog"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// busNode is a node of three GPUs at known PCI addresses; GPU-1 has two
// MIG devices (GPU instances 1 and 2).
func busNode() *topology.Node {
	return &topology.Node{GPUs: []topology.GPU{
		{Index: 0, UUID: "GPU-0", PCIBusID: "00000000:18:00.0"},
		{Index: 1, UUID: "GPU-1", PCIBusID: "00000000:3B:00.0", MIGEnabled: true, MIG: []topology.MIGDevice{
			{UUID: "MIG-1-a", GPUInstance: 1, ComputeInstance: 0},
			{UUID: "MIG-1-b", GPUInstance: 2, ComputeInstance: 0},
		}},
		{Index: 2, UUID: "GPU-2", PCIBusID: "0000:b3:00.0"},
	}}
}

// logMonitor is a monitor without NVML on busNode, its kernel-log check
// built but not running (tests hand it events), on a fake clock.
func logMonitor(t *testing.T, cfg Config) (*Monitor, *kernelLogCheck, *prometheus.Registry, *clocktesting.FakeClock) {
	t.Helper()
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC))
	cfg.clock = clk
	cfg.DCGMMode = DCGMOff
	reg := prometheus.NewRegistry()
	m, err := NewMonitor(cfg, nil, discard(), reg)
	if err != nil {
		t.Fatal(err)
	}
	m.SetNode(busNode())
	c := m.kernelLog
	if c == nil {
		c, err = newKernelLogCheck(m, nil)
		if err != nil {
			t.Fatal(err)
		}
	}
	return m, c, reg, clk
}

func parse(t *testing.T, line string) kernlog.Event {
	t.Helper()
	var p kernlog.Parser
	e, ok := p.Parse(line)
	if !ok {
		t.Fatalf("no event in %q", line)
	}
	return e
}

// TestKernelLogXIDLikeNVML: an Xid line is the observation an NVML XID
// event makes (check, key, class, hold, reason), charged to the GPU at
// its PCI address.
func TestKernelLogXIDLikeNVML(t *testing.T) {
	m, c, reg, _ := logMonitor(t, Config{MIGDevicesServed: true, KernelLog: kernlog.ModeOff})
	c.handle(parse(t, "NVRM: Xid (PCI:0000:3b:00): 79, pid=1911, name=python, GPU has fallen off the bus."))
	st := m.Status("GPU-1")
	if st.Healthy || !slices.Contains(st.Causes, "xid-79") {
		t.Fatalf("GPU-1 after a log xid 79: %+v", st)
	}
	want, _ := m.xidObservation(79)
	if !slices.ContainsFunc(st.Reasons, func(r string) bool { return strings.HasPrefix(r, want.Reason) }) {
		t.Errorf("GPU-1 reasons %v, want NVML's %q", st.Reasons, want.Reason)
	}
	// Held like NVML's: a clear does not end it, only reset evidence.
	m.Observe(Observation{DeviceID: "GPU-1", Check: CheckXID, Key: "xid 79", Cleared: true})
	if m.Healthy("GPU-1") {
		t.Error("log xid 79 not held")
	}
	// Whole GPU: both MIG devices are affected through their parent.
	for _, id := range []string{"MIG-1-a", "MIG-1-b"} {
		if m.Healthy(id) {
			t.Errorf("%s healthy under its GPU's xid 79", id)
		}
	}
	if !m.Healthy("GPU-0") || !m.Healthy("GPU-2") {
		t.Error("another GPU charged")
	}
	if x, ok := m.LastXID("GPU-1"); !ok || x != 79 {
		t.Errorf("LastXID(GPU-1) = %d, %v", x, ok)
	}
	if got := testutil.ToFloat64(m.metrics.xids.WithLabelValues("GPU-1", "79")); got != 1 {
		t.Errorf("xid counter = %v, want 1", got)
	}
	_ = reg
}

// TestKernelLogXIDMIGAttribution: an Xid line naming a GPU and compute
// instance goes to that MIG device, as NVML's event would; with MIG
// devices not served, to the GPU.
func TestKernelLogXIDMIGAttribution(t *testing.T) {
	line := "NVRM: Xid (PCI:0000:3b:00 GPU-I:02 GPU-CI:00): 74, pid=2811, name=python3, NVLink: fatal error"
	m, c, _, _ := logMonitor(t, Config{MIGDevicesServed: true, KernelLog: kernlog.ModeOff})
	c.handle(parse(t, line))
	if m.Healthy("MIG-1-b") || !m.Healthy("MIG-1-a") || m.Status("GPU-1").Causes != nil {
		t.Errorf("served MIG: MIG-1-b %v, MIG-1-a %v, GPU-1 causes %v; want only MIG-1-b charged",
			m.Healthy("MIG-1-b"), m.Healthy("MIG-1-a"), m.Status("GPU-1").Causes)
	}
	m, c, _, _ = logMonitor(t, Config{KernelLog: kernlog.ModeOff})
	c.handle(parse(t, line))
	if m.Healthy("GPU-1") {
		t.Error("MIG not served: GPU-1 healthy after its MIG device's xid 74")
	}
}

// TestKernelLogFallenOffBus: the driver's fallen-off-the-bus message makes
// the GPU unfit, held until reset evidence, with the reboot action of
// XID 79.
func TestKernelLogFallenOffBus(t *testing.T) {
	m, c, _, _ := logMonitor(t, Config{KernelLog: kernlog.ModeOff})
	c.handle(parse(t, "NVRM: The NVIDIA GPU 0000:b3:00.0\nNVRM: (PCI ID: 10de:26b5) installed in this system has\nNVRM: fallen off the bus and is not responding to commands."))
	st := m.Status("GPU-2")
	if st.Healthy || !slices.Equal(st.Causes, []string{"kernel-log-fallen-off-the-bus"}) {
		t.Fatalf("GPU-2: %+v", st)
	}
	m.Observe(Observation{DeviceID: "GPU-2", Check: CheckKernelLog, Key: "fallen-off-the-bus", Cleared: true})
	if m.Healthy("GPU-2") {
		t.Fatal("fallen off the bus not held")
	}
	m.Observe(Observation{DeviceID: "GPU-2", Reset: true, Reason: "test reset"})
	m.mu.Lock()
	held := m.states["GPU-2"].causes["kernel-log/fallen-off-the-bus"]
	m.mu.Unlock()
	if held == nil || held.held {
		t.Errorf("cause after reset evidence %+v: want released", held)
	}
	if held != nil && held.action != ActionReboot {
		t.Errorf("action %q, want %q", held.action, ActionReboot)
	}
}

// TestKernelLogSXID: a fatal SXid makes every GPU unfit (held); a
// non-fatal one is only counted.
func TestKernelLogSXID(t *testing.T) {
	m, c, _, _ := logMonitor(t, Config{KernelLog: kernlog.ModeOff})
	c.handle(parse(t, "nvidia-nvswitch3: SXid (PCI:0000:c1:00.0): 28006, Non-fatal, Link 46 MC TS crumbstore MCTO (First)"))
	if fit, reasons := m.NodeFit(); !fit {
		t.Fatalf("unfit after a non-fatal sxid: %v", reasons)
	}
	if got := testutil.ToFloat64(c.sxids.WithLabelValues("3", "28006", "false")); got != 1 {
		t.Errorf("non-fatal sxid counter = %v", got)
	}
	c.handle(parse(t, "nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Fatal, Link 28 sourcetrack timeout error (First)"))
	for _, id := range []string{"GPU-0", "GPU-1", "GPU-2"} {
		st := m.Status(id)
		if st.Healthy || !slices.Contains(st.Causes, "kernel-log-sxid") {
			t.Errorf("%s after a fatal sxid: %+v", id, st)
		}
	}
	f := m.Fitness()
	if f.Fit || f.Reason != CheckKernelLog || !strings.Contains(f.Message, "sxid 24007") {
		t.Errorf("fitness %+v", f)
	}
}

// TestKernelLogUnknownBus: a fault at an address no GPU has is ignored
// and counted.
func TestKernelLogUnknownBus(t *testing.T) {
	m, c, _, _ := logMonitor(t, Config{KernelLog: kernlog.ModeOff})
	c.handle(parse(t, "NVRM: Xid (PCI:0000:99:00): 79, pid=1, name=x, GPU has fallen off the bus."))
	if fit, _ := m.NodeFit(); !fit {
		t.Error("unfit from an unknown GPU")
	}
	if got := testutil.ToFloat64(c.unattributed); got != 1 {
		t.Errorf("unattributed = %v, want 1", got)
	}
}

// TestKernelLogRunsFromFile: the monitor reads <host-root>/dev/kmsg on its
// own (Run) and its cursor goes to the state dir; disabledChecks switches
// the check off.
func TestKernelLogRunsFromFile(t *testing.T) {
	root, state := t.TempDir(), t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "dev"), 0o755); err != nil {
		t.Fatal(err)
	}
	// Logged now (time since boot, as printk stamps it): within the
	// first start's horizon.
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		t.Fatal(err)
	}
	rec := kernlog.FormatKmsg(4, 1, uint64(ts.Nano()/1000), "NVRM: Xid (PCI:0000:18:00): 48, pid=1, name=x, An uncorrectable double bit error")
	if err := os.WriteFile(filepath.Join(root, "dev/kmsg"), []byte(rec), 0o644); err != nil {
		t.Fatal(err)
	}
	off, _, _, _ := logMonitor(t, Config{HostRoot: root, StateDir: state, DisabledChecks: []string{CheckKernelLog}})
	if off.kernelLog != nil {
		t.Error("kernel-log check built while disabled")
	}
	m, err := NewMonitor(Config{HostRoot: root, StateDir: state, DCGMMode: DCGMOff, KernelLog: kernlog.ModeKmsg}, nil, discard(), nil)
	if err != nil {
		t.Fatal(err)
	}
	m.SetNode(busNode())
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = m.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()
	waitUntil(t, "GPU-0 unhealthy from the kernel log", func() bool { return !m.Healthy("GPU-0") })
	waitUntil(t, "the cursor saved", func() bool {
		c, err := kernlog.LoadCursor(state)
		return err == nil && c.HasSeq && c.Seq == 1
	})
}

func TestKernelLogConfig(t *testing.T) {
	err := Config{KernelLog: "dmesg"}.Validate()
	if err == nil || !strings.Contains(err.Error(), `health.kernelLog "dmesg"`) {
		t.Errorf("Validate(kernelLog dmesg) = %v, want an error naming the field and value", err)
	}
	for _, ok := range kernlog.Modes() {
		if err := (Config{KernelLog: ok}).Validate(); err != nil {
			t.Errorf("Validate(kernelLog %s) = %v", ok, err)
		}
	}
	if err := (Config{DisabledChecks: []string{CheckKernelLog}}).Validate(); err != nil {
		t.Errorf("disabling %s: %v", CheckKernelLog, err)
	}
}

// TestKernelLogXIDDisabled: health.disabledChecks: [xid] switches off the
// kernel log's XIDs as well as NVML's; its other lines still count.
func TestKernelLogXIDDisabled(t *testing.T) {
	m, c, _, _ := logMonitor(t, Config{KernelLog: kernlog.ModeOff, DisabledChecks: []string{CheckXID}})
	c.handle(parse(t, "NVRM: Xid (PCI:0000:18:00): 48, pid=1, name=x, An uncorrectable double bit error"))
	if !m.Healthy("GPU-0") {
		t.Fatalf("GPU-0 unhealthy from a kernel-log xid with xid disabled: %v", m.Status("GPU-0").Reasons)
	}
	c.handle(parse(t, "NVRM: The NVIDIA GPU 0000:b3:00.0\nNVRM: (PCI ID: 10de:26b5) installed in this system has\nNVRM: fallen off the bus and is not responding to commands."))
	if m.Healthy("GPU-2") {
		t.Fatal("GPU-2 healthy after falling off the bus: the kernel-log check itself was switched off")
	}
}
