package dra

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/dynamic-resource-allocation/structured"
	"sigs.k8s.io/yaml"

	"github.com/gpu-node-agent/gpu-node-agent/gpu"
	"github.com/gpu-node-agent/gpu-node-agent/sim"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// docClaims are the ResourceClaims of docs/dra.md's examples, by name.
func docClaims(t *testing.T) map[string]*resourceapi.ResourceClaim {
	t.Helper()
	text, err := os.ReadFile("../docs/dra.md")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*resourceapi.ResourceClaim{}
	for _, m := range regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllSubmatch(text, -1) {
		var kind metav1.TypeMeta
		if err := yaml.Unmarshal(m[1], &kind); err != nil {
			t.Fatalf("docs/dra.md example: %v\n%s", err, m[1])
		}
		if kind.Kind != "ResourceClaim" {
			continue
		}
		var c resourceapi.ResourceClaim
		if err := yaml.UnmarshalStrict(m[1], &c); err != nil {
			t.Fatalf("docs/dra.md example: %v\n%s", err, m[1])
		}
		c.UID = types.UID("uid-" + c.Name)
		// What the API server's defaulting does to a stored claim
		// (k8s.io/kubernetes pkg/apis/resource/v1 defaults.go:
		// SetDefaults_ExactDeviceRequest): an exact request allocates
		// ExactCount devices, one unless it says otherwise.
		for i := range c.Spec.Devices.Requests {
			if r := c.Spec.Devices.Requests[i].Exactly; r != nil {
				if r.AllocationMode == "" {
					r.AllocationMode = resourceapi.DeviceAllocationModeExactCount
				}
				if r.AllocationMode == resourceapi.DeviceAllocationModeExactCount && r.Count == 0 {
					r.Count = 1
				}
			}
		}
		out[c.Name] = &c
	}
	for _, name := range []string{"two-gpus-one-island", "gpu-and-nic-aligned"} {
		if out[name] == nil {
			t.Fatalf("docs/dra.md has no ResourceClaim %s (have %v)", name, out)
		}
	}
	return out
}

// classLister serves the chart's DeviceClasses.
type classLister map[string]*resourceapi.DeviceClass

func (l classLister) List() ([]*resourceapi.DeviceClass, error) {
	var out []*resourceapi.DeviceClass
	for _, c := range l {
		out = append(out, c)
	}
	return out, nil
}

func (l classLister) Get(name string) (*resourceapi.DeviceClass, error) {
	if c, ok := l[name]; ok {
		return c, nil
	}
	return nil, fmt.Errorf("deviceclass %s not found", name)
}

// chartClasses are the chart's DeviceClasses: one per kind, and one per
// MIG profile of the simulator's A100 and H100 layouts (the chart lists
// NVIDIA's); with sharing (dra.sharing.enabled) the kind and profile
// classes select exclusive devices and the shared classes the others.
func chartClasses(t *testing.T, sharing bool) classLister {
	t.Helper()
	sel := chartSelectors(t)
	kindSel, profileSel, sharedSel := sel.kind, sel.profile, sel.shared
	l := classLister{}
	class := func(name, expr string) {
		l[name] = &resourceapi.DeviceClass{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{
				CEL: &resourceapi.CELDeviceSelector{Expression: expr},
			}}},
		}
	}
	for _, kind := range []string{TypeGPU, TypeMIG, TypeNIC} {
		class(kind+"."+DriverName, instantiate(kindSel, kind, "", sharing))
	}
	for _, p := range []string{"1g.5gb", "2g.10gb", "3g.20gb", "1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"} {
		class("mig-"+p+"."+DriverName, instantiate(profileSel, "", p, sharing))
	}
	class("rdma-ib."+DriverName, strings.ReplaceAll(sel.rdma, "{{ $r.name }}", "ib"))
	if sharing {
		for _, kind := range []string{TypeGPU, TypeMIG} {
			class(kind+"-shared."+DriverName, instantiate(sharedSel, kind, "", sharing))
		}
	}
	return l
}

const nodeName = "gpu-node"

