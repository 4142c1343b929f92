package rdma

import (
	"context"
	"fmt"
	"math"
	"slices"

	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// maxCombinations bounds the exhaustive search; beyond it the choice is
// greedy. C(16,8) = 12870 covers a DGX's compute rails.
const maxCombinations = 20000

// PreferredAllocation implements plugin.PreferredAllocator. It picks size
// ports from available (keeping mustInclude) that are, in order:
//  1. close to the GPUs the same container was just given: every such GPU
//     gets a nearby NIC (one rail per GPU beats two NICs next to one GPU),
//     then every chosen NIC is near some GPU;
//  2. close to each other (sum of pairwise PCIe levels);
//  3. first by ID, so the answer is deterministic.
func (r *exclusiveResource) PreferredAllocation(_ context.Context, available, mustInclude []string, size int) ([]string, error) {
	if size > len(available) {
		return nil, fmt.Errorf("preferred allocation for %s: want %d devices, %d available", r.name, size, len(available))
	}
	if len(mustInclude) > size {
		return nil, fmt.Errorf("preferred allocation for %s: %d must-include devices exceed size %d", r.name, len(mustInclude), size)
	}
	for _, id := range slices.Concat(available, mustInclude) {
		if _, ok := r.byID[id]; !ok {
			return nil, fmt.Errorf("preferred allocation for %s: unknown device %q", r.name, id)
		}
	}
	gpus := r.recentGPUs()
	chosen := append([]string(nil), mustInclude...)
	var pool []string
	for _, id := range available {
		if !slices.Contains(chosen, id) && !slices.Contains(pool, id) {
			pool = append(pool, id)
		}
	}
	slices.Sort(pool)
	need := size - len(chosen)
	if need <= 0 {
		return chosen, nil
	}
	if binomial(len(pool), need) <= maxCombinations {
		best, bestCost := []string(nil), math.Inf(1)
		combine(pool, need, func(pick []string) {
			set := append(append([]string(nil), chosen...), pick...)
			if c := r.cost(set, gpus); c < bestCost {
				best, bestCost = set, c
			}
		})
		return best, nil
	}
	// Greedy: add the port that lowers the cost most, one at a time.
	for range need {
		bestIdx, bestCost := -1, math.Inf(1)
		for i, id := range pool {
			if c := r.cost(append(chosen[:len(chosen):len(chosen)], id), gpus); c < bestCost {
				bestIdx, bestCost = i, c
			}
		}
		chosen = append(chosen, pool[bestIdx])
		pool = slices.Delete(pool, bestIdx, bestIdx+1)
	}
	return chosen, nil
}

// recentGPUs resolves the recently allocated GPU UUIDs to GPUs.
func (r *exclusiveResource) recentGPUs() []topology.GPU {
	if r.recent == nil {
		return nil
	}
	var out []topology.GPU
	for _, uuid := range r.recent.RecentAllocation() {
		for _, g := range r.gpus {
			if g.UUID == uuid {
				out = append(out, g)
			}
		}
	}
	return out
}

// cost scores a set of ports; lower is better. GPU coverage dominates
// NIC-to-NIC closeness by a factor large enough never to be outweighed.
func (r *exclusiveResource) cost(ids []string, gpus []topology.GPU) float64 {
	const gpuWeight = 1000
	var gpuCost, pairCost float64
	for _, g := range gpus {
		best := len(pciLevels)
		for _, id := range ids {
			best = min(best, r.gpuLevel(id, g))
		}
		gpuCost += float64(best)
	}
	if len(gpus) > 0 {
		for _, id := range ids {
			best := len(pciLevels)
			for _, g := range gpus {
				best = min(best, r.gpuLevel(id, g))
			}
			gpuCost += float64(best)
		}
	}
	for i := range ids {
		for j := i + 1; j < len(ids); j++ {
			a, b := r.byID[ids[i]].dev, r.byID[ids[j]].dev
			pairCost += float64(pciLevels[Distance(a.PCI.Path, a.PCI.NUMANode, b.PCI.Path, b.PCI.NUMANode)])
		}
	}
	return gpuWeight*gpuCost + pairCost
}

func (r *exclusiveResource) gpuLevel(id string, g topology.GPU) int {
	d := r.byID[id].dev
	return pciLevels[Distance(d.PCI.Path, d.PCI.NUMANode, g.PCIPath, g.NUMANode)]
}

// combine calls fn with every k-subset of items, in lexicographic order.
func combine(items []string, k int, fn func([]string)) {
	pick := make([]string, 0, k)
	var rec func(start int)
	rec = func(start int) {
		if len(pick) == k {
			fn(pick)
			return
		}
		for i := start; i <= len(items)-(k-len(pick)); i++ {
			pick = append(pick, items[i])
			rec(i + 1)
			pick = pick[:len(pick)-1]
		}
	}
	rec(0)
}

func binomial(n, k int) float64 {
	if k < 0 || k > n {
		return 0
	}
	r := 1.0
	for i := 1; i <= k; i++ {
		r = r * float64(n-k+i) / float64(i)
	}
	return r
}
