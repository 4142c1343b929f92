package safeguard

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// BucketLabel is the label every slot Lease carries beside SlotLabel: its
// bucket, index / BucketSize, so that one LIST or watch selecting both
// labels reads one bucket of slots instead of all K.
const BucketLabel = "gpu-node-agent.io/taint-slot-bucket"

// BucketSize is how many consecutive slots a bucket holds: slot i is in
// bucket i / BucketSize. A bucket's LIST reads at most this many Leases
// (12-13 KiB in protobuf, measured) however large the fleet.
//
// A Lease labelled by another bucket numbering (an agent of another
// version) only makes its slot look absent to a bucket's reader, whose
// Create then fails with AlreadyExists: never a second holder.
const BucketSize = 16

// How many buckets a node without a slot lists on one Acquire: after its
// probes missed (firstLooks), and when asking again while refused
// (againLooks, besides reading the bucket it follows from its watch). A
// refused node lists again only lookGap after it last listed, or on an
// ask of its own (see againDelay): the asks that come sooner (its own
// Node's update after the refusal, a slot freed in the bucket it
// follows) read only that bucket, from its watch. Resyncs come later.
// Measured in the fleet simulation, the ask right after a refusal listed
// one bucket per refused node and found a free slot in under 1% of them.
const (
	firstLooks = 2
	againLooks = 1
	lookGap    = againDelay / 2
)

// A refused node that the full-bucket hint leaves buckets to read asks
// again on its own, up to againAsks times while the hint still does: the
// n-th ask (n from 0) comes between half of againDelay<<n and all of it
// after the refusal that scheduled it (4-8 s, 8-16 s, 16-32 s, 32-64 s).
// Each such ask reads one bucket the hint leaves open and marks it when
// it is full, so the open buckets shrink with every round of the refused
// nodes' asks until a slot is found or the hint marks every bucket full;
// coming when a wave has settled, they find the last free slots of a wave
// at the limit. It costs at most againAsks buckets more per refused node,
// whatever the fleet's size, and nothing once the hint is complete.
const (
	againDelay = 8 * time.Second
	againAsks  = 4
)

func bucketOf(index int) int { return index / BucketSize }

// bucketCount is how many buckets hold the slots under k.
func bucketCount(k int) int { return (k + BucketSize - 1) / BucketSize }

// bucketSelector selects bucket b's slot Leases.
func (s *Slots) bucketSelector(b int) string {
	return labels.Set{SlotLabel: s.cfg.Prefix, BucketLabel: strconv.Itoa(b)}.String()
}

// view is what one Acquire has read of the slots.
type view struct {
	// leases are the slots read, by index: an index is known only when
	// leases has it (a nil value: read, and absent).
	leases map[int]*coordinationv1.Lease
	// busy are the indices found occupied (unexpired, or the holder's
	// Node tainted) or lost to another node; lost are the buckets in
	// which this node lost a race for a free slot.
	busy map[int]bool
	lost []int
	// mine are Leases of ours found in a bucket (a Create whose answer
	// was lost): the first is renewed, the rest released.
	mine []*coordinationv1.Lease
	// read are the buckets read, in order; listed are the LISTs of those
	// this Acquire listed (not read from the followed bucket's cache), by
	// bucket.
	read   []int
	listed map[int]*coordinationv1.LeaseList
}

func newView() *view {
	return &view{leases: map[int]*coordinationv1.Lease{}, busy: map[int]bool{}, listed: map[int]*coordinationv1.LeaseList{}}
}

// indices are the indices under k whose state v knows, in order.
func (v *view) indices(k int) []int {
	var out []int
	for i := range v.leases {
		if i < k {
			out = append(out, i)
		}
	}
	slices.Sort(out)
	return out
}

// slots are the Leases v read, sorted by index.
func (v *view) slots() []slotState {
	var out []slotState
	for i, l := range v.leases {
		if l != nil {
			out = append(out, slotState{index: i, lease: l})
		}
	}
	slices.SortFunc(out, func(a, b slotState) int { return a.index - b.index })
	return out
}

