package nvmlowner

import (
	"context"
	"errors"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner/nvmlapi"
	"github.com/gpu-node-agent/gpu-node-agent/sim"
	"github.com/gpu-node-agent/gpu-node-agent/sim/simtest"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// migMakeNode is a simulated DGX H100 with GPU 0 in MIG mode and no MIG
// device (layout, if given, instead), and an owner over it.
func migMakeNode(t *testing.T, timeout time.Duration, layout ...string) (*sim.Node, *Owner) {
	t.Helper()
	spec, err := sim.Profile("dgx-h100", sim.WithMIG(0, layout...))
	if err != nil {
		t.Fatal(err)
	}
	node, err := sim.New(spec, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	o := New(node.NVML(), Config{CallTimeout: timeout}, nil)
	if err := o.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	return node, o
}

// discoverWith is one discovery through o with opts.
func discoverWith(t *testing.T, o *Owner, node *sim.Node, opts DiscoverOptions) *topology.Node {
	t.Helper()
	x := NewDiscoverer(o, node.HostRoot(), nil)
	x.SetOptions(opts)
	got, err := x.Discover(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// gpuInstancesOf counts GPU 0's GPU instances of profile, through NVML.
func gpuInstancesOf(t *testing.T, node *sim.Node, profile int) int {
	t.Helper()
	dev, ret := node.NVML().DeviceGetHandleByIndex(0)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	info, ret := dev.GetGpuInstanceProfileInfo(profile)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	gis, ret := dev.GetGpuInstances(&info)
	if ret != nvml.SUCCESS {
		t.Fatalf("GetGpuInstances: %v", ret)
	}
	return len(gis)
}

var (
	place3g = topology.MIGPlacement{Start: 4, Size: 3}
	place1g = topology.MIGPlacement{Start: 0, Size: 1}
)

// TestMakeMIG: a MIG device made on demand is the device discovery then
// finds (profile, placement, instances, UUID), and the simulator lists
// it; a second one is listed after it.
func TestMakeMIG(t *testing.T) {
	node, o := migMakeNode(t, 5*time.Second)
	ctx := context.Background()
	gpu0 := node.Spec().GPUs[0].UUID

	m, err := o.MakeMIG(ctx, gpu0, nvml.GPU_INSTANCE_PROFILE_3_SLICE, place3g)
	if err != nil {
		t.Fatal(err)
	}
	// giIDFor: a 3g instance at slice 4 is GPU instance 2.
	if m.Profile != "3g.40gb" || m.Placement != place3g || m.GPUInstance != 2 || m.ComputeInstance != 0 ||
		m.Index != 0 || !strings.HasPrefix(m.UUID, "MIG-") || m.MemoryMiB != 40960 || m.Attributes.GPUInstanceSlices != 3 {
		t.Errorf("made %+v", m)
	}
	second, err := o.MakeMIG(ctx, gpu0, nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, place1g)
	if err != nil {
		t.Fatal(err)
	}
	if second.Profile != "1g.10gb+me" || second.Index != 1 || second.GPUInstance != 7 || second.Placement != place1g {
		t.Errorf("second made %+v", second)
	}

	got := discoverWith(t, o, node, DiscoverOptions{}).GPUs[0]
	if want := []topology.MIGDevice{m, second}; !got.MIGEnabled || !reflect.DeepEqual(got.MIG, want) {
		t.Errorf("discovered:\n got  %+v\n want %+v", got.MIG, want)
	}
	if spec := node.Spec().GPUs[0].MIG; !reflect.DeepEqual(spec, got.MIG) {
		t.Errorf("simulator lists:\n %+v\n discovery found\n %+v", spec, got.MIG)
	}
}

// TestMakeMIGRefused: what NVML refuses leaves nothing behind, and the
// error names the step and wraps nvml.h's return.
func TestMakeMIGRefused(t *testing.T) {
	tests := []struct {
		name    string
		gpu     int
		profile int
		at      topology.MIGPlacement
		step    string
		want    nvml.Return
	}{
		// nvml.h nvmlDeviceGetGpuInstancePossiblePlacements_v2:
		// "Creation of new GPU instance will fail if there is overlap
		// with the already occupied memory slices";
		// nvmlDeviceCreateGpuInstanceWithPlacement: INSUFFICIENT_RESOURCES.
		{"overlapping slice", 0, nvml.GPU_INSTANCE_PROFILE_1_SLICE, topology.MIGPlacement{Start: 1, Size: 1},
			"CreateGpuInstanceWithPlacement", nvml.ERROR_INSUFFICIENT_RESOURCES},
		{"overlapping whole gpu", 0, nvml.GPU_INSTANCE_PROFILE_7_SLICE, topology.MIGPlacement{Start: 0, Size: 7},
			"CreateGpuInstanceWithPlacement", nvml.ERROR_INSUFFICIENT_RESOURCES},
		// H100's 1g.10gb+me allows one instance: a second, on free
		// slices, is refused.
		{"instance count", 0, nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, topology.MIGPlacement{Start: 4, Size: 1},
			"CreateGpuInstanceWithPlacement", nvml.ERROR_INSUFFICIENT_RESOURCES},
		// INVALID_ARGUMENT "If device, profile, profileId, placement or
		// gpuInstance are invalid".
		{"illegal placement", 0, nvml.GPU_INSTANCE_PROFILE_3_SLICE, topology.MIGPlacement{Start: 1, Size: 3},
			"CreateGpuInstanceWithPlacement", nvml.ERROR_INVALID_ARGUMENT},
		{"wrong size", 0, nvml.GPU_INSTANCE_PROFILE_2_SLICE, topology.MIGPlacement{Start: 0, Size: 1},
			"CreateGpuInstanceWithPlacement", nvml.ERROR_INVALID_ARGUMENT},
		// nvmlDeviceGetGpuInstanceProfileInfo: NOT_SUPPORTED "If device
		// doesn't support MIG or profile isn't supported".
		{"profile the gpu lacks", 0, nvml.GPU_INSTANCE_PROFILE_6_SLICE, topology.MIGPlacement{Start: 0, Size: 6},
			"GetGpuInstanceProfileInfo", nvml.ERROR_NOT_SUPPORTED},
		// NOT_SUPPORTED "If device doesn't have MIG mode enabled".
		{"mig mode off", 1, nvml.GPU_INSTANCE_PROFILE_1_SLICE, topology.MIGPlacement{Start: 0, Size: 1},
			"CreateGpuInstanceWithPlacement", nvml.ERROR_NOT_SUPPORTED},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			node, o := migMakeNode(t, 5*time.Second, "3g.40gb")
			before := node.Spec()
			// The layout's 3g instance sits at the first 3g placement.
			if p := before.GPUs[0].MIG[0].Placement; p != (topology.MIGPlacement{Start: 0, Size: 3}) {
				t.Fatalf("layout's 3g.40gb at %+v, want slices 0-2", p)
			}
			if tc.name == "instance count" {
				if _, err := o.MakeMIG(context.Background(), before.GPUs[0].UUID, tc.profile, tc.at); err != nil {
					t.Fatal(err)
				}
				before = node.Spec()
				tc.at = topology.MIGPlacement{Start: 5, Size: 1}
			}
			_, err := o.MakeMIG(context.Background(), before.GPUs[tc.gpu].UUID, tc.profile, tc.at)
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.step) {
				t.Fatalf("MakeMIG: %v, want %s from %s", err, tc.want, tc.step)
			}
			var ce *CallError
			if !errors.As(err, &ce) || !strings.HasSuffix(ce.What, tc.step) {
				t.Errorf("error %v: want a CallError naming %s", err, tc.step)
			}
			if after := node.Spec(); !reflect.DeepEqual(after.GPUs, before.GPUs) {
				t.Errorf("refused make changed the node:\n %+v\n→ %+v", before.GPUs[tc.gpu].MIG, after.GPUs[tc.gpu].MIG)
			}
			if tc.gpu == 0 && tc.profile == nvml.GPU_INSTANCE_PROFILE_1_SLICE && gpuInstancesOf(t, node, tc.profile) != 0 {
				t.Error("a GPU instance was left behind")
			}
		})
	}
}

// TestMakeMIGRollsBack: when the compute instance cannot be made, the GPU
// instance made before it is destroyed again; the placement is free
// afterwards.
func TestMakeMIGRollsBack(t *testing.T) {
	node, o := migMakeNode(t, 5*time.Second)
	gpu0 := node.Spec().GPUs[0].UUID
	fault := `{"kind":"mig-create-fails","gpu":0,"call":"CreateComputeInstance","ret":"ERROR_UNKNOWN"}`
	simtest.Fault(t, node, http.MethodPost, fault)
	_, err := o.MakeMIG(context.Background(), gpu0, nvml.GPU_INSTANCE_PROFILE_3_SLICE, place3g)
	if !errors.Is(err, nvml.ERROR_UNKNOWN) || !strings.Contains(err.Error(), "GpuInstance.CreateComputeInstance") {
		t.Fatalf("MakeMIG: %v, want ERROR_UNKNOWN from GpuInstance.CreateComputeInstance", err)
	}
	if n := gpuInstancesOf(t, node, nvml.GPU_INSTANCE_PROFILE_3_SLICE); n != 0 {
		t.Errorf("%d GPU instances left behind", n)
	}
	if mig := node.Spec().GPUs[0].MIG; len(mig) != 0 {
		t.Errorf("MIG devices left behind: %+v", mig)
	}
	simtest.Fault(t, node, http.MethodDelete, fault)
	if _, err := o.MakeMIG(context.Background(), gpu0, nvml.GPU_INSTANCE_PROFILE_3_SLICE, place3g); err != nil {
		t.Errorf("the placement is not free after the rollback: %v", err)
	}
}

// TestMakeMIGFaultOnGPUInstance: the fault's default, the GPU instance
// refused as if the slices were taken.
func TestMakeMIGFaultOnGPUInstance(t *testing.T) {
	node, o := migMakeNode(t, 5*time.Second)
	simtest.Fault(t, node, http.MethodPost, `{"kind":"mig-create-fails","gpu":0}`)
	_, err := o.MakeMIG(context.Background(), node.Spec().GPUs[0].UUID, nvml.GPU_INSTANCE_PROFILE_1_SLICE, place1g)
	if !errors.Is(err, nvml.ERROR_INSUFFICIENT_RESOURCES) {
		t.Fatalf("MakeMIG: %v, want ERROR_INSUFFICIENT_RESOURCES", err)
	}
}

// TestUnmakeMIG: unmaking destroys the compute and GPU instance; again,
// or where nothing was made, it succeeds; a GPU instance left without its
// compute instance (a crash between the two) is cleaned up; a device in
// use is refused.
func TestUnmakeMIG(t *testing.T) {
	node, o := migMakeNode(t, 5*time.Second)
	ctx := context.Background()
	gpu0 := node.Spec().GPUs[0].UUID
	m, err := o.MakeMIG(ctx, gpu0, nvml.GPU_INSTANCE_PROFILE_3_SLICE, place3g)
	if err != nil {
		t.Fatal(err)
	}

	// In use: nvml.h nvmlComputeInstanceDestroy IN_USE.
	pid, err := node.StartProcess(sim.ProcessSpec{GPU: 0, MIG: m.UUID, MemoryMiB: 1024, Kind: sim.ProcessHost})
	if err != nil {
		t.Fatal(err)
	}
	if err := o.UnmakeMIG(ctx, gpu0, nvml.GPU_INSTANCE_PROFILE_3_SLICE, place3g, ""); !errors.Is(err, nvml.ERROR_IN_USE) {
		t.Errorf("UnmakeMIG of a device in use: %v, want ERROR_IN_USE", err)
	}
	if err := node.StopProcess(pid); err != nil {
		t.Fatal(err)
	}

	for range 2 {
		if err := o.UnmakeMIG(ctx, gpu0, nvml.GPU_INSTANCE_PROFILE_3_SLICE, place3g, ""); err != nil {
			t.Fatalf("UnmakeMIG: %v", err)
		}
		if mig := node.Spec().GPUs[0].MIG; len(mig) != 0 {
			t.Fatalf("MIG devices left: %+v", mig)
		}
		if n := gpuInstancesOf(t, node, nvml.GPU_INSTANCE_PROFILE_3_SLICE); n != 0 {
			t.Fatalf("%d GPU instances left", n)
		}
	}
	for _, tc := range []struct {
		gpu     int
		profile int
		at      topology.MIGPlacement
	}{
		{0, nvml.GPU_INSTANCE_PROFILE_1_SLICE, place1g},
		{0, nvml.GPU_INSTANCE_PROFILE_6_SLICE, topology.MIGPlacement{}}, // a profile the GPU lacks
		{1, nvml.GPU_INSTANCE_PROFILE_1_SLICE, place1g},                 // MIG mode off
	} {
		if err := o.UnmakeMIG(ctx, node.Spec().GPUs[tc.gpu].UUID, tc.profile, tc.at, ""); err != nil {
			t.Errorf("UnmakeMIG on gpu %d of profile %d where nothing is: %v", tc.gpu, tc.profile, err)
		}
	}

	// A GPU instance without its compute instance.
	dev, _ := node.NVML().DeviceGetHandleByIndex(0)
	info, _ := dev.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_1_SLICE)
	if _, ret := dev.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: 2, Size: 1}); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if err := o.UnmakeMIG(ctx, gpu0, nvml.GPU_INSTANCE_PROFILE_1_SLICE, topology.MIGPlacement{Start: 2, Size: 1}, ""); err != nil {
		t.Fatal(err)
	}
	if n := gpuInstancesOf(t, node, nvml.GPU_INSTANCE_PROFILE_1_SLICE); n != 0 {
		t.Errorf("%d GPU instances left", n)
	}
}

