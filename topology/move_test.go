package topology_test

import (
	"bytes"
	"cmp"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"text/tabwriter"

	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// pod is a PodHold of namespace/name on devices.
func pod(key string, devices ...string) topology.PodHold {
	ns, name, _ := strings.Cut(key, "/")
	return topology.PodHold{Namespace: ns, Name: name, Devices: devices}
}

// uuids returns the UUIDs of GPUs idx of n.
func uuids(n *topology.Node, idx ...int) []string {
	var out []string
	for _, i := range idx {
		out = append(out, n.GPUs[i].UUID)
	}
	return out
}

// onePerGPU is one pod per GPU of idx, each holding that GPU whole, named
// prefix-<i>.
func onePerGPU(n *topology.Node, prefix string, idx ...int) []topology.PodHold {
	var out []topology.PodHold
	for _, i := range idx {
		out = append(out, pod(fmt.Sprintf("%s-%d", prefix, i), n.GPUs[i].UUID))
	}
	return out
}

func seq(from, to int) []int {
	var out []int
	for i := from; i <= to; i++ {
		out = append(out, i)
	}
	return out
}

// TestMoveFixtureCliques pins the premises of the cases below, computed
// from the fixtures' links rather than assumed: the DGX-1V's only blocks
// of four are its two quads and it has none of five; DGX H100 and DGX-2
// link every pair; the PCIe node links none.
func TestMoveFixtureCliques(t *testing.T) {
	cliques := func(n *topology.Node, size int) [][]int {
		var out [][]int
		for m := uint32(0); m < 1<<len(n.GPUs); m++ {
			if bits.OnesCount32(m) != size {
				continue
			}
			var set []int
			for b := m; b != 0; b &= b - 1 {
				set = append(set, bits.TrailingZeros32(b))
			}
			linked := true
			for k, a := range set {
				for _, b := range set[k+1:] {
					linked = linked && n.Link(a, b).NVLinks > 0
				}
			}
			if linked {
				out = append(out, set)
			}
		}
		slices.SortFunc(out, slices.Compare)
		return out
	}
	v := loadFreeFixture(t, "dgx-1v")
	if got, want := cliques(v, 4), [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}; !reflect.DeepEqual(got, want) {
		t.Errorf("dgx-1v blocks of 4: %v, want %v", got, want)
	}
	if got := cliques(v, 5); len(got) != 0 {
		t.Errorf("dgx-1v blocks of 5: %v, want none", got)
	}
	for _, f := range []struct {
		name                  string
		gpus, largest, blocks int
	}{
		{"dgx-h100", 8, 8, 1},  // every pair linked
		{"dgx-2", 16, 16, 1},   // every pair linked
		{"pcie-8gpu", 8, 1, 8}, // no pair linked
	} {
		n := loadFreeFixture(t, f.name)
		if len(n.GPUs) != f.gpus {
			t.Fatalf("%s: %d GPUs, want %d", f.name, len(n.GPUs), f.gpus)
		}
		if got := cliques(n, f.largest); len(got) != f.blocks {
			t.Errorf("%s: %d blocks of %d GPUs, want %d", f.name, len(got), f.largest, f.blocks)
		}
		if f.largest < f.gpus {
			if got := cliques(n, f.largest+1); len(got) != 0 {
				t.Errorf("%s: blocks of %d GPUs %v, want none", f.name, f.largest+1, got)
			}
		}
	}
}

type moveCase struct {
	name    string
	fixture string
	node    func(t *testing.T) *topology.Node // default: the fixture
	// unhealthy names the devices offered says false for.
	unhealthy func(n *topology.Node) []string
	holds     func(n *topology.Node) []topology.PodHold

	blockNow, blockIfMoved int
	block                  []int
	pods                   []string // namespace/name
	wholeNode              bool
}

var moveCases = []moveCase{
	{
		name: "1-GPU pods on 0 and 4", fixture: "dgx-h100",
		holds: func(n *topology.Node) []topology.PodHold {
			return []topology.PodHold{pod("ml/a", uuids(n, 0)...), pod("ml/b", uuids(n, 4)...)}
		},
		// Free 1-3, 5-7: 6; the ladder 1 2 4 8 says 8, the whole node.
		blockNow: 6, block: seq(0, 7), pods: []string{"ml/a", "ml/b"}, blockIfMoved: 8, wholeNode: true,
	},
	{
		name: "a 2-GPU pod and three 1-GPU pods: fewer GPUs held beats lower indices", fixture: "dgx-h100",
		holds: func(n *topology.Node) []topology.PodHold {
			return []topology.PodHold{
				pod("train/pair", uuids(n, 0, 1)...),
				pod("web/z", uuids(n, 2)...), pod("web/a", uuids(n, 5)...), pod("web/b", uuids(n, 7)...),
			}
		},
		// Free 3 4 6 → target 4. One pod always does: train/pair gives
		// {0,1,3,4} (2 GPUs held), web/z {2,3,4,6} (1 GPU, lowest of
		// the 1-GPU ones; names play no part).
		blockNow: 3, block: []int{2, 3, 4, 6}, pods: []string{"web/z"}, blockIfMoved: 4,
	},
	{
		name: "wholly free (an RDMA-only pod)", fixture: "dgx-h100",
		holds: func(*topology.Node) []topology.PodHold {
			return []topology.PodHold{pod("net/rdma", "mlx5_0")}
		},
		blockNow: 8, blockIfMoved: 8, wholeNode: true,
	},
	{
		name: "wholly full, eight 1-GPU pods: tie → lowest index", fixture: "dgx-h100",
		holds: func(n *topology.Node) []topology.PodHold {
			var hs []topology.PodHold
			for i := range 8 {
				// Names in the reverse order of the GPUs.
				hs = append(hs, pod(fmt.Sprintf("batch/job-%d", 7-i), n.GPUs[i].UUID))
			}
			return hs
		},
		blockNow: 0, block: []int{0}, pods: []string{"batch/job-7"}, blockIfMoved: 1,
	},
	{
		name: "full, GPU 0 shared by two replicas: one pod beats lower index", fixture: "dgx-h100",
		holds: func(n *topology.Node) []topology.PodHold {
			hs := []topology.PodHold{pod("ts/a", n.GPUs[0].UUID+"::0"), pod("ts/b", n.GPUs[0].UUID+"::1")}
			return append(hs, onePerGPU(n, "app/p", seq(1, 7)...)...)
		},
		blockNow: 0, block: []int{1}, pods: []string{"app/p-1"}, blockIfMoved: 1,
	},
	{
		name: "GPU 0 shared by two replicas, rest free: both move", fixture: "dgx-h100",
		holds: func(n *topology.Node) []topology.PodHold {
			return []topology.PodHold{pod("ts/b", n.GPUs[0].UUID+"::1"), pod("ts/a", n.GPUs[0].UUID+"::0")}
		},
		blockNow: 7, block: seq(0, 7), pods: []string{"ts/a", "ts/b"}, blockIfMoved: 8, wholeNode: true,
	},
	{
		name: "a pod with an RDMA port and GPU 3; one with RDMA and unknown IDs only", fixture: "dgx-h100",
		holds: func(n *topology.Node) []topology.PodHold {
			return []topology.PodHold{
				pod("net/x", "mlx5_0", n.GPUs[3].UUID),
				pod("net/y", "mlx5_1", "GPU-not-on-this-node", "MIG-not-on-this-node::2"),
			}
		},
		blockNow: 7, block: seq(0, 7), pods: []string{"net/x"}, blockIfMoved: 8, wholeNode: true,
	},
	{
		name: "one pod listed twice (GPUs 0 and 1), rest free", fixture: "dgx-h100",
		holds: func(n *topology.Node) []topology.PodHold {
			return []topology.PodHold{pod("ml/p", uuids(n, 1)...), pod("ml/p", uuids(n, 0)...)}
		},
		blockNow: 6, block: seq(0, 7), pods: []string{"ml/p"}, blockIfMoved: 8, wholeNode: true,
	},
	{
		name: "full, one pod listed twice holds 0 and 1: it counts as 2 GPUs", fixture: "dgx-h100",
		holds: func(n *topology.Node) []topology.PodHold {
			hs := []topology.PodHold{pod("ml/p", uuids(n, 0)...), pod("ml/p", uuids(n, 1)...)}
			return append(hs, onePerGPU(n, "app/q", seq(2, 7)...)...)
		},
		blockNow: 0, block: []int{2}, pods: []string{"app/q-2"}, blockIfMoved: 1,
	},
	{
		name: "7 unhealthy (held), 6 lost (held): E=6, ladder 1 2 4 6", fixture: "dgx-h100",
		node: func(t *testing.T) *topology.Node {
			n := loadFreeFixture(t, "dgx-h100")
			n.GPUs[6].Lost = true
			return n
		},
		unhealthy: func(n *topology.Node) []string { return uuids(n, 7) },
		holds: func(n *topology.Node) []topology.PodHold {
			return append(onePerGPU(n, "app/p", 0, 1), pod("app/on-lost", uuids(n, 6)...), pod("app/on-sick", uuids(n, 7)...))
		},
		// Free 2-5: 4. The pods on 6 and 7 free nothing a pod can use.
		blockNow: 4, block: seq(0, 5), pods: []string{"app/p-0", "app/p-1"}, blockIfMoved: 6, wholeNode: true,
	},
	{
		name: "MIG on 0 and 1, pods on MIG devices: E=6, never moved", fixture: "dgx-h100+mig",
		node: dgxH100MIG,
		holds: func(n *topology.Node) []topology.PodHold {
			return []topology.PodHold{
				pod("infer/m0", migUUIDs(n, 0, "3g.40gb")...),
				pod("infer/m1", migUUIDs(n, 1, "1g.10gb")[0]+"::0"),
				pod("train/a", uuids(n, 2)...), pod("train/b", uuids(n, 5)...),
			}
		},
		blockNow: 4, block: seq(2, 7), pods: []string{"train/a", "train/b"}, blockIfMoved: 6, wholeNode: true,
	},
	{
		name: "MIG, full: a pod on a MIG device and GPU 2 holds 2 GPUs", fixture: "dgx-h100+mig",
		node: dgxH100MIG,
		holds: func(n *topology.Node) []topology.PodHold {
			hs := []topology.PodHold{pod("a/mixed", migUUIDs(n, 0, "2g.20gb")[0], n.GPUs[2].UUID)}
			return append(hs, onePerGPU(n, "b/p", seq(3, 7)...)...)
		},
		blockNow: 0, block: []int{3}, pods: []string{"b/p-3"}, blockIfMoved: 1,
	},
	{
		name: "no quad free; Q1's pod holds fewer GPUs", fixture: "dgx-1v",
		holds: func(n *topology.Node) []topology.PodHold {
			return []topology.PodHold{pod("x/a", uuids(n, 0, 1)...), pod("x/b", uuids(n, 5)...)}
		},
		// Free 2 3 4 6 7: {4,6,7} → 3, target 4. Q0 needs x/a (2
		// GPUs), Q1 x/b (1 GPU).
		blockNow: 3, block: seq(4, 7), pods: []string{"x/b"}, blockIfMoved: 4,
	},
	{
		name: "no quad free; one 3-GPU pod beats two 1-GPU pods", fixture: "dgx-1v",
		holds: func(n *topology.Node) []topology.PodHold {
			return []topology.PodHold{pod("x/c", uuids(n, 0)...), pod("x/d", uuids(n, 1)...), pod("x/e", uuids(n, 4, 5, 6)...)}
		},
		// Free 2 3 7: 2-3 and 3-7 linked, 2-7 not → 2, target 4.
		blockNow: 2, block: seq(4, 7), pods: []string{"x/e"}, blockIfMoved: 4,
	},
	{
		name: "Q0 free, the next step is the whole node (not a block)", fixture: "dgx-1v",
		holds: func(n *topology.Node) []topology.PodHold { return onePerGPU(n, "y/p", 4, 6) },
		// Every GPU free, the largest block is still a quad.
		blockNow: 4, block: seq(0, 7), pods: []string{"y/p-4", "y/p-6"}, blockIfMoved: 4, wholeNode: true,
	},
	{
		name: "free 3 and 4 are not linked: target 2", fixture: "dgx-1v",
		holds: func(n *topology.Node) []topology.PodHold { return onePerGPU(n, "z/p", 0, 1, 2, 5, 6, 7) },
		// {0,3} and {0,4} both need one pod; {0,3} comes first.
		blockNow: 1, block: []int{0, 3}, pods: []string{"z/p-0"}, blockIfMoved: 2,
	},
	{
		name: "wholly free", fixture: "dgx-1v",
		blockNow: 4, blockIfMoved: 4, wholeNode: true,
	},
	{
		name: "scattered 1-GPU pods on 0 3 8 9 15: target 16", fixture: "dgx-2",
		holds:    func(n *topology.Node) []topology.PodHold { return onePerGPU(n, "s/p", 0, 3, 8, 9, 15) },
		blockNow: 11, block: seq(0, 15), pods: []string{"s/p-0", "s/p-15", "s/p-3", "s/p-8", "s/p-9"},
		blockIfMoved: 16, wholeNode: true,
	},
	{
		name: "even GPUs 1-GPU pods, a 2-GPU pod on 1 3: target 8", fixture: "dgx-2",
		holds: func(n *topology.Node) []topology.PodHold {
			return append(onePerGPU(n, "s/p", 0, 2, 4, 6, 8, 10, 12, 14), pod("s/pair", uuids(n, 1, 3)...))
		},
		// Free 5 7 9 11 13 15: 6. Two more GPUs: the pair's one pod, or
		// two 1-GPU pods.
		blockNow: 6, block: []int{1, 3, 5, 7, 9, 11, 13, 15}, pods: []string{"s/pair"}, blockIfMoved: 8,
	},
	{
		name: "13 1-GPU pods, 13-15 free: target 4", fixture: "dgx-2",
		holds:    func(n *topology.Node) []topology.PodHold { return onePerGPU(n, "s/p", seq(0, 12)...) },
		blockNow: 3, block: []int{0, 13, 14, 15}, pods: []string{"s/p-0"}, blockIfMoved: 4,
	},
	{
		name: "7 1-GPU pods, GPU 7 free: no block of 2, target the whole node", fixture: "pcie-8gpu",
		holds:    func(n *topology.Node) []topology.PodHold { return onePerGPU(n, "p/p", seq(0, 6)...) },
		blockNow: 1, block: seq(0, 7), pods: []string{"p/p-0", "p/p-1", "p/p-2", "p/p-3", "p/p-4", "p/p-5", "p/p-6"},
		blockIfMoved: 1, wholeNode: true,
	},
	{
		name: "wholly full: target 1", fixture: "pcie-8gpu",
		holds:    func(n *topology.Node) []topology.PodHold { return onePerGPU(n, "p/p", seq(0, 7)...) },
		blockNow: 0, block: []int{0}, pods: []string{"p/p-0"}, blockIfMoved: 1,
	},
	{
		name: "every GPU lost: E=0", fixture: "dgx-h100",
		node: func(t *testing.T) *topology.Node {
			n := loadFreeFixture(t, "dgx-h100")
			for i := range n.GPUs {
				n.GPUs[i].Lost = true
			}
			return n
		},
		holds: func(n *topology.Node) []topology.PodHold { return onePerGPU(n, "p/p", 0) },
	},
	{
		name: "nil node", fixture: "-",
		node: func(*testing.T) *topology.Node { return nil },
		holds: func(*topology.Node) []topology.PodHold {
			return []topology.PodHold{pod("p/p", "GPU-x")}
		},
	},
}

// TestMoveAdviceTable checks AdviseMoves on the fixtures and logs the
// cases as a table (go test -run TestMoveAdviceTable -v).
func TestMoveAdviceTable(t *testing.T) {
	var table bytes.Buffer
	tw := tabwriter.NewWriter(&table, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "fixture\tcase\tBlockNow\tTarget\tpods suggested\tBlockIfMoved\tWholeNode")
	for _, tc := range moveCases {
		t.Run(tc.fixture+"/"+tc.name, func(t *testing.T) {
			var n *topology.Node
			if tc.node != nil {
				n = tc.node(t)
			} else {
				n = loadFreeFixture(t, tc.fixture)
			}
			unhealthy := map[string]bool{}
			if tc.unhealthy != nil {
				for _, id := range tc.unhealthy(n) {
					unhealthy[id] = true
				}
			}
			var holds []topology.PodHold
			if tc.holds != nil {
				holds = tc.holds(n)
			}
			offered := func(id string) bool { return !unhealthy[id] }
			got := topology.AdviseMoves(n, offered, holds)

			var names []string
			for _, p := range got.Pods {
				names = append(names, p.Namespace+"/"+p.Name)
			}
			if got.BlockNow != tc.blockNow {
				t.Errorf("BlockNow = %d, want %d", got.BlockNow, tc.blockNow)
			}
			if !slices.Equal(got.Block, tc.block) || (got.Block == nil) != (tc.block == nil) {
				t.Errorf("Block = %v, want %v", got.Block, tc.block)
			}
			if !slices.Equal(names, tc.pods) || (got.Pods == nil) != (tc.pods == nil) {
				t.Errorf("Pods = %v, want %v", names, tc.pods)
			}
			if got.BlockIfMoved != tc.blockIfMoved {
				t.Errorf("BlockIfMoved = %d, want %d", got.BlockIfMoved, tc.blockIfMoved)
			}
			if got.WholeNode != tc.wholeNode {
				t.Errorf("WholeNode = %v, want %v", got.WholeNode, tc.wholeNode)
			}
			checkPodsCopied(t, holds, got.Pods)

			target, pods := "-", "none"
			if got.Block != nil {
				target = fmt.Sprint(len(got.Block))
				pods = strings.Join(names, " ")
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%d\t%v\n", tc.fixture, tc.name, got.BlockNow, target, pods, got.BlockIfMoved, got.WholeNode)
		})
	}
	tw.Flush()
	t.Logf("\n%s", table.String())
}

// checkPodsCopied asserts each advised pod carries the devices it was
// listed with (merged, sorted and each once when listed several times),
// in a slice of its own.
func checkPodsCopied(t *testing.T, holds, advised []topology.PodHold) {
	t.Helper()
	for _, p := range advised {
		var listed []topology.PodHold
		for _, h := range holds {
			if h.Namespace == p.Namespace && h.Name == p.Name {
				listed = append(listed, h)
			}
		}
		var want []string
		switch len(listed) {
		case 0:
			t.Errorf("advised pod %s/%s is not among the holds", p.Namespace, p.Name)
			continue
		case 1:
			want = listed[0].Devices
			if len(want) > 0 && &want[0] == &p.Devices[0] {
				t.Errorf("advised pod %s/%s shares its Devices slice with the hold", p.Namespace, p.Name)
			}
		default:
			for _, h := range listed {
				want = append(want, h.Devices...)
			}
			slices.Sort(want)
			want = slices.Compact(want)
		}
		if !slices.Equal(p.Devices, want) {
			t.Errorf("advised pod %s/%s devices %v, want %v", p.Namespace, p.Name, p.Devices, want)
		}
	}
}

// TestAdviseMovesDoesNotModify checks AdviseMoves leaves the node and
// the holds as they were.
func TestAdviseMovesDoesNotModify(t *testing.T) {
	n := dgxH100MIG(t)
	before, err := snapshotJSON(n)
	if err != nil {
		t.Fatal(err)
	}
	holds := []topology.PodHold{
		pod("a/p", n.GPUs[5].UUID, n.GPUs[3].UUID),
		pod("a/p", n.GPUs[2].UUID),
		pod("a/q", migUUIDs(n, 0, "3g.40gb")[0]),
	}
	want := []topology.PodHold{
		pod("a/p", n.GPUs[5].UUID, n.GPUs[3].UUID),
		pod("a/p", n.GPUs[2].UUID),
		pod("a/q", migUUIDs(n, 0, "3g.40gb")[0]),
	}
	got := topology.AdviseMoves(n, nil, holds)
	if len(got.Pods) != 1 || len(got.Pods[0].Devices) != 3 {
		t.Fatalf("advice %+v, want pod a/p with its three GPUs", got)
	}
	got.Pods[0].Devices[0] = "changed"
	after, err := snapshotJSON(n)
	if err != nil {
		t.Fatal(err)
	}
	if before != after {
		t.Errorf("AdviseMoves changed the node")
	}
	if !reflect.DeepEqual(holds, want) {
		t.Errorf("AdviseMoves changed the holds (or shares them with its advice): %v", holds)
	}
}

// TestAdviseMovesMadeUpNodes covers nodes past every real one: a node
// whose search meets the step bound still gets valid advice, and one of
// more than 64 eligible GPUs gets none.
func TestAdviseMovesMadeUpNodes(t *testing.T) {
	// 64 GPUs, all linked; 20 free (44-63), 0-43 one pod each: target
	// 32 needs any 12 of the 44 pods, and C(44,12) blocks tie at 12.
	n := linkedNode(64, func(int, int) bool { return true })
	holds := onePerGPU(n, "p/p", seq(0, 43)...)
	got := topology.AdviseMoves(n, nil, holds)
	if got.BlockNow != 20 || len(got.Block) != 32 || len(got.Pods) != 12 || got.BlockIfMoved != 32 || got.WholeNode {
		t.Errorf("64 linked GPUs, 20 free: advice %+v, want 12 pods freeing a block of 32", got)
	}
	checkAdviceFrees(t, n, holds, got)

	// The same 64 GPUs in eight islands of eight; each island but the
	// last holds one 1-GPU pod per GPU but one.
	n = linkedNode(64, func(a, b int) bool { return a/8 == b/8 })
	holds = nil
	for i := range 56 {
		if i%8 != 7 {
			holds = append(holds, pod(fmt.Sprintf("p/p-%02d", i), n.GPUs[i].UUID))
		}
	}
	got = topology.AdviseMoves(n, nil, holds)
	if got.BlockNow != 8 || len(got.Block) != 64 || len(got.Pods) != 49 || got.BlockIfMoved != 8 || !got.WholeNode {
		t.Errorf("eight islands of eight: BlockNow %d, Block %v, %d pods, BlockIfMoved %d, WholeNode %v; want 8, all 64, 49, 8, true",
			got.BlockNow, got.Block, len(got.Pods), got.BlockIfMoved, got.WholeNode)
	}

	n = linkedNode(65, func(int, int) bool { return true })
	got = topology.AdviseMoves(n, nil, onePerGPU(n, "p/p", 0))
	if got.BlockNow != 64 || got.Pods != nil || got.Block != nil || got.BlockIfMoved != 64 || got.WholeNode {
		t.Errorf("65 GPUs: advice %+v, want none (BlockNow 64)", got)
	}
}

// checkAdviceFrees asserts that once adv.Pods left, every GPU of
// adv.Block is free and the block is pairwise NVLink-connected.
func checkAdviceFrees(t *testing.T, n *topology.Node, holds []topology.PodHold, adv topology.MoveAdvice) {
	t.Helper()
	moved := map[string]bool{}
	for _, p := range adv.Pods {
		moved[p.Namespace+"/"+p.Name] = true
	}
	held := map[string]bool{}
	for _, h := range holds {
		if !moved[h.Namespace+"/"+h.Name] {
			for _, id := range h.Devices {
				base, _, _ := strings.Cut(id, "::")
				held[base] = true
			}
		}
	}
	checkBlock(t, n, adv.Block, func(i int) bool { return !held[n.GPUs[i].UUID] })
}

// moveWorld is a fixture with what the property test computes from it
// once: the NVLink neighbours of each GPU (by position) and, for every
// set of GPUs, the size of its largest NVLink block.
type moveWorld struct {
	name  string
	node  *topology.Node
	adj   []uint32
	omega []uint8 // set (bit mask of positions) → largest block in it
}

func newMoveWorld(t *testing.T, name string, n *topology.Node) *moveWorld {
	w := &moveWorld{name: name, node: n, adj: make([]uint32, len(n.GPUs))}
	for a := range n.GPUs {
		if n.GPUs[a].Index != a {
			t.Fatalf("%s: GPU at %d has index %d", name, a, n.GPUs[a].Index)
		}
		for b := range n.GPUs {
			if a != b && n.Link(a, b).NVLinks > 0 {
				w.adj[a] |= 1 << b
			}
		}
	}
	// ω(m) = max(ω(m−v), 1+ω(m∩N(v))) for v the lowest GPU of m; both
	// sets are below m.
	w.omega = make([]uint8, 1<<len(n.GPUs))
	for m := uint32(1); m < uint32(len(w.omega)); m++ {
		v := bits.TrailingZeros32(m)
		w.omega[m] = max(w.omega[m&^(1<<v)], 1+w.omega[m&w.adj[v]])
	}
	return w
}

func (w *moveWorld) clique(m uint32) bool { return int(w.omega[m]) == bits.OnesCount32(m) }

// randomHolds lays out up to ten pods on n at random: whole GPUs,
// replicas, MIG devices, other resources, pods listed twice.
func randomHolds(r *rand.Rand, n *topology.Node) []topology.PodHold {
	var migs []string
	for _, g := range n.GPUs {
		for _, m := range g.MIG {
			migs = append(migs, m.UUID)
		}
	}
	var holds []topology.PodHold
	for p := range r.IntN(11) {
		h := pod(fmt.Sprintf("ns-%d/pod-%d", r.IntN(2), p))
		k := []int{1, 1, 1, 2, 2, 4, 8}[r.IntN(7)]
		for _, i := range r.Perm(len(n.GPUs))[:min(k, len(n.GPUs))] {
			id := n.GPUs[i].UUID
			if r.IntN(4) == 0 {
				id += fmt.Sprintf("::%d", r.IntN(3))
			}
			h.Devices = append(h.Devices, id)
		}
		if len(migs) > 0 && r.IntN(3) == 0 {
			h.Devices = append(h.Devices, migs[r.IntN(len(migs))])
		}
		if r.IntN(5) == 0 {
			h.Devices = append(h.Devices, []string{"mlx5_0", "GPU-not-on-this-node"}[r.IntN(2)])
		}
		if len(h.Devices) > 1 && r.IntN(8) == 0 {
			cut := 1 + r.IntN(len(h.Devices)-1)
			holds = append(holds, topology.PodHold{Namespace: h.Namespace, Name: h.Name, Devices: h.Devices[cut:]})
			h.Devices = h.Devices[:cut]
		}
		holds = append(holds, h)
	}
	return holds
}

// TestAdviseMovesProperties checks AdviseMoves on random layouts of the
// fixtures against a brute force over every set of GPUs and every set of
// pods: the block the advice names is usable, of the target size, and
// freed by moving its pods; no set of fewer pods frees a usable block of
// that size; and the block is the cheapest by the documented order.
func TestAdviseMovesProperties(t *testing.T) {
	worlds := []*moveWorld{
		newMoveWorld(t, "dgx-h100", loadFreeFixture(t, "dgx-h100")),
		newMoveWorld(t, "dgx-h100+mig", dgxH100MIG(t)),
		newMoveWorld(t, "dgx-1v", loadFreeFixture(t, "dgx-1v")),
		newMoveWorld(t, "dgx-2", loadFreeFixture(t, "dgx-2")),
		newMoveWorld(t, "pcie-8gpu", loadFreeFixture(t, "pcie-8gpu")),
	}
	// kinds counts the layouts with advice by world, a block short of
	// the whole node (false) or the whole node (true).
	kinds := map[string]map[bool]int{}
	for _, w := range worlds {
		kinds[w.name] = map[bool]int{}
	}
	for _, w := range worlds {
		for seed := range uint64(500) {
			r := rand.New(rand.NewPCG(seed, 77))
			n := *w.node
			n.GPUs = slices.Clone(w.node.GPUs)
			unhealthy := map[string]bool{}
			for i := range n.GPUs {
				switch r.IntN(16) {
				case 0:
					n.GPUs[i].Lost = true
				case 1:
					unhealthy[n.GPUs[i].UUID] = true
				}
			}
			holds := randomHolds(r, &n)
			offered := func(id string) bool { return !unhealthy[id] }
			got := topology.AdviseMoves(&n, offered, holds)
			if checkMoveProperties(t, w, &n, unhealthy, holds, got) {
				kinds[w.name][len(got.Block) == len(eligibleOf(&n, unhealthy))]++
			}
			if t.Failed() {
				t.Fatalf("%s seed %d: holds %v\nadvice %+v", w.name, seed, holds, got)
			}
			shuffled := slices.Clone(holds)
			r.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
			if again := topology.AdviseMoves(&n, offered, shuffled); !reflect.DeepEqual(again, got) {
				t.Fatalf("%s seed %d: holds in another order gave %+v, want %+v", w.name, seed, again, got)
			}
		}
	}
	// The layouts must exercise the search for a block and the whole
	// node alike, not only the no-advice path.
	for _, w := range worlds {
		t.Logf("%s: advice in %d layouts, %d freeing a block short of the whole node", w.name, kinds[w.name][false]+kinds[w.name][true], kinds[w.name][false])
		if kinds[w.name][false] < 25 || kinds[w.name][true] < 25 {
			t.Errorf("%s: advice to free a block in %d layouts, the whole node in %d; want 25 of each at least", w.name, kinds[w.name][false], kinds[w.name][true])
		}
	}
}

// eligibleOf returns the GPUs of n that could serve a whole-GPU pod.
func eligibleOf(n *topology.Node, unhealthy map[string]bool) []int {
	var out []int
	for i, g := range n.GPUs {
		if !g.Lost && !g.MIGEnabled && !unhealthy[g.UUID] {
			out = append(out, i)
		}
	}
	return out
}

// brutePod is one pod as the brute force sees it, merged over its holds.
type brutePod struct {
	key      string
	eligible uint32 // eligible GPUs it holds (UUID or replica)
	gpus     uint32 // every GPU it holds, MIG devices as their GPU
}

// checkMoveProperties checks one advice; it reports whether there was
// advice.
func checkMoveProperties(t *testing.T, w *moveWorld, n *topology.Node, unhealthy map[string]bool, holds []topology.PodHold, got topology.MoveAdvice) bool {
	t.Helper()
	var eligible uint32
	for i, g := range n.GPUs {
		if !g.Lost && !g.MIGEnabled && !unhealthy[g.UUID] {
			eligible |= 1 << i
		}
	}
	byKey := map[string]*brutePod{}
	for _, h := range holds {
		k := h.Namespace + "/" + h.Name
		if byKey[k] == nil {
			byKey[k] = &brutePod{key: k}
		}
		for _, id := range h.Devices {
			base, _, _ := strings.Cut(id, "::")
			for i, g := range n.GPUs {
				if g.UUID == base {
					byKey[k].gpus |= 1 << i
					byKey[k].eligible |= eligible & (1 << i)
				}
				for _, m := range g.MIG {
					if m.UUID == base {
						byKey[k].gpus |= 1 << i
					}
				}
			}
		}
	}
	var pods []brutePod // those holding an eligible GPU
	var held uint32
	for _, p := range byKey {
		if p.eligible != 0 {
			pods = append(pods, *p)
			held |= p.eligible
		}
	}
	slices.SortFunc(pods, func(a, b brutePod) int { return cmp.Compare(a.key, b.key) })
	e := bits.OnesCount32(eligible)
	blockNow := int(w.omega[eligible&^held])
	if got.BlockNow != blockNow {
		t.Errorf("BlockNow = %d, want %d", got.BlockNow, blockNow)
	}
	if e == 0 || held == 0 {
		if got.Pods != nil || got.Block != nil || got.BlockIfMoved != blockNow || got.WholeNode != (e > 0) {
			t.Errorf("wholly free (E=%d): advice %+v, want none", e, got)
		}
		return false
	}
	target := 1
	for target <= blockNow {
		target *= 2
	}
	if target >= e || target > int(w.omega[eligible]) {
		target = e
	}
	usable := func(m uint32) bool {
		return m&^eligible == 0 && bits.OnesCount32(m) == target && (m == eligible || w.clique(m))
	}
	// The cheapest usable block by (pods, GPUs they hold, indices).
	type cost struct {
		pods, gpus int
		block      []int
	}
	var best *cost
	var bestMask uint32
	for m := eligible; ; m = (m - 1) & eligible {
		if usable(m) {
			c := cost{}
			var gpus uint32
			for _, p := range pods {
				if p.eligible&m != 0 {
					c.pods++
					gpus |= p.gpus
				}
			}
			c.gpus = bits.OnesCount32(gpus)
			for b := m; b != 0; b &= b - 1 {
				c.block = append(c.block, bits.TrailingZeros32(b))
			}
			if best == nil || cmp.Or(cmp.Compare(c.pods, best.pods), cmp.Compare(c.gpus, best.gpus), slices.Compare(c.block, best.block)) < 0 {
				best, bestMask = &c, m
			}
		}
		if m == 0 {
			break
		}
	}
	if best == nil {
		t.Fatalf("no usable block of %d GPUs among eligible %b", target, eligible)
	}
	var wantPods []string
	var kept uint32 // eligible GPUs still held once the wanted pods left
	for _, p := range pods {
		if p.eligible&bestMask != 0 {
			wantPods = append(wantPods, p.key)
		} else {
			kept |= p.eligible
		}
	}
	var gotPods []string
	for _, p := range got.Pods {
		gotPods = append(gotPods, p.Namespace+"/"+p.Name)
	}
	if !slices.Equal(gotPods, wantPods) || !slices.Equal(got.Block, best.block) {
		t.Errorf("target %d: advice moves %v to free %v, want %v to free %v", target, gotPods, got.Block, wantPods, best.block)
	}
	freeAfter := eligible &^ kept
	if got.BlockIfMoved != int(w.omega[freeAfter]) || got.WholeNode != (freeAfter == eligible) {
		t.Errorf("BlockIfMoved %d WholeNode %v, want %d %v", got.BlockIfMoved, got.WholeNode, w.omega[freeAfter], freeAfter == eligible)
	}

	// What the advice says is true: its block is usable and free once
	// its pods left, and the block after is at least the target (or the
	// whole node, which is not one block).
	var block uint32
	for _, i := range got.Block {
		block |= 1 << i
	}
	stillHeld := uint32(0)
	for _, p := range pods {
		if !slices.Contains(gotPods, p.key) {
			stillHeld |= p.eligible
		}
	}
	if !usable(block) || block&stillHeld != 0 {
		t.Errorf("block %v is not a usable free block of %d GPUs once %v moved", got.Block, target, gotPods)
	}
	if got.BlockIfMoved < target && !(target == e && got.WholeNode) {
		t.Errorf("BlockIfMoved %d below the target %d", got.BlockIfMoved, target)
	}
	// No fewer pods free a usable block of the target size.
	for s := uint32(0); s < 1<<len(pods); s++ {
		if bits.OnesCount32(s) >= len(got.Pods) {
			continue
		}
		var left uint32
		for i, p := range pods {
			if s&(1<<i) == 0 {
				left |= p.eligible
			}
		}
		free := eligible &^ left
		if (target == e && free == eligible) || (target < e && int(w.omega[free]) >= target) {
			t.Errorf("moving %d pods (set %b) frees a usable block of %d; the advice moves %d", bits.OnesCount32(s), s, target, len(got.Pods))
			break
		}
	}
	return true
}
