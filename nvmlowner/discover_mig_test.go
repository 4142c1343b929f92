package nvmlowner

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner/nvmlapi"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// migMock is a MIG-enabled parent GPU and one MIG device on it, built from
// go-nvml's own mocks. Profile IDs are offset from the enum, as a real
// driver's are (19 for 1g.10gb on an H100), so matching the ID against the
// enum directly would fail.
type migMock struct {
	parent *mock.Device
	gi     *mock.GpuInstance
	md     *mock.Device
}

const (
	profileIDOffset = 40
	h100MemoryBytes = 81559 << 20 // what NVML reports for an H100 80GB HBM3
	testMIGUUID     = "MIG-00000000-0000-0000-0000-000000000001"
	testGI          = 5
)

// newMIGMock returns a parent offering every GPU instance profile and a MIG
// device on GPU instance testGI of profile, with the given slice counts and
// memory.
func newMIGMock(profile, giSlices, ciSlices int, memMiB uint64) *migMock {
	m := &migMock{}
	m.gi = &mock.GpuInstance{
		GetInfoFunc: func() (nvml.GpuInstanceInfo, nvml.Return) {
			return nvml.GpuInstanceInfo{Id: testGI, ProfileId: uint32(profile + profileIDOffset)}, nvml.SUCCESS
		},
	}
	m.parent = &mock.Device{
		GetGpuInstanceByIdFunc: func(id int) (nvml.GpuInstance, nvml.Return) {
			if id != testGI {
				return nil, nvml.ERROR_NOT_FOUND
			}
			return m.gi, nvml.SUCCESS
		},
		GetGpuInstanceProfileInfoFunc: func(p int) (nvml.GpuInstanceProfileInfo, nvml.Return) {
			if p < 0 || p >= nvml.GPU_INSTANCE_PROFILE_COUNT {
				return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_INVALID_ARGUMENT
			}
			return nvml.GpuInstanceProfileInfo{Id: uint32(p + profileIDOffset)}, nvml.SUCCESS
		},
	}
	m.md = &mock.Device{
		GetUUIDFunc:              func() (string, nvml.Return) { return testMIGUUID, nvml.SUCCESS },
		GetGpuInstanceIdFunc:     func() (int, nvml.Return) { return testGI, nvml.SUCCESS },
		GetComputeInstanceIdFunc: func() (int, nvml.Return) { return 0, nvml.SUCCESS },
		GetAttributesFunc: func() (nvml.DeviceAttributes, nvml.Return) {
			return nvml.DeviceAttributes{
				GpuInstanceSliceCount:     uint32(giSlices),
				ComputeInstanceSliceCount: uint32(ciSlices),
				MemorySizeMB:              memMiB,
			}, nvml.SUCCESS
		},
	}
	return m
}

