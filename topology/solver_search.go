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
// item is chosen first, so each partition is reached once. What keeps it
// fast (16 GPUs: tens of microseconds for most sizes, a few hundred for
// the worst, against BestEffort's seconds):
//   - an upper bound per state (each item gets its best size-1 partners
//     still in the state; the leftover group's items fewer) prunes groups
//     that cannot beat the best value found so far, and candidates are
//     filtered by it before they are sorted best-first;
//   - solve carries a threshold (alpha) and memo entries also remember the
//     "at most X" answers of pruned searches, as a transposition table does;
//   - a greedy dive supplies the first threshold;
//   - when the rest of a state is a single group, a candidate's total is
//     score(state) minus the cut between the group and the rest, known in
//     O(1) and bounded while the group is built, so most of the C(n-1,k-1)
//     groups are never completed (size n/2 at 16 GPUs: 6435 → a handful);
//   - items of one class (MIG slices of one parent GPU) are
//     interchangeable, so a group only ever takes the lowest remaining
//     items of a class; masks stay canonical and the state space small.
//
// Reconstruction then walks the optimum in BestEffort's enumeration order
// (best), so ties resolve as they do there.
type partitioner struct {
	n     int
	size  int
	rem   int    // n % size: the leftover group's size (0: none)
	req   uint64 // must-include items: one full group holds all of them
	w     []int  // n*n pair scores
	class []int  // equal ids on adjacent items mark interchangeable items
	// nbrs lists, per item, the other items by descending pair score: the
	// state bound walks it to find an item's best partners in a mask.
	nbrs [][]int
	flat []int // backing store of nbrs
	memo map[uint64]memoEntry
	// bufs are per-depth candidate buffers reused across states.
	bufs [][]candidate
	// Scratch for expand/gen: the state being expanded.
	rowsum                  []int
	gBestExact              int
	dyn                     []int // per item: its best size-1 partners in the state being expanded
	gFind, gFound           bool  // find mode: stop at the first exact match of gTarget
	gTarget                 int
	gMinPair                int // lowest pair score in the state being expanded
	gFloor                  int // expand: exact totals at or below it are not wanted
	gExactK                 bool
	prefix                  []int // per item: pair scores with the items of the state below it
	gMatch                  candidate
	recon                   []candidate // reconstruction buffer
	gMask                   uint64
	gCount, gK, gScore, gUB int
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
	bound int  // 2*score + the rest's bound: the child's optimistic total, doubled
	exact bool // bound is the child's exact total (the rest is one final group)
}

// grow makes p's buffers hold a problem of n items; a partitioner is
// reused across calls (from the Allocator's pool) to spare the allocations.
func (p *partitioner) grow(n int) {
	if cap(p.w) < n*n {
		p.w = make([]int, n*n)
		p.flat = make([]int, n*n)
	}
	if cap(p.class) < n {
		p.class = make([]int, n)
		p.rowsum = make([]int, n)
		p.dyn = make([]int, n)
		p.prefix = make([]int, n)
		p.nbrs = make([][]int, n)
	}
	p.w, p.class, p.rowsum, p.dyn, p.nbrs, p.prefix = p.w[:n*n], p.class[:n], p.rowsum[:n], p.dyn[:n], p.nbrs[:n], p.prefix[:n]
	if p.memo == nil {
		p.memo = make(map[uint64]memoEntry, 16)
	}
}

// reset starts a new problem on p.w and p.class (filled by the caller after
// grow): size, must-include mask, fresh memo, partner lists.
func (p *partitioner) reset(n, size int, req uint64) {
	p.n, p.size, p.rem, p.req = n, size, n%size, req
	clear(p.memo)
	w := p.w
	flat := p.flat[:0]
	for i := 0; i < n; i++ {
		nb := flat[len(flat):len(flat):cap(flat)]
		for j := 0; j < n; j++ {
			if j != i {
				nb = append(nb, j)
			}
		}
		slices.SortStableFunc(nb, func(x, y int) int { return w[i*n+y] - w[i*n+x] })
		p.nbrs[i] = nb[:len(nb):len(nb)]
		flat = flat[:len(flat)+len(nb)]
	}
}

