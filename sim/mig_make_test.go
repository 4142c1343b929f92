package sim

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner/nvmlapi"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// migOnNode is a DGX H100 with GPU 0 in MIG mode and no instance (the
// spec's way: migEnabled with an empty list), or layout on it.
func migOnNode(t *testing.T, layout ...string) (*Node, nvmlapi.Device) {
	t.Helper()
	n := newFaultNode(t, WithMIG(0, layout...))
	dev, ret := n.NVML().DeviceGetHandleByIndex(0)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	return n, dev
}

// profileInfo is GPU dev's info of GPU instance profile p.
func profileInfo(t *testing.T, dev nvmlapi.Device, p int) *nvml.GpuInstanceProfileInfo {
	t.Helper()
	info, ret := dev.GetGpuInstanceProfileInfo(p)
	if ret != nvml.SUCCESS {
		t.Fatalf("GetGpuInstanceProfileInfo(%d): %v", p, ret)
	}
	return &info
}

// makeGI makes a GPU instance of profile p at start/size on dev.
func makeGI(t *testing.T, dev nvmlapi.Device, p int, start, size uint32) nvmlapi.GpuInstance {
	t.Helper()
	gi, ret := dev.CreateGpuInstanceWithPlacement(profileInfo(t, dev, p), &nvml.GpuInstancePlacement{Start: start, Size: size})
	if ret != nvml.SUCCESS || gi == nil {
		t.Fatalf("CreateGpuInstanceWithPlacement(%d at %d+%d): %v", p, start, size, ret)
	}
	return gi
}

// fullCI is the compute instance profile spanning gi, slices big.
func fullCI(t *testing.T, gi nvmlapi.GpuInstance, slices uint32) *nvml.ComputeInstanceProfileInfo {
	t.Helper()
	for p := range nvml.COMPUTE_INSTANCE_PROFILE_COUNT {
		info, ret := gi.GetComputeInstanceProfileInfo(p, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret == nvml.SUCCESS && info.SliceCount == slices {
			return &info
		}
	}
	t.Fatalf("no compute instance profile of %d slices", slices)
	return nil
}

// drained empties the change signal and says whether one was pending.
func drained(n *Node) bool {
	select {
	case <-n.Changed():
		return true
	default:
		return false
	}
}

func TestGpuInstancePossiblePlacements(t *testing.T) {
	n, dev := migOnNode(t, "3g.40gb")
	info := profileInfo(t, dev, nvml.GPU_INSTANCE_PROFILE_3_SLICE)
	// nvml.h: "returns all the possible placements for the given profile
	// regardless of whether MIG is enabled or not": the layout's instance
	// at slices 0-2 leaves the list as it is.
	want := []nvml.GpuInstancePlacement{{Start: 0, Size: 3}, {Start: 4, Size: 3}}
	got, ret := dev.GetGpuInstancePossiblePlacements(info)
	if ret != nvml.SUCCESS || !slices.Equal(got, want) {
		t.Errorf("3g placements %v %v, want %v", got, ret, want)
	}
	off, _ := n.NVML().DeviceGetHandleByIndex(1)
	if got, ret := off.GetGpuInstancePossiblePlacements(info); ret != nvml.SUCCESS || !slices.Equal(got, want) {
		t.Errorf("3g placements with MIG off %v %v, want %v", got, ret, want)
	}
	if _, ret := dev.GetGpuInstancePossiblePlacements(nil); ret != nvml.ERROR_INVALID_ARGUMENT {
		t.Errorf("nil info: %v", ret)
	}
	if _, ret := dev.GetGpuInstancePossiblePlacements(&nvml.GpuInstanceProfileInfo{Id: 99}); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("unknown profile: %v", ret)
	}
	v100, _ := newTestNode(t, "dgx-1v").NVML().DeviceGetHandleByIndex(0)
	if _, ret := v100.GetGpuInstancePossiblePlacements(info); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("a GPU without MIG: %v", ret)
	}
}

