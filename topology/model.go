// Package topology owns what a node has and how it is wired: a plain data
// model of GPUs, MIG devices, NICs and the links between them, MIG profile
// names, its JSON snapshot format, and the preferred-allocation solver that
// reads it. It makes no NVML call: the model is discovered by
// nvmlowner.Discoverer.
package topology

// Node is everything the agent knows about a node's devices and wiring. The
// same struct is the JSON snapshot: `topology dump` prints it, `--simulate
// FILE` loads it, and tests use it as a fixture.
type Node struct {
	// GPUs are ordered by NVML index.
	GPUs []GPU `json:"gpus"`
	// Links holds one entry per GPU pair (A < B) that is connected by
	// NVLink or whose PCIe relationship is known.
	Links []Link `json:"links,omitempty"`
	// NICs are RDMA-capable network devices (filled by package rdma).
	NICs []NIC `json:"nics,omitempty"`
	// Host is what the node's labels say beyond its devices: driver and
	// CUDA versions, machine type, vGPU.
	Host Host `json:"host,omitzero"`
	// Unread lists what this discovery could not read for a reason other
	// than the hardware not having it (NOT_SUPPORTED), e.g. "gpu 3:
	// GetCudaComputeCapability: Unknown Error". A node with any is
	// incomplete: labels computed from it could drop what is only
	// momentarily unreadable (see LabelsComplete).
	Unread []string `json:"unread,omitempty"`
}

// Host is the node-wide part of what gpu-feature-discovery labels.
type Host struct {
	// DriverVersion is nvmlSystemGetDriverVersion, e.g. "570.172.08".
	DriverVersion string `json:"driverVersion,omitempty"`
	// CUDADriverVersion is nvmlSystemGetCudaDriverVersion: the CUDA
	// version the driver supports, 1000*major + 10*minor (12080 is 12.8).
	CUDADriverVersion int `json:"cudaDriverVersion,omitempty"`
	// MachineType is <host-root>/sys/class/dmi/id/product_name, trimmed;
	// empty when the file cannot be read.
	MachineType string `json:"machineType,omitempty"`
	// VGPU is what the NVIDIA PCI functions' configuration space says
	// about vGPU; nil when it could not be read.
	VGPU *VGPU `json:"vgpu,omitempty"`
}

// VGPU says whether the node's NVIDIA PCI functions are vGPUs (a guest of
// a vGPU host), found by the vendor-specific PCI capability with the "VF"
// signature, and the host driver that capability names.
type VGPU struct {
	Present           bool   `json:"present"`
	HostDriverVersion string `json:"hostDriverVersion,omitempty"`
	HostDriverBranch  string `json:"hostDriverBranch,omitempty"`
}

