package metrics

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
)

func TestUnitConversions(t *testing.T) {
	tests := []struct {
		name string
		f    field
		v    nvmlowner.Value
		want float64
		ok   bool
	}{
		{"framebuffer bytes to whole MiB", fieldFBUsed, nvmlowner.Value{V: 3*mib + mib/2, Status: nvmlowner.OK}, 3, true},
		{"power mW to W", fieldPowerUsage, nvmlowner.Value{V: 100500, Status: nvmlowner.OK}, 100.5, true},
		{"energy stays mJ", fieldTotalEnergy, nvmlowner.Value{V: 123456789, Status: nvmlowner.OK}, 123456789, true},
		{"not supported has no value", fieldGPUTemp, nvmlowner.Value{Status: nvmlowner.NotSupported}, 0, false},
		{"failed has no value", fieldGPUTemp, nvmlowner.Value{Status: nvmlowner.Failed, Err: nvml.ERROR_UNKNOWN}, 0, false},
		{"absent has no value", fieldGPUTemp, nvmlowner.Value{}, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := valueOf(tt.f, tt.v)
			if got != tt.want || ok != tt.ok {
				t.Errorf("valueOf = %v, %v; want %v, %v", got, ok, tt.want, tt.ok)
			}
		})
	}
}

func TestSampleError(t *testing.T) {
	with := func(f nvmlowner.Field, v nvmlowner.Value) nvmlowner.Sample {
		var s nvmlowner.Sample
		s.Values[f] = v
		return s
	}
	tests := []struct {
		name string
		s    nvmlowner.Sample
		want string // substring of the error; "" for none
	}{
		{"all fine", with(nvmlowner.FieldGPUTemp, nvmlowner.Value{V: 40, Status: nvmlowner.OK}), ""},
		{"not supported is no data", with(nvmlowner.FieldRetiredSBE, nvmlowner.Value{Status: nvmlowner.NotSupported}), ""},
		{"no permission is no data", with(nvmlowner.FieldECCSBEAggregate, nvmlowner.Value{Status: nvmlowner.NoPermission}), ""},
		{"failed field", with(nvmlowner.FieldPowerUsage, nvmlowner.Value{Status: nvmlowner.Failed, Err: nvml.ERROR_UNKNOWN}), "read power-usage"},
		{"gpu not read", nvmlowner.Sample{Err: &nvmlowner.CallError{What: "sample", Err: nvmlowner.ErrTimeout}}, "timed out"},
		{"failed mig read", nvmlowner.Sample{MIG: []nvmlowner.MIGSample{{
			UUID: "MIG-1", FBUsed: nvmlowner.Value{Status: nvmlowner.Failed, Err: nvml.ERROR_UNKNOWN},
		}}}, "read mig MIG-1 fb-used"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := sampleError(&tt.s)
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("sampleError = %v, want nil", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("sampleError = %v, want one containing %q", err, tt.want)
			}
		})
	}
	// The NVML return stays inspectable.
	s := with(nvmlowner.FieldGPUTemp, nvmlowner.Value{Status: nvmlowner.Failed, Err: nvml.ERROR_UNKNOWN})
	if err := sampleError(&s); !errors.Is(err, nvml.ERROR_UNKNOWN) {
		t.Errorf("sampleError = %v, want it to wrap ERROR_UNKNOWN", err)
	}
}

// TestFailureIsLoggedOncePerEpisode checks the log stays quiet while a GPU
// keeps failing: one warning when it starts, one info when it recovers.
func TestFailureIsLoggedOncePerEpisode(t *testing.T) {
	mn := newMockNode(t, 2, nil)
	failing := true
	mn.devs[1].GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) {
		if failing {
			return 0, nvml.ERROR_GPU_IS_LOST
		}
		return 40, nvml.SUCCESS
	}
	var logs bytes.Buffer
	c, err := NewCollector(newSampler(t, mn.lib, mn.node, patientTimeout), Config{}, prometheus.NewRegistry(),
		slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})))
	if err != nil {
		t.Fatal(err)
	}
	c.SetNode(mn.node)
	for range 3 {
		collectNow(t, c)
	}
	failing = false
	for range 2 {
		collectNow(t, c)
	}
	out := logs.String()
	if n := strings.Count(out, `msg="gpu readings failed"`); n != 1 {
		t.Errorf("%d failure lines over 3 failing cycles, want 1:\n%s", n, out)
	}
	if !strings.Contains(out, "GPU_IS_LOST") && !strings.Contains(out, "GPU is lost") {
		t.Errorf("failure line does not say why:\n%s", out)
	}
	if n := strings.Count(out, `msg="gpu readings recovered"`); n != 1 {
		t.Errorf("%d recovery lines, want 1:\n%s", n, out)
	}
	// Everything else logged is the one-time no-data notice per reading.
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if !strings.Contains(line, "gpu readings") && !strings.Contains(line, "nvml reading unavailable") {
			t.Errorf("unexpected log line: %s", line)
		}
	}
}
