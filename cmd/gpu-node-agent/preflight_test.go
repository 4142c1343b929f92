//go:build simulator

package main

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
)

// preflightRun runs the preflight subcommand and returns its exit status,
// stdout and stderr.
func preflightRun(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(append([]string{"preflight", "--log-level", "error"}, args...), &stdout, &stderr, env(nil))
	return code, stdout.String(), stderr.String()
}

// row finds the table row of item on target ("node", "GPU 3", "rdma/ib mlx5_3").
func row(out, item, target string) string {
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(item) + `\s+` + regexp.QuoteMeta(target) + `(\s.*)?$`)
	return re.FindString(out)
}

// TestPreflightCommandPasses: on a simulated DGX H100 every item with
// something to judge passes; DCGM (none on a simulated node) and page
// retirement (Hopper remaps rows) are skipped.
func TestPreflightCommandPasses(t *testing.T) {
	code, out, errOut := preflightRun(t, "--simulate", "dgx-h100", "--config", "testdata/preflight.yaml")
	if code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	for _, want := range []struct{ item, target, status string }{
		{"gpu-count", "node", "PASS"},
		{"driver-version", "node", "PASS"},
		{"persistence-mode", "GPU 7 (0000:b3:00.0)", "PASS"},
		{"ecc-mode", "GPU 0 (0000:03:00.0)", "PASS"},
		{"retired-pages", "GPU 0 (0000:03:00.0)", "SKIPPED"},
		{"row-remap", "GPU 0 (0000:03:00.0)", "PASS"},
		{"pcie-link", "GPU 3 (0000:33:00.0)", "PASS"},
		{"nvlink", "GPU 5 (0000:93:00.0)", "PASS"},
		{"fabric", "GPU 1 (0000:13:00.0)", "PASS"},
		{"throttle", "GPU 2 (0000:23:00.0)", "PASS"},
		{"rdma-ports", "rdma/ib mlx5_7", "PASS"},
		{"dcgm-diag", "node", "SKIPPED"},
		{"command", "node", "PASS"},
	} {
		if r := row(out, want.item, want.target); !strings.Contains(r, want.status) {
			t.Errorf("%s %s: row %q, want %s\n%s", want.item, want.target, r, want.status, out)
		}
	}
	if !strings.HasSuffix(out, "preflight passed (11 items passed, 2 skipped)\n") {
		t.Errorf("last line:\n%s", out)
	}
}

// TestPreflightCommandFaults: each fault injected from the start fails
// its item on the faulty GPU (or the node, or the port), exit status 1,
// and nothing else fails.
func TestPreflightCommandFaults(t *testing.T) {
	tests := []struct {
		faults, item, target, detail string
	}{
		{"pcie-degraded:3", "pcie-link", "GPU 3 (0000:33:00.0)", "PCIe link gen 4 x8, max gen 5 x16: width below its maximum"},
		{"pcie-degraded:6=5x4", "pcie-link", "GPU 6 (0000:a3:00.0)", "PCIe link gen 5 x4, max gen 5 x16"},
		{"ecc-disabled:1", "ecc-mode", "GPU 1 (0000:13:00.0)", "ECC disabled (pending disabled), want enabled"},
		{"old-driver", "driver-version", "node", "driver 525.147.05, want at least 550.54.15"},
		{"old-driver=535.54.03", "driver-version", "node", "driver 535.54.03, want at least 550.54.15"},
		{"throttle:4", "throttle", "GPU 4 (0000:83:00.0)", "clocks held down by hw-slowdown"},
		{"throttle:5=sw-power-cap", "throttle", "GPU 5 (0000:93:00.0)", "clocks held down by sw-power-cap"},
		{"persistence-disabled:2", "persistence-mode", "GPU 2 (0000:23:00.0)", "persistence mode disabled"},
		{"nvlink-down:7=4", "nvlink", "GPU 7 (0000:b3:00.0)", "NVLink 4 down; 17 of 18 expected up"},
		{"fabric-not-ready:0", "fabric", "GPU 0 (0000:03:00.0)", "registration in progress"},
		{"row-remap-failure:1", "row-remap", "GPU 1 (0000:13:00.0)", "row remap failure"},
		{"port-down=mlx5_2", "rdma-ports", "rdma/ib mlx5_2", "port 1 state is DOWN, want ACTIVE/LinkUp"},
		{"gpu-missing:5", "gpu-count", "node", "on the PCI bus but not in NVML: 0000:93:00.0"},
	}
	for _, tc := range tests {
		t.Run(tc.faults, func(t *testing.T) {
			code, out, errOut := preflightRun(t, "--simulate", "dgx-h100", "--config", "testdata/preflight.yaml", "--sim-faults", tc.faults)
			if code != 1 {
				t.Fatalf("exit %d, want 1\n%s%s", code, out, errOut)
			}
			r := row(out, tc.item, tc.target)
			if !strings.Contains(r, "FAIL") || !strings.Contains(r, tc.detail) {
				t.Errorf("row %q, want FAIL with %q\n%s", r, tc.detail, out)
			}
			if n := strings.Count(out, " FAIL "); n != 1 {
				t.Errorf("%d failed rows, want 1\n%s", n, out)
			}
			if !strings.Contains(out, "preflight failed: "+tc.item+": "+tc.target+": ") {
				t.Errorf("summary does not name %s on %s\n%s", tc.item, tc.target, out)
			}
		})
	}
}

