package metrics

import (
	"bytes"
	"context"
	"encoding/binary"
	"log/slog"
	"math"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus"
)

func TestFieldValueDecoding(t *testing.T) {
	put64 := func(v uint64) (b [8]byte) { binary.NativeEndian.PutUint64(b[:], v); return }
	put32 := func(v uint32) (b [8]byte) { binary.NativeEndian.PutUint32(b[:], v); return }
	tests := []struct {
		name   string
		typ    nvml.ValueType
		value  [8]byte
		want   float64
		wantOK bool
	}{
		{"double", nvml.VALUE_TYPE_DOUBLE, put64(math.Float64bits(41.5)), 41.5, true},
		{"unsigned int", nvml.VALUE_TYPE_UNSIGNED_INT, put32(73), 73, true},
		{"unsigned long", nvml.VALUE_TYPE_UNSIGNED_LONG, put64(1 << 40), 1 << 40, true},
		{"unsigned long long", nvml.VALUE_TYPE_UNSIGNED_LONG_LONG, put64(123456789012), 123456789012, true},
		{"signed long long", nvml.VALUE_TYPE_SIGNED_LONG_LONG, put64(uint64(0xFFFFFFFFFFFFFFFF)), -1, true},
		{"signed int", nvml.VALUE_TYPE_SIGNED_INT, put32(0xFFFFFFFE), -2, true},
		{"unsigned short", nvml.VALUE_TYPE_UNSIGNED_SHORT, put32(0x0001FFFF), 0xFFFF, true},
		{"unknown type", nvml.VALUE_TYPE_COUNT, put64(1), 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := fieldValue(nvml.FieldValue{ValueType: uint32(tt.typ), Value: tt.value})
			if got != tt.want || ok != tt.wantOK {
				t.Errorf("fieldValue = %v, %v; want %v, %v", got, ok, tt.want, tt.wantOK)
			}
		})
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
	c, err := NewCollector(mn.lib, patientConfig(Config{}), prometheus.NewRegistry(),
		slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})))
	if err != nil {
		t.Fatal(err)
	}
	c.SetNode(mn.node)
	for range 3 {
		c.CollectNow(context.Background())
	}
	failing = false
	for range 2 {
		c.CollectNow(context.Background())
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
	if n := strings.Count(out, "\n"); n != 2 {
		t.Errorf("%d log lines, want 2:\n%s", n, out)
	}
}