// TestMIGDeviceProfileVariants discovers a MIG device of every GPU instance
// profile variant, including those no simulated GPU offers (GFX, NO_ME,
// ALL_ME), and of compute instances smaller than their GPU instance.
func TestMIGDeviceProfileVariants(t *testing.T) {
	// H100 80GB sizes: an eighth is 10gb, a quarter 20gb, half 40gb.
	const eighth, quarter, half, whole = 9856, 19968, 40192, 80896
	tests := []struct {
		name               string
		profile            int
		giSlices, ciSlices int
		memMiB             uint64
		want               string
	}{
		{"1_SLICE", nvml.GPU_INSTANCE_PROFILE_1_SLICE, 1, 1, eighth, "1g.10gb"},
		{"2_SLICE", nvml.GPU_INSTANCE_PROFILE_2_SLICE, 2, 2, quarter, "2g.20gb"},
		{"3_SLICE", nvml.GPU_INSTANCE_PROFILE_3_SLICE, 3, 3, half, "3g.40gb"},
		{"4_SLICE", nvml.GPU_INSTANCE_PROFILE_4_SLICE, 4, 4, half, "4g.40gb"},
		{"6_SLICE", nvml.GPU_INSTANCE_PROFILE_6_SLICE, 6, 6, whole, "6g.80gb"},
		{"7_SLICE", nvml.GPU_INSTANCE_PROFILE_7_SLICE, 7, 7, whole, "7g.80gb"},
		{"8_SLICE", nvml.GPU_INSTANCE_PROFILE_8_SLICE, 8, 8, whole, "8g.80gb"},
		{"1_SLICE_REV1", nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, 1, 1, eighth, "1g.10gb+me"},
		{"2_SLICE_REV1", nvml.GPU_INSTANCE_PROFILE_2_SLICE_REV1, 2, 2, quarter, "2g.20gb+me"},
		{"1_SLICE_REV2", nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2, 1, 1, quarter, "1g.20gb"},
		{"1_SLICE_GFX", nvml.GPU_INSTANCE_PROFILE_1_SLICE_GFX, 1, 1, eighth, "1g.10gb+gfx"},
		{"2_SLICE_GFX", nvml.GPU_INSTANCE_PROFILE_2_SLICE_GFX, 2, 2, quarter, "2g.20gb+gfx"},
		{"3_SLICE_GFX", nvml.GPU_INSTANCE_PROFILE_3_SLICE_GFX, 3, 3, half, "3g.40gb+gfx"},
		{"4_SLICE_GFX", nvml.GPU_INSTANCE_PROFILE_4_SLICE_GFX, 4, 4, half, "4g.40gb+gfx"},
		{"1_SLICE_NO_ME", nvml.GPU_INSTANCE_PROFILE_1_SLICE_NO_ME, 1, 1, eighth, "1g.10gb-me"},
		{"2_SLICE_NO_ME", nvml.GPU_INSTANCE_PROFILE_2_SLICE_NO_ME, 2, 2, quarter, "2g.20gb-me"},
		{"1_SLICE_ALL_ME", nvml.GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME, 1, 1, eighth, "1g.10gb+me.all"},
		{"2_SLICE_ALL_ME", nvml.GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME, 2, 2, quarter, "2g.20gb+me.all"},
		{"1c.3_SLICE", nvml.GPU_INSTANCE_PROFILE_3_SLICE, 3, 1, half, "1c.3g.40gb"},
		{"1c.2_SLICE_NO_ME", nvml.GPU_INSTANCE_PROFILE_2_SLICE_NO_ME, 2, 1, quarter, "1c.2g.20gb-me"},
		{"2c.4_SLICE_GFX", nvml.GPU_INSTANCE_PROFILE_4_SLICE_GFX, 4, 2, half, "2c.4g.40gb+gfx"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := newMIGMock(tc.profile, tc.giSlices, tc.ciSlices, tc.memMiB)
			got, err := migDevice(nvmlapi.WrapDevice(m.parent), nvmlapi.WrapDevice(m.md), 3, h100MemoryBytes)
			if err != nil {
				t.Fatalf("migDevice: %v", err)
			}
			want := topology.MIGDevice{UUID: testMIGUUID, Profile: tc.want, GPUInstance: testGI, MemoryMiB: tc.memMiB, Index: 3,
				Attributes: topology.MIGAttributes{GPUInstanceSlices: uint32(tc.giSlices), ComputeInstanceSlices: uint32(tc.ciSlices)}}
			if got != want {
				t.Errorf("migDevice = %+v, want %+v", got, want)
			}
		})
	}
}

// TestMIGDeviceProfileErrors checks that a MIG device whose profile cannot
// be read is an error naming the call, never a device under a plain name.
func TestMIGDeviceProfileErrors(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*migMock)
		call   string
		ret    nvml.Return // wrapped in the error; SUCCESS when none is
	}{
		{"unprivileged GetGpuInstanceById", func(m *migMock) {
			m.parent.GetGpuInstanceByIdFunc = func(int) (nvml.GpuInstance, nvml.Return) { return nil, nvml.ERROR_NO_PERMISSION }
		}, "GetGpuInstanceById(5)", nvml.ERROR_NO_PERMISSION},
		{"gpu instance gone", func(m *migMock) {
			m.parent.GetGpuInstanceByIdFunc = func(int) (nvml.GpuInstance, nvml.Return) { return nil, nvml.ERROR_NOT_FOUND }
		}, "GetGpuInstanceById(5)", nvml.ERROR_NOT_FOUND},
		{"gpu lost", func(m *migMock) {
			m.parent.GetGpuInstanceByIdFunc = func(int) (nvml.GpuInstance, nvml.Return) { return nil, nvml.ERROR_GPU_IS_LOST }
		}, "GetGpuInstanceById(5)", nvml.ERROR_GPU_IS_LOST},
		{"GetInfo unprivileged", func(m *migMock) {
			m.gi.GetInfoFunc = func() (nvml.GpuInstanceInfo, nvml.Return) { return nvml.GpuInstanceInfo{}, nvml.ERROR_NO_PERMISSION }
		}, "GetInfo", nvml.ERROR_NO_PERMISSION},
		{"profile info fails", func(m *migMock) {
			m.parent.GetGpuInstanceProfileInfoFunc = func(int) (nvml.GpuInstanceProfileInfo, nvml.Return) {
				return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_UNKNOWN
			}
		}, "GetGpuInstanceProfileInfo(0)", nvml.ERROR_UNKNOWN},
		{"profile id matches no profile", func(m *migMock) {
			m.parent.GetGpuInstanceProfileInfoFunc = func(int) (nvml.GpuInstanceProfileInfo, nvml.Return) {
				return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
			}
		}, "profile id", nvml.SUCCESS},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := newMIGMock(nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, 1, 1, 9856)
			tc.mutate(m)
			got, err := migDevice(nvmlapi.WrapDevice(m.parent), nvmlapi.WrapDevice(m.md), 0, h100MemoryBytes)
			if err == nil {
				t.Fatalf("migDevice = %+v, want an error", got)
			}
			if !strings.Contains(err.Error(), tc.call) || !strings.Contains(err.Error(), testMIGUUID) {
				t.Errorf("error %q does not name the device and %s", err, tc.call)
			}
			if tc.ret != nvml.SUCCESS && !errors.Is(err, tc.ret) {
				t.Errorf("error %q does not wrap %v", err, tc.ret)
			}
		})
	}
}

