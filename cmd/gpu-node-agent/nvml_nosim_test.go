//go:build !simulator

package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
)

// TestNVMLCensusWithoutSimulator: the product binary's census refuses
// --simulate as every other command does.
func TestNVMLCensusWithoutSimulator(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := run([]string{"nvml", "census", "--simulate", "dgx-h100"}, &stdout, &stderr, func(string) string { return "" })
	if code != 2 || !strings.Contains(stderr.String(), errNoSimulator.Error()) {
		t.Errorf("exit %d, stderr %q; want 2 and %q", code, stderr.String(), errNoSimulator)
	}
}

// TestNVMLCensusWithoutNVML runs the product's census on this machine's
// real NVML: without libnvidia-ml.so.1 it fails, exit status 1, saying
// NVML cannot be initialised, and prints no census.
func TestNVMLCensusWithoutNVML(t *testing.T) {
	if lib := nvmlowner.Real(); lib.Init() == nvml.SUCCESS {
		lib.Shutdown()
		t.Skip("NVML loads here; this test is for machines without it")
	}
	var stdout, stderr bytes.Buffer
	code := run([]string{"nvml", "census", "--log-level", "error"}, &stdout, &stderr, func(string) string { return "" })
	if code != 1 || stdout.Len() != 0 || !strings.Contains(stderr.String(), "gpu-node-agent nvml census: NVML cannot be initialised: nvml init: ERROR_LIBRARY_NOT_FOUND") {
		t.Errorf("exit %d\nstdout %.200q\nstderr %s", code, stdout.String(), stderr.String())
	}
}
