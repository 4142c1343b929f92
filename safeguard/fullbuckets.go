package safeguard

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// FullBucketsAnnotation prefixes the annotations of the full-bucket
// hint, the Lease <Prefix>-full: annotation <prefix><g> holds, as two hex
// digits, the buckets 8g..8g+7 nodes last found without a free slot (bit
// j for bucket 8g+j), then "@" and when it was written (Unix seconds),
// e.g. "05@1796000000". One annotation per 8 buckets (12 at K = 1,500)
// keeps the hint small, and lets nodes write different groups at once
// without overwriting one another.
const FullBucketsAnnotation = "gpu-node-agent.io/full-buckets-"

// HintReleasedAnnotation is the hint's annotation saying when a slot was
// last released (Unix seconds): a group of marks dated no later than
// that marks no bucket, since the release may have freed a slot in any of
// them. Every node releasing a slot writes it, unless it already says as
// late, so that a recovery of hundreds of nodes writes it about once a
// second, and no write waits on another: it is one value, last writer
// wins, and every writer writes about the same time.
const HintReleasedAnnotation = "gpu-node-agent.io/slots-released-at"

// hintTTL is how long a group of the hint counts: an older one marks no
// bucket, so that the marks of a wave that has passed (its slots since
// released) do not steer the next. It outlasts a wave and its refused
// nodes' own asks (the last at most 2 min after the refusal, see
// againDelay).
const hintTTL = 3 * time.Minute

// hintGroup is how many buckets one annotation of the hint holds.
const hintGroup = 8

// hintDelay bounds the random delay before a node writes what it found
// into the hint (publishHint), hintTimeout the whole write.
const (
	hintDelay   = time.Second
	hintTimeout = 10 * time.Second
)

// hintFieldManager owns the hint's annotations, whichever node writes
// them, so that its managedFields stay one entry.
const hintFieldManager = "gpu-node-agent-safeguard"

// fullHint is the full-bucket hint as one Acquire read it: which buckets
// to look in first. It is only a hint: a slot is still taken by Create or
// a resourceVersion-guarded Update, whatever the hint says, so a wrong
// hint can cost a look, never a slot too many.
//
// Why: a node that reads a few random buckets of many finds the last free
// slots of a fleet at its limit only by luck (at K = 1,500, 94 buckets, a
// mass fault of exactly K nodes leaves about 34 of them refused beside as
// many free slots in test/cmd/slotsmodel's model of the protocol without
// the hint, none with it). Nodes that find a bucket full mark it, and the
// next nodes look first in the buckets no one marked. Its size is one bit
// per bucket, in annotations of 8 buckets each. A node's credentials,
// however misused, can only make the others look elsewhere first.
//
// A node that releases a slot expires every mark made before (see
// HintReleasedAnnotation, noteRelease): a mark left on a bucket with free
// slots would keep the refused nodes of the next wave from looking there,
// and a wave of exactly K faulting nodes would leave slots free beside
// refused nodes. Clearing only the released slot's bucket, with writes
// guarded by the resourceVersion so that none is lost, made the hint a
// hot spot in a recovery: at 3,000 nodes, 600 releases at once made 1,981
// PATCHes of which 1,967 were Conflicts, and the clears given up on hid
// 35 free slots from the next wave.
//
// Marks are merge patches of whole groups, last writer wins: nodes
// writing the same group at once may lose one another's marks. While a
// wave takes slots (none freed), a bucket found full stays full, so a
// lost mark costs a look, and the refused nodes' own asks find it again.
// Guarding marks with the resourceVersion would keep every one, but cost
// more than the looks it saves: measured at 3,000 nodes, 2-3 Conflicts
// and re-reads per writing node, more hint requests than bucket LISTs. A
// mark that outlives a release all the same (written from a read older
// than the release, or by a node whose clock runs ahead) expires with
// its group (hintTTL).
type fullHint struct {
	lease *coordinationv1.Lease // nil: absent
	full  map[int]bool
	// released is when a slot was last released (HintReleasedAnnotation,
	// Unix seconds; 0 when never).
	released int64
	// marked and cleared are the changes this Acquire found.
	marked, cleared map[int]bool
}

func (s *Slots) hintName() string { return s.cfg.Prefix + "-full" }

// readHint reads the hint (one GET, from kube-apiserver's watch cache:
// resourceVersion "0"; a hint a moment old serves as well). A hint that
// cannot be read is an empty one: it only orders the looks.
func (s *Slots) readHint(ctx context.Context) *fullHint {
	h, err := s.getHint(ctx, "0")
	if err != nil {
		s.log.Debug("full-bucket hint not read; looking at random", "node", s.node, "err", err)
		return emptyHint()
	}
	return h
}