func TestCreateGpuInstanceWithPlacement(t *testing.T) {
	n, dev := migOnNode(t, "3g.40gb") // at slices 0-2, GPU instance 1
	drained(n)
	off, _ := n.NVML().DeviceGetHandleByIndex(1)
	p1g := profileInfo(t, dev, nvml.GPU_INSTANCE_PROFILE_1_SLICE)
	tests := []struct {
		name string
		dev  nvmlapi.Device
		info *nvml.GpuInstanceProfileInfo
		at   nvml.GpuInstancePlacement
		want nvml.Return
	}{
		// nvml.h nvmlDeviceCreateGpuInstanceWithPlacement.
		{"mig mode off", off, p1g, nvml.GpuInstancePlacement{Start: 0, Size: 1}, nvml.ERROR_NOT_SUPPORTED},
		{"nil info", dev, nil, nvml.GpuInstancePlacement{Start: 0, Size: 1}, nvml.ERROR_INVALID_ARGUMENT},
		{"unknown profile", dev, &nvml.GpuInstanceProfileInfo{Id: 99}, nvml.GpuInstancePlacement{Start: 0, Size: 1}, nvml.ERROR_INVALID_ARGUMENT},
		{"illegal start", dev, p1g, nvml.GpuInstancePlacement{Start: 7, Size: 1}, nvml.ERROR_INVALID_ARGUMENT},
		{"illegal size", dev, p1g, nvml.GpuInstancePlacement{Start: 4, Size: 2}, nvml.ERROR_INVALID_ARGUMENT},
		{"on the layout's instance", dev, p1g, nvml.GpuInstancePlacement{Start: 2, Size: 1}, nvml.ERROR_INSUFFICIENT_RESOURCES},
		{"whole gpu", dev, profileInfo(t, dev, nvml.GPU_INSTANCE_PROFILE_7_SLICE), nvml.GpuInstancePlacement{Start: 0, Size: 7},
			nvml.ERROR_INSUFFICIENT_RESOURCES},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			gi, ret := tc.dev.CreateGpuInstanceWithPlacement(tc.info, &tc.at)
			if ret != tc.want || gi != nil {
				t.Errorf("got %v, %v; want nil, %v", gi, ret, tc.want)
			}
		})
	}
	if drained(n) {
		t.Error("a refused creation signalled a change")
	}

	gi := makeGI(t, dev, nvml.GPU_INSTANCE_PROFILE_1_SLICE, 5, 1)
	if !drained(n) {
		t.Error("no change signalled")
	}
	info, ret := gi.GetInfo()
	// giIDFor: 1g at slice 5 is GPU instance 12.
	if ret != nvml.SUCCESS || info.Id != 12 || info.ProfileId != p1g.Id || info.Placement != (nvml.GpuInstancePlacement{Start: 5, Size: 1}) {
		t.Errorf("GetInfo = %+v, %v", info, ret)
	}
	if same, ret := dev.GetGpuInstanceById(12); ret != nvml.SUCCESS || same != gi {
		t.Errorf("GetGpuInstanceById(12) = %v, %v; want the same handle", same, ret)
	}
	if _, ret := dev.CreateGpuInstanceWithPlacement(p1g, &nvml.GpuInstancePlacement{Start: 5, Size: 1}); ret != nvml.ERROR_INSUFFICIENT_RESOURCES {
		t.Errorf("a second instance on the slice: %v", ret)
	}
	// The layout's 3g instance and the new one, listed by profile.
	if gis, ret := dev.GetGpuInstances(p1g); ret != nvml.SUCCESS || len(gis) != 1 || gis[0] != gi {
		t.Errorf("GetGpuInstances(1g) = %v, %v", gis, ret)
	}
	if gis, ret := dev.GetGpuInstances(profileInfo(t, dev, nvml.GPU_INSTANCE_PROFILE_3_SLICE)); ret != nvml.SUCCESS || len(gis) != 1 {
		t.Errorf("GetGpuInstances(3g) = %v, %v", gis, ret)
	}
	if _, ret := off.GetGpuInstances(p1g); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("GetGpuInstances with MIG off: %v", ret)
	}
	// A GPU instance is not a MIG device until it has a compute instance.
	if mig := n.Spec().GPUs[0].MIG; len(mig) != 1 {
		t.Errorf("%d MIG devices, want the layout's one", len(mig))
	}

	// The instance count: 1g.10gb+me allows one.
	me := profileInfo(t, dev, nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1)
	makeGI(t, dev, nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, 3, 1)
	if _, ret := dev.CreateGpuInstanceWithPlacement(me, &nvml.GpuInstancePlacement{Start: 4, Size: 1}); ret != nvml.ERROR_INSUFFICIENT_RESOURCES {
		t.Errorf("past the instance count: %v", ret)
	}
}