// addBucket records bucket b as read: its Leases, every other index of it
// absent.
func (v *view) addBucket(b int, leases []*coordinationv1.Lease, prefix string) {
	v.read = append(v.read, b)
	for i := b * BucketSize; i < (b+1)*BucketSize; i++ {
		if _, ok := v.leases[i]; !ok {
			v.leases[i] = nil
		}
	}
	for _, l := range leases {
		if i := slotIndex(prefix, l.Name); i >= 0 {
			v.leases[i] = l
		}
	}
}

// lookAround is Acquire for a node that knows it holds no slot and whose
// probes, if any, missed: it reads buckets of slots, not all K. First the
// bucket it follows (its watch's cache, no request), then up to
// firstLooks random buckets (againLooks when it was refused before), one
// LIST each, taking an absent or free slot of each with the same atomic
// writes as ever. With more buckets than that, it picks them among those
// the full-bucket hint (one small Lease, see fullHint) neither marks
// full nor claims (a node refused before, only among those), and writes
// what it found into the hint. Finding no free slot, it is refused and
// follows one bucket with a watch (see refuse), so that a
// slot freed there is taken as soon as Room says so; a later ask lookGap
// or more after its last LIST, or of its own, reads one more bucket
// (claimed in the hint first, see claimBucket), and a refused node
// whose hint still left buckets open asks again on its own after the
// wave (askAgainLater), until the hint marks every bucket full, so that a
// slot free in a bucket no refused node follows is found too.
//
// A refusal here means "no free slot among those read", not "all K
// occupied": it can only err towards refusing, never past K. How often a
// slot is left free beside a refused node, and for how long, is measured
// in docs/fleet.md.
//
// The fleet size comes from this node's cache, from the records on the
// Leases read (recordQuorum of them), or a measurement; without a fresh
// size of its own the node first lists one bucket (under the K of the
// largest size it knows, bucket 0 when it knows none) for their records.
func (s *Slots) lookAround(ctx context.Context) (Decision, error) {
	v := newView()
	followed := -1
	if f := s.following(); f != nil && f.addTo(v, s.cfg, s.node) {
		followed = f.bucket
	}
	looks := firstLooks
	own := s.againDue.Swap(false)
	if s.refused {
		looks = againLooks
		if !own && s.now().Sub(s.listedAt) < lookGap {
			looks = 0
		}
	}
	var listed []int
	if !s.freshCache() && len(v.leases) == 0 {
		b := s.randIntN(bucketCount(Limit(max(s.fleet, 1), s.cfg.MaxFraction)))
		if err := s.listBucket(ctx, b, v); err != nil {
			return Decision{Slot: -1}, err
		}
		listed, looks = append(listed, b), looks-1
	}
	d, refuse, err := s.limitFrom(ctx, v)
	if err != nil {
		return Decision{Slot: -1}, err
	}
	if refuse {
		return s.refuse(ctx, d, v), nil
	}
	var hint *fullHint
	for {
		if len(v.mine) > 0 {
			mine := v.mine
			v.mine = nil
			held, err := s.adopt(ctx, mine)
			if err != nil {
				return Decision{Slot: -1}, err
			}
			if held {
				return Decision{Held: true, Slot: slotIndex(s.cfg.Prefix, s.held.Name)}, nil
			}
		}
		won, err := s.takeFrom(ctx, &d, v, v.indices(d.Limit))
		if err != nil {
			return Decision{Slot: -1}, err
		}
		if won {
			s.updateHint(ctx, hint, v, d)
			return d, nil
		}
		if looks == 0 {
			break
		}
		if hint == nil && bucketCount(d.Limit) > firstLooks {
			// With more buckets than one ask reads, look first where no
			// node found every slot taken.
			hint = s.readHint(ctx)
		}
		// A node refused before reads only a bucket the hint leaves open:
		// in a wave well past the limit the hint soon marks every bucket,
		// and its asks then cost the followed bucket's cache and the hint.
		// A mark gone wrong (a clear lost) hides a bucket from refused
		// nodes until it expires (hintTTL), or a node asking for the
		// first time reads it.
		b := s.pickBucket(d.Limit, v, hint, s.refused)
		if b < 0 {
			break
		}
		// Claim b so that other refused nodes asking now look elsewhere;
		// while the API server sheds writes, look on the next own ask
		// instead (openUnread schedules it, b being unread).
		if s.refused && hint != nil && !s.claimBucket(ctx, hint, b) {
			break
		}
		if err := s.listBucket(ctx, b, v); err != nil {
			return Decision{Slot: -1}, err
		}
		listed, looks = append(listed, b), looks-1
	}
	if len(listed) > 0 {
		s.listedAt = s.now()
	}
	s.updateHint(ctx, hint, v, d)
	s.log.Debug("no free taint slot among those read", "node", s.node, "limit", d.Limit, "followed", followed, "listed", listed)
	d = s.refuse(ctx, d, v)
	if hint != nil && hint.openUnread(bucketCount(d.Limit), v) {
		// The hint leaves buckets open that this node did not read: they
		// may hold the last free slots of a wave (nodes that took slots by
		// probing marked nothing). Ask again once the other nodes have
		// marked more.
		s.askAgainLater()
	}
	return d, nil
}

