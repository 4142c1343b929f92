package sim

import (
	"fmt"
	"slices"
	"strings"

	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// treeShape describes how a profile hangs its GPUs (and NIC slots) off the
// PCIe hierarchy of each socket. Every leaf switch holds gpusPerLeaf GPUs and
// nicsPerLeaf NICs on its own downstream ports.
type treeShape struct {
	gpusPerLeaf int
	nicsPerLeaf int
	// leavesPerTop > 0 puts that many leaf switches below one top-level
	// switch, so GPUs under different leaves of one top are "multi-switch".
	leavesPerTop int
	// subtreesPerHostBridge is how many root ports (each holding one top or
	// leaf switch) share one host bridge; 1 makes every subtree its own
	// host bridge, so GPUs in different subtrees of a socket are "same-cpu".
	subtreesPerHostBridge int
}

// pciTree is the PCIe hierarchy of a simulated node: the path of every
// endpoint and the NUMA node of every host bridge.
type pciTree struct {
	gpuPaths [][]string
	gpuNUMA  []int
	nicPaths [][]string
	nicNUMA  []int
}

func bdf(bus, dev, fn int) string {
	return fmt.Sprintf("0000:%02x:%02x.%x", bus, dev, fn)
}

// buildTree lays out gpus GPUs over two sockets (half each) following shape.
// Host bridge j of socket s owns buses s*0x80 + j*0x20 .. +0x1f, which leaves
// 0xf0.. free for NVSwitches, and bus numbers are handed out depth first as
// firmware does.
func buildTree(gpus int, shape treeShape) pciTree {
	const sockets = 2
	var t pciTree
	perSocket := gpus / sockets
	leaves := perSocket / shape.gpusPerLeaf
	subtrees := leaves
	if shape.leavesPerTop > 0 {
		subtrees = leaves / shape.leavesPerTop
	}
	for s := 0; s < sockets; s++ {
		gpu := s * perSocket
		for st := 0; st < subtrees; st++ {
			hb := st / shape.subtreesPerHostBridge
			port := st % shape.subtreesPerHostBridge
			root := s*0x80 + hb*0x20
			// Buses below this root port start after the ones the host
			// bridge's earlier root ports used.
			next := root + 1 + port*(0x20/shape.subtreesPerHostBridge)
			alloc := func() int { b := next; next++; return b }
			rootPort := bdf(root, 1+2*port, 1)
			prefix := []string{rootPort}
			leafPrefixes := [][]string{prefix}
			if shape.leavesPerTop > 0 {
				up := alloc()
				down := alloc()
				leafPrefixes = nil
				for k := 0; k < shape.leavesPerTop; k++ {
					leafPrefixes = append(leafPrefixes, []string{rootPort, bdf(up, 0, 0), bdf(down, k, 0)})
				}
			}
			for _, lp := range leafPrefixes {
				up := alloc()
				down := alloc()
				path := append(slices.Clone(lp), bdf(up, 0, 0))
				k := 0
				for g := 0; g < shape.gpusPerLeaf; g++ {
					t.gpuPaths = append(t.gpuPaths, append(slices.Clone(path), bdf(down, k, 0), bdf(alloc(), 0, 0)))
					t.gpuNUMA = append(t.gpuNUMA, s)
					gpu++
					k++
				}
				for c := 0; c < shape.nicsPerLeaf; c++ {
					t.nicPaths = append(t.nicPaths, append(slices.Clone(path), bdf(down, k, 0), bdf(alloc(), 0, 0)))
					t.nicNUMA = append(t.nicNUMA, s)
					k++
				}
			}
		}
	}
	return t
}

// hostBridge is the PCI domain:bus of the root complex a path hangs off,
// taken from its root port ("0000:40:01.1" -> "0000:40").
func hostBridge(path []string) string {
	if len(path) == 0 {
		return ""
	}
	return path[0][:7]
}

// pcieLevel is the closest common ancestor of two endpoints given their PCI
// paths and NUMA nodes, with the meaning nvidia-smi topo gives the levels:
// PIX (one switch), PXB (several switches, no host bridge), PHB (host
// bridge), NODE (same socket), SYS (across sockets).
func pcieLevel(a, b []string, numaA, numaB int) topology.PCIeLevel {
	if numaA != numaB {
		return topology.PCIeCrossCPU
	}
	if len(a) == 0 || len(b) == 0 || hostBridge(a) != hostBridge(b) {
		return topology.PCIeSameCPU
	}
	common := 0
	for common < len(a)-1 && common < len(b)-1 && a[common] == b[common] {
		common++
	}
	switch {
	case common == 0:
		return topology.PCIeHostBridge
	case len(a) == common+2 && len(b) == common+2 && !isRootPort(a[common-1]):
		// Both endpoints sit on downstream ports of the switch whose
		// upstream port is the last shared hop.
		return topology.PCIeSingleSwitch
	default:
		return topology.PCIeMultiSwitch
	}
}

// isRootPort reports whether a path element is a root port; in the
// simulator's trees those are the only functions numbered .1.
func isRootPort(bdf string) bool { return strings.HasSuffix(bdf, ".1") }

// nvmlLevel maps a model PCIe level to NVML's topology level.
func nvmlLevel(l topology.PCIeLevel) (int, bool) {
	switch l {
	case topology.PCIeSameBoard:
		return 0, true
	case topology.PCIeSingleSwitch:
		return 10, true
	case topology.PCIeMultiSwitch:
		return 20, true
	case topology.PCIeHostBridge:
		return 30, true
	case topology.PCIeSameCPU:
		return 40, true
	case topology.PCIeCrossCPU:
		return 50, true
	}
	return 0, false
}
