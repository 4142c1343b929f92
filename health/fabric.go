package health

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
)

// checkFabric reads the NVSwitch fabric registration of GPUs that report
// one (Hopper and later on NVSwitch systems; others answer NOT_SUPPORTED,
// or state NVML_GPU_FABRIC_STATE_NOT_SUPPORTED). Until Fabric Manager has
// registered the GPU (state COMPLETED with status SUCCESS, nvml.h
// nvmlGpuFabricInfo_t) CUDA initialisation fails on it, so any other state
// or a failed status makes the GPU unfit while it lasts.
func checkFabric(in *checkInput, out *checkResult) {
	state, has := ok(in.Cur, nvmlowner.FieldFabricState)
	if !has || state == nvml.GPU_FABRIC_STATE_NOT_SUPPORTED {
		return
	}
	status, _ := ok(in.Cur, nvmlowner.FieldFabricStatus)
	var reason string
	bad := true
	switch {
	case state != nvml.GPU_FABRIC_STATE_COMPLETED:
		reason = "nvswitch fabric registration " + fabricStateName(state)
	case nvml.Return(status) != nvml.SUCCESS:
		reason = fmt.Sprintf("nvswitch fabric registration failed: %v", nvml.Return(status))
	default:
		bad = false
	}
	out.add(flag(in.UUID, CheckFabric, "", bad, reason))
}

func fabricStateName(s uint64) string {
	switch s {
	case nvml.GPU_FABRIC_STATE_NOT_STARTED:
		return "not started"
	case nvml.GPU_FABRIC_STATE_IN_PROGRESS:
		return "in progress"
	}
	return fmt.Sprintf("in state %d", s)
}