// TestMakeMIGHungGPU: a hung GPU costs MakeMIG and UnmakeMIG one call
// timeout (ErrTimeout), as any call on its lane. The make held by the
// hang goes on once the GPU answers again; UnmakeMIG then cleans it up.
func TestMakeMIGHungGPU(t *testing.T) {
	node, o := migMakeNode(t, 200*time.Millisecond)
	ctx := context.Background()
	gpu0 := node.Spec().GPUs[0].UUID
	// A first call looks the handle up, so the hang holds a MIG call.
	if err := o.UnmakeMIG(ctx, gpu0, nvml.GPU_INSTANCE_PROFILE_1_SLICE, place1g, ""); err != nil {
		t.Fatal(err)
	}
	hang := `{"kind":"hang","gpu":0}`
	simtest.Fault(t, node, http.MethodPost, hang)
	if _, err := o.MakeMIG(ctx, gpu0, nvml.GPU_INSTANCE_PROFILE_1_SLICE, place1g); !errors.Is(err, ErrTimeout) || !errors.Is(err, ErrMaybeMade) {
		t.Errorf("MakeMIG on a hung GPU: %v, want ErrTimeout and ErrMaybeMade", err)
	}
	if err := o.UnmakeMIG(ctx, gpu0, nvml.GPU_INSTANCE_PROFILE_1_SLICE, place1g, ""); !errors.Is(err, ErrTimeout) {
		t.Errorf("UnmakeMIG on a hung GPU: %v, want ErrTimeout", err)
	}
	simtest.Fault(t, node, http.MethodDelete, hang)
	// The lane is free once the held make has finished; a liveness
	// bound, not a timing assertion.
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := o.UnmakeMIG(ctx, gpu0, nvml.GPU_INSTANCE_PROFILE_1_SLICE, place1g, "")
		if err == nil {
			break
		}
		if !errors.Is(err, ErrTimeout) || time.Now().After(deadline) {
			t.Fatalf("UnmakeMIG after the hang: %v", err)
		}
	}
	if mig := node.Spec().GPUs[0].MIG; len(mig) != 0 {
		t.Errorf("MIG devices left: %+v", mig)
	}
}