// TestComputeInstances: a compute instance is a new MIG device everywhere
// the simulator shows one (NVML, GET /state, capability files), and goes
// when destroyed; the GPU instance is in use until then.
func TestComputeInstances(t *testing.T) {
	n, dev := migOnNode(t)
	drained(n)
	gi := makeGI(t, dev, nvml.GPU_INSTANCE_PROFILE_2_SLICE, 2, 2) // GPU instance 4
	caps := filepath.Join(n.HostRoot(), "proc", "driver", "nvidia", "capabilities", "gpu0", "mig")
	if _, err := os.Stat(filepath.Join(caps, "gi4", "access")); err != nil {
		t.Errorf("gpu instance capability: %v", err)
	}

	for _, tc := range []struct {
		profile, eng int
		want         nvml.Return
	}{
		{nvml.COMPUTE_INSTANCE_PROFILE_COUNT, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, nvml.ERROR_INVALID_ARGUMENT},
		{nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_COUNT, nvml.ERROR_INVALID_ARGUMENT},
		{nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, nvml.ERROR_NOT_SUPPORTED},
		{nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, nvml.SUCCESS},
	} {
		if _, ret := gi.GetComputeInstanceProfileInfo(tc.profile, tc.eng); ret != tc.want {
			t.Errorf("GetComputeInstanceProfileInfo(%d, %d) = %v, want %v", tc.profile, tc.eng, ret, tc.want)
		}
	}
	if _, ret := gi.CreateComputeInstance(&nvml.ComputeInstanceProfileInfo{Id: 99}); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("CreateComputeInstance of an unknown profile: %v", ret)
	}

	full := fullCI(t, gi, 2)
	ci, ret := gi.CreateComputeInstance(full)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if !drained(n) {
		t.Error("no change signalled")
	}
	info, ret := ci.GetInfo()
	if ret != nvml.SUCCESS || info.Id != 0 || info.GpuInstance != gi || info.ProfileId != full.Id {
		t.Fatalf("compute instance info %+v, %v", info, ret)
	}
	m, ret := dev.GetMigDeviceHandleByIndex(0)
	if ret != nvml.SUCCESS || m != info.Device {
		t.Fatalf("MIG device 0: %v, %v; want the compute instance's device", m, ret)
	}
	uuid, _ := m.GetUUID()
	spec := n.Spec().GPUs[0].MIG
	want := topology.MIGDevice{UUID: uuid, Profile: "2g.20gb", GPUInstance: 4, ComputeInstance: 0, MemoryMiB: 20480, Index: 0,
		Attributes: topology.MIGAttributes{Multiprocessors: 32, GPUInstanceSlices: 2, ComputeInstanceSlices: 2, CopyEngines: 2, Decoders: 1},
		Placement:  topology.MIGPlacement{Start: 2, Size: 2}}
	if len(spec) != 1 || spec[0] != want {
		t.Errorf("spec MIG %+v, want %+v", spec, want)
	}
	if got, ret := gi.GetComputeInstanceById(0); ret != nvml.SUCCESS || got != ci {
		t.Errorf("GetComputeInstanceById(0) = %v, %v", got, ret)
	}
	if _, ret := gi.GetComputeInstanceById(1); ret != nvml.ERROR_NOT_FOUND {
		t.Errorf("GetComputeInstanceById(1) = %v", ret)
	}
	if _, err := os.Stat(filepath.Join(caps, "gi4", "ci0", "access")); err != nil {
		t.Errorf("compute instance capability: %v", err)
	}
	// The instance is full: nvml.h INSUFFICIENT_RESOURCES.
	if _, ret := gi.CreateComputeInstance(full); ret != nvml.ERROR_INSUFFICIENT_RESOURCES {
		t.Errorf("a second full compute instance: %v", ret)
	}
	// nvml.h nvmlGpuInstanceDestroy: IN_USE while compute instances are
	// active on it.
	if ret := gi.Destroy(); ret != nvml.ERROR_IN_USE {
		t.Errorf("GpuInstance.Destroy with a compute instance: %v", ret)
	}
	// Handles by UUID find it.
	if byUUID, ret := n.NVML().DeviceGetHandleByUUID(uuid); ret != nvml.SUCCESS || byUUID != m {
		t.Errorf("DeviceGetHandleByUUID = %v, %v", byUUID, ret)
	}

	if ret := ci.Destroy(); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if !drained(n) {
		t.Error("no change signalled")
	}
	if ret := ci.Destroy(); ret != nvml.ERROR_INVALID_ARGUMENT {
		t.Errorf("destroying it again: %v", ret)
	}
	if _, ret := ci.GetInfo(); ret != nvml.ERROR_INVALID_ARGUMENT {
		t.Errorf("GetInfo of a destroyed compute instance: %v", ret)
	}
	if _, ret := dev.GetMigDeviceHandleByIndex(0); ret != nvml.ERROR_NOT_FOUND {
		t.Errorf("MIG device 0 after the destroy: %v", ret)
	}
	if _, ret := n.NVML().DeviceGetHandleByUUID(uuid); ret != nvml.ERROR_NOT_FOUND {
		t.Errorf("DeviceGetHandleByUUID after the destroy: %v", ret)
	}
	if len(n.Spec().GPUs[0].MIG) != 0 {
		t.Errorf("spec still lists %+v", n.Spec().GPUs[0].MIG)
	}
	if _, err := os.Stat(filepath.Join(caps, "gi4", "ci0")); !os.IsNotExist(err) {
		t.Errorf("compute instance capability after the destroy: %v", err)
	}
	if _, err := os.Stat(filepath.Join(caps, "gi4", "access")); err != nil {
		t.Errorf("gpu instance capability after the compute instance's destroy: %v", err)
	}

	if ret := gi.Destroy(); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if !drained(n) {
		t.Error("no change signalled")
	}
	if ret := gi.Destroy(); ret != nvml.ERROR_INVALID_ARGUMENT {
		t.Errorf("destroying it again: %v", ret)
	}
	if _, ret := gi.GetInfo(); ret != nvml.ERROR_INVALID_ARGUMENT {
		t.Errorf("GetInfo of a destroyed GPU instance: %v", ret)
	}
	if _, ret := dev.GetGpuInstanceById(4); ret != nvml.ERROR_NOT_FOUND {
		t.Errorf("GetGpuInstanceById after the destroy: %v", ret)
	}
	if _, err := os.Stat(filepath.Join(caps, "gi4")); !os.IsNotExist(err) {
		t.Errorf("gpu instance capability after the destroy: %v", err)
	}
	// The slices are free again.
	makeGI(t, dev, nvml.GPU_INSTANCE_PROFILE_2_SLICE, 2, 2)
}

