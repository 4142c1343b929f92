package health

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestOpenDCGMWithoutLibrary checks the real adapter on a machine without
// libdcgm.so.4: it reports the library missing, and never panics.
func TestOpenDCGMWithoutLibrary(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
	}{
		{"auto embedded", Config{DCGMMode: DCGMAuto}},
		{"standalone", Config{DCGMMode: DCGMStandalone, DCGMAddress: "127.0.0.1:5555"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, err := openDCGM(tc.cfg.WithDefaults(), discard())
			if err == nil {
				d.Close()
				t.Skip("libdcgm.so.4 is installed here; this test is for machines without it")
			}
			if !strings.Contains(err.Error(), "libdcgm.so.4") {
				t.Fatalf("error %q does not name the library", err)
			}
		})
	}
	if _, err := openDCGM(Config{DCGMMode: DCGMOff}, discard()); err != errDCGMOff {
		t.Fatalf("off mode: %v", err)
	}
}

// TestRunDCGMFallsBack runs the DCGM goroutine without the library: it
// returns at once and the monitor goes on with NVML, so an NVML-reported
// fault still makes the device unhealthy.
func TestRunDCGMFallsBack(t *testing.T) {
	f := newFakeNVML(1)
	m, err := NewMonitor(Config{DCGMMode: DCGMAuto, PollInterval: time.Hour}, ownerOf(f), discard(), nil)
	if err != nil {
		t.Fatal(err)
	}
	m.cfg.eventWait = 10 * time.Millisecond
	if openErr := func() error {
		d, err := openDCGM(m.cfg, discard())
		if err == nil {
			d.Close()
		}
		return err
	}(); openErr == nil {
		t.Skip("libdcgm.so.4 is installed here")
	}
	m.runDCGM(context.Background()) // must return, not block

	// The whole monitor in auto mode: DCGM falls back again inside Run,
	// and the NVML XID watcher still turns a fatal XID into a fault.
	m.SetNode(f.node(false))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := m.Run(ctx); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	defer func() { cancel(); wg.Wait() }()
	h := &harness{f: f, m: m}
	h.waitFor(t, "event set created", func() bool { f.mu.Lock(); defer f.mu.Unlock(); return f.creates > 0 })
	if !m.Healthy("GPU-0") {
		t.Fatalf("GPU-0 unhealthy before any fault: %+v", m.Status("GPU-0"))
	}
	f.xid(0, 79)
	h.waitFor(t, "GPU-0 unhealthy from an NVML XID after the DCGM fallback", func() bool { return !m.Healthy("GPU-0") })
	if st := m.Status("GPU-0"); !strings.Contains(strings.Join(st.Reasons, ","), "79") {
		t.Errorf("GPU-0 reasons %v, want the NVML XID 79", st.Reasons)
	}
}

// TestDCGMNonFatalXID: DCGM's XID policy fires for every XID; only those in
// the fatal list make the device unfit.
func TestDCGMNonFatalXID(t *testing.T) {
	fd := &fakeDCGM{obs: make(chan Observation, 2)}
	h := start(t, newFakeNVML(1), false, fd)
	fd.obs <- Observation{DeviceID: "GPU-0", Key: "policy XID Error", Fatal: true, Event: true, Reason: "dcgm: xid 13", XID: 13}
	h.waitFor(t, "xid counted", func() bool {
		return counterValue(h.m, "GPU-0", "13") == 1
	})
	if !h.m.Healthy("GPU-0") {
		t.Fatal("a non-fatal DCGM XID made the GPU unhealthy")
	}
}

// TestOpenDCGMDiagWithoutLibrary: the preflight's DCGM diagnostic opens
// through the same adapter: off is ErrDCGMOff, and without libdcgm.so.4
// the error names the library.
func TestOpenDCGMDiagWithoutLibrary(t *testing.T) {
	if _, err := OpenDCGMDiag(Config{DCGMMode: DCGMOff}, nil); err != ErrDCGMOff {
		t.Fatalf("off mode: %v, want ErrDCGMOff", err)
	}
	d, err := OpenDCGMDiag(Config{DCGMMode: DCGMAuto}, nil)
	if err == nil {
		defer d.Close()
		if _, err := d.RunDiag(context.Background(), 0); err == nil || !strings.Contains(err.Error(), "level 0") {
			t.Errorf("level 0: %v", err)
		}
		t.Skip("libdcgm.so.4 is installed here; this test is for machines without it")
	}
	if !strings.Contains(err.Error(), "libdcgm.so.4") {
		t.Fatalf("error %q does not name the library", err)
	}
}
