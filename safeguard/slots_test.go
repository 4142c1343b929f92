package safeguard

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpu-node-agent/gpu-node-agent/kubeapi/kubeapitest"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/metadata"
	metadatafake "k8s.io/client-go/metadata/fake"
	k8stesting "k8s.io/client-go/testing"
)

const (
	slotNS    = "gpu-node-agent"
	slotTaint = "gpu-node-agent.io/unhealthy"
	slotSelf  = "self"
)

var slotT0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func slotTestLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// slotLease is slot i held by holder, last renewed ago before slotT0, for 15m.
type slotLease struct {
	index  int
	holder string
	ago    time.Duration
}

// slotFixture is a fake API server with a fleet of nodes and slot leases.
type slotFixture struct {
	client *fake.Clientset
	meta   *metadatafake.FakeMetadataClient
	slots  *Slots
	// now is the clock (atomic: a follower's informer reads it too).
	now atomic.Pointer[time.Time]
	// sleeps are the delays Slots asked for (none is waited).
	sleeps []time.Duration
}

// newSlotFixture builds nodes fleet-0..fleet-(n-1) (labelled fleet=a, plus
// slotSelf when inFleet), taints the named ones, and creates leases.
func newSlotFixture(t *testing.T, n int, selfInFleet bool, tainted []string, leases []slotLease, cfg Config) *slotFixture {
	t.Helper()
	var objs []runtime.Object
	var metas []runtime.Object
	addNode := func(name string) {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"fleet": "a"}}}
		for _, tn := range tainted {
			if tn == name {
				node.Spec.Taints = []corev1.Taint{{Key: slotTaint, Value: "xid", Effect: corev1.TaintEffectNoSchedule}}
			}
		}
		objs = append(objs, node)
		metas = append(metas, &metav1.PartialObjectMetadata{
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
			ObjectMeta: node.ObjectMeta,
		})
	}
	for i := range n {
		addNode(fmt.Sprintf("fleet-%d", i))
	}
	if selfInFleet {
		addNode(slotSelf)
	}
	// A node outside the fleet must not count.
	objs = append(objs, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "outsider"}})
	metas = append(metas, &metav1.PartialObjectMetadata{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"}, ObjectMeta: metav1.ObjectMeta{Name: "outsider"},
	})
	cfg.Namespace, cfg.TaintKey, cfg.NodeSelector = slotNS, slotTaint, "fleet=a"
	cfg = cfg.WithDefaults()
	for _, l := range leases {
		renew := metav1.NewMicroTime(slotT0.Add(-l.ago))
		objs = append(objs, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: slotName(cfg.Prefix, l.index), Namespace: slotNS,
				Labels: map[string]string{SlotLabel: cfg.Prefix, BucketLabel: strconv.Itoa(bucketOf(l.index)),
					HolderLabel: HolderValue(l.holder)}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: new(l.holder), LeaseDurationSeconds: new(int32(900)),
				AcquireTime: &renew, RenewTime: &renew, LeaseTransitions: new(int32(3))},
		})
	}
	scheme := metadatafake.NewTestScheme()
	if err := metav1.AddMetaToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	f := &slotFixture{client: fake.NewClientset(objs...), meta: metadatafake.NewSimpleMetadataClient(scheme, metas...)}
	f.setNow(slotT0)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	f.slots = New(f.client, f.meta, slotSelf, cfg, slotTestLog())
	f.slots.now = func() time.Time { return *f.now.Load() }
	f.slots.randIntN = func(int) int { return 0 }
	f.slots.jitter = func(max time.Duration) time.Duration { return max / 2 }
	f.slots.sleep = func(_ context.Context, d time.Duration) error {
		f.sleeps = append(f.sleeps, d)
		return nil
	}
	f.slots.hintWait = func(context.Context) error { return nil }
	return f
}

func (f *slotFixture) setNow(t time.Time) { f.now.Store(&t) }

// later moves the clock on by lookGap: a refused node asking then lists
// a bucket again.
func (f *slotFixture) later() { f.setNow(f.slots.now().Add(lookGap)) }

// record writes a fleet size measured ago before slotT0 on slot i's
// Lease, as its holder would.
func (f *slotFixture) record(t *testing.T, i, size int, ago time.Duration) {
	t.Helper()
	l := f.lease(t, i)
	l.Annotations = map[string]string{
		FleetSizeAnnotation:           strconv.Itoa(size),
		FleetSizeMeasuredAtAnnotation: slotT0.Add(-ago).Format(time.RFC3339),
	}
	if _, err := f.client.CoordinationV1().Leases(slotNS).Update(context.Background(), l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.clearRequests()
}

// requests counts the fake clients' actions as "verb resource", leaving
// out the follower's (see isFollow). A LIST of Leases selecting
// HolderLabel (findOwn's) counts as "list own leases".
func (f *slotFixture) requests() map[string]int {
	f.slots.hintWrites.Wait()
	out := map[string]int{}
	for _, a := range f.client.Actions() {
		if isFollow(a) {
			continue
		}
		if l, ok := a.(k8stesting.ListActionImpl); ok && strings.Contains(l.ListOptions.LabelSelector, HolderLabel) {
			out["list own leases"]++
			continue
		}
		out[a.GetVerb()+" "+a.GetResource().Resource]++
	}
	for _, a := range f.meta.Actions() {
		out["metadata "+a.GetVerb()+" "+a.GetResource().Resource]++
	}
	return out
}

// isFollow says whether a is the follower's informer at work: its watch,
// or its LIST (the reflector lists from resourceVersion "0"; with the
// fake clientset it lists and watches rather than streaming the list).
func isFollow(a k8stesting.Action) bool {
	switch a := a.(type) {
	case k8stesting.WatchActionImpl:
		return true
	case k8stesting.ListActionImpl:
		return a.ListOptions.ResourceVersion != ""
	}
	return false
}

// followed waits until s follows a bucket with a synced cache and
// returns that bucket.
func followed(t *testing.T, s *Slots) int {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		s.mu.Lock()
		f := s.follow
		s.mu.Unlock()
		if f != nil && f.synced.Load() {
			return f.bucket
		}
		if time.Now().After(deadline) {
			t.Fatal("the refused node follows no bucket with a synced cache")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (f *slotFixture) clearRequests() {
	f.slots.hintWrites.Wait()
	f.client.ClearActions()
	f.meta.ClearActions()
}

// lease is slot i's Lease; i = -1 is the full-bucket hint.
func (f *slotFixture) lease(t *testing.T, i int) *coordinationv1.Lease {
	t.Helper()
	name := slotName(DefaultSlotPrefix, i)
	if i < 0 {
		name = DefaultSlotPrefix + "-full"
	}
	l, err := f.client.CoordinationV1().Leases(slotNS).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get lease %d: %v", i, err)
	}
	return l
}

func TestLimit(t *testing.T) {
	tests := []struct {
		name string
		n    int
		f    float64
		want int
	}{
		{"N=40 f=0.2: exactly 8 despite float error", 40, 0.2, 8},
		{"N=4 f=0.2: 0.8 rounds to the minimum 1", 4, 0.2, 1},
		{"N=7 f=0.3: 2.1 rounds down to 2", 7, 0.3, 2},
		{"N=100 f=0.07: 7.000000000000001 is 7", 100, 0.07, 7},
		{"N=10 f=0.3: 2.9999999999999996 is 3", 10, 0.3, 3},
		{"N=0: one node may always be tainted", 0, 0.2, 1},
		{"N=7500 f=0.2: 1500", 7500, 0.2, 1500},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Limit(tc.n, tc.f); got != tc.want {
				t.Errorf("Limit(%d, %g) = %d, want %d", tc.n, tc.f, got, tc.want)
			}
		})
	}
}

