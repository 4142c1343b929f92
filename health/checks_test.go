package health

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
)

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// summary renders observations as "key:F|E|C|I|R[:reason]" for comparison:
// Fatal, fatal Event, Cleared, Informational, Reset evidence; a held fatal
// cause is "H".
func summary(obs []Observation) string {
	var parts []string
	for _, o := range obs {
		k := "I"
		switch {
		case o.Reset:
			k = "R"
		case o.Fatal && o.HoldUntilReset:
			k = "H"
		case o.Fatal && o.Event:
			k = "E"
		case o.Fatal:
			k = "F"
		case o.Cleared:
			k = "C"
		}
		s := o.causeKey() + ":" + k
		if o.Fatal || o.Reset {
			s += ":" + o.Reason
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, " ")
}

// healthySample is a Hopper GPU on an NVSwitch fabric as NVML reports it
// when all is well: retired pages NOT_SUPPORTED (row remapping instead),
// two NVLinks up with zero error counters, fabric registration completed,
// no recovery action.
func healthySample() *nvmlowner.Sample {
	s := &nvmlowner.Sample{UUID: "GPU-0"}
	for f := range nvmlowner.NumFields {
		s.Values[f] = nvmlowner.Value{Status: nvmlowner.OK}
	}
	s.Values[nvmlowner.FieldECCMode].V = 1
	s.Values[nvmlowner.FieldTotalEnergy].V = 1000
	s.Values[nvmlowner.FieldFabricState].V = nvml.GPU_FABRIC_STATE_COMPLETED
	for _, f := range []nvmlowner.Field{nvmlowner.FieldRetiredSBE, nvmlowner.FieldRetiredDBE, nvmlowner.FieldRetiredPending} {
		s.Values[f] = nvmlowner.Value{Status: nvmlowner.NotSupported}
	}
	for l := range 2 {
		lk := nvmlowner.Link{Link: l, Up: nvmlowner.Value{V: 1, Status: nvmlowner.OK}}
		for i := range lk.Counters {
			lk.Counters[i] = nvmlowner.Value{Status: nvmlowner.OK}
		}
		s.Links = append(s.Links, lk)
	}
	return s
}

func set(f nvmlowner.Field, v uint64) func(*nvmlowner.Sample) {
	return func(s *nvmlowner.Sample) { s.Values[f] = nvmlowner.Value{V: v, Status: nvmlowner.OK} }
}

func status(f nvmlowner.Field, st nvmlowner.Status) func(*nvmlowner.Sample) {
	return func(s *nvmlowner.Sample) { s.Values[f] = nvmlowner.Value{Status: st} }
}

func linkDown(l int) func(*nvmlowner.Sample) {
	return func(s *nvmlowner.Sample) { s.Links[l].Up.V = 0; s.Links[l].Counters = [4]nvmlowner.Value{} }
}

func linkErrors(l int, n uint64) func(*nvmlowner.Sample) {
	return func(s *nvmlowner.Sample) {
		for i := range s.Links[l].Counters {
			if s.Links[l].Counters[i].Status == nvmlowner.OK {
				s.Links[l].Counters[i].V = n
			}
		}
	}
}

func countersUnsupported(s *nvmlowner.Sample) {
	for l := range s.Links {
		s.Links[l].Counters = [4]nvmlowner.Value{{Status: nvmlowner.NotSupported}, {Status: nvmlowner.NotSupported},
			{Status: nvmlowner.NotSupported}, {Status: nvmlowner.NotSupported}}
	}
}

func withErr(err error) func(*nvmlowner.Sample) { return func(s *nvmlowner.Sample) { s.Err = err } }

func build(mods []func(*nvmlowner.Sample)) *nvmlowner.Sample {
	s := healthySample()
	for _, m := range mods {
		m(s)
	}
	return s
}

// TestSampleChecks runs each check as the pure function it is: a previous
// sample (or none), the current one, baselines and the topology's expected
// links in; observations and baselines out.
func TestSampleChecks(t *testing.T) {
	none := []func(*nvmlowner.Sample){}
	type mods = []func(*nvmlowner.Sample)
	tests := []struct {
		name      string
		run       func(*checkInput, *checkResult)
		prev      mods // nil: no previous sample
		cur       mods
		baselines map[string]uint64
		expected  int
		want      string
		wantBase  string
	}{
		{name: "ecc healthy sets the baseline", run: checkECC, cur: none, want: "ecc/dbe:C", wantBase: "ecc-dbe-volatile=0"},
		{name: "ecc dbe rise is held until reset", run: checkECC, cur: mods{set(nvmlowner.FieldECCDBEVolatile, 2)},
			baselines: map[string]uint64{baselineDBE: 0}, want: "ecc/dbe:H:2 volatile double-bit ECC errors"},
		{name: "ecc count at first sight is the baseline", run: checkECC, cur: mods{set(nvmlowner.FieldECCDBEVolatile, 3)},
			want: "ecc/dbe:C", wantBase: "ecc-dbe-volatile=3"},
		{name: "ecc baseline survives a restart", run: checkECC, cur: mods{set(nvmlowner.FieldECCDBEVolatile, 3)},
			baselines: map[string]uint64{baselineDBE: 1}, want: "ecc/dbe:H:2 volatile double-bit ECC errors"},
		{name: "ecc count below baseline is a new baseline", run: checkECC, cur: none,
			baselines: map[string]uint64{baselineDBE: 4}, want: "ecc/dbe:C", wantBase: "ecc-dbe-volatile=0"},
		{name: "ecc disabled says nothing", run: checkECC, cur: mods{set(nvmlowner.FieldECCMode, 0), set(nvmlowner.FieldECCDBEVolatile, 5)}, want: ""},
		{name: "ecc not supported says nothing", run: checkECC, cur: mods{status(nvmlowner.FieldECCMode, nvmlowner.NotSupported),
			status(nvmlowner.FieldECCDBEVolatile, nvmlowner.NotSupported)}, want: ""},
		{name: "ecc no permission says nothing", run: checkECC, cur: mods{status(nvmlowner.FieldECCDBEVolatile, nvmlowner.NoPermission)}, want: ""},

		{name: "retired not supported on hopper says nothing", run: checkRetired, cur: none, want: ""},
		{name: "retired healthy", run: checkRetired, cur: mods{set(nvmlowner.FieldRetiredPending, 0), set(nvmlowner.FieldRetiredSBE, 0), set(nvmlowner.FieldRetiredDBE, 0)},
			want: "retired-pages/pending:C retired-pages/limit:C"},
		{name: "retired pending", run: checkRetired, cur: mods{set(nvmlowner.FieldRetiredPending, 1), set(nvmlowner.FieldRetiredSBE, 0), set(nvmlowner.FieldRetiredDBE, 0)},
			want: "retired-pages/pending:F:retired pages pending (reset required) retired-pages/limit:C"},
		{name: "retired over limit", run: checkRetired, cur: mods{set(nvmlowner.FieldRetiredPending, 0), set(nvmlowner.FieldRetiredSBE, 40), set(nvmlowner.FieldRetiredDBE, 21)},
			want: "retired-pages/pending:C retired-pages/limit:F:61 retired pages (limit 60)"},
		{name: "retired at limit", run: checkRetired, cur: mods{set(nvmlowner.FieldRetiredPending, 0), set(nvmlowner.FieldRetiredSBE, 60), set(nvmlowner.FieldRetiredDBE, 0)},
			want: "retired-pages/pending:C retired-pages/limit:C"},

		{name: "remap healthy", run: checkRemap, cur: none, want: "row-remap/pending:C row-remap/failure:C"},
		{name: "remap pending", run: checkRemap, cur: mods{set(nvmlowner.FieldRemapPending, 1)},
			want: "row-remap/pending:F:row remapping pending (reset required) row-remap/failure:C"},
		{name: "remap failure", run: checkRemap, cur: mods{set(nvmlowner.FieldRemapFailure, 1)},
			want: "row-remap/pending:C row-remap/failure:F:row remapping failure"},
		{name: "remap not supported on volta says nothing", run: checkRemap, cur: mods{status(nvmlowner.FieldRemapPending, nvmlowner.NotSupported),
			status(nvmlowner.FieldRemapFailure, nvmlowner.NotSupported)}, want: ""},

		{name: "nvlink up", run: checkNVLink, prev: none, cur: none, baselines: map[string]uint64{"nvlink-up-0": 1, "nvlink-up-1": 1},
			want: "nvlink/link 0:C nvlink/link 1:C"},
		{name: "nvlink first seen up is remembered", run: checkNVLink, cur: none, want: "nvlink/link 0:C nvlink/link 1:C",
			wantBase: "nvlink-up-0=1 nvlink-up-1=1"},
		{name: "nvlink seen up then down", run: checkNVLink, prev: none, cur: mods{linkDown(1)},
			baselines: map[string]uint64{"nvlink-up-0": 1, "nvlink-up-1": 1}, want: "nvlink/link 0:C nvlink/link 1:F:nvlink 1 down"},
		{name: "nvlink never seen up and not wired is absent", run: checkNVLink, cur: mods{linkDown(1)},
			want: "nvlink/link 0:C", wantBase: "nvlink-up-0=1"},
		{name: "nvlink wired but never up is down", run: checkNVLink, cur: mods{linkDown(1)}, expected: 2,
			want: "nvlink/link 0:C nvlink/link 1:F:nvlink 1 down", wantBase: "nvlink-up-0=1"},
		{name: "nvlink error jump", run: checkNVLink, prev: none, cur: mods{linkErrors(0, 40)},
			baselines: map[string]uint64{"nvlink-up-0": 1, "nvlink-up-1": 1},
			want:      "nvlink/link 0:C nvlink/link 0 errors:E:nvlink 0 errors rose by 160 nvlink/link 1:C"},
		{name: "nvlink small error rise", run: checkNVLink, prev: none, cur: mods{linkErrors(0, 24)},
			baselines: map[string]uint64{"nvlink-up-0": 1, "nvlink-up-1": 1}, want: "nvlink/link 0:C nvlink/link 1:C"},
		{name: "nvlink counters not supported (blackwell): state still checked", run: checkNVLink, prev: mods{countersUnsupported},
			cur: mods{countersUnsupported, linkDown(0)}, baselines: map[string]uint64{"nvlink-up-0": 1, "nvlink-up-1": 1},
			want: "nvlink/link 0:F:nvlink 0 down nvlink/link 1:C"},
		{name: "nvlink on blackwell: recovery events count instead", run: checkNVLink,
			prev:      mods{countersUnsupported, func(s *nvmlowner.Sample) { s.Links[1].Recoveries = nvmlowner.Value{V: 3, Status: nvmlowner.OK} }},
			cur:       mods{countersUnsupported, func(s *nvmlowner.Sample) { s.Links[1].Recoveries = nvmlowner.Value{V: 103, Status: nvmlowner.OK} }},
			baselines: map[string]uint64{"nvlink-up-0": 1, "nvlink-up-1": 1},
			want:      "nvlink/link 0:C nvlink/link 1:C nvlink/link 1 errors:E:nvlink 1 errors rose by 100"},
		{name: "nvlink one counter unsupported, the others count", run: checkNVLink, prev: mods{func(s *nvmlowner.Sample) {
			s.Links[0].Counters[0] = nvmlowner.Value{Status: nvmlowner.NotSupported}
		}}, cur: mods{func(s *nvmlowner.Sample) {
			s.Links[0].Counters[0] = nvmlowner.Value{Status: nvmlowner.NotSupported}
			s.Links[0].Counters[2].V = 150
		}}, baselines: map[string]uint64{"nvlink-up-0": 1, "nvlink-up-1": 1},
			want: "nvlink/link 0:C nvlink/link 0 errors:E:nvlink 0 errors rose by 150 nvlink/link 1:C"},

		{name: "fabric completed", run: checkFabric, cur: none, want: "fabric-not-ready:C"},
		{name: "fabric in progress", run: checkFabric, cur: mods{set(nvmlowner.FieldFabricState, nvml.GPU_FABRIC_STATE_IN_PROGRESS)},
			want: "fabric-not-ready:F:nvswitch fabric registration in progress"},
		{name: "fabric completed with failure status", run: checkFabric, cur: mods{set(nvmlowner.FieldFabricStatus, uint64(nvml.ERROR_UNKNOWN))},
			want: "fabric-not-ready:F:nvswitch fabric registration failed: ERROR_UNKNOWN"},
		{name: "fabric not supported says nothing", run: checkFabric, cur: mods{status(nvmlowner.FieldFabricState, nvmlowner.NotSupported)}, want: ""},
		{name: "fabric state not supported says nothing", run: checkFabric, cur: mods{set(nvmlowner.FieldFabricState, nvml.GPU_FABRIC_STATE_NOT_SUPPORTED)}, want: ""},

		{name: "recovery none", run: checkRecoveryAction, cur: none, want: "recovery-action:C"},
		{name: "recovery gpu reset is held", run: checkRecoveryAction, cur: mods{set(nvmlowner.FieldRecoveryAction, uint64(nvml.GPU_RECOVERY_ACTION_GPU_RESET))},
			want: "recovery-action:H:driver requests a gpu reset"},
		{name: "recovery node reboot is held", run: checkRecoveryAction, cur: mods{set(nvmlowner.FieldRecoveryAction, uint64(nvml.GPU_RECOVERY_ACTION_NODE_REBOOT))},
			want: "recovery-action:H:driver requests a node reboot"},
		{name: "recovery drain p2p", run: checkRecoveryAction, cur: mods{set(nvmlowner.FieldRecoveryAction, uint64(nvml.GPU_RECOVERY_ACTION_DRAIN_P2P))},
			want: "recovery-action:F:driver requests draining peer-to-peer traffic"},
		{name: "recovery field missing in older drivers says nothing", run: checkRecoveryAction,
			cur: mods{status(nvmlowner.FieldRecoveryAction, nvmlowner.NotSupported)}, want: ""},

		{name: "reset: nothing changed", run: checkReset, prev: none, cur: none, want: ""},
		{name: "reset: first sample is no evidence", run: checkReset, cur: none, want: ""},
		{name: "reset: volatile dbe dropped", run: checkReset, prev: mods{set(nvmlowner.FieldECCDBEVolatile, 2)}, cur: none,
			want: "reset:R:volatile double-bit ECC count dropped"},
		{name: "reset: volatile dbe below baseline after restart", run: checkReset, cur: none, baselines: map[string]uint64{baselineDBE: 2},
			want: "reset:R:volatile double-bit ECC count below its baseline"},
		{name: "reset: energy counter restarted (driver reload)", run: checkReset, prev: mods{set(nvmlowner.FieldTotalEnergy, 5000)}, cur: none,
			want: "reset:R:energy counter restarted"},
		{name: "reset: recovery action back to none", run: checkReset, prev: mods{set(nvmlowner.FieldRecoveryAction, uint64(nvml.GPU_RECOVERY_ACTION_GPU_RESET))},
			cur: none, want: "reset:R:driver recovery action back to none"},
		{name: "reset: pending remap completed", run: checkReset, prev: mods{set(nvmlowner.FieldRemapPending, 1)}, cur: none,
			want: "reset:R:pending row remap completed"},
		{name: "reset: gpu back after lost", run: checkReset, prev: mods{withErr(nvml.ERROR_GPU_IS_LOST)}, cur: none,
			want: "reset:R:gpu answers again after being lost"},
		{name: "reset: a counter that is not supported is no evidence", run: checkReset, prev: mods{set(nvmlowner.FieldTotalEnergy, 5000)},
			cur: mods{status(nvmlowner.FieldTotalEnergy, nvmlowner.NotSupported)}, want: ""},

		{name: "lost: visible", run: checkLost, cur: none, want: "gpu-lost:C nvml-timeout:C"},
		{name: "lost: fallen off the bus", run: checkLost, cur: mods{withErr(fmt.Errorf("sample: %w", nvml.ERROR_GPU_IS_LOST))},
			want: "gpu-lost:F:gpu lost (fallen off the bus) nvml-timeout:C"},
		{name: "lost: not found", run: checkLost, cur: mods{withErr(nvml.ERROR_NOT_FOUND)},
			want: "gpu-lost:F:gpu not visible to nvml nvml-timeout:C"},
		{name: "lost: hung", run: checkLost, cur: mods{withErr(&nvmlowner.CallError{What: "sample", Err: nvmlowner.ErrTimeout})},
			want: "gpu-lost:C nvml-timeout:F:nvml calls hang: nvml sample: nvml call timed out"},
		{name: "lost: library failure is not this gpu's", run: checkLost, cur: mods{withErr(errors.New("nvml device count: ERROR_UNKNOWN"))}, want: ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := &checkInput{UUID: "GPU-0", Cur: build(tc.cur), Cfg: Config{}.WithDefaults(),
				Baselines: tc.baselines, ExpectedNVLinks: tc.expected}
			if tc.prev != nil {
				in.Prev = build(tc.prev)
			}
			var out checkResult
			tc.run(in, &out)
			if got := summary(out.Obs); got != tc.want {
				t.Errorf("observations\ngot  %q\nwant %q", got, tc.want)
			}
			var base []string
			for _, k := range sortedKeys(out.Baselines) {
				base = append(base, fmt.Sprintf("%s=%d", k, out.Baselines[k]))
			}
			if got := strings.Join(base, " "); got != tc.wantBase {
				t.Errorf("baselines\ngot  %q\nwant %q", got, tc.wantBase)
			}
		})
	}
}

