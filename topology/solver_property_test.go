package topology

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// The number of random requests the property test checks, and its seed;
// e.g. `go test ./topology -run Exhaustive -solver.cases=100000 -solver.seed=7`.
var (
	propertyCases = flag.Int("solver.cases", 4000, "random cases for TestPreferredMatchesExhaustiveSearch")
	propertySeed  = flag.Uint64("solver.seed", 2026, "seed for TestPreferredMatchesExhaustiveSearch")
)

// bruteForce enumerates partitions exactly as go-gpuallocator's BestEffort
// does (pad with nil to a multiple of size; a set holds all the padding or
// none; sets ordered by their first device), keeps the first partition with
// the highest total that has a full set holding every must-include device,
// and answers with that set, or with the first highest-scoring full set.
// Positions index into w (n x n); pad is -1. Size 1 follows our documented
// rule instead: the device with the lowest sum of pair scores.
func bruteForce(w []int, n, size int, req []int) (set []int, total int) {
	score := func(s []int) int {
		t := 0
		for i := range s {
			for j := i + 1; j < len(s); j++ {
				if s[i] >= 0 && s[j] >= 0 {
					t += w[s[i]*n+s[j]]
				}
			}
		}
		return t
	}
	if size == 1 {
		if len(req) == 1 {
			return req, 0
		}
		best, cost := 0, 0
		for i := range n {
			c := 0
			for j := range n {
				c += w[i*n+j]
			}
			if i == 0 || c < cost {
				best, cost = i, c
			}
		}
		return []int{best}, 0
	}
	devs := make([]int, n)
	for i := range devs {
		devs[i] = i
	}
	for len(devs)%size != 0 {
		devs = append(devs, -1)
	}
	padding := len(devs) - n
	countPad := func(s []int) int {
		c := 0
		for _, d := range s {
			if d < 0 {
				c++
			}
		}
		return c
	}
	holdsAll := func(s []int) bool {
		for _, r := range req {
			if !slices.Contains(s, r) {
				return false
			}
		}
		return true
	}
	var bestPart [][]int
	bestTotal := 0
	var iterate func(devs []int, accum [][]int)
	iterate = func(devs []int, accum [][]int) {
		if len(devs) == size {
			part := append(slices.Clone(accum), slices.Clone(devs))
			ok := false
			for _, s := range part {
				if holdsAll(s) && countPad(s) == 0 {
					ok = true
				}
			}
			if !ok {
				return
			}
			t := 0
			for _, s := range part {
				t += score(s)
			}
			if bestPart == nil || t > bestTotal {
				bestPart, bestTotal = part, t
			}
			return
		}
		// Every (size-1)-subset of devs[1:] in lexicographic order, with devs[0].
		var combos func(start int, cur []int)
		combos = func(start int, cur []int) {
			if len(cur) == size {
				if p := countPad(cur); p != 0 && p != padding {
					return
				}
				var rest []int
				for _, d := range devs {
					if !slices.Contains(cur, d) {
						rest = append(rest, d)
					}
				}
				iterate(rest, append(accum, slices.Clone(cur)))
				return
			}
			for j := start; j < len(devs); j++ {
				combos(j+1, append(cur, devs[j]))
			}
		}
		combos(1, []int{devs[0]})
	}
	iterate(devs, nil)
	bestScore := -1
	for _, s := range bestPart {
		if countPad(s) != 0 || !holdsAll(s) {
			continue // we never answer with the padded leftover set
		}
		if sc := score(s); sc > bestScore {
			set, bestScore = s, sc
		}
	}
	return set, bestTotal
}

// randomNode builds a node of n GPUs with random NVLink counts (0-4) and
// random PCIe levels (or none) between every pair.
func randomNode(r *rand.Rand, n int) *Node {
	levels := []PCIeLevel{"", PCIeSameBoard, PCIeSingleSwitch, PCIeMultiSwitch, PCIeHostBridge, PCIeSameCPU, PCIeCrossCPU}
	node := &Node{}
	for i := range n {
		node.GPUs = append(node.GPUs, GPU{Index: i, UUID: fmt.Sprintf("GPU-%d", i)})
	}
	for a := range n {
		for b := a + 1; b < n; b++ {
			node.Links = append(node.Links, Link{A: a, B: b, NVLinks: r.IntN(5), PCIe: levels[r.IntN(len(levels))]})
		}
	}
	return node
}

