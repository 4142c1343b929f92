package safeguard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
)

// SlotLabel is the label every slot Lease carries, its value the slot
// prefix. Every LIST and watch of slot Leases selects it, together with
// BucketLabel (one bucket) or HolderLabel (one node's own): Slots never
// reads all K slots.
const SlotLabel = "gpu-node-agent.io/taint-slot"

// Defaults of Config.
const (
	DefaultSlotPrefix        = "gpu-node-agent-taint-slot"
	DefaultSlotLeaseDuration = 15 * time.Minute
	DefaultFleetSizeTTL      = 10 * time.Minute
)

// fleetPageSize is the page size of the metadata-only Node LIST.
const fleetPageSize = 500

// maxSlotWrites bounds the Create/Update attempts per reading of the
// slots (the buckets one Acquire read).
const maxSlotWrites = 2

// Annotations of the fleet size recorded on every slot Lease this node
// writes: the size and when it was measured (RFC 3339, UTC), so that
// nodes faulting together reuse one another's measurement instead of
// each listing every Node.
const (
	FleetSizeAnnotation           = "gpu-node-agent.io/fleet-size"
	FleetSizeMeasuredAtAnnotation = "gpu-node-agent.io/fleet-size-measured-at"
)

// recordQuorum is how many distinct holders must have recorded a fresh
// fleet size before this node uses their records instead of measuring
// (it then uses the smallest): one agent's credentials, however misused,
// can lower K (which only refuses) but not raise it.
const recordQuorum = 2

// coldSpread bounds the random delay before an Acquire that holds no
// slot and has no fresh fleet size of its own: nodes faulting at one
// instant then read the slots spread over this window, and all but the
// first few find the sizes the first holders recorded rather than each
// measuring.
const coldSpread = 2 * time.Second

// probeSlots is how many slots a node that knows it holds none tries to
// create blind, at random indices under K, before it lists the slots.
const probeSlots = 2

// ErrNotHeld is returned by Renew when this node holds no slot (it never
// acquired one, released it, or lost it to a takeover): the caller must
// not write its taint.
var ErrNotHeld = errors.New("taint slot not held")

// Config configures the taint slots.
type Config struct {
	// Namespace holds the slot Leases (required).
	Namespace string
	// Prefix names the slots: Leases <Prefix>-0 .. <Prefix>-(K-1).
	// Default DefaultSlotPrefix.
	Prefix string
	// MaxFraction is the fraction of the fleet that may be tainted; see
	// Limit for the rounding. 1 or more disables the safeguard.
	MaxFraction float64
	// NodeSelector is the label selector of the fleet ("" = all Nodes).
	NodeSelector string
	// LeaseDuration is how long a slot stays claimed without a renew.
	// Default DefaultSlotLeaseDuration; whole seconds (rounded up).
	LeaseDuration time.Duration
	// TaintKey is the taint whose presence on a holder's Node keeps its
	// slot occupied after its Lease expired (required).
	TaintKey string
	// FleetSizeTTL is how long a measured fleet size is reused.
	// Default DefaultFleetSizeTTL.
	FleetSizeTTL time.Duration
}

// WithDefaults returns c with unset fields defaulted.
func (c Config) WithDefaults() Config {
	if c.Prefix == "" {
		c.Prefix = DefaultSlotPrefix
	}
	if c.LeaseDuration == 0 {
		c.LeaseDuration = DefaultSlotLeaseDuration
	}
	if c.FleetSizeTTL == 0 {
		c.FleetSizeTTL = DefaultFleetSizeTTL
	}
	return c
}

