package preflight

import (
	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
)

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
