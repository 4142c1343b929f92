package preflight

import (
	"errors"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
)

var h100 = gpu{index: 3, uuid: "GPU-3", busID: "0000:1b:00.0", model: "NVIDIA H100 80GB HBM3"}

func v(x uint64) nvmlowner.Value { return nvmlowner.Value{V: x, Status: nvmlowner.OK} }

var (
	notSupported = nvmlowner.Value{Status: nvmlowner.NotSupported}
	noPermission = nvmlowner.Value{Status: nvmlowner.NoPermission}
	failed       = nvmlowner.Value{Status: nvmlowner.Failed, Err: nvml.ERROR_UNKNOWN}
)

// healthy is what a healthy, busy H100 SXM5 on a DGX H100 answers.
func healthy() *nvmlowner.PreflightSample {
	s := &nvmlowner.PreflightSample{
		UUID:    "GPU-3",
		PCIeGen: v(5), PCIeWidth: v(16), PCIeMaxGen: v(5), PCIeMaxWidth: v(16),
		Persistence: v(1), ECCCurrent: v(1), ECCPending: v(1),
		ClocksEventReasons: v(0), RetiredPending: notSupported, RemapPending: v(0), RemapFailure: v(0),
		FabricState: v(nvml.GPU_FABRIC_STATE_COMPLETED), FabricStatus: v(uint64(nvml.SUCCESS)),
	}
	for l := range 18 {
		s.NVLinks = append(s.NVLinks, nvmlowner.NVLinkState{Link: l, Up: v(1)})
	}
	return s
}

