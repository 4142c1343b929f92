//go:build simulator

package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
)

// censusRun runs "nvml census" and returns its exit status, stdout and
// stderr.
func censusRun(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(append([]string{"nvml", "census"}, args...), &stdout, &stderr, env(nil))
	return code, stdout.String(), stderr.String()
}

func decodeCensus(t *testing.T, b []byte) nvmlowner.Census {
	t.Helper()
	var c nvmlowner.Census
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatalf("census is not JSON: %v\n%.500s", err, b)
	}
	return c
}

// TestNVMLCensusCommand: a census of a simulated DGX H100 with MIG on GPU
// 0, to stdout and to a file.
func TestNVMLCensusCommand(t *testing.T) {
	const simulate = "dgx-h100,mig=0:3g.40gb+2g.20gb+1g.10gb+1g.10gb"
	code, out, errOut := censusRun(t, "--simulate", simulate)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	c := decodeCensus(t, []byte(out))
	gpus, migs := 0, 0
	for _, d := range c.Devices {
		switch {
		case d.Parent == nil:
			gpus++
		case *d.Parent == 0 && strings.HasPrefix(d.UUID, "MIG-"):
			migs++
		default:
			t.Errorf("MIG device %+v", d)
		}
		if len(d.Calls) == 0 {
			t.Errorf("device %d: no calls", d.Index)
		}
	}
	if c.DeviceCount != 8 || gpus != 8 || migs != 4 || len(c.Events) == 0 {
		t.Errorf("device count %d, %d GPUs, %d MIG devices on GPU 0, %d event sets", c.DeviceCount, gpus, migs, len(c.Events))
	}
	if !strings.HasPrefix(out, "{\n  \"callTimeout\": \"5s\",") {
		t.Errorf("not indented JSON with the default call timeout: %.80s", out)
	}

	file := filepath.Join(t.TempDir(), "census.json")
	code, out, errOut = censusRun(t, "--simulate", "dgx-a100", "-o", file)
	if code != 0 || out != "" {
		t.Fatalf("-o: exit %d, stdout %.80q, stderr %s", code, out, errOut)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if c := decodeCensus(t, b); c.DeviceCount != 8 || len(c.Devices) != 8 {
		t.Errorf("-o: %d devices", c.DeviceCount)
	}
}

// TestNVMLCensusCommandHungGPU: a hung GPU is data (exit 0): its call is
// recorded as timed out, the other GPUs answer.
func TestNVMLCensusCommandHungGPU(t *testing.T) {
	code, out, errOut := censusRun(t, "--simulate", "dgx-h100", "--sim-faults", "hang:3", "--nvml-call-timeout", "1s")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	c := decodeCensus(t, []byte(out))
	if c.CallTimeout != "1s" || len(c.Devices) != 8 {
		t.Fatalf("call timeout %s, %d devices", c.CallTimeout, len(c.Devices))
	}
	for _, d := range c.Devices {
		first := d.Calls[0]
		if hung := first.Ret == nvmlowner.CensusCallTimeout; hung != (d.Index == 3) || (d.Index != 3 && len(d.Calls) < 100) {
			t.Errorf("GPU %d: first call %s %s, %d calls", d.Index, first.Method, first.Ret, len(d.Calls))
		}
	}
}

func TestNVMLCensusCommandErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"nvml cannot be initialised", []string{"census", "--simulate", "dgx-h100", "--sim-faults", "nvml-failure"}, 1, "nvml census: NVML cannot be initialised: nvml init: ERROR_UNKNOWN\n"},
		{"unknown profile", []string{"census", "--simulate", "dgx-h999"}, 2, `unknown profile "dgx-h999"`},
		{"unknown flag", []string{"census", "--mig-strategy", "mixed"}, 2, "flag provided but not defined: -mig-strategy"},
		{"argument", []string{"census", "now"}, 2, `unexpected argument "now"`},
		{"timeout too short", []string{"census", "--simulate", "dgx-h100", "--nvml-call-timeout", "1ms"}, 2, "nvml-call-timeout: 1ms is below 10ms"},
		{"no command", nil, 2, "usage: gpu-node-agent nvml census"},
		{"unknown command", []string{"dump"}, 2, `unknown command "dump" (census)`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(append([]string{"nvml"}, tc.args...), &stdout, &stderr, env(nil))
			if code != tc.code || !strings.Contains(stderr.String(), tc.want) || stdout.Len() != 0 {
				t.Errorf("exit %d, stdout %.80q, stderr %q; want %d and %q", code, stdout.String(), stderr.String(), tc.code, tc.want)
			}
		})
	}
}