func TestSlotsAcquire(t *testing.T) {
	expired := 16 * time.Minute
	tests := []struct {
		name        string
		fleet       int
		selfInFleet bool
		maxFraction float64
		tainted     []string
		leases      []slotLease
		want        Decision
		// wantRequests counts requests as "verb resource" (see
		// requests). The node has just started: it first looks up its own
		// Leases (two LISTs); holding none, it lists one bucket (the
		// selector makes measuring read Nodes, so it reads the sizes
		// recorded there first, see probe).
		wantRequests map[string]int
	}{
		{
			name: "free slot taken", fleet: 9, selfInFleet: true, maxFraction: 0.2,
			want:         Decision{Held: true, Slot: 0, Limit: 2, Fleet: 10, Seen: 2},
			wantRequests: map[string]int{"list own leases": 2, "list leases": 1, "metadata list nodes": 1, "create leases": 1},
		},
		{
			name: "first slot taken, the next free one is tried", fleet: 9, selfInFleet: true, maxFraction: 0.2,
			leases:       []slotLease{{0, "fleet-1", time.Minute}},
			want:         Decision{Held: true, Slot: 1, Limit: 2, Fleet: 10, Occupied: 1, Seen: 2},
			wantRequests: map[string]int{"list own leases": 2, "list leases": 1, "metadata list nodes": 1, "create leases": 1},
		},
		{
			name: "all slots held: refused, no write, no node read", fleet: 9, selfInFleet: true, maxFraction: 0.2,
			leases:       []slotLease{{0, "fleet-1", time.Minute}, {1, "fleet-2", 14 * time.Minute}},
			want:         Decision{Slot: -1, Limit: 2, Fleet: 10, Occupied: 2, Seen: 2},
			wantRequests: map[string]int{"list own leases": 2, "list leases": 1, "metadata list nodes": 1},
		},
		{
			name: "already the holder: renews, no fleet read", fleet: 9, selfInFleet: true, maxFraction: 0.2,
			leases:       []slotLease{{0, "fleet-1", time.Minute}, {1, slotSelf, time.Minute}},
			want:         Decision{Held: true, Slot: 1},
			wantRequests: map[string]int{"list own leases": 2, "update leases": 1},
		},
		{
			name: "already the holder of an expired slot: renews", fleet: 9, selfInFleet: true, maxFraction: 0.2,
			leases:       []slotLease{{1, slotSelf, expired}},
			want:         Decision{Held: true, Slot: 1},
			wantRequests: map[string]int{"list own leases": 2, "update leases": 1},
		},
		{
			name: "expired lease, untainted holder: taken over", fleet: 3, selfInFleet: true, maxFraction: 0.2,
			leases:       []slotLease{{0, "fleet-1", expired}},
			want:         Decision{Held: true, Slot: 0, Limit: 1, Fleet: 4, Seen: 1},
			wantRequests: map[string]int{"list own leases": 2, "list leases": 1, "metadata list nodes": 1, "get nodes": 1, "update leases": 1},
		},
		{
			name: "expired lease, tainted holder: stays occupied", fleet: 3, selfInFleet: true, maxFraction: 0.2,
			tainted:      []string{"fleet-1"},
			leases:       []slotLease{{0, "fleet-1", expired}},
			want:         Decision{Slot: -1, Limit: 1, Fleet: 4, Occupied: 1, Seen: 1},
			wantRequests: map[string]int{"list own leases": 2, "list leases": 1, "metadata list nodes": 1, "get nodes": 1},
		},
		{
			name: "unexpired lease, untainted holder: occupied without a node read", fleet: 3, selfInFleet: true, maxFraction: 0.2,
			leases:       []slotLease{{0, "fleet-1", 14 * time.Minute}},
			want:         Decision{Slot: -1, Limit: 1, Fleet: 4, Occupied: 1, Seen: 1},
			wantRequests: map[string]int{"list own leases": 2, "list leases": 1, "metadata list nodes": 1},
		},
		{
			name: "expired lease, holder node gone: free", fleet: 3, selfInFleet: true, maxFraction: 0.2,
			leases:       []slotLease{{0, "deleted-node", expired}},
			want:         Decision{Held: true, Slot: 0, Limit: 1, Fleet: 4, Seen: 1},
			wantRequests: map[string]int{"list own leases": 2, "list leases": 1, "metadata list nodes": 1, "get nodes": 1, "update leases": 1},
		},
		{
			name: "fleet shrank: the holder keeps its slot at index >= K", fleet: 3, selfInFleet: true, maxFraction: 0.2,
			leases:       []slotLease{{0, "fleet-1", time.Minute}, {5, slotSelf, time.Minute}},
			want:         Decision{Held: true, Slot: 5},
			wantRequests: map[string]int{"list own leases": 2, "update leases": 1},
		},
		{
			name: "slots at or above K do not count against it", fleet: 9, selfInFleet: true, maxFraction: 0.2,
			leases:       []slotLease{{0, "fleet-1", time.Minute}, {2, "fleet-2", time.Minute}, {3, "fleet-3", time.Minute}},
			want:         Decision{Held: true, Slot: 1, Limit: 2, Fleet: 10, Occupied: 1, Seen: 2},
			wantRequests: map[string]int{"list own leases": 2, "list leases": 1, "metadata list nodes": 1, "create leases": 1},
		},
		{
			name: "slotSelf counted when not in the fleet list", fleet: 4, maxFraction: 0.4,
			leases:       []slotLease{{0, "fleet-1", time.Minute}},
			want:         Decision{Held: true, Slot: 1, Limit: 2, Fleet: 5, Occupied: 1, Seen: 2},
			wantRequests: map[string]int{"list own leases": 2, "list leases": 1, "metadata list nodes": 1, "create leases": 1},
		},
		{
			name: "MaxFraction 1: always held, no requests", fleet: 3, selfInFleet: true, maxFraction: 1,
			leases:       []slotLease{{0, "fleet-1", time.Minute}},
			want:         Decision{Held: true, Slot: -1},
			wantRequests: map[string]int{},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newSlotFixture(t, tc.fleet, tc.selfInFleet, tc.tainted, tc.leases, Config{MaxFraction: tc.maxFraction})
			got, err := f.slots.Acquire(context.Background())
			if err != nil {
				t.Fatalf("acquire: %v", err)
			}
			if got != tc.want {
				t.Errorf("decision %+v, want %+v", got, tc.want)
			}
			if reqs := f.requests(); !sameCounts(reqs, tc.wantRequests) {
				t.Errorf("requests %v, want %v", reqs, tc.wantRequests)
			}
			if got.Held && got.Slot >= 0 {
				l := f.lease(t, got.Slot)
				if leaseHolder(l) != slotSelf || l.Spec.RenewTime == nil || !l.Spec.RenewTime.Time.Equal(slotT0) ||
					l.Labels[SlotLabel] != DefaultSlotPrefix || l.Labels[HolderLabel] != slotSelf || *l.Spec.LeaseDurationSeconds != 900 {
					t.Errorf("held lease %s: holder %q renewTime %v labels %v duration %d, want %q, %v, the slot and holder labels, 900",
						l.Name, leaseHolder(l), l.Spec.RenewTime, l.Labels, *l.Spec.LeaseDurationSeconds, slotSelf, slotT0)
				}
				// A slot taken (not renewed) records the size it was
				// granted on, measured just now.
				if r, ok := recordOf(l); got.Limit > 0 && (!ok || r.n != got.Fleet || !r.at.Equal(slotT0)) {
					t.Errorf("held lease %s records %+v (%v), want size %d measured at %v", l.Name, r, ok, got.Fleet, slotT0)
				}
			}
		})
	}
}

