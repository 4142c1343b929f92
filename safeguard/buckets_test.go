package safeguard

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
)

// heldBy is slots from..to-1 held by other nodes, renewed a minute ago.
func heldBy(from, to int) []slotLease {
	var out []slotLease
	for i := from; i < to; i++ {
		out = append(out, slotLease{i, fmt.Sprintf("fleet-%d", i), time.Minute})
	}
	return out
}

// without is leases without the slots named.
func without(leases []slotLease, indices ...int) []slotLease {
	var out []slotLease
	for _, l := range leases {
		keep := true
		for _, i := range indices {
			keep = keep && l.index != i
		}
		if keep {
			out = append(out, l)
		}
	}
	return out
}

// leaseLists are the label selectors of the Slots' own LISTs of Leases
// (the follower's aside), in order.
func (f *slotFixture) leaseLists() []string {
	var out []string
	for _, a := range f.client.Actions() {
		if l, ok := a.(k8stesting.ListActionImpl); ok && !isFollow(a) && a.GetResource().Resource == "leases" {
			out = append(out, l.ListOptions.LabelSelector)
		}
	}
	return out
}

// hint is the full-bucket hint's buckets, in order (nil when absent).
func (f *slotFixture) hint(t *testing.T) []int {
	t.Helper()
	f.slots.hintWrites.Wait()
	l, err := f.client.CoordinationV1().Leases(slotNS).Get(t.Context(), DefaultSlotPrefix+"-full", metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	if _, slot := l.Labels[SlotLabel]; slot {
		t.Error("the hint carries the slot label: slot listings would read it")
	}
	return FullBuckets(l, f.slots.now())
}

// setHint writes a hint marking buckets full, as another node would, and
// clears the requests.
func (f *slotFixture) setHint(t *testing.T, buckets ...int) {
	t.Helper()
	f.writeHint(t, buckets...)
	f.clearRequests()
}

// writeHint writes a hint marking buckets full, as another node would
// (now).
func (f *slotFixture) writeHint(t *testing.T, buckets ...int) {
	t.Helper()
	f.writeHintAt(t, f.slots.now(), buckets...)
}

// writeHintAt writes a hint marking buckets full, dated at.
func (f *slotFixture) writeHintAt(t *testing.T, at time.Time, buckets ...int) {
	t.Helper()
	annotations := map[string]string{}
	for _, b := range buckets {
		annotations[bucketKey(b)] = strconv.FormatInt(at.Unix(), 10)
	}
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: DefaultSlotPrefix + "-full", Namespace: slotNS,
		Annotations: annotations}, Spec: coordinationv1.LeaseSpec{HolderIdentity: new("fleet-9")}}
	if _, err := f.client.CoordinationV1().Leases(slotNS).Create(t.Context(), l, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// markHint marks buckets full in the existing hint, now, as another node
// would.
func (f *slotFixture) markHint(t *testing.T, buckets ...int) {
	t.Helper()
	gvr := coordinationv1.SchemeGroupVersion.WithResource("leases")
	obj, err := f.client.Tracker().Get(gvr, slotNS, DefaultSlotPrefix+"-full")
	if err != nil {
		t.Fatal(err)
	}
	l := obj.(*coordinationv1.Lease).DeepCopy()
	for _, b := range buckets {
		l.Annotations[bucketKey(b)] = strconv.FormatInt(f.slots.now().Unix(), 10)
	}
	if err := f.client.Tracker().Update(gvr, l, slotNS); err != nil {
		t.Fatal(err)
	}
}

// knownFixture is a fixture whose node knows it holds nothing (as after
// the tainter's Release at start) and has a fresh fleet size.
func knownFixture(t *testing.T, fleet int, leases []slotLease) *slotFixture {
	t.Helper()
	f := newSlotFixture(t, fleet, true, nil, leases, Config{MaxFraction: 0.2})
	f.slots.known = true
	f.slots.fleet, f.slots.fleetAt = fleet+1, slotT0.Add(-time.Minute)
	return f
}

// TestSlotsReadBuckets: with K = 64 (four buckets) and every slot held, a
// node whose probes miss lists two buckets, not the 64 slots, is refused
// and follows one of them; asking again at once reads only the followed
// bucket, from its watch (no request), and asking lookGap later lists one
// more. No ask reads more than 3 x BucketSize slots, whatever K is.
func TestSlotsReadBuckets(t *testing.T) {
	f := knownFixture(t, 319, heldBy(0, 64))
	d, err := f.slots.Acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if want := (Decision{Slot: -1, Limit: 64, Fleet: 320, Occupied: 32, Seen: 32}); d != want {
		t.Errorf("first ask: %+v, want %+v", d, want)
	}
	// Two probes, the hint read (absent), two buckets listed; then the
	// hint read again (still absent, so the news is news) and created
	// marking them full.
	if reqs, want := f.requests(), map[string]int{"create leases": 3, "get leases": 2, "list leases": 2}; !sameCounts(reqs, want) {
		t.Errorf("first ask: requests %v, want %v", reqs, want)
	}
	if got := f.hint(t); fmt.Sprint(got) != "[0 1]" {
		t.Errorf("full-bucket hint %v after the first ask, want [0 1]", got)
	}
	// The admission policy lets a node write only Leases it holds.
	if l := f.lease(t, -1); leaseHolder(l) != slotSelf {
		t.Errorf("hint written with holder %q, want the writer %q", leaseHolder(l), slotSelf)
	}
	lists := f.leaseLists()
	if fmt.Sprint(lists) != fmt.Sprint([]string{f.slots.bucketSelector(0), f.slots.bucketSelector(1)}) {
		t.Errorf("first ask listed %q, want buckets 0 and 1", lists)
	}
	b := followed(t, f.slots)
	if b != 0 && b != 1 {
		t.Errorf("follows bucket %d, want one it listed", b)
	}
	// Its watch starts from the LIST the refusal made.
	for _, a := range f.client.Actions() {
		if l, ok := a.(k8stesting.ListActionImpl); ok && isFollow(a) {
			t.Errorf("the watch listed %q again", l.ListOptions.LabelSelector)
		}
	}
	f.clearRequests()
	d, err = f.slots.Acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if want := (Decision{Slot: -1, Limit: 64, Fleet: 320, Occupied: 16, Seen: 16}); d != want {
		t.Errorf("ask at once: %+v, want %+v", d, want)
	}
	if reqs := f.requests(); len(reqs) != 0 {
		t.Errorf("ask at once: requests %v, want none (the followed bucket from the cache)", reqs)
	}
	f.later()
	d, err = f.slots.Acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if want := (Decision{Slot: -1, Limit: 64, Fleet: 320, Occupied: 32, Seen: 32}); d != want {
		t.Errorf("second ask: %+v, want %+v", d, want)
	}
	if reqs, want := f.requests(), map[string]int{"get leases": 2, "list leases": 1, "patch leases": 2}; !sameCounts(reqs, want) {
		t.Errorf("second ask: requests %v, want %v (the followed bucket from the cache, the hint, one more bucket claimed in it and listed, then the hint read again and the bucket marked full, its claim removed)", reqs, want)
	}
	if got := f.hint(t); fmt.Sprint(got) != "[0 1 2]" {
		t.Errorf("full-bucket hint %v after the second ask, want [0 1 2]", got)
	}
	// The claim comes before the LIST, so that other refused nodes
	// asking meanwhile look elsewhere; what the LIST found comes after.
	var order []string
	for _, a := range f.client.Actions() {
		if !isFollow(a) && (a.GetVerb() == "patch" || a.GetVerb() == "list") {
			order = append(order, a.GetVerb())
		}
	}
	if fmt.Sprint(order) != "[patch list patch]" {
		t.Errorf("second ask wrote and listed in the order %v, want [patch list patch]", order)
	}
	if l := f.lease(t, -1); l.Annotations[claimKey(2)] != "" {
		t.Errorf("bucket 2's claim left after the ask: %v", l.Annotations)
	}
	if got := followed(t, f.slots); got != b {
		t.Errorf("second ask follows bucket %d, want %d still", got, b)
	}
}

// TestSlotsFullBucketHint: a refusal says the slots read were occupied,
// not all K. The one free slot of K = 40 sits in bucket 2, which the first
// ask does not read; it marks buckets 0 and 1 full in the hint, so the
// next ask (which, without the hint, would pick bucket 1 again: the
// random draw is always the first) lists bucket 2 and takes the slot.
func TestSlotsFullBucketHint(t *testing.T) {
	f := knownFixture(t, 199, without(heldBy(0, 40), 35))
	d, err := f.slots.Acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if want := (Decision{Slot: -1, Limit: 40, Fleet: 200, Occupied: 32, Seen: 32}); d != want {
		t.Errorf("first ask: %+v, want %+v", d, want)
	}
	if b := followed(t, f.slots); b != 0 {
		t.Fatalf("follows bucket %d, want 0 (the first listed)", b)
	}
	f.clearRequests()
	f.later()
	d, err = f.slots.Acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if want := (Decision{Held: true, Slot: 35, Limit: 40, Fleet: 200, Occupied: 23, Seen: 24}); d != want {
		t.Errorf("second ask: %+v, want %+v", d, want)
	}
	if reqs, want := f.requests(), map[string]int{"get leases": 2, "list leases": 1, "create leases": 1, "patch leases": 2}; !sameCounts(reqs, want) {
		t.Errorf("second ask: requests %v, want %v", reqs, want)
	}
	if lists := f.leaseLists(); len(lists) != 1 || lists[0] != f.slots.bucketSelector(2) {
		t.Errorf("second ask listed %q, want bucket 2", lists)
	}
	// It took bucket 2's last free slot: bucket 2 is full now too.
	if got := f.hint(t); fmt.Sprint(got) != "[0 1 2]" {
		t.Errorf("full-bucket hint %v, want [0 1 2]", got)
	}
	if f.slots.follow != nil {
		t.Error("still following a bucket after taking a slot")
	}
}

// TestSlotsClaimClearedWhenSlotsLeft: a refused node claims the bucket
// it is about to list; finding two free slots there, it takes one and
// removes its claim without marking the bucket full, since one is left
// for the other refused nodes.
func TestSlotsClaimClearedWhenSlotsLeft(t *testing.T) {
	f := knownFixture(t, 319, without(heldBy(0, 64), 40, 41)) // K = 64
	if d, err := f.slots.Acquire(t.Context()); err != nil || d.Held {
		t.Fatalf("first ask = %+v, %v; want refused", d, err)
	}
	// It marked buckets 0 and 1 full; another node marked 3.
	f.slots.hintWrites.Wait()
	f.markHint(t, 3)
	f.clearRequests()
	var claimed []int
	f.client.PrependReactor("list", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if !isFollow(a) {
			// The tracker, not the client: a reactor runs under the
			// client's lock.
			if obj, err := f.client.Tracker().Get(coordinationv1.SchemeGroupVersion.WithResource("leases"), slotNS, DefaultSlotPrefix+"-full"); err == nil {
				claimed = sortedBuckets(decodeClaims(obj.(*coordinationv1.Lease).Annotations, f.slots.now()))
			}
		}
		return false, nil, nil
	})
	f.later()
	d, err := f.slots.Acquire(t.Context())
	if err != nil || !d.Held || (d.Slot != 40 && d.Slot != 41) {
		t.Fatalf("second ask = %+v, %v; want slot 40 or 41 of bucket 2", d, err)
	}
	if fmt.Sprint(claimed) != "[2]" {
		t.Errorf("buckets claimed %v while listing bucket 2, want [2]", claimed)
	}
	if got := f.hint(t); fmt.Sprint(got) != "[0 1 3]" {
		t.Errorf("full-bucket hint %v after taking a slot of two, want [0 1 3]", got)
	}
	if l := f.lease(t, -1); l.Annotations[claimKey(2)] != "" {
		t.Errorf("bucket 2's claim left after the ask: %v", l.Annotations)
	}
}