// stateBound2 returns twice an upper bound on f(mask): every item gets its
// best size-1 partners still in mask, except that the items of a pending
// leftover group get only rem-1 (we charge the cheapest items for that).
func (p *partitioner) stateBound2(mask uint64) int {
	total := 0
	pending := p.rem > 0 && bits.OnesCount64(mask)%p.size == p.rem
	var loss [maxDevices]int // per item: what a leftover seat costs it
	nloss := 0
	for m := mask; m != 0; m &= m - 1 {
		v := bits.TrailingZeros64(m)
		full, short, k := 0, 0, 0
		for _, u := range p.nbrs[v] {
			if k == p.size-1 {
				break
			}
			if mask&(uint64(1)<<uint(u)) == 0 {
				continue
			}
			s := p.w[v*p.n+u]
			full += s
			if k < p.rem-1 {
				short += s
			}
			k++
		}
		total += full
		p.dyn[v] = full
		if pending {
			loss[nloss] = full - short
			nloss++
		}
	}
	if pending && nloss >= p.rem {
		l := loss[:nloss]
		slices.Sort(l)
		for _, x := range l[:p.rem] {
			total -= x
		}
	}
	return total
}

// finalGroup reports whether mask must be exactly one group, and then its
// exact value (infeasible when it breaks the must-include rule).
func (p *partitioner) finalGroup(mask uint64) (int, bool) {
	c := bits.OnesCount64(mask)
	if c != p.size && !(p.rem > 0 && c == p.rem) {
		return 0, false
	}
	if r := mask & p.req; r != 0 && (r != p.req || c != p.size) {
		return infeasible, true
	}
	return p.groupScore(mask), true
}

func (p *partitioner) full() uint64 {
	if p.n == 64 {
		return math.MaxUint64
	}
	return 1<<uint(p.n) - 1
}

// groupSizes lists the sizes the group holding mask's lowest item may have
// (one or two; the array avoids an allocation per state).
func (p *partitioner) groupSizes(mask uint64) ([2]int, int) {
	c := bits.OnesCount64(mask)
	switch {
	case p.rem == 0 || c%p.size != p.rem:
		return [2]int{p.size}, 1 // the leftover group is already placed
	case c == p.rem:
		return [2]int{p.rem}, 1
	}
	return [2]int{p.size, p.rem}, 2
}

// expand appends to buf the valid groups holding mask's lowest item whose
// total is not yet known (the rest of mask still needs partitioning), each
// with twice its optimistic total as bound, and returns the best exact
// total among the others: when the rest of mask is one final group the
// total is exact and costs nothing extra, since with rowsum(v) the sum of
// v's pair scores inside mask,
// score(g) + score(rest) = score(mask) + 2*score(g) - Σ_{v∈g} rowsum(v).
// Exact candidates are never stored: for size n/2 there are C(n-1, n/2-1).
//
// Exact candidates below floor are not enumerated to the end: their total
// is score(mask) - cut(g, rest), and the cut between the items already in
// g and those already passed over only grows (see gen).
func (p *partitioner) expand(buf []candidate, mask uint64, haveDyn bool, floor int) ([]candidate, int) {
	p.prepare(mask, haveDyn)
	p.gFind, p.gBestExact, p.gFloor = false, infeasible, floor
	low := bits.TrailingZeros64(mask)
	sizes, ns := p.groupSizes(mask)
	for _, k := range sizes[:ns] {
		p.setK(k)
		buf = p.gen(buf, low+1, k-1, uint64(1)<<uint(low), 0, p.rowsum[low], p.dyn[low], 0)
	}
	return buf, p.gBestExact
}

// setK selects the group size gen enumerates.
func (p *partitioner) setK(k int) {
	p.gK = k
	restCount := p.gCount - k
	p.gExactK = restCount == 0 || restCount == p.size || restCount == p.rem
}

// find is expand for reconstruction: it returns the lexicographically
// first exact candidate whose total is target (ok false if none) and the
// non-exact candidates that may still reach target and come before it.
func (p *partitioner) find(buf []candidate, mask uint64, target int) (open []candidate, first candidate, ok bool) {
	p.prepare(mask, false)
	p.gFind, p.gTarget = true, target
	low := bits.TrailingZeros64(mask)
	sizes, ns := p.groupSizes(mask)
	for _, k := range sizes[:ns] {
		p.setK(k)
		p.gFound = false
		buf = p.gen(buf, low+1, k-1, uint64(1)<<uint(low), 0, p.rowsum[low], p.dyn[low], 0)
		if p.gFound && (!ok || p.lexCompare(p.gMatch.g, first.g) < 0) {
			first, ok = p.gMatch, true
		}
	}
	p.gFound = false
	return buf, first, ok
}

