package safeguard

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	k8stesting "k8s.io/client-go/testing"
)

// ownLists records what each of the Slots' own LISTs of Leases (the
// follower's aside) returned: the names, in order of the LISTs. It
// answers them from the fake's tracker filtered by the label selector,
// as the fake clientset does (and so as the API server would).
type ownLists struct {
	mu    sync.Mutex
	names [][]string
}

func (f *slotFixture) recordLists() *ownLists {
	r := &ownLists{}
	react := k8stesting.ObjectReaction(f.client.Tracker())
	f.client.PrependReactor("list", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if isFollow(a) {
			return false, nil, nil
		}
		_, obj, err := react(a)
		if err != nil {
			return true, nil, err
		}
		sel, err := labels.Parse(a.(k8stesting.ListActionImpl).ListOptions.LabelSelector)
		if err != nil {
			return true, nil, err
		}
		list := obj.(*coordinationv1.LeaseList)
		out := &coordinationv1.LeaseList{ListMeta: list.ListMeta}
		var names []string
		for _, l := range list.Items {
			if sel.Matches(labels.Set(l.Labels)) {
				out.Items = append(out.Items, l)
				names = append(names, l.Name)
			}
		}
		slices.Sort(names)
		r.mu.Lock()
		r.names = append(r.names, names)
		r.mu.Unlock()
		return true, out, nil
	})
	return r
}

// take returns the names recorded so far and forgets them.
func (r *ownLists) take() [][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.names
	r.names = nil
	return out
}

// addOlderLease creates slot i's Lease held by holder as an agent of an
// older version wrote it: the slot label alone (no bucket, no holder
// label).
func (f *slotFixture) addOlderLease(t *testing.T, i int, holder string) {
	t.Helper()
	at := metav1.NewMicroTime(slotT0.Add(-time.Minute))
	l := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: slotName(DefaultSlotPrefix, i), Namespace: slotNS,
			Labels: map[string]string{SlotLabel: DefaultSlotPrefix}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: new(holder), LeaseDurationSeconds: new(int32(900)),
			AcquireTime: &at, RenewTime: &at},
	}
	if _, err := f.client.CoordinationV1().Leases(slotNS).Create(t.Context(), l, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.clearRequests()
}

// TestSlotsRestartFindsOwnLease: a node that restarts while it holds slot
// 137 of 300 held (K = 300) finds its Lease with two LISTs, one by its
// holder label, one of the Leases without a holder label (two older
// agents' here), and renews it: it reads no other node's labelled Lease,
// nor any other slot, nor the full-bucket hint, nor the fleet size.
func TestSlotsRestartFindsOwnLease(t *testing.T) {
	leases := without(heldBy(0, 300), 137, 250, 251)
	leases = append(leases, slotLease{137, slotSelf, time.Minute})
	f := newSlotFixture(t, 1499, true, nil, leases, Config{MaxFraction: 0.2})
	f.addOlderLease(t, 250, "fleet-250")
	f.addOlderLease(t, 251, "fleet-251")
	// The full-bucket hint has no holder label, and no slot label either:
	// the LIST of unlabelled slot Leases does not read it.
	f.setHint(t, 0, 1)
	lists := f.recordLists()
	d, err := f.slots.Acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if want := (Decision{Held: true, Slot: 137}); d != want {
		t.Errorf("decision %+v, want %+v", d, want)
	}
	if reqs, want := f.requests(), map[string]int{"list own leases": 2, "update leases": 1}; !sameCounts(reqs, want) {
		t.Errorf("requests %v, want %v", reqs, want)
	}
	if lists := f.leaseLists(); fmt.Sprint(lists) != fmt.Sprint(ownSelectors(slotSelf)) {
		t.Errorf("listed %q, want %q", lists, ownSelectors(slotSelf))
	}
	// What the LISTs returned: its own Lease, then the older agents'.
	want := [][]string{{slotName(DefaultSlotPrefix, 137)}, {slotName(DefaultSlotPrefix, 250), slotName(DefaultSlotPrefix, 251)}}
	if got := lists.take(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("the LISTs returned %v, want %v", got, want)
	}
	if l := f.lease(t, 137); leaseHolder(l) != slotSelf || !l.Spec.RenewTime.Time.Equal(slotT0) {
		t.Errorf("slot 137 held by %q renewed at %v, want %q at %v", leaseHolder(l), l.Spec.RenewTime, slotSelf, slotT0)
	}
	// Known now: the next Acquire renews, no LIST.
	f.clearRequests()
	if d, err := f.slots.Acquire(t.Context()); err != nil || d.Slot != 137 {
		t.Fatalf("second Acquire = %+v, %v; want slot 137", d, err)
	}
	if reqs, want := f.requests(), map[string]int{"update leases": 1}; !sameCounts(reqs, want) {
		t.Errorf("second Acquire: requests %v, want %v", reqs, want)
	}
}