// TestSlotsClaimKeepsOthersAsking: a refused node that finds every
// bucket it did not read marked full or claimed lists none, and asks
// again on its own later while a bucket is claimed (its claimer may find
// a slot left there), not once none is.
func TestSlotsClaimKeepsOthersAsking(t *testing.T) {
	f := knownFixture(t, 319, heldBy(0, 64)) // K = 64, four buckets
	if d, err := f.slots.Acquire(t.Context()); err != nil || d.Held {
		t.Fatalf("first ask = %+v, %v; want refused", d, err)
	}
	f.slots.hintWrites.Wait()
	f.slots.stopAgain()
	gvr := coordinationv1.SchemeGroupVersion.WithResource("leases")
	obj, err := f.client.Tracker().Get(gvr, slotNS, DefaultSlotPrefix+"-full")
	if err != nil {
		t.Fatal(err)
	}
	l := obj.(*coordinationv1.Lease).DeepCopy()
	now := strconv.FormatInt(f.slots.now().Unix(), 10)
	l.Annotations[bucketKey(3)], l.Annotations[claimKey(2)] = now, now
	if err := f.client.Tracker().Update(gvr, l, slotNS); err != nil {
		t.Fatal(err)
	}
	f.clearRequests()
	f.later()
	if d, err := f.slots.Acquire(t.Context()); err != nil || d.Held {
		t.Fatalf("ask with bucket 2 claimed = %+v, %v; want refused", d, err)
	}
	if lists := f.leaseLists(); len(lists) != 0 {
		t.Errorf("listed %q with every other bucket marked or claimed, want none", lists)
	}
	if !f.slots.againPending.Load() {
		t.Error("no own ask scheduled while a bucket is claimed")
	}
	f.slots.stopAgain()
	// Once the claim is gone and the bucket marked, it stops.
	delete(l.Annotations, claimKey(2))
	l.Annotations[bucketKey(2)] = now
	if err := f.client.Tracker().Update(gvr, l, slotNS); err != nil {
		t.Fatal(err)
	}
	f.later()
	if d, err := f.slots.Acquire(t.Context()); err != nil || d.Held {
		t.Fatalf("ask with every bucket marked = %+v, %v; want refused", d, err)
	}
	if f.slots.againPending.Load() {
		t.Error("own ask scheduled with every bucket marked full")
	}
}

