package topology

import (
	"math/bits"
	"strings"
)

// Free is what a node has free for a new pod right now: devices that are
// offered (healthy) and allocated to no pod. It is what a scheduler that
// only counts devices cannot see: whether the free GPUs are NVLink-bound
// to each other, on which NUMA node they sit, which MIG profiles are left.
type Free struct {
	// GPUs counts the free whole GPUs.
	GPUs int
	// GPUsByNUMA counts the free whole GPUs by NUMA node (-1: the platform
	// reports none). Every NUMA node that holds one of the node's GPUs has
	// an entry, 0 when none of its GPUs is free.
	GPUsByNUMA map[int]int
	// NVLinkBlock is a largest set of free GPUs (GPU indices, ascending)
	// in which every pair is NVLink-connected: Link.NVLinks > 0, directly
	// (a DGX-1's hybrid cube-mesh) or through the NVSwitch fabric (DGX
	// A100/H100, DGX-2), which the model records as NVLinks between every
	// pair of GPUs on it. A free GPU alone is a block of one; empty when
	// no GPU is free.
	NVLinkBlock []int
	// NVLinkBlockExact is false when the search stopped at its bound
	// (see largestNVLinkBlock): NVLinkBlock is then the largest block
	// found, a lower bound. Never the case on a real node (≤ 16 GPUs).
	NVLinkBlockExact bool
	// MIGByProfile counts the free MIG devices by profile (e.g.
	// "1g.10gb"). Every profile configured on a MIG-enabled GPU of the
	// node has an entry, 0 when none of its devices is free.
	MIGByProfile map[string]int
}

// FreeDevices computes what is free on n. offered says whether the agent
// offers a device to the kubelet (healthy); it is asked about GPU UUIDs
// and MIG UUIDs, and nil means every device is offered. allocated holds
// the device IDs the kubelet assigned to pods, as the pod-resources API
// lists them: GPU UUIDs, MIG UUIDs, and replicas of either
// ("<uuid>::<n>", time-sliced sharing); IDs of other resources (RDMA
// ports) or of devices n does not have are ignored.
//
// A whole GPU is free when it is offered, not lost, not in MIG mode, and
// neither it, nor a replica of it, nor any of its MIG devices is
// allocated. A GPU in MIG mode is never a free whole GPU (a whole-GPU
// pod gets no usable GPU there); its MIG devices are counted instead,
// each free when offered and allocated to no pod, and its GPU neither
// lost nor allocated whole (as under mig-strategy none).
//
// FreeDevices only reads n; it is a pure function of its arguments.
func FreeDevices(n *Node, offered func(id string) bool, allocated map[string]bool) Free {
	f := Free{GPUsByNUMA: map[int]int{}, MIGByProfile: map[string]int{}, NVLinkBlockExact: true}
	if n == nil {
		return f
	}
	if offered == nil {
		offered = func(string) bool { return true }
	}
	// busy holds the allocated devices, replicas folded into the device
	// they share.
	busy := make(map[string]bool, len(allocated))
	for id, ok := range allocated {
		if !ok {
			continue
		}
		base, _, _ := strings.Cut(id, "::")
		busy[base] = true
	}
	var free []int
	for i := range n.GPUs {
		g := &n.GPUs[i]
		if _, ok := f.GPUsByNUMA[g.NUMANode]; !ok {
			f.GPUsByNUMA[g.NUMANode] = 0
		}
		if g.MIGEnabled {
			for _, m := range g.MIG {
				if _, ok := f.MIGByProfile[m.Profile]; !ok {
					f.MIGByProfile[m.Profile] = 0
				}
				if !g.Lost && !busy[g.UUID] && !busy[m.UUID] && offered(m.UUID) {
					f.MIGByProfile[m.Profile]++
				}
			}
			continue
		}
		if g.Lost || busy[g.UUID] || !offered(g.UUID) {
			continue
		}
		f.GPUs++
		f.GPUsByNUMA[g.NUMANode]++
		free = append(free, g.Index)
	}
	f.NVLinkBlock, f.NVLinkBlockExact = largestNVLinkBlock(n, free)
	return f
}

// maxBlockSearchSteps bounds the exact block search (calls of
// cliqueSearch.expand). With Tomita's pivot rule the search makes
// O(3^(k/3)) calls for k GPUs (Tomita, Tanaka, Takahashi 2006), a few
// hundred for the 16 GPUs of the largest node (DGX-2); only a made-up
// node of dozens of sparsely linked GPUs can reach the bound.
const maxBlockSearchSteps = 1 << 16