// sizeOn is a fleet size recorded on slot index, measured ago before slotT0.
type sizeOn struct {
	index, size int
	ago         time.Duration
}

// TestSlotsFleetSizeRecords: the sizes recorded on the slot Leases stand
// in for measuring when fresh and recorded by recordQuorum holders (the
// smallest is used), prove a refusal on their own when the unexpired
// Leases fill their K, and never grant on a stale size. The node has just
// started: it holds no slot and has no fresh size of its own, so it lists
// a bucket for the records (see TestSlotsRecordsAdjustOwnSize for a node
// with a fresh size).
func TestSlotsFleetSizeRecords(t *testing.T) {
	expired := 16 * time.Minute
	tests := []struct {
		name        string
		fleet       int
		maxFraction float64
		leases      []slotLease
		records     []sizeOn
		// cached is this node's own size, measured cachedAgo before slotT0.
		cached    int
		cachedAgo time.Duration
		want      Decision
		// wantRecord is the size and measuring time recorded on the slot
		// taken.
		wantRecord *sizeRecord
		// wantRequests leave out the lookup of its own Leases (two LISTs)
		// every case starts with.
		wantRequests map[string]int
		wantSleeps   []time.Duration
	}{
		{
			name: "two holders' fresh records: the smallest used, no node LIST", fleet: 19, maxFraction: 0.2,
			leases:       []slotLease{{0, "fleet-1", time.Minute}, {1, "fleet-2", time.Minute}},
			records:      []sizeOn{{0, 20, 2 * time.Minute}, {1, 25, time.Minute}},
			want:         Decision{Held: true, Slot: 2, Limit: 4, Fleet: 20, Occupied: 2, Seen: 4},
			wantRecord:   &sizeRecord{20, slotT0.Add(-2 * time.Minute)},
			wantRequests: map[string]int{"list leases": 1, "create leases": 1},
			wantSleeps:   []time.Duration{coldSpread / 2},
		},
		{
			name: "one holder's fresh record alone: measured", fleet: 19, maxFraction: 0.2,
			leases:       []slotLease{{0, "fleet-1", time.Minute}},
			records:      []sizeOn{{0, 1000, time.Minute}},
			want:         Decision{Held: true, Slot: 1, Limit: 4, Fleet: 20, Occupied: 1, Seen: 4},
			wantRecord:   &sizeRecord{20, slotT0},
			wantRequests: map[string]int{"list leases": 1, "metadata list nodes": 1, "create leases": 1},
			wantSleeps:   []time.Duration{coldSpread / 2},
		},
		{
			name: "two records of one holder: measured", fleet: 19, maxFraction: 0.2,
			leases:       []slotLease{{0, "fleet-1", time.Minute}, {7, "fleet-1", time.Minute}},
			records:      []sizeOn{{0, 1000, time.Minute}, {7, 1000, time.Minute}},
			want:         Decision{Held: true, Slot: 1, Limit: 4, Fleet: 20, Occupied: 1, Seen: 4},
			wantRequests: map[string]int{"list leases": 1, "metadata list nodes": 1, "create leases": 1},
			wantSleeps:   []time.Duration{coldSpread / 2},
		},
		{
			name: "stale records: measured", fleet: 19, maxFraction: 0.2,
			leases:       []slotLease{{0, "fleet-1", time.Minute}, {1, "fleet-2", time.Minute}},
			records:      []sizeOn{{0, 30, DefaultFleetSizeTTL}, {1, 30, time.Hour}},
			want:         Decision{Held: true, Slot: 2, Limit: 4, Fleet: 20, Occupied: 2, Seen: 4},
			wantRecord:   &sizeRecord{20, slotT0},
			wantRequests: map[string]int{"list leases": 1, "metadata list nodes": 1, "create leases": 1},
			wantSleeps:   []time.Duration{coldSpread / 2},
		},
		{
			name: "records measured far in the future: not fresh, measured", fleet: 19, maxFraction: 0.2,
			leases:       []slotLease{{0, "fleet-1", time.Minute}, {1, "fleet-2", time.Minute}},
			records:      []sizeOn{{0, 30, -DefaultFleetSizeTTL}, {1, 30, -time.Hour}},
			want:         Decision{Held: true, Slot: 2, Limit: 4, Fleet: 20, Occupied: 2, Seen: 4},
			wantRequests: map[string]int{"list leases": 1, "metadata list nodes": 1, "create leases": 1},
			wantSleeps:   []time.Duration{coldSpread / 2},
		},
		{
			name: "unexpired leases fill K of a stale record: refused without measuring", fleet: 19, maxFraction: 0.2,
			leases:       []slotLease{{0, "fleet-1", time.Minute}, {1, "fleet-2", time.Minute}},
			records:      []sizeOn{{0, 10, time.Hour}},
			want:         Decision{Slot: -1, Limit: 2, Fleet: 10, Occupied: 2, Seen: 2},
			wantRequests: map[string]int{"list leases": 1},
			wantSleeps:   []time.Duration{coldSpread / 2},
		},
		{
			name: "unexpired leases fill K of a stale cache: refused without measuring", fleet: 19, maxFraction: 0.2,
			leases: []slotLease{{0, "fleet-1", time.Minute}, {1, "fleet-2", time.Minute}},
			cached: 10, cachedAgo: time.Hour,
			want:         Decision{Slot: -1, Limit: 2, Fleet: 10, Occupied: 2, Seen: 2},
			wantRequests: map[string]int{"list leases": 1},
			wantSleeps:   []time.Duration{coldSpread / 2},
		},
		{
			name: "the largest stale size leaves room: measured, granted on the fresh size", fleet: 19, maxFraction: 0.2,
			leases:       []slotLease{{0, "fleet-1", time.Minute}, {1, "fleet-2", time.Minute}},
			records:      []sizeOn{{0, 10, time.Hour}, {1, 15, time.Hour}},
			want:         Decision{Held: true, Slot: 2, Limit: 4, Fleet: 20, Occupied: 2, Seen: 4},
			wantRecord:   &sizeRecord{20, slotT0},
			wantRequests: map[string]int{"list leases": 1, "metadata list nodes": 1, "create leases": 1},
			wantSleeps:   []time.Duration{coldSpread / 2},
		},
		{
			name: "expired leases do not prove a stale refusal: measured", fleet: 19, maxFraction: 0.2,
			leases:  []slotLease{{0, "fleet-1", time.Minute}, {1, "fleet-2", expired}},
			records: []sizeOn{{0, 10, time.Hour}},
			want:    Decision{Held: true, Slot: 1, Limit: 4, Fleet: 20, Occupied: 1, Seen: 4},
			wantRequests: map[string]int{"list leases": 1, "metadata list nodes": 1, "get nodes": 1,
				"update leases": 1},
			wantRecord: &sizeRecord{20, slotT0},
			wantSleeps: []time.Duration{coldSpread / 2},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newSlotFixture(t, tc.fleet, true, nil, tc.leases, Config{MaxFraction: tc.maxFraction})
			for _, r := range tc.records {
				f.record(t, r.index, r.size, r.ago)
			}
			if tc.cached > 0 {
				f.slots.fleet, f.slots.fleetAt = tc.cached, slotT0.Add(-tc.cachedAgo)
			}
			got, err := f.slots.Acquire(context.Background())
			if err != nil {
				t.Fatalf("acquire: %v", err)
			}
			if got != tc.want {
				t.Errorf("decision %+v, want %+v", got, tc.want)
			}
			want := maps.Clone(tc.wantRequests)
			want["list own leases"] = 2
			if reqs := f.requests(); !sameCounts(reqs, want) {
				t.Errorf("requests %v, want %v", reqs, want)
			}
			if fmt.Sprint(f.sleeps) != fmt.Sprint(tc.wantSleeps) {
				t.Errorf("delays %v, want %v", f.sleeps, tc.wantSleeps)
			}
			if tc.wantRecord != nil {
				r, ok := recordOf(f.lease(t, got.Slot))
				if !ok || r.n != tc.wantRecord.n || !r.at.Equal(tc.wantRecord.at) {
					t.Errorf("slot %d records %+v (%v), want %+v", got.Slot, r, ok, *tc.wantRecord)
				}
			}
		})
	}
}