// TestSlotsClaimShedWaitsForNextAsk: a refused node whose claim the
// API server sheds (429, or a timeout) does not list the bucket it meant
// to claim: a claim that lands late keeps no one else off it. It asks
// again on its own, and lists the bucket once its claim is written. A
// claim refused for another reason (here the admission policy) is no
// reason to look less: the bucket is listed unclaimed.
func TestSlotsClaimShedWaitsForNextAsk(t *testing.T) {
	for _, tc := range []struct {
		name   string
		err    error
		listed bool
	}{
		{"429", apierrors.NewTooManyRequests("too many requests", 1), false},
		{"server timeout", apierrors.NewServerTimeout(coordinationv1.Resource("leases"), "patch", 1), false},
		{"forbidden", apierrors.NewForbidden(coordinationv1.Resource("leases"), DefaultSlotPrefix+"-full", fmt.Errorf("denied")), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := knownFixture(t, 319, heldBy(0, 64)) // K = 64, four buckets
			if d, err := f.slots.Acquire(t.Context()); err != nil || d.Held {
				t.Fatalf("first ask = %+v, %v; want refused", d, err)
			}
			f.slots.stopAgain()
			f.clearRequests()
			var refuse atomic.Bool
			refuse.Store(true)
			f.client.PrependReactor("patch", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
				if a.(k8stesting.PatchAction).GetName() == DefaultSlotPrefix+"-full" && refuse.Load() {
					return true, nil, tc.err
				}
				return false, nil, nil
			})
			f.later()
			if d, err := f.slots.Acquire(t.Context()); err != nil || d.Held {
				t.Fatalf("ask with the claim refused = %+v, %v; want refused", d, err)
			}
			lists := f.leaseLists()
			if tc.listed != (len(lists) == 1) || len(lists) > 1 {
				t.Errorf("listed %q with the claim answered %q; want a bucket listed: %v", lists, tc.err, tc.listed)
			}
			if !f.slots.againPending.Load() {
				t.Error("no own ask scheduled with buckets 2 and 3 open and unread")
			}
			f.slots.stopAgain()
			if tc.listed {
				return
			}
			// The next ask's claim is written: it lists.
			refuse.Store(false)
			f.clearRequests()
			f.later()
			f.slots.againDue.Store(true)
			if d, err := f.slots.Acquire(t.Context()); err != nil || d.Held {
				t.Fatalf("ask with the claim written = %+v, %v; want refused", d, err)
			}
			if lists := f.leaseLists(); len(lists) != 1 {
				t.Errorf("listed %q with the claim written, want one bucket", lists)
			}
			f.slots.stopAgain()
		})
	}
}