// maxExactBlockGPUs is the most free GPUs the exact search takes (one
// bit each in a uint64); beyond it a greedy search gives a lower bound.
const maxExactBlockGPUs = 64

// nvlinkAdjacency is the NVLink graph of the GPUs in pos (GPU index →
// position, positions under size, size at most 64) as bitmasks: bit b of
// adj[a] says the GPUs at positions a and b share an NVLink.
func nvlinkAdjacency(n *Node, pos map[int]int, size int) []uint64 {
	adj := make([]uint64, size)
	for _, l := range n.Links {
		a, okA := pos[l.A]
		b, okB := pos[l.B]
		if !okA || !okB || a == b || l.NVLinks <= 0 {
			continue
		}
		adj[a] |= 1 << b
		adj[b] |= 1 << a
	}
	return adj
}

// largestNVLinkBlock finds a maximum clique of the graph whose vertices
// are the free GPUs (indices, ascending) and whose edges are their
// NVLink-connected pairs. exact is false when the answer is only the
// largest clique found within the bounds above.
func largestNVLinkBlock(n *Node, free []int) (block []int, exact bool) {
	if len(free) == 0 {
		return nil, true
	}
	pos := make(map[int]int, len(free)) // GPU index → position in free
	for p, idx := range free {
		pos[idx] = p
	}
	if len(free) > maxExactBlockGPUs {
		return greedyNVLinkBlock(n, free, pos), false
	}
	s := cliqueSearch{adj: nvlinkAdjacency(n, pos, len(free))}
	all := uint64(1)<<len(free) - 1
	if len(free) == maxExactBlockGPUs {
		all = ^uint64(0)
	}
	s.expand(0, all, 0)
	for m := s.best; m != 0; m &= m - 1 {
		block = append(block, free[bits.TrailingZeros64(m)])
	}
	return block, !s.cut
}

// cliqueSearch is Bron–Kerbosch with Tomita's pivot and a size bound,
// over at most 64 vertices as bit sets.
type cliqueSearch struct {
	adj   []uint64
	best  uint64
	steps int
	cut   bool
}

// expand grows the clique r with candidates p; x holds the vertices
// already tried at this level (every clique through them is explored).
func (s *cliqueSearch) expand(r, p, x uint64) {
	if s.steps >= maxBlockSearchSteps {
		s.cut = true
		return
	}
	s.steps++
	if bits.OnesCount64(r) > bits.OnesCount64(s.best) {
		s.best = r
	}
	if p == 0 || bits.OnesCount64(r)+bits.OnesCount64(p) <= bits.OnesCount64(s.best) {
		return
	}
	// Every maximal clique holds the pivot u or a non-neighbour of it, so
	// only those are branched on; u is the vertex with the most
	// neighbours among the candidates.
	var u, most = -1, -1
	for m := p | x; m != 0; m &= m - 1 {
		v := bits.TrailingZeros64(m)
		if c := bits.OnesCount64(p & s.adj[v]); c > most {
			u, most = v, c
		}
	}
	for m := p &^ s.adj[u]; m != 0; m &= m - 1 {
		v := bits.TrailingZeros64(m)
		bit := uint64(1) << v
		s.expand(r|bit, p&s.adj[v], x&s.adj[v])
		if s.cut {
			return
		}
		p &^= bit
		x |= bit
	}
}

// greedyNVLinkBlock grows a block from every free GPU in turn, adding
// each later GPU linked to all already in it, and keeps the largest: a
// lower bound for nodes beyond the exact search.
func greedyNVLinkBlock(n *Node, free []int, pos map[int]int) []int {
	linked := make(map[[2]int]bool, len(n.Links))
	for _, l := range n.Links {
		_, okA := pos[l.A]
		_, okB := pos[l.B]
		if okA && okB && l.NVLinks > 0 {
			linked[[2]int{min(l.A, l.B), max(l.A, l.B)}] = true
		}
	}
	var best []int
	for start := range free {
		block := []int{free[start]}
		for _, c := range free[start+1:] {
			all := true
			for _, b := range block {
				if !linked[[2]int{min(b, c), max(b, c)}] {
					all = false
					break
				}
			}
			if all {
				block = append(block, c)
			}
		}
		if len(block) > len(best) {
			best = block
		}
	}
	return best
}