// TestGPUItems: each per-GPU item passes on a healthy GPU and fails (or
// skips, where the GPU gives no data) on what breaks it, naming the GPU
// and what was seen against what was expected.
func TestGPUItems(t *testing.T) {
	tests := []struct {
		name   string
		item   string
		cfg    func(*Config)
		gpu    *gpu
		sample func(*nvmlowner.PreflightSample)
		status Status
		detail string // a substring of the detail
	}{
		{name: "persistence on", item: ItemPersistence, status: Pass, detail: "persistence mode enabled"},
		{name: "persistence off", item: ItemPersistence, sample: func(s *nvmlowner.PreflightSample) { s.Persistence = v(0) },
			status: Fail, detail: "persistence mode disabled, want enabled"},
		{name: "persistence not readable", item: ItemPersistence, sample: func(s *nvmlowner.PreflightSample) { s.Persistence = failed },
			status: Fail, detail: "persistence mode not read: ERROR_UNKNOWN"},

		{name: "ecc on", item: ItemECC, status: Pass, detail: "ECC enabled"},
		{name: "ecc off", item: ItemECC, sample: func(s *nvmlowner.PreflightSample) { s.ECCCurrent, s.ECCPending = v(0), v(0) },
			status: Fail, detail: "ECC disabled (pending disabled), want enabled"},
		{name: "ecc off until reboot", item: ItemECC, sample: func(s *nvmlowner.PreflightSample) { s.ECCCurrent = v(0) },
			status: Fail, detail: "ECC disabled (pending enabled), want enabled"},
		{name: "ecc off after reboot", item: ItemECC, sample: func(s *nvmlowner.PreflightSample) { s.ECCPending = v(0) },
			status: Fail, detail: "pending disabled: off after the next reboot"},
		{name: "ecc unsupported", item: ItemECC, sample: func(s *nvmlowner.PreflightSample) { s.ECCCurrent, s.ECCPending = notSupported, notSupported },
			status: Skipped, detail: "ECC mode not supported on this GPU"},

		{name: "no page pending (Volta)", item: ItemRetiredPages, sample: func(s *nvmlowner.PreflightSample) { s.RetiredPending = v(0) },
			status: Pass, detail: "no page pending retirement"},
		{name: "page pending (Volta)", item: ItemRetiredPages, sample: func(s *nvmlowner.PreflightSample) { s.RetiredPending = v(1) },
			status: Fail, detail: "a page is pending retirement, want none"},
		{name: "page retirement on Hopper", item: ItemRetiredPages, status: Skipped, detail: "remap rows instead"},

		{name: "no remap", item: ItemRowRemap, status: Pass, detail: "no row remap pending or failed"},
		{name: "remap pending", item: ItemRowRemap, sample: func(s *nvmlowner.PreflightSample) { s.RemapPending = v(1) },
			status: Fail, detail: "a row remap is pending, want none"},
		{name: "remap failure", item: ItemRowRemap, sample: func(s *nvmlowner.PreflightSample) { s.RemapFailure = v(1) },
			status: Fail, detail: "row remap failure"},
		{name: "remap with MIG on", item: ItemRowRemap, sample: func(s *nvmlowner.PreflightSample) { s.RemapPending, s.RemapFailure = notSupported, notSupported },
			status: Skipped, detail: "or MIG enabled"},

		{name: "pcie at max", item: ItemPCIe, status: Pass, detail: "PCIe link gen 5 x16, max gen 5 x16"},
		{name: "pcie degraded", item: ItemPCIe, sample: func(s *nvmlowner.PreflightSample) { s.PCIeGen, s.PCIeWidth = v(4), v(8) },
			status: Fail, detail: "PCIe link gen 4 x8, max gen 5 x16: width below its maximum"},
		{name: "pcie generation down", item: ItemPCIe, sample: func(s *nvmlowner.PreflightSample) { s.PCIeGen = v(3) },
			status: Fail, detail: "PCIe link gen 3 x16, max gen 5 x16: generation below its maximum"},
		{name: "pcie idle slows", item: ItemPCIe, sample: func(s *nvmlowner.PreflightSample) {
			s.PCIeGen, s.ClocksEventReasons = v(1), v(nvml.ClocksEventReasonGpuIdle)
		}, status: Pass, detail: "generation not judged while the GPU is idle"},
		{name: "pcie idle slows, strict", item: ItemPCIe, cfg: func(c *Config) { c.PCIe.FailIdleDowngrade = true }, sample: func(s *nvmlowner.PreflightSample) {
			s.PCIeGen, s.ClocksEventReasons = v(1), v(nvml.ClocksEventReasonGpuIdle)
		}, status: Fail, detail: "gen 1 x16, max gen 5 x16: generation below its maximum"},
		{name: "pcie idle narrow", item: ItemPCIe, sample: func(s *nvmlowner.PreflightSample) {
			s.PCIeGen, s.PCIeWidth, s.ClocksEventReasons = v(1), v(8), v(nvml.ClocksEventReasonGpuIdle)
		}, status: Fail, detail: "width below its maximum"},
		{name: "pcie unknown", item: ItemPCIe, sample: func(s *nvmlowner.PreflightSample) { s.PCIeMaxWidth = notSupported },
			status: Skipped, detail: "PCIe max link width not supported"},

		{name: "nvlinks up", item: ItemNVLink, status: Pass, detail: "18 of 18 NVLinks up"},
		{name: "nvlink down", item: ItemNVLink, sample: func(s *nvmlowner.PreflightSample) { s.NVLinks[7].Up = v(0); s.NVLinks[11].Up = v(0) },
			status: Fail, detail: "NVLink 7, 11 down; 16 of 18 expected up (NVIDIA H100 80GB HBM3)"},
		{name: "nvlink missing", item: ItemNVLink, sample: func(s *nvmlowner.PreflightSample) { s.NVLinks = s.NVLinks[:12] },
			status: Fail, detail: "NVLink 12, 13, 14, 15, 16, 17 down"},
		{name: "nvlink unreadable", item: ItemNVLink, sample: func(s *nvmlowner.PreflightSample) { s.NVLinks[2].Up = failed },
			status: Fail, detail: "NVLink 2 state not read"},
		{name: "nvlinks on a PCIe card", item: ItemNVLink, gpu: &gpu{index: 0, uuid: "GPU-0", busID: "0000:17:00.0", model: "NVIDIA A100-PCIE-80GB"},
			sample: func(s *nvmlowner.PreflightSample) { s.NVLinks = nil }, status: Skipped, detail: "no NVLink expected (NVIDIA A100-PCIE-80GB wires none"},
		{name: "nvlinks configured", item: ItemNVLink, cfg: func(c *Config) { c.NVLink.Expected = 4 },
			gpu:    &gpu{index: 0, uuid: "GPU-0", busID: "0000:17:00.0", model: "NVIDIA A100-PCIE-80GB"},
			sample: func(s *nvmlowner.PreflightSample) { s.NVLinks = s.NVLinks[:3] }, status: Fail, detail: "NVLink 3 down; 3 of 4 expected up (nvlink.expected)"},

		{name: "fabric completed", item: ItemFabric, status: Pass, detail: "registration completed"},
		{name: "fabric in progress", item: ItemFabric, sample: func(s *nvmlowner.PreflightSample) { s.FabricState = v(nvml.GPU_FABRIC_STATE_IN_PROGRESS) },
			status: Fail, detail: "registration in progress, want completed"},
		{name: "fabric not started", item: ItemFabric, sample: func(s *nvmlowner.PreflightSample) { s.FabricState = v(nvml.GPU_FABRIC_STATE_NOT_STARTED) },
			status: Fail, detail: "not started"},
		{name: "fabric failed", item: ItemFabric, sample: func(s *nvmlowner.PreflightSample) { s.FabricStatus = v(uint64(nvml.ERROR_UNKNOWN)) },
			status: Fail, detail: "completed with ERROR_UNKNOWN, want success"},
		{name: "no fabric", item: ItemFabric, sample: func(s *nvmlowner.PreflightSample) { s.FabricState, s.FabricStatus = notSupported, notSupported },
			status: Skipped, detail: "no NVSwitch fabric"},
		{name: "fabric state not supported", item: ItemFabric, sample: func(s *nvmlowner.PreflightSample) { s.FabricState = v(nvml.GPU_FABRIC_STATE_NOT_SUPPORTED) },
			status: Skipped, detail: "no NVSwitch fabric"},

		{name: "not throttled", item: ItemThrottle, status: Pass, detail: "no counted clocks event reason active"},
		{name: "idle is not throttling", item: ItemThrottle, sample: func(s *nvmlowner.PreflightSample) { s.ClocksEventReasons = v(nvml.ClocksEventReasonGpuIdle) },
			status: Pass, detail: "(active, not counted: gpu-idle)"},
		{name: "hw slowdown", item: ItemThrottle, sample: func(s *nvmlowner.PreflightSample) {
			s.ClocksEventReasons = v(nvml.ClocksThrottleReasonHwSlowdown | nvml.ClocksEventReasonSwThermalSlowdown | nvml.ClocksEventReasonSyncBoost)
		}, status: Fail, detail: "clocks held down by hw-slowdown, sw-thermal-slowdown, want no reason of preflight.throttle.reasons active (active, not counted: sync-boost)"},
		{name: "counted as configured", item: ItemThrottle, cfg: func(c *Config) { c.Throttle.Reasons = []string{"sync-boost"} },
			sample: func(s *nvmlowner.PreflightSample) { s.ClocksEventReasons = v(nvml.ClocksEventReasonSyncBoost) },
			status: Fail, detail: "clocks held down by sync-boost"},
		{name: "reasons not permitted", item: ItemThrottle, sample: func(s *nvmlowner.PreflightSample) { s.ClocksEventReasons = noPermission },
			status: Skipped, detail: "NO_PERMISSION"},
	}
	for _, tc := range tests {
		t.Run(tc.item+"/"+tc.name, func(t *testing.T) {
			cfg := Config{}
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			cfg = cfg.WithDefaults()
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			g := h100
			if tc.gpu != nil {
				g = *tc.gpu
			}
			s := healthy()
			if tc.sample != nil {
				tc.sample(s)
			}
			r := gpuItems[tc.item](cfg, g, s)
			if r.Item != tc.item || r.Device != g.uuid || r.Target != g.target() {
				t.Errorf("result names %s %s %s, want %s %s %s", r.Item, r.Target, r.Device, tc.item, g.target(), g.uuid)
			}
			if r.Status != tc.status || !strings.Contains(r.Detail, tc.detail) {
				t.Errorf("%s %q, want %s containing %q", r.Status, r.Detail, tc.status, tc.detail)
			}
		})
	}
	// Every per-GPU item has cases for pass and fail.
	seen := map[string]map[Status]bool{}
	for _, tc := range tests {
		if seen[tc.item] == nil {
			seen[tc.item] = map[Status]bool{}
		}
		seen[tc.item][tc.status] = true
	}
	for _, item := range GPUItems {
		if !seen[item][Pass] || !seen[item][Fail] {
			t.Errorf("item %s: no pass or no fail case", item)
		}
	}
}

func TestGPUTargetName(t *testing.T) {
	if got := h100.target(); got != "GPU 3 (0000:1b:00.0)" {
		t.Errorf("target %q", got)
	}
	if got := (gpu{index: 2, uuid: "GPU-2"}).target(); got != "GPU 2 (GPU-2)" {
		t.Errorf("target without a bus ID %q", got)
	}
	r := h100.result(ItemPCIe, Fail, "PCIe link gen %d x%d, max gen 5 x16", 4, 8)
	if got, want := r.Message(), "GPU 3 (0000:1b:00.0): PCIe link gen 4 x8, max gen 5 x16"; got != want {
		t.Errorf("message %q, want %q", got, want)
	}
	if !errors.Is(failed.Err, nvml.ERROR_UNKNOWN) {
		t.Fatal("fixture")
	}
}