// prepare computes the per-state sums expand and find need. Candidate
// bounds use each item's best partners within this state (p.dyn), which
// bound them in any smaller state too.
func (p *partitioner) prepare(mask uint64, haveDyn bool) {
	if !haveDyn {
		p.stateBound2(mask)
	}
	maskScore2, ub, minPair := 0, 0, math.MaxInt
	for m := mask; m != 0; m &= m - 1 {
		v := bits.TrailingZeros64(m)
		row := p.w[v*p.n : (v+1)*p.n]
		s := 0
		for r := mask; r != 0; r &= r - 1 {
			u := bits.TrailingZeros64(r)
			if u == v {
				p.prefix[v] = s // pairs with the items of mask below v
			}
			s += row[u]
			if u != v && row[u] < minPair {
				minPair = row[u]
			}
		}
		p.rowsum[v] = s
		maskScore2 += s
		ub += p.dyn[v]
	}
	if minPair == math.MaxInt || minPair < 0 {
		minPair = 0
	}
	p.gMask, p.gCount, p.gScore, p.gUB, p.gMinPair = mask, bits.OnesCount64(mask), maskScore2/2, ub, minPair
}

// gen extends the partial group g (pair score s, rowsum total rs, bound
// total us) with need more items from positions >= next. cut is the pair
// score between g and the items of mask below next that g passed over:
// they end in the rest, so an exact candidate's total is at most
// score(mask) - cut, which prunes whole branches.
func (p *partitioner) gen(buf []candidate, next, need int, g uint64, s, rs, us, cut int) []candidate {
	mask := p.gMask
	if p.gExactK && p.cutPrunes(g, next, cut) {
		return buf
	}
	if need == 0 {
		if r := g & p.req; r != 0 && (r != p.req || p.gK != p.size) {
			return buf
		}
		c := candidate{g: g, score: s}
		rest := mask &^ g
		restCount := p.gCount - p.gK
		if restCount == 0 || restCount == p.size || restCount == p.rem {
			c.exact = true
			if r := rest & p.req; r != 0 && (r != p.req || restCount != p.size) {
				c.bound = 2 * infeasible
			} else {
				c.bound = 2 * (p.gScore + 2*s - rs)
			}
			if p.gFind {
				if c.bound/2 == p.gTarget && c.bound/2 != infeasible {
					p.gFound, p.gMatch = true, c
				}
			} else {
				p.gBestExact = max(p.gBestExact, c.bound/2)
			}
			return buf
		}
		c.bound = 2*s + p.gUB - us
		if p.rem > 0 && restCount%p.size == p.rem {
			// The rest still holds the leftover group: each of its rem items
			// loses at least size-rem partners, each worth >= the lowest pair.
			c.bound -= p.rem * (p.size - p.rem) * p.gMinPair
		}
		if p.gFind && c.bound/2 < p.gTarget {
			return buf
		}
		return append(buf, c)
	}
	for j := next; j < p.n; j++ {
		bit := uint64(1) << uint(j)
		if mask&bit == 0 {
			continue
		}
		if bits.OnesCount64(mask>>uint(j)) < need {
			break // not enough items left
		}
		add := 0
		row := p.w[j*p.n : (j+1)*p.n]
		for m := g; m != 0; m &= m - 1 {
			add += row[bits.TrailingZeros64(m)]
		}
		// Interchangeable items: take the lowest remaining first.
		if !(j > 0 && p.class[j] == p.class[j-1] && mask&(bit>>1) != 0 && g&(bit>>1) == 0) {
			// j joins g: its pairs with the passed-over items (those of mask
			// below j, minus g) join the cut.
			buf = p.gen(buf, j+1, need-1, g|bit, s+add, rs+p.rowsum[j], us+p.dyn[j], cut+p.prefix[j]-add)
			if p.gFound {
				return buf // find mode: later groups come after the match
			}
		}
		cut += add // j is passed over from here on
		if p.gExactK && p.cutPrunes(g, j+1, cut) {
			return buf
		}
	}
	return buf
}

