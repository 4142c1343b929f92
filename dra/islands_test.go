package dra

import (
	"slices"
	"testing"

	"github.com/gpu-node-agent/gpu-node-agent/sim"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// linksNode is a node of count GPUs with NVLink bundles {a, b, links}.
func linksNode(count int, links ...[3]int) *topology.Node {
	n := &topology.Node{}
	for i := range count {
		n.GPUs = append(n.GPUs, topology.GPU{Index: i, NUMANode: -1})
	}
	for _, l := range links {
		n.Links = append(n.Links, topology.Link{A: l[0], B: l[1], NVLinks: l[2]})
	}
	return n
}

func TestNVLinkGroups(t *testing.T) {
	profile := func(name string) *topology.Node {
		n, err := sim.Profile(name)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	all := func(v, count int) []int { return slices.Repeat([]int{v}, count) }
	for _, tc := range []struct {
		name           string
		node           *topology.Node
		domain, island []int
	}{
		{"dgx-h100: one NVSwitch fabric", profile("dgx-h100"), all(0, 8), all(0, 8)},
		{"dgx-a100: one NVSwitch fabric", profile("dgx-a100"), all(0, 8), all(0, 8)},
		{"dgx-2: sixteen GPUs on NVSwitches", profile("dgx-2"), all(0, 16), all(0, 16)},
		{
			"dgx-1v: cube-mesh is one domain, two fully linked quads",
			profile("dgx-1v"), all(0, 8), []int{0, 0, 0, 0, 4, 4, 4, 4},
		},
		{"pcie-8gpu: no NVLink", profile("pcie-8gpu"), all(-1, 8), all(-1, 8)},
		{"two bridged pairs", linksNode(4, [3]int{0, 1, 4}, [3]int{2, 3, 4}), []int{0, 0, 2, 2}, []int{0, 0, 2, 2}},
		{"chain", linksNode(3, [3]int{0, 1, 2}, [3]int{1, 2, 2}), []int{0, 0, 0}, []int{0, 0, 2}},
		{"one GPU without NVLink", linksNode(3, [3]int{0, 2, 1}), []int{0, -1, 0}, []int{0, -1, 0}},
		{"link entries without NVLink", linksNode(2, [3]int{0, 1, 0}), []int{-1, -1}, []int{-1, -1}},
		{"a link to a GPU the model lacks", linksNode(2, [3]int{0, 5, 2}), []int{-1, -1}, []int{-1, -1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			domain, island := nvlinkGroups(tc.node)
			if !slices.Equal(domain, tc.domain) {
				t.Errorf("domains %v, want %v", domain, tc.domain)
			}
			if !slices.Equal(island, tc.island) {
				t.Errorf("islands %v, want %v", island, tc.island)
			}
			checkIslands(t, tc.node, domain, island)
		})
	}
}

// checkIslands checks what the attributes promise: every pair in an island
// is linked, an island lies within one domain, and its name is a member.
func checkIslands(t *testing.T, n *topology.Node, domain, island []int) {
	t.Helper()
	linked := map[[2]int]bool{}
	for _, l := range n.Links {
		if l.NVLinks > 0 {
			linked[[2]int{l.A, l.B}], linked[[2]int{l.B, l.A}] = true, true
		}
	}
	for a := range island {
		if island[a] < 0 {
			continue
		}
		if island[island[a]] != island[a] {
			t.Errorf("gpu %d: island %d is not named by a member", a, island[a])
		}
		for b := a + 1; b < len(island); b++ {
			if island[a] == island[b] {
				if !linked[[2]int{a, b}] {
					t.Errorf("gpus %d and %d share island %d without a link", a, b, island[a])
				}
				if domain[a] != domain[b] {
					t.Errorf("gpus %d and %d share island %d but not a domain", a, b, island[a])
				}
			}
		}
	}
}

// TestNVLinkAttributes: the attributes name the groups by device name and
// a GPU without NVLink has none.
func TestNVLinkAttributes(t *testing.T) {
	n := linksNode(3, [3]int{1, 2, 4})
	res, err := Build(n, Options{})
	if err != nil {
		t.Fatal(err)
	}
	devs := byName(res.Devices)
	if _, ok := devs["gpu-0"].Attributes[AttrNVLinkIsland]; ok {
		t.Error("gpu-0 has no NVLink but an island attribute")
	}
	for _, g := range []string{"gpu-1", "gpu-2"} {
		if got := str(devs[g], AttrNVLinkIsland); got != "gpu-1" {
			t.Errorf("%s: island %q, want gpu-1", g, got)
		}
		if got := str(devs[g], AttrNVLinkDomain); got != "gpu-1" {
			t.Errorf("%s: domain %q, want gpu-1", g, got)
		}
	}
}
