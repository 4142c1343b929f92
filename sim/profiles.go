package sim

import (
	"crypto/sha256"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"

	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// V100 configurations for the Volta profiles; go-nvml's mocks stop at Ampere.
var (
	v100SXM2 = gpus.Config{
		Name:         "Tesla V100-SXM2-32GB",
		Architecture: nvml.DEVICE_ARCH_VOLTA,
		Brand:        nvml.BRAND_TESLA,
		MemoryMB:     32768,
		CudaMajor:    7,
		CudaMinor:    0,
		PciDeviceId:  0x1DB510DE,
	}
	v100SXM3 = gpus.Config{
		Name:         "Tesla V100-SXM3-32GB",
		Architecture: nvml.DEVICE_ARCH_VOLTA,
		Brand:        nvml.BRAND_TESLA,
		MemoryMB:     32768,
		CudaMajor:    7,
		CudaMinor:    0,
		PciDeviceId:  0x1DB810DE,
	}
)

// knownConfigs are the GPU models the simulator can impersonate, looked up by
// the model name a snapshot carries.
var knownConfigs = []gpus.Config{
	realisticMIG(gpus.A100_SXM4_40GB), realisticMIG(gpus.A100_SXM4_80GB),
	realisticMIG(gpus.A100_PCIE_40GB), realisticMIG(gpus.A100_PCIE_80GB),
	realisticMIG(gpus.A30_PCIE_24GB), realisticMIG(gpus.H100_SXM5_80GB),
	realisticMIG(gpus.H200_SXM5_141GB), realisticMIG(gpus.B200_SXM5_180GB),
	v100SXM2, v100SXM3,
}

// profileDef is one built-in simulated node.
type profileDef struct {
	gpu   gpus.Config
	count int
	shape treeShape
	// nvswitchLinks is the number of NVLinks from each GPU into the
	// NVSwitch fabric (0: no NVSwitch).
	nvswitchLinks int
	// nvswitches is the number of NVSwitch chips the links spread over.
	nvswitches int
	// direct lists direct GPU-GPU NVLink bundles: {a, b, links}.
	direct [][3]int
	// nicLinkLayer is the link layer of the profile's NICs.
	nicLinkLayer string
	// storageNICs are extra NICs after the compute ones, outside the GPU
	// switch tree.
	storageNICs []topology.NIC
	// machine is the DMI product name (/sys/class/dmi/id/product_name) the
	// simulated host's firmware reports: the system's name, not copied
	// from any real firmware.
	machine string
	// nvlinkDomain is the multi-node NVLink domain the GPUs register in
	// (nil: none; a Hopper or later NVSwitch system then registers with
	// an all-zero cluster UUID, fabric.go).
	nvlinkDomain *nvlinkDomain
}

// nvlinkDomain is what every GPU of a multi-node NVLink profile reads from
// nvmlDeviceGetGpuFabricInfo once the Fabric Manager has registered it:
// the cluster UUID and clique ID of its NVLink domain.
type nvlinkDomain struct {
	clusterUUID string
	cliqueID    uint32
}

// dgxA100Storage is the DGX A100's storage NIC: one dual-port ConnectX
// running RoCE on a root port of socket 1, one PCI function per port, so
// mlx5_8 and mlx5_9 follow the eight InfiniBand compute NICs.
var dgxA100Storage = []topology.NIC{
	{Name: "mlx5_8", NUMANode: 1, LinkLayer: "Ethernet", PCIBusID: "0000:c1:00.0",
		PCIPath: []string{"0000:c0:01.1", "0000:c1:00.0"}, NetDevs: []string{"enp193s0f0np0"}},
	{Name: "mlx5_9", NUMANode: 1, LinkLayer: "Ethernet", PCIBusID: "0000:c1:00.1",
		PCIPath: []string{"0000:c0:01.1", "0000:c1:00.1"}, NetDevs: []string{"enp193s0f1np1"}},
}

// dgx1vLinks is the DGX-1 (Volta) hybrid cube-mesh: two NVLinks on the
// pairs of the first list, one on the second; six links per GPU in all.
var dgx1vLinks = [][3]int{
	{0, 3, 2}, {0, 4, 2}, {1, 2, 2}, {1, 5, 2}, {2, 3, 2}, {4, 7, 2}, {5, 6, 2}, {6, 7, 2},
	{0, 1, 1}, {0, 2, 1}, {1, 3, 1}, {2, 6, 1}, {3, 7, 1}, {4, 5, 1}, {4, 6, 1}, {5, 7, 1},
}

var profiles = map[string]profileDef{
	"dgx-a100": {
		gpu: realisticMIG(gpus.A100_SXM4_40GB), count: 8, nvswitchLinks: 12, nvswitches: 6,
		shape:        treeShape{gpusPerLeaf: 2, nicsPerLeaf: 2, subtreesPerHostBridge: 1},
		nicLinkLayer: "InfiniBand",
		storageNICs:  dgxA100Storage,
		machine:      "DGX A100",
	},
	"dgx-h100": {
		gpu: realisticMIG(gpus.H100_SXM5_80GB), count: 8, nvswitchLinks: 18, nvswitches: 4,
		shape:        treeShape{gpusPerLeaf: 1, nicsPerLeaf: 1, subtreesPerHostBridge: 2},
		nicLinkLayer: "InfiniBand",
		machine:      "DGX H100",
	},
	"dgx-h200": {
		gpu: realisticMIG(gpus.H200_SXM5_141GB), count: 8, nvswitchLinks: 18, nvswitches: 4,
		shape:        treeShape{gpusPerLeaf: 1, nicsPerLeaf: 1, subtreesPerHostBridge: 2},
		nicLinkLayer: "InfiniBand",
		machine:      "DGX H200",
	},
	"dgx-b200": {
		gpu: realisticMIG(gpus.B200_SXM5_180GB), count: 8, nvswitchLinks: 18, nvswitches: 2,
		shape:        treeShape{gpusPerLeaf: 1, nicsPerLeaf: 1, subtreesPerHostBridge: 2},
		nicLinkLayer: "InfiniBand",
		machine:      "DGX B200",
	},
	"dgx-1v": {
		gpu: v100SXM2, count: 8, direct: dgx1vLinks,
		shape:        treeShape{gpusPerLeaf: 2, nicsPerLeaf: 1, subtreesPerHostBridge: 2},
		nicLinkLayer: "InfiniBand",
		machine:      "DGX-1",
	},
	"dgx-2": {
		gpu: v100SXM3, count: 16, nvswitchLinks: 6, nvswitches: 12,
		shape:        treeShape{gpusPerLeaf: 2, nicsPerLeaf: 1, leavesPerTop: 2, subtreesPerHostBridge: 2},
		nicLinkLayer: "InfiniBand",
		machine:      "DGX-2",
	},
	// One compute tray of a GB200 NVL72 rack: two Grace CPUs with two
	// Blackwell GPUs each, every GPU's 18 NVLink 5 links going out of the
	// tray to the rack's NVLink switch trays (18 NVSwitch chips), and one
	// InfiniBand NIC per GPU. The 18 trays of a rack form one NVLink
	// domain: their GPUs register with one cluster UUID and clique ID,
	// fixed here (not taken from a real system).
	//
	// Approximations: the GPUs are go-nvml's B200 mock (the simulator has
	// no GB200 model; a GB200 names itself "NVIDIA GB200", with about
	// 186 GB of HBM3e); they hang off PCIe root ports of PCI domain 0
	// like the other profiles' (on the real tray each GPU sits behind its
	// Grace CPU's NVLink-C2C, in a PCI domain of its own); the BlueField
	// DPUs of the tray are left out; the links' far ends get the bus IDs
	// the simulator gives any 18-link GPU's switches (four, a DGX
	// H100's), which discovery does not read.
	"gb200-nvl72": {
		gpu: realisticMIG(gpus.B200_SXM5_180GB), count: 4, nvswitchLinks: 18, nvswitches: 18,
		shape:        treeShape{gpusPerLeaf: 1, nicsPerLeaf: 1, subtreesPerHostBridge: 1},
		nicLinkLayer: "InfiniBand",
		machine:      "GB200 NVL72",
		nvlinkDomain: &nvlinkDomain{clusterUUID: "3f2c8a6e-0b41-4d7e-9c15-5e8b7a1c2d90", cliqueID: 7},
	},
	"pcie-8gpu": {
		gpu: realisticMIG(gpus.A100_PCIE_80GB), count: 8,
		shape:   treeShape{gpusPerLeaf: 2, leavesPerTop: 2, subtreesPerHostBridge: 1},
		machine: "PCIe GPU Server (simulated)",
	},
}

// Profiles lists the built-in simulated node profiles, sorted.
func Profiles() []string {
	names := make([]string, 0, len(profiles))
	for name := range profiles {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// ProfileOption customises a built-in profile.
type ProfileOption func(*profileOptions) error

type profileOptions struct {
	mig map[int][]string
}

// WithMIG enables MIG on GPU gpuIndex with one MIG device per profile name,
// e.g. WithMIG(0, "1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"). The names are
// checked against the MIG profiles of the GPU model and must fit its slices.
// Without names the GPU is in MIG mode with no instance, for MIG devices
// made on demand.
func WithMIG(gpuIndex int, profiles ...string) ProfileOption {
	return func(o *profileOptions) error {
		if o.mig == nil {
			o.mig = map[int][]string{}
		}
		if _, dup := o.mig[gpuIndex]; dup {
			return fmt.Errorf("mig layout for gpu %d given twice", gpuIndex)
		}
		o.mig[gpuIndex] = slices.Clone(profiles)
		return nil
	}
}

// Profile returns the node model of a built-in profile: GPUs with
// deterministic UUIDs, bus IDs, NUMA nodes and PCI paths, NIC slots, and a
// link entry for every GPU pair.
func Profile(name string, opts ...ProfileOption) (*topology.Node, error) {
	def, ok := profiles[name]
	if !ok {
		return nil, fmt.Errorf("unknown simulator profile %q (known: %v)", name, Profiles())
	}
	var o profileOptions
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, fmt.Errorf("profile %s: %w", name, err)
		}
	}
	tree := buildTree(def.count, def.shape)
	node := &topology.Node{Host: topology.Host{MachineType: def.machine}}
	for i := 0; i < def.count; i++ {
		g := topology.GPU{
			Index:    i,
			UUID:     deterministicUUID("GPU", name, "gpu", i),
			PCIBusID: tree.gpuPaths[i][len(tree.gpuPaths[i])-1],
			NUMANode: tree.gpuNUMA[i],
			// go-nvml names some mocks "Mock NVIDIA ..."; the GPU names
			// itself "NVIDIA ..." (configFor maps it back).
			Model:      strings.TrimPrefix(def.gpu.Name, "Mock "),
			Brand:      topology.BrandName(def.gpu.Brand),
			MemoryMiB:  def.gpu.MemoryMB,
			Minor:      i,
			PCIPath:    tree.gpuPaths[i],
			MIGCapable: len(def.gpu.MIGProfiles.GpuInstanceProfiles) > 0,
			// A GPU is a PCI 3D controller (class 0x030200) in compute mode.
			PCIClass:     0x030200,
			ComputeMajor: def.gpu.CudaMajor,
			ComputeMinor: def.gpu.CudaMinor,
			Fabric:       def.fabric(),
		}
		node.GPUs = append(node.GPUs, g)
	}
	for gi, layout := range o.mig {
		if gi < 0 || gi >= def.count {
			return nil, fmt.Errorf("profile %s: mig layout for gpu %d: no such gpu (profile has %d)", name, gi, def.count)
		}
		g := &node.GPUs[gi]
		if !g.MIGCapable {
			return nil, fmt.Errorf("profile %s: gpu %d (%s) does not support MIG", name, gi, def.gpu.Name)
		}
		mig, err := planMIG(def.gpu, g.UUID, 0, layout)
		if err != nil {
			return nil, fmt.Errorf("profile %s: gpu %d: %w", name, gi, err)
		}
		g.MIGEnabled = true
		g.MIG = mig
	}
	nvl := map[[2]int]int{}
	for _, d := range def.direct {
		nvl[[2]int{d[0], d[1]}] = d[2]
	}
	for a := 0; a < def.count; a++ {
		for b := a + 1; b < def.count; b++ {
			l := topology.Link{A: a, B: b, NVLinks: nvl[[2]int{a, b}]}
			if def.nvswitchLinks > 0 {
				l.NVLinks = def.nvswitchLinks
			}
			l.PCIe = pcieLevel(tree.gpuPaths[a], tree.gpuPaths[b], tree.gpuNUMA[a], tree.gpuNUMA[b])
			node.Links = append(node.Links, l)
		}
	}
	for i, path := range tree.nicPaths {
		busID := path[len(path)-1]
		node.NICs = append(node.NICs, topology.NIC{
			Name:      fmt.Sprintf("mlx5_%d", i),
			PCIBusID:  busID,
			NUMANode:  tree.nicNUMA[i],
			PCIPath:   path,
			LinkLayer: def.nicLinkLayer,
			NetDevs:   []string{netdevName(busID)},
		})
	}
	for _, nic := range def.storageNICs {
		nic.PCIPath = slices.Clone(nic.PCIPath)
		nic.NetDevs = slices.Clone(nic.NetDevs)
		node.NICs = append(node.NICs, nic)
	}
	for i := range node.NICs {
		nic := &node.NICs[i]
		for g := range node.GPUs {
			nic.GPUs = append(nic.GPUs, topology.NICGPULink{
				GPU:  g,
				PCIe: pcieLevel(nic.PCIPath, tree.gpuPaths[g], nic.NUMANode, tree.gpuNUMA[g]),
			})
		}
	}
	return node, nil
}

// fabric is what a GPU of the profile reads from
// nvmlDeviceGetGpuFabricInfo: nothing (NOT_SUPPORTED) off an NVSwitch or
// before Hopper; registered with its NVLink domain on a multi-node NVLink
// profile; registered with an all-zero cluster UUID and clique 0 on a
// single-node NVSwitch system (fabric.go says why).
func (def profileDef) fabric() *topology.Fabric {
	if def.nvswitchLinks == 0 || !fabricArch(def.gpu.Architecture) {
		return nil
	}
	f := &topology.Fabric{State: topology.FabricCompleted}
	if d := def.nvlinkDomain; d != nil {
		f.ClusterUUID, f.CliqueID = d.clusterUUID, d.cliqueID
	}
	return f
}

// netdevName is the predictable interface name systemd gives an InfiniBand
// port at a bus ID: "ibp<bus>s<slot>" (f0 implied).
func netdevName(busID string) string {
	var dom, bus, dev, fn int
	if _, err := fmt.Sscanf(busID, "%x:%x:%x.%x", &dom, &bus, &dev, &fn); err != nil {
		return "ib0"
	}
	return fmt.Sprintf("ibp%ds%d", bus, dev)
}

// deterministicUUID formats a hash of its parts as prefix-8-4-4-4-12, so that
// simulated devices keep their IDs across runs.
func deterministicUUID(prefix string, parts ...any) string {
	h := sha256.Sum256([]byte(fmt.Sprintf("%#v", parts)))
	return fmt.Sprintf("%s-%x-%x-%x-%x-%x", prefix, h[0:4], h[4:6], h[6:8], h[8:10], h[10:16])
}

// configFor finds the mock GPU configuration for a model name, or makes
// one without MIG profiles from what the snapshot says (its MIG devices are
// then simulated from their names and sizes alone).
func configFor(g topology.GPU) gpus.Config {
	for _, c := range knownConfigs {
		// go-nvml names its SXM4 A100 "Mock NVIDIA A100-SXM4-40GB"; a dump
		// of a real one says "NVIDIA A100-SXM4-40GB" and keeps that name.
		if c.Name == g.Model || (g.Model != "" && strings.TrimPrefix(c.Name, "Mock ") == g.Model) {
			c.Name = g.Model
			return c
		}
	}
	c := gpus.Config{
		Name:         g.Model,
		Architecture: nvml.DEVICE_ARCH_UNKNOWN,
		Brand:        nvml.BRAND_NVIDIA,
		MemoryMB:     g.MemoryMiB,
		CudaMajor:    g.ComputeMajor,
		CudaMinor:    g.ComputeMinor,
		PciDeviceId:  0x000010DE,
	}
	if c.Name == "" {
		c.Name = "NVIDIA Simulated GPU"
	}
	if c.MemoryMB == 0 {
		c.MemoryMB = 16384
	}
	return c
}