func emptyHint() *fullHint {
	return &fullHint{full: map[int]bool{}, marked: map[int]bool{}, cleared: map[int]bool{}}
}

// getHint reads the hint at resourceVersion rv ("0": the watch cache,
// "": the latest); absent is an empty hint with a nil lease.
func (s *Slots) getHint(ctx context.Context, rv string) (*fullHint, error) {
	h := emptyHint()
	l, err := s.client.CoordinationV1().Leases(s.cfg.Namespace).Get(ctx, s.hintName(), metav1.GetOptions{ResourceVersion: rv})
	if apierrors.IsNotFound(err) {
		return h, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get full-bucket hint %s: %w", s.hintName(), err)
	}
	h.lease = l
	h.full, h.released = decodeBuckets(l.Annotations, s.now())
	return h, nil
}

// openUnread says whether a bucket under n is neither marked full (by
// the hint or this Acquire) nor read by v.
func (h *fullHint) openUnread(n int, v *view) bool {
	for b := range n {
		if _, read := v.leases[b*BucketSize]; read {
			continue
		}
		if !h.full[b] && !h.marked[b] {
			return true
		}
	}
	return false
}

// note records what bucket b showed: full (no free slot left under K
// once this node took its own) or not.
func (h *fullHint) note(b int, full bool) {
	switch {
	case full && !h.full[b]:
		h.marked[b] = true
	case !full && h.full[b]:
		h.cleared[b] = true
	}
}

// publishHint writes what this Acquire found into the hint, later and
// only if it is still news: after a random delay of up to hintDelay it
// reads the hint again (from the watch cache) and writes the buckets that
// the hint does not show as found yet. Nodes that find the same buckets
// full at once (the end of a mass fault: hundreds of them) then write it
// once or a few times, not each, so that the one Lease is no hot spot. It
// runs on its own goroutine, the Acquire that found it returned.
func (s *Slots) publishHint(ctx context.Context, h *fullHint) {
	if len(h.marked) == 0 && len(h.cleared) == 0 {
		return
	}
	marked, cleared := maps.Clone(h.marked), maps.Clone(h.cleared)
	s.laterHint(ctx, func(ctx context.Context, fresh *fullHint) error {
		for b := range marked {
			if !fresh.full[b] {
				fresh.marked[b] = true
			}
		}
		for b := range cleared {
			if fresh.full[b] {
				fresh.cleared[b] = true
			}
		}
		return s.writeHint(ctx, fresh)
	})
}

// noteRelease expires the hint's marks made before now, later (see
// HintReleasedAnnotation), when l, this node's slot, was just released:
// after a random delay of up to hintDelay it reads the hint (from the
// watch cache) and, when it marks a bucket and does not say a release
// this late, writes the release time. A fleet whose K fits in the buckets
// one ask reads never uses the hint, and skips it (K from this node's
// fleet size, else the one recorded on l).
func (s *Slots) noteRelease(ctx context.Context, l *coordinationv1.Lease) {
	n := s.fleet
	if r, ok := recordOf(l); n <= 0 && ok {
		n = r.n
	}
	if n > 0 && bucketCount(Limit(n, s.cfg.MaxFraction)) <= firstLooks {
		return
	}
	at := s.now().Unix()
	s.laterHint(ctx, func(ctx context.Context, fresh *fullHint) error {
		if fresh.lease == nil || len(fresh.full) == 0 || fresh.released >= at {
			return nil
		}
		patch, err := json.Marshal(map[string]any{
			"metadata": map[string]any{"annotations": map[string]string{HintReleasedAnnotation: strconv.FormatInt(at, 10)}},
			"spec":     map[string]any{"holderIdentity": s.node},
		})
		if err != nil {
			return err
		}
		_, err = s.client.CoordinationV1().Leases(s.cfg.Namespace).Patch(ctx, s.hintName(), types.MergePatchType, patch,
			metav1.PatchOptions{FieldManager: hintFieldManager})
		if apierrors.IsNotFound(err) {
			// Gone since: no mark to expire.
			return nil
		}
		return err
	})
}