// resourceSlices is what the kubelet plugin will publish: the node's pool,
// one ResourceSlice per SplitCounters chunk of counters, then one per
// Split chunk of devices.
func resourceSlices(devs []resourceapi.Device, counters ...resourceapi.CounterSet) []*resourceapi.ResourceSlice {
	var specs []resourceapi.ResourceSliceSpec
	for _, c := range SplitCounters(counters) {
		specs = append(specs, resourceapi.ResourceSliceSpec{SharedCounters: c})
	}
	for _, c := range Split(devs) {
		specs = append(specs, resourceapi.ResourceSliceSpec{Devices: c})
	}
	var out []*resourceapi.ResourceSlice
	for i, spec := range specs {
		node := nodeName
		spec.Driver = DriverName
		spec.Pool = resourceapi.ResourcePool{Name: nodeName, Generation: 1, ResourceSliceCount: int64(len(specs))}
		spec.NodeName = &node
		out = append(out, &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", nodeName, i)}, Spec: spec})
	}
	return out
}

// allocate runs the scheduler's structured allocator for one claim on the
// node's slices; nil when the claim cannot be satisfied.
func allocate(t *testing.T, devs []resourceapi.Device, claim *resourceapi.ResourceClaim, allocated ...string) []resourceapi.DeviceRequestAllocationResult {
	t.Helper()
	return allocateWith(t, devs, chartClasses(t, false), nil, claim, allocated...)
}

// allocateWith is allocate with the given classes and, for shared
// devices, the claims already allocated (their consumed capacity).
func allocateWith(t *testing.T, devs []resourceapi.Device, classes classLister, prior []*resourceapi.ResourceClaim, claim *resourceapi.ResourceClaim, allocated ...string) []resourceapi.DeviceRequestAllocationResult {
	t.Helper()
	return allocateSlices(t, resourceSlices(devs), classes, prior, claim, allocated...)
}

// allocateSlices is allocateWith on the given slices.
func allocateSlices(t *testing.T, rs []*resourceapi.ResourceSlice, classes classLister, prior []*resourceapi.ResourceClaim, claim *resourceapi.ResourceClaim, allocated ...string) []resourceapi.DeviceRequestAllocationResult {
	t.Helper()
	// The features on by default in Kubernetes 1.37 (GA or beta), which
	// select the allocator the 1.37 scheduler runs.
	features := structured.Features{AdminAccess: true, ConsumableCapacity: true, DeviceBindingAndStatus: true,
		DeviceTaints: true, PartitionableDevices: true, PrioritizedList: true}
	state := structured.AllocatedState{AllocatedDevices: sets.New[structured.DeviceID]()}
	for _, d := range allocated {
		state.AllocatedDevices.Insert(structured.MakeDeviceID(DriverName, nodeName, d))
	}
	for _, c := range prior {
		for _, r := range c.Status.Allocation.Devices.Results {
			id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
			if r.ShareID == nil {
				state.AllocatedDevices.Insert(id)
				continue
			}
			if state.AllocatedSharedDeviceIDs == nil {
				state.AllocatedSharedDeviceIDs = sets.New[structured.SharedDeviceID]()
				state.AggregatedCapacity = structured.NewConsumedCapacityCollection()
			}
			state.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, r.ShareID))
			state.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
		}
	}
	a, err := structured.NewAllocator(context.Background(), features, state, classes, rs, cel.NewCache(10, cel.Features{EnableConsumableCapacity: true}))
	if err != nil {
		t.Fatal(err)
	}
	res, err := a.Allocate(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, []*resourceapi.ResourceClaim{claim})
	if err != nil {
		t.Fatalf("allocate %s: %v", claim.Name, err)
	}
	if res == nil {
		return nil
	}
	for _, r := range res[0].Devices.Results {
		if r.Driver != DriverName || r.Pool != nodeName {
			t.Fatalf("%s: result from driver %s pool %s", claim.Name, r.Driver, r.Pool)
		}
	}
	return res[0].Devices.Results
}

