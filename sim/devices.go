package sim

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// nvswitchBus is the first bus of the simulated NVSwitches; the profiles'
// PCIe trees keep clear of it.
const nvswitchBus = 0xf0

// wireNVLinks turns the spec's per-pair NVLink counts into per-GPU links.
// When every pair has the same non-zero count (and there are more than two
// GPUs) the GPUs are taken to sit on an NVSwitch fabric with that many links
// each, which is what discovery's min(switch links) rule reads back;
// otherwise each pair's links are direct GPU-GPU links.
func (n *Node) wireNVLinks() {
	spec := n.spec
	count := len(spec.GPUs)
	pairs := map[[2]int]int{}
	for _, l := range spec.Links {
		if l.NVLinks > 0 {
			pairs[[2]int{l.A, l.B}] = l.NVLinks
		}
	}
	if per, ok := uniformFabric(pairs, count); ok {
		switches := nvswitchesFor(per)
		for _, g := range n.gpus {
			for l := 0; l < per; l++ {
				g.links = append(g.links, nvlinkEnd{
					remoteType:  nvml.NVLINK_DEVICE_TYPE_SWITCH,
					remoteBusID: bdf(nvswitchBus+l%switches, 0, 0),
				})
			}
		}
		return
	}
	for _, l := range spec.Links {
		for k := 0; k < l.NVLinks; k++ {
			n.gpus[l.A].links = append(n.gpus[l.A].links, nvlinkEnd{remoteType: nvml.NVLINK_DEVICE_TYPE_GPU, remoteBusID: n.gpus[l.B].busID})
			n.gpus[l.B].links = append(n.gpus[l.B].links, nvlinkEnd{remoteType: nvml.NVLINK_DEVICE_TYPE_GPU, remoteBusID: n.gpus[l.A].busID})
		}
	}
}

func uniformFabric(pairs map[[2]int]int, count int) (int, bool) {
	if count <= 2 || len(pairs) != count*(count-1)/2 {
		return 0, false
	}
	per := -1
	for _, c := range pairs {
		if per >= 0 && c != per {
			return 0, false
		}
		per = c
	}
	return per, per > 0
}

// nvswitchesFor is how many NVSwitch chips a GPU's links spread over on the
// DGX generations with that many links per GPU.
func nvswitchesFor(linksPerGPU int) int {
	switch linksPerGPU {
	case 6: // DGX-2: one link to each of the six switches on its board
		return 6
	case 12: // DGX A100: two links to each of six switches
		return 6
	case 18: // DGX H100: 5+4+4+5 over four switches
		return 4
	}
	return 1
}

// pciInfo is what NVML reports for a bus ID: an eight-digit domain in BusId
// and a four-digit one in BusIdLegacy, upper-case hex like the driver.
func pciInfo(busID string, deviceID uint32) nvml.PciInfo {
	var dom, bus, dev, fn uint32
	_, _ = fmt.Sscanf(busID, "%x:%x:%x.%x", &dom, &bus, &dev, &fn)
	p := nvml.PciInfo{Domain: dom, Bus: bus, Device: dev, PciDeviceId: deviceID, PciSubSystemId: 0x147f10de}
	copyCString(p.BusId[:], fmt.Sprintf("%08X:%02X:%02X.%X", dom, bus, dev, fn))
	copyCString(p.BusIdLegacy[:], fmt.Sprintf("%04X:%02X:%02X.%X", dom, bus, dev, fn))
	return p
}

func copyCString(dst []int8, s string) {
	for i := 0; i < len(s) && i < len(dst)-1; i++ {
		dst[i] = int8(s[i])
	}
}

// installDevice gives GPU i what the mock lacks: PCI info, NUMA, NVLink,
// topology and MIG queries.
func (n *Node) installDevice(i int) {
	d := n.devices[i]
	g := n.gpus[i]
	d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
		return pciInfo(g.busID, g.cfg.PciDeviceId), nvml.SUCCESS
	}
	d.GetNumaNodeIdFunc = func() (int, nvml.Return) {
		if g.numa < 0 {
			return 0, nvml.ERROR_NOT_SUPPORTED
		}
		return g.numa, nvml.SUCCESS
	}
	linkOK := func(l int) nvml.Return {
		if len(g.links) == 0 {
			return nvml.ERROR_NOT_SUPPORTED
		}
		if l < 0 || l >= len(g.links) {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		return nvml.SUCCESS
	}
	d.GetNvLinkStateFunc = func(l int) (nvml.EnableState, nvml.Return) {
		if r := linkOK(l); r != nvml.SUCCESS {
			return nvml.FEATURE_DISABLED, r
		}
		n.mu.RLock()
		down := g.links[l].down
		n.mu.RUnlock()
		if down {
			return nvml.FEATURE_DISABLED, nvml.SUCCESS
		}
		return nvml.FEATURE_ENABLED, nvml.SUCCESS
	}
	d.GetNvLinkRemotePciInfoFunc = func(l int) (nvml.PciInfo, nvml.Return) {
		if r := linkOK(l); r != nvml.SUCCESS {
			return nvml.PciInfo{}, r
		}
		return pciInfo(g.links[l].remoteBusID, 0), nvml.SUCCESS
	}
	d.GetNvLinkRemoteDeviceTypeFunc = func(l int) (nvml.IntNvLinkDeviceType, nvml.Return) {
		if r := linkOK(l); r != nvml.SUCCESS {
			return nvml.NVLINK_DEVICE_TYPE_UNKNOWN, r
		}
		return g.links[l].remoteType, nvml.SUCCESS
	}
	d.GetNvLinkVersionFunc = func(l int) (uint32, nvml.Return) {
		if r := linkOK(l); r != nvml.SUCCESS {
			return 0, r
		}
		return nvlinkVersion(g.cfg.Architecture), nvml.SUCCESS
	}
	d.GetTopologyCommonAncestorFunc = func(other nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) {
		o := n.indexOf(other)
		if o < 0 {
			return 0, nvml.ERROR_INVALID_ARGUMENT
		}
		lvl, _ := nvmlLevel(n.pairLevel(i, o))
		return nvml.GpuTopologyLevel(lvl), nvml.SUCCESS
	}
	n.installMIG(i)
}

// pairLevel is the PCIe level between GPUs a and b: the spec's link entry
// if it has one, else derived from PCI paths and NUMA nodes.
func (n *Node) pairLevel(a, b int) topology.PCIeLevel {
	if a == b {
		return topology.PCIeSameBoard
	}
	n.mu.RLock()
	defer n.mu.RUnlock()
	if l := n.spec.Link(a, b); l.PCIe != "" {
		return l.PCIe
	}
	ga, gb := n.spec.GPUs[a], n.spec.GPUs[b]
	return pcieLevel(ga.PCIPath, gb.PCIPath, ga.NUMANode, gb.NUMANode)
}

func nvlinkVersion(arch nvml.DeviceArchitecture) uint32 {
	switch arch {
	case nvml.DEVICE_ARCH_VOLTA:
		return 2
	case nvml.DEVICE_ARCH_AMPERE:
		return 3
	case nvml.DEVICE_ARCH_HOPPER:
		return 4
	case nvml.DEVICE_ARCH_BLACKWELL:
		return 5
	}
	return 4
}