// Validate checks c (after WithDefaults) and returns every problem.
func (c Config) Validate() error {
	var errs []error
	for _, msg := range validation.IsDNS1123Label(c.Namespace) {
		errs = append(errs, fmt.Errorf("slots namespace %q: %s", c.Namespace, msg))
	}
	// The longest name is <prefix>-<index>; leave room for 6 digits.
	for _, msg := range validation.IsDNS1123Subdomain(c.Prefix + "-999999") {
		errs = append(errs, fmt.Errorf("slots prefix %q: %s", c.Prefix, msg))
	}
	for _, msg := range validation.IsValidLabelValue(c.Prefix) {
		errs = append(errs, fmt.Errorf("slots prefix %q as a label value: %s", c.Prefix, msg))
	}
	if math.IsNaN(c.MaxFraction) || c.MaxFraction <= 0 {
		errs = append(errs, fmt.Errorf("slots maxFraction %g: must be > 0", c.MaxFraction))
	}
	if _, err := labels.Parse(c.NodeSelector); err != nil {
		errs = append(errs, fmt.Errorf("slots nodeSelector %q: %w", c.NodeSelector, err))
	}
	if c.LeaseDuration < time.Second || c.LeaseDuration > math.MaxInt32*time.Second {
		errs = append(errs, fmt.Errorf("slots leaseDuration %s: must be at least 1s", c.LeaseDuration))
	}
	for _, msg := range validation.IsQualifiedName(c.TaintKey) {
		errs = append(errs, fmt.Errorf("slots taintKey %q: %s", c.TaintKey, msg))
	}
	if c.FleetSizeTTL <= 0 {
		errs = append(errs, fmt.Errorf("slots fleetSizeTTL %s: must be > 0", c.FleetSizeTTL))
	}
	return errors.Join(errs...)
}

// Disabled says whether MaxFraction lets the whole fleet be tainted, in
// which case Slots makes no requests.
func (c Config) Disabled() bool { return c.MaxFraction >= 1 }

// Limit is K, the number of slots for a fleet of n nodes:
// max(1, floor(maxFraction*n + 1e-9)). It rounds down, so the fraction is
// never exceeded (n=7, f=0.3: 2.1 -> 2), except that one node may always
// be tainted so a small fleet still protects itself (n=4, f=0.2: 0.8 ->
// 1). The 1e-9 absorbs binary floating point error where the product is
// a whole number (n=40, f=0.2: 8.000000000000002 or 7.999999999999999 ->
// 8).
func Limit(n int, maxFraction float64) int {
	return max(1, int(math.Floor(maxFraction*float64(n)+1e-9)))
}

// Decision is the outcome of Acquire.
type Decision struct {
	// Held says this node holds a slot and may write its taint.
	Held bool
	// Slot is the index held, -1 when none (or the safeguard is off).
	Slot int
	// Limit is K and Fleet the fleet size N it was computed from; both
	// are 0 when Acquire did not need them (this node already held a
	// slot, or the safeguard is off).
	Limit, Fleet int
	// Occupied is how many of the slots this node read under Limit were
	// occupied by other nodes when it was refused or took its slot, and
	// Seen how many it read: its probes' and the buckets' it read. A
	// refusal says that the Seen slots were occupied, not that all K were.
	Occupied, Seen int
}

// Slots is one node's view of the taint slots: the node may carry the
// taint only while it holds one of K slot Leases, taken by Create or by a
// resourceVersion-guarded Update, so the limit rests on the API server's
// own compare-and-swap, never on a count read earlier. Why this cannot
// fail open, and what it reads from the API server, is in docs/fleet.md.
//
// Its methods are safe for concurrent use but meant for one caller (the
// tainter, or Shared): Acquire (or Allow) before adding the taint, Renew
// right before any later taint write, Release once the taint is removed.
type Slots struct {
	client kubernetes.Interface
	meta   metadata.Interface
	node   string
	// holder is node's HolderLabel value.
	holder string
	cfg    Config
	log    *slog.Logger

	// now, randIntN, jitter and sleep are the clock, random sources and
	// delay (tests replace them).
	now      func() time.Time
	randIntN func(n int) int
	jitter   func(max time.Duration) time.Duration
	sleep    func(ctx context.Context, d time.Duration) error

	mu sync.Mutex
	// held is our slot's Lease as last written or read, nil when none.
	held *coordinationv1.Lease
	// known says held is authoritative; until the first Acquire or
	// Release (after a restart, or a write whose answer was lost) a Lease
	// of ours may exist unseen (see findOwn).
	known bool
	// fleet is the fleet size last measured or adopted and fleetAt when
	// it was measured.
	fleet   int
	fleetAt time.Time
	// staleRefused says the last decision was a refusal on a size that
	// was not fresh: the next Acquire without a fresh size measures.
	staleRefused bool
	// refused says the last Acquire was refused (every slot it read
	// occupied, or every race for a free one lost): the next Acquire
	// reads the followed bucket, and one more from lookGap after its last
	// LIST, instead of probing (see probe and lookAround).
	refused bool
	// follow is the watch of one bucket of slots while refused, nil when
	// none; room is signalled when it sees a slot of that bucket freed
	// (Room).
	follow *follower
	room   chan struct{}
	// listedAt is when the last Acquire that was refused listed a
	// bucket (see lookGap).
	listedAt time.Time
	// againCount is how many asks of its own a refused node scheduled
	// (askAgainLater) since it last held or released a slot; againTimer
	// signals the last, againPending until it fired; againAfter is when
	// the n-th comes (tests replace it).
	againCount   int
	againTimer   *time.Timer
	againPending atomic.Bool
	againAfter   func(n int) time.Duration
	// againDue is set when an own ask fired, until the Acquire it
	// signals: that ask lists a bucket however soon after the last LIST.
	againDue atomic.Bool
	// hintWait is the random delay before a hint write (tests replace
	// it); hintWrites are the writes under way.
	hintWait   func(ctx context.Context) error
	hintWrites sync.WaitGroup
}