// TestSlotsStaleFullBucketHint: the hint is only where to look first. It
// marks bucket 3 full, wrongly (a slot was released since and its clear
// lost). A refused node reads only buckets the hint leaves open: once it
// has read those, asking again costs no LIST. A node asking for the first
// time (here the same node after a Release) reads a marked bucket when
// every other is marked too, takes a slot there and clears its mark,
// since a free slot is left in it.
func TestSlotsStaleFullBucketHint(t *testing.T) {
	f := knownFixture(t, 319, without(heldBy(0, 64), 50, 51)) // K = 64
	f.setHint(t, 3)
	for ask, want := range [][]int{{0, 1}, {2}, nil} {
		f.slots.hintWrites.Wait()
		f.clearRequests()
		f.later()
		d, err := f.slots.Acquire(t.Context())
		if err != nil || d.Held {
			t.Fatalf("ask %d = %+v, %v; want refused", ask, d, err)
		}
		var wantLists []string
		for _, b := range want {
			wantLists = append(wantLists, f.slots.bucketSelector(b))
		}
		if got := f.leaseLists(); fmt.Sprint(got) != fmt.Sprint(wantLists) {
			t.Errorf("ask %d listed %q, want buckets %v", ask, got, want)
		}
		followed(t, f.slots)
	}
	if got := f.hint(t); fmt.Sprint(got) != "[0 1 2 3]" {
		t.Fatalf("full-bucket hint %v after the refused asks, want [0 1 2 3]", got)
	}
	if err := f.slots.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	// Draw the last candidate: bucket 3.
	f.slots.randIntN = func(n int) int { return n - 1 }
	d, err := f.slots.Acquire(t.Context())
	if err != nil || !d.Held || (d.Slot != 50 && d.Slot != 51) {
		t.Fatalf("first ask after release = %+v, %v; want slot 50 or 51 of bucket 3", d, err)
	}
	if got := f.hint(t); fmt.Sprint(got) != "[0 1 2]" {
		t.Errorf("full-bucket hint %v, want [0 1 2] (bucket 3 cleared: a free slot is left in it)", got)
	}
}

// TestSlotsHintWrittenOnlyIfNews: a node writes what it found into the
// hint later, and only what the hint does not show by then: nodes that
// find the same buckets full at once write them once, not each.
func TestSlotsHintWrittenOnlyIfNews(t *testing.T) {
	f := knownFixture(t, 319, heldBy(0, 64)) // K = 64, four buckets
	release := make(chan struct{})
	f.slots.hintWait = func(context.Context) error { <-release; return nil }
	if d, err := f.slots.Acquire(t.Context()); err != nil || d.Held {
		t.Fatalf("ask = %+v, %v; want refused", d, err)
	}
	// Meanwhile another node wrote the same news.
	f.writeHint(t, 0, 1)
	f.client.ClearActions()
	close(release)
	f.slots.hintWrites.Wait()
	for _, a := range f.client.Actions() {
		switch a := a.(type) {
		case k8stesting.PatchAction:
			t.Errorf("patched %s with news the hint had", a.GetName())
		case k8stesting.CreateAction:
			t.Errorf("created %s with news the hint had", a.GetObject().(*coordinationv1.Lease).Name)
		}
	}
	if reqs, want := f.requests(), map[string]int{"get leases": 1}; !sameCounts(reqs, want) {
		t.Errorf("requests of the delayed write %v, want %v (the hint read again, nothing written)", reqs, want)
	}
	if got := f.hint(t); fmt.Sprint(got) != "[0 1]" {
		t.Errorf("full-bucket hint %v, want [0 1]", got)
	}
}

