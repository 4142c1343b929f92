package nvmlowner

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// migDevice reads MIG device idx (handle md) of GPU parent. Every call must
// succeed: a MIG device whose profile cannot be told (for one, the
// privileged GetGpuInstanceById failing with NO_PERMISSION) is an error
// rather than a device under a guessed name, as in go-nvlib's
// migdevice.GetProfile. Errors wrap the nvml.Return, so a caller can tell
// ERROR_GPU_IS_LOST.
func migDevice(parent, md Device, idx int, parentMemory uint64) (topology.MIGDevice, error) {
	m := topology.MIGDevice{Index: idx}
	var ret nvml.Return
	if m.UUID, ret = md.GetUUID(); ret != nvml.SUCCESS {
		return m, fmt.Errorf("mig device %d: GetUUID: %w", idx, ret)
	}
	if m.GPUInstance, ret = md.GetGpuInstanceId(); ret != nvml.SUCCESS {
		return m, fmt.Errorf("mig device %s: GetGpuInstanceId: %w", m.UUID, ret)
	}
	if m.ComputeInstance, ret = md.GetComputeInstanceId(); ret != nvml.SUCCESS {
		return m, fmt.Errorf("mig device %s: GetComputeInstanceId: %w", m.UUID, ret)
	}
	attrs, ret := md.GetAttributes()
	if ret != nvml.SUCCESS {
		return m, fmt.Errorf("mig device %s: GetAttributes: %w", m.UUID, ret)
	}
	profile, placement, err := migGPUInstanceProfile(parent, m.GPUInstance)
	if err != nil {
		return m, fmt.Errorf("mig device %s: %w", m.UUID, err)
	}
	m.Placement = placement
	m.MemoryMiB = attrs.MemorySizeMB
	m.Attributes = topology.MIGAttributes{
		Multiprocessors:       attrs.MultiprocessorCount,
		GPUInstanceSlices:     attrs.GpuInstanceSliceCount,
		ComputeInstanceSlices: attrs.ComputeInstanceSliceCount,
		CopyEngines:           attrs.SharedCopyEngineCount,
		Decoders:              attrs.SharedDecoderCount,
		Encoders:              attrs.SharedEncoderCount,
		JPEGs:                 attrs.SharedJpegCount,
		OFAs:                  attrs.SharedOfaCount,
	}
	m.Profile, err = topology.MIGProfileNameOf(profile, int(attrs.GpuInstanceSliceCount), int(attrs.ComputeInstanceSliceCount),
		attrs.MemorySizeMB, parentMemory)
	if err != nil {
		return m, fmt.Errorf("mig device %s: %w", m.UUID, err)
	}
	return m, nil
}

// migGPUInstanceProfile returns the GPU_INSTANCE_PROFILE_* value of GPU
// instance giID on parent, and where the instance sits
// (nvmlGpuInstanceInfo_t.placement): the attributes a MIG device reports
// (slices, memory) do not tell a "+me" or "+gfx" profile from the plain
// one.
//
// nvmlGpuInstanceInfo_t.profileId is a per-device profile ID (19 for
// 1g.10gb on an H100, 20 for 1g.10gb+me), not the enum, so like go-nvlib's
// migdevice.GetProfile it is matched against the ID that
// nvmlDeviceGetGpuInstanceProfileInfo reports for each enum value;
// NOT_SUPPORTED or INVALID_ARGUMENT there means the GPU lacks that profile
// (nvml.h).
func migGPUInstanceProfile(parent Device, giID int) (int, topology.MIGPlacement, error) {
	gi, ret := parent.GetGpuInstanceById(giID)
	if ret != nvml.SUCCESS {
		return 0, topology.MIGPlacement{}, fmt.Errorf("GetGpuInstanceById(%d): %w", giID, ret)
	}
	if gi == nil {
		return 0, topology.MIGPlacement{}, fmt.Errorf("GetGpuInstanceById(%d): no gpu instance", giID)
	}
	info, ret := gi.GetInfo()
	if ret != nvml.SUCCESS {
		return 0, topology.MIGPlacement{}, fmt.Errorf("gpu instance %d: GetInfo: %w", giID, ret)
	}
	at := topology.MIGPlacement{Start: info.Placement.Start, Size: info.Placement.Size}
	p, err := gpuInstanceProfileOf(parent, info.ProfileId)
	if err != nil {
		return 0, topology.MIGPlacement{}, fmt.Errorf("gpu instance %d: %w", giID, err)
	}
	return p, at, nil
}

// gpuInstanceProfileOf finds the GPU_INSTANCE_PROFILE_* value whose
// per-device profile ID (nvmlDeviceGetGpuInstanceProfileInfo) is id.
func gpuInstanceProfileOf(parent Device, id uint32) (int, error) {
	for p := 0; p < nvml.GPU_INSTANCE_PROFILE_COUNT; p++ {
		pi, ret := parent.GetGpuInstanceProfileInfo(p)
		switch ret {
		case nvml.SUCCESS:
			if pi.Id == id {
				return p, nil
			}
		case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_INVALID_ARGUMENT:
		default:
			return 0, fmt.Errorf("GetGpuInstanceProfileInfo(%d): %w", p, ret)
		}
	}
	return 0, fmt.Errorf("profile id %d is none of the GPU's %d known gpu instance profiles", id, nvml.GPU_INSTANCE_PROFILE_COUNT)
}