// cutPrunes says whether no exact candidate extending g can be wanted. g
// (gK items when done) and the rest (gCount-gK) will have gK*(gCount-gK)
// pairs between them; those between g and the items passed over below next
// sum to cut, every other one scores at least gMinPair. The total is
// score(mask) minus that cut.
func (p *partitioner) cutPrunes(g uint64, next int, cut int) bool {
	pc := bits.OnesCount64(g)
	below := p.gMask
	if next < 64 {
		below &= 1<<uint(next) - 1
	}
	sc := bits.OnesCount64(below) - pc
	total := p.gScore - cut - (p.gK*(p.gCount-p.gK)-pc*sc)*p.gMinPair
	if p.gFind {
		return total < p.gTarget
	}
	return total <= max(p.gFloor, p.gBestExact)
}

// solve returns f(mask) and true when f(mask) > alpha; otherwise it returns
// an upper bound <= alpha and false.
func (p *partitioner) solve(mask uint64, alpha int, depth int) (int, bool) {
	if mask == 0 {
		return 0, true
	}
	if v, ok := p.finalGroup(mask); ok {
		return v, v > alpha
	}
	if e, ok := p.memo[mask]; ok {
		if e.exact {
			return e.v, e.v > alpha
		}
		if e.v <= alpha {
			return e.v, false
		}
	}
	if ub := p.stateBound2(mask) / 2; ub <= alpha {
		p.memo[mask] = memoEntry{v: ub}
		return ub, false
	}
	for len(p.bufs) <= depth {
		p.bufs = append(p.bufs, nil)
	}
	// Exact candidates need no search; the others are tried most promising
	// first so the threshold rises early. The order only affects speed: the
	// value is the exact maximum either way.
	open, best := p.expand(p.bufs[depth][:0], mask, true, alpha) // stateBound2 above filled p.dyn
	// Drop what cannot beat the threshold before sorting the rest.
	floor, kept := max(alpha, best), open[:0]
	for _, c := range open {
		if c.bound/2 > floor {
			kept = append(kept, c)
		}
	}
	open = kept
	slices.SortFunc(open, func(a, b candidate) int { return b.bound - a.bound })
	p.bufs[depth] = open

	for i := 0; i < len(open); i++ {
		c := open[i]
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
//
// A greedy dive first finds a good partition, so that the exact search
// starts with its value as the threshold instead of solving its first
// subproblems with none.
func (p *partitioner) value(mask uint64) int {
	alpha := infeasible - 1
	if l := p.dive(mask); l != infeasible {
		alpha = l - 1
	}
	v, ok := p.solve(mask, alpha, 0)
	if !ok {
		return infeasible
	}
	return v
}

// dive returns the value of a greedy partition of mask (infeasible if it
// finds none): at each state it takes the group with the highest bound.
func (p *partitioner) dive(mask uint64) int {
	total, fallback := 0, infeasible
	for mask != 0 {
		if v, ok := p.finalGroup(mask); ok {
			if v == infeasible {
				break
			}
			return max(fallback, total+v)
		}
		p.stateBound2(mask)
		open, bestExact := p.expand(p.recon[:0], mask, true, infeasible-1)
		p.recon = open
		if bestExact != infeasible {
			fallback = max(fallback, total+bestExact)
		}
		bi := -1
		for i := range open {
			if bi < 0 || open[i].bound > open[bi].bound {
				bi = i
			}
		}
		if bi < 0 {
			break
		}
		total += open[bi].score
		mask &^= open[bi].g
	}
	return fallback
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
		open, first, ok := p.find(p.recon[:0], mask, target)
		p.recon = open
		slices.SortFunc(open, func(a, b candidate) int { return p.lexCompare(a.g, b.g) })
		chosen, found := first, ok
		for _, c := range open {
			if ok && p.lexCompare(c.g, first.g) > 0 {
				break
			}
			need := target - c.score
			if v, solved := p.solve(mask&^c.g, need-1, 0); solved && v == need {
				chosen, found = c, true
				break
			}
		}
		if !found {
			panic("topology: partition reconstruction lost the optimum") // cannot happen: f(mask) is attained
		}
		partition = append(partition, chosen.g)
		mask, target = mask&^chosen.g, target-chosen.score
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
