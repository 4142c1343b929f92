package safeguard

import (
	"context"
	"encoding/json"
	"errors"
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

// FullBucketAnnotation prefixes the annotations of the full-bucket
// hint, the Lease <Prefix>-full, that mark buckets: annotation
// full-<b> says when (Unix seconds) a node last found bucket b without a
// free slot, e.g. "full-12": "1796000000"; a bucket without one is not
// marked. One annotation per bucket, because a JSON merge patch merges
// annotations key by key: nodes marking buckets at once, whatever the
// buckets, never overwrite one another's marks. The keys carry no
// domain prefix because every node that reads the hint reads them all
// (22-23 bytes a mark in protobuf, 2.1 KiB at K = 1,500 with every bucket
// marked), and the hint is the agent's own object: no one else writes
// it.
const FullBucketAnnotation = "full-"

// ClaimAnnotation prefixes the hint's annotations that claim buckets:
// claim-<b> says when (Unix seconds) a refused node set out to list
// bucket b (see claimBucket). A claim counts for claimTTL at most; the
// node removes it once it has written what it found there.
const ClaimAnnotation = "claim-"

// claimTTL is how long a claim counts: much longer than a LIST and the
// write after it take, so that only a claim whose node failed to remove
// it expires.
const claimTTL = 30 * time.Second

// HintReleasedAnnotation is the hint's annotation saying when a slot was
// last released (Unix seconds): a mark dated no later than that marks no
// bucket, since the release may have freed a slot in any of them. A node
// releasing a slot writes it when a mark made before its release is
// left, so that a recovery of hundreds of nodes writes it about once a
// second, and no write waits on another: it is one value, last writer
// wins, and every writer writes about the same time.
const HintReleasedAnnotation = "gpu-node-agent.io/slots-released-at"

// hintTTL is how long a mark of the hint counts: an older one marks no
// bucket, so that the marks of a wave that has passed (its slots since
// released) do not steer the next. It outlasts a wave and its refused
// nodes' own asks (the last at most 2 min after the refusal, see
// againDelay).
const hintTTL = 3 * time.Minute

// hintDelay bounds the random delay before a node writes what it found
// into the hint (publishHint), hintTimeout the whole write; claimTimeout
// bounds a claim's write (claimBucket), retries after a 429 included.
const (
	hintDelay    = time.Second
	hintTimeout  = 10 * time.Second
	claimTimeout = time.Second
)

// hintFieldManager is the field manager of the hint's writes, whichever
// node writes it.
const hintFieldManager = "gpu-node-agent-safeguard"

// resetManagedFields, as an object's managedFields in a write other than
// an apply, makes kube-apiserver store it without them (see
// https://kubernetes.io/docs/reference/using-api/server-side-apply/#clearing-managedfields),
// and an object stored without them stays so through later such writes.
// Every write of the hint sends it: field tracking would repeat each of
// its annotation keys, doubling what every node reads of it, and nothing
// applies to the hint.
var resetManagedFields = []metav1.ManagedFieldsEntry{{}}

// fullHint is the full-bucket hint as one Acquire read it: which buckets
// to look in first. It is only a hint: a slot is still taken by Create or
// a resourceVersion-guarded Update, whatever the hint says, so a wrong
// hint can cost a look, never a slot too many.
//
// Why: a node that reads a few random buckets of many finds the last free
// slots of a fleet at its limit only by luck (at K = 1,500, 94 buckets, a
// mass fault of exactly K nodes leaves about 48 of them refused beside as
// many free slots in test/cmd/slotsmodel's model of the protocol without
// the hint, none with it). Nodes that find a bucket full mark it, and the
// next nodes look first in the buckets no one marked. Its size is one
// annotation per bucket marked (22-23 bytes each), its writes are
// merge patches without a resourceVersion that never conflict, and a
// node's credentials, however misused, can only make the others look
// elsewhere first.
//
// Marks are lossless: each is its own annotation, so two nodes marking
// at once keep both marks. A mark lost would cost every refused node that
// trusts the hint a LIST of that full bucket on each of its own asks: with
// one annotation per 8 buckets, written whole by the last writer, the
// fleet simulation at 3,000 nodes measured more than a thousand such
// LISTs per two waves, every one of a full bucket, against under a
// hundred at 1,000 nodes.
//
// A node that releases a slot expires every mark made before (see
// HintReleasedAnnotation, noteRelease): a mark left on a bucket with free
// slots would keep the refused nodes of the next wave from looking there,
// and a wave of exactly K faulting nodes would leave slots free beside
// refused nodes. Clearing only the released slot's bucket, with writes
// guarded by the resourceVersion so that none is lost, made the hint a
// hot spot in a recovery: at 3,000 nodes, 600 releases at once made 1,981
// PATCHes of which 1,967 were Conflicts, and the clears given up on hid
// 35 free slots from the next wave. A mark that outlives a release all
// the same (written from a read older than the release, or by a node
// whose clock runs ahead) expires after hintTTL.
type fullHint struct {
	lease *coordinationv1.Lease // nil: absent
	full  map[int]bool
	// released is when a slot was last released (HintReleasedAnnotation,
	// Unix seconds; 0 when never).
	released int64
	// claimed are the buckets claimed (ClaimAnnotation) less than
	// claimTTL ago.
	claimed map[int]bool
	// marked and cleared are the changes this Acquire found; claims are
	// the buckets it claimed, unclaim the claims to remove.
	marked, cleared, claims, unclaim map[int]bool
}

func (s *Slots) hintName() string { return s.cfg.Prefix + "-full" }

// readHint reads the hint (getHint). A hint that cannot be read is an
// empty one: it only orders the looks.
func (s *Slots) readHint(ctx context.Context) *fullHint {
	h, err := s.getHint(ctx)
	if err != nil {
		s.log.Debug("full-bucket hint not read; looking at random", "node", s.node, "err", err)
		return emptyHint()
	}
	return h
}

func emptyHint() *fullHint {
	return &fullHint{full: map[int]bool{}, claimed: map[int]bool{}, marked: map[int]bool{}, cleared: map[int]bool{},
		claims: map[int]bool{}, unclaim: map[int]bool{}}
}

// getHint reads the hint with one GET from kube-apiserver's watch cache
// (resourceVersion "0": a hint a moment old serves as well); absent is an
// empty hint with a nil lease.
func (s *Slots) getHint(ctx context.Context) (*fullHint, error) {
	h := emptyHint()
	l, err := s.client.CoordinationV1().Leases(s.cfg.Namespace).Get(ctx, s.hintName(), metav1.GetOptions{ResourceVersion: "0"})
	if apierrors.IsNotFound(err) {
		return h, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get full-bucket hint %s: %w", s.hintName(), err)
	}
	h.lease = l
	h.full, h.released = decodeBuckets(l.Annotations, s.now())
	h.claimed = decodeClaims(l.Annotations, s.now())
	return h, nil
}

// openUnread says whether a bucket under n is neither marked full (by
// the hint or this Acquire) nor read by v. A bucket another node claimed
// counts as open: that node may find a slot left there.
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
// once this node took its own) or not. A claim of this Acquire on b is
// removed with what it found.
func (h *fullHint) note(b int, full bool) {
	switch {
	case full && !h.full[b]:
		h.marked[b] = true
	case !full && h.full[b]:
		h.cleared[b] = true
	}
	if h.claims[b] {
		h.unclaim[b] = true
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
	if len(h.marked) == 0 && len(h.cleared) == 0 && len(h.unclaim) == 0 {
		return
	}
	marked, cleared, unclaim := maps.Clone(h.marked), maps.Clone(h.cleared), maps.Clone(h.unclaim)
	s.laterHint(ctx, func(ctx context.Context, fresh *fullHint) error {
		for b := range unclaim {
			if _, ok := fresh.lease.GetAnnotations()[claimKey(b)]; ok {
				fresh.unclaim[b] = true
			}
		}
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

// claimBucket claims bucket b in the hint now (ClaimAnnotation), before
// a refused node lists it, and records the claim in h, so that what the
// node finds there removes it (note, publishHint). Refused nodes do not
// list a bucket claimed, but keep asking on their own while one is
// (openUnread): the claimer may find a slot left there. It reports
// whether to list b now: not when the API server is shedding writes
// (429, or no answer within claimTimeout), since a claim that lands late
// keeps no one else off b; the node then looks on its next own ask. Any
// other failure leaves b unclaimed and listed, as without the hint.
//
// Why: the buckets a wave leaves open in the hint though full are few
// (their last slots taken by nodes that did not read them full), and the
// refused nodes' own asks come in a burst: every node asking before a
// mark of the first one to list such a bucket reaches the hint lists it
// too. Measured at 3,000 nodes without the claim, 58 own asks listed
// three full buckets within two seconds. With claims that client-go
// retried through the API server's 429s for up to 8 s, one wave's own
// asks listed one full bucket 60 times in 9 s: each claim landed only
// after the other nodes had read the hint without it.
func (s *Slots) claimBucket(ctx context.Context, h *fullHint, b int) bool {
	ctx, cancel := context.WithTimeout(ctx, claimTimeout)
	defer cancel()
	claim := &fullHint{lease: h.lease, claims: map[int]bool{b: true}}
	err := s.writeHint(ctx, claim)
	if err == nil {
		h.claims[b] = true
		return true
	}
	shed := apierrors.IsTooManyRequests(err) || apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) ||
		errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil
	s.log.Debug("full-bucket hint: bucket not claimed", "node", s.node, "bucket", b, "listed", !shed, "err", err)
	return !shed
}

// noteRelease expires the hint's marks made before now, later (see
// HintReleasedAnnotation), when l, this node's slot, was just released:
// after a random delay of up to hintDelay it reads the hint (from the
// watch cache) and, when it marks a bucket and does not say a release
// this late, writes the release time and removes the marks and claims
// dated no later. A fleet whose K fits in the buckets
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
		annotations := map[string]any{HintReleasedAnnotation: strconv.FormatInt(at, 10)}
		// The marks and claims it expires go too, and any annotation
		// of their prefixes that does not parse, so that the hint does
		// not keep a key per bucket between waves. A mark another node
		// wrote since the read is lost with them: it costs a look.
		for k, v := range fresh.lease.Annotations {
			if !strings.HasPrefix(k, FullBucketAnnotation) && !strings.HasPrefix(k, ClaimAnnotation) {
				continue
			}
			if _, sec, ok := parseMark(k, v); !ok || sec <= at {
				annotations[k] = nil
			}
		}
		err := s.patchHint(ctx, annotations)
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
		fresh, err := s.getHint(ctx)
		if err == nil {
			err = write(ctx, fresh)
		}
		if err != nil {
			s.log.Debug("full-bucket hint not written", "node", s.node, "err", err)
		}
	})
}

// writeHint writes h's news into the hint: each bucket marked or
// claimed, dated now, and each mark cleared or claim given up, removed,
// in one JSON merge patch of those annotations only (Create when h read
// none; either finds the other case when another node created or deleted
// it since). Nothing to write is success.
func (s *Slots) writeHint(ctx context.Context, h *fullHint) error {
	if len(h.marked) == 0 && len(h.cleared) == 0 && len(h.claims) == 0 && len(h.unclaim) == 0 {
		return nil
	}
	now := strconv.FormatInt(s.now().Unix(), 10)
	changes := map[string]any{}
	marks := map[string]string{}
	for b := range h.marked {
		changes[bucketKey(b)], marks[bucketKey(b)] = now, now
	}
	for b := range h.claims {
		changes[claimKey(b)], marks[claimKey(b)] = now, now
	}
	for b := range h.unclaim {
		changes[claimKey(b)] = nil
	}
	for b := range h.cleared {
		changes[bucketKey(b)] = nil
	}
	create := func() error {
		l := &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: s.hintName(), Namespace: s.cfg.Namespace, Annotations: marks,
				ManagedFields: resetManagedFields},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &s.node},
		}
		_, err := s.client.CoordinationV1().Leases(s.cfg.Namespace).Create(ctx, l, metav1.CreateOptions{FieldManager: hintFieldManager})
		return err
	}
	var err error
	if h.lease == nil {
		if err = create(); apierrors.IsAlreadyExists(err) {
			err = s.patchHint(ctx, changes)
		}
	} else if err = s.patchHint(ctx, changes); apierrors.IsNotFound(err) {
		err = create()
	}
	return err
}

