package preflight

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner/nvmlapi"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// gpuItem judges one GPU's sample (whose Err is nil).
type gpuItem func(cfg Config, g gpu, s *nvmlowner.PreflightSample) Result

// gpuItems are the per-GPU items by name (GPUItems lists their order).
var gpuItems = map[string]gpuItem{
	ItemPersistence:  checkPersistence,
	ItemECC:          checkECC,
	ItemRetiredPages: checkRetiredPages,
	ItemRowRemap:     checkRowRemap,
	ItemPCIe:         checkPCIe,
	ItemNVLink:       checkNVLink,
	ItemFabric:       checkFabric,
	ItemThrottle:     checkThrottle,
}

// checkPersistence: nvidia-persistenced keeps the driver's state while no
// client is open; without it the first CUDA call of every pod pays the
// GPU's initialisation and a GPU's error state can be torn down with the
// last client.
func checkPersistence(_ Config, g gpu, s *nvmlowner.PreflightSample) Result {
	if r, ok := unread(ItemPersistence, g, "persistence mode", s.Persistence); !ok {
		return r
	}
	if s.Persistence.V != 1 {
		return g.result(ItemPersistence, Fail, "persistence mode disabled, want enabled (nvidia-persistenced)")
	}
	return g.result(ItemPersistence, Pass, "persistence mode enabled")
}

// checkECC: ECC on now and after the next reboot (the pending mode), on
// GPUs that have it (nvml.h: "Only applicable to devices with ECC").
func checkECC(_ Config, g gpu, s *nvmlowner.PreflightSample) Result {
	if r, ok := unread(ItemECC, g, "ECC mode", s.ECCCurrent); !ok {
		return r
	}
	cur, pending := s.ECCCurrent.V, s.ECCPending.V
	pendingOK := s.ECCPending.Status == nvmlowner.OK
	switch {
	case cur != 1 && pendingOK:
		return g.result(ItemECC, Fail, "ECC %s (pending %s), want enabled", enabledWord(cur), enabledWord(pending))
	case cur != 1:
		return g.result(ItemECC, Fail, "ECC %s, want enabled", enabledWord(cur))
	case pendingOK && pending != 1:
		return g.result(ItemECC, Fail, "ECC enabled, but pending disabled: off after the next reboot")
	}
	return g.result(ItemECC, Pass, "ECC enabled")
}

// checkRetiredPages: a page waiting for retirement (Kepler to Volta) is
// retired only at the next reset or driver reload; until then it can
// fault again.
func checkRetiredPages(_ Config, g gpu, s *nvmlowner.PreflightSample) Result {
	if s.RetiredPending.Status == nvmlowner.NotSupported {
		return g.result(ItemRetiredPages, Skipped, "page retirement not supported on this GPU (Ampere and later remap rows instead)")
	}
	if r, ok := unread(ItemRetiredPages, g, "retired pages pending status", s.RetiredPending); !ok {
		return r
	}
	if s.RetiredPending.V == 1 {
		return g.result(ItemRetiredPages, Fail, "a page is pending retirement, want none (needs a GPU reset)")
	}
	return g.result(ItemRetiredPages, Pass, "no page pending retirement")
}

// checkRowRemap: a pending row remap (Ampere and later) takes effect only
// at the next reset; a remap failure means the bank ran out of spare rows
// and the GPU needs service.
func checkRowRemap(_ Config, g gpu, s *nvmlowner.PreflightSample) Result {
	if s.RemapPending.Status == nvmlowner.NotSupported {
		return g.result(ItemRowRemap, Skipped, "row remapping not supported on this GPU (before Ampere, or MIG enabled)")
	}
	if r, ok := unread(ItemRowRemap, g, "remapped rows", s.RemapPending); !ok {
		return r
	}
	switch {
	case s.RemapFailure.V == 1:
		return g.result(ItemRowRemap, Fail, "row remap failure (no spare rows left), want none")
	case s.RemapPending.V == 1:
		return g.result(ItemRowRemap, Fail, "a row remap is pending, want none (needs a GPU reset)")
	}
	return g.result(ItemRowRemap, Pass, "no row remap pending or failed")
}

// checkPCIe: the link trained at the maximum generation and width the GPU
// and its slot allow (nvml.h's "max ... possible with this device and
// system"). An idle GPU's generation is not judged unless
// pcie.failIdleDowngrade: the driver lowers an idle link's speed.
func checkPCIe(cfg Config, g gpu, s *nvmlowner.PreflightSample) Result {
	for _, v := range []struct {
		what string
		v    nvmlowner.Value
	}{{"PCIe link generation", s.PCIeGen}, {"PCIe link width", s.PCIeWidth}, {"PCIe max link generation", s.PCIeMaxGen}, {"PCIe max link width", s.PCIeMaxWidth}} {
		if r, ok := unread(ItemPCIe, g, v.what, v.v); !ok {
			return r
		}
	}
	gen, width, maxGen, maxWidth := s.PCIeGen.V, s.PCIeWidth.V, s.PCIeMaxGen.V, s.PCIeMaxWidth.V
	seen := fmt.Sprintf("PCIe link gen %d x%d, max gen %d x%d", gen, width, maxGen, maxWidth)
	idle := s.ClocksEventReasons.Status == nvmlowner.OK && s.ClocksEventReasons.V&nvml.ClocksEventReasonGpuIdle != 0
	switch {
	case width < maxWidth:
		return g.result(ItemPCIe, Fail, "%s: width below its maximum", seen)
	case gen < maxGen && idle && !cfg.PCIe.FailIdleDowngrade:
		return g.result(ItemPCIe, Pass, "%s: width at its maximum; generation not judged while the GPU is idle (the driver slows an idle link)", seen)
	case gen < maxGen:
		return g.result(ItemPCIe, Fail, "%s: generation below its maximum", seen)
	}
	return g.result(ItemPCIe, Pass, "%s", seen)
}

