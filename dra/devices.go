package dra

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/dynamic-resource-allocation/deviceattribute"

	"github.com/gpu-node-agent/gpu-node-agent/gpu"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// Attribute and capacity names in the driver's domain (DriverName). The
// GPU and MIG ones follow NVIDIA's DRA driver (k8s-dra-driver-gpu,
// cmd/gpu-kubelet-plugin/deviceinfo.go: type, uuid, productName, brand,
// architecture, cudaComputeCapability and driverVersion as versions,
// cudaDriverVersion, parentUUID, profile, capacity memory and the MIG
// engine counts), so a selector written for one reads the other. Where we
// differ: "index", "parentIndex", "numaNode" and the NVLink attributes are
// ours; NVIDIA's "pcieBusID" is the standard resource.kubernetes.io/pciBusID
// here; "architecture" is GFD's lower-case family ("hopper"), as the
// agent's nvidia.com/gpu.family label, where NVIDIA says "Hopper"; "brand"
// is not published because the topology model does not carry
// nvmlDeviceGetBrand yet.
const (
	AttrType                  resourceapi.QualifiedName = "type"
	AttrUUID                  resourceapi.QualifiedName = "uuid"
	AttrIndex                 resourceapi.QualifiedName = "index"
	AttrProductName           resourceapi.QualifiedName = "productName"
	AttrBrand                 resourceapi.QualifiedName = "brand"
	AttrArchitecture          resourceapi.QualifiedName = "architecture"
	AttrCUDAComputeCapability resourceapi.QualifiedName = "cudaComputeCapability"
	AttrDriverVersion         resourceapi.QualifiedName = "driverVersion"
	AttrCUDADriverVersion     resourceapi.QualifiedName = "cudaDriverVersion"
	// AttrNUMANode is the device's NUMA node, absent when the platform
	// reports none. k8s.io/dynamic-resource-allocation v0.37 has the
	// standard resource.kubernetes.io/numaNode and a helper reading it
	// from sysfs; the driver does not publish it yet (docs/dra.md,
	// Versions).
	AttrNUMANode resourceapi.QualifiedName = "numaNode"
	// AttrPCIeSwitch names the PCIe switch a device hangs off (the bus ID
	// of the switch's upstream port), absent for a device on a root port.
	// The standard pcieRoot is the root complex, which on DGX systems
	// holds two GPU-NIC switches; matching pcieSwitch across a GPU and a
	// NIC request gives the pair nvidia-smi topo calls PIX.
	AttrPCIeSwitch   resourceapi.QualifiedName = "pcieSwitch"
	AttrNVLinkDomain resourceapi.QualifiedName = "nvlinkDomain"
	AttrNVLinkIsland resourceapi.QualifiedName = "nvlinkIsland"
	// AttrNVLinkClique is the multi-node NVLink domain of a whole GPU,
	// "<ClusterUUID>.<CliqueID>": the value of the node's
	// nvidia.com/gpu.clique label (topology.Clique), and absent with it.
	// NVIDIA's DRA driver publishes no such attribute on its GPUs (its
	// compute-domain plugin reads the clique for IMEX), so the name is
	// ours. MIG devices do not get it: NVIDIA's GFD reads fabric IDs of
	// whole GPUs only.
	AttrNVLinkClique resourceapi.QualifiedName = "nvlinkClique"
	AttrProfile      resourceapi.QualifiedName = "profile"
	AttrParentUUID   resourceapi.QualifiedName = "parentUUID"
	AttrParentIndex  resourceapi.QualifiedName = "parentIndex"
	AttrRDMADevice   resourceapi.QualifiedName = "rdmaDevice"
	AttrNetDev       resourceapi.QualifiedName = "netdev"
	AttrLinkLayer    resourceapi.QualifiedName = "linkLayer"
	// AttrRDMAResource is the device plugin's resource a NIC stands for
	// (rdma/<name>, Options.NICResources).
	AttrRDMAResource resourceapi.QualifiedName = "rdmaResource"

	CapMemory          resourceapi.QualifiedName = "memory"
	CapMultiprocessors resourceapi.QualifiedName = "multiprocessors"
	CapCopyEngines     resourceapi.QualifiedName = "copyEngines"
	CapDecoders        resourceapi.QualifiedName = "decoders"
	CapEncoders        resourceapi.QualifiedName = "encoders"
	CapJPEGEngines     resourceapi.QualifiedName = "jpegEngines"
	CapOFAEngines      resourceapi.QualifiedName = "ofaEngines"
	// CapShares is a shared device's count of shares (Options.Shares).
	CapShares resourceapi.QualifiedName = "shares"
)