// TestComputeInstanceIndexes: MIG devices are listed in order of making;
// destroying one moves those after it down an index. UUIDs are
// deterministic: the same calls on another node give the same ones.
func TestComputeInstanceIndexes(t *testing.T) {
	make3 := func(t *testing.T) (*Node, nvmlapi.Device, []nvmlapi.ComputeInstance, []string) {
		n, dev := migOnNode(t)
		var cis []nvmlapi.ComputeInstance
		var uuids []string
		for _, start := range []uint32{0, 1, 2} {
			gi := makeGI(t, dev, nvml.GPU_INSTANCE_PROFILE_1_SLICE, start, 1)
			ci, ret := gi.CreateComputeInstance(fullCI(t, gi, 1))
			if ret != nvml.SUCCESS {
				t.Fatal(ret)
			}
			info, _ := ci.GetInfo()
			uuid, _ := info.Device.GetUUID()
			cis, uuids = append(cis, ci), append(uuids, uuid)
		}
		return n, dev, cis, uuids
	}
	n, dev, cis, uuids := make3(t)
	_, _, _, again := make3(t)
	if distinct := slices.Compact(slices.Sorted(slices.Values(uuids))); !slices.Equal(uuids, again) || len(distinct) != 3 {
		t.Errorf("UUIDs %v and %v: want three, the same on both nodes", uuids, again)
	}
	if ret := cis[0].Destroy(); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	for idx, want := range uuids[1:] {
		m, ret := dev.GetMigDeviceHandleByIndex(idx)
		if ret != nvml.SUCCESS {
			t.Fatalf("MIG device %d: %v", idx, ret)
		}
		if uuid, _ := m.GetUUID(); uuid != want {
			t.Errorf("MIG device %d is %s, want %s", idx, uuid, want)
		}
		if i, _ := mockOf(m).GetIndex(); i != idx {
			t.Errorf("MIG device %s: index %d, want %d", want, i, idx)
		}
	}
	if spec := n.Spec().GPUs[0].MIG; len(spec) != 2 || spec[0].UUID != uuids[1] || spec[0].Index != 0 || spec[1].Index != 1 {
		t.Errorf("spec MIG %+v", spec)
	}
}