// TestDocClaims allocates docs/dra.md's example claims with the scheduler's
// allocator and checks the devices it picks are aligned as the claims ask.
func TestDocClaims(t *testing.T) {
	claims := docClaims(t)
	model, res := buildSim(t, "dgx-h100")
	devs := byName(res.Devices)

	t.Run("gpu and nic under one switch", func(t *testing.T) {
		// Each GPU in turn is the only free one: the allocator must find
		// its own NIC every time.
		for _, g := range model.GPUs {
			var busy []string
			for _, o := range model.GPUs {
				if o.Index != g.Index {
					busy = append(busy, GPUName(o.Index))
				}
			}
			got := allocate(t, res.Devices, claims["gpu-and-nic-aligned"], busy...)
			if len(got) != 2 {
				t.Fatalf("gpu %d free: allocated %v, want a GPU and a NIC", g.Index, got)
			}
			gpu, nic := devs[got[0].Device], devs[got[1].Device]
			if got[0].Request != "gpu" {
				gpu, nic = nic, gpu
			}
			if gpu.Name != GPUName(g.Index) || str(nic, AttrType) != TypeNIC {
				t.Fatalf("gpu %d free: got %s and %s", g.Index, gpu.Name, nic.Name)
			}
			root := deviceattribute.StandardDeviceAttributePCIeRoot
			if str(gpu, root) != str(nic, root) || str(gpu, AttrPCIeSwitch) != str(nic, AttrPCIeSwitch) {
				t.Errorf("%s and %s: roots %s/%s switches %s/%s", gpu.Name, nic.Name, str(gpu, root), str(nic, root), str(gpu, AttrPCIeSwitch), str(nic, AttrPCIeSwitch))
			}
			if lvl := nicGPULevel(model, str(nic, AttrRDMADevice), g.Index); lvl != topology.PCIeSingleSwitch {
				t.Errorf("%s and %s are %q apart in the model, want single-switch", gpu.Name, nic.Name, lvl)
			}
		}
	})

	t.Run("two gpus on one island", func(t *testing.T) {
		got := allocate(t, res.Devices, claims["two-gpus-one-island"])
		if len(got) != 2 || str(devs[got[0].Device], AttrNVLinkIsland) == "" ||
			str(devs[got[0].Device], AttrNVLinkIsland) != str(devs[got[1].Device], AttrNVLinkIsland) {
			t.Fatalf("allocated %v, want two GPUs of one island", got)
		}
	})

	t.Run("two gpus on one island of the DGX-1V cube-mesh", func(t *testing.T) {
		m1v, r1v := buildSim(t, "dgx-1v")
		d1v := byName(r1v.Devices)
		// With GPUs 1-3 and 5-7 busy, 0 and 4 are free: linked, but in
		// different quads, so not one island.
		got := allocate(t, r1v.Devices, claims["two-gpus-one-island"], "gpu-1", "gpu-2", "gpu-3", "gpu-5", "gpu-6", "gpu-7")
		if got != nil {
			t.Fatalf("allocated %v across the quads", got)
		}
		got = allocate(t, r1v.Devices, claims["two-gpus-one-island"], "gpu-0", "gpu-1", "gpu-4", "gpu-5")
		if len(got) != 2 {
			t.Fatalf("allocated %v, want gpus 2 and 3 (one quad)", got)
		}
		a, b := int(*d1v[got[0].Device].Attributes[AttrIndex].IntValue), int(*d1v[got[1].Device].Attributes[AttrIndex].IntValue)
		if !nvlinked(m1v, a, b) {
			t.Errorf("gpus %d and %d share an island without an NVLink", a, b)
		}
	})

	t.Run("no island on a PCIe node", func(t *testing.T) {
		_, rp := buildSim(t, "pcie-8gpu")
		if got := allocate(t, rp.Devices, claims["two-gpus-one-island"]); got != nil {
			t.Fatalf("allocated %v on GPUs without NVLink", got)
		}
	})
}