// checkNVLink: links 0..n-1 up, n from nvlink.expected or what the GPU's
// model wires on its board (topology.ExpectedNVLinks). A link NVML does
// not list at all is down too: the model says it is there.
func checkNVLink(cfg Config, g gpu, s *nvmlowner.PreflightSample) Result {
	expected := cfg.NVLink.Expected
	from := "nvlink.expected"
	if expected == 0 {
		expected = topology.ExpectedNVLinks(g.model)
		from = g.model
	}
	if expected == 0 {
		return g.result(ItemNVLink, Skipped, "no NVLink expected (%s wires none; set preflight.nvlink.expected)", orUnknownModel(g.model))
	}
	byLink := map[int]nvmlowner.Value{}
	for _, l := range s.NVLinks {
		byLink[l.Link] = l.Up
	}
	var down, unreadable []string
	for l := range expected {
		v, ok := byLink[l]
		switch {
		case !ok || (v.Status == nvmlowner.OK && v.V != 1):
			down = append(down, strconv.Itoa(l))
		case v.Status != nvmlowner.OK:
			unreadable = append(unreadable, strconv.Itoa(l))
		}
	}
	switch {
	case len(down) > 0:
		return g.result(ItemNVLink, Fail, "NVLink %s down; %d of %d expected up (%s)", strings.Join(down, ", "), expected-len(down)-len(unreadable), expected, from)
	case len(unreadable) > 0:
		return g.result(ItemNVLink, Fail, "NVLink %s state not read; want %d up (%s)", strings.Join(unreadable, ", "), expected, from)
	}
	return g.result(ItemNVLink, Pass, "%d of %d NVLinks up", expected, expected)
}

func orUnknownModel(m string) string {
	if m == "" {
		return "an unknown model"
	}
	return m
}

// checkFabric: on NVSwitch systems (Hopper and later) CUDA cannot start
// on a GPU until Fabric Manager has registered it (nvml.h
// nvmlGpuFabricInfo_t: state COMPLETED with status SUCCESS).
func checkFabric(_ Config, g gpu, s *nvmlowner.PreflightSample) Result {
	if s.FabricState.Status == nvmlowner.NotSupported || (s.FabricState.Status == nvmlowner.OK && s.FabricState.V == nvml.GPU_FABRIC_STATE_NOT_SUPPORTED) {
		return g.result(ItemFabric, Skipped, "no NVSwitch fabric on this GPU")
	}
	if r, ok := unread(ItemFabric, g, "NVSwitch fabric state", s.FabricState); !ok {
		return r
	}
	switch state := s.FabricState.V; {
	case state == nvml.GPU_FABRIC_STATE_NOT_STARTED:
		return g.result(ItemFabric, Fail, "NVSwitch fabric registration not started, want completed (is nvidia-fabricmanager running?)")
	case state == nvml.GPU_FABRIC_STATE_IN_PROGRESS:
		return g.result(ItemFabric, Fail, "NVSwitch fabric registration in progress, want completed")
	case state != nvml.GPU_FABRIC_STATE_COMPLETED:
		return g.result(ItemFabric, Fail, "NVSwitch fabric registration in state %d, want completed", state)
	case s.FabricStatus.Status == nvmlowner.OK && nvml.Return(s.FabricStatus.V) != nvml.SUCCESS:
		return g.result(ItemFabric, Fail, "NVSwitch fabric registration completed with %v, want success", nvml.Return(s.FabricStatus.V))
	}
	return g.result(ItemFabric, Pass, "NVSwitch fabric registration completed")
}

// checkThrottle: none of the counted clocks event reasons
// (throttle.reasons) active.
func checkThrottle(cfg Config, g gpu, s *nvmlowner.PreflightSample) Result {
	if r, ok := unread(ItemThrottle, g, "clocks event reasons", s.ClocksEventReasons); !ok {
		return r
	}
	var counted uint64
	for _, name := range cfg.Throttle.Reasons {
		bit, _ := nvmlapi.ClocksEventReasonBit(name) // Validate checked the names
		counted |= bit
	}
	mask := s.ClocksEventReasons.V
	bad := nvmlapi.ClocksEventReasonsIn(mask & counted)
	other := nvmlapi.ClocksEventReasonsIn(mask &^ counted)
	note := ""
	if len(other) > 0 {
		note = " (active, not counted: " + strings.Join(other, ", ") + ")"
	}
	if len(bad) > 0 {
		return g.result(ItemThrottle, Fail, "clocks held down by %s, want no reason of preflight.throttle.reasons active%s", strings.Join(bad, ", "), note)
	}
	return g.result(ItemThrottle, Pass, "no counted clocks event reason active%s", note)
}
