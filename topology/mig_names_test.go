package topology

import (
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// TestMIGProfileSuffix pins the name attribute of every GPU instance profile
// go-nvml v0.13.3-1 defines to go-nvlib's naming (pkg/nvlib/device/
// mig_profile.go), and checks no defined profile is left out.
func TestMIGProfileSuffix(t *testing.T) {
	tests := []struct {
		name    string
		profile int
		suffix  string
	}{
		{"1_SLICE", nvml.GPU_INSTANCE_PROFILE_1_SLICE, ""},
		{"2_SLICE", nvml.GPU_INSTANCE_PROFILE_2_SLICE, ""},
		{"3_SLICE", nvml.GPU_INSTANCE_PROFILE_3_SLICE, ""},
		{"4_SLICE", nvml.GPU_INSTANCE_PROFILE_4_SLICE, ""},
		{"7_SLICE", nvml.GPU_INSTANCE_PROFILE_7_SLICE, ""},
		{"8_SLICE", nvml.GPU_INSTANCE_PROFILE_8_SLICE, ""},
		{"6_SLICE", nvml.GPU_INSTANCE_PROFILE_6_SLICE, ""},
		{"1_SLICE_REV1", nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, "+me"},
		{"2_SLICE_REV1", nvml.GPU_INSTANCE_PROFILE_2_SLICE_REV1, "+me"},
		{"1_SLICE_REV2", nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2, ""},
		{"1_SLICE_GFX", nvml.GPU_INSTANCE_PROFILE_1_SLICE_GFX, "+gfx"},
		{"2_SLICE_GFX", nvml.GPU_INSTANCE_PROFILE_2_SLICE_GFX, "+gfx"},
		{"4_SLICE_GFX", nvml.GPU_INSTANCE_PROFILE_4_SLICE_GFX, "+gfx"},
		{"1_SLICE_NO_ME", nvml.GPU_INSTANCE_PROFILE_1_SLICE_NO_ME, "-me"},
		{"2_SLICE_NO_ME", nvml.GPU_INSTANCE_PROFILE_2_SLICE_NO_ME, "-me"},
		{"1_SLICE_ALL_ME", nvml.GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME, "+me.all"},
		{"2_SLICE_ALL_ME", nvml.GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME, "+me.all"},
		{"3_SLICE_GFX", nvml.GPU_INSTANCE_PROFILE_3_SLICE_GFX, "+gfx"},
	}
	covered := map[int]bool{}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := MIGProfileSuffix(tc.profile)
			if !ok || got != tc.suffix {
				t.Errorf("MIGProfileSuffix(%d) = %q, %t; want %q, true", tc.profile, got, ok, tc.suffix)
			}
		})
		covered[tc.profile] = true
	}
	for p := 0; p < nvml.GPU_INSTANCE_PROFILE_COUNT; p++ {
		if !covered[p] {
			t.Errorf("gpu instance profile %d has no case in this table", p)
		}
	}
	for _, p := range []int{-1, nvml.GPU_INSTANCE_PROFILE_COUNT} {
		if s, ok := MIGProfileSuffix(p); ok {
			t.Errorf("MIGProfileSuffix(%d) = %q, true; want not ok for a profile go-nvml does not define", p, s)
		}
	}
}