// TestTaintedDeviceNotAllocated: a device tainted NoSchedule by Build is
// one the scheduler's allocator does not hand out.
func TestTaintedDeviceNotAllocated(t *testing.T) {
	claims := docClaims(t)
	model, root := simNode(t, "dgx-h100")
	var busy []string
	for _, g := range model.GPUs[1:] {
		busy = append(busy, GPUName(g.Index))
	}
	healthy, err := Build(model, Options{PCIeRoot: SysfsPCIeRoot(root)})
	if err != nil {
		t.Fatal(err)
	}
	if got := allocate(t, healthy.Devices, claims["gpu-and-nic-aligned"], busy...); len(got) != 2 {
		t.Fatalf("healthy gpu-0: allocated %v", got)
	}
	for _, unhealthy := range []string{model.GPUs[0].UUID, model.NICs[0].Name} {
		tainted, err := Build(model, Options{PCIeRoot: SysfsPCIeRoot(root), Unhealthy: map[string]Fault{unhealthy: {Cause: "xid-79"}}})
		if err != nil {
			t.Fatal(err)
		}
		if got := allocate(t, tainted.Devices, claims["gpu-and-nic-aligned"], busy...); got != nil {
			t.Errorf("%s tainted: allocated %v", unhealthy, got)
		}
	}
}

func nicGPULevel(n *topology.Node, nic string, gpu int) topology.PCIeLevel {
	for _, x := range n.NICs {
		if x.Name != nic {
			continue
		}
		for _, l := range x.GPUs {
			if l.GPU == gpu {
				return l.PCIe
			}
		}
	}
	return ""
}

func nvlinked(n *topology.Node, a, b int) bool {
	for _, l := range n.Links {
		if (l.A == a && l.B == b || l.A == b && l.B == a) && l.NVLinks > 0 {
			return true
		}
	}
	return false
}

// extendedClaim is the claim the scheduler builds for a container asking
// for count of an extended resource that class serves (KEP-5004, as
// k8s.io/kubernetes v1.37.2's dynamicresources plugin writes it: one
// exact request per container and resource, no selectors, no
// tolerations, no constraints).
func extendedClaim(class string, count int64) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "pod-extended-resources-x", UID: "uid-extended",
			Annotations: map[string]string{resourceapi.ExtendedResourceClaimAnnotation: "true"}},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "container-0-request-0",
			Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class,
				AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count},
		}}}},
	}
}

