package nvmlowner

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner/nvmlapi"
)

// TestHardwareNVMLUnavailable: an NVML that can't load is one error line,
// no GPU node, and is retried on every discovery until it loads.
func TestHardwareNVMLUnavailable(t *testing.T) {
	var mu sync.Mutex
	loaded := false
	shutdowns := 0
	lib := &mock.Interface{
		InitFunc: func() nvml.Return {
			mu.Lock()
			defer mu.Unlock()
			if !loaded {
				return nvml.ERROR_LIBRARY_NOT_FOUND
			}
			return nvml.SUCCESS
		},
		ShutdownFunc: func() nvml.Return {
			mu.Lock()
			defer mu.Unlock()
			shutdowns++
			return nvml.SUCCESS
		},
		DeviceGetCountFunc: func() (int, nvml.Return) { return 0, nvml.SUCCESS },
		ErrorStringFunc:    func(r nvml.Return) string { return "library not found" },
	}
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	h := NewHardware(New(nvmlapi.Wrap(lib), Config{}, log), t.TempDir(), log)
	defer h.Close()
	for i := 0; i < 3; i++ {
		if _, err := h.Discover(); !errors.Is(err, ErrUnavailable) {
			t.Fatalf("discovery %d: error = %v, want ErrUnavailable", i, err)
		}
	}
	if n := strings.Count(logs.String(), "level=ERROR"); n != 1 {
		t.Errorf("%d error lines for a failing NVML, want 1:\n%s", n, logs.String())
	}
	mu.Lock()
	loaded = true
	mu.Unlock()
	node, err := h.Discover()
	if err != nil {
		t.Fatalf("after NVML loads: %v", err)
	}
	if len(node.GPUs) != 0 {
		t.Errorf("gpus = %d, want 0", len(node.GPUs))
	}
	if h.LastNode() != node {
		t.Error("LastNode is not the node just discovered")
	}
	h.Close()
	h.Close()
	mu.Lock()
	defer mu.Unlock()
	if shutdowns != 1 {
		t.Errorf("%d Shutdown calls after one successful Init and two Close calls, want 1", shutdowns)
	}
}