// askAgainLater signals Room once, later (see againDelay), unless an ask
// of its own is pending already or this node made againAsks of them
// since it last held or released a slot. Taking a slot or releasing
// cancels it.
func (s *Slots) askAgainLater() {
	if s.againPending.Load() || s.againCount >= againAsks {
		return
	}
	d := s.againAfter(s.againCount)
	s.againCount++
	s.againPending.Store(true)
	s.againTimer = time.AfterFunc(d, func() {
		s.againPending.Store(false)
		s.againDue.Store(true)
		s.signalRoom()
	})
}

// againAfterDefault is when the n-th own ask comes: between half of
// againDelay<<n and all of it.
func (s *Slots) againAfterDefault(n int) time.Duration {
	d := againDelay << n
	return d/2 + s.jitter(d/2)
}

// stopAgain cancels a pending askAgainLater and allows againAsks more.
func (s *Slots) stopAgain() {
	if s.againTimer != nil {
		s.againTimer.Stop()
		s.againTimer = nil
	}
	s.againPending.Store(false)
	s.againDue.Store(false)
	s.againCount = 0
}

// updateHint notes in hint (when this Acquire read it) which buckets it
// read were full and which were not, and writes the changes.
func (s *Slots) updateHint(ctx context.Context, hint *fullHint, v *view, d Decision) {
	if hint == nil {
		return
	}
	for _, b := range v.read {
		if b >= bucketCount(d.Limit) {
			continue
		}
		full := true
		for i := b * BucketSize; i < min((b+1)*BucketSize, d.Limit); i++ {
			if !v.busy[i] && !(d.Held && i == d.Slot) {
				full = false
				break
			}
		}
		hint.note(b, full)
	}
	if len(hint.marked)+len(hint.cleared) > 0 {
		s.log.Debug("full-bucket hint updated", "node", s.node, "marked", sortedBuckets(hint.marked), "cleared", sortedBuckets(hint.cleared))
	}
	s.publishHint(ctx, hint)
}

// listBucket reads bucket b's slot Leases (one LIST) into v.
func (s *Slots) listBucket(ctx context.Context, b int, v *view) error {
	sel := s.bucketSelector(b)
	list, err := s.client.CoordinationV1().Leases(s.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return fmt.Errorf("list taint slot leases %s in %s: %w", sel, s.cfg.Namespace, err)
	}
	v.listed[b] = list
	leases := make([]*coordinationv1.Lease, 0, len(list.Items))
	for i := range list.Items {
		l := &list.Items[i]
		if leaseHolder(l) == s.node {
			v.mine = append(v.mine, l)
			continue
		}
		leases = append(leases, l)
	}
	v.addBucket(b, leases, s.cfg.Prefix)
	return nil
}