// patchHint writes annotations (a nil value removes one) into the hint
// with one JSON merge patch, as its holder (the admission policy lets a
// node write only Leases it holds), without managedFields.
func (s *Slots) patchHint(ctx context.Context, annotations map[string]any) error {
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"annotations": annotations, "managedFields": resetManagedFields},
		"spec":     map[string]any{"holderIdentity": s.node},
	})
	if err != nil {
		return err
	}
	_, err = s.client.CoordinationV1().Leases(s.cfg.Namespace).Patch(ctx, s.hintName(), types.MergePatchType, patch,
		metav1.PatchOptions{FieldManager: hintFieldManager})
	return err
}

// bucketKey is the hint's annotation marking bucket b, claimKey the one
// claiming it.
func bucketKey(b int) string { return FullBucketAnnotation + strconv.Itoa(b) }
func claimKey(b int) string  { return ClaimAnnotation + strconv.Itoa(b) }

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
// marked full, and when a slot was last released. A mark that does not
// parse, is dated no later than the last release, or is dated hintTTL or
// more from now (either way: a date that far ahead comes from a clock
// that does not agree with ours) marks no bucket.
func decodeBuckets(annotations map[string]string, now time.Time) (full map[int]bool, released int64) {
	full = map[int]bool{}
	if r, err := strconv.ParseInt(annotations[HintReleasedAnnotation], 10, 64); err == nil && r > 0 {
		released = r
	}
	for k, v := range annotations {
		if !strings.HasPrefix(k, FullBucketAnnotation) {
			continue
		}
		b, sec, ok := parseMark(k, v)
		if !ok {
			continue
		}
		if age := now.Sub(time.Unix(sec, 0)); age >= hintTTL || age <= -hintTTL || sec <= released {
			continue
		}
		full[b] = true
	}
	return full, released
}

