package rdma

import (
	"fmt"
	"regexp"
	"strings"
	"sync"

	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

var hostBridgeRE = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^pci[0-9a-fA-F]{4}:[0-9a-fA-F]{2}$`)
})

// parsePCIPath splits a resolved sysfs device path such as
// /sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0 into its host bridge
// ("pci0000:00") and the chain of BDFs below it. It stops at the first
// element that is not a BDF, so paths into a device's subdirectories work.
func parsePCIPath(p string) (hostBridge string, chain []string, err error) {
	parts := strings.Split(p, "/")
	for i, part := range parts {
		if !hostBridgeRE().MatchString(part) {
			continue
		}
		for _, q := range parts[i+1:] {
			q = strings.ToLower(q)
			if !topology.IsBusID(q) {
				break
			}
			chain = append(chain, q)
		}
		if len(chain) == 0 {
			return "", nil, fmt.Errorf("pci path %s: no device below %s", p, part)
		}
		return part, chain, nil
	}
	return "", nil, fmt.Errorf("pci path %s: no pciDDDD:BB host bridge element", p)
}

// pciLevels ranks topology.PCIeLevel values, nearest first.
var pciLevels = map[topology.PCIeLevel]int{
	topology.PCIeSameBoard:    0,
	topology.PCIeSingleSwitch: 1,
	topology.PCIeMultiSwitch:  2,
	topology.PCIeHostBridge:   3,
	topology.PCIeSameCPU:      4,
	topology.PCIeCrossCPU:     5,
}

// Distance returns the closest common PCIe ancestor of two devices given
// their PCI paths (root port first, device last, as topology.GPU.PCIPath)
// and NUMA nodes. The rule, nearest first:
//   - same-board: the two are functions of one device (same bus:device).
//   - single-switch: their parent bridges are siblings (or the same
//     bridge), i.e. the downstream ports of one PCIe switch.
//   - multi-switch: they share a bridge below the root port, but reach it
//     through more than one switch.
//   - host-bridge: different root ports of the same host bridge (the root
//     ports' domain:bus match).
//   - same-cpu: different host bridges, same NUMA node.
//   - cross-cpu: anything else, including unknown paths or NUMA nodes.
func Distance(a []string, numaA int, b []string, numaB int) topology.PCIeLevel {
	if len(a) == 0 || len(b) == 0 {
		return numaLevel(numaA, numaB)
	}
	devA, devB := a[len(a)-1], b[len(b)-1]
	if slot(devA) == slot(devB) {
		return topology.PCIeSameBoard
	}
	parentA, parentB := a[:len(a)-1], b[:len(b)-1]
	common := 0
	for common < len(parentA) && common < len(parentB) && parentA[common] == parentB[common] {
		common++
	}
	if common > 0 {
		// Diverging at the last bridge means the parents are downstream
		// ports of one switch (or one bridge): a single switch.
		if common >= len(parentA)-1 && common >= len(parentB)-1 {
			return topology.PCIeSingleSwitch
		}
		return topology.PCIeMultiSwitch
	}
	if rootBus(a[0]) == rootBus(b[0]) {
		return topology.PCIeHostBridge
	}
	return numaLevel(numaA, numaB)
}

func numaLevel(a, b int) topology.PCIeLevel {
	if a >= 0 && a == b {
		return topology.PCIeSameCPU
	}
	return topology.PCIeCrossCPU
}

// slot strips the function from a BDF: "0000:0c:00.1" -> "0000:0c:00".
func slot(bdf string) string {
	if i := strings.LastIndexByte(bdf, '.'); i >= 0 {
		return strings.ToLower(bdf[:i])
	}
	return strings.ToLower(bdf)
}

// rootBus is the domain:bus of a root port, which identifies its host
// bridge ("0000:00:01.0" -> "0000:00" under pci0000:00).
func rootBus(bdf string) string {
	if i := strings.LastIndexByte(bdf, ':'); i >= 0 {
		return strings.ToLower(bdf[:i])
	}
	return strings.ToLower(bdf)
}

// ToTopology converts discovered devices into the node model: one NIC per
// device, with its PCIe distance to every GPU (see Distance for the rule).
func ToTopology(devs []Device, gpus []topology.GPU) []topology.NIC {
	nics := make([]topology.NIC, 0, len(devs))
	for _, d := range devs {
		nic := topology.NIC{
			Name:     d.Name,
			PCIBusID: d.PCI.Address,
			NUMANode: d.PCI.NUMANode,
			PCIPath:  append([]string(nil), d.PCI.Path...),
			NetDevs:  netDevNames(d),
		}
		if len(d.Ports) > 0 {
			nic.LinkLayer = d.Ports[0].LinkLayer
		}
		for _, g := range gpus {
			nic.GPUs = append(nic.GPUs, topology.NICGPULink{
				GPU:  g.Index,
				PCIe: Distance(d.PCI.Path, d.PCI.NUMANode, g.PCIPath, g.NUMANode),
			})
		}
		nics = append(nics, nic)
	}
	return nics
}

// netDevNames lists the netdevs of a device, device/net first, without
// duplicates or Virtual ones.
func netDevNames(d Device) []string {
	var names []string
	seen := map[string]bool{}
	add := func(nds []NetDev) {
		for _, n := range nds {
			if !n.Virtual && !seen[n.Name] {
				seen[n.Name] = true
				names = append(names, n.Name)
			}
		}
	}
	add(d.NetDevs)
	for _, p := range d.Ports {
		add(p.NetDevs)
	}
	return names
}