// TestDiscoverMIGProfiles: with DiscoverOptions.MIGProfiles a GPU in MIG
// mode lists its GPU instance profiles by ID, each with every placement
// of the model's table, occupied or not; without it, or on a GPU not in
// MIG mode, none.
func TestDiscoverMIGProfiles(t *testing.T) {
	node, o := migMakeNode(t, 5*time.Second, "3g.40gb")
	if got := discoverWith(t, o, node, DiscoverOptions{}); len(got.GPUs[0].MIGProfiles) != 0 {
		t.Errorf("profiles read without the option: %+v", got.GPUs[0].MIGProfiles)
	}
	got := discoverWith(t, o, node, DiscoverOptions{MIGProfiles: true})
	for i, g := range got.GPUs[1:] {
		if len(g.MIGProfiles) != 0 {
			t.Errorf("gpu %d (MIG off): profiles %+v", i+1, g.MIGProfiles)
		}
	}
	profiles := got.GPUs[0].MIGProfiles
	var names []string
	for _, p := range profiles {
		names = append(names, p.Name)
	}
	// go-nvml's H100 table, by GPU_INSTANCE_PROFILE_* value.
	want := []string{"1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb", "1g.10gb+me", "1g.20gb"}
	if !slices.Equal(names, want) {
		t.Fatalf("profiles %v, want %v", names, want)
	}
	if !slices.IsSortedFunc(profiles, func(a, b topology.MIGProfile) int { return a.ID - b.ID }) {
		t.Error("profiles not in ID order")
	}
	p3 := profiles[2]
	if p3.ID != nvml.GPU_INSTANCE_PROFILE_3_SLICE || p3.MemoryMiB != 40960 ||
		!slices.Equal(p3.Placements, []topology.MIGPlacement{{Start: 0, Size: 3}, {Start: 4, Size: 3}}) ||
		p3.Attributes != (topology.MIGAttributes{Multiprocessors: 48, GPUInstanceSlices: 3, ComputeInstanceSlices: 3, CopyEngines: 3, Decoders: 2}) {
		t.Errorf("3g.40gb: %+v", p3)
	}
	if n := len(profiles[0].Placements); n != 7 {
		t.Errorf("1g.10gb: %d placements, want all 7", n)
	}
	// A device made on demand is named as its profile (the layout's
	// 3g.40gb holds the first placement).
	m, err := o.MakeMIG(context.Background(), got.GPUs[0].UUID, p3.ID, p3.Placements[1])
	if err != nil {
		t.Fatal(err)
	}
	if m.Profile != p3.Name {
		t.Errorf("made %s from profile %s", m.Profile, p3.Name)
	}
}