// TestSlotsHintKeepsEveryMark: nodes marking buckets at once keep one
// another's marks: a node that read the hint before another node marked
// bucket 1 writes its own mark of bucket 0, and bucket 1 stays marked.
func TestSlotsHintKeepsEveryMark(t *testing.T) {
	f := knownFixture(t, 319, heldBy(0, 64)) // K = 64, four buckets
	f.writeHint(t, 3)
	h := f.slots.readHint(t.Context())
	f.markHint(t, 1)
	h.note(0, true)
	if err := f.slots.writeHint(t.Context(), h); err != nil {
		t.Fatal(err)
	}
	if got := f.hint(t); fmt.Sprint(got) != "[0 1 3]" {
		t.Errorf("full-bucket hint %v, want [0 1 3]: bucket 1's mark kept", got)
	}
}

// TestSlotsFullBucketsEncoding: the hint's marks, one annotation per
// bucket, round-trip with their date; a mark that does not parse, is
// dated no later than the last release, or is dated hintTTL or more away
// from now marks no bucket.
func TestSlotsFullBucketsEncoding(t *testing.T) {
	now := slotT0
	date := func(d time.Duration) string { return strconv.FormatInt(now.Add(d).Unix(), 10) }
	for _, set := range [][]int{nil, {0}, {7, 8}, {0, 3, 93}, {1499 / 16}} {
		annotations := map[string]string{"other": "x"}
		for _, b := range set {
			annotations[bucketKey(b)] = date(-time.Minute)
		}
		full, _ := decodeBuckets(annotations, now)
		if got := sortedBuckets(full); fmt.Sprint(got) != fmt.Sprint(set) {
			t.Errorf("%v round-trips to %v", set, got)
		}
	}
	if k := bucketKey(12); k != "full-12" {
		t.Errorf("bucket 12's annotation is %q", k)
	}
	for _, bad := range []map[string]string{
		{FullBucketAnnotation + "0": "yesterday"},
		{FullBucketAnnotation + "0": ""},
		{FullBucketAnnotation + "0": "0"},
		{FullBucketAnnotation + "-1": date(0)},
		{FullBucketAnnotation + "01": date(0)},
		{FullBucketAnnotation + "x": date(0)},
		{FullBucketAnnotation + "0": date(-hintTTL)},
		{FullBucketAnnotation + "0": date(hintTTL)},
		{FullBucketAnnotation + "0": date(-time.Minute), HintReleasedAnnotation: date(-time.Minute)},
		{FullBucketAnnotation + "0": date(-time.Minute), HintReleasedAnnotation: date(0)},
	} {
		if got, _ := decodeBuckets(bad, now); len(got) != 0 {
			t.Errorf("%v decodes to %v, want no bucket", bad, got)
		}
	}
	if got, _ := decodeBuckets(map[string]string{FullBucketAnnotation + "0": date(-hintTTL + time.Second)}, now); fmt.Sprint(sortedBuckets(got)) != "[0]" {
		t.Errorf("a mark dated just under hintTTL ago decodes to %v, want [0]", got)
	}
	got, released := decodeBuckets(map[string]string{FullBucketAnnotation + "0": date(0), HintReleasedAnnotation: date(-time.Second)}, now)
	if fmt.Sprint(sortedBuckets(got)) != "[0]" || released != now.Add(-time.Second).Unix() {
		t.Errorf("a mark dated after the last release decodes to %v (released %d), want [0] (released %d)", got, released, now.Add(-time.Second).Unix())
	}
}

// TestSlotsHintMarksExpire: the marks of a wave that has passed do not
// steer the next. A hint written hintTTL ago marks buckets 0-2 full of
// K = 64: a node reads it as marking nothing, and what it writes marks
// only what it found.
func TestSlotsHintMarksExpire(t *testing.T) {
	f := knownFixture(t, 319, heldBy(0, 64)) // K = 64, four buckets, all held
	f.writeHintAt(t, f.slots.now().Add(-hintTTL), 0, 1, 2)
	f.clearRequests()
	if d, err := f.slots.Acquire(t.Context()); err != nil || d.Held {
		t.Fatalf("ask = %+v, %v; want refused", d, err)
	}
	// With the old marks counted, it would list bucket 3 (the only open
	// one) first; read as expired, the draw (always the first) lists
	// buckets 0 and 1.
	if lists := f.leaseLists(); fmt.Sprint(lists) != fmt.Sprint([]string{f.slots.bucketSelector(0), f.slots.bucketSelector(1)}) {
		t.Errorf("listed %q, want buckets 0 and 1", lists)
	}
	if got := f.hint(t); fmt.Sprint(got) != "[0 1]" {
		t.Errorf("full-bucket hint %v, want [0 1]: what this node found, the expired mark of 2 not counted", got)
	}
	f.slots.stopAgain()
}