// TestExtendedResourceClaims: the scheduler's allocator serves a plain
// nvidia.com/gpu or nvidia.com/mig-<profile> request through the chart's
// classes from the published slices. It takes the first free devices in
// slice order, which is GPU index order: on NVIDIA's DGX layouts the
// lowest indices of an NVLink domain come first, so an unfragmented node
// gives a request the GPUs the device plugin would. Nothing else steers
// it: the claim carries no constraint, so on a fragmented node it takes
// GPUs the device plugin's preferred allocation would not.
func TestExtendedResourceClaims(t *testing.T) {
	gpuClass := TypeGPU + "." + DriverName
	indices := func(t *testing.T, devs map[string]resourceapi.Device, got []resourceapi.DeviceRequestAllocationResult) []int {
		t.Helper()
		var out []int
		for _, r := range got {
			d := devs[r.Device]
			if str(d, AttrType) != TypeGPU {
				t.Fatalf("%s is a %s, want a GPU", r.Device, str(d, AttrType))
			}
			out = append(out, int(*d.Attributes[AttrIndex].IntValue))
		}
		return out
	}

	t.Run("two GPUs of a DGX H100", func(t *testing.T) {
		model, res := buildSim(t, "dgx-h100")
		got := indices(t, byName(res.Devices), allocate(t, res.Devices, extendedClaim(gpuClass, 2)))
		if !slices.Equal(got, []int{0, 1}) || !nvlinked(model, got[0], got[1]) {
			t.Fatalf("allocated GPUs %v, want 0 and 1 (NVLinked)", got)
		}
	})
	t.Run("four GPUs of a DGX-1V are one quad", func(t *testing.T) {
		model, res := buildSim(t, "dgx-1v")
		got := indices(t, byName(res.Devices), allocate(t, res.Devices, extendedClaim(gpuClass, 4)))
		if !slices.Equal(got, []int{0, 1, 2, 3}) {
			t.Fatalf("allocated GPUs %v, want the quad 0-3", got)
		}
		for i := range got {
			for j := i + 1; j < len(got); j++ {
				if !nvlinked(model, got[i], got[j]) {
					t.Errorf("GPUs %d and %d of the quad have no NVLink", got[i], got[j])
				}
			}
		}
	})
	t.Run("a fragmented DGX-1V cannot be steered", func(t *testing.T) {
		model, res := buildSim(t, "dgx-1v")
		// Free: 1 (whose quad is otherwise busy) and 4-7. The device
		// plugin would pick two of 4-7; first fit takes 1 and 4.
		got := indices(t, byName(res.Devices), allocate(t, res.Devices, extendedClaim(gpuClass, 2), "gpu-0", "gpu-2", "gpu-3"))
		if !slices.Equal(got, []int{1, 4}) {
			t.Fatalf("allocated GPUs %v, want 1 and 4 (first fit)", got)
		}
		if nvlinked(model, 1, 4) {
			t.Fatal("GPUs 1 and 4 are NVLinked in the model: this case no longer shows the limit")
		}
	})
	t.Run("an RDMA resource", func(t *testing.T) {
		model, root := simNode(t, "dgx-h100")
		// Half the NICs stand for rdma/ib (as if its selectors chose
		// them); the others for none.
		nicRes := map[string]string{}
		for _, n := range model.NICs[:len(model.NICs)/2] {
			nicRes[n.Name] = "rdma/ib"
		}
		res, err := Build(model, Options{PCIeRoot: SysfsPCIeRoot(root), NICResources: nicRes})
		if err != nil {
			t.Fatal(err)
		}
		devs := byName(res.Devices)
		got := allocate(t, res.Devices, extendedClaim("rdma-ib."+DriverName, int64(len(nicRes))))
		if len(got) != len(nicRes) {
			t.Fatalf("rdma/ib: %d: allocated %v", len(nicRes), got)
		}
		for _, r := range got {
			if d := devs[r.Device]; str(d, AttrType) != TypeNIC || nicRes[str(d, AttrRDMADevice)] != "rdma/ib" {
				t.Errorf("rdma/ib got %s, which stands for none", r.Device)
			}
		}
		if got := allocate(t, res.Devices, extendedClaim("rdma-ib."+DriverName, int64(len(nicRes)+1))); got != nil {
			t.Errorf("rdma/ib: one more than there are: allocated %v", got)
		}
	})
	t.Run("a MIG profile", func(t *testing.T) {
		_, res := buildSim(t, "dgx-a100", sim.WithMIG(1, "3g.20gb", "2g.10gb", "1g.5gb"))
		devs := byName(res.Devices)
		for _, profile := range []string{"3g.20gb", "2g.10gb", "1g.5gb"} {
			got := allocate(t, res.Devices, extendedClaim("mig-"+profile+"."+DriverName, 1))
			if len(got) != 1 || str(devs[got[0].Device], AttrType) != TypeMIG || str(devs[got[0].Device], AttrProfile) != profile {
				t.Errorf("nvidia.com/mig-%s: allocated %v", profile, got)
			}
		}
		if got := allocate(t, res.Devices, extendedClaim("mig-1g.5gb."+DriverName, 2)); got != nil {
			t.Errorf("two 1g.5gb of a layout with one: allocated %v", got)
		}
	})
}

// sharedClaim is a claim of one device of class, asking for the given
// capacity (nil: the devices' defaults).
func sharedClaim(name, class string, capacity map[resourceapi.QualifiedName]resource.Quantity) *resourceapi.ResourceClaim {
	req := &resourceapi.ExactDeviceRequest{DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}
	if capacity != nil {
		req.Capacity = &resourceapi.CapacityRequirements{Requests: capacity}
	}
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name)},
		Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: req}}}},
	}
}