// TestDiscoverMIGProfilesReused: a GPU that stays in MIG mode keeps the
// profiles of the previous discovery without asking NVML again.
func TestDiscoverMIGProfilesReused(t *testing.T) {
	node, o := migMakeNode(t, 5*time.Second)
	x := NewDiscoverer(o, node.HostRoot(), nil)
	x.SetOptions(DiscoverOptions{MIGProfiles: true})
	first, err := x.Discover(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	before := node.NVMLCalls()["GetGpuInstancePossiblePlacements"]
	second, err := x.Discover(context.Background(), first)
	if err != nil {
		t.Fatal(err)
	}
	if after := node.NVMLCalls()["GetGpuInstancePossiblePlacements"]; after != before {
		t.Errorf("%d placement calls on a rediscovery, want none", after-before)
	}
	if !reflect.DeepEqual(first.GPUs[0].MIGProfiles, second.GPUs[0].MIGProfiles) || len(second.GPUs[0].MIGProfiles) == 0 {
		t.Errorf("profiles not kept: %+v", second.GPUs[0].MIGProfiles)
	}
}

// TestMakeMIGRollbackSteps: with go-nvml's mocks behind the real binding,
// every failure after the GPU instance's creation destroys what was made,
// newest first; a rollback that fails is reported with the step's error.
func TestMakeMIGRollbackSteps(t *testing.T) {
	tests := []struct {
		name string
		// ciFails, findFails: the compute instance is refused, or its MIG
		// device is not among the handles; giDestroy is what the GPU
		// instance's Destroy answers.
		ciFails, findFails bool
		giDestroy          nvml.Return
		want               []nvml.Return
		destroyed          []string
	}{
		{"compute instance refused", true, false, nvml.SUCCESS,
			[]nvml.Return{nvml.ERROR_INSUFFICIENT_RESOURCES}, []string{"gi"}},
		{"compute instance refused, rollback fails", true, false, nvml.ERROR_IN_USE,
			[]nvml.Return{nvml.ERROR_INSUFFICIENT_RESOURCES, nvml.ERROR_IN_USE}, []string{"gi"}},
		{"mig device not found", false, true, nvml.SUCCESS,
			[]nvml.Return{nvml.ERROR_NOT_FOUND}, []string{"ci", "gi"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeLib()
			gpu := f.devs["GPU-a"]
			var destroyed []string
			ci := &mock.ComputeInstance{
				GetInfoFunc: func() (nvml.ComputeInstanceInfo, nvml.Return) { return nvml.ComputeInstanceInfo{Id: 0}, nvml.SUCCESS },
				DestroyFunc: func() nvml.Return { destroyed = append(destroyed, "ci"); return nvml.SUCCESS },
			}
			gi := &mock.GpuInstance{
				GetInfoFunc: func() (nvml.GpuInstanceInfo, nvml.Return) { return nvml.GpuInstanceInfo{Id: 7}, nvml.SUCCESS },
				GetComputeInstanceProfileInfoFunc: func(p, _ int) (nvml.ComputeInstanceProfileInfo, nvml.Return) {
					if p != nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE {
						return nvml.ComputeInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
					}
					return nvml.ComputeInstanceProfileInfo{Id: 0, SliceCount: 1}, nvml.SUCCESS
				},
				CreateComputeInstanceFunc: func(*nvml.ComputeInstanceProfileInfo) (nvml.ComputeInstance, nvml.Return) {
					if tc.ciFails {
						return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
					}
					return ci, nvml.SUCCESS
				},
				DestroyFunc: func() nvml.Return { destroyed = append(destroyed, "gi"); return tc.giDestroy },
			}
			gpu.GetGpuInstanceProfileInfoFunc = func(int) (nvml.GpuInstanceProfileInfo, nvml.Return) {
				return nvml.GpuInstanceProfileInfo{Id: 19, SliceCount: 1, InstanceCount: 7}, nvml.SUCCESS
			}
			gpu.CreateGpuInstanceWithPlacementFunc = func(*nvml.GpuInstanceProfileInfo, *nvml.GpuInstancePlacement) (nvml.GpuInstance, nvml.Return) {
				return gi, nvml.SUCCESS
			}
			gpu.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return 7, nvml.SUCCESS }
			gpu.GetMigDeviceHandleByIndexFunc = func(int) (nvml.Device, nvml.Return) { return nil, nvml.ERROR_NOT_FOUND }
			o := New(nvmlapi.Wrap(f), Config{CallTimeout: 5 * time.Second}, nil)
			_, err := o.MakeMIG(context.Background(), "GPU-a", nvml.GPU_INSTANCE_PROFILE_1_SLICE, place1g)
			for _, w := range tc.want {
				if !errors.Is(err, w) {
					t.Errorf("error %v: want it to wrap %s", err, w)
				}
			}
			if !slices.Equal(destroyed, tc.destroyed) {
				t.Errorf("destroyed %v, want %v", destroyed, tc.destroyed)
			}
		})
	}
}