// TestSlotsRecordsAdjustOwnSize: a node with a fresh size of its own
// uses a lower size another holder recorded on a Lease it reads (here the
// bucket it follows, from its watch's cache), never a higher one. Each
// case is refused first with every slot under the K of its own size held;
// then slots 2 and 3 are freed, and the next ask decides on what the
// followed bucket shows: with the own size of 20 (K = 4) it would take
// slot 2; a record of 10 makes K = 2, both held, refused. With an own
// size of 10 (K = 2), two holders' records of 1,000 do not raise K to
// 200: refused still.
func TestSlotsRecordsAdjustOwnSize(t *testing.T) {
	for _, tc := range []struct {
		name    string
		own     int
		records []sizeOn
		want    Decision
		// wantCache is the node's size afterwards and when it was measured.
		wantCache sizeRecord
	}{
		{
			name: "a lower record lowers it", own: 20,
			records:   []sizeOn{{0, 10, 3 * time.Minute}},
			want:      Decision{Slot: -1, Limit: 2, Fleet: 10, Occupied: 2, Seen: 2},
			wantCache: sizeRecord{10, slotT0.Add(-3 * time.Minute)},
		},
		{
			name: "higher records do not raise it", own: 10,
			records:   []sizeOn{{0, 1000, time.Minute}, {1, 1000, time.Minute}},
			want:      Decision{Slot: -1, Limit: 2, Fleet: 10, Occupied: 2, Seen: 2},
			wantCache: sizeRecord{10, slotT0.Add(-2 * time.Minute)},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := Limit(tc.own, 0.2)
			f := newSlotFixture(t, 19, true, nil, heldBy(0, k), Config{MaxFraction: 0.2})
			f.slots.known = true
			f.slots.fleet, f.slots.fleetAt = tc.own, slotT0.Add(-2*time.Minute)
			for _, r := range tc.records {
				f.record(t, r.index, r.size, r.ago)
			}
			d, err := f.slots.Acquire(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if want := (Decision{Slot: -1, Limit: k, Fleet: tc.own, Occupied: k, Seen: k}); d != want {
				t.Fatalf("first ask: %+v, want %+v", d, want)
			}
			if b := followed(t, f.slots); b != 0 {
				t.Fatalf("follows bucket %d, want 0", b)
			}
			for i := 2; i < k; i++ {
				if err := f.client.CoordinationV1().Leases(slotNS).Delete(t.Context(), slotName(DefaultSlotPrefix, i), metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			if k > 2 {
				select {
				case <-f.slots.Room():
				case <-time.After(30 * time.Second):
					t.Fatal("no Room signal after slots of the followed bucket were freed")
				}
			}
			f.clearRequests()
			if d, err = f.slots.Acquire(t.Context()); err != nil {
				t.Fatal(err)
			}
			if d != tc.want {
				t.Errorf("ask from the followed bucket: %+v, want %+v", d, tc.want)
			}
			if f.slots.fleet != tc.wantCache.n || !f.slots.fleetAt.Equal(tc.wantCache.at) {
				t.Errorf("own size %d measured at %v, want %d at %v", f.slots.fleet, f.slots.fleetAt, tc.wantCache.n, tc.wantCache.at)
			}
			// K spans bucket 0 only, read from the watch's cache: no
			// request, no write.
			if reqs := f.requests(); len(reqs) != 0 {
				t.Errorf("ask from the followed bucket made requests %v, want none", reqs)
			}
		})
	}
}

// TestSlotsStaleRefusalOnce: a refusal on a stale size is made once; the
// next Acquire that still finds no fresh size measures, and grants on the
// measured size if the fleet grew. The second ask reads the bucket the
// refused node follows from its watch: no LIST.
func TestSlotsStaleRefusalOnce(t *testing.T) {
	f := newSlotFixture(t, 19, true, nil, []slotLease{{0, "fleet-1", time.Minute}, {1, "fleet-2", time.Minute}}, Config{MaxFraction: 0.2})
	f.record(t, 0, 10, time.Hour)
	f.record(t, 1, 10, time.Hour)
	ctx := t.Context()
	steps := []struct {
		want         Decision
		wantRequests map[string]int
	}{
		{Decision{Slot: -1, Limit: 2, Fleet: 10, Occupied: 2, Seen: 2}, map[string]int{"list own leases": 2, "list leases": 1}},
		{Decision{Held: true, Slot: 2, Limit: 4, Fleet: 20, Occupied: 2, Seen: 4}, map[string]int{"metadata list nodes": 1, "create leases": 1}},
	}
	for i, st := range steps {
		if i > 0 {
			followed(t, f.slots)
		}
		f.clearRequests()
		d, err := f.slots.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if d != st.want {
			t.Errorf("acquire %d: %+v, want %+v", i, d, st.want)
		}
		if reqs := f.requests(); !sameCounts(reqs, st.wantRequests) {
			t.Errorf("acquire %d: requests %v, want %v", i, reqs, st.wantRequests)
		}
	}
}

// TestSlotsRenewRecordsSize: a renew records this node's size on its
// Lease, but keeps a record measured later (a previous run's).
func TestSlotsRenewRecordsSize(t *testing.T) {
	f := newSlotFixture(t, 3, true, nil, []slotLease{{0, slotSelf, time.Minute}}, Config{MaxFraction: 0.2})
	ctx := context.Background()
	f.record(t, 0, 7, time.Minute)
	f.slots.fleet, f.slots.fleetAt = 4, slotT0.Add(-2*time.Minute)
	if d, err := f.slots.Acquire(ctx); err != nil || !d.Held {
		t.Fatalf("acquire = %+v, %v; want held", d, err)
	}
	if r, _ := recordOf(f.lease(t, 0)); r.n != 7 {
		t.Errorf("after renewing with an older size: record %+v, want the later 7 kept", r)
	}
	f.slots.fleet, f.slots.fleetAt = 4, slotT0
	if err := f.slots.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	if r, _ := recordOf(f.lease(t, 0)); r.n != 4 || !r.at.Equal(slotT0) {
		t.Errorf("after renewing with a newer size: record %+v, want 4 at %v", r, slotT0)
	}
}

// TestSlotsNeverBeyondK: nodes of a fleet of 40 (K = 8) acquire at once
// against the versioned fake, with a lying holder's Lease (above K, so it
// occupies nothing) recording a fresh size of a million: however the
// records spread, no more than K slots are granted and every grant is on
// the true size.
func TestSlotsNeverBeyondK(t *testing.T) {
	const (
		fleetSize = 40
		limit     = 8
		faulting  = 24
	)
	for rep := range 5 {
		t.Run(fmt.Sprintf("rep %d", rep), func(t *testing.T) {
			var objs []runtime.Object
			var metas []runtime.Object
			for i := range fleetSize {
				n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("fleet-%d", i), Labels: map[string]string{"fleet": "a"}}}
				objs = append(objs, n)
				metas = append(metas, &metav1.PartialObjectMetadata{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"}, ObjectMeta: n.ObjectMeta})
			}
			at := metav1.NewMicroTime(slotT0)
			objs = append(objs, &coordinationv1.Lease{
				ObjectMeta: metav1.ObjectMeta{Name: slotName(DefaultSlotPrefix, 20), Namespace: slotNS,
					Labels: map[string]string{SlotLabel: DefaultSlotPrefix},
					Annotations: map[string]string{FleetSizeAnnotation: "1000000",
						FleetSizeMeasuredAtAnnotation: slotT0.Format(time.RFC3339)}},
				Spec: coordinationv1.LeaseSpec{HolderIdentity: new("liar"), LeaseDurationSeconds: new(int32(900)),
					AcquireTime: &at, RenewTime: &at},
			})
			client := kubeapitest.NewVersioned(t, objs...)
			scheme := metadatafake.NewTestScheme()
			if err := metav1.AddMetaToScheme(scheme); err != nil {
				t.Fatal(err)
			}
			meta := metadatafake.NewSimpleMetadataClient(scheme, metas...)
			cfg := Config{Namespace: slotNS, MaxFraction: 0.2, TaintKey: slotTaint, NodeSelector: "fleet=a"}
			decisions := make([]Decision, faulting)
			errs := make([]error, faulting)
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i := range faulting {
				s := New(client, meta, fmt.Sprintf("fleet-%d", i), cfg, slotTestLog())
				s.now = func() time.Time { return slotT0 }
				s.sleep = func(context.Context, time.Duration) error { return nil }
				wg.Go(func() {
					<-start
					decisions[i], errs[i] = s.Acquire(context.Background())
				})
			}
			close(start)
			wg.Wait()
			held := map[int]string{}
			for i, d := range decisions {
				if errs[i] != nil {
					t.Fatalf("fleet-%d: %v", i, errs[i])
				}
				if !d.Held {
					continue
				}
				if other, dup := held[d.Slot]; dup {
					t.Errorf("slot %d granted to fleet-%d and %s", d.Slot, i, other)
				}
				held[d.Slot] = fmt.Sprintf("fleet-%d", i)
				if d.Slot >= limit || d.Limit != limit || d.Fleet != fleetSize {
					t.Errorf("fleet-%d granted %+v, want a slot under %d of a fleet of %d", i, d, limit, fleetSize)
				}
			}
			if len(held) < 1 || len(held) > limit {
				t.Errorf("%d slots granted, want 1..%d", len(held), limit)
			}
		})
	}
}

func sameCounts(got, want map[string]int) bool {
	if len(got) != len(want) {
		return false
	}
	for k, v := range want {
		if got[k] != v {
			return false
		}
	}
	return true
}

// TestSlotsTakeoverBumpsTransitions: a takeover is a new holder, so
// leaseTransitions counts it (as client-go's leader election does).
func TestSlotsTakeoverBumpsTransitions(t *testing.T) {
	f := newSlotFixture(t, 3, true, nil, []slotLease{{0, "fleet-1", time.Hour}}, Config{MaxFraction: 0.2})
	if d, err := f.slots.Acquire(context.Background()); err != nil || !d.Held {
		t.Fatalf("acquire = %+v, %v; want held", d, err)
	}
	l := f.lease(t, 0)
	if *l.Spec.LeaseTransitions != 4 || !l.Spec.AcquireTime.Time.Equal(slotT0) {
		t.Errorf("leaseTransitions %d acquireTime %v, want 4 and %v", *l.Spec.LeaseTransitions, l.Spec.AcquireTime, slotT0)
	}
}

// TestSlotsLostRace: when another node creates the only free slot first,
// Acquire refuses and follows the bucket where it lost the race; asking
// again reads the winner's Lease from the watch's cache, no request.
func TestSlotsLostRace(t *testing.T) {
	f := newSlotFixture(t, 3, true, nil, nil, Config{MaxFraction: 0.2})
	f.client.PrependReactor("create", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		l := a.(k8stesting.CreateAction).GetObject().(*coordinationv1.Lease).DeepCopy()
		l.Spec.HolderIdentity = new("fleet-2")
		if err := f.client.Tracker().Create(a.GetResource(), l, slotNS); err != nil {
			return true, nil, err
		}
		return true, nil, apierrors.NewAlreadyExists(schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}, l.Name)
	})
	d, err := f.slots.Acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	want := Decision{Slot: -1, Limit: 1, Fleet: 4, Occupied: 1, Seen: 1}
	if d != want {
		t.Errorf("decision %+v, want %+v", d, want)
	}
	wantReqs := map[string]int{"list own leases": 2, "list leases": 1, "metadata list nodes": 1, "create leases": 1}
	if reqs := f.requests(); !sameCounts(reqs, wantReqs) {
		t.Errorf("requests %v, want %v", reqs, wantReqs)
	}
	if b := followed(t, f.slots); b != 0 {
		t.Fatalf("follows bucket %d, want 0, where it lost the race", b)
	}
	f.clearRequests()
	if d, err = f.slots.Acquire(t.Context()); err != nil || d != want {
		t.Errorf("asking again: %+v, %v; want %+v", d, err, want)
	}
	if reqs := f.requests(); len(reqs) != 0 {
		t.Errorf("asking again made requests %v, want none (the fleet size cached, the bucket from the watch)", reqs)
	}
}