// GPU is one physical GPU.
type GPU struct {
	Index    int    `json:"index"`
	UUID     string `json:"uuid"`
	PCIBusID string `json:"pciBusID,omitempty"`
	// NUMANode is the NUMA node from /sys/bus/pci/devices/<bdf>/numa_node;
	// -1 when the platform reports none.
	NUMANode int    `json:"numaNode"`
	Model    string `json:"model,omitempty"`
	// Brand is nvmlDeviceGetBrand's brand as go-nvlib names it ("Tesla",
	// "Nvidia", "Quadro", ...); empty when unknown.
	Brand     string `json:"brand,omitempty"`
	MemoryMiB uint64 `json:"memoryMiB,omitempty"`
	// Minor is the N of /dev/nvidiaN.
	Minor int `json:"minor,omitempty"`
	// ComputeMajor and ComputeMinor are the CUDA compute capability
	// (nvmlDeviceGetCudaComputeCapability), 9.0 for Hopper; 0 when unknown.
	ComputeMajor int `json:"computeMajor,omitempty"`
	ComputeMinor int `json:"computeMinor,omitempty"`
	// PCIClass is /sys/bus/pci/devices/<bdf>/class: 0x030200 for a 3D
	// controller (compute mode), 0x030000 for VGA (display mode); 0 when
	// it cannot be read.
	PCIClass uint32 `json:"pciClass,omitempty"`
	// PCIPath is the chain of PCI addresses from the root port down to the
	// GPU itself, read from the sysfs device link. Empty when unknown.
	PCIPath []string `json:"pciPath,omitempty"`
	// MIGCapable says the GPU supports MIG; MIGEnabled that MIG mode is on.
	MIGCapable bool `json:"migCapable,omitempty"`
	MIGEnabled bool `json:"migEnabled,omitempty"`
	// MIG lists the MIG devices configured on this GPU (MIGEnabled only).
	MIG []MIGDevice `json:"mig,omitempty"`
	// MIGProfiles are the GPU instance profiles the GPU offers, each with
	// every placement the driver allows for it, read only while MIG mode
	// is on and only when asked for (MIG devices made on demand).
	MIGProfiles []MIGProfile `json:"migProfiles,omitempty"`
	// Fabric is the GPU's registration with an NVLink fabric
	// (nvmlDeviceGetGpuFabricInfo); nil when the GPU has none (NVML
	// answers NOT_SUPPORTED: no NVSwitch, or older than Hopper) or the
	// read failed (then Node.Unread says so).
	Fabric *Fabric `json:"fabric,omitempty"`
	// Lost is set when NVML reports the GPU lost or unreachable during
	// discovery; the GPU stays in the model so it can be reported unhealthy.
	Lost bool `json:"lost,omitempty"`
	// LostReason says why Lost is set: the call that reported the GPU lost
	// ("GetUUID: GPU is lost") or that did not return in time
	// ("nvml-timeout: GetMemoryInfo").
	LostReason string `json:"lostReason,omitempty"`
}

// MIGDevice is one MIG device (a GPU instance + compute instance pair).
type MIGDevice struct {
	UUID string `json:"uuid"`
	// Profile is the canonical profile name, e.g. "1g.10gb" or "3g.40gb".
	Profile string `json:"profile"`
	// GPUInstance and ComputeInstance are the NVML GI and CI IDs, used to
	// match XID events and /dev/nvidia-caps nodes.
	GPUInstance     int    `json:"gi"`
	ComputeInstance int    `json:"ci"`
	MemoryMiB       uint64 `json:"memoryMiB,omitempty"`
	// Index is the MIG device index within its parent (NVML MIG handle index).
	Index int `json:"index"`
	// Attributes are the device's nvmlDeviceGetAttributes counts.
	Attributes MIGAttributes `json:"attributes,omitzero"`
	// Placement is where its GPU instance sits on the parent
	// (nvmlGpuInstanceInfo_t.placement); zero when unknown.
	Placement MIGPlacement `json:"placement,omitzero"`
}

// MIGPlacement is where a GPU instance sits on its GPU (nvml.h
// nvmlGpuInstancePlacement_t): its first slice and how many slices it
// spans, in the units of the GPU's placement table (eight memory slices on
// A100, H100, H200 and B200). Two GPU instances collide when their ranges
// overlap.
type MIGPlacement struct {
	Start uint32 `json:"start"`
	Size  uint32 `json:"size"`
}

// End is one past the placement's last slice.
func (p MIGPlacement) End() uint32 { return p.Start + p.Size }

// Overlaps reports whether p and q share a slice.
func (p MIGPlacement) Overlaps(q MIGPlacement) bool {
	return p.Size > 0 && q.Size > 0 && p.Start < q.End() && q.Start < p.End()
}