// TestUnmakeMIGByUUID: given the UUID of the device it made, UnmakeMIG
// leaves alone a device made at the same place since, and destroys its
// own; on a GPU that is gone there is nothing to destroy.
func TestUnmakeMIGByUUID(t *testing.T) {
	node, o := migMakeNode(t, 5*time.Second)
	ctx := context.Background()
	gpu0 := node.Spec().GPUs[0].UUID
	first, err := o.MakeMIG(ctx, gpu0, nvml.GPU_INSTANCE_PROFILE_3_SLICE, place3g)
	if err != nil {
		t.Fatal(err)
	}
	if err := o.UnmakeMIG(ctx, gpu0, nvml.GPU_INSTANCE_PROFILE_3_SLICE, place3g, first.UUID); err != nil {
		t.Fatal(err)
	}
	second, err := o.MakeMIG(ctx, gpu0, nvml.GPU_INSTANCE_PROFILE_3_SLICE, place3g)
	if err != nil {
		t.Fatal(err)
	}
	if second.UUID == first.UUID {
		t.Fatalf("a device made again has the UUID %s of the first", first.UUID)
	}
	// A retry for the first device: the second is not its.
	if err := o.UnmakeMIG(ctx, gpu0, nvml.GPU_INSTANCE_PROFILE_3_SLICE, place3g, first.UUID); err != nil {
		t.Fatal(err)
	}
	if mig := node.Spec().GPUs[0].MIG; len(mig) != 1 || mig[0].UUID != second.UUID {
		t.Fatalf("MIG devices %+v, want the second %s kept", mig, second.UUID)
	}
	if err := o.UnmakeMIG(ctx, gpu0, nvml.GPU_INSTANCE_PROFILE_3_SLICE, place3g, second.UUID); err != nil {
		t.Fatal(err)
	}
	if mig := node.Spec().GPUs[0].MIG; len(mig) != 0 {
		t.Fatalf("MIG devices %+v left", mig)
	}
	// A GPU the driver no longer has (nvml.h
	// nvmlDeviceGetHandleByUUID: NOT_FOUND).
	if err := o.UnmakeMIG(ctx, "GPU-00000000-0000-0000-0000-000000000000", nvml.GPU_INSTANCE_PROFILE_3_SLICE, place3g, second.UUID); err != nil {
		t.Errorf("UnmakeMIG on a GPU that is gone: %v", err)
	}
	// A lost GPU (XID 79): its MIG devices went with it.
	third, err := o.MakeMIG(ctx, gpu0, nvml.GPU_INSTANCE_PROFILE_3_SLICE, place3g)
	if err != nil {
		t.Fatal(err)
	}
	simtest.Fault(t, node, http.MethodPost, `{"kind":"gpu-lost","gpu":0}`)
	if err := o.UnmakeMIG(ctx, gpu0, nvml.GPU_INSTANCE_PROFILE_3_SLICE, place3g, third.UUID); err != nil {
		t.Errorf("UnmakeMIG on a lost GPU: %v", err)
	}
}