// TestSlotsHolderLabelOnlyAHint: a Lease that carries this node's holder
// label but is held by another node (spec.holderIdentity) is not this
// node's: a restarted node neither renews nor releases it, and with K = 1
// it is refused beside it.
func TestSlotsHolderLabelOnlyAHint(t *testing.T) {
	f := newSlotFixture(t, 3, true, nil, []slotLease{{0, "fleet-1", time.Minute}}, Config{MaxFraction: 0.2}) // K = 1
	l := f.lease(t, 0)
	l.Labels[HolderLabel] = HolderValue(slotSelf)
	if _, err := f.client.CoordinationV1().Leases(slotNS).Update(t.Context(), l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.clearRequests()
	lists := f.recordLists()
	if err := f.slots.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	if reqs, want := f.requests(), map[string]int{"list own leases": 2}; !sameCounts(reqs, want) {
		t.Errorf("release after a restart: requests %v, want %v (nothing of ours deleted)", reqs, want)
	}
	if got := lists.take(); fmt.Sprint(got) != fmt.Sprint([][]string{{slotName(DefaultSlotPrefix, 0)}, nil}) {
		t.Errorf("the LISTs returned %v, want slot 0 (labelled ours) and nothing", got)
	}
	restarted := New(f.client, f.meta, slotSelf, f.slots.cfg, slotTestLog(), WithClock(func() time.Time { return slotT0 }), WithoutSpread())
	f.clearRequests()
	d, err := restarted.Acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if want := (Decision{Slot: -1, Limit: 1, Fleet: 4, Occupied: 1, Seen: 1}); d != want {
		t.Errorf("decision %+v, want %+v", d, want)
	}
	if got := f.requests(); got["update leases"] != 0 || got["delete leases"] != 0 {
		t.Errorf("requests %v: wrote another node's Lease", got)
	}
	if l := f.lease(t, 0); leaseHolder(l) != "fleet-1" {
		t.Errorf("slot 0 held by %q, want fleet-1 still", leaseHolder(l))
	}
	restarted.mu.Lock()
	restarted.unfollow()
	restarted.mu.Unlock()
}

// TestSlotsOlderOwnLeaseFound: a Lease of ours written by an older agent
// (no bucket label, no holder label) is found by the LIST of Leases
// without a holder label and renewed, and the renew adds both labels: the
// next restart finds it by its holder label, and the LIST of unlabelled
// Leases returns nothing.
func TestSlotsOlderOwnLeaseFound(t *testing.T) {
	f := newSlotFixture(t, 199, true, nil, heldBy(0, 20), Config{MaxFraction: 0.2}) // K = 40
	f.addOlderLease(t, 21, slotSelf)
	lists := f.recordLists()
	for run := range 2 {
		s := New(f.client, f.meta, slotSelf, f.slots.cfg, slotTestLog(), WithClock(func() time.Time { return slotT0 }), WithoutSpread())
		f.clearRequests()
		d, err := s.Acquire(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if want := (Decision{Held: true, Slot: 21}); d != want {
			t.Errorf("run %d: decision %+v, want %+v", run, d, want)
		}
		if reqs, want := f.requests(), map[string]int{"list own leases": 2, "update leases": 1}; !sameCounts(reqs, want) {
			t.Errorf("run %d: requests %v, want %v", run, reqs, want)
		}
		name := slotName(DefaultSlotPrefix, 21)
		want := [][]string{nil, {name}}
		if run > 0 {
			want = [][]string{{name}, nil}
		}
		if got := lists.take(); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("run %d: the LISTs returned %v, want %v", run, got, want)
		}
		if l := f.lease(t, 21); l.Labels[BucketLabel] != "1" || l.Labels[HolderLabel] != slotSelf || l.Labels[SlotLabel] != DefaultSlotPrefix {
			t.Errorf("run %d: renewed Lease's labels %v, want bucket 1 and holder %s", run, l.Labels, slotSelf)
		}
	}
}

// TestHolderValue: a node name that is a valid label value is its own
// holder value; a longer one (a node name may have 253 characters, a
// label value 63) is "sha256-" and 40 hex digits, a valid label value,
// the same every time and different for names that differ only at the
// end.
func TestHolderValue(t *testing.T) {
	long := strings.Repeat("a", 60) + ".example.com"
	for _, name := range []string{slotSelf, strings.Repeat("n", 63), "gpu-node-17.zone-b.example.com"} {
		if got := HolderValue(name); got != name {
			t.Errorf("HolderValue(%q) = %q, want the name", name, got)
		}
	}
	seen := map[string]string{}
	for _, name := range []string{strings.Repeat("n", 64), long, long[:len(long)-1] + "n", strings.Repeat("x.", 126) + "x"} {
		got := HolderValue(name)
		if msgs := validation.IsValidLabelValue(got); len(msgs) > 0 {
			t.Errorf("HolderValue(%q) = %q, not a label value: %v", name, got, msgs)
		}
		hexPart, ok := strings.CutPrefix(got, "sha256-")
		if !ok || len(hexPart) != 40 || strings.Trim(hexPart, "0123456789abcdef") != "" {
			t.Errorf("HolderValue(%q) = %q, want sha256- and 40 hex digits", name, got)
		}
		if again := HolderValue(name); again != got {
			t.Errorf("HolderValue(%q) = %q, then %q", name, got, again)
		}
		if other, dup := seen[got]; dup {
			t.Errorf("%q and %q share the holder value %q", name, other, got)
		}
		seen[got] = name
	}
}

// TestSlotsLongNodeName: a node whose name is too long for a label value
// labels its Lease with the hashed value, and after a restart finds it by
// that value.
func TestSlotsLongNodeName(t *testing.T) {
	node := strings.Repeat("a", 60) + ".example.com"
	f := newSlotFixture(t, 9, true, nil, nil, Config{MaxFraction: 0.2}) // K = 2
	start := func() *Slots {
		return New(f.client, f.meta, node, f.slots.cfg, slotTestLog(), WithClock(func() time.Time { return slotT0 }), WithoutSpread())
	}
	d, err := start().Acquire(t.Context())
	if err != nil || !d.Held {
		t.Fatalf("acquire = %+v, %v; want held", d, err)
	}
	l := f.lease(t, d.Slot)
	if got := l.Labels[HolderLabel]; got != HolderValue(node) || got == node {
		t.Errorf("holder label %q, want the hashed value %q", got, HolderValue(node))
	}
	f.clearRequests()
	lists := f.recordLists()
	d2, err := start().Acquire(t.Context())
	if err != nil || d2 != (Decision{Held: true, Slot: d.Slot}) {
		t.Fatalf("after a restart: %+v, %v; want slot %d renewed", d2, err, d.Slot)
	}
	if lists := f.leaseLists(); fmt.Sprint(lists) != fmt.Sprint(ownSelectors(node)) {
		t.Errorf("listed %q, want %q", lists, ownSelectors(node))
	}
	if got := lists.take(); fmt.Sprint(got) != fmt.Sprint([][]string{{l.Name}, nil}) {
		t.Errorf("the LISTs returned %v, want its Lease by the holder label", got)
	}
}

// TestSlotsTakeoverReplacesHolderLabel: a takeover labels the Lease with
// the new holder's value, not the previous holder's.
func TestSlotsTakeoverReplacesHolderLabel(t *testing.T) {
	f := newSlotFixture(t, 3, true, nil, []slotLease{{0, "fleet-1", time.Hour}}, Config{MaxFraction: 0.2})
	if got := f.lease(t, 0).Labels[HolderLabel]; got != "fleet-1" {
		t.Fatalf("fixture holder label %q, want fleet-1", got)
	}
	if d, err := f.slots.Acquire(t.Context()); err != nil || !d.Held || d.Slot != 0 {
		t.Fatalf("acquire = %+v, %v; want slot 0 taken over", d, err)
	}
	if l := f.lease(t, 0); leaseHolder(l) != slotSelf || l.Labels[HolderLabel] != slotSelf {
		t.Errorf("after the takeover: holder %q, holder label %q; want %q for both", leaseHolder(l), l.Labels[HolderLabel], slotSelf)
	}
	// Released, it is gone, and a further restart finds nothing.
	if err := f.slots.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := f.client.CoordinationV1().Leases(slotNS).Get(t.Context(), slotName(DefaultSlotPrefix, 0), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("slot 0 after release: %v, want NotFound", err)
	}
}