// TestSlotsRoomWhenFollowedSlotFreed: a refused node asks again on its
// own while the full-bucket hint leaves buckets it did not read open,
// reading one of them each time, until the hint marks every bucket full;
// then it follows a bucket, and when a slot of it is freed (its holder
// deletes the Lease), Room is signalled and the next Acquire takes that
// slot from the watch's cache with one Create and no LIST, then stops
// following.
func TestSlotsRoomWhenFollowedSlotFreed(t *testing.T) {
	f := knownFixture(t, 319, heldBy(0, 64)) // K = 64, four buckets
	var own []int
	f.slots.againAfter = func(n int) time.Duration { own = append(own, n); return time.Millisecond }
	if d, err := f.slots.Acquire(t.Context()); err != nil || d.Held {
		t.Fatalf("first ask = %+v, %v; want refused", d, err)
	}
	// Buckets 0 and 1 read: 2 and 3 are open. Each own ask reads one.
	for ask, want := range []string{"[0 1 2]", "[0 1 2 3]"} {
		select {
		case <-f.slots.Room():
		case <-time.After(30 * time.Second):
			t.Fatalf("no Room signal to ask again with the hint at %v", f.hint(t))
		}
		f.slots.hintWrites.Wait()
		// The clock stands still: an own ask lists however soon it
		// comes.
		if d, err := f.slots.Acquire(t.Context()); err != nil || d.Held {
			t.Fatalf("own ask %d = %+v, %v; want refused", ask, d, err)
		}
		if got := f.hint(t); fmt.Sprint(got) != want {
			t.Fatalf("full-bucket hint %v after own ask %d, want %s", got, ask, want)
		}
	}
	if fmt.Sprint(own) != "[0 1]" || f.slots.againPending.Load() {
		t.Errorf("own asks scheduled %v (pending %v), want [0 1]: none once the hint marks every bucket full", own, f.slots.againPending.Load())
	}
	b := followed(t, f.slots)
	freed := b*BucketSize + 7
	if err := f.client.CoordinationV1().Leases(slotNS).Delete(t.Context(), slotName(DefaultSlotPrefix, freed), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-f.slots.Room():
	case <-time.After(30 * time.Second):
		t.Fatal("no Room signal after a slot of the followed bucket was freed")
	}
	f.clearRequests()
	d, err := f.slots.Acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if !d.Held || d.Slot != freed {
		t.Errorf("ask after Room: %+v, want slot %d held", d, freed)
	}
	if reqs, want := f.requests(), map[string]int{"create leases": 1}; !sameCounts(reqs, want) {
		t.Errorf("ask after Room: requests %v, want %v", reqs, want)
	}
	if f.slots.follow != nil {
		t.Error("still following a bucket after taking a slot")
	}
}

// TestSlotsOwnAsksBounded: a refused node whose hint writes all fail
// (the hint stays empty, so every bucket looks open) asks again on its
// own at most againAsks times, each later than the one before, until it
// holds or releases a slot; Release allows againAsks more.
func TestSlotsOwnAsksBounded(t *testing.T) {
	f := knownFixture(t, 799, heldBy(0, 160)) // K = 160, ten buckets
	hintWrite := func(a k8stesting.Action) bool {
		switch a := a.(type) {
		case k8stesting.CreateAction:
			return a.GetObject().(*coordinationv1.Lease).Name == DefaultSlotPrefix+"-full"
		case k8stesting.PatchAction:
			return a.GetName() == DefaultSlotPrefix+"-full"
		}
		return false
	}
	f.client.PrependReactor("*", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if hintWrite(a) {
			return true, nil, apierrors.NewForbidden(coordinationv1.Resource("leases"), DefaultSlotPrefix+"-full", fmt.Errorf("denied"))
		}
		return false, nil, nil
	})
	var own []time.Duration
	f.slots.againAfter = func(n int) time.Duration {
		d := f.slots.againAfterDefault(n)
		own = append(own, d)
		return time.Hour + d // never fires: the test asks itself
	}
	for ask := range againAsks + 3 {
		f.later()
		if d, err := f.slots.Acquire(t.Context()); err != nil || d.Held {
			t.Fatalf("ask %d = %+v, %v; want refused", ask, d, err)
		}
		f.slots.againPending.Store(false) // as if it fired
	}
	if len(own) != againAsks {
		t.Fatalf("%d own asks scheduled over %d refusals, want %d", len(own), againAsks+3, againAsks)
	}
	for i := 1; i < len(own); i++ {
		if own[i] <= own[i-1] {
			t.Errorf("own ask %d after %s, not later than the one before (%s)", i, own[i], own[i-1])
		}
	}
	if err := f.slots.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	if d, err := f.slots.Acquire(t.Context()); err != nil || d.Held {
		t.Fatalf("ask after release = %+v, %v; want refused", d, err)
	}
	if len(own) != againAsks+1 {
		t.Errorf("%d own asks scheduled after a release, want one more", len(own)-againAsks)
	}
	f.slots.stopAgain()
}