// Options is what Build needs beside the node model.
type Options struct {
	// PCIeRoot resolves the standard pcieRoot attribute; SysfsPCIeRoot
	// in the agent. Nil leaves the attribute out.
	PCIeRoot PCIeRootResolver
	// Unhealthy holds the devices the health monitor finds unfit, by the
	// monitor's device ID: GPU UUID (topology.LostGPUID for a GPU lost
	// before its UUID was read), MIG UUID, RDMA device name. Each gets a
	// device taint. The monitor's status already folds the parent GPU's
	// and the node's health into a MIG device's, so Build does not.
	Unhealthy map[string]Fault
	// Shares are the devices, by GPU or MIG UUID, that more than one
	// claim may hold at once (gpu.TimeSlicing.Shares): each is published
	// with allowMultipleAllocations and consumable capacity (KEP-5075) of
	// Replicas shares, one by default, and its memory, an equal part of
	// it by default. Nil: every device is exclusive.
	Shares map[string]gpu.Share
	// NICResources names, by RDMA device, the exclusive RDMA resource a
	// NIC stands for (rdma.ExclusiveResourceOf), published as its
	// rdmaResource attribute so that a DeviceClass can serve that
	// extended resource. Nil: none.
	NICResources map[string]string
	// OnDemandMIG publishes each GPU in MIG mode whose profiles were read
	// (topology.GPU.MIGProfiles) as a partitionable device (KEP-4815): a
	// counter set of its memory slices and engines, and one device per
	// placement of every profile, consuming the slices it covers and the
	// profile's engines, which Prepare makes and Unprepare destroys. A
	// MIG device that exists and was not made for a claim (an operator's
	// layout) is published as it is, and the placements it covers are
	// not offered.
	OnDemandMIG bool
	// Made are the MIG devices made, or being made, for claims
	// (Preparer.Made): each is published as its placement, not as a
	// device of its own.
	Made MadeSet
}

// Result is the node's devices as ResourceSlices publish them.
type Result struct {
	// Devices are the GPUs not in MIG mode by index, then the MIG devices
	// by parent index in the model's order, then the NICs in the model's
	// order.
	Devices []resourceapi.Device
	// IDs are the health monitor's IDs of Devices, index by index (the
	// keys of Options.Unhealthy).
	IDs []string
	// CounterSets are the shared counters of the GPUs whose MIG devices
	// are made on demand (Options.OnDemandMIG), by GPU index: what their
	// placement devices consume.
	CounterSets []resourceapi.CounterSet
	// Unread lists attributes that could not be resolved and were left
	// out ("gpu-3: pcieRoot: ..."), as topology.Node.Unread does for
	// discovery: the device is still published.
	Unread []string
}

// Build turns a node model into its ResourceSlice devices. A GPU in MIG
// mode is offered as its MIG devices (the static layout), not as a whole
// GPU: in MIG mode the whole GPU cannot run CUDA work. A lost GPU is still
// published (with what is known of it) so its taint can say why it cannot
// be allocated. The error reports what would make the API server reject
// the slice: an invalid or duplicate device name, or too many attributes
// and capacities on a device.
func Build(n *topology.Node, opts Options) (Result, error) {
	if n == nil {
		return Result{}, errors.New("dra devices: nil node")
	}
	b := builder{node: n, opts: opts, clique: topology.Clique(n)}
	b.domain, b.island = nvlinkGroups(n)
	for i := range n.GPUs {
		g := &n.GPUs[i]
		if g.MIGEnabled {
			continue
		}
		d := b.gpu(g)
		b.share(&d, g.UUID)
		b.add(d, healthID(g))
	}
	for i := range n.GPUs {
		g := &n.GPUs[i]
		if !g.MIGEnabled {
			continue
		}
		if opts.OnDemandMIG && len(g.MIGProfiles) > 0 {
			b.onDemand(g)
			continue
		}
		for _, m := range g.MIG {
			if opts.Made.Has(g.UUID, m) {
				// Its profiles were not read this time: a device made
				// for a claim is not offered to another.
				continue
			}
			d := b.mig(g, m)
			b.share(&d, m.UUID)
			b.add(d, m.UUID)
		}
	}
	for _, nic := range n.NICs {
		b.add(b.nic(nic), nic.Name)
	}
	if err := validateDevices(b.res.Devices); err != nil {
		return Result{}, fmt.Errorf("dra devices: %w", err)
	}
	return b.res, nil
}

