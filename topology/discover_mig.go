package topology

import (
	"fmt"
	"math"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// MIG profile name attributes, spelled as go-nvlib spells them
// (github.com/NVIDIA/go-nvlib v0.12.0, pkg/nvlib/device/mig_profile.go:
// AttributeMediaExtensions, AttributeMediaExtensionsAll, AttributeGraphics).
const (
	// MIGAttributeMediaExtensions marks a profile with media engines
	// ("1g.10gb+me"), or, negated, one with none ("1g.10gb-me").
	MIGAttributeMediaExtensions = "me"
	// MIGAttributeMediaExtensionsAll marks a profile holding all of the
	// GPU's media engines ("1g.24gb+me.all").
	MIGAttributeMediaExtensionsAll = "me.all"
	// MIGAttributeGraphics marks a graphics-capable profile ("1g.24gb+gfx").
	MIGAttributeGraphics = "gfx"
)

// MIGProfileSuffix returns the attribute suffix that NVIDIA's tools put
// after the "<g>g.<gb>gb" part of a MIG profile's name, for a GPU instance
// profile given as one of go-nvml's GPU_INSTANCE_PROFILE_* values (the
// NVML_GPU_INSTANCE_PROFILE_* enum of nvml.h, not the per-device profile ID
// nvmlGpuInstanceInfo_t.profileId carries). ok is false for a value go-nvml
// v0.13.3-1 does not define: such a profile cannot be named.
//
// The mapping is go-nvlib's NewMigProfile and MigProfileInfo.String
// (github.com/NVIDIA/go-nvlib v0.12.0, pkg/nvlib/device/mig_profile.go),
// which the NVIDIA device plugin (v0.20, internal/rm/device_map.go,
// internal/rm/rm.go) turns into nvidia.com/mig-<name> resources: REV1 is
// "+me", ALL_ME "+me.all", GFX "+gfx", NO_ME the negative "-me". REV2 (a
// 1-slice profile with twice the memory) has no attribute; its memory sets
// it apart. go-nvlib v0.12.0 rejects GPU_INSTANCE_PROFILE_3_SLICE_GFX
// (nvml.h: "3_SLICE gfx + media capable profile", new in R580); it is named
// "+gfx" here like the other GFX profiles, so it never shares a name with
// the plain 3-slice profile.
func MIGProfileSuffix(profile int) (suffix string, ok bool) {
	switch profile {
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE,
		nvml.GPU_INSTANCE_PROFILE_2_SLICE,
		nvml.GPU_INSTANCE_PROFILE_3_SLICE,
		nvml.GPU_INSTANCE_PROFILE_4_SLICE,
		nvml.GPU_INSTANCE_PROFILE_6_SLICE,
		nvml.GPU_INSTANCE_PROFILE_7_SLICE,
		nvml.GPU_INSTANCE_PROFILE_8_SLICE,
		nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2:
		return "", true
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1,
		nvml.GPU_INSTANCE_PROFILE_2_SLICE_REV1:
		return "+" + MIGAttributeMediaExtensions, true
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME,
		nvml.GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME:
		return "+" + MIGAttributeMediaExtensionsAll, true
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_GFX,
		nvml.GPU_INSTANCE_PROFILE_2_SLICE_GFX,
		nvml.GPU_INSTANCE_PROFILE_3_SLICE_GFX,
		nvml.GPU_INSTANCE_PROFILE_4_SLICE_GFX:
		return "+" + MIGAttributeGraphics, true
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_NO_ME,
		nvml.GPU_INSTANCE_PROFILE_2_SLICE_NO_ME:
		return "-" + MIGAttributeMediaExtensions, true
	}
	return "", false
}

// MIGProfileName returns the canonical MIG profile name NVIDIA's tools use
// ("1g.10gb", "1c.3g.40gb", "1g.10gb+me"). giSlices and ciSlices are the GPU
// and compute instance slice counts, migMemoryMiB the GPU instance memory,
// parentMemoryBytes the parent GPU's total memory and attrs profile
// attributes such as "me" (media extensions), joined after a "+". Use
// MIGProfileNameOf to name a profile by its NVML profile, which also covers
// the negative attribute ("-me").
//
// The memory figure is not the MIG memory rounded up: like go-nvlib it is the
// fraction of the parent's memory, rounded up to eighths, times the parent's
// memory in whole GiB, so a 4864 MiB slice of a 40 GiB A100 is "5gb".
func MIGProfileName(giSlices, ciSlices int, migMemoryMiB, parentMemoryBytes uint64, attrs ...string) string {
	var suffix string
	if len(attrs) > 0 {
		suffix = "+" + strings.Join(attrs, ",")
	}
	return migProfileName(giSlices, ciSlices, migMemoryMiB, parentMemoryBytes, suffix)
}

// MIGProfileNameOf names a MIG device of GPU instance profile profile (one
// of go-nvml's GPU_INSTANCE_PROFILE_* values) the way go-nvlib does; see
// MIGProfileName for the other arguments and MIGProfileSuffix for the
// attributes. It fails for a profile go-nvml does not define.
//
// Compute instance profiles add no attribute: go-nvlib counts
// COMPUTE_INSTANCE_PROFILE_1_SLICE_REV1 as one slice and
// COMPUTE_INSTANCE_PROFILE_7_SLICE_NVL as seven, and only the slice count
// shows in the name ("1c.2g.20gb").
func MIGProfileNameOf(profile, giSlices, ciSlices int, migMemoryMiB, parentMemoryBytes uint64) (string, error) {
	suffix, ok := MIGProfileSuffix(profile)
	if !ok {
		return "", fmt.Errorf("gpu instance profile %d is not one go-nvml defines", profile)
	}
	return migProfileName(giSlices, ciSlices, migMemoryMiB, parentMemoryBytes, suffix), nil
}

func migProfileName(giSlices, ciSlices int, migMemoryMiB, parentMemoryBytes uint64, suffix string) string {
	gb := migMemoryGB(migMemoryMiB, parentMemoryBytes)
	if ciSlices == 0 || ciSlices == giSlices {
		return fmt.Sprintf("%dg.%dgb%s", giSlices, gb, suffix)
	}
	return fmt.Sprintf("%dc.%dg.%dgb%s", ciSlices, giSlices, gb, suffix)
}

func migMemoryGB(migMemoryMiB, parentMemoryBytes uint64) uint64 {
	const (
		mib    = 1 << 20
		gib    = 1 << 30
		eighth = 8
	)
	if parentMemoryBytes == 0 {
		// Without the parent's size the best we can do is round up.
		return (migMemoryMiB + 1023) / 1024
	}
	frac := float64(migMemoryMiB) * mib / float64(parentMemoryBytes)
	frac = math.Ceil(frac*eighth) / eighth
	totalGB := float64((parentMemoryBytes + gib - 1) / gib)
	return uint64(math.Round(frac * totalGB))
}

// migDevice reads MIG device idx (handle md) of GPU parent. Every call must
// succeed: a MIG device whose profile cannot be told (for one, the
// privileged GetGpuInstanceById failing with NO_PERMISSION) is an error
// rather than a device under a guessed name, as in go-nvlib's
// migdevice.GetProfile. Errors wrap the nvml.Return, so a caller can tell
// ERROR_GPU_IS_LOST.
func migDevice(parent, md nvml.Device, idx int, parentMemory uint64) (MIGDevice, error) {
	m := MIGDevice{Index: idx}
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
	profile, err := migGPUInstanceProfile(parent, m.GPUInstance)
	if err != nil {
		return m, fmt.Errorf("mig device %s: %w", m.UUID, err)
	}
	m.MemoryMiB = attrs.MemorySizeMB
	m.Profile, err = MIGProfileNameOf(profile, int(attrs.GpuInstanceSliceCount), int(attrs.ComputeInstanceSliceCount),
		attrs.MemorySizeMB, parentMemory)
	if err != nil {
		return m, fmt.Errorf("mig device %s: %w", m.UUID, err)
	}
	return m, nil
}

// migGPUInstanceProfile returns the GPU_INSTANCE_PROFILE_* value of GPU
// instance giID on parent: the attributes a MIG device reports (slices,
// memory) do not tell a "+me" or "+gfx" profile from the plain one.
//
// nvmlGpuInstanceInfo_t.profileId is a per-device profile ID (19 for
// 1g.10gb on an H100, 20 for 1g.10gb+me), not the enum, so like go-nvlib's
// migdevice.GetProfile it is matched against the ID that
// nvmlDeviceGetGpuInstanceProfileInfo reports for each enum value;
// NOT_SUPPORTED or INVALID_ARGUMENT there means the GPU lacks that profile
// (nvml.h).
func migGPUInstanceProfile(parent nvml.Device, giID int) (int, error) {
	gi, ret := parent.GetGpuInstanceById(giID)
	if ret != nvml.SUCCESS {
		return 0, fmt.Errorf("GetGpuInstanceById(%d): %w", giID, ret)
	}
	if gi == nil {
		return 0, fmt.Errorf("GetGpuInstanceById(%d): no gpu instance", giID)
	}
	info, ret := gi.GetInfo()
	if ret != nvml.SUCCESS {
		return 0, fmt.Errorf("gpu instance %d: GetInfo: %w", giID, ret)
	}
	for p := 0; p < nvml.GPU_INSTANCE_PROFILE_COUNT; p++ {
		pi, ret := parent.GetGpuInstanceProfileInfo(p)
		switch ret {
		case nvml.SUCCESS:
			if pi.Id == info.ProfileId {
				return p, nil
			}
		case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_INVALID_ARGUMENT:
		default:
			return 0, fmt.Errorf("GetGpuInstanceProfileInfo(%d): %w", p, ret)
		}
	}
	return 0, fmt.Errorf("gpu instance %d: profile id %d is none of the GPU's %d known gpu instance profiles",
		giID, info.ProfileId, nvml.GPU_INSTANCE_PROFILE_COUNT)
}
