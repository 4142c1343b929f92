package topology_test

import (
	"bytes"
	"fmt"
	"maps"
	"math/bits"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"

	"github.com/gpu-node-agent/gpu-node-agent/sim"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// The fixtures below are the simulator's profiles as snapshots
// (testdata/profiles, kept equal to package sim's profiles by its tests).
//
// DGX-1V, NVIDIA's hybrid cube-mesh (DGX-1 System Architecture white
// paper WP-08437-001: a cube with GPUs at its corners, all twelve edges
// NVLink, two of the six faces with their diagonals too; six NVLinks per
// V100). The pairs with NVLinks, as in NVIDIA's go-gpuallocator v0.6.0
// (gpuallocator/common_test.go, NewDGX1VoltaNode) and the topology NCCL
// dumps on a DGX-1V (NVIDIA/nccl#671):
//
//	two links: 0-3 0-4 1-2 1-5 2-3 4-7 5-6 6-7
//	one link:  0-1 0-2 1-3 2-6 3-7 4-5 4-6 5-7
//	none:      the other twelve pairs (0-5 0-6 0-7 1-4 1-6 1-7 2-4 2-5 2-7 3-4 3-5 3-6)
//
// Neighbours: N(0)={1,2,3,4} N(1)={0,2,3,5} N(2)={0,1,3,6} N(3)={0,1,2,7}
// N(4)={0,5,6,7} N(5)={1,4,6,7} N(6)={2,4,5,7} N(7)={3,4,5,6}.
// So Q0={0,1,2,3} and Q1={4,5,6,7} are each fully linked, and the only
// links between them are the matching i–(i+4). A block with GPUs of both
// quads holds such a pair, and N(i) ∩ N(i+4) is empty (e.g. {1,2,3,4} ∩
// {0,5,6,7}), so that block has two GPUs. Hence the largest free block
// is max(|free ∩ Q0|, |free ∩ Q1|, 2 if some i and i+4 are both free, 1
// if any GPU is free). NUMA: GPUs 0-3 on node 0, 4-7 on node 1.
//
// DGX H100: each H100's 18 NVLinks go to the four NVSwitch chips (the
// 18 links of `nvidia-smi nvlink -R` on an H100 server reach four switch
// bus IDs, NVIDIA/nccl#1182), so every pair of GPUs is NVLink-connected
// (NV18 in `nvidia-smi topo -m`; the model records 18 NVLinks for each
// of the 28 pairs) and any set of free GPUs is one block: the largest
// block is the number of free GPUs. NUMA: GPUs 0-3 on node 0, 4-7 on 1.

func loadFreeFixture(t *testing.T, name string) *topology.Node {
	t.Helper()
	n, err := topology.LoadSnapshot(filepath.Join("testdata", "profiles", name+".json"))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// dgxH100MIG is the DGX H100 with the demo's MIG layout: GPU 0 split
// 3g.40gb+2g.20gb+1g.10gb+1g.10gb, GPU 1 into seven 1g.10gb.
func dgxH100MIG(t *testing.T) *topology.Node {
	t.Helper()
	n, err := sim.Profile("dgx-h100",
		sim.WithMIG(0, "3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"),
		sim.WithMIG(1, "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb"))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestDGX1VFixtureIsTheCubeMesh pins the premise of the DGX-1V
// derivations: the fixture's NVLink pairs are exactly the published ones.
func TestDGX1VFixtureIsTheCubeMesh(t *testing.T) {
	n := loadFreeFixture(t, "dgx-1v")
	want := map[[2]int]int{
		{0, 3}: 2, {0, 4}: 2, {1, 2}: 2, {1, 5}: 2, {2, 3}: 2, {4, 7}: 2, {5, 6}: 2, {6, 7}: 2,
		{0, 1}: 1, {0, 2}: 1, {1, 3}: 1, {2, 6}: 1, {3, 7}: 1, {4, 5}: 1, {4, 6}: 1, {5, 7}: 1,
	}
	for a := range 8 {
		for b := a + 1; b < 8; b++ {
			if got := n.Link(a, b).NVLinks; got != want[[2]int{a, b}] {
				t.Errorf("pair %d-%d: %d NVLinks, want %d", a, b, got, want[[2]int{a, b}])
			}
		}
	}
	h100 := loadFreeFixture(t, "dgx-h100")
	for a := range 8 {
		for b := a + 1; b < 8; b++ {
			if got := h100.Link(a, b).NVLinks; got != 18 {
				t.Fatalf("dgx-h100 pair %d-%d: %d NVLinks, want 18 (NVSwitch)", a, b, got)
			}
		}
	}
}

// migUUIDs lists the UUIDs of GPU gpu's MIG devices with the profile.
func migUUIDs(n *topology.Node, gpu int, profile string) []string {
	var out []string
	for _, m := range n.GPUs[gpu].MIG {
		if m.Profile == profile {
			out = append(out, m.UUID)
		}
	}
	return out
}

func TestFreeDevices(t *testing.T) {
	uuid := func(n *topology.Node, i int) string { return n.GPUs[i].UUID }
	tests := []struct {
		name string
		node func(t *testing.T) *topology.Node
		// unhealthy and allocated name devices by func of the node.
		unhealthy func(n *topology.Node) []string
		allocated func(n *topology.Node) []string
		// nilOffered passes offered == nil (every device offered).
		nilOffered bool

		wantGPUs      int
		wantNUMA      map[int]int
		wantBlockSize int
		wantBlock     []int // nil: several largest blocks, any will do
		wantMIG       map[string]int
	}{
		{
			name: "dgx-1v idle: 8 free, a quad is the largest block",
			node: func(t *testing.T) *topology.Node { return loadFreeFixture(t, "dgx-1v") },
			// free ∩ Q0 = Q0, free ∩ Q1 = Q1: two blocks of 4.
			wantGPUs: 8, wantNUMA: map[int]int{0: 4, 1: 4}, wantBlockSize: 4,
			wantMIG: map[string]int{},
		},
		{
			name:      "dgx-1v, 0 and 5 allocated",
			node:      func(t *testing.T) *topology.Node { return loadFreeFixture(t, "dgx-1v") },
			allocated: func(n *topology.Node) []string { return []string{uuid(n, 0), uuid(n, 5)} },
			// free {1,2,3,4,6,7}: free ∩ Q0 = {1,2,3}, free ∩ Q1 = {4,6,7}: 3.
			wantGPUs: 6, wantNUMA: map[int]int{0: 3, 1: 3}, wantBlockSize: 3,
			wantMIG: map[string]int{},
		},
		{
			name: "dgx-1v, 0 1 4 5 allocated: four free, no three of them linked",
			node: func(t *testing.T) *topology.Node { return loadFreeFixture(t, "dgx-1v") },
			allocated: func(n *topology.Node) []string {
				return []string{uuid(n, 0), uuid(n, 1), uuid(n, 4), uuid(n, 5)}
			},
			// free {2,3,6,7}: two per quad, and the cross pairs 2-6, 3-7:
			// a square 2-3-7-6 without diagonals, so blocks of 2.
			wantGPUs: 4, wantNUMA: map[int]int{0: 2, 1: 2}, wantBlockSize: 2,
			wantMIG: map[string]int{},
		},
		{
			name: "dgx-1v, 0 1 2 5 6 7 allocated: the two free GPUs are not linked",
			node: func(t *testing.T) *topology.Node { return loadFreeFixture(t, "dgx-1v") },
			allocated: func(n *topology.Node) []string {
				return []string{uuid(n, 0), uuid(n, 1), uuid(n, 2), uuid(n, 5), uuid(n, 6), uuid(n, 7)}
			},
			// free {3,4}: N(3) = {0,1,2,7} lacks 4, so no two free GPUs
			// are linked: blocks of 1.
			wantGPUs: 2, wantNUMA: map[int]int{0: 1, 1: 1}, wantBlockSize: 1,
			wantMIG: map[string]int{},
		},
		{
			name:      "dgx-1v, 3 unhealthy, a replica of 4 allocated",
			node:      func(t *testing.T) *topology.Node { return loadFreeFixture(t, "dgx-1v") },
			unhealthy: func(n *topology.Node) []string { return []string{uuid(n, 3)} },
			allocated: func(n *topology.Node) []string { return []string{uuid(n, 4) + "::2"} },
			// free {0,1,2,5,6,7}: {0,1,2} and {5,6,7}: 3.
			wantGPUs: 6, wantNUMA: map[int]int{0: 3, 1: 3}, wantBlockSize: 3,
			wantMIG: map[string]int{},
		},
		{
			name: "dgx-1v, 6 lost (though offered), 7 allocated",
			node: func(t *testing.T) *topology.Node {
				n := loadFreeFixture(t, "dgx-1v")
				n.GPUs[6].Lost, n.GPUs[6].LostReason = true, "GetUUID: GPU is lost"
				return n
			},
			allocated: func(n *topology.Node) []string { return []string{uuid(n, 7)} },
			// free {0,1,2,3,4,5}: free ∩ Q0 = Q0 is the only block of 4.
			wantGPUs: 6, wantNUMA: map[int]int{0: 4, 1: 2}, wantBlockSize: 4, wantBlock: []int{0, 1, 2, 3},
			wantMIG: map[string]int{},
		},
		{
			name:     "dgx-h100 idle: one block of 8 through NVSwitch",
			node:     func(t *testing.T) *topology.Node { return loadFreeFixture(t, "dgx-h100") },
			wantGPUs: 8, wantNUMA: map[int]int{0: 4, 1: 4}, wantBlockSize: 8, wantBlock: []int{0, 1, 2, 3, 4, 5, 6, 7},
			wantMIG: map[string]int{},
		},
		{
			name:      "dgx-h100, 0 1 2 allocated, 7 unhealthy",
			node:      func(t *testing.T) *topology.Node { return loadFreeFixture(t, "dgx-h100") },
			allocated: func(n *topology.Node) []string { return []string{uuid(n, 0), uuid(n, 1), uuid(n, 2)} },
			unhealthy: func(n *topology.Node) []string { return []string{uuid(n, 7)} },
			// free {3,4,5,6}, all linked through the switches.
			wantGPUs: 4, wantNUMA: map[int]int{0: 1, 1: 3}, wantBlockSize: 4, wantBlock: []int{3, 4, 5, 6},
			wantMIG: map[string]int{},
		},
		{
			name: "dgx-h100 demo MIG layout, MIG devices and a replica allocated, 5 lost",
			node: func(t *testing.T) *topology.Node {
				n := dgxH100MIG(t)
				n.GPUs[5].Lost = true
				return n
			},
			allocated: func(n *topology.Node) []string {
				return []string{
					migUUIDs(n, 0, "3g.40gb")[0],
					migUUIDs(n, 1, "1g.10gb")[0],
					uuid(n, 2) + "::0",
					"mlx5_0", // an RDMA port: another resource, ignored
				}
			},
			unhealthy: func(n *topology.Node) []string { return []string{migUUIDs(n, 1, "1g.10gb")[6]} },
			// Whole GPUs: 0 and 1 are in MIG mode, 2 shared by a pod, 5
			// lost: free {3,4,6,7} (NUMA 0: 3; NUMA 1: 4 6 7), one block.
			// MIG: 3g.40gb 1-1 = 0; 2g.20gb 1; 1g.10gb: GPU 0's two +
			// GPU 1's seven less one allocated, less one unhealthy = 2+5.
			wantGPUs: 4, wantNUMA: map[int]int{0: 1, 1: 3}, wantBlockSize: 4, wantBlock: []int{3, 4, 6, 7},
			wantMIG: map[string]int{"3g.40gb": 0, "2g.20gb": 1, "1g.10gb": 7},
		},
		{
			name: "dgx-h100, GPU 1 in MIG mode allocated whole (mig-strategy none), a MIG replica allocated",
			node: dgxH100MIG,
			allocated: func(n *topology.Node) []string {
				return []string{uuid(n, 1), migUUIDs(n, 0, "1g.10gb")[1] + "::3"}
			},
			// GPU 1 held whole: none of its seven 1g.10gb is free. GPU 0:
			// 3g.40gb, 2g.20gb and one of its two 1g.10gb. Whole GPUs
			// 2..7 free (NUMA 0: 2 3; NUMA 1: 4..7), one block of 6.
			wantGPUs: 6, wantNUMA: map[int]int{0: 2, 1: 4}, wantBlockSize: 6, wantBlock: []int{2, 3, 4, 5, 6, 7},
			wantMIG: map[string]int{"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 1},
		},
		{
			name: "dgx-h100 MIG GPU lost: its MIG devices are not free",
			node: func(t *testing.T) *topology.Node {
				n := dgxH100MIG(t)
				n.GPUs[1].Lost = true
				return n
			},
			nilOffered: true,
			wantGPUs:   6, wantNUMA: map[int]int{0: 2, 1: 4}, wantBlockSize: 6, wantBlock: []int{2, 3, 4, 5, 6, 7},
			wantMIG: map[string]int{"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2},
		},
		{
			name: "dgx-2: sixteen GPUs on one NVSwitch fabric, five allocated",
			node: func(t *testing.T) *topology.Node { return loadFreeFixture(t, "dgx-2") },
			allocated: func(n *topology.Node) []string {
				return []string{uuid(n, 0), uuid(n, 3), uuid(n, 8), uuid(n, 9), uuid(n, 15)}
			},
			// DGX-2: 8 GPUs per NUMA node (0-7, 8-15), NV6 between every pair.
			wantGPUs: 11, wantNUMA: map[int]int{0: 6, 1: 5}, wantBlockSize: 11,
			wantBlock: []int{1, 2, 4, 5, 6, 7, 10, 11, 12, 13, 14},
			wantMIG:   map[string]int{},
		},
		{
			name: "unknown and de-allocated IDs are ignored, nil offered offers all",
			node: func(t *testing.T) *topology.Node { return loadFreeFixture(t, "dgx-h100") },
			allocated: func(n *topology.Node) []string {
				return []string{"GPU-not-on-this-node", "MIG-not-on-this-node::1", "mlx5_3"}
			},
			nilOffered: true,
			wantGPUs:   8, wantNUMA: map[int]int{0: 4, 1: 4}, wantBlockSize: 8, wantBlock: []int{0, 1, 2, 3, 4, 5, 6, 7},
			wantMIG: map[string]int{},
		},
		{
			name: "every GPU lost before its UUID was read",
			node: func(*testing.T) *topology.Node {
				n := &topology.Node{}
				for i := range 2 {
					n.GPUs = append(n.GPUs, topology.GPU{Index: i, UUID: topology.LostGPUID(i), NUMANode: -1, Lost: true})
				}
				return n
			},
			nilOffered: true,
			wantGPUs:   0, wantNUMA: map[int]int{-1: 0}, wantMIG: map[string]int{},
		},
		{
			name:     "empty node",
			node:     func(*testing.T) *topology.Node { return &topology.Node{} },
			wantNUMA: map[int]int{}, wantMIG: map[string]int{},
		},
		{
			name:     "nil node",
			node:     func(*testing.T) *topology.Node { return nil },
			wantNUMA: map[int]int{}, wantMIG: map[string]int{},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := tc.node(t)
			unhealthy := map[string]bool{}
			allocated := map[string]bool{"GPU-released-by-its-pod": false}
			if tc.unhealthy != nil {
				for _, id := range tc.unhealthy(n) {
					unhealthy[id] = true
				}
			}
			if tc.allocated != nil {
				for _, id := range tc.allocated(n) {
					allocated[id] = true
				}
			}
			if n != nil && len(n.GPUs) > 0 {
				allocated[n.GPUs[len(n.GPUs)-1].UUID+"-released"] = false
			}
			offered := func(id string) bool {
				if n != nil {
					if _, _, ok := n.MIGParent(id); !ok {
						if _, ok := n.GPUByUUID(id); !ok {
							t.Errorf("offered asked about %q, which is neither a GPU nor a MIG device of the node", id)
						}
					}
				}
				return !unhealthy[id]
			}
			if tc.nilOffered {
				offered = nil
			}
			got := topology.FreeDevices(n, offered, allocated)
			if got.GPUs != tc.wantGPUs {
				t.Errorf("GPUs = %d, want %d", got.GPUs, tc.wantGPUs)
			}
			if !maps.Equal(got.GPUsByNUMA, tc.wantNUMA) {
				t.Errorf("GPUsByNUMA = %v, want %v", got.GPUsByNUMA, tc.wantNUMA)
			}
			if !maps.Equal(got.MIGByProfile, tc.wantMIG) {
				t.Errorf("MIGByProfile = %v, want %v", got.MIGByProfile, tc.wantMIG)
			}
			if !got.NVLinkBlockExact {
				t.Errorf("NVLinkBlockExact = false on a %d-GPU node", len(n.GPUs))
			}
			if len(got.NVLinkBlock) != tc.wantBlockSize {
				t.Errorf("NVLinkBlock = %v (%d GPUs), want %d GPUs", got.NVLinkBlock, len(got.NVLinkBlock), tc.wantBlockSize)
			}
			if tc.wantBlock != nil && !slices.Equal(got.NVLinkBlock, tc.wantBlock) {
				t.Errorf("NVLinkBlock = %v, want %v", got.NVLinkBlock, tc.wantBlock)
			}
			checkBlock(t, n, got.NVLinkBlock, func(i int) bool {
				g := n.GPUs[i]
				return !g.Lost && !g.MIGEnabled && !allocated[g.UUID] && !unhealthy[g.UUID]
			})
		})
	}
}

// checkBlock asserts block is ascending, free and pairwise NVLinked.
func checkBlock(t *testing.T, n *topology.Node, block []int, free func(int) bool) {
	t.Helper()
	if !slices.IsSorted(block) {
		t.Errorf("block %v not ascending", block)
	}
	for k, a := range block {
		if !free(a) {
			t.Errorf("block %v holds GPU %d, which is not free", block, a)
		}
		for _, b := range block[k+1:] {
			if n.Link(a, b).NVLinks <= 0 {
				t.Errorf("block %v holds %d and %d, which have no NVLink", block, a, b)
			}
		}
	}
}

// linkedNode is a node of k GPUs, all free, with NVLinks on the pairs
// linked says.
func linkedNode(k int, linked func(a, b int) bool) *topology.Node {
	n := &topology.Node{}
	for i := range k {
		n.GPUs = append(n.GPUs, topology.GPU{Index: i, UUID: fmt.Sprintf("GPU-%d", i), NUMANode: i % 2})
	}
	for a := range k {
		for b := a + 1; b < k; b++ {
			l := topology.Link{A: a, B: b, PCIe: topology.PCIeCrossCPU}
			if linked(a, b) {
				l.NVLinks = 1
			}
			n.Links = append(n.Links, l)
		}
	}
	return n
}

// TestFreeDevicesLargestBlockIsMaximum checks the block search against
// every subset of GPUs on random wirings of up to 12 GPUs.
func TestFreeDevicesLargestBlockIsMaximum(t *testing.T) {
	r := rand.New(rand.NewPCG(14, 2026))
	for c := range 300 {
		k := 1 + r.IntN(12)
		density := r.Float64()
		adj := make([]uint32, k)
		n := linkedNode(k, func(a, b int) bool {
			if r.Float64() < density {
				adj[a] |= 1 << b
				adj[b] |= 1 << a
				return true
			}
			return false
		})
		allocated := map[string]bool{}
		var freeMask uint32
		for i := range k {
			if r.IntN(4) == 0 {
				allocated[n.GPUs[i].UUID] = true
			} else {
				freeMask |= 1 << i
			}
		}
		want := 0
		for s := uint32(0); s < 1<<k; s++ {
			if s&^freeMask != 0 || bits.OnesCount32(s) <= want {
				continue
			}
			clique := true
			for m := s; m != 0 && clique; m &= m - 1 {
				v := bits.TrailingZeros32(m)
				clique = s&^(1<<v)&^adj[v] == 0
			}
			if clique {
				want = bits.OnesCount32(s)
			}
		}
		got := topology.FreeDevices(n, nil, allocated)
		if len(got.NVLinkBlock) != want || !got.NVLinkBlockExact {
			t.Fatalf("case %d (%d GPUs, free %b): block %v exact %v, want %d GPUs", c, k, freeMask, got.NVLinkBlock, got.NVLinkBlockExact, want)
		}
		checkBlock(t, n, got.NVLinkBlock, func(i int) bool { return freeMask&(1<<i) != 0 })
	}
}

// TestFreeDevicesBlockSearchBounds covers the made-up nodes past the
// exact search: a Moon–Moser graph (3^(k/3) maximal cliques) exhausts
// the step bound, and more than 64 free GPUs take the greedy search.
func TestFreeDevicesBlockSearchBounds(t *testing.T) {
	// 48 GPUs in triangles {0,1,2}, {3,4,5}, ...: linked to every GPU
	// outside their own triangle. Every maximal block takes one GPU of
	// each triangle (16 GPUs), and there are 3^16 of them.
	n := linkedNode(48, func(a, b int) bool { return a/3 != b/3 })
	got := topology.FreeDevices(n, nil, nil)
	if got.NVLinkBlockExact {
		t.Errorf("Moon–Moser 48: NVLinkBlockExact = true, want the step bound to stop the search")
	}
	if len(got.NVLinkBlock) != 16 {
		t.Errorf("Moon–Moser 48: block of %d GPUs, want the 16 of the first maximal block found", len(got.NVLinkBlock))
	}
	checkBlock(t, n, got.NVLinkBlock, func(int) bool { return true })

	// 70 GPUs in two NVLink islands, 0-39 and 40-69.
	n = linkedNode(70, func(a, b int) bool { return (a < 40) == (b < 40) })
	got = topology.FreeDevices(n, nil, map[string]bool{"GPU-0": true})
	if got.NVLinkBlockExact {
		t.Errorf("70 GPUs: NVLinkBlockExact = true, want the greedy search (a lower bound)")
	}
	if want := 39; len(got.NVLinkBlock) != want || got.NVLinkBlock[0] != 1 {
		t.Errorf("70 GPUs, GPU 0 allocated: block %v, want GPUs 1..39", got.NVLinkBlock)
	}
	checkBlock(t, n, got.NVLinkBlock, func(i int) bool { return i != 0 })
	if got.GPUs != 69 || got.GPUsByNUMA[0] != 34 || got.GPUsByNUMA[1] != 35 {
		t.Errorf("70 GPUs, GPU 0 allocated: %d free, by NUMA %v; want 69, 0:34 1:35", got.GPUs, got.GPUsByNUMA)
	}
}

// TestFreeDevicesDoesNotModify checks FreeDevices leaves its inputs as
// they were.
func TestFreeDevicesDoesNotModify(t *testing.T) {
	n := dgxH100MIG(t)
	before, err := snapshotJSON(n)
	if err != nil {
		t.Fatal(err)
	}
	allocated := map[string]bool{n.GPUs[3].UUID + "::1": true, n.GPUs[4].UUID: false}
	topology.FreeDevices(n, func(string) bool { return true }, allocated)
	after, err := snapshotJSON(n)
	if err != nil {
		t.Fatal(err)
	}
	if before != after {
		t.Errorf("FreeDevices changed the node:\nbefore %s\nafter  %s", before, after)
	}
	if len(allocated) != 2 || !allocated[n.GPUs[3].UUID+"::1"] || allocated[n.GPUs[4].UUID] {
		t.Errorf("FreeDevices changed allocated: %v", allocated)
	}
}

func snapshotJSON(n *topology.Node) (string, error) {
	var b bytes.Buffer
	if err := topology.WriteSnapshot(&b, n); err != nil {
		return "", err
	}
	return b.String(), nil
}