// healthID is the health monitor's ID of a GPU.
func healthID(g *topology.GPU) string {
	if g.UUID == "" {
		return topology.LostGPUID(g.Index)
	}
	return g.UUID
}

type builder struct {
	node           *topology.Node
	opts           Options
	domain, island []int
	// clique is the node's multi-node NVLink domain, "" for none.
	clique string
	res    Result
}

func (b *builder) add(d resourceapi.Device, id string) {
	if f, bad := b.opts.Unhealthy[id]; bad {
		d.Taints = []resourceapi.DeviceTaint{f.taint()}
	}
	b.res.Devices = append(b.res.Devices, d)
	b.res.IDs = append(b.res.IDs, id)
}

func (b *builder) unread(device, what string, err error) {
	b.res.Unread = append(b.res.Unread, fmt.Sprintf("%s: %s: %v", device, what, err))
}

// attrs is a device's attribute map with setters that skip unknown values.
type attrs map[resourceapi.QualifiedName]resourceapi.DeviceAttribute

func (a attrs) str(name resourceapi.QualifiedName, v string) {
	if v != "" {
		a[name] = resourceapi.DeviceAttribute{StringValue: &v}
	}
}

func (a attrs) int(name resourceapi.QualifiedName, v int64) {
	a[name] = resourceapi.DeviceAttribute{IntValue: &v}
}

func (a attrs) version(name resourceapi.QualifiedName, v string) {
	if s, ok := semver(v); ok {
		a[name] = resourceapi.DeviceAttribute{VersionValue: &s}
	}
}

// pci sets the standard pciBusID and pcieRoot attributes, the PCIe switch
// and the NUMA node. path is the device's PCI path from its root port
// (topology.GPU.PCIPath, topology.NIC.PCIPath).
func (b *builder) pci(a attrs, device, busID string, path []string, numa int) {
	if numa >= 0 {
		a.int(AttrNUMANode, int64(numa))
	}
	a.str(AttrPCIeSwitch, pcieSwitch(path))
	if busID == "" {
		return
	}
	busID = topology.NormalizeBusID(busID)
	attr, err := deviceattribute.GetPCIBusIDAttribute(busID)
	if err != nil {
		b.unread(device, "pciBusID", err)
		return
	}
	a[attr.Name] = attr.Value
	if b.opts.PCIeRoot == nil {
		return
	}
	root, err := b.opts.PCIeRoot(busID)
	if err != nil {
		b.unread(device, "pcieRoot", err)
		return
	}
	a.str(deviceattribute.StandardDeviceAttributePCIeRoot, root)
}

// gpuCommon sets what a GPU and its MIG devices share.
func (b *builder) gpuCommon(a attrs, g *topology.GPU) {
	a.str(AttrProductName, g.Model)
	a.str(AttrBrand, g.Brand)
	if g.ComputeMajor != 0 {
		a.str(AttrArchitecture, topology.ArchFamily(g.ComputeMajor, g.ComputeMinor))
		a.version(AttrCUDAComputeCapability, fmt.Sprintf("%d.%d", g.ComputeMajor, g.ComputeMinor))
	}
	a.version(AttrDriverVersion, b.node.Host.DriverVersion)
	if v := b.node.Host.CUDADriverVersion; v > 0 {
		a.version(AttrCUDADriverVersion, fmt.Sprintf("%d.%d", v/1000, v%1000/10))
	}
}

func (b *builder) gpu(g *topology.GPU) resourceapi.Device {
	name := GPUName(g.Index)
	a := attrs{}
	a.str(AttrType, TypeGPU)
	a.str(AttrUUID, g.UUID)
	a.int(AttrIndex, int64(g.Index))
	b.gpuCommon(a, g)
	b.pci(a, name, g.PCIBusID, g.PCIPath, g.NUMANode)
	if i := g.Index; i >= 0 && i < len(b.domain) && b.domain[i] >= 0 {
		a.str(AttrNVLinkDomain, GPUName(b.domain[i]))
		a.str(AttrNVLinkIsland, GPUName(b.island[i]))
	}
	a.str(AttrNVLinkClique, b.clique)
	d := resourceapi.Device{Name: name, Attributes: a}
	if g.MemoryMiB > 0 {
		d.Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{CapMemory: mib(g.MemoryMiB)}
	}
	return d
}