// New returns the slots of node. cfg is used with its defaults
// applied; validate it first (Config.Validate). meta reads the fleet
// size (metadata only); it may be nil when the safeguard is off.
func New(client kubernetes.Interface, meta metadata.Interface, node string, cfg Config, log *slog.Logger, opts ...Option) *Slots {
	s := &Slots{
		client: client, meta: meta, node: node, holder: HolderValue(node), cfg: cfg.WithDefaults(), log: log,
		now: time.Now, randIntN: rand.IntN, jitter: randJitter, sleep: sleepCtx,
		room: make(chan struct{}, 1),
	}
	s.hintWait = func(ctx context.Context) error { return s.sleep(ctx, s.jitter(hintDelay)) }
	s.againAfter = s.againAfterDefault
	for _, o := range opts {
		o(s)
	}
	return s
}

// Option changes how Slots keeps time.
type Option func(*Slots)

// WithClock makes now the clock of Lease times and fleet-size ages.
func WithClock(now func() time.Time) Option { return func(s *Slots) { s.now = now } }

// WithoutSpread drops the random delay that spreads nodes faulting at one
// instant (coldSpread): for a single node, and for tests that must not
// wait.
func WithoutSpread() Option {
	return func(s *Slots) {
		s.jitter = func(time.Duration) time.Duration { return 0 }
		s.sleep = func(context.Context, time.Duration) error { return nil }
	}
}

// randJitter is a random delay in [0, max).
func randJitter(max time.Duration) time.Duration {
	if max <= 0 {
		return 0
	}
	return rand.N(max)
}

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// slotState is what one reading says of one slot.
type slotState struct {
	index int
	lease *coordinationv1.Lease // nil when absent
}