// TestMIGLayoutReplacesInstances: a layout change invalidates the handles
// of the instances it replaced, and its instances carry placements that
// made instances collide with.
func TestMIGLayoutReplacesInstances(t *testing.T) {
	n, dev := migOnNode(t)
	gi := makeGI(t, dev, nvml.GPU_INSTANCE_PROFILE_1_SLICE, 0, 1)
	if err := n.SetMIGLayout(0, []string{"4g.40gb"}); err != nil {
		t.Fatal(err)
	}
	if _, ret := gi.GetInfo(); ret != nvml.ERROR_INVALID_ARGUMENT {
		t.Errorf("GetInfo of a replaced GPU instance: %v", ret)
	}
	if p := n.Spec().GPUs[0].MIG[0].Placement; p != (topology.MIGPlacement{Start: 0, Size: 4}) {
		t.Errorf("layout's 4g.40gb at %+v", p)
	}
	p1g := profileInfo(t, dev, nvml.GPU_INSTANCE_PROFILE_1_SLICE)
	if _, ret := dev.CreateGpuInstanceWithPlacement(p1g, &nvml.GpuInstancePlacement{Start: 3, Size: 1}); ret != nvml.ERROR_INSUFFICIENT_RESOURCES {
		t.Errorf("on the layout's 4g instance: %v", ret)
	}
	makeGI(t, dev, nvml.GPU_INSTANCE_PROFILE_1_SLICE, 4, 1)
}