// TestSlotsRenewRelease walks the life of a slot: acquired, renewed
// before a taint write, released after the taint is removed; then Renew
// refuses and Release makes no request.
func TestSlotsRenewRelease(t *testing.T) {
	f := newSlotFixture(t, 3, true, nil, nil, Config{MaxFraction: 0.2})
	ctx := context.Background()
	if err := f.slots.Renew(ctx); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("renew before acquire: %v, want ErrNotHeld", err)
	}
	if d, err := f.slots.Acquire(ctx); err != nil || !d.Held {
		t.Fatalf("acquire = %+v, %v; want held", d, err)
	}
	f.setNow(slotT0.Add(time.Minute))
	f.clearRequests()
	if err := f.slots.Renew(ctx); err != nil {
		t.Fatalf("renew: %v", err)
	}
	if reqs, want := f.requests(), map[string]int{"update leases": 1}; !sameCounts(reqs, want) {
		t.Errorf("renew requests %v, want %v", reqs, want)
	}
	if l := f.lease(t, 0); !l.Spec.RenewTime.Time.Equal(*f.now.Load()) {
		t.Errorf("renewTime %v after renew, want %v", l.Spec.RenewTime, *f.now.Load())
	}
	f.clearRequests()
	if err := f.slots.Release(ctx); err != nil {
		t.Fatalf("release: %v", err)
	}
	if reqs, want := f.requests(), map[string]int{"delete leases": 1}; !sameCounts(reqs, want) {
		t.Errorf("release requests %v, want %v", reqs, want)
	}
	if _, err := f.client.CoordinationV1().Leases(slotNS).Get(ctx, slotName(DefaultSlotPrefix, 0), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("lease after release: %v, want NotFound", err)
	}
	f.clearRequests()
	if err := f.slots.Renew(ctx); !errors.Is(err, ErrNotHeld) {
		t.Errorf("renew after release: %v, want ErrNotHeld", err)
	}
	if err := f.slots.Release(ctx); err != nil {
		t.Errorf("second release: %v", err)
	}
	if reqs := f.requests(); len(reqs) != 0 {
		t.Errorf("renew+release with nothing held made requests %v", reqs)
	}
}