// decodeClaims are the buckets the hint's annotations claim as of now
// (a claim dated less than claimTTL from now).
func decodeClaims(annotations map[string]string, now time.Time) map[int]bool {
	claimed := map[int]bool{}
	for k, v := range annotations {
		if !strings.HasPrefix(k, ClaimAnnotation) {
			continue
		}
		if b, sec, ok := parseMark(k, v); ok {
			if age := now.Sub(time.Unix(sec, 0)); age < claimTTL && age > -claimTTL {
				claimed[b] = true
			}
		}
	}
	return claimed
}

// parseMark reads annotation k: v as a mark or claim of the hint
// (FullBucketAnnotation or ClaimAnnotation): its bucket and date; ok is
// false when it is neither.
func parseMark(k, v string) (b int, sec int64, ok bool) {
	rest, found := strings.CutPrefix(k, FullBucketAnnotation)
	if !found {
		rest, found = strings.CutPrefix(k, ClaimAnnotation)
	}
	if !found {
		return 0, 0, false
	}
	b, err := strconv.Atoi(rest)
	if err != nil || b < 0 || strconv.Itoa(b) != rest {
		return 0, 0, false
	}
	sec, err = strconv.ParseInt(v, 10, 64)
	if err != nil || sec <= 0 {
		return 0, 0, false
	}
	return b, sec, true
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