// TestSpecLayoutPlacements: a spec's MIG layout without placements (an
// older snapshot) gets the ones its GPU instance IDs stand for, and made
// instances collide with them.
func TestSpecLayoutPlacements(t *testing.T) {
	spec, err := Profile("dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	spec.GPUs[0].MIGEnabled = true
	spec.GPUs[0].MIG = []topology.MIGDevice{
		{UUID: "MIG-00000000-0000-0000-0000-000000000001", Profile: "3g.40gb", GPUInstance: 2},
		{UUID: "MIG-00000000-0000-0000-0000-000000000002", Profile: "1g.10gb", GPUInstance: 9, Index: 1},
	}
	n, err := New(spec, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	got := n.Spec().GPUs[0].MIG
	if got[0].Placement != (topology.MIGPlacement{Start: 4, Size: 3}) || got[1].Placement != (topology.MIGPlacement{Start: 2, Size: 1}) {
		t.Errorf("placements %+v, %+v; want 4+3 (GI 2), 2+1 (GI 9)", got[0].Placement, got[1].Placement)
	}
	dev, _ := n.NVML().DeviceGetHandleByIndex(0)
	p3g := profileInfo(t, dev, nvml.GPU_INSTANCE_PROFILE_3_SLICE)
	if _, ret := dev.CreateGpuInstanceWithPlacement(p3g, &nvml.GpuInstancePlacement{Start: 4, Size: 3}); ret != nvml.ERROR_INSUFFICIENT_RESOURCES {
		t.Errorf("on the spec's 3g instance: %v", ret)
	}
}

// TestMIGModeWithoutInstances: MIG mode on with no instance, by spec and
// at run time (POST /mig with migMode), distinct from MIG off.
func TestMIGModeWithoutInstances(t *testing.T) {
	n, dev := migOnNode(t)
	if cur, _, ret := dev.GetMigMode(); ret != nvml.SUCCESS || cur != nvml.DEVICE_MIG_ENABLE {
		t.Errorf("spec with an empty layout: mode %d, %v", cur, ret)
	}
	if g := n.Spec().GPUs[0]; !g.MIGEnabled || len(g.MIG) != 0 {
		t.Errorf("spec: enabled %t, %d MIG devices", g.MIGEnabled, len(g.MIG))
	}
	if _, ret := dev.GetMigDeviceHandleByIndex(0); ret != nvml.ERROR_NOT_FOUND {
		t.Errorf("MIG device 0: %v", ret)
	}

	post := func(body string) int {
		rec := httptest.NewRecorder()
		n.ControlHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/mig", strings.NewReader(body)))
		return rec.Code
	}
	mode := func(gpu int) int {
		d, _ := n.NVML().DeviceGetHandleByIndex(gpu)
		cur, _, _ := d.GetMigMode()
		return cur
	}
	drained(n)
	for _, tc := range []struct {
		body string
		code int
		mode int
		migs int
	}{
		{`{"gpu":1,"migMode":true,"profiles":[]}`, http.StatusOK, nvml.DEVICE_MIG_ENABLE, 0},
		{`{"gpu":1,"migMode":true,"profiles":["1g.10gb"]}`, http.StatusOK, nvml.DEVICE_MIG_ENABLE, 1},
		{`{"gpu":1,"migMode":true}`, http.StatusOK, nvml.DEVICE_MIG_ENABLE, 0},
		{`{"gpu":1,"profiles":[]}`, http.StatusOK, nvml.DEVICE_MIG_DISABLE, 0},
		{`{"gpu":1,"migMode":false,"profiles":["1g.10gb"]}`, http.StatusBadRequest, nvml.DEVICE_MIG_DISABLE, 0},
		{`{"gpu":1,"migMode":"on"}`, http.StatusBadRequest, nvml.DEVICE_MIG_DISABLE, 0},
	} {
		if code := post(tc.body); code != tc.code {
			t.Errorf("POST /mig %s: %d, want %d", tc.body, code, tc.code)
		}
		if m, migs := mode(1), len(n.Spec().GPUs[1].MIG); m != tc.mode || migs != tc.migs {
			t.Errorf("after %s: mode %d with %d MIG devices, want %d with %d", tc.body, m, migs, tc.mode, tc.migs)
		}
		if signalled := drained(n); signalled != (tc.code == http.StatusOK) {
			t.Errorf("after %s: change signalled %t", tc.body, signalled)
		}
	}
	if err := n.EnableMIG(2); err != nil {
		t.Fatal(err)
	}
	if mode(2) != nvml.DEVICE_MIG_ENABLE || !n.Spec().GPUs[2].MIGEnabled {
		t.Error("EnableMIG left MIG off")
	}
	if err := newTestNode(t, "dgx-1v").EnableMIG(0); err == nil {
		t.Error("EnableMIG on a V100 succeeded")
	}
}

// TestMIGCreateFault: the mig-create-fails fault makes the GPU instance
// (by default, as INSUFFICIENT_RESOURCES) or the compute instance call
// fail until cleared.
func TestMIGCreateFault(t *testing.T) {
	n, dev := migOnNode(t)
	p1g := profileInfo(t, dev, nvml.GPU_INSTANCE_PROFILE_1_SLICE)
	at := &nvml.GpuInstancePlacement{Start: 0, Size: 1}
	inject := func(method, body string) int {
		rec := httptest.NewRecorder()
		n.ControlHandler().ServeHTTP(rec, httptest.NewRequest(method, "/faults", strings.NewReader(body)))
		return rec.Code
	}
	for _, bad := range []string{
		`{"kind":"mig-create-fails","gpu":0,"call":"SetMigMode"}`,
		`{"kind":"mig-create-fails","gpu":0,"ret":"ERROR_TIMEOUT"}`,
		`{"kind":"mig-create-fails","gpu":9}`,
	} {
		if code := inject(http.MethodPost, bad); code != http.StatusBadRequest {
			t.Errorf("POST /faults %s: %d, want 400", bad, code)
		}
	}
	if code := (func() int {
		v100 := newTestNode(t, "dgx-1v")
		rec := httptest.NewRecorder()
		v100.ControlHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/faults", strings.NewReader(`{"kind":"mig-create-fails","gpu":0}`)))
		return rec.Code
	})(); code != http.StatusBadRequest {
		t.Errorf("fault on a GPU without MIG: %d, want 400", code)
	}

	if code := inject(http.MethodPost, `{"kind":"mig-create-fails","gpu":0}`); code != http.StatusNoContent {
		t.Fatalf("POST: %d", code)
	}
	if _, ret := dev.CreateGpuInstanceWithPlacement(p1g, at); ret != nvml.ERROR_INSUFFICIENT_RESOURCES {
		t.Errorf("under the fault: %v", ret)
	}
	// A bad request is still refused as nvml.h says, not by the fault.
	if _, ret := dev.CreateGpuInstanceWithPlacement(p1g, &nvml.GpuInstancePlacement{Start: 9, Size: 1}); ret != nvml.ERROR_INVALID_ARGUMENT {
		t.Errorf("illegal placement under the fault: %v", ret)
	}
	if code := inject(http.MethodPost, `{"kind":"mig-create-fails","gpu":0,"call":"CreateComputeInstance","ret":"ERROR_NO_PERMISSION"}`); code != http.StatusNoContent {
		t.Fatalf("POST: %d", code)
	}
	gi := makeGI(t, dev, nvml.GPU_INSTANCE_PROFILE_1_SLICE, 0, 1)
	full := fullCI(t, gi, 1)
	if _, ret := gi.CreateComputeInstance(full); ret != nvml.ERROR_NO_PERMISSION {
		t.Errorf("compute instance under the fault: %v", ret)
	}
	if code := inject(http.MethodDelete, `{"kind":"mig-create-fails","gpu":0}`); code != http.StatusNoContent {
		t.Fatalf("DELETE: %d", code)
	}
	if _, ret := gi.CreateComputeInstance(full); ret != nvml.SUCCESS {
		t.Errorf("after the fault: %v", ret)
	}
}

// TestMIGInstancesLostHungCounted: instance calls answer GPU_IS_LOST on a
// lost GPU, wait while it hangs, and are counted.
func TestMIGInstancesLostHungCounted(t *testing.T) {
	n, dev := migOnNode(t)
	gi := makeGI(t, dev, nvml.GPU_INSTANCE_PROFILE_1_SLICE, 0, 1)
	p1g := profileInfo(t, dev, nvml.GPU_INSTANCE_PROFILE_1_SLICE)

	if err := n.InjectFault(Fault{Kind: FaultGPULost, GPU: 0}); err != nil {
		t.Fatal(err)
	}
	if _, ret := gi.GetInfo(); ret != nvml.ERROR_GPU_IS_LOST {
		t.Errorf("GetInfo on a lost GPU: %v", ret)
	}
	if _, ret := dev.CreateGpuInstanceWithPlacement(p1g, &nvml.GpuInstancePlacement{Start: 1, Size: 1}); ret != nvml.ERROR_GPU_IS_LOST {
		t.Errorf("CreateGpuInstanceWithPlacement on a lost GPU: %v", ret)
	}
	if ret := gi.Destroy(); ret != nvml.ERROR_GPU_IS_LOST {
		t.Errorf("Destroy on a lost GPU: %v", ret)
	}
	if err := n.ClearFault(Fault{Kind: FaultGPULost, GPU: 0}); err != nil {
		t.Fatal(err)
	}

	n.gates[0].setHang(true)
	done := make(chan nvml.Return)
	go func() {
		_, ret := gi.GetInfo()
		done <- ret
	}()
	waitHeld(t, n, 0, 1)
	n.gates[0].setHang(false)
	if ret := <-done; ret != nvml.SUCCESS {
		t.Errorf("GetInfo after the hang: %v", ret)
	}

	calls := n.NVMLCalls()
	for name, want := range map[string]uint64{"CreateGpuInstanceWithPlacement": 2, "GpuInstanceGetInfo": 2, "GpuInstanceDestroy": 1} {
		if calls[name] != want {
			t.Errorf("%s counted %d times, want %d", name, calls[name], want)
		}
	}
}

// TestMIGUnprivileged: making a GPU instance needs privileges (nvml.h:
// "Requires privileged user").
func TestMIGUnprivileged(t *testing.T) {
	n, dev := migOnNode(t)
	n.SetUnprivileged(true)
	p1g := profileInfo(t, dev, nvml.GPU_INSTANCE_PROFILE_1_SLICE)
	if _, ret := dev.CreateGpuInstanceWithPlacement(p1g, &nvml.GpuInstancePlacement{Start: 0, Size: 1}); ret != nvml.ERROR_NO_PERMISSION {
		t.Errorf("unprivileged CreateGpuInstanceWithPlacement: %v", ret)
	}
	if _, ret := dev.GetGpuInstancePossiblePlacements(p1g); ret != nvml.ERROR_NO_PERMISSION {
		t.Errorf("unprivileged GetGpuInstancePossiblePlacements: %v", ret)
	}
}

// TestPlaceLayout: the placement search honours taken slices and the
// preference, and fails when nothing fits.
func TestPlaceLayout(t *testing.T) {
	cfg := realisticMIG(gpus.H100_SXM5_80GB)
	byName := map[string]migProfile{}
	for _, p := range migProfilesOf(cfg) {
		byName[p.name] = p
	}
	got, ok := placeLayout(cfg, []migProfile{byName["3g.40gb"], byName["1g.10gb"]},
		[]nvml.GpuInstancePlacement{{Start: 0, Size: 3}}, nil)
	if !ok || got[0] != (nvml.GpuInstancePlacement{Start: 4, Size: 3}) || got[1] != (nvml.GpuInstancePlacement{Start: 3, Size: 1}) {
		t.Errorf("placed %v, %t", got, ok)
	}
	if _, ok := placeLayout(cfg, []migProfile{byName["7g.80gb"]}, []nvml.GpuInstancePlacement{{Start: 6, Size: 1}}, nil); ok {
		t.Error("7g.80gb placed beside a taken slice")
	}
}