// TestSlotsRenewTakenOver: when the renew conflicts because another node
// took the slot over, Renew says ErrNotHeld (do not taint).
func TestSlotsRenewTakenOver(t *testing.T) {
	f := newSlotFixture(t, 3, true, nil, nil, Config{MaxFraction: 0.2})
	ctx := context.Background()
	if d, err := f.slots.Acquire(ctx); err != nil || !d.Held {
		t.Fatalf("acquire = %+v, %v; want held", d, err)
	}
	// Another node takes the slot over (the fake does not check
	// resourceVersions, so the conflict is injected).
	taken := f.lease(t, 0)
	taken.Spec.HolderIdentity = new("fleet-1")
	if _, err := f.client.CoordinationV1().Leases(slotNS).Update(ctx, taken, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.client.PrependReactor("update", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewConflict(schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}, taken.Name, errors.New("modified"))
	})
	err := f.slots.Renew(ctx)
	if !errors.Is(err, ErrNotHeld) || !strings.Contains(err.Error(), "fleet-1") {
		t.Errorf("renew of a slot taken over: %v, want ErrNotHeld naming fleet-1", err)
	}
	if err := f.slots.Renew(ctx); !errors.Is(err, ErrNotHeld) {
		t.Errorf("second renew: %v, want ErrNotHeld", err)
	}
}

