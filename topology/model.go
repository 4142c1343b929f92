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
}

// GPU is one physical GPU.
type GPU struct {
	Index    int    `json:"index"`
	UUID     string `json:"uuid"`
	PCIBusID string `json:"pciBusID,omitempty"`
	// NUMANode is the NUMA node from /sys/bus/pci/devices/<bdf>/numa_node;
	// -1 when the platform reports none.
	NUMANode  int    `json:"numaNode"`
	Model     string `json:"model,omitempty"`
	MemoryMiB uint64 `json:"memoryMiB,omitempty"`
	// Minor is the N of /dev/nvidiaN.
	Minor int `json:"minor,omitempty"`
	// PCIPath is the chain of PCI addresses from the root port down to the
	// GPU itself, read from the sysfs device link. Empty when unknown.
	PCIPath []string `json:"pciPath,omitempty"`
	// MIGCapable says the GPU supports MIG; MIGEnabled that MIG mode is on.
	MIGCapable bool `json:"migCapable,omitempty"`
	MIGEnabled bool `json:"migEnabled,omitempty"`
	// MIG lists the MIG devices configured on this GPU (MIGEnabled only).
	MIG []MIGDevice `json:"mig,omitempty"`
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
