package dra

import (
	"slices"

	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// NVLink grouping. Two attributes, both strings naming the group by its
// lowest-indexed GPU ("gpu-0"), so a claim can ask for GPUs in one group
// with matchAttribute; a GPU with no NVLink has neither, and a claim with
// such a constraint cannot get it (matchAttribute fails on a device that
// lacks the attribute).
//
//   - nvlinkDomain: a connected component of the graph whose edges are the
//     GPU pairs with NVLinks > 0 (topology.Link counts links through an
//     NVSwitch too). Any GPU of a domain reaches any other over NVLink,
//     perhaps through other GPUs: what NCCL rings need.
//   - nvlinkIsland: a group in which every pair is linked directly (or
//     through the NVSwitch fabric): what peer-to-peer needs. A domain that
//     is a clique is one island. Otherwise it is cut into disjoint cliques
//     greedily in index order: each island starts at the lowest GPU not yet
//     placed and takes, in index order, every GPU linked to all of its
//     members so far. An attribute holds one value (list attributes are
//     alpha, DRAListTypeAttributes), so islands cannot overlap.
//
// On NVSwitch systems (DGX A100/H100, DGX-2) every pair is linked: one
// domain and one island of all GPUs. The DGX-1V hybrid cube-mesh is one
// domain of 8 but not a clique (GPU 0 has no link to 5, 6 or 7); the greedy
// cut gives its two fully linked quads, {0,1,2,3} and {4,5,6,7}. PCIe-only
// nodes have neither attribute.

// nvlinkGroups returns, by GPU index, the domain and island each GPU
// belongs to, named by their lowest member's index; -1 for a GPU without
// NVLink.
func nvlinkGroups(n *topology.Node) (domain, island []int) {
	count := len(n.GPUs)
	linked := make([][]bool, count)
	for i := range linked {
		linked[i] = make([]bool, count)
	}
	hasLink := make([]bool, count)
	for _, l := range n.Links {
		if l.NVLinks <= 0 || l.A < 0 || l.B < 0 || l.A >= count || l.B >= count || l.A == l.B {
			continue
		}
		linked[l.A][l.B], linked[l.B][l.A] = true, true
		hasLink[l.A], hasLink[l.B] = true, true
	}
	domain = slices.Repeat([]int{-1}, count)
	island = slices.Repeat([]int{-1}, count)
	// Components by depth-first search from each unplaced GPU in index
	// order, so a component is named by its lowest index.
	for start := range count {
		if !hasLink[start] || domain[start] >= 0 {
			continue
		}
		stack := []int{start}
		domain[start] = start
		for len(stack) > 0 {
			g := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			for h := range count {
				if linked[g][h] && domain[h] < 0 {
					domain[h] = start
					stack = append(stack, h)
				}
			}
		}
	}
	for start := range count {
		if !hasLink[start] || island[start] >= 0 {
			continue
		}
		members := []int{start}
		island[start] = start
		for g := start + 1; g < count; g++ {
			if island[g] >= 0 || domain[g] != domain[start] {
				continue
			}
			if !allLinked(linked, g, members) {
				continue
			}
			members = append(members, g)
			island[g] = start
		}
	}
	return domain, island
}

func allLinked(linked [][]bool, g int, members []int) bool {
	for _, m := range members {
		if !linked[g][m] {
			return false
		}
	}
	return true
}