// TestSharedDevices: a device the time-slicing section shares is published
// for several claims at once, each holding one of its shares (and an equal
// part of its memory) unless it asks for more, so that the scheduler's
// allocator gives it to at most `replicas` claims; with the chart's
// sharing classes, the exclusive classes never hand it out and the shared
// class hands out nothing else.
func TestSharedDevices(t *testing.T) {
	model, root := simNode(t, "dgx-h100")
	g := model.GPUs[2]
	res, err := Build(model, Options{PCIeRoot: SysfsPCIeRoot(root), Shares: map[string]gpu.Share{g.UUID: {Replicas: 2, ServedAs: "nvidia.com/gpu.shared"}}})
	if err != nil {
		t.Fatal(err)
	}
	devs := byName(res.Devices)
	d := devs[GPUName(g.Index)]
	if d.AllowMultipleAllocations == nil || !*d.AllowMultipleAllocations {
		t.Fatalf("%s: allowMultipleAllocations %v, want true", d.Name, d.AllowMultipleAllocations)
	}
	shares, mem := d.Capacity[CapShares], d.Capacity[CapMemory]
	if shares.Value.Value() != 2 || shares.RequestPolicy == nil || shares.RequestPolicy.Default.Value() != 1 {
		t.Errorf("%s shares %+v, want 2 with a default of 1", d.Name, shares)
	}
	if want := int64(g.MemoryMiB) * 1024 * 1024 / 2; mem.RequestPolicy == nil || mem.RequestPolicy.Default.Value() != want {
		t.Errorf("%s memory %+v, want a default of half of %d MiB", d.Name, mem, g.MemoryMiB)
	}
	for _, o := range res.Devices {
		if o.Name != d.Name && o.AllowMultipleAllocations != nil {
			t.Errorf("%s is published shared; only %s is", o.Name, d.Name)
		}
	}

	classes := chartClasses(t, true)
	sharedClass, gpuClass := "gpu-shared."+DriverName, TypeGPU+"."+DriverName
	// The exclusive class: every GPU but the shared one.
	whole := 0
	for _, x := range model.GPUs {
		if !x.MIGEnabled {
			whole++
		}
	}
	if got := allocateWith(t, res.Devices, classes, nil, extendedClaim(gpuClass, int64(whole))); got != nil {
		t.Errorf("%d GPUs of the exclusive class allocated, but one of the %d is shared: %v", whole, whole, got)
	}
	got := allocateWith(t, res.Devices, classes, nil, extendedClaim(gpuClass, int64(whole-1)))
	for _, r := range got {
		if r.Device == d.Name {
			t.Errorf("the exclusive class handed out the shared %s", d.Name)
		}
	}

	// Two claims share it, a third finds no share left.
	var prior []*resourceapi.ResourceClaim
	shareIDs := map[types.UID]bool{}
	for _, name := range []string{"a", "b"} {
		c := sharedClaim(name, sharedClass, nil)
		got := allocateWith(t, res.Devices, classes, prior, c)
		if len(got) != 1 || got[0].Device != d.Name || got[0].ShareID == nil {
			t.Fatalf("claim %s: allocated %+v, want a share of %s", name, got, d.Name)
		}
		if c := got[0].ConsumedCapacity[CapShares]; c.Value() != 1 {
			t.Errorf("claim %s consumed %s shares, want 1", name, c.String())
		}
		shareIDs[*got[0].ShareID] = true
		c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: got}}
		prior = append(prior, c)
	}
	if len(shareIDs) != 2 {
		t.Errorf("share IDs %v, want two", shareIDs)
	}
	if got := allocateWith(t, res.Devices, classes, prior, sharedClaim("c", sharedClass, nil)); got != nil {
		t.Errorf("a third claim got %+v of a device with two shares", got)
	}
	// A claim may ask for every share: the device is then its alone.
	all := map[resourceapi.QualifiedName]resource.Quantity{CapShares: resource.MustParse("2")}
	got = allocateWith(t, res.Devices, classes, nil, sharedClaim("whole", sharedClass, all))
	if len(got) != 1 || got[0].Device != d.Name {
		t.Fatalf("a claim of both shares: allocated %+v", got)
	}
	whole1 := sharedClaim("whole", sharedClass, all)
	whole1.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: got}}
	if got := allocateWith(t, res.Devices, classes, []*resourceapi.ResourceClaim{whole1}, sharedClaim("d", sharedClass, nil)); got != nil {
		t.Errorf("a claim got %+v of a device whose shares another holds all of", got)
	}
}
