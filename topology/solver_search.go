package topology

import (
	"math"
	"math/bits"
	"slices"
)

// infeasible marks a state that cannot be partitioned under the
// must-include rule. It is far below any real score but cannot overflow
// when a group score is added to it.
const infeasible = math.MinInt / 4

// partitioner finds the highest-scoring partition of n items into groups
// of size `size` plus, when n%size != 0, one leftover group of n%size items:
// the objective of go-gpuallocator's BestEffort policy, whose padding rule
// (a padded set holds all the padding or none) yields exactly that shape
// and counts the leftover group's internal pairs in the partition total.
//
// The search is a memoised DP over item bitmasks: f(mask) is the best
// partition value of the items in mask, and the group holding mask's lowest
// item is chosen first, so each partition is reached once. Two things keep
// it fast: an upper bound (each item contributes at most half of its best
// size-1 pair scores) prunes groups that cannot beat the best value found so
// far, and memo entries remember "at most X" answers from pruned searches
// the way a transposition table does, so a state is not searched twice for
// the same threshold. Items of one class (MIG slices of one parent GPU) are
// interchangeable, so a group only ever takes the lowest remaining items of
// a class; this keeps masks canonical and the state space small.
type partitioner struct {
	n     int
	size  int
	rem   int    // n % size: the leftover group's size (0: none)
	req   uint64 // must-include items: one full group holds all of them
	nreq  int
	w     []int // n*n pair scores
	class []int // equal ids on adjacent items mark interchangeable items
	ub2   []int // per item: sum of its best size-1 pair scores (2x bound)
	memo  map[uint64]memoEntry
	// bufs are per-depth candidate buffers reused across states.
	bufs [][]candidate
}

// memoEntry is f(mask) when exact, otherwise an upper bound on it.
type memoEntry struct {
	v     int
	exact bool
}

// candidate is one group that can hold the lowest item of a state.
type candidate struct {
	g     uint64
	score int
	bound int // 2*score + ub2(mask without g): the child's optimistic total, doubled
}

func newPartitioner(w []int, n, size int, req uint64, class []int) *partitioner {
	p := &partitioner{
		n: n, size: size, rem: n % size, req: req, nreq: bits.OnesCount64(req),
		w: w, class: class,
		ub2:  make([]int, n),
		memo: make(map[uint64]memoEntry, 64),
	}
	top := make([]int, 0, n)
	for i := 0; i < n; i++ {
		top = top[:0]
		for j := 0; j < n; j++ {
			if j != i {
				top = append(top, w[i*n+j])
			}
		}
		slices.Sort(top)
		s := 0
		for k := 0; k < size-1 && k < len(top); k++ {
			s += top[len(top)-1-k]
		}
		p.ub2[i] = s
	}
	return p
}

func (p *partitioner) full() uint64 {
	if p.n == 64 {
		return math.MaxUint64
	}
	return 1<<uint(p.n) - 1
}

func (p *partitioner) ub2Of(mask uint64) int {
	s := 0
	for m := mask; m != 0; m &= m - 1 {
		s += p.ub2[bits.TrailingZeros64(m)]
	}
	return s
}

// groupSizes lists the sizes the group holding mask's lowest item may have.
func (p *partitioner) groupSizes(mask uint64) []int {
	c := bits.OnesCount64(mask)
	if p.rem == 0 || c%p.size != p.rem {
		return []int{p.size} // the leftover group is already placed
	}
	if c == p.rem {
		return []int{p.rem}
	}
	return []int{p.size, p.rem}
}

// groups appends to buf every valid group of size k that holds mask's
// lowest item, in lexicographic order of its items.
func (p *partitioner) groups(buf []candidate, mask uint64, k int) []candidate {
	low := bits.TrailingZeros64(mask)
	var rec func(next int, need int, g uint64, s int)
	rec = func(next int, need int, g uint64, s int) {
		if need == 0 {
			if r := g & p.req; r != 0 && (r != p.req || k != p.size) {
				return
			}
			buf = append(buf, candidate{g: g, score: s})
			return
		}
		for j := next; j < p.n; j++ {
			bit := uint64(1) << uint(j)
			if mask&bit == 0 {
				continue
			}
			if bits.OnesCount64(mask>>uint(j)) < need {
				return // not enough items left
			}
			// Interchangeable items: take the lowest remaining first.
			if j > 0 && p.class[j] == p.class[j-1] && mask&(bit>>1) != 0 && g&(bit>>1) == 0 {
				continue
			}
			add := 0
			for m := g; m != 0; m &= m - 1 {
				add += p.w[bits.TrailingZeros64(m)*p.n+j]
			}
			rec(j+1, need-1, g|bit, s+add)
		}
	}
	rec(low+1, k-1, uint64(1)<<uint(low), 0)
	return buf
}