// placementsFailLib answers GetGpuInstancePossiblePlacements with
// ERROR_UNKNOWN on every GPU while fail is set.
type placementsFailLib struct {
	Library
	fail *atomic.Bool
}

func (l placementsFailLib) DeviceGetHandleByIndex(i int) (Device, nvml.Return) {
	d, ret := l.Library.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		return nil, ret
	}
	return placementsFailDevice{d, l.fail}, ret
}

func (l placementsFailLib) DeviceGetHandleByUUID(uuid string) (Device, nvml.Return) {
	d, ret := l.Library.DeviceGetHandleByUUID(uuid)
	if ret != nvml.SUCCESS {
		return nil, ret
	}
	return placementsFailDevice{d, l.fail}, ret
}

type placementsFailDevice struct {
	Device
	fail *atomic.Bool
}

func (d placementsFailDevice) GetGpuInstancePossiblePlacements(info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstancePlacement, nvml.Return) {
	if d.fail.Load() {
		return nil, nvml.ERROR_UNKNOWN
	}
	return d.Device.GetGpuInstancePossiblePlacements(info)
}

func (d placementsFailDevice) GetTopologyCommonAncestor(other Device) (nvml.GpuTopologyLevel, nvml.Return) {
	if o, ok := other.(placementsFailDevice); ok {
		other = o.Device
	}
	return d.Device.GetTopologyCommonAncestor(other)
}