func (b *builder) mig(g *topology.GPU, m topology.MIGDevice) resourceapi.Device {
	name := MIGName(g.Index, m)
	a := attrs{}
	a.str(AttrType, TypeMIG)
	a.str(AttrUUID, m.UUID)
	a.str(AttrProfile, m.Profile)
	a.str(AttrParentUUID, g.UUID)
	a.int(AttrParentIndex, int64(g.Index))
	b.gpuCommon(a, g)
	// A MIG device is a slice of its parent's PCI function: same bus ID,
	// root and NUMA node (NVIDIA's driver gives it the parent's too).
	b.pci(a, name, g.PCIBusID, g.PCIPath, g.NUMANode)
	c := migCapacity(m.Attributes, m.MemoryMiB)
	d := resourceapi.Device{Name: name, Attributes: a}
	if len(c) > 0 {
		d.Capacity = c
	}
	return d
}

// migCapacity is a MIG device's capacity: its multiprocessors, engines
// and memory, each left out when zero.
func migCapacity(a topology.MIGAttributes, memoryMiB uint64) map[resourceapi.QualifiedName]resourceapi.DeviceCapacity {
	c := map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{}
	for _, v := range migCounts(a) {
		if v.n > 0 {
			c[v.capacity] = resourceapi.DeviceCapacity{Value: *resource.NewQuantity(int64(v.n), resource.DecimalSI)}
		}
	}
	if memoryMiB > 0 {
		c[CapMemory] = mib(memoryMiB)
	}
	return c
}

// migCount is one count of a MIG device under its capacity name and the
// name of the counter its placements consume (NVIDIA's driver's names:
// the capacity's in DNS-label form).
type migCount struct {
	capacity resourceapi.QualifiedName
	counter  string
	n        uint32
}

func migCounts(a topology.MIGAttributes) []migCount {
	return []migCount{
		{CapMultiprocessors, "multiprocessors", a.Multiprocessors},
		{CapCopyEngines, "copy-engines", a.CopyEngines},
		{CapDecoders, "decoders", a.Decoders},
		{CapEncoders, "encoders", a.Encoders},
		{CapJPEGEngines, "jpeg-engines", a.JPEGs},
		{CapOFAEngines, "ofa-engines", a.OFAs},
	}
}

// Counter names of a GPU's counter set beside the engine counts of
// migCounts: its memory in bytes, and one counter of 1 per memory slice
// (the units of topology.MIGPlacement) that a placement covering the
// slice consumes whole, so that no two allocated placements overlap.
const counterMemory = "memory"

// MemorySliceCounter is the counter of memory slice i of a GPU's counter
// set.
func MemorySliceCounter(i uint32) string { return fmt.Sprintf("memory-slice-%d", i) }

// onDemand publishes GPU g in MIG mode as a partitionable device: the
// MIG devices that exist and were not made for a claim as they are, the
// GPU's counter set, and a device for every placement of every profile
// that none of those covers. A placement device's health is its parent's,
// or once made for a claim its MIG device's.
func (b *builder) onDemand(g *topology.GPU) {
	var taken []topology.MIGPlacement
	unknown := false
	made := map[string]string{} // placement device name -> MIG UUID
	for _, m := range g.MIG {
		if b.opts.Made.Has(g.UUID, m) {
			made[PlacementName(g.Index, m.Profile, m.Placement.Start)] = m.UUID
			continue
		}
		d := b.mig(g, m)
		b.share(&d, m.UUID)
		b.add(d, m.UUID)
		if m.Placement.Size == 0 {
			unknown = true
		}
		taken = append(taken, m.Placement)
	}
	if unknown {
		b.unread(GPUName(g.Index), "mig placements", errors.New("a MIG device of the GPU has no known placement, so none is offered"))
		return
	}
	set := CounterSetName(g.Index)
	offered := false
	for _, p := range g.MIGProfiles {
		for _, pl := range p.Placements {
			if slices.ContainsFunc(taken, pl.Overlaps) {
				continue
			}
			d := b.placement(g, p, pl, set)
			id := healthID(g)
			if uuid, ok := made[d.Name]; ok {
				id = uuid
			}
			b.add(d, id)
			offered = true
		}
	}
	// A counter set no device consumes is left out: a GPU whose slices
	// an operator's layout fills offers nothing made on demand.
	if offered {
		b.res.CounterSets = append(b.res.CounterSets, counterSet(set, g.MIGProfiles))
	}
}

