package sim

import (
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner/nvmlapi"
)

// archCase is what a built-in profile's GPUs are and answer.
type archCase struct {
	profile   string
	arch      nvml.DeviceArchitecture
	retired   bool // page retirement (before Ampere)
	remap     bool // row remapping (Ampere on)
	nvlinkErr bool // NVLink DL error counters (before Blackwell)
	nvlinks   bool // the profile's GPUs have NVLinks
}

var archCases = []archCase{
	{profile: "dgx-1v", arch: nvml.DEVICE_ARCH_VOLTA, retired: true, nvlinkErr: true, nvlinks: true},
	{profile: "dgx-2", arch: nvml.DEVICE_ARCH_VOLTA, retired: true, nvlinkErr: true, nvlinks: true},
	{profile: "pcie-8gpu", arch: nvml.DEVICE_ARCH_AMPERE, remap: true, nvlinkErr: true},
	{profile: "dgx-a100", arch: nvml.DEVICE_ARCH_AMPERE, remap: true, nvlinkErr: true, nvlinks: true},
	{profile: "dgx-h100", arch: nvml.DEVICE_ARCH_HOPPER, remap: true, nvlinkErr: true, nvlinks: true},
	{profile: "dgx-h200", arch: nvml.DEVICE_ARCH_HOPPER, remap: true, nvlinkErr: true, nvlinks: true},
	{profile: "dgx-b200", arch: nvml.DEVICE_ARCH_BLACKWELL, remap: true, nvlinks: true},
	{profile: "gb200-nvl72", arch: nvml.DEVICE_ARCH_BLACKWELL, remap: true, nvlinks: true},
}

