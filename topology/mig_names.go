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