// counterSet is what a GPU's placements share: one counter per memory
// slice up to the end of the furthest placement, and of each engine count
// and the memory the largest a single profile needs to fill the GPU
// (count × instances). NVIDIA's driver takes the largest count alone,
// which blocks valid layouts where a small profile's engines add up to
// more than the whole-GPU profile reports (go-nvml's H100 table: a
// decoder on each of seven 1g.10gb, five on 7g.80gb). Where the counts
// add up, as the hardware's do, the two agree; where a profile is the
// only one with an engine (the media extensions of +me, one instance),
// its instance count bounds it as the driver does.
func counterSet(name string, profiles []topology.MIGProfile) resourceapi.CounterSet {
	counters := map[string]resourceapi.Counter{}
	var slicesEnd uint32
	var memory uint64
	total := map[string]uint64{}
	for _, p := range profiles {
		n := uint64(max(p.Instances, 1))
		for _, v := range migCounts(p.Attributes) {
			total[v.counter] = max(total[v.counter], uint64(v.n)*n)
		}
		memory = max(memory, p.MemoryMiB*n)
		for _, pl := range p.Placements {
			slicesEnd = max(slicesEnd, pl.End())
		}
	}
	for k, n := range total {
		if n > 0 {
			counters[k] = resourceapi.Counter{Value: *resource.NewQuantity(int64(n), resource.DecimalSI)}
		}
	}
	if memory > 0 {
		counters[counterMemory] = resourceapi.Counter{Value: mib(memory).Value}
	}
	one := resourceapi.Counter{Value: *resource.NewQuantity(1, resource.DecimalSI)}
	for i := range slicesEnd {
		counters[MemorySliceCounter(i)] = one
	}
	return resourceapi.CounterSet{Name: name, Counters: counters}
}

// placement is the device of profile p at placement pl on GPU g: what the
// MIG device made there would be, less its UUID, consuming pl's memory
// slices and p's engines and memory from the GPU's counter set.
func (b *builder) placement(g *topology.GPU, p topology.MIGProfile, pl topology.MIGPlacement, set string) resourceapi.Device {
	name := PlacementName(g.Index, p.Name, pl.Start)
	a := attrs{}
	a.str(AttrType, TypeMIG)
	a.str(AttrProfile, p.Name)
	a.str(AttrParentUUID, g.UUID)
	a.int(AttrParentIndex, int64(g.Index))
	b.gpuCommon(a, g)
	b.pci(a, name, g.PCIBusID, g.PCIPath, g.NUMANode)
	consumed := map[string]resourceapi.Counter{}
	for _, v := range migCounts(p.Attributes) {
		if v.n > 0 {
			consumed[v.counter] = resourceapi.Counter{Value: *resource.NewQuantity(int64(v.n), resource.DecimalSI)}
		}
	}
	if p.MemoryMiB > 0 {
		consumed[counterMemory] = resourceapi.Counter{Value: mib(p.MemoryMiB).Value}
	}
	one := resourceapi.Counter{Value: *resource.NewQuantity(1, resource.DecimalSI)}
	for i := pl.Start; i < pl.End(); i++ {
		consumed[MemorySliceCounter(i)] = one
	}
	d := resourceapi.Device{
		Name: name, Attributes: a,
		ConsumesCounters: []resourceapi.DeviceCounterConsumption{{CounterSet: set, Counters: consumed}},
	}
	if c := migCapacity(p.Attributes, p.MemoryMiB); len(c) > 0 {
		d.Capacity = c
	}
	return d
}