// TestSlotsReleaseExpiresHintMarks: a node releasing a slot expires the
// hint's marks made before (its release time, and the marks removed, in
// one merge patch without a resourceVersion or managedFields): that
// bucket, or any other, may have a free slot now. A release that finds
// no mark made before it writes nothing; a mark made after the release
// counts.
func TestSlotsReleaseExpiresHintMarks(t *testing.T) {
	f := knownFixture(t, 319, without(heldBy(0, 64), 20))
	f.setHint(t, 0, 2, 3)
	d, err := f.slots.Acquire(t.Context())
	if err != nil || !d.Held || d.Slot != 20 {
		t.Fatalf("ask = %+v, %v; want slot 20 held", d, err)
	}
	if got := f.hint(t); fmt.Sprint(got) != "[0 1 2 3]" {
		t.Fatalf("full-bucket hint %v after taking the last slot, want [0 1 2 3]", got)
	}
	// A second later, it releases.
	f.setNow(f.slots.now().Add(time.Second))
	var patches []string
	f.client.PrependReactor("patch", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		patches = append(patches, string(a.(k8stesting.PatchAction).GetPatch()))
		return false, nil, nil
	})
	if err := f.slots.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := f.hint(t); len(got) != 0 {
		t.Errorf("full-bucket hint %v after the release, want no bucket marked", got)
	}
	want := fmt.Sprintf(`{"metadata":{"annotations":{%q:null,%q:null,%q:null,%q:null,%q:"%d"},"managedFields":[{}]},"spec":{"holderIdentity":%q}}`,
		bucketKey(0), bucketKey(1), bucketKey(2), bucketKey(3), HintReleasedAnnotation, f.slots.now().Unix(), slotSelf)
	if len(patches) != 1 || patches[0] != want {
		t.Errorf("release patches %q, want [%s]", patches, want)
	}
	// Another release this second (the fixture's node again) writes
	// nothing: every mark is older than the last release.
	d, err = f.slots.Acquire(t.Context())
	if err != nil || !d.Held {
		t.Fatalf("ask after the release = %+v, %v; want a slot held", d, err)
	}
	f.slots.hintWrites.Wait()
	patches = nil
	if err := f.slots.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	f.slots.hintWrites.Wait()
	if len(patches) != 0 {
		t.Errorf("a second release in the same second patched the hint: %q", patches)
	}
	// A mark made after the release counts.
	f.setNow(f.slots.now().Add(time.Second))
	f.markHint(t, 1)
	if got := f.hint(t); fmt.Sprint(got) != "[1]" {
		t.Errorf("full-bucket hint %v with a mark made after the release, want [1]", got)
	}
}

// TestSlotsFollowStops: the watch of a refused node stops on Release (the
// node turned fit) and when the context of the Acquire that started it
// ends; a node never follows two buckets.
func TestSlotsFollowStops(t *testing.T) {
	t.Run("release", func(t *testing.T) {
		f := knownFixture(t, 319, heldBy(0, 64))
		if _, err := f.slots.Acquire(t.Context()); err != nil {
			t.Fatal(err)
		}
		followed(t, f.slots)
		w := f.slots.follow
		if err := f.slots.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		if f.slots.follow != nil {
			t.Fatal("following after Release")
		}
		select {
		case <-w.done:
		default:
			t.Fatal("the watch still runs after Release")
		}
	})
	t.Run("context", func(t *testing.T) {
		f := knownFixture(t, 319, heldBy(0, 64))
		ctx, cancel := context.WithCancel(t.Context())
		if _, err := f.slots.Acquire(ctx); err != nil {
			t.Fatal(err)
		}
		followed(t, f.slots)
		w := f.slots.follow
		cancel()
		select {
		case <-w.done:
		case <-time.After(30 * time.Second):
			t.Fatal("the watch still runs after its context ended")
		}
		f.slots.mu.Lock()
		got := f.slots.following()
		f.slots.mu.Unlock()
		if got != nil {
			t.Fatal("a stopped watch is still followed")
		}
	})
	t.Run("one at a time", func(t *testing.T) {
		f := knownFixture(t, 319, heldBy(0, 64))
		var watches []*follower
		for range 3 {
			if _, err := f.slots.Acquire(t.Context()); err != nil {
				t.Fatal(err)
			}
			followed(t, f.slots)
			watches = append(watches, f.slots.follow)
		}
		for i, w := range watches[1:] {
			if w != watches[0] {
				t.Errorf("ask %d started another watch", i+2)
			}
		}
	})
}