func newArchNode(t *testing.T, profile string, opts ...ProfileOption) *Node {
	t.Helper()
	spec, err := Profile(profile, opts...)
	if err != nil {
		t.Fatal(err)
	}
	n, err := New(spec, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// migOnGPU0 enables MIG on GPU 0 of a MIG-capable profile with one device
// of the model's smallest profile.
func migOnGPU0(t *testing.T, profile string) ProfileOption {
	t.Helper()
	ps := migProfilesOf(profiles[profile].gpu)
	if len(ps) == 0 {
		t.Fatalf("%s: no MIG profiles", profile)
	}
	return WithMIG(0, ps[0].name)
}

func wantRet(t *testing.T, what string, got nvml.Return, supported bool) {
	t.Helper()
	want := nvml.ERROR_NOT_SUPPORTED
	if supported {
		want = nvml.SUCCESS
	}
	if got != want {
		t.Errorf("%s: got %v, want %v", what, got, want)
	}
}

func TestArchSupport(t *testing.T) {
	if len(archCases) != len(Profiles()) {
		t.Fatalf("archCases covers %d profiles, the simulator has %d: %v", len(archCases), len(Profiles()), Profiles())
	}
	for _, tc := range archCases {
		t.Run(tc.profile, func(t *testing.T) {
			n := newArchNode(t, tc.profile)
			lib := n.NVML()
			dev, ret := lib.DeviceGetHandleByIndex(0)
			if ret != nvml.SUCCESS {
				t.Fatal(ret)
			}
			if arch, ret := mockOf(dev).GetArchitecture(); ret != nvml.SUCCESS || arch != tc.arch {
				t.Fatalf("GetArchitecture: %v %v, want %v", archName(arch), ret, archName(tc.arch))
			}
			for _, cause := range []nvml.PageRetirementCause{
				nvml.PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS, nvml.PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
			} {
				_, ret := dev.GetRetiredPages(cause)
				wantRet(t, "GetRetiredPages", ret, tc.retired)
				_, _, ret = mockOf(dev).GetRetiredPages_v2(cause)
				wantRet(t, "GetRetiredPages_v2", ret, tc.retired)
			}
			_, ret = dev.GetRetiredPagesPendingStatus()
			wantRet(t, "GetRetiredPagesPendingStatus", ret, tc.retired)
			_, _, _, _, ret = dev.GetRemappedRows()
			wantRet(t, "GetRemappedRows", ret, tc.remap)
			if tc.nvlinks {
				for _, c := range []nvml.NvLinkErrorCounter{
					nvml.NVLINK_ERROR_DL_REPLAY, nvml.NVLINK_ERROR_DL_RECOVERY, nvml.NVLINK_ERROR_DL_CRC_FLIT, nvml.NVLINK_ERROR_DL_CRC_DATA,
				} {
					_, ret := dev.GetNvLinkErrorCounter(0, c)
					wantRet(t, "GetNvLinkErrorCounter", ret, tc.nvlinkErr)
				}
			}
			for _, f := range []string{featureRetiredPages, featureRowRemap, featureNVLinkErrors} {
				want := map[string]bool{featureRetiredPages: tc.retired, featureRowRemap: tc.remap, featureNVLinkErrors: tc.nvlinkErr}[f]
				if got := n.supports(0, f); got != want {
					t.Errorf("supports(0, %s) = %v, want %v", f, got, want)
				}
			}
			if n.supports(len(n.devices), featureRowRemap) {
				t.Error("supports: true for a GPU the node does not have")
			}
		})
	}
}

// TestArchFaultsVisible injects the memory faults an architecture can show
// and reads them back through NVML, and checks that checkFaultArch refuses
// the others naming the architecture.
func TestArchFaultsVisible(t *testing.T) {
	for _, tc := range archCases {
		t.Run(tc.profile, func(t *testing.T) {
			n := newArchNode(t, tc.profile)
			dev, _ := n.NVML().DeviceGetHandleByIndex(1)
			for _, k := range []struct {
				kind      string
				supported bool
				visible   func() bool
			}{
				{FaultRetiredPending, tc.retired, func() bool {
					st, ret := dev.GetRetiredPagesPendingStatus()
					return ret == nvml.SUCCESS && st == nvml.FEATURE_ENABLED
				}},
				{FaultRowRemapPending, tc.remap, func() bool {
					_, unc, pending, _, ret := dev.GetRemappedRows()
					return ret == nvml.SUCCESS && pending && unc == 1
				}},
				{FaultRowRemapFailure, tc.remap, func() bool {
					_, _, _, failed, ret := dev.GetRemappedRows()
					return ret == nvml.SUCCESS && failed
				}},
			} {
				err := n.checkFaultArch(k.kind, 1)
				if !k.supported {
					if err == nil || !strings.Contains(err.Error(), archName(tc.arch)) {
						t.Errorf("checkFaultArch(%s): %v, want an error naming %s", k.kind, err, archName(tc.arch))
					}
					continue
				}
				if err != nil {
					t.Errorf("checkFaultArch(%s): %v", k.kind, err)
				}
				if k.visible() {
					t.Fatalf("%s visible before injection", k.kind)
				}
				if err := n.injectFault(Fault{Kind: k.kind, GPU: 1}); err != nil {
					t.Fatal(err)
				}
				if !k.visible() {
					t.Errorf("%s injected but not visible through NVML", k.kind)
				}
				if err := n.clearFault(Fault{Kind: k.kind, GPU: 1}); err != nil {
					t.Fatal(err)
				}
				if k.visible() {
					t.Errorf("%s cleared but still visible", k.kind)
				}
			}
			for _, kind := range []string{FaultXID, FaultECCDBE, FaultGPULost, FaultNVLinkDown} {
				if err := n.checkFaultArch(kind, 1); err != nil {
					t.Errorf("checkFaultArch(%s): %v", kind, err)
				}
			}
		})
	}
}

// TestRemappedRowsWithMIG: nvml.h nvmlDeviceGetRemappedRows returns
// NOT_SUPPORTED "If MIG is enabled".
func TestRemappedRowsWithMIG(t *testing.T) {
	for _, profile := range []string{"dgx-a100", "dgx-h100", "dgx-b200"} {
		t.Run(profile, func(t *testing.T) {
			n := newArchNode(t, profile, migOnGPU0(t, profile))
			lib := n.NVML()
			remap := func(gpu int) nvml.Return {
				dev, _ := lib.DeviceGetHandleByIndex(gpu)
				_, _, _, _, ret := dev.GetRemappedRows()
				return ret
			}
			wantRet(t, "GetRemappedRows on the MIG-enabled gpu", remap(0), false)
			wantRet(t, "GetRemappedRows on a gpu without MIG", remap(1), true)
			if err := n.SetMIGLayout(0, nil); err != nil {
				t.Fatal(err)
			}
			wantRet(t, "GetRemappedRows after MIG off", remap(0), true)
		})
	}
}

func TestNVLinkErrorFields(t *testing.T) {
	dl := []uint32{nvml.FI_DEV_NVLINK_ERROR_DL_REPLAY, nvml.FI_DEV_NVLINK_ERROR_DL_RECOVERY, nvml.FI_DEV_NVLINK_ERROR_DL_CRC}
	nvlink5 := []uint32{nvml.FI_DEV_NVLINK_COUNT_LINK_RECOVERY_SUCCESSFUL_EVENTS,
		nvml.FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS, nvml.FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS}
	for _, tc := range archCases {
		if !tc.nvlinks {
			continue
		}
		t.Run(tc.profile, func(t *testing.T) {
			n := newArchNode(t, tc.profile)
			dev, _ := n.NVML().DeviceGetHandleByIndex(0)
			links := uint32(len(n.gpus[0].links))
			var fvs []nvml.FieldValue
			for _, id := range append(append([]uint32{}, dl...), nvlink5...) {
				fvs = append(fvs, nvml.FieldValue{FieldId: id, ScopeId: links - 1}, nvml.FieldValue{FieldId: id, ScopeId: links})
			}
			fvs = append(fvs, nvml.FieldValue{FieldId: nvml.FI_DEV_MEMORY_TEMP})
			if ret := dev.GetFieldValues(fvs); ret != nvml.SUCCESS {
				t.Fatal(ret)
			}
			for _, fv := range fvs {
				ret := nvml.Return(fv.NvmlReturn)
				supported := true
				switch {
				case fv.FieldId == nvml.FI_DEV_MEMORY_TEMP:
				case fv.FieldId <= nvml.FI_DEV_NVLINK_ERROR_DL_CRC:
					supported = tc.nvlinkErr
				default:
					supported = !tc.nvlinkErr
				}
				want := nvml.ERROR_NOT_SUPPORTED
				switch {
				case supported && fv.FieldId != nvml.FI_DEV_MEMORY_TEMP && fv.ScopeId >= links:
					want = nvml.ERROR_INVALID_ARGUMENT
				case supported:
					want = nvml.SUCCESS
				}
				if ret != want {
					t.Errorf("field %d link %d: got %v, want %v", fv.FieldId, fv.ScopeId, ret, want)
				}
			}
		})
	}
}

// TestUnprivileged checks what a caller without root gets, and that a
// privileged caller (the default) gets what it did before.
func TestUnprivileged(t *testing.T) {
	for _, tc := range archCases {
		t.Run(tc.profile, func(t *testing.T) {
			migCapable := len(profiles[tc.profile].gpu.MIGProfiles.GpuInstanceProfiles) > 0
			var opts []ProfileOption
			if migCapable {
				opts = append(opts, migOnGPU0(t, tc.profile))
			}
			n := newArchNode(t, tc.profile, opts...)
			lib := n.NVML()
			parent, _ := lib.DeviceGetHandleByIndex(0)
			other, _ := lib.DeviceGetHandleByIndex(1)
			var migDev nvmlapi.Device
			if migCapable {
				var ret nvml.Return
				if migDev, ret = parent.GetMigDeviceHandleByIndex(0); ret != nvml.SUCCESS {
					t.Fatal(ret)
				}
			}
			giID := 0
			if migCapable {
				giID = n.Spec().GPUs[0].MIG[0].GPUInstance
			}
			profileInfo := func() nvml.GpuInstanceProfileInfo {
				ps := migProfilesOf(profiles[tc.profile].gpu)
				if len(ps) == 0 {
					return nvml.GpuInstanceProfileInfo{}
				}
				return ps[0].gi
			}

			// answers lists each call with its answer while privileged;
			// unprivileged, the ones marked so answer NO_PERMISSION.
			type answer struct {
				call       string
				fn         func() nvml.Return
				privileged nvml.Return
				denied     bool
			}
			notMIG := nvml.ERROR_NOT_SUPPORTED // calls on a GPU without MIG
			migRet := func(ok nvml.Return) nvml.Return {
				if migCapable {
					return ok
				}
				return notMIG
			}
			retired := nvml.ERROR_NOT_SUPPORTED
			if tc.retired {
				retired = nvml.SUCCESS
			}
			answers := []answer{
				{"GetMemoryInfo on gpu 0", func() nvml.Return { _, r := parent.GetMemoryInfo(); return r }, nvml.SUCCESS, migCapable},
				{"GetMemoryInfo on gpu 1 (no MIG)", func() nvml.Return { _, r := other.GetMemoryInfo(); return r }, nvml.SUCCESS, false},
				{"GetGpuInstanceById", func() nvml.Return { _, r := parent.GetGpuInstanceById(giID); return r }, migRet(nvml.SUCCESS), migCapable},
				{"GetGpuInstances", func() nvml.Return { i := profileInfo(); _, r := mockOf(parent).GetGpuInstances(&i); return r }, migRet(nvml.SUCCESS), migCapable},
				{"GetGpuInstanceProfileInfo", func() nvml.Return {
					_, r := parent.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_1_SLICE)
					return r
				}, migRet(nvml.SUCCESS), false},
				{"CreateGpuInstance", func() nvml.Return { i := profileInfo(); _, r := mockOf(parent).CreateGpuInstance(&i); return r }, notMIG, migCapable},
				{"SetMigMode", func() nvml.Return { _, r := mockOf(parent).SetMigMode(nvml.DEVICE_MIG_DISABLE); return r }, notMIG, migCapable},
				{"SetMigMode activation status", func() nvml.Return { r, _ := mockOf(parent).SetMigMode(nvml.DEVICE_MIG_DISABLE); return r }, notMIG, migCapable},
				{"SetPersistenceMode", func() nvml.Return { return mockOf(other).SetPersistenceMode(nvml.FEATURE_ENABLED) }, nvml.ERROR_NOT_SUPPORTED, true},
				{"SetComputeMode", func() nvml.Return { return mockOf(other).SetComputeMode(nvml.COMPUTEMODE_DEFAULT) }, nvml.ERROR_NOT_SUPPORTED, true},
				{"ClearEccErrorCounts", func() nvml.Return { return mockOf(other).ClearEccErrorCounts(nvml.VOLATILE_ECC) }, nvml.ERROR_NOT_SUPPORTED, true},
				{"SetGpuLockedClocks", func() nvml.Return { return mockOf(other).SetGpuLockedClocks(1000, 1500) }, nvml.ERROR_NOT_SUPPORTED, true},
				// nvml.h does not restrict page retirement queries.
				{"GetRetiredPages", func() nvml.Return {
					_, r := other.GetRetiredPages(nvml.PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
					return r
				}, retired, false},
			}
			if migCapable {
				answers = append(answers, answer{"GetMemoryInfo on a MIG device", func() nvml.Return {
					_, r := migDev.GetMemoryInfo()
					return r
				}, nvml.SUCCESS, false})
			}
			check := func(unprivileged bool) {
				t.Helper()
				for _, a := range answers {
					want := a.privileged
					if unprivileged && a.denied {
						want = nvml.ERROR_NO_PERMISSION
					}
					if got := a.fn(); got != want {
						t.Errorf("unprivileged=%v: %s: got %v, want %v", unprivileged, a.call, got, want)
					}
				}
			}
			check(false)
			n.SetUnprivileged(true)
			check(true)
			n.SetUnprivileged(false)
			check(false)
		})
	}
}

// TestUnprivilegedFollowsMIGLayout: the parent's memory info is denied only
// while MIG is on, and the answer follows run-time layout changes.
func TestUnprivilegedFollowsMIGLayout(t *testing.T) {
	n := newArchNode(t, "dgx-h100")
	n.SetUnprivileged(true)
	dev, _ := n.NVML().DeviceGetHandleByIndex(2)
	mem := func() nvml.Return { _, r := dev.GetMemoryInfo(); return r }
	if got := mem(); got != nvml.SUCCESS {
		t.Fatalf("MIG off: %v", got)
	}
	if err := n.SetMIGLayout(2, []string{migProfilesOf(profiles["dgx-h100"].gpu)[0].name}); err != nil {
		t.Fatal(err)
	}
	if got := mem(); got != nvml.ERROR_NO_PERMISSION {
		t.Fatalf("MIG on: %v, want %v", got, nvml.ERROR_NO_PERMISSION)
	}
	if err := n.SetMIGLayout(2, nil); err != nil {
		t.Fatal(err)
	}
	if got := mem(); got != nvml.SUCCESS {
		t.Fatalf("MIG off again: %v", got)
	}
}

func TestPrivilegedCallsNameMockFields(t *testing.T) {
	n := newArchNode(t, "dgx-1v") // New panics on a field mock.Device lacks
	for _, c := range privilegedCalls {
		if !strings.HasSuffix(c.field, "Func") || c.why == "" {
			t.Errorf("%+v: want a mock field name and the header's words", c)
		}
	}
	_ = n
}
