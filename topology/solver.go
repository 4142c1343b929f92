package topology

import (
	"cmp"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"sync"
)

// The objective is the one NVIDIA's go-gpuallocator v0.6.0 BestEffort policy
// maximises, so users get the placements the NVIDIA device plugin gives them:
//
//   - a GPU pair scores 100 per NVLink plus its PCIe level score (PCIeScore);
//     our NVLink counts include links through NVSwitch, which BestEffort
//     cannot see (it would score every DGX A100/H100 pair by PCIe alone);
//   - a set scores the sum over all its pairs;
//   - the available devices are partitioned into groups of the requested
//     size plus, when len(available)%size != 0, one leftover group of the
//     remainder (BestEffort pads with nil; a padded set must hold all the
//     padding or none, which is this shape). The partition with the highest
//     total — leftover group's internal pairs included — wins; among equal
//     totals the first in BestEffort's enumeration order wins (groups by
//     their first device, each group lexicographic, padding last);
//   - with must-include devices, only partitions with one full group holding
//     all of them count, and the answer is that group; otherwise the answer
//     is the highest-scoring group of the winning partition, the first one
//     on ties.
//
// Deliberate differences, each where BestEffort's answer is not useful:
//   - BestEffort can answer with the leftover (nil-padded, short) group when
//     it scores highest; we only ever answer with a full group.
//   - BestEffort answers size 1 with the first available device (every
//     single-device partition scores 0); we pick the device whose removal
//     hurts the remaining devices least: the one with the lowest sum of pair
//     scores to the other available devices, lowest index on ties. That keeps
//     well-connected devices together for later multi-device requests.
//   - Device order is GPU index (then MIG index), not the order of the
//     request, so ties are broken the same way whatever order the kubelet
//     sends; BestEffort breaks ties by request order.
//   - Lost GPUs (and MIG devices on them) are dropped from the available set
//     instead of failing the call; unknown IDs are errors rather than an
//     empty answer.
//   - MIG devices (BestEffort has none): two slices on one parent score
//     above any possible sum of GPU pair scores, slices on different parents
//     score the parents' GPU pair score. So a partition first maximises the
//     number of same-parent pairs, then the NVLink/PCIe closeness of parents.

// PCIeScore returns BestEffort's score for a PCIe level: same-board 60,
// single-switch 50, multi-switch 40, host-bridge 30, same-cpu 20,
// cross-cpu 10, unknown 0.
func PCIeScore(l PCIeLevel) int {
	switch l {
	case PCIeSameBoard:
		return 60
	case PCIeSingleSwitch:
		return 50
	case PCIeMultiSwitch:
		return 40
	case PCIeHostBridge:
		return 30
	case PCIeSameCPU:
		return 20
	case PCIeCrossCPU:
		return 10
	}
	return 0
}

// PairScore returns the BestEffort pair score of a link: 100 per NVLink
// (NVSwitch paths included) plus the PCIe level score.
func PairScore(l Link) int {
	return 100*l.NVLinks + PCIeScore(l.PCIe)
}

// maxDevices is the solver's bitmask width.
const maxDevices = 64

// Allocator answers preferred-allocation requests for one node model. It
// precomputes everything that depends only on the node, so build it once
// per discovery and rebuild it when the node changes. It is safe for
// concurrent use: Preferred and Explain only read it.
type Allocator struct {
	uuids []string // GPU UUID by position (positions are in GPU index order)
	index []int    // GPU index by position
	lost  []bool
	pair  []int // GPU pair scores, len(uuids)^2
	gpus  map[string]int
	migs  map[string]migRef
	// migSame is the score of two MIG slices on one parent.
	migSame int
	// pool recycles solver state between calls.
	pool sync.Pool
}

type migRef struct {
	parent int // GPU position
	index  int // MIG device index within the parent
}

// NewAllocator builds an Allocator for n.
func NewAllocator(n *Node) *Allocator {
	order := make([]int, len(n.GPUs))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(x, y int) int { return cmp.Compare(n.GPUs[x].Index, n.GPUs[y].Index) })
	a := &Allocator{
		uuids: make([]string, len(order)),
		index: make([]int, len(order)),
		lost:  make([]bool, len(order)),
		pair:  make([]int, len(order)*len(order)),
		gpus:  make(map[string]int, len(order)),
		migs:  make(map[string]migRef),
	}
	a.pool.New = func() any { return new(partitioner) }
	byIndex := make(map[int]int, len(order))
	for pos, i := range order {
		g := n.GPUs[i]
		a.uuids[pos], a.index[pos], a.lost[pos] = g.UUID, g.Index, g.Lost
		a.gpus[g.UUID] = pos
		byIndex[g.Index] = pos
		for _, m := range g.MIG {
			a.migs[m.UUID] = migRef{parent: pos, index: m.Index}
		}
	}
	maxPair := 0
	for _, l := range n.Links {
		pa, okA := byIndex[l.A]
		pb, okB := byIndex[l.B]
		if !okA || !okB || pa == pb {
			continue
		}
		s := PairScore(l)
		a.pair[pa*len(order)+pb], a.pair[pb*len(order)+pa] = s, s
		maxPair = max(maxPair, s)
	}
	// Above any total of GPU pair scores a partition of maxDevices can hold.
	a.migSame = (maxPair+1)*(maxDevices*(maxDevices-1)/2) + 1
	return a
}