// TestSlotsLeaseWithoutBucketLabel: a slot Lease an older agent created
// carries no BucketLabel, so no bucket's LIST shows it; its slot looks
// absent, and the Create that would take it fails with AlreadyExists:
// refused, never a second holder. The older holder renewing it (after an
// upgrade, its first Acquire finds it among the Leases without a holder
// label) labels it.
func TestSlotsLeaseWithoutBucketLabel(t *testing.T) {
	f := knownFixture(t, 3, nil) // K = 1
	renew := metav1.NewMicroTime(slotT0)
	legacy := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: slotName(DefaultSlotPrefix, 0), Namespace: slotNS,
			Labels: map[string]string{SlotLabel: DefaultSlotPrefix}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: new("fleet-1"), LeaseDurationSeconds: new(int32(900)),
			AcquireTime: &renew, RenewTime: &renew},
	}
	if _, err := f.client.CoordinationV1().Leases(slotNS).Create(t.Context(), legacy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.clearRequests()
	d, err := f.slots.Acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if d.Held {
		t.Fatalf("took the slot an older agent's Lease holds: %+v", d)
	}
	if l := f.lease(t, 0); leaseHolder(l) != "fleet-1" {
		t.Errorf("slot 0 held by %q, want fleet-1 still", leaseHolder(l))
	}
	// The older holder, upgraded, renews its slot: the bucket label is added.
	holder := New(f.client, f.meta, "fleet-1", f.slots.cfg, slotTestLog(), WithClock(func() time.Time { return slotT0 }), WithoutSpread())
	if d, err := holder.Acquire(t.Context()); err != nil || !d.Held || d.Slot != 0 {
		t.Fatalf("the holder's Acquire = %+v, %v; want slot 0 renewed", d, err)
	}
	if l := f.lease(t, 0); l.Labels[BucketLabel] != "0" || l.Labels[HolderLabel] != "fleet-1" {
		t.Errorf("renewed Lease's labels %v, want %s 0 and %s fleet-1", l.Labels, BucketLabel, HolderLabel)
	}
}

// TestSlotsAdoptsOwnLeaseInBucket: a Lease of ours that the node did not
// know of (a Create whose answer was lost) shows up in a bucket it lists:
// it renews that one rather than taking a second slot.
func TestSlotsAdoptsOwnLeaseInBucket(t *testing.T) {
	f := knownFixture(t, 49, append(heldBy(0, 2), slotLease{5, slotSelf, time.Minute})) // K = 10
	d, err := f.slots.Acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if !d.Held || d.Slot != 5 {
		t.Errorf("decision %+v, want slot 5 (ours) held", d)
	}
	if reqs, want := f.requests(), map[string]int{"create leases": 2, "list leases": 1, "update leases": 1}; !sameCounts(reqs, want) {
		t.Errorf("requests %v, want %v", reqs, want)
	}
	list, err := f.client.CoordinationV1().Leases(slotNS).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mine := 0
	for _, l := range list.Items {
		if leaseHolder(&l) == slotSelf {
			mine++
		}
	}
	if mine != 1 {
		t.Errorf("%d Leases held by this node, want 1", mine)
	}
}

// TestSlotsWriteErrorFindsOwn: a Create that fails without an answer
// (it may have landed) makes the node forget that it knows what it holds:
// its next Acquire looks up its own Leases (two LISTs, neither reading
// all slots), finds the Lease and renews it.
func TestSlotsWriteErrorFindsOwn(t *testing.T) {
	f := knownFixture(t, 9, nil) // K = 2
	lost := true
	f.client.PrependReactor("create", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if !lost {
			return false, nil, nil
		}
		lost = false
		l := a.(k8stesting.CreateAction).GetObject()
		if err := f.client.Tracker().Create(a.GetResource(), l, slotNS); err != nil {
			return true, nil, err
		}
		return true, nil, apierrors.NewTimeoutError("the answer was lost", 1)
	})
	if _, err := f.slots.Acquire(t.Context()); err == nil {
		t.Fatal("Acquire with a lost answer: nil error, want the timeout")
	}
	if f.slots.known {
		t.Fatal("still sure of holding nothing after a write without an answer")
	}
	f.clearRequests()
	d, err := f.slots.Acquire(t.Context())
	if err != nil || !d.Held || d.Slot != 0 {
		t.Fatalf("next Acquire = %+v, %v; want slot 0 renewed", d, err)
	}
	if reqs, want := f.requests(), map[string]int{"list own leases": 2, "update leases": 1}; !sameCounts(reqs, want) {
		t.Errorf("requests %v, want %v (its own Leases looked up)", reqs, want)
	}
	if lists := f.leaseLists(); fmt.Sprint(lists) != fmt.Sprint(ownSelectors(slotSelf)) {
		t.Errorf("listed %q, want %q", lists, ownSelectors(slotSelf))
	}
}

// ownSelectors are the label selectors of findOwn's LISTs for node, as
// the API server receives them.
func ownSelectors(node string) []string {
	slot := SlotLabel + "=" + DefaultSlotPrefix
	return []string{slot + "," + HolderLabel + "=" + HolderValue(node), slot + ",!" + HolderLabel}
}

// TestSlotsLabels: a slot Lease carries SlotLabel, the BucketLabel of
// its index and its holder's HolderLabel (replacing a previous holder's),
// and other labels survive.
func TestSlotsLabels(t *testing.T) {
	s := New(nil, nil, slotSelf, Config{}, slotTestLog())
	for _, idx := range []int{0, 15, 16, 1499} {
		got := s.setLabels(map[string]string{"keep": "me", HolderLabel: "fleet-1"}, idx)
		want := map[string]string{"keep": "me", SlotLabel: DefaultSlotPrefix, BucketLabel: strconv.Itoa(idx / 16), HolderLabel: slotSelf}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("slot %d labels %v, want %v", idx, got, want)
		}
	}
}