// TestDiscoverMIGProfilesPartial: a profile table that could not be read
// whole is not published (the failure is an unread item) nor kept for
// the next discovery, which reads it again.
func TestDiscoverMIGProfilesPartial(t *testing.T) {
	spec, err := sim.Profile("dgx-h100", sim.WithMIG(0))
	if err != nil {
		t.Fatal(err)
	}
	node, err := sim.New(spec, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	fail := &atomic.Bool{}
	fail.Store(true)
	o := New(placementsFailLib{node.NVML(), fail}, Config{CallTimeout: 5 * time.Second}, nil)
	if err := o.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	x := NewDiscoverer(o, node.HostRoot(), nil)
	x.SetOptions(DiscoverOptions{MIGProfiles: true})
	first, err := x.Discover(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if p := first.GPUs[0].MIGProfiles; len(p) != 0 {
		t.Errorf("profiles %+v from a table whose placements failed", p)
	}
	if !slices.ContainsFunc(first.Unread, func(u string) bool { return strings.Contains(u, "GetGpuInstancePossiblePlacements") }) {
		t.Errorf("unread %v does not name the failed call", first.Unread)
	}
	fail.Store(false)
	second, err := x.Discover(context.Background(), first)
	if err != nil {
		t.Fatal(err)
	}
	if p := second.GPUs[0].MIGProfiles; len(p) == 0 || len(p[0].Placements) == 0 {
		t.Errorf("profiles not read again once the calls answer: %+v", p)
	}
}