// TestRunSampleChecks checks the set: a GPU that could not be read gets
// only the lost/timeout verdict, and disabled checks stay silent.
func TestRunSampleChecks(t *testing.T) {
	cfg := Config{DisabledChecks: []string{CheckECC, CheckNVLink, CheckFabric, CheckRemap, CheckRecovery}}.WithDefaults()
	res := runSampleChecks(&checkInput{UUID: "GPU-0", Cur: build(nil), Cfg: cfg})
	if got, want := summary(res.Obs), "gpu-lost:C nvml-timeout:C"; got != want {
		t.Errorf("disabled checks: got %q, want %q", got, want)
	}
	hung := build([]func(*nvmlowner.Sample){withErr(&nvmlowner.CallError{What: "sample", Err: nvmlowner.ErrTimeout})})
	res = runSampleChecks(&checkInput{UUID: "GPU-0", Cur: hung, Prev: build(nil), Cfg: Config{}.WithDefaults()})
	if got, want := summary(res.Obs), "gpu-lost:C nvml-timeout:F:nvml calls hang: nvml sample: nvml call timed out"; got != want {
		t.Errorf("hung gpu: got %q, want %q", got, want)
	}
}

func TestNVMLObservation(t *testing.T) {
	if got := summary([]Observation{nvmlObservation(&nvmlowner.Snapshot{})}); got != "nvml/poll:C" {
		t.Errorf("working: %q", got)
	}
	snap := &nvmlowner.Snapshot{LibErr: &nvmlowner.CallError{What: "device count", Err: nvml.ERROR_UNKNOWN}}
	if got, want := summary([]Observation{nvmlObservation(snap)}), "nvml/poll:F:nvml: nvml device count: ERROR_UNKNOWN"; got != want {
		t.Errorf("failing: got %q, want %q", got, want)
	}
}

func sortedKeys(m map[string]uint64) []string {
	return slices.Sorted(maps.Keys(m))
}
