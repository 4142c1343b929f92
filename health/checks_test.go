package health

import (
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// summary renders observations as "key:F|C|I:reason" for comparison.
func summary(obs []Observation) string {
	var parts []string
	for _, o := range obs {
		k := "I"
		switch {
		case o.Fatal && o.Event:
			k = "E"
		case o.Fatal:
			k = "F"
		case o.Cleared:
			k = "C"
		}
		s := o.causeKey() + ":" + k
		if o.Fatal {
			s += ":" + o.Reason
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, " ")
}

// pollTwice runs a check on GPU 0 with before applied, then after, and
// returns the second poll's observations: checks that compare with the
// previous reading need two.
func pollTwice(c DeviceCheck, before, after func(g *fakeGPU)) string {
	f := newFakeNVML(1)
	g := f.gpus[0]
	t := Target{UUID: g.uuid, Device: g.dev}
	f.set(func() { before(g) })
	c.CheckDevice(t)
	f.set(func() { after(g) })
	return summary(c.CheckDevice(t))
}

func nop(*fakeGPU) {}

func TestPolledChecks(t *testing.T) {
	tests := []struct {
		name          string
		check         func() DeviceCheck
		before, after func(g *fakeGPU)
		want          string
	}{
		{"ecc healthy", func() DeviceCheck { return newECCCheck(nil, discard()) }, nop, nop, "ecc/dbe:C"},
		{"ecc dbe rise is fatal", func() DeviceCheck { return newECCCheck(nil, discard()) }, nop,
			func(g *fakeGPU) { g.volatileDBE = 2 }, "ecc/dbe:F:2 volatile double-bit ECC errors"},
		{"ecc count at start is the baseline", func() DeviceCheck { return newECCCheck(nil, discard()) },
			func(g *fakeGPU) { g.volatileDBE = 3 }, nop, "ecc/dbe:C"},
		{"ecc reset clears", func() DeviceCheck { return newECCCheck(nil, discard()) },
			func(g *fakeGPU) { g.volatileDBE = 3 }, func(g *fakeGPU) { g.volatileDBE = 0 }, "ecc/dbe:C"},
		{"ecc disabled says nothing", func() DeviceCheck { return newECCCheck(nil, discard()) }, nop,
			func(g *fakeGPU) { g.eccDisabled = true; g.volatileDBE = 5 }, ""},
		{"ecc lost says nothing", func() DeviceCheck { return newECCCheck(nil, discard()) }, nop,
			func(g *fakeGPU) { g.lost = true }, ""},

		{"retired healthy", func() DeviceCheck { return &retiredCheck{limit: 60} }, nop, nop, "retired-pages/pending:C retired-pages/limit:C"},
		{"retired pending", func() DeviceCheck { return &retiredCheck{limit: 60} }, nop,
			func(g *fakeGPU) { g.retiredPending = true }, "retired-pages/pending:F:retired pages pending (reset required) retired-pages/limit:C"},
		{"retired over limit", func() DeviceCheck { return &retiredCheck{limit: 60} }, nop,
			func(g *fakeGPU) { g.retired = 61 }, "retired-pages/pending:C retired-pages/limit:F:61 retired pages (limit 60)"},
		{"retired at limit", func() DeviceCheck { return &retiredCheck{limit: 60} }, nop,
			func(g *fakeGPU) { g.retired = 60 }, "retired-pages/pending:C retired-pages/limit:C"},

		{"remap healthy", func() DeviceCheck { return remapCheck{} }, nop, nop, "row-remap/pending:C row-remap/failure:C"},
		{"remap pending", func() DeviceCheck { return remapCheck{} }, nop,
			func(g *fakeGPU) { g.remapPending = true }, "row-remap/pending:F:row remapping pending (reset required) row-remap/failure:C"},
		{"remap failure", func() DeviceCheck { return remapCheck{} }, nop,
			func(g *fakeGPU) { g.remapFailure = true }, "row-remap/pending:C row-remap/failure:F:row remapping failure"},
		{"remap lost says nothing", func() DeviceCheck { return remapCheck{} }, nop,
			func(g *fakeGPU) { g.lost = true }, ""},

		{"nvlink up", func() DeviceCheck { return newNVLinkCheck(100) }, nop, nop, "nvlink/link 0:C nvlink/link 1:C"},
		{"nvlink up then down", func() DeviceCheck { return newNVLinkCheck(100) }, nop,
			func(g *fakeGPU) { g.links[1] = false }, "nvlink/link 0:C nvlink/link 1:F:nvlink 1 down"},
		{"nvlink never up is ignored", func() DeviceCheck { return newNVLinkCheck(100) },
			func(g *fakeGPU) { g.links[1] = false }, nop, "nvlink/link 0:C"},
		{"nvlink error jump", func() DeviceCheck { return newNVLinkCheck(100) }, nop,
			func(g *fakeGPU) { g.linkErrors[0] = 150 }, "nvlink/link 0:C nvlink/link 0 errors:E:nvlink 0 errors rose by 150 nvlink/link 1:C"},
		{"nvlink small error rise", func() DeviceCheck { return newNVLinkCheck(100) }, nop,
			func(g *fakeGPU) { g.linkErrors[0] = 99 }, "nvlink/link 0:C nvlink/link 1:C"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := pollTwice(tc.check(), tc.before, tc.after); got != tc.want {
				t.Fatalf("got  %q\nwant %q", got, tc.want)
			}
		})
	}
}

func TestLostCheck(t *testing.T) {
	tests := []struct {
		name   string
		uuid   string
		set    func(f *fakeNVML)
		handle bool
		want   string
	}{
		{"visible", "GPU-0", func(*fakeNVML) {}, true, "gpu-lost:C"},
		{"gpu is lost", "GPU-0", func(f *fakeNVML) { f.gpus[0].lost = true }, false, "gpu-lost:F:gpu lost (fallen off the bus)"},
		{"not visible", "GPU-9", func(*fakeNVML) {}, false, "gpu-lost:F:gpu not visible to nvml"},
		{"other nvml error", "GPU-0", func(f *fakeNVML) { f.countRet = nvml.ERROR_UNKNOWN }, false, "gpu-lost:F:nvml handle: ERROR_UNKNOWN"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeNVML(1)
			f.set(func() { tc.set(f) })
			dev, o := (&lostCheck{lib: f}).resolve(tc.uuid)
			if got := summary([]Observation{o}); got != tc.want || (dev != nil) != tc.handle {
				t.Fatalf("got %q handle=%v, want %q handle=%v", got, dev != nil, tc.want, tc.handle)
			}
		})
	}
}