func TestPreferredMatchesExhaustiveSearch(t *testing.T) {
	r := rand.New(rand.NewPCG(4, *propertySeed))
	for c := range *propertyCases {
		gpus := 1 + r.IntN(10)
		node := randomNode(r, gpus)
		// A random non-empty subset is available, in random order.
		var avail []int
		for i := range gpus {
			if r.IntN(4) != 0 {
				avail = append(avail, i)
			}
		}
		if len(avail) == 0 {
			avail = []int{r.IntN(gpus)}
		}
		r.Shuffle(len(avail), func(i, j int) { avail[i], avail[j] = avail[j], avail[i] })
		size := 1 + r.IntN(len(avail))
		var must []int
		for _, i := range r.Perm(len(avail))[:r.IntN(min(size, 3)+1)] {
			must = append(must, avail[i])
		}

		a := NewAllocator(node)
		e, err := a.Explain(gpuIDs(node, avail...), gpuIDs(node, must...), size)
		if err != nil {
			t.Fatalf("case %d: %v", c, err)
		}

		// The brute force works on positions in index order, like the solver.
		sorted := slices.Sorted(slices.Values(avail))
		m := len(sorted)
		w := make([]int, m*m)
		for i := range m {
			for j := range m {
				if i != j {
					l := node.Links[linkIndex(gpus, min(sorted[i], sorted[j]), max(sorted[i], sorted[j]))]
					w[i*m+j] = PairScore(l)
				}
			}
		}
		var req []int
		for _, g := range must {
			req = append(req, slices.Index(sorted, g))
		}
		wantSet, wantTotal := bruteForce(w, m, size, req)
		var want []int
		for _, p := range wantSet {
			want = append(want, sorted[p])
		}
		slices.Sort(want)
		desc := fmt.Sprintf("case %d: %d GPUs, available %v, must %v, size %d", c, gpus, avail, must, size)
		if size > 1 && e.PartitionScore != wantTotal {
			t.Fatalf("%s: partition score %d, exhaustive %d", desc, e.PartitionScore, wantTotal)
		}
		gotScore, _ := a.SetScore(e.Chosen)
		wantScore, _ := a.SetScore(gpuIDs(node, want...))
		if gotScore != wantScore {
			t.Fatalf("%s: chosen %v scores %d, exhaustive %v scores %d", desc, e.Chosen, gotScore, want, wantScore)
		}
		// Same tie-breaking as BestEffort's enumeration order: the same set.
		if !slices.Equal(e.Chosen, gpuIDs(node, want...)) {
			t.Fatalf("%s: chosen %v, exhaustive %v", desc, e.Chosen, want)
		}
		if len(e.Chosen) != size {
			t.Fatalf("%s: %d devices chosen", desc, len(e.Chosen))
		}
	}
	t.Logf("%d random cases (seed %d) matched exhaustive search", *propertyCases, *propertySeed)
}

// linkIndex is the position of pair (a<b) in randomNode's link list.
func linkIndex(n, a, b int) int {
	return a*n - a*(a+1)/2 + (b - a - 1)
}

// TestPreferredMIGMatchesExhaustiveSearch checks the MIG path (slices of
// one parent are interchangeable, which the solver exploits) against the
// same exhaustive search on the solver's own pair scores: the partition
// total and the chosen set's score must match (which of two interchangeable
// slices is named may differ).
func TestPreferredMIGMatchesExhaustiveSearch(t *testing.T) {
	r := rand.New(rand.NewPCG(5, *propertySeed))
	cases := *propertyCases / 4
	for c := range cases {
		node := randomNode(r, 1+r.IntN(5))
		var ids []string
		for i := range node.GPUs {
			g := &node.GPUs[i]
			g.MIGCapable, g.MIGEnabled = true, true
			for k := range r.IntN(4) {
				if len(ids) == 10 {
					break
				}
				id := fmt.Sprintf("MIG-%d-%d", i, k)
				g.MIG = append(g.MIG, MIGDevice{UUID: id, Profile: "1g.10gb", Index: k})
				ids = append(ids, id)
			}
		}
		if len(ids) == 0 {
			continue
		}
		a := NewAllocator(node)
		size := 1 + r.IntN(len(ids))
		var must []string
		for _, i := range r.Perm(len(ids))[:r.IntN(min(size, 2)+1)] {
			must = append(must, ids[i])
		}
		e, err := a.Explain(ids, must, size)
		if err != nil {
			t.Fatalf("case %d: %v", c, err)
		}
		m := len(ids) // ids are already in solver order (GPU, then MIG index)
		w := make([]int, m*m)
		for i := range m {
			for j := range m {
				if i != j {
					w[i*m+j], _ = a.SetScore([]string{ids[i], ids[j]})
				}
			}
		}
		var req []int
		for _, id := range must {
			req = append(req, slices.Index(ids, id))
		}
		wantSet, wantTotal := bruteForce(w, m, size, req)
		var want []string
		for _, p := range wantSet {
			want = append(want, ids[p])
		}
		desc := fmt.Sprintf("case %d: %v must %v size %d", c, ids, must, size)
		if size > 1 && e.PartitionScore != wantTotal {
			t.Fatalf("%s: partition score %d, exhaustive %d", desc, e.PartitionScore, wantTotal)
		}
		gotScore, _ := a.SetScore(e.Chosen)
		wantScore, _ := a.SetScore(want)
		if size > 1 && gotScore != wantScore {
			t.Fatalf("%s: chosen %v scores %d, exhaustive %v scores %d", desc, e.Chosen, gotScore, want, wantScore)
		}
		if len(e.Chosen) != size {
			t.Fatalf("%s: %d devices chosen", desc, len(e.Chosen))
		}
		for _, id := range must {
			if !slices.Contains(e.Chosen, id) {
				t.Fatalf("%s: chosen %v lacks must-include %s", desc, e.Chosen, id)
			}
		}
	}
	t.Logf("%d random MIG cases matched exhaustive search", cases)
}