// laterHint runs write on the hint as read (from the watch cache) after
// a random delay of up to hintDelay, on its own goroutine, within
// hintTimeout. Failing is only logged: the hint only orders the looks.
func (s *Slots) laterHint(ctx context.Context, write func(ctx context.Context, fresh *fullHint) error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), hintTimeout)
	s.hintWrites.Go(func() {
		defer cancel()
		if err := s.hintWait(ctx); err != nil {
			return
		}
		fresh, err := s.getHint(ctx, "0")
		if err == nil {
			err = write(ctx, fresh)
		}
		if err != nil {
			s.log.Debug("full-bucket hint not written", "node", s.node, "err", err)
		}
	})
}

// writeHint writes h's news into the hint: for each group of 8 buckets
// it changes, the group as h read it with the marks and clears, dated
// now, in one JSON merge patch (Create when h read none; either finds
// the other case when another node created or deleted it since).
// Nothing to write is success.
func (s *Slots) writeHint(ctx context.Context, h *fullHint) error {
	if len(h.marked) == 0 && len(h.cleared) == 0 {
		return nil
	}
	full := maps.Clone(h.full)
	groups := map[int]bool{}
	for b := range h.marked {
		full[b], groups[b/hintGroup] = true, true
	}
	for b := range h.cleared {
		delete(full, b)
		groups[b/hintGroup] = true
	}
	annotations := map[string]string{}
	for g := range groups {
		annotations[FullBucketsAnnotation+strconv.Itoa(g)] = encodeGroup(full, g, s.now())
	}
	leases := s.client.CoordinationV1().Leases(s.cfg.Namespace)
	// The writer is its holder: the admission policy lets a node write
	// only Leases it holds.
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"annotations": annotations},
		"spec":     map[string]any{"holderIdentity": s.node},
	})
	if err != nil {
		return err
	}
	create := func() error {
		l := &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: s.hintName(), Namespace: s.cfg.Namespace, Annotations: annotations},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: &s.node},
		}
		_, err := leases.Create(ctx, l, metav1.CreateOptions{FieldManager: hintFieldManager})
		return err
	}
	update := func() error {
		_, err := leases.Patch(ctx, s.hintName(), types.MergePatchType, patch, metav1.PatchOptions{FieldManager: hintFieldManager})
		return err
	}
	if h.lease == nil {
		if err = create(); apierrors.IsAlreadyExists(err) {
			err = update()
		}
	} else if err = update(); apierrors.IsNotFound(err) {
		err = create()
	}
	return err
}

// encodeGroup is group g of full as two hex digits, dated at.
func encodeGroup(full map[int]bool, g int, at time.Time) string {
	var by byte
	for j := range hintGroup {
		if full[g*hintGroup+j] {
			by |= 1 << j
		}
	}
	return hex.EncodeToString([]byte{by}) + "@" + strconv.FormatInt(at.Unix(), 10)
}

// FullBuckets are the buckets the hint l marks full as of now, in order
// (for tools and tests; nil when l is nil).
func FullBuckets(l *coordinationv1.Lease, now time.Time) []int {
	if l == nil {
		return nil
	}
	full, _ := decodeBuckets(l.Annotations, now)
	return sortedBuckets(full)
}

// decodeBuckets reads the hint's annotations as of now: the buckets
// marked full, and when a slot was last released. A group that does not
// parse, has no date, is dated no later than the last release, or is
// dated hintTTL or more from now (either way: a date that far ahead
// comes from a clock that does not agree with ours) marks no bucket.
func decodeBuckets(annotations map[string]string, now time.Time) (full map[int]bool, released int64) {
	full = map[int]bool{}
	if r, err := strconv.ParseInt(annotations[HintReleasedAnnotation], 10, 64); err == nil && r > 0 {
		released = r
	}
	for k, v := range annotations {
		rest, ok := strings.CutPrefix(k, FullBucketsAnnotation)
		if !ok {
			continue
		}
		g, err := strconv.Atoi(rest)
		bits, date, dated := strings.Cut(v, "@")
		by, herr := hex.DecodeString(bits)
		sec, derr := strconv.ParseInt(date, 10, 64)
		if err != nil || g < 0 || strconv.Itoa(g) != rest || herr != nil || len(by) != 1 || !dated || derr != nil {
			continue
		}
		if age := now.Sub(time.Unix(sec, 0)); age >= hintTTL || age <= -hintTTL || sec <= released {
			continue
		}
		for j := range hintGroup {
			if by[0]&(1<<j) != 0 {
				full[g*hintGroup+j] = true
			}
		}
	}
	return full, released
}

// sortedBuckets is set's buckets in order (for logs).
func sortedBuckets(set map[int]bool) []int {
	var out []int
	for b := range set {
		out = append(out, b)
	}
	slices.Sort(out)
	return out
}