// pickBucket is a random bucket under k that v has not read, one the
// hint neither marks full nor claims when there is one; -1 when v read
// them all, or, with openOnly, when the hint marks or claims every one it
// did not read.
func (s *Slots) pickBucket(k int, v *view, hint *fullHint, openOnly bool) int {
	var unread, open []int
	for b := range bucketCount(k) {
		if _, read := v.leases[b*BucketSize]; read {
			continue
		}
		unread = append(unread, b)
		if hint == nil || !hint.full[b] && !hint.claimed[b] {
			open = append(open, b)
		}
	}
	if len(open) > 0 {
		return open[s.randIntN(len(open))]
	}
	if len(unread) == 0 || openOnly && hint != nil {
		return -1
	}
	return unread[s.randIntN(len(unread))]
}

// takeFrom tries to take a free slot among indices (all under d.Limit):
// absent, or expired with its holder untainted (one GET of the Node per
// expired Lease). It tries up to maxSlotWrites of them starting at a
// random one; a race lost marks that slot busy and its bucket lost. It
// counts the slots read into d (Seen, Occupied) and sets Held and Slot
// on a win.
func (s *Slots) takeFrom(ctx context.Context, d *Decision, v *view, indices []int) (bool, error) {
	var free []slotState
	for _, i := range indices {
		if v.busy[i] {
			continue
		}
		l := v.leases[i]
		if l == nil {
			free = append(free, slotState{index: i})
			continue
		}
		busy, err := s.occupied(ctx, l)
		if err != nil {
			return false, err
		}
		if busy {
			v.busy[i] = true
		} else {
			free = append(free, slotState{index: i, lease: l})
		}
	}
	if len(free) > 0 {
		start := s.randIntN(len(free))
		for n := range min(maxSlotWrites, len(free)) {
			c := free[(start+n)%len(free)]
			won, err := s.take(ctx, c)
			if err != nil {
				return false, err
			}
			if won {
				d.Held, d.Slot = true, c.index
				s.count(d, v)
				s.log.Info("took taint slot", "node", s.node, "slot", c.index, "limit", d.Limit, "fleet", d.Fleet,
					"occupied", d.Occupied, "read", d.Seen)
				return true, nil
			}
			v.busy[c.index] = true
			if b := bucketOf(c.index); !slices.Contains(v.lost, b) {
				v.lost = append(v.lost, b)
			}
		}
	}
	s.count(d, v)
	return false, nil
}

// count sets d's Seen and Occupied from v.
func (s *Slots) count(d *Decision, v *view) {
	d.Seen, d.Occupied = 0, 0
	for _, i := range v.indices(d.Limit) {
		d.Seen++
		if v.busy[i] {
			d.Occupied++
		}
	}
}

// refuse records a refusal and makes this node follow a bucket of the
// slots: one where it lost a race, since a slot may still be free there
// (following it from now on, its watch's first state signals Room for
// the slots absent in it, so the node asks again at once, from the
// watch's cache); else the one it follows already; else one it read, at
// random. A new watch starts from this Acquire's LIST of the bucket.
func (s *Slots) refuse(ctx context.Context, d Decision, v *view) Decision {
	s.refused = true
	if d.Limit <= 0 {
		return d
	}
	n := bucketCount(d.Limit)
	f := s.following()
	var lost, read []int
	for b := range n {
		if slices.Contains(v.lost, b) {
			lost = append(lost, b)
		}
		if _, ok := v.leases[b*BucketSize]; ok {
			read = append(read, b)
		}
	}
	switch {
	case f != nil && f.bucket < n && (len(lost) == 0 || slices.Contains(lost, f.bucket)):
		f.setLimit(d.Limit)
	case len(lost) > 0:
		b := lost[s.randIntN(len(lost))]
		s.followBucket(ctx, b, d.Limit, v.listed[b])
	case len(read) > 0:
		b := read[s.randIntN(len(read))]
		s.followBucket(ctx, b, d.Limit, v.listed[b])
	default:
		s.followBucket(ctx, s.randIntN(n), d.Limit, nil)
	}
	return d
}