func (b *builder) nic(nic topology.NIC) resourceapi.Device {
	name := NICName(nic.Name)
	a := attrs{}
	a.str(AttrType, TypeNIC)
	a.str(AttrRDMADevice, nic.Name)
	if len(nic.NetDevs) > 0 {
		a.str(AttrNetDev, nic.NetDevs[0])
	}
	a.str(AttrLinkLayer, nic.LinkLayer)
	if r := b.opts.NICResources[nic.Name]; r != "" {
		a.str(AttrRDMAResource, r)
	}
	b.pci(a, name, nic.PCIBusID, nic.PCIPath, nic.NUMANode)
	return resourceapi.Device{Name: name, Attributes: a}
}

// pcieSwitch is the upstream port of the switch a device sits below: the
// path runs root port, [switch upstream port, downstream port]..., device,
// so with three or more elements the one before the device is a switch's
// downstream port (a root port is only ever first) and the one before that
// its upstream port. Empty for a device on a root port or an unknown path.
func pcieSwitch(path []string) string {
	if len(path) < 3 {
		return ""
	}
	return topology.NormalizeBusID(path[len(path)-3])
}

// share makes d, the device of uuid, a shared one when Options.Shares
// says so: several claims may hold it at once (allowMultipleAllocations),
// each consuming, unless it asks for more, one of the Replicas shares
// and an equal part of the memory, so that at most Replicas claims hold
// it. The memory is the scheduler's accounting only: nothing on the GPU
// enforces it, as nothing does for time-slicing's replicas.
func (b *builder) share(d *resourceapi.Device, uuid string) {
	s, ok := b.opts.Shares[uuid]
	if !ok || uuid == "" || s.Replicas < 2 {
		return
	}
	d.AllowMultipleAllocations = new(true)
	if d.Capacity == nil {
		d.Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{}
	}
	one := resource.NewQuantity(1, resource.DecimalSI)
	n := resource.NewQuantity(int64(s.Replicas), resource.DecimalSI)
	d.Capacity[CapShares] = resourceapi.DeviceCapacity{Value: *n, RequestPolicy: &resourceapi.CapacityRequestPolicy{
		Default: one, ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: one, Max: n, Step: one},
	}}
	mem, ok := d.Capacity[CapMemory]
	if !ok {
		return
	}
	const miB = 1024 * 1024
	part := mem.Value.Value() / int64(s.Replicas) / miB * miB
	if part < miB {
		return
	}
	step := resource.NewQuantity(miB, resource.BinarySI)
	mem.RequestPolicy = &resourceapi.CapacityRequestPolicy{
		Default:    resource.NewQuantity(part, resource.BinarySI),
		ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: step, Step: step},
	}
	d.Capacity[CapMemory] = mem
}

func mib(n uint64) resourceapi.DeviceCapacity {
	return resourceapi.DeviceCapacity{Value: *resource.NewQuantity(int64(n)*1024*1024, resource.BinarySI)}
}

// semver turns a dotted numeric version ("570.172.08", "9.0") into the
// semantic version a VersionValue must hold: three numeric parts without
// leading zeros ("570.172.8", "9.0.0"). NVIDIA's driver does the same
// through Masterminds/semver. ok is false for anything else.
func semver(v string) (string, bool) {
	parts := strings.Split(strings.TrimSpace(v), ".")
	if v == "" || len(parts) > 3 {
		return "", false
	}
	out := make([]string, 3)
	for i := range out {
		out[i] = "0"
		if i >= len(parts) {
			continue
		}
		n, err := strconv.ParseUint(parts[i], 10, 32)
		if err != nil {
			return "", false
		}
		out[i] = strconv.FormatUint(n, 10)
	}
	return strings.Join(out, "."), true
}

// validateDevices checks what the API server's ResourceSlice validation
// would reject in devices Build made: names that are not DNS labels or
// repeat, more attributes and capacities than a device may have.
func validateDevices(devs []resourceapi.Device) error {
	seen := map[string]bool{}
	for _, d := range devs {
		if errs := validation.IsDNS1123Label(d.Name); len(errs) > 0 {
			return fmt.Errorf("device name %q: %s", d.Name, strings.Join(errs, "; "))
		}
		if seen[d.Name] {
			return fmt.Errorf("device name %q given to two devices", d.Name)
		}
		seen[d.Name] = true
		if k := len(d.Attributes) + len(d.Capacity); k > resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice {
			return fmt.Errorf("device %s: %d attributes and capacities, at most %d", d.Name, k, resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice)
		}
	}
	return nil
}