// Acquire makes sure this node holds a slot: if it already holds one (at
// any index, even at or above K after the fleet shrank) it renews it;
// otherwise it takes a free slot under K or refuses when it finds none.
// A refusal, including losing every race for a slot, is a Decision with
// Held false and a nil error; an error means the API server could not be
// asked. Held means the Lease was written just now, so the taint may
// follow without a separate Renew.
//
// No Acquire lists all K slots. A node that does not know whether it
// holds one (after a restart, or a write whose answer was lost) first
// finds its own Leases with two small LISTs (see findOwn) and renews the
// one it finds. A node that knows it holds none probes (see probe), then
// reads buckets of slots (see lookAround), and once refused it follows
// one bucket with a watch until it holds a slot or releases (Room says
// when to ask again).
func (s *Slots) Acquire(ctx context.Context) (Decision, error) {
	if s.cfg.Disabled() {
		return Decision{Held: true, Slot: -1}, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	d, err := s.acquire(ctx)
	if err == nil && d.Held {
		s.unfollow()
		s.stopAgain()
	}
	return d, err
}

func (s *Slots) acquire(ctx context.Context) (Decision, error) {
	if s.held != nil {
		err := s.renewLocked(ctx, s.held)
		if err == nil {
			return Decision{Held: true, Slot: slotIndex(s.cfg.Prefix, s.held.Name)}, nil
		}
		if !errors.Is(err, ErrNotHeld) {
			return Decision{Slot: -1}, err
		}
		// Taken over or deleted: this node holds nothing now.
	}
	if !s.known {
		own, err := s.findOwn(ctx)
		if err != nil {
			return Decision{Slot: -1}, err
		}
		s.known = true
		if len(own) > 0 {
			held, err := s.adopt(ctx, own)
			if err != nil {
				return Decision{Slot: -1}, err
			}
			if held {
				return Decision{Held: true, Slot: slotIndex(s.cfg.Prefix, s.held.Name)}, nil
			}
			// Taken over between the LIST and the renew: it holds nothing.
		}
	}
	if !s.freshCache() {
		// Spread nodes faulting together (see coldSpread).
		if err := s.sleep(ctx, s.jitter(coldSpread)); err != nil {
			return Decision{Slot: -1}, fmt.Errorf("acquire taint slot: %w", err)
		}
	}
	if !s.refused {
		d, err := s.probe(ctx)
		if err != nil || d.Held {
			return d, err
		}
	}
	return s.lookAround(ctx)
}

// probe tries to take a slot without listing them: it creates the Leases
// of up to probeSlots distinct random slots under K, and the first Create
// that succeeds holds that slot. It is Acquire's first step when this node
// knows it holds no slot (its own Leases looked up, or a Release) and its
// last Acquire was not refused (a refused node asking again would most
// likely find the slots held again: it reads the bucket it follows and one
// more, see lookAround).
//
// It is as safe as taking a slot read: an absent Lease is a free slot (see
// Slots), and Create is create-if-absent, so a probe can only win a slot
// no one holds. A probe that finds its slot's Lease present (AlreadyExists)
// learns nothing about whether that Lease has expired, so when every
// probe misses, Acquire reads buckets of slots (lookAround), to take an
// absent or expired slot there or to refuse.
//
// Why: in a mass fault most of the nodes that will get a slot find one
// free, and reading slots costs about 650 bytes per Lease (protobuf).
// Probing makes a node that finds a free slot read no Lease at all; only
// the nodes that miss read buckets: the ones to be refused once the slots
// fill, and those whose probes collided with other nodes'. K needs a
// fresh fleet size: this node's own, or, with no node selector, one
// measured now (a LIST of limit 1 counted by the API server, see
// measure). With a selector and no fresh size of its own, measuring reads
// every selected Node, so the node reads a bucket instead to adopt the
// sizes other holders recorded.
//
// The Decision's Occupied counts only the probed slots found held.
func (s *Slots) probe(ctx context.Context) (Decision, error) {
	n := s.fleet
	if !s.freshCache() {
		if s.cfg.NodeSelector != "" {
			return Decision{Slot: -1}, nil
		}
		var err error
		if n, err = s.measure(ctx); err != nil {
			return Decision{Slot: -1}, err
		}
	}
	s.staleRefused = false
	k := Limit(n, s.cfg.MaxFraction)
	d := Decision{Slot: -1, Limit: k, Fleet: n}
	for i, idx := range s.probeIndices(k) {
		won, err := s.take(ctx, slotState{index: idx})
		if err != nil {
			return Decision{Slot: -1}, err
		}
		d.Seen++
		if won {
			d.Held, d.Slot = true, idx
			s.log.Info("took taint slot", "node", s.node, "slot", idx, "limit", k, "fleet", n, "probed", i+1)
			return d, nil
		}
		d.Occupied++
	}
	s.log.Debug("probed taint slots held, reading buckets", "node", s.node, "limit", k, "probed", d.Occupied)
	return d, nil
}

// probeIndices is min(probeSlots, k) distinct slot indices under k, each
// uniform at random.
func (s *Slots) probeIndices(k int) []int {
	out := make([]int, 0, min(probeSlots, k))
	for len(out) < cap(out) {
		// The i-th pick is uniform over the k-i indices not yet picked:
		// the r-th index in order that is not taken.
		r := s.randIntN(k - len(out))
		idx := 0
		for ; ; idx++ {
			if slices.Contains(out, idx) {
				continue
			}
			if r == 0 {
				break
			}
			r--
		}
		out = append(out, idx)
	}
	return out
}

// Renew extends this node's claim on its slot; call it right before each
// taint write and write the taint only if it returns nil. ErrNotHeld
// (wrapped) means the node holds no slot: do not write the taint.
func (s *Slots) Renew(ctx context.Context) error {
	if s.cfg.Disabled() {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held == nil {
		return fmt.Errorf("renew taint slot of node %s: %w", s.node, ErrNotHeld)
	}
	return s.renewLocked(ctx, s.held)
}

// Allow is Acquire for the Safeguard seam: true when this node holds a
// slot (its Lease just written), so the taint may be added now.
func (s *Slots) Allow(ctx context.Context) (bool, error) {
	d, err := s.Acquire(ctx)
	return d.Held, err
}

// Release gives this node's slot back; call it after the taint was
// removed, and after a refusal once the node no longer needs a slot (it
// stops the watch a refused node follows a bucket with). It deletes our
// Lease only if it is still ours (preconditions on its UID and
// resourceVersion); a slot already gone or taken over is success. After
// a restart it first finds Leases of ours with two small LISTs (see
// findOwn); once nothing is held it makes no requests.
func (s *Slots) Release(ctx context.Context) error {
	if s.cfg.Disabled() {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var mine []*coordinationv1.Lease
	switch {
	case s.held != nil:
		mine = append(mine, s.held)
	case !s.known:
		own, err := s.findOwn(ctx)
		if err != nil {
			return err
		}
		mine = own
	}
	for _, l := range mine {
		if err := s.deleteOurs(ctx, l); err != nil {
			return err
		}
		idx := slotIndex(s.cfg.Prefix, l.Name)
		s.log.Info("released taint slot", "node", s.node, "slot", idx)
		s.noteRelease(ctx, l)
	}
	// A refusal is old news by the next fault.
	s.held, s.known, s.refused = nil, true, false
	s.unfollow()
	s.stopAgain()
	return nil
}

// limitFrom computes K from what v read: a fresh fleet size from this
// node's cache or the records on the Leases read, else a refusal on a
// stale size when the unexpired Leases read fill it (see staleRefusal),
// else the size measured now.
func (s *Slots) limitFrom(ctx context.Context, v *view) (d Decision, refuse bool, err error) {
	n, ok := s.freshSize(v.slots())
	if !ok {
		if d, refuse := s.staleRefusal(v); refuse {
			return d, true, nil
		}
		if n, err = s.measure(ctx); err != nil {
			return Decision{Slot: -1}, false, err
		}
	}
	s.staleRefused = false
	k := Limit(n, s.cfg.MaxFraction)
	return Decision{Slot: -1, Limit: k, Fleet: n}, false, nil
}

// occupied says whether Lease l's slot is occupied: unexpired, or its
// holder's Node still carries the taint (one GET, only when expired).
func (s *Slots) occupied(ctx context.Context, l *coordinationv1.Lease) (bool, error) {
	if !s.expired(l) {
		return true, nil
	}
	h := leaseHolder(l)
	if h == "" {
		return false, nil
	}
	node, err := s.client.CoreV1().Nodes().Get(ctx, h, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("get node %s holding expired taint slot %s: %w", h, l.Name, err)
	}
	return slices.ContainsFunc(node.Spec.Taints, func(t corev1.Taint) bool { return t.Key == s.cfg.TaintKey }), nil
}

// expired says whether l's claim has run out by now.
func (s *Slots) expired(l *coordinationv1.Lease) bool {
	at := l.Spec.RenewTime
	if at == nil {
		at = l.Spec.AcquireTime
	}
	if at == nil {
		return true
	}
	d := s.cfg.LeaseDuration
	if l.Spec.LeaseDurationSeconds != nil {
		d = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
	}
	return !at.Add(d).After(s.now())
}

// take tries to take the free slot c: Create when absent, Update with
// the resourceVersion read when present. It reports false when another
// node won the race.
func (s *Slots) take(ctx context.Context, c slotState) (bool, error) {
	leases := s.client.CoordinationV1().Leases(s.cfg.Namespace)
	now := metav1.NewMicroTime(s.now())
	var (
		got *coordinationv1.Lease
		err error
	)
	if c.lease == nil {
		l := &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{
				Name: slotName(s.cfg.Prefix, c.index), Namespace: s.cfg.Namespace,
				Labels: s.setLabels(nil, c.index),
			},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity: &s.node, LeaseDurationSeconds: s.durationSeconds(),
				AcquireTime: &now, RenewTime: &now, LeaseTransitions: new(int32(0)),
			},
		}
		s.record(l)
		got, err = leases.Create(ctx, l, metav1.CreateOptions{})
	} else {
		l := c.lease.DeepCopy()
		transitions := int32(0)
		if l.Spec.LeaseTransitions != nil {
			transitions = *l.Spec.LeaseTransitions + 1
		}
		l.Labels = s.setLabels(l.Labels, c.index)
		l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds = &s.node, s.durationSeconds()
		l.Spec.AcquireTime, l.Spec.RenewTime, l.Spec.LeaseTransitions = &now, &now, &transitions
		// The previous holder's record is replaced: a record is always
		// the holder's own.
		delete(l.Annotations, FleetSizeAnnotation)
		delete(l.Annotations, FleetSizeMeasuredAtAnnotation)
		s.record(l)
		got, err = leases.Update(ctx, l, metav1.UpdateOptions{})
	}
	if apierrors.IsAlreadyExists(err) || apierrors.IsConflict(err) {
		return false, nil
	}
	if err != nil {
		// The write may have landed without its answer reaching us: until
		// a lookup of our own Leases says otherwise, one may exist.
		s.known = false
		return false, fmt.Errorf("take taint slot %s: %w", slotName(s.cfg.Prefix, c.index), err)
	}
	s.held, s.known = got, true
	return true, nil
}

// setLabels returns labels (a copy, or a new map when nil) with slot
// index's as this node holds it: SlotLabel, its BucketLabel, and
// HolderLabel this node's value (a takeover replaces the previous
// holder's).
func (s *Slots) setLabels(labels map[string]string, index int) map[string]string {
	out := make(map[string]string, len(labels)+3)
	maps.Copy(out, labels)
	out[SlotLabel] = s.cfg.Prefix
	out[BucketLabel] = strconv.Itoa(bucketOf(index))
	out[HolderLabel] = s.holder
	return out
}

// renewLocked renews our Lease l with its resourceVersion. On a Conflict
// it re-reads the Lease: still ours, it retries once with the new
// version; taken over or gone, ErrNotHeld.
func (s *Slots) renewLocked(ctx context.Context, l *coordinationv1.Lease) error {
	leases := s.client.CoordinationV1().Leases(s.cfg.Namespace)
	for attempt := 0; ; attempt++ {
		u := l.DeepCopy()
		now := metav1.NewMicroTime(s.now())
		u.Spec.RenewTime, u.Spec.LeaseDurationSeconds = &now, s.durationSeconds()
		// A Lease an older agent created has no BucketLabel or
		// HolderLabel yet.
		if idx := slotIndex(s.cfg.Prefix, u.Name); idx >= 0 {
			u.Labels = s.setLabels(u.Labels, idx)
		}
		s.record(u)
		got, err := leases.Update(ctx, u, metav1.UpdateOptions{})
		if err == nil {
			s.held, s.known = got, true
			return nil
		}
		if apierrors.IsNotFound(err) {
			s.held = nil
			return fmt.Errorf("renew taint slot %s: deleted: %w", l.Name, ErrNotHeld)
		}
		if !apierrors.IsConflict(err) || attempt > 0 {
			return fmt.Errorf("renew taint slot %s: %w", l.Name, err)
		}
		cur, err := leases.Get(ctx, l.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			s.held = nil
			return fmt.Errorf("renew taint slot %s: deleted: %w", l.Name, ErrNotHeld)
		}
		if err != nil {
			return fmt.Errorf("re-read taint slot %s after a conflict: %w", l.Name, err)
		}
		if leaseHolder(cur) != s.node {
			s.held = nil
			s.log.Warn("taint slot taken over", "node", s.node, "lease", l.Name, "holder", leaseHolder(cur))
			return fmt.Errorf("renew taint slot %s: taken over by %q: %w", l.Name, leaseHolder(cur), ErrNotHeld)
		}
		l = cur
	}
}

// deleteOurs deletes Lease l if it is unchanged since we read or wrote
// it; gone is success, and on a Conflict it re-reads it and deletes it
// only if it is still ours.
func (s *Slots) deleteOurs(ctx context.Context, l *coordinationv1.Lease) error {
	leases := s.client.CoordinationV1().Leases(s.cfg.Namespace)
	for attempt := 0; ; attempt++ {
		pre := metav1.Preconditions{}
		if l.UID != "" {
			pre.UID = new(types.UID(l.UID))
		}
		if l.ResourceVersion != "" {
			pre.ResourceVersion = new(l.ResourceVersion)
		}
		err := leases.Delete(ctx, l.Name, metav1.DeleteOptions{Preconditions: &pre})
		if err == nil || apierrors.IsNotFound(err) {
			return nil
		}
		if !apierrors.IsConflict(err) || attempt > 0 {
			return fmt.Errorf("delete taint slot %s: %w", l.Name, err)
		}
		cur, err := leases.Get(ctx, l.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("re-read taint slot %s after a conflict: %w", l.Name, err)
		}
		if leaseHolder(cur) != s.node {
			return nil
		}
		l = cur
	}
}

// nodesResource is the Nodes resource for the metadata client.
var nodesResource = schema.GroupVersionResource{Version: "v1", Resource: "nodes"}

// measure is N: the Nodes matching the selector, this node counted if
// it is not among them, from a paged, metadata-only LIST. It becomes
// this node's cached size.
//
// With no selector (the whole cluster is the fleet) the first page asks
// for one Node: the API server then says how many follow in
// metadata.remainingItemCount, exact at the list's resourceVersion, so N
// costs one small response instead of every Node's metadata (at 7,500
// GPU nodes, whose labels run to kilobytes each, megabytes per node that
// measures). The server leaves remainingItemCount out when the list has a
// label selector ("the number of remaining items is unknown",
// ListMeta.RemainingItemCount in k8s.io/apimachinery meta/v1 types.go),
// and may leave it out otherwise; then the pages are read as before. The
// count path does not see whether this node is among the Nodes: with no
// selector it is, since its own Node exists while it runs; were it
// deleted, N would be one short, and K errs towards refusing.
func (s *Slots) measure(ctx context.Context) (int, error) {
	if s.meta == nil {
		return 0, errors.New("measure fleet size: no metadata client")
	}
	n, self, cont, limit := 0, false, "", int64(fleetPageSize)
	if s.cfg.NodeSelector == "" {
		limit = 1
	}
	for {
		list, err := s.meta.Resource(nodesResource).List(ctx, metav1.ListOptions{
			LabelSelector: s.cfg.NodeSelector, Limit: limit, Continue: cont,
		})
		if err != nil {
			return 0, fmt.Errorf("list nodes %q (metadata) for the fleet size: %w", s.cfg.NodeSelector, err)
		}
		if limit == 1 && list.RemainingItemCount != nil && *list.RemainingItemCount >= 0 {
			n = len(list.Items) + int(*list.RemainingItemCount)
			self = true
			break
		}
		for _, item := range list.Items {
			n++
			self = self || item.Name == s.node
		}
		if cont = list.Continue; cont == "" {
			break
		}
		limit = fleetPageSize
	}
	if !self {
		n++
	}
	s.fleet, s.fleetAt = n, s.now()
	return n, nil
}

// fresh says whether a size measured at at is younger than FleetSizeTTL.
// A time as far in the future is not: it cannot come from a clock that
// agrees with ours.
func (s *Slots) fresh(at time.Time) bool {
	age := s.now().Sub(at)
	return !at.IsZero() && age < s.cfg.FleetSizeTTL && age > -s.cfg.FleetSizeTTL
}

// freshCache says whether this node's cached size is fresh.
func (s *Slots) freshCache() bool { return s.fleet > 0 && s.fresh(s.fleetAt) }

// freshSize is the smallest fresh size known: this node's cache, and the
// sizes recorded on slots by other holders when recordQuorum of them
// recorded a fresh one (one node's record alone may lower this node's
// size, never stand in for it). ok is false when there is none. The size
// chosen becomes this node's cache, dated by the earliest measuring time
// among the sizes it was chosen from, so that adopting and recording it
// again never makes a size look fresher than its sources.
func (s *Slots) freshSize(slots []slotState) (n int, ok bool) {
	byHolder := map[string]sizeRecord{}
	for _, sl := range slots {
		h := leaseHolder(sl.lease)
		r, found := recordOf(sl.lease)
		if h == "" || h == s.node || !found || !s.fresh(r.at) {
			continue
		}
		if cur, seen := byHolder[h]; !seen || r.n < cur.n {
			byHolder[h] = r
		}
	}
	own := s.freshCache()
	if !own && len(byHolder) < recordQuorum {
		return 0, false
	}
	best := sizeRecord{at: s.now()}
	if own {
		best = sizeRecord{n: s.fleet, at: minTime(s.fleetAt, best.at)}
	}
	for _, r := range byHolder {
		if best.n == 0 || r.n < best.n {
			best.n = r.n
		}
		best.at = minTime(best.at, r.at)
	}
	s.fleet, s.fleetAt = best.n, best.at
	return best.n, true
}

// staleRefusal is the refusal the slots read prove without a fresh size:
// with the largest size known (cached or recorded, however old), every
// slot read under its K held by an unexpired Lease. It is not made twice
// in a row (the size may predate the fleet's growth).
func (s *Slots) staleRefusal(v *view) (Decision, bool) {
	if s.staleRefused {
		return Decision{Slot: -1}, false
	}
	n := s.fleet
	for _, sl := range v.slots() {
		if r, ok := recordOf(sl.lease); ok && r.n > n && r.at.Before(s.now().Add(s.cfg.FleetSizeTTL)) {
			n = r.n
		}
	}
	if n <= 0 {
		return Decision{Slot: -1}, false
	}
	k := Limit(n, s.cfg.MaxFraction)
	d := Decision{Slot: -1, Limit: k, Fleet: n}
	for _, i := range v.indices(k) {
		d.Seen++
		if l := v.leases[i]; l != nil && !s.expired(l) {
			d.Occupied++
		}
	}
	if d.Seen == 0 || d.Occupied < d.Seen {
		return Decision{Slot: -1}, false
	}
	s.staleRefused = true
	s.log.Debug("taint slots read full by a fleet size that is not fresh", "node", s.node, "limit", k, "fleet", n, "read", d.Seen)
	return d, true
}

// sizeRecord is a fleet size and when it was measured.
type sizeRecord struct {
	n  int
	at time.Time
}

// recordOf reads the fleet size recorded on l; ok is false when l has
// none or it does not parse.
func recordOf(l *coordinationv1.Lease) (sizeRecord, bool) {
	if l == nil {
		return sizeRecord{}, false
	}
	n, err := strconv.Atoi(l.Annotations[FleetSizeAnnotation])
	if err != nil || n <= 0 {
		return sizeRecord{}, false
	}
	at, err := time.Parse(time.RFC3339, l.Annotations[FleetSizeMeasuredAtAnnotation])
	if err != nil {
		return sizeRecord{}, false
	}
	return sizeRecord{n: n, at: at}, true
}

// record writes this node's cached size on l, unless l already records
// one measured later (a Lease of a previous run, before this one
// measured). The time is truncated to the second, which only makes it
// look older.
func (s *Slots) record(l *coordinationv1.Lease) {
	if s.fleet <= 0 || s.fleetAt.IsZero() {
		return
	}
	if r, ok := recordOf(l); ok && r.at.After(s.fleetAt) {
		return
	}
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Annotations[FleetSizeAnnotation] = strconv.Itoa(s.fleet)
	l.Annotations[FleetSizeMeasuredAtAnnotation] = s.fleetAt.UTC().Truncate(time.Second).Format(time.RFC3339)
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func (s *Slots) durationSeconds() *int32 {
	return new(int32((s.cfg.LeaseDuration + time.Second - 1) / time.Second))
}

func leaseHolder(l *coordinationv1.Lease) string {
	if l == nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

func slotName(prefix string, i int) string { return prefix + "-" + strconv.Itoa(i) }

// slotIndex is i of a Lease named <prefix>-<i>, -1 for any other name.
func slotIndex(prefix, name string) int {
	rest, ok := strings.CutPrefix(name, prefix+"-")
	if !ok {
		return -1
	}
	i, err := strconv.Atoi(rest)
	if err != nil || i < 0 || strconv.Itoa(i) != rest {
		return -1
	}
	return i
}