// solve returns f(mask) and true when f(mask) > alpha; otherwise it returns
// an upper bound <= alpha and false.
func (p *partitioner) solve(mask uint64, alpha int, depth int) (int, bool) {
	if mask == 0 {
		return 0, true
	}
	if e, ok := p.memo[mask]; ok {
		if e.exact {
			return e.v, e.v > alpha
		}
		if e.v <= alpha {
			return e.v, false
		}
	}
	rest := p.ub2Of(mask)
	if rest/2 <= alpha {
		return rest / 2, false
	}
	for len(p.bufs) <= depth {
		p.bufs = append(p.bufs, nil)
	}
	buf := p.bufs[depth][:0]
	for _, k := range p.groupSizes(mask) {
		buf = p.groups(buf, mask, k)
	}
	for i := range buf {
		c := &buf[i]
		c.bound = 2*c.score + p.ub2Of(mask&^c.g)
	}
	// Most promising first so the threshold rises early. The order only
	// affects speed: the value is the exact maximum either way.
	slices.SortStableFunc(buf, func(a, b candidate) int { return b.bound - a.bound })
	p.bufs[depth] = buf

	best := infeasible
	for i := 0; i < len(buf); i++ {
		c := p.bufs[depth][i]
		floor := max(alpha, best)
		if c.bound/2 <= floor {
			break // sorted by bound: no later group can do better
		}
		v, ok := p.solve(mask&^c.g, floor-c.score, depth+1)
		if ok && v != infeasible && c.score+v > best {
			best = c.score + v
		}
	}
	if best > alpha {
		p.memo[mask] = memoEntry{v: best, exact: true}
		return best, true
	}
	p.memo[mask] = memoEntry{v: alpha, exact: false}
	return alpha, false
}

// value returns the exact f(mask).
func (p *partitioner) value(mask uint64) int {
	v, ok := p.solve(mask, infeasible-1, 0)
	if !ok {
		return infeasible
	}
	return v
}

// best returns the first partition, in BestEffort's enumeration order,
// whose value is the maximum: groups ordered by their lowest item, each
// chosen as the lexicographically first group (padding sorting after every
// real item) that still reaches the optimum.
func (p *partitioner) best() (partition []uint64, total int) {
	mask := p.full()
	total = p.value(mask)
	if total == infeasible {
		return nil, total
	}
	target := total
	for mask != 0 {
		var cands []candidate
		for _, k := range p.groupSizes(mask) {
			cands = p.groups(cands, mask, k)
		}
		slices.SortStableFunc(cands, func(a, b candidate) int { return p.lexCompare(a.g, b.g) })
		found := false
		for _, c := range cands {
			need := target - c.score
			if rest := mask &^ c.g; p.ub2Of(rest)/2 < need {
				continue
			} else if v, ok := p.solve(rest, need-1, 0); ok && v == need {
				partition = append(partition, c.g)
				mask, target = rest, need
				found = true
				break
			}
		}
		if !found {
			panic("topology: partition reconstruction lost the optimum") // cannot happen: f(mask) is attained
		}
	}
	return partition, total
}

// lexCompare orders two groups holding the same lowest item the way
// BestEffort enumerates them: by their sorted items, a smaller group being
// padded with positions after every real item.
func (p *partitioner) lexCompare(a, b uint64) int {
	for a != 0 || b != 0 {
		x, y := p.n+64, p.n+64
		if a != 0 {
			x = bits.TrailingZeros64(a)
		}
		if b != 0 {
			y = bits.TrailingZeros64(b)
		}
		if x != y {
			return x - y
		}
		a &= a - 1
		b &= b - 1
	}
	return 0
}

// groupScore sums the pair scores inside g.
func (p *partitioner) groupScore(g uint64) int {
	s := 0
	for m := g; m != 0; m &= m - 1 {
		i := bits.TrailingZeros64(m)
		for r := m & (m - 1); r != 0; r &= r - 1 {
			s += p.w[i*p.n+bits.TrailingZeros64(r)]
		}
	}
	return s
}
