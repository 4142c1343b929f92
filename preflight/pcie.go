package preflight

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
)

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