// Explanation is what justified a preferred allocation.
type Explanation struct {
	Size int
	// Available are the devices considered, in solver order (GPU index,
	// then MIG index); Skipped are available devices dropped as lost.
	Available   []string
	Skipped     []string
	MustInclude []string
	// Pairs holds the score of every pair of considered devices.
	Pairs []ScoredPair
	// Partition is the winning partition (nil for size 1); its last group
	// may be the leftover group.
	Partition      []Group
	PartitionScore int
	Chosen         []string
	ChosenScore    int
	// Rule names how Chosen was picked.
	Rule string
}

// ScoredPair is the score of one device pair.
type ScoredPair struct {
	A, B  string
	Score int
}

// Group is one group of a partition.
type Group struct {
	Devices []string
	Score   int
	// Leftover marks the group of len(available)%size devices.
	Leftover bool
}

// Preferred returns the size devices to allocate from available, holding
// every mustInclude device. IDs are GPU UUIDs or MIG UUIDs (not mixed).
// The answer has exactly size devices, in GPU/MIG index order, or an error
// naming what is wrong with the request.
func (a *Allocator) Preferred(available, mustInclude []string, size int) ([]string, error) {
	e, err := a.explain(available, mustInclude, size, false)
	if err != nil {
		return nil, err
	}
	return e.Chosen, nil
}

// Explain answers like Preferred and also returns the pair scores and the
// partition that justified the answer.
func (a *Allocator) Explain(available, mustInclude []string, size int) (*Explanation, error) {
	return a.explain(available, mustInclude, size, true)
}

// SetScore returns the sum of pair scores of a set of devices, the score
// Preferred maximises; it lets callers compare answers.
func (a *Allocator) SetScore(ids []string) (int, error) {
	items, _, err := a.resolve(ids)
	if err != nil {
		return 0, err
	}
	s := 0
	for i := range items {
		for j := i + 1; j < len(items); j++ {
			s += a.itemScore(items[i], items[j])
		}
	}
	return s, nil
}

// item is one requested device: a GPU (mig < 0) or a MIG slice.
type item struct {
	id     string
	gpu    int // GPU position (the parent for MIG)
	mig    int // MIG index within the parent; -1 for a GPU
	isMIG  bool
	isLost bool
}

func (a *Allocator) lookup(id string) (item, bool) {
	if p, ok := a.gpus[id]; ok {
		return item{id: id, gpu: p, mig: -1, isLost: a.lost[p]}, true
	}
	if m, ok := a.migs[id]; ok {
		return item{id: id, gpu: m.parent, mig: m.index, isMIG: true, isLost: a.lost[m.parent]}, true
	}
	return item{}, false
}

// resolve maps ids to items in solver order, dropping lost devices (returned
// separately).
func (a *Allocator) resolve(ids []string) (items []item, lost []string, err error) {
	for _, id := range ids {
		it, ok := a.lookup(id)
		if !ok {
			return nil, nil, fmt.Errorf("unknown device %q", id)
		}
		if len(items) > 0 && items[0].isMIG != it.isMIG {
			return nil, nil, fmt.Errorf("device %q: GPU and MIG devices cannot be mixed in one request", id)
		}
		if it.isLost {
			lost = append(lost, id)
			continue
		}
		items = append(items, it)
	}
	slices.SortFunc(items, func(x, y item) int {
		if c := cmp.Compare(a.index[x.gpu], a.index[y.gpu]); c != 0 {
			return c
		}
		return cmp.Compare(x.mig, y.mig)
	})
	for i := 1; i < len(items); i++ {
		if items[i].gpu == items[i-1].gpu && items[i].mig == items[i-1].mig {
			return nil, nil, fmt.Errorf("device %q listed twice", items[i].id)
		}
	}
	slices.Sort(lost)
	for i := 1; i < len(lost); i++ {
		if lost[i] == lost[i-1] {
			return nil, nil, fmt.Errorf("device %q listed twice", lost[i])
		}
	}
	return items, lost, nil
}