// MIGProfile is one GPU instance profile a GPU in MIG mode offers
// (nvmlDeviceGetGpuInstanceProfileInfo), with the compute instance that
// spans the whole GPU instance, and every placement the driver allows for
// it (nvmlDeviceGetGpuInstancePossiblePlacements).
type MIGProfile struct {
	// Name is the canonical profile name, "1g.10gb+me".
	Name string `json:"name"`
	// ID is the GPU_INSTANCE_PROFILE_* value the profile is asked for by
	// (nvml.h), not the per-device profile ID the info carries.
	ID        int    `json:"id"`
	MemoryMiB uint64 `json:"memoryMiB,omitempty"`
	// Instances is how many GPU instances of the profile the GPU holds at
	// most (nvmlGpuInstanceProfileInfo_t.instanceCount).
	Instances uint32 `json:"instances,omitempty"`
	// Attributes are what a MIG device of this profile reports: the
	// profile's multiprocessors, slices and engines.
	Attributes MIGAttributes  `json:"attributes,omitzero"`
	Placements []MIGPlacement `json:"placements,omitempty"`
}

// MIGAttributes are the counts nvmlDeviceGetAttributes reports for a MIG
// device (nvmlDeviceAttributes_t): its multiprocessors, GPU and compute
// instance slices and shared engines.
type MIGAttributes struct {
	Multiprocessors       uint32 `json:"multiprocessors,omitempty"`
	GPUInstanceSlices     uint32 `json:"giSlices,omitempty"`
	ComputeInstanceSlices uint32 `json:"ciSlices,omitempty"`
	CopyEngines           uint32 `json:"copyEngines,omitempty"`
	Decoders              uint32 `json:"decoders,omitempty"`
	Encoders              uint32 `json:"encoders,omitempty"`
	JPEGs                 uint32 `json:"jpegs,omitempty"`
	OFAs                  uint32 `json:"ofas,omitempty"`
}

// Link describes how two GPUs (by index, A < B) reach each other.
type Link struct {
	A int `json:"a"`
	B int `json:"b"`
	// NVLinks is the number of NVLink lanes connecting the pair, counting
	// those that go through an NVSwitch (min of both GPUs' switch links).
	NVLinks int `json:"nvlinks,omitempty"`
	// PCIe is the closest common PCIe ancestor of the pair.
	PCIe PCIeLevel `json:"pcie,omitempty"`
}

// NIC is an RDMA-capable network device (an HCA port/function).
type NIC struct {
	Name     string   `json:"name"`
	PCIBusID string   `json:"pciBusID,omitempty"`
	NUMANode int      `json:"numaNode"`
	PCIPath  []string `json:"pciPath,omitempty"`
	// NetDevs are the network interfaces backed by this RDMA device.
	NetDevs []string `json:"netdevs,omitempty"`
	// LinkLayer is "InfiniBand" or "Ethernet".
	LinkLayer string `json:"linkLayer,omitempty"`
	// GPUs is the PCIe distance from this NIC to each GPU, by GPU index.
	GPUs []NICGPULink `json:"gpus,omitempty"`
}

// NICGPULink is the PCIe distance between a NIC and one GPU.
type NICGPULink struct {
	GPU  int       `json:"gpu"`
	PCIe PCIeLevel `json:"pcie"`
}

// PCIeLevel is the closest common PCIe ancestor of two devices, from nearest
// to farthest. The names match NVML's topology levels.
type PCIeLevel string

// PCIe levels, nearest first.
const (
	PCIeSameBoard    PCIeLevel = "same-board"    // NVML TOPOLOGY_INTERNAL
	PCIeSingleSwitch PCIeLevel = "single-switch" // TOPOLOGY_SINGLE
	PCIeMultiSwitch  PCIeLevel = "multi-switch"  // TOPOLOGY_MULTIPLE
	PCIeHostBridge   PCIeLevel = "host-bridge"   // TOPOLOGY_HOSTBRIDGE
	PCIeSameCPU      PCIeLevel = "same-cpu"      // TOPOLOGY_NODE
	PCIeCrossCPU     PCIeLevel = "cross-cpu"     // TOPOLOGY_SYSTEM
)