// TestSlotsReleaseAfterRestart: a fresh Slots finds the Lease a previous
// run held with the two LISTs of its own Leases and deletes it; Releases
// after that make no requests.
func TestSlotsReleaseAfterRestart(t *testing.T) {
	f := newSlotFixture(t, 3, true, nil, []slotLease{{0, "fleet-1", time.Minute}, {2, slotSelf, time.Minute}}, Config{MaxFraction: 0.2})
	ctx := context.Background()
	for range 2 {
		if err := f.slots.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// And, knowing no fleet size, a GET of the full-bucket hint to clear
	// the released slot's bucket (absent here: nothing written).
	wantReqs := map[string]int{"list own leases": 2, "delete leases": 1, "get leases": 1}
	if reqs := f.requests(); !sameCounts(reqs, wantReqs) {
		t.Errorf("requests %v, want %v", reqs, wantReqs)
	}
	list, err := f.client.CoordinationV1().Leases(slotNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 1 || leaseHolder(&list.Items[0]) != "fleet-1" {
		t.Errorf("leases after release %v, want only fleet-1's", list.Items)
	}
}

// TestSlotsFleetSizeCached: refused Acquires reuse the fleet size for
// FleetSizeTTL, then measure it again, following continue tokens.
func TestSlotsFleetSizeCached(t *testing.T) {
	f := newSlotFixture(t, 9, true, nil, []slotLease{{0, "fleet-1", time.Minute}, {1, "fleet-2", time.Minute}}, Config{MaxFraction: 0.2})
	ctx := t.Context()
	for range 3 {
		if d, err := f.slots.Acquire(ctx); err != nil || d.Held || d.Fleet != 10 {
			t.Fatalf("acquire = %+v, %v; want refused in a fleet of 10", d, err)
		}
	}
	if got := f.requests()["metadata list nodes"]; got != 1 {
		t.Errorf("%d fleet measurements in 3 acquires within the TTL, want 1", got)
	}
	// After the TTL the fleet has grown to 1,250 nodes, served in pages.
	// The unexpired Leases still fill K of the stale size: one refusal
	// without measuring, then the next Acquire measures.
	f.setNow(slotT0.Add(DefaultFleetSizeTTL))
	f.clearRequests()
	paged := &pagedNodeMeta{Interface: f.meta, total: 1250}
	f.slots.meta = paged
	d, err := f.slots.Acquire(ctx)
	if err != nil || d.Held || d.Fleet != 10 || len(paged.limits) != 0 {
		t.Fatalf("first acquire after the TTL = %+v, %v, %d node LISTs; want refused on the stale size, no LIST", d, err, len(paged.limits))
	}
	d, err = f.slots.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// 1,250 + slotSelf = 1,251 nodes: K = 250; slot 2 is the first free
	// one of the bucket the node follows.
	if d.Fleet != 1251 || d.Limit != 250 || !d.Held || d.Slot != 2 {
		t.Errorf("decision %+v, want fleet 1251, limit 250, held", d)
	}
	if fmt.Sprint(paged.limits) != "[500 500 500]" {
		t.Errorf("page limits %v, want three pages of 500", paged.limits)
	}
}

func TestConfigValidate(t *testing.T) {
	good := Config{Namespace: slotNS, MaxFraction: 0.2, TaintKey: slotTaint, NodeSelector: "fleet=a"}
	tests := []struct {
		name    string
		mutate  func(*Config)
		wantErr string
	}{
		{"defaults are valid", func(*Config) {}, ""},
		{"namespace required", func(c *Config) { c.Namespace = "" }, "namespace"},
		{"prefix must name leases", func(c *Config) { c.Prefix = "Bad_Prefix" }, "prefix"},
		{"maxFraction must be positive", func(c *Config) { c.MaxFraction = 0 }, "maxFraction"},
		{"bad selector", func(c *Config) { c.NodeSelector = "a in (" }, "nodeSelector"},
		{"lease duration at least 1s", func(c *Config) { c.LeaseDuration = time.Millisecond }, "leaseDuration"},
		{"taint key required", func(c *Config) { c.TaintKey = "" }, "taintKey"},
		{"fleet size TTL positive", func(c *Config) { c.FleetSizeTTL = -time.Second }, "fleetSizeTTL"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := good
			tc.mutate(&c)
			err := c.WithDefaults().Validate()
			if tc.wantErr == "" {
				if err != nil {
					t.Errorf("validate: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("validate: %v, want an error naming %s", err, tc.wantErr)
			}
		})
	}
}

// pagedNodeMeta serves total Nodes' metadata in pages of the requested
// Limit with continue tokens (the fake metadata client ignores both) and
// records each request's Limit.
type pagedNodeMeta struct {
	metadata.Interface
	total  int
	limits []int64
}

func (p *pagedNodeMeta) Resource(gvr schema.GroupVersionResource) metadata.Getter {
	return pagedNodeGetter{Getter: p.Interface.Resource(gvr), p: p}
}

type pagedNodeGetter struct {
	metadata.Getter
	p *pagedNodeMeta
}

func (g pagedNodeGetter) List(_ context.Context, opts metav1.ListOptions) (*metav1.PartialObjectMetadataList, error) {
	g.p.limits = append(g.p.limits, opts.Limit)
	from := 0
	if opts.Continue != "" {
		var err error
		if from, err = strconv.Atoi(opts.Continue); err != nil {
			return nil, err
		}
	}
	to := min(g.p.total, from+int(opts.Limit))
	list := &metav1.PartialObjectMetadataList{}
	for i := from; i < to; i++ {
		list.Items = append(list.Items, metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("big-%d", i)}})
	}
	if to < g.p.total {
		list.Continue = strconv.Itoa(to)
	}
	return list, nil
}

// TestSlotsMeasureCount: with no node selector the fleet size is one
// LIST of limit 1 whose remainingItemCount counts the rest; when the
// server leaves the count out (it does for selectors) the pages are read.
func TestSlotsMeasureCount(t *testing.T) {
	page := func(names ...string) *metav1.PartialObjectMetadataList {
		l := &metav1.PartialObjectMetadataList{}
		for _, n := range names {
			l.Items = append(l.Items, metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: n}})
		}
		return l
	}
	for _, tc := range []struct {
		name     string
		selector string
		// serve answers a LIST with these options.
		serve      func(metav1.ListOptions) *metav1.PartialObjectMetadataList
		want       int
		wantLimits []int64
	}{
		{
			name: "no selector: counted by remainingItemCount",
			serve: func(o metav1.ListOptions) *metav1.PartialObjectMetadataList {
				l := page("node-0")
				if o.Limit == 1 {
					l.RemainingItemCount = new(int64(7499))
				}
				return l
			},
			want: 7500, wantLimits: []int64{1},
		},
		{
			name: "no selector, no count from the server: pages read, self added",
			serve: func(o metav1.ListOptions) *metav1.PartialObjectMetadataList {
				if o.Continue == "" {
					l := page("node-0")
					l.Continue = "next"
					return l
				}
				return page("node-1", "node-2")
			},
			want: 4, wantLimits: []int64{1, fleetPageSize},
		},
		{
			name: "no selector, no count, self listed",
			serve: func(o metav1.ListOptions) *metav1.PartialObjectMetadataList {
				return page("node-0", slotSelf)
			},
			want: 2, wantLimits: []int64{1},
		},
		{
			name:     "selector: remainingItemCount ignored, pages read",
			selector: "fleet=a",
			serve: func(o metav1.ListOptions) *metav1.PartialObjectMetadataList {
				l := page("node-0", slotSelf)
				l.RemainingItemCount = new(int64(1000))
				return l
			},
			want: 2, wantLimits: []int64{fleetPageSize},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var limits []int64
			meta := listMeta(func(o metav1.ListOptions) (*metav1.PartialObjectMetadataList, error) {
				if o.LabelSelector != tc.selector {
					t.Errorf("label selector %q, want %q", o.LabelSelector, tc.selector)
				}
				if len(limits) > 10 {
					return nil, errors.New("too many pages")
				}
				limits = append(limits, o.Limit)
				return tc.serve(o), nil
			})
			cfg := Config{Namespace: slotNS, TaintKey: slotTaint, MaxFraction: 0.2, NodeSelector: tc.selector}
			s := New(fake.NewClientset(), meta, slotSelf, cfg, slotTestLog())
			n, err := s.measure(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if n != tc.want {
				t.Errorf("fleet size %d, want %d", n, tc.want)
			}
			if fmt.Sprint(limits) != fmt.Sprint(tc.wantLimits) {
				t.Errorf("LIST limits %v, want %v", limits, tc.wantLimits)
			}
		})
	}
}

// listMeta is a metadata client whose LIST of any resource is list (the
// fake metadata client drops Limit and Continue from its actions).
type listMeta func(metav1.ListOptions) (*metav1.PartialObjectMetadataList, error)

func (f listMeta) Resource(schema.GroupVersionResource) metadata.Getter {
	return listMetaResource{list: f}
}

type listMetaResource struct {
	metadata.ResourceInterface // nil: only List is served
	list                       listMeta
}

func (r listMetaResource) Namespace(string) metadata.ResourceInterface { return r }