// migLib is an NVML library with one MIG-enabled GPU holding one MIG device.
func migLib(m *migMock) nvml.Interface {
	m.parent.GetUUIDFunc = func() (string, nvml.Return) { return "GPU-00000000-0000-0000-0000-000000000000", nvml.SUCCESS }
	m.parent.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) { return nvml.PciInfo{Bus: 7}, nvml.SUCCESS }
	m.parent.GetNameFunc = func() (string, nvml.Return) { return "NVIDIA H100 80GB HBM3", nvml.SUCCESS }
	m.parent.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) { return nvml.Memory{Total: h100MemoryBytes}, nvml.SUCCESS }
	m.parent.GetMinorNumberFunc = func() (int, nvml.Return) { return 0, nvml.SUCCESS }
	m.parent.GetMigModeFunc = func() (int, int, nvml.Return) {
		return nvml.DEVICE_MIG_ENABLE, nvml.DEVICE_MIG_ENABLE, nvml.SUCCESS
	}
	m.parent.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return 1, nvml.SUCCESS }
	m.parent.GetMigDeviceHandleByIndexFunc = func(int) (nvml.Device, nvml.Return) { return m.md, nvml.SUCCESS }
	m.parent.GetNvLinkStateFunc = func(int) (nvml.EnableState, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
	return &mock.Interface{
		DeviceGetCountFunc:         func() (int, nvml.Return) { return 1, nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(int) (nvml.Device, nvml.Return) { return m.parent, nvml.SUCCESS },
		DeviceGetHandleByUUIDFunc:  func(string) (nvml.Device, nvml.Return) { return m.parent, nvml.SUCCESS },
	}
}

// TestDiscoverSkipsUnnamableMIG checks what discovery makes of a MIG device
// whose profile cannot be read: left out with a warning naming the GPU and
// the failed call when the caller lacks privilege, and the GPU marked lost
// when the GPU is lost.
func TestDiscoverSkipsUnnamableMIG(t *testing.T) {
	tests := []struct {
		name     string
		ret      nvml.Return
		wantLost bool
	}{
		{"no permission", nvml.ERROR_NO_PERMISSION, false},
		{"gpu lost", nvml.ERROR_GPU_IS_LOST, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := newMIGMock(nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, 1, 1, 9856)
			m.parent.GetGpuInstanceByIdFunc = func(int) (nvml.GpuInstance, nvml.Return) { return nil, tc.ret }
			var logs bytes.Buffer
			node, err := Discover(nvmlapi.Wrap(migLib(m)), t.TempDir(), slog.New(slog.NewTextHandler(&logs, nil)))
			if err != nil {
				t.Fatalf("Discover: %v", err)
			}
			if len(node.GPUs) != 1 {
				t.Fatalf("discovered %d gpus, want 1", len(node.GPUs))
			}
			g := node.GPUs[0]
			if len(g.MIG) != 0 {
				t.Errorf("mig devices %+v, want the unnamable one left out", g.MIG)
			}
			if !g.MIGEnabled {
				t.Errorf("MIG mode lost: %+v", g)
			}
			if g.Lost != tc.wantLost {
				t.Errorf("gpu lost = %t, want %t", g.Lost, tc.wantLost)
			}
			if !tc.wantLost {
				out := logs.String()
				if !strings.Contains(out, "level=WARN") || !strings.Contains(out, "gpu=0") || !strings.Contains(out, "GetGpuInstanceById") {
					t.Errorf("no warning naming the gpu and the call in:\n%s", out)
				}
			}
		})
	}
}
