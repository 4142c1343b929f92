package sim

import "github.com/NVIDIA/go-nvml/pkg/nvml"

// installFabric answers GetGpuFabricInfo. nvml.h nvmlDeviceGetGpuFabricInfo:
// "For Hopper or newer fully supported devices. On Hopper + NVSwitch
// systems, GPU is registered with the NVIDIA Fabric Manager. Upon
// successful registration, the GPU is added to the NVLink fabric"; it
// documents NVML_ERROR_NOT_SUPPORTED "If device doesn't support gpu
// fabric", which is what the other GPUs (and MIG devices) answer. A GPU on
// a fabric reports probe state NVML_GPU_FABRIC_STATE_COMPLETED with status
// SUCCESS; while fabric-not-ready holds, NVML_GPU_FABRIC_STATE_IN_PROGRESS
// with NVML_ERROR_NOT_READY (the status "Must be checked only if state
// returns complete").
//
// Only the v1 call is simulated: go-nvml's GetGpuFabricInfoV returns a
// GpuFabricInfoHandler, a struct around an unexported real nvmlDevice, which
// a mock cannot build; the simulator's V-handler stays the zero handler of
// fillUnsupported, and calling its V1/V2 would reach the real library.
func (n *Node) installFabric() {
	fs := n.faults
	for i, d := range n.devices {
		if !n.onFabric(i) {
			d.GetGpuFabricInfoFunc = func() (nvml.GpuFabricInfo, nvml.Return) {
				return nvml.GpuFabricInfo{}, nvml.ERROR_NOT_SUPPORTED
			}
			continue
		}
		d.GetGpuFabricInfoFunc = func() (nvml.GpuFabricInfo, nvml.Return) {
			fs.mu.Lock()
			notReady, failed := fs.gpus[i].fabricNotReady, fs.nvmlFailed
			fs.mu.Unlock()
			if failed {
				return nvml.GpuFabricInfo{}, nvml.ERROR_UNKNOWN
			}
			if notReady {
				return nvml.GpuFabricInfo{State: nvml.GPU_FABRIC_STATE_IN_PROGRESS, Status: uint32(nvml.ERROR_NOT_READY)}, nvml.SUCCESS
			}
			return nvml.GpuFabricInfo{State: nvml.GPU_FABRIC_STATE_COMPLETED, Status: uint32(nvml.SUCCESS)}, nvml.SUCCESS
		}
	}
}

// onFabric says whether GPU i is a Hopper or later GPU whose NVLinks go to
// NVSwitches (the dgx-h100, dgx-h200 and dgx-b200 profiles), the GPUs that
// register with the Fabric Manager.
func (n *Node) onFabric(i int) bool {
	g := n.gpus[i]
	switch g.cfg.Architecture {
	case nvml.DEVICE_ARCH_HOPPER, nvml.DEVICE_ARCH_BLACKWELL, nvml.DEVICE_ARCH_RUBIN:
	default:
		return false
	}
	for _, l := range g.links {
		if l.remoteType == nvml.NVLINK_DEVICE_TYPE_SWITCH {
			return true
		}
	}
	return false
}
