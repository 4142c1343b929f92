// Package sim simulates GPU nodes so the agent, its tests and the demo run
// unchanged without hardware: go-nvml's own mock NVML servers extended with
// bus IDs, NUMA, NVLink and MIG, a sysfs/dev tree under a host root, run-time
// MIG changes and a loopback control endpoint for MIG changes and faults.
package sim

import (
	"fmt"
	"log/slog"
	"slices"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner/nvmlapi"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// Node is a simulated GPU node: the agent's NVML (nvmlapi.Library) and a
// host root whose sysfs and /dev agree with it.
//
// Concurrency: NVML calls may come from any goroutine while the layout
// changes. All mutable simulator state is guarded by mu. The XxxFunc fields
// of the mock devices are only assigned while New runs (in the install*
// hooks) or, for MIG devices, before a new layout is published; after that
// behaviour changes only through state that those functions read under mu
// (RLock in the functions, Lock in whoever changes it). A function holding
// mu must not call another device method, since that may take mu again.
type Node struct {
	log      *slog.Logger
	hostRoot string
	srv      *server.Server
	devices  []*server.Device

	// changed is signalled (without blocking) after every layout change.
	changed chan struct{}

	// layoutMu serialises layout changes (which also write files).
	layoutMu sync.Mutex

	mu   sync.RWMutex
	spec *topology.Node
	gpus []*gpuState
	// migHooks run on every MIG device the simulator creates, before it is
	// published, so fault and counter code can give it behaviour.
	migHooks []func(gpu int, d *mock.Device)
	faults   *faultState // set by installFaults (faults.go); has its own lock
	// calls counts NVML calls by method; gates[i] is what every call on GPU
	// i's handles passes (calls.go). nullDevice is the device of events
	// NVML raises without one (faults.go).
	calls      *callCounts
	gates      []*gpuGate
	nullDevice nvmlapi.Device
	arch       *archState // set by installArch (arch.go)
	procs      *procState // set by installProcesses (processes.go)
	// preflight is what the preflight faults change (preflight.go).
	preflight *preflightState

	// kmsg is the simulated kernel log, <host-root>/dev/kmsg (kmsg.go).
	kmsg *kmsgLog
	// nicFaults are the running nic-flap and nic-errors faults (nics.go).
	nicFaults nicFaults
}

// gpuState is the simulator's view of one GPU. Fields below mu are guarded
// by Node.mu; the rest are fixed once New returns.
type gpuState struct {
	index int
	cfg   gpus.Config
	busID string
	numa  int
	links []nvlinkEnd

	// migCapable: the GPU answers MIG calls (its model has MIG profiles,
	// or a snapshot says so); maxMIG is its GetMaxMigDeviceCount.
	migCapable bool
	maxMIG     int
	// memBytes is the GPU's memory, what MIG profile names are relative to.
	memBytes uint64
	// fabric is the GPU's NVLink fabric registration (fabric.go); nil
	// when GetGpuFabricInfo answers NOT_SUPPORTED.
	fabric *topology.Fabric

	// guarded by Node.mu
	lost bool
	// missing: the driver failed to initialise the GPU (gpu-missing): it is
	// on the PCI bus but NVML does not list it.
	missing    bool
	migEnabled bool
	generation int
	// gis are the GPU instances, with a compute instance or not yet;
	// mig the MIG devices (compute instances) in NVML's index order.
	gis []*gpuInstance
	mig []*migDevice

	// made counts the compute instances made through NVML, for their
	// UUIDs; guarded by Node.layoutMu.
	made int
}

// nvlinkEnd is the far end of one NVLink of a GPU.
type nvlinkEnd struct {
	remoteType  nvml.IntNvLinkDeviceType
	remoteBusID string
	// down is guarded by Node.mu; faults set it.
	down bool
}

// gpuInstance is one GPU instance of a GPU in MIG mode: the
// nvml.GpuInstance the mock device's functions hand out (go-nvml's mock,
// its functions answering as the handle does) and what the simulator knows
// of it. NVML callers reach it through giHandle (mig_handles.go). Fields
// are fixed once it is published, but destroyed, which Node.mu guards.
type gpuInstance struct {
	mock.GpuInstance
	n   *Node
	gpu int
	id  int
	// profile is the GPU instance profile (and the compute instance
	// profile that spans it); placement where it sits.
	profile   migProfile
	placement nvml.GpuInstancePlacement

	destroyed bool
}

// migDevice is one simulated MIG device: a compute instance of a GPU
// instance. Fields are fixed once it is published, but info.Index (NVML
// renumbers the MIG devices after one that is destroyed) and destroyed,
// which Node.mu guards.
type migDevice struct {
	dev   *mock.Device
	info  topology.MIGDevice
	attrs nvml.DeviceAttributes
	gi    *gpuInstance
	// ci is the compute instance profile, ciPlacement where the compute
	// instance sits in its GPU instance.
	ci          nvml.ComputeInstanceProfileInfo
	ciPlacement nvml.ComputeInstancePlacement

	destroyed bool
}

// New builds a simulated node from spec (a profile or a snapshot) and writes
// its sysfs and /dev tree under hostRoot, which must exist and is usually a
// temporary directory. A spec without PCI paths gets a flat PCI tree and its
// links' PCIe levels answer GetTopologyCommonAncestor.
func New(spec *topology.Node, hostRoot string, log *slog.Logger) (*Node, error) {
	if spec == nil {
		return nil, fmt.Errorf("simulated node: nil spec")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := spec.Validate(); err != nil {
		return nil, fmt.Errorf("simulated node: %w", err)
	}
	spec = cloneNode(spec)
	cfgs := make([]gpus.Config, len(spec.GPUs))
	for i, g := range spec.GPUs {
		cfgs[i] = configFor(g)
		// A snapshot's brand is what the GPU reports; without one, the
		// model's config says.
		if b, ok := topology.BrandType(g.Brand); ok {
			cfgs[i].Brand = b
		}
		spec.GPUs[i].Brand = topology.BrandName(cfgs[i].Brand)
	}
	// An R570 production-branch driver (CUDA 12.8): the NVML 12.8 header is
	// the first with NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (field 230), which
	// the simulator answers (go-nvml commit f420a32 "Bump to NVML version
	// 12.8" added it; its 12.6 header, R560, lacks it). 550.54.15, the
	// version simulated before, predates the field.
	// A snapshot of a real node keeps its driver's versions.
	driver, cuda := "570.172.08", 12080
	if spec.Host.DriverVersion != "" && spec.Host.CUDADriverVersion != 0 {
		driver, cuda = spec.Host.DriverVersion, spec.Host.CUDADriverVersion
	}
	spec.Host.DriverVersion, spec.Host.CUDADriverVersion = driver, cuda
	srv, err := server.New(
		server.WithGPUs(cfgs...),
		server.WithDriverVersion(driver),
		server.WithNVMLVersion("12."+driver),
		server.WithCUDADriverVersion(cuda),
	)
	if err != nil {
		return nil, fmt.Errorf("simulated node: mock server: %w", err)
	}
	n := &Node{
		log:      log,
		hostRoot: hostRoot,
		srv:      srv,
		changed:  make(chan struct{}, 1),
		spec:     spec,
		calls:    &callCounts{},
	}
	for i, g := range spec.GPUs {
		d := srv.Devices[i].(*server.Device)
		busID := g.PCIBusID
		if busID == "" {
			// A bus per GPU on a flat tree, clear of the profiles' ranges.
			busID = bdf(0x10+i, 0, 0)
			spec.GPUs[i].PCIBusID = busID
		}
		d.UUID = g.UUID
		d.PciBusID = busID
		d.Minor = g.Minor
		if g.Minor == 0 && i != 0 {
			d.Minor = i
			spec.GPUs[i].Minor = i
		}
		if g.MemoryMiB != 0 {
			d.MemoryInfo = nvml.Memory{Total: g.MemoryMiB << 20}
		}
		d.MemoryInfo.Free = d.MemoryInfo.Total
		if spec.GPUs[i].MemoryMiB == 0 {
			spec.GPUs[i].MemoryMiB = d.MemoryInfo.Total >> 20
		}
		if spec.GPUs[i].Model == "" {
			spec.GPUs[i].Model = cfgs[i].Name
		}
		spec.GPUs[i].MIGCapable = spec.GPUs[i].MIGCapable || len(cfgs[i].MIGProfiles.GpuInstanceProfiles) > 0
		n.devices = append(n.devices, d)
		n.gates = append(n.gates, &gpuGate{calls: n.calls, gpu: i})
		n.gpus = append(n.gpus, &gpuState{
			index:    i,
			cfg:      cfgs[i],
			busID:    busID,
			numa:     g.NUMANode,
			memBytes: d.MemoryInfo.Total,
			lost:     g.Lost,
		})
	}
	n.wireNVLinks()
	for i := range n.devices {
		n.installDevice(i)
	}
	if err := n.writeHostTree(); err != nil {
		return nil, fmt.Errorf("simulated node: host tree under %s: %w", hostRoot, err)
	}
	if err := n.installKmsg(); err != nil {
		return nil, fmt.Errorf("simulated node: kernel log under %s: %w", hostRoot, err)
	}
	n.installFaults()
	n.installFabric()
	n.installCounters()
	if err := n.installProcesses(); err != nil {
		return nil, fmt.Errorf("simulated node: %w", err)
	}
	n.installNICs()
	n.installArch()
	n.installPreflight()
	// MIG devices come after the install hooks so that their MIG hooks
	// apply to the initial layout as to later ones.
	for i, g := range spec.GPUs {
		if !g.MIGEnabled {
			continue
		}
		if err := n.buildMIG(i, g.MIG); err != nil {
			return nil, fmt.Errorf("simulated node: gpu %d: %w", i, err)
		}
	}
	if err := n.writeMIGCaps(); err != nil {
		return nil, fmt.Errorf("simulated node: mig capability files under %s: %w", hostRoot, err)
	}
	for i, d := range n.devices {
		fillUnsupported(&d.Device)
		n.wrapLost(&d.Device, i)
	}
	log.Info("simulated node ready", "gpus", len(spec.GPUs), "links", len(spec.Links), "nics", len(spec.NICs), "hostRoot", hostRoot)
	return n, nil
}

// NVML returns the simulated NVML library. Init and Shutdown succeed and may
// be called any number of times.
func (n *Node) NVML() nvmlapi.Library { return library{n} }

// HostRoot is the directory holding the simulated /sys and /dev.
func (n *Node) HostRoot() string { return n.hostRoot }

// Spec returns a copy of the node's current layout (MIG included) as NVML
// lists it: a GPU the driver failed to initialise (gpu-missing) is left out
// and the GPUs after it move down one index, as NVML's enumeration does
// (links and NIC distances follow). It is what discovery must find.
func (n *Node) Spec() *topology.Node {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.listed(cloneNode(n.spec))
}

// listed drops the GPUs NVML does not list from spec (a copy of n.spec)
// and renumbers the rest. Caller holds n.mu.
func (n *Node) listed(spec *topology.Node) *topology.Node {
	index := make([]int, len(n.gpus)) // simulator index -> NVML index, -1 if not listed
	next := 0
	for i, g := range n.gpus {
		index[i] = -1
		if !g.missing {
			index[i] = next
			next++
		}
	}
	if next == len(n.gpus) {
		return spec
	}
	gpus := spec.GPUs[:0]
	for i, g := range spec.GPUs {
		if index[i] >= 0 {
			g.Index = index[i]
			gpus = append(gpus, g)
		}
	}
	spec.GPUs = gpus
	links := spec.Links[:0]
	for _, l := range spec.Links {
		if index[l.A] >= 0 && index[l.B] >= 0 {
			l.A, l.B = index[l.A], index[l.B]
			links = append(links, l)
		}
	}
	spec.Links = links
	for k := range spec.NICs {
		near := spec.NICs[k].GPUs[:0]
		for _, d := range spec.NICs[k].GPUs {
			if d.GPU >= 0 && d.GPU < len(index) && index[d.GPU] >= 0 {
				d.GPU = index[d.GPU]
				near = append(near, d)
			}
		}
		spec.NICs[k].GPUs = near
	}
	return spec
}

// gpuSpec returns a copy of GPU i's entry in the layout by the simulator's
// index, listed by NVML or not.
func (n *Node) gpuSpec(i int) topology.GPU {
	n.mu.RLock()
	defer n.mu.RUnlock()
	g := n.spec.GPUs[i]
	g.MIG = slices.Clone(g.MIG)
	g.PCIPath = slices.Clone(g.PCIPath)
	return g
}

// Device returns the mock device of GPU i (nil if out of range) so the
// fault, counter and NIC code of this package can set its XxxFunc fields.
// Assign those only inside the install* hooks that New calls; see Node.
// It is not the NVML handle: NVML() hands out handles that call these
// functions directly (n.handle(i) inside the package), and anything that
// gives a device back to NVML callers (an event's Device, say) should use
// that handle so that it compares equal to theirs. Tests read the calls
// the agent does not make (nvmlapi.Device) from here.
func (n *Node) Device(i int) *server.Device {
	if i < 0 || i >= len(n.devices) {
		return nil
	}
	return n.devices[i]
}

// Changed is signalled after every layout change (MIG reconfiguration).
// Signals coalesce: one pending signal stands for any number of changes, so
// a single consumer re-reads the layout (re-discovers) on each receive.
func (n *Node) Changed() <-chan struct{} { return n.changed }

func (n *Node) notifyChanged() {
	select {
	case n.changed <- struct{}{}:
	default:
	}
}

// addMIGHook registers f to run on every MIG device created from now on,
// before it is visible through NVML. Call it only from an install* hook.
func (n *Node) addMIGHook(f func(gpu int, d *mock.Device)) {
	n.migHooks = append(n.migHooks, f)
}

// setGPULost marks GPU i lost (or found again): every NVML call on it except
// identity (UUID, index, minor, PCI info) then fails with ERROR_GPU_IS_LOST.
func (n *Node) setGPULost(i int, lost bool) error {
	if i < 0 || i >= len(n.gpus) {
		return fmt.Errorf("gpu %d: no such gpu", i)
	}
	n.mu.Lock()
	n.gpus[i].lost = lost
	n.spec.GPUs[i].Lost = lost
	n.mu.Unlock()
	return nil
}

// setNVLinkDown takes NVLink l of GPU i down (or up again).
func (n *Node) setNVLinkDown(i, l int, down bool) error {
	if i < 0 || i >= len(n.gpus) {
		return fmt.Errorf("gpu %d: no such gpu", i)
	}
	if l < 0 || l >= len(n.gpus[i].links) {
		return fmt.Errorf("gpu %d: nvlink %d: no such link (gpu has %d)", i, l, len(n.gpus[i].links))
	}
	n.mu.Lock()
	n.gpus[i].links[l].down = down
	n.mu.Unlock()
	return nil
}

func cloneNode(in *topology.Node) *topology.Node {
	out := &topology.Node{
		GPUs:  slices.Clone(in.GPUs),
		Links: slices.Clone(in.Links),
		NICs:  slices.Clone(in.NICs),
		Host:  in.Host,
	}
	if in.Host.VGPU != nil {
		v := *in.Host.VGPU
		out.Host.VGPU = &v
	}
	for i := range out.GPUs {
		out.GPUs[i].PCIPath = slices.Clone(out.GPUs[i].PCIPath)
		out.GPUs[i].MIG = slices.Clone(out.GPUs[i].MIG)
		if f := out.GPUs[i].Fabric; f != nil {
			c := *f
			out.GPUs[i].Fabric = &c
		}
	}
	for i := range out.NICs {
		out.NICs[i].PCIPath = slices.Clone(out.NICs[i].PCIPath)
		out.NICs[i].NetDevs = slices.Clone(out.NICs[i].NetDevs)
		out.NICs[i].GPUs = slices.Clone(out.NICs[i].GPUs)
	}
	return out
}