func TestNVMLCheck(t *testing.T) {
	tests := []struct {
		name string
		gpus int
		set  func(f *fakeNVML)
		ok   bool
		want string
	}{
		{"working", 1, func(*fakeNVML) {}, true, "nvml/poll:C"},
		{"init fails", 1, func(f *fakeNVML) { f.initRet = nvml.ERROR_DRIVER_NOT_LOADED }, false, "nvml/poll:F:nvml init: ERROR_DRIVER_NOT_LOADED"},
		{"no library and no gpus is not a fault", 0, func(f *fakeNVML) { f.initRet = nvml.ERROR_LIBRARY_NOT_FOUND }, false, "nvml/poll:C"},
		{"no library with gpus is a fault", 1, func(f *fakeNVML) { f.initRet = nvml.ERROR_LIBRARY_NOT_FOUND }, false, "nvml/poll:F:nvml init: ERROR_LIBRARY_NOT_FOUND"},
		{"device count fails", 1, func(f *fakeNVML) { f.countRet = nvml.ERROR_UNKNOWN }, false, "nvml/poll:F:nvml device count: ERROR_UNKNOWN"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeNVML(tc.gpus)
			f.set(func() { tc.set(f) })
			o, ok := (&nvmlCheck{lib: f}).probe(tc.gpus)
			if got := summary([]Observation{o}); got != tc.want || ok != tc.ok {
				t.Fatalf("got %q ok=%v, want %q ok=%v", got, ok, tc.want, tc.ok)
			}
		})
	}
}
