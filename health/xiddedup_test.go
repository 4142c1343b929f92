package health

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gpu-node-agent/gpu-node-agent/kernlog"
)

// TestXIDDedup: per (device, XID) the count is the maximum over sources
// within the window.
func TestXIDDedup(t *testing.T) {
	type occ struct {
		source string
		at     time.Duration // after the start
	}
	nvml, log := "", SourceKernelLog
	for _, tc := range []struct {
		name    string
		seen    []occ
		counted int
	}{
		{"nvml then log", []occ{{nvml, 0}, {log, time.Second}}, 1},
		{"log then nvml", []occ{{log, 0}, {nvml, 2 * time.Second}}, 1},
		{"two repeats from both", []occ{{nvml, 0}, {nvml, time.Second}, {log, 2 * time.Second}, {log, 3 * time.Second}}, 2},
		{"two repeats interleaved", []occ{{nvml, 0}, {log, time.Second}, {nvml, 5 * time.Second}, {log, 6 * time.Second}}, 2},
		{"log sees more than nvml", []occ{{nvml, 0}, {log, time.Second}, {log, 2 * time.Second}}, 2},
		{"one source only", []occ{{nvml, 0}, {nvml, time.Second}, {nvml, 2 * time.Second}}, 3},
		{"outside the window", []occ{{nvml, 0}, {log, 31 * time.Second}}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newXIDDedup(30 * time.Second)
			start := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
			counted := 0
			for _, o := range tc.seen {
				if !d.duplicate("GPU-0", 79, o.source, start.Add(o.at)) {
					counted++
				}
			}
			if counted != tc.counted {
				t.Errorf("counted %d, want %d", counted, tc.counted)
			}
		})
	}
	// Keys are per device and XID.
	d := newXIDDedup(30 * time.Second)
	now := time.Now()
	d.duplicate("GPU-0", 79, "", now)
	if d.duplicate("GPU-1", 79, SourceKernelLog, now) || d.duplicate("GPU-0", 48, SourceKernelLog, now) {
		t.Error("another device's or XID's occurrence made a duplicate")
	}
}

// TestMonitorXIDOnceFromTwoSources: an XID that NVML and the kernel log
// both report is counted once by the XID counter and acted on once (one
// unhealthy transition); a real repeat counts again.
func TestMonitorXIDOnceFromTwoSources(t *testing.T) {
	m, c, _, clk := logMonitor(t, Config{KernelLog: kernlog.ModeOff})
	nvmlXID := func() {
		o, _ := m.xidObservation(13)
		o.DeviceID = "GPU-0"
		m.Observe(o)
	}
	logXID := func() { c.handle(parse(t, "NVRM: Xid (PCI:0000:18:00): 13, pid=1, name=x, Graphics Exception")) }
	counter := func() float64 { return testutil.ToFloat64(m.metrics.xids.WithLabelValues("GPU-0", "13")) }

	nvmlXID()
	clk.Step(time.Second)
	logXID()
	if got := counter(); got != 1 {
		t.Fatalf("NVML then log: counter %v, want 1", got)
	}
	clk.Step(time.Second)
	logXID() // a second real XID, seen by the log first
	clk.Step(time.Second)
	nvmlXID()
	if got := counter(); got != 2 {
		t.Errorf("a repeat seen by both: counter %v, want 2", got)
	}
	if got := testutil.ToFloat64(m.metrics.observations.WithLabelValues(CheckXID, KindGPU)); got != 2 {
		t.Errorf("xid observations %v, want 2", got)
	}
}
