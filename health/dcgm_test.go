package health

import (
	"context"
	"strings"
	"testing"
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
// returns at once and the monitor goes on with NVML.
func TestRunDCGMFallsBack(t *testing.T) {
	f := newFakeNVML(1)
	m, err := NewMonitor(Config{DCGMMode: DCGMAuto}, f, discard(), nil)
	if err != nil {
		t.Fatal(err)
	}
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