// TestPreflightCommandLostGPU: a GPU lost before start fails every per-GPU
// item on it, and only on it.
func TestPreflightCommandLostGPU(t *testing.T) {
	code, out, _ := preflightRun(t, "--simulate", "dgx-a100", "--sim-faults", "gpu-lost:6")
	if code != 1 {
		t.Fatalf("exit %d\n%s", code, out)
	}
	for _, item := range []string{"persistence-mode", "ecc-mode", "pcie-link", "nvlink", "throttle"} {
		if r := row(out, item, "GPU 6"); !strings.Contains(r, "FAIL") || !strings.Contains(r, "GPU lost or gone") {
			t.Errorf("%s on the lost GPU: %q", item, r)
		}
		if r := row(out, item, "GPU 5"); !strings.Contains(r, "PASS") {
			t.Errorf("%s beside it: %q", item, r)
		}
	}
}

func TestPreflightCommandBadConfig(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--config", "testdata/preflight-unknown-key.yaml"}, "preflight.pcie.failIdleDowngrades: unknown key (known: failIdleDowngrade)"},
		{[]string{"--preflight-expected-gpus", "-1"}, "preflight.gpuCount.expected: -1 is negative"},
		{[]string{"--sim-faults", "throttle:1=hot"}, `unknown clocks event reason "hot"`},
		{[]string{"--sim-faults", "ecc-disabled:1=yes"}, "kind ecc-disabled takes no value"},
	} {
		code, out, errOut := preflightRun(t, append([]string{"--simulate", "dgx-h100"}, tc.args...)...)
		if code != 2 || !strings.Contains(errOut, tc.want) || out != "" {
			t.Errorf("%v: exit %d, stderr %q, want 2 and %q", tc.args, code, errOut, tc.want)
		}
	}
	// A fault the simulator refuses (row remapping on Volta) is not a
	// configuration error: the node could not be built as asked.
	if code, _, errOut := preflightRun(t, "--simulate", "dgx-1v", "--sim-faults", "row-remap-pending:1"); code != 1 || !strings.Contains(errOut, "does not support row-remap") {
		t.Errorf("refused fault: exit %d, %q", code, errOut)
	}
}

// TestPreflightCommandExpectedGPUs: the flag sets the count the bus and
// NVML must show.
func TestPreflightCommandExpectedGPUs(t *testing.T) {
	code, out, _ := preflightRun(t, "--simulate", "dgx-h100", "--preflight-expected-gpus", "16")
	if r := row(out, "gpu-count", "node"); code != 1 || !strings.Contains(r, "8 GPUs on the PCI bus, 8 in NVML, 16 expected (preflight.gpuCount.expected): not the expected count") {
		t.Errorf("exit %d, row %q", code, r)
	}
}