func (a *Allocator) itemScore(x, y item) int {
	if x.gpu == y.gpu {
		if x.isMIG {
			return a.migSame
		}
		return 0
	}
	return a.pair[x.gpu*len(a.uuids)+y.gpu]
}

func (a *Allocator) explain(available, mustInclude []string, size int, full bool) (*Explanation, error) {
	items, lost, err := a.resolve(available)
	if err != nil {
		return nil, fmt.Errorf("available devices: %w", err)
	}
	n := len(items)
	if n > maxDevices {
		return nil, fmt.Errorf("%d available devices: the solver handles at most %d", n, maxDevices)
	}
	if size < 1 || size > n {
		return nil, fmt.Errorf("size %d out of range: %d devices available", size, n)
	}
	var req uint64
	for _, id := range mustInclude {
		i := slices.IndexFunc(items, func(it item) bool { return it.id == id })
		ok := i >= 0
		switch {
		case ok && req&(1<<uint(i)) != 0:
			return nil, fmt.Errorf("must-include device %q listed twice", id)
		case ok:
			req |= 1 << uint(i)
		case slices.Contains(lost, id):
			return nil, fmt.Errorf("must-include device %q is lost", id)
		default:
			if _, known := a.lookup(id); !known {
				return nil, fmt.Errorf("unknown must-include device %q", id)
			}
			return nil, fmt.Errorf("must-include device %q is not available", id)
		}
	}
	if nreq := bits.OnesCount64(req); nreq > size {
		return nil, fmt.Errorf("%d must-include devices exceed size %d", nreq, size)
	}

	if size == n && !full {
		// One group: nothing to choose (BestEffort answers the same).
		e := &Explanation{Size: size, Skipped: lost, Rule: "every available device"}
		for _, it := range items {
			e.Chosen = append(e.Chosen, it.id)
		}
		return e, nil
	}

	p := a.pool.Get().(*partitioner)
	defer a.pool.Put(p)
	p.grow(n)
	w := p.w
	for i := range items {
		w[i*n+i] = 0
		for j := i + 1; j < n; j++ {
			s := a.itemScore(items[i], items[j])
			w[i*n+j], w[j*n+i] = s, s
		}
	}
	e := &Explanation{Size: size, Skipped: lost}
	if full {
		for _, it := range items {
			e.Available = append(e.Available, it.id)
		}
		for i := range n {
			if req&(1<<uint(i)) != 0 {
				e.MustInclude = append(e.MustInclude, items[i].id)
			}
		}
		for i := range n {
			for j := i + 1; j < n; j++ {
				e.Pairs = append(e.Pairs, ScoredPair{A: items[i].id, B: items[j].id, Score: w[i*n+j]})
			}
		}
	}
	ids := func(g uint64) []string {
		var out []string
		for m := g; m != 0; m &= m - 1 {
			out = append(out, items[bits.TrailingZeros64(m)].id)
		}
		return out
	}

	if size == 1 {
		chosen := leastConnected(w, n, req)
		e.Chosen, e.Rule = ids(chosen), "size 1: the device with the lowest sum of pair scores to the other available devices (lowest index on ties)"
		if req != 0 {
			e.Rule = "size 1: the must-include device"
		}
		return e, nil
	}

	class := p.class
	for i, it := range items {
		class[i] = it.gpu
		if !it.isMIG || req&(1<<uint(i)) != 0 {
			class[i] = len(a.uuids) + i // a class of its own
		}
	}
	p.reset(n, size, req)
	partition, total := p.best()
	if partition == nil {
		return nil, errors.New("no partition holds all must-include devices") // cannot happen after the checks above
	}
	e.PartitionScore = total
	bestScore, chosen := infeasible, uint64(0)
	for _, g := range partition {
		s := p.groupScore(g)
		leftover := bits.OnesCount64(g) != size
		e.Partition = append(e.Partition, Group{Devices: ids(g), Score: s, Leftover: leftover})
		if leftover || g&req != req {
			continue
		}
		if s > bestScore {
			bestScore, chosen = s, g
		}
	}
	e.Chosen, e.ChosenScore = ids(chosen), bestScore
	e.Rule = "the highest-scoring full group of the highest-scoring partition"
	if req != 0 {
		e.Rule = "the group of the highest-scoring partition that holds every must-include device"
	}
	return e, nil
}

// leastConnected returns the single device whose pair scores to the others
// sum lowest (the must-include device when there is one).
func leastConnected(w []int, n int, req uint64) uint64 {
	if req != 0 {
		return req
	}
	best, bestCost := 0, 0
	for i := range n {
		c := 0
		for j := range n {
			c += w[i*n+j]
		}
		if i == 0 || c < bestCost {
			best, bestCost = i, c
		}
	}
	return 1 << uint(best)
}
