//go:build !simulator

package main

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
)

// TestNoSimulator: the product binary has no simulator. Every way of
// asking for one exits 2 with the same message, before anything touches
// the node (no device-plugin directory is created).
func TestNoSimulator(t *testing.T) {
	const want = "this binary has no simulator; use gpu-node-agent-sim"
	tests := []struct {
		name string
		args []string
		env  map[string]string
	}{
		{name: "simulate flag", args: []string{"--simulate", "dgx-h100"}},
		{name: "simulate env", env: map[string]string{"GNA_SIMULATE": "dgx-h100"}},
		{name: "sim control flag", args: []string{"--sim-control-address", "127.0.0.1:9402"}},
		{name: "sim faults flag", args: []string{"--sim-faults", "nvml-failure"}},
		{name: "demo", args: []string{"demo"}},
		{name: "topology dump simulate", args: []string{"topology", "dump", "--simulate", "dgx-h100"}},
		{name: "topology labels simulate", args: []string{"topology", "labels", "--simulate", "dgx-h100"}},
		{name: "preflight simulate", args: []string{"preflight", "--simulate", "dgx-h100"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "plugins")
			args := tc.args
			if len(args) == 0 || strings.HasPrefix(args[0], "-") {
				args = append([]string{"--device-plugin-dir", dir, "--metrics-address="}, args...)
			}
			var stdout, stderr bytes.Buffer
			code := run(args, &stdout, &stderr, func(k string) string { return tc.env[k] })
			if code != 2 || !strings.Contains(stderr.String(), want) {
				t.Errorf("exit %d, stderr %q; want 2 and %q", code, stderr.String(), want)
			}
			if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("device-plugin dir created: %v", err)
			}
		})
	}
}

// TestDefaultsValidWithoutSimulator: the product binary's defaults name no
// simulator setting, so a plain start validates.
func TestDefaultsValidWithoutSimulator(t *testing.T) {
	c, err := loadConfig(nil, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults do not validate: %v", err)
	}
}

// TestPreflightWithoutNVML runs the product's preflight on this machine's
// real NVML and /sys: without libnvidia-ml.so.1 the gpu-count item fails
// naming NVML, the per-GPU items are skipped, and the exit status is 1.
func TestPreflightWithoutNVML(t *testing.T) {
	if lib := nvmlowner.Real(); lib.Init() == nvml.SUCCESS {
		lib.Shutdown()
		t.Skip("NVML loads here; this test is for machines without it")
	}
	var stdout, stderr bytes.Buffer
	code := run([]string{"preflight", "--log-level", "error"}, &stdout, &stderr, func(string) string { return "" })
	out := stdout.String()
	if code != 1 || !strings.Contains(out, "in NVML: NVML unavailable") || !strings.Contains(out, "no GPU read: NVML unavailable") {
		t.Errorf("exit %d\n%s%s", code, out, stderr.String())
	}
}
