// Command slotsmodel is a model of how the fleet safeguard's nodes find
// free slots when each reads only a few buckets of them (package
// safeguard, docs/fleet.md "What a refusal means"): how many slots a wave
// of faulting nodes leaves free beside refused nodes, and how many
// resyncs of the refused nodes it takes to use them, with and without
// the full-bucket hint. It models, it does not run the protocol: nodes
// arrive one at a time and see every earlier node's writes at once (no
// races, no lag of the hint), each probes two random slots, then lists
// two buckets (the hint's open ones first, with the hint), is refused,
// and, with the hint, asks again on its own up to four times while the
// hint leaves a bucket open, then reads one more bucket per resync. The fleet simulation and the
// real-apiserver tests measure the protocol itself.
package main

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
)

const bucketSize = 16

func main() {
	var (
		trials = flag.Int("trials", 200, "waves per configuration")
		seed   = flag.Uint64("seed", 1, "random seed")
	)
	flag.Parse()
	rng := rand.New(rand.NewPCG(*seed, *seed))
	fmt.Println("| fleet | K | faulting | hint | waves leaving slots free | slots free after the wave (mean, max) | resyncs to use them (mean, max) |")
	fmt.Println("|---|---|---|---|---|---|---|")
	for _, n := range []int{1000, 3000, 7500} {
		k := n / 5
		for _, f := range []int{k * 9 / 10, k, k + 20, k * 3 / 2} {
			for _, hint := range []bool{false, true} {
				var left, freeSum, freeMax, rsSum, rsMax int
				for range *trials {
					free, rs := wave(rng, k, f, hint)
					if free > 0 {
						left++
					}
					freeSum, freeMax = freeSum+free, max(freeMax, free)
					rsSum, rsMax = rsSum+rs, max(rsMax, rs)
				}
				fmt.Printf("| %d | %d | %d | %v | %d of %d | %.2f, %d | %.1f, %d |\n", n, k, f, hint, left, *trials,
					float64(freeSum)/float64(*trials), freeMax, float64(rsSum)/float64(*trials), rsMax)
			}
		}
	}
}

// model is one wave's slots and hint.
type model struct {
	rng  *rand.Rand
	k    int
	held []bool
	full map[int]bool // the hint: buckets found full
	hint bool
}

func (m *model) buckets() int { return (m.k + bucketSize - 1) / bucketSize }

// look lists bucket b: takes a random free slot (true), and marks the
// bucket in the hint when it is full afterwards.
func (m *model) look(b int) bool {
	var free []int
	for i := b * bucketSize; i < min((b+1)*bucketSize, m.k); i++ {
		if !m.held[i] {
			free = append(free, i)
		}
	}
	if len(free) > 0 {
		m.held[free[m.rng.IntN(len(free))]] = true
	}
	if len(free) <= 1 {
		m.full[b] = true
	} else {
		delete(m.full, b)
	}
	return len(free) > 0
}

// pick is an unread bucket: one the hint leaves open first (with the
// hint), -1 when all were read.
func (m *model) pick(read map[int]bool) int {
	var unread, open []int
	for b := range m.buckets() {
		if read[b] {
			continue
		}
		unread = append(unread, b)
		if !m.full[b] {
			open = append(open, b)
		}
	}
	if m.hint && len(open) > 0 {
		return open[m.rng.IntN(len(open))]
	}
	if len(unread) == 0 {
		return -1
	}
	return unread[m.rng.IntN(len(unread))]
}

// ask reads up to looks more buckets; true when it took a slot.
func (m *model) ask(read map[int]bool, looks int) bool {
	for range looks {
		b := m.pick(read)
		if b < 0 {
			return false
		}
		read[b] = true
		if m.look(b) {
			return true
		}
	}
	return false
}

// wave runs f faulting nodes against k slots and returns the slots left
// free after the wave (of those the wave could use) and the resyncs it
// took to use them.
func wave(rng *rand.Rand, k, f int, hint bool) (free, resyncs int) {
	m := &model{rng: rng, k: k, held: make([]bool, k), full: map[int]bool{}, hint: hint}
	var refused []map[int]bool // one per refused node
	for range f {
		took := false
		for _, p := range rng.Perm(k)[:min(2, k)] {
			if !m.held[p] {
				m.held[p], took = true, true
				break
			}
		}
		if took {
			continue
		}
		if !m.ask(map[int]bool{}, 2) {
			refused = append(refused, nil)
		}
	}
	if hint {
		// The refused nodes' own asks after the wave: up to four rounds,
		// each while the hint leaves a bucket open.
		for round := 0; round < 4 && len(m.full) < m.buckets(); round++ {
			refused = slices.DeleteFunc(refused, func(map[int]bool) bool { return m.ask(map[int]bool{}, 1) })
		}
	}
	usable := func() int {
		n := 0
		for _, h := range m.held {
			if h {
				n++
			}
		}
		return min(k, f) - n
	}
	free = usable()
	for usable() > 0 && len(refused) > 0 && resyncs < 1000 {
		resyncs++
		// Each ask reads afresh: the bucket read, like the first ask's, may
		// be one read before.
		refused = slices.DeleteFunc(refused, func(map[int]bool) bool { return m.ask(map[int]bool{}, 1) })
	}
	return free, resyncs
}