func (r listMetaResource) List(_ context.Context, o metav1.ListOptions) (*metav1.PartialObjectMetadataList, error) {
	return r.list(o)
}

// TestSlotsProbe: a node that knows it holds no slot tries to create up
// to two random slots under K before it reads any; only when both are
// held does it list a bucket (to take an absent or expired slot there, or
// to refuse), and once refused it follows that bucket with a watch, so
// that asking again reads the bucket from the watch's cache.
func TestSlotsProbe(t *testing.T) {
	expired := 16 * time.Minute
	type ask struct {
		want         Decision
		wantRequests map[string]int
	}
	tests := []struct {
		name  string
		fleet int
		// noSelector makes the whole cluster the fleet (counted, not
		// listed); freshSize gives the node a fresh cached size.
		noSelector bool
		freshSize  int
		tainted    []string
		leases     []slotLease
		// releaseBetween releases (nothing held) between the asks.
		releaseBetween bool
		asks           []ask
	}{
		{
			name: "fresh size, probed slot free: one Create, no listing", fleet: 9, freshSize: 10,
			asks: []ask{{Decision{Held: true, Slot: 0, Limit: 2, Fleet: 10, Seen: 1}, map[string]int{"create leases": 1}}},
		},
		{
			name: "first probe held, second wins", fleet: 9, freshSize: 10,
			leases: []slotLease{{0, "fleet-1", time.Minute}},
			asks:   []ask{{Decision{Held: true, Slot: 1, Limit: 2, Fleet: 10, Occupied: 1, Seen: 2}, map[string]int{"create leases": 2}}},
		},
		{
			name: "both probes held: the bucket listed gives the expired slot", fleet: 14, freshSize: 15,
			leases: []slotLease{{0, "fleet-1", time.Minute}, {1, "fleet-2", time.Minute}, {2, "fleet-3", expired}},
			asks: []ask{{Decision{Held: true, Slot: 2, Limit: 3, Fleet: 15, Occupied: 2, Seen: 3},
				map[string]int{"create leases": 2, "list leases": 1, "get nodes": 1, "update leases": 1}}},
		},
		{
			name: "all held: probes miss and the bucket refuses; asking again reads the followed bucket, no request", fleet: 9, freshSize: 10,
			leases: []slotLease{{0, "fleet-1", time.Minute}, {1, "fleet-2", time.Minute}},
			asks: []ask{
				{Decision{Slot: -1, Limit: 2, Fleet: 10, Occupied: 2, Seen: 2}, map[string]int{"create leases": 2, "list leases": 1}},
				{Decision{Slot: -1, Limit: 2, Fleet: 10, Occupied: 2, Seen: 2}, map[string]int{}},
			},
		},
		{
			name: "all held, then released: the next fault probes again", fleet: 9, freshSize: 10, releaseBetween: true,
			leases: []slotLease{{0, "fleet-1", time.Minute}, {1, "fleet-2", time.Minute}},
			asks: []ask{
				{Decision{Slot: -1, Limit: 2, Fleet: 10, Occupied: 2, Seen: 2}, map[string]int{"create leases": 2, "list leases": 1}},
				{Decision{Slot: -1, Limit: 2, Fleet: 10, Occupied: 2, Seen: 2}, map[string]int{"create leases": 2, "list leases": 1}},
			},
		},
		{
			// fleet-0..8, self and the outsider: 11 Nodes in the cluster.
			name: "no selector, no fresh size: the fleet is counted, then probed", fleet: 9, noSelector: true,
			asks: []ask{{Decision{Held: true, Slot: 0, Limit: 2, Fleet: 11, Seen: 1}, map[string]int{"metadata list nodes": 1, "create leases": 1}}},
		},
		{
			name: "selector, no fresh size: lists a bucket to adopt recorded sizes instead of reading every Node", fleet: 9,
			asks: []ask{{Decision{Held: true, Slot: 0, Limit: 2, Fleet: 10, Seen: 2}, map[string]int{"list leases": 1, "metadata list nodes": 1, "create leases": 1}}},
		},
		{
			name: "K = 1: one probe", fleet: 3, freshSize: 4,
			leases: []slotLease{{0, "fleet-1", time.Minute}},
			asks:   []ask{{Decision{Slot: -1, Limit: 1, Fleet: 4, Occupied: 1, Seen: 1}, map[string]int{"create leases": 1, "list leases": 1}}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newSlotFixture(t, tc.fleet, true, tc.tainted, tc.leases, Config{MaxFraction: 0.2})
			if tc.noSelector {
				f.slots.cfg.NodeSelector = ""
			}
			if tc.freshSize > 0 {
				f.slots.fleet, f.slots.fleetAt = tc.freshSize, slotT0.Add(-time.Minute)
			}
			// As after the tainter's Release at start: nothing held.
			f.slots.known = true
			var last Decision
			for i, a := range tc.asks {
				if i > 0 && tc.releaseBetween {
					if err := f.slots.Release(t.Context()); err != nil {
						t.Fatal(err)
					}
				} else if i > 0 && !last.Held {
					followed(t, f.slots)
				}
				f.clearRequests()
				got, err := f.slots.Acquire(t.Context())
				if err != nil {
					t.Fatalf("ask %d: %v", i, err)
				}
				if got != a.want {
					t.Errorf("ask %d: decision %+v, want %+v", i, got, a.want)
				}
				if reqs := f.requests(); !sameCounts(reqs, a.wantRequests) {
					t.Errorf("ask %d: requests %v, want %v", i, reqs, a.wantRequests)
				}
				if got.Held {
					if l := f.lease(t, got.Slot); leaseHolder(l) != slotSelf {
						t.Errorf("ask %d: slot %d held by %q, want %q", i, got.Slot, leaseHolder(l), slotSelf)
					}
				}
				last = got
			}
		})
	}
}

// TestSlotsProbeIndices: the probed slots are distinct, under K, and
// every pair is reachable.
func TestSlotsProbeIndices(t *testing.T) {
	s := &Slots{}
	for k := 1; k <= 4; k++ {
		seen := map[[2]int]bool{}
		for r0 := range k {
			for r1 := range max(1, k-1) {
				rs := []int{r0, r1}
				s.randIntN = func(n int) int {
					r := rs[0]
					rs = rs[1:]
					if r >= n {
						t.Fatalf("k=%d: draw %d out of [0,%d)", k, r, n)
					}
					return r
				}
				got := s.probeIndices(k)
				if len(got) != min(probeSlots, k) {
					t.Fatalf("k=%d: %v, want %d indices", k, got, min(probeSlots, k))
				}
				if len(got) == 2 {
					if got[0] == got[1] || got[1] >= k {
						t.Fatalf("k=%d: %v not distinct under k", k, got)
					}
					seen[[2]int{got[0], got[1]}] = true
				}
			}
		}
		if k >= 2 && len(seen) != k*(k-1) {
			t.Errorf("k=%d: %d ordered pairs reachable, want %d", k, len(seen), k*(k-1))
		}
	}
}
