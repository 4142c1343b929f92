package apiserver

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/gpu-node-agent/gpu-node-agent/internal/testutil"
	"github.com/gpu-node-agent/gpu-node-agent/kubeapi"
	"github.com/gpu-node-agent/gpu-node-agent/safeguard"
	"github.com/gpu-node-agent/gpu-node-agent/test/e2e/cluster"
	"github.com/gpu-node-agent/gpu-node-agent/test/internal/apicount"
)

// scaleWave is what one mass fault of the slot safeguards cost.
type scaleWave struct {
	fleet, faulting, limit int
	tainted, maxSeen       int
	// resyncs are the resyncs it took every slot the wave could use to be
	// used, unusedAfterWave the slots left unused before the first.
	resyncs, unusedAfterWave int
	// allTainted is how long after the fault the last node that could
	// be tainted was.
	allTainted time.Duration
	received   apicount.Snapshot
}

// perFaulting is the bytes received per faulting node.
func (w scaleWave) perFaulting() float64 {
	return float64(w.received.Received()) / float64(w.faulting)
}

// TestSlotsReadsFlatWithFleet: the bytes a faulting node reads from the
// API server to take a slot or be refused do not grow with the fleet. A
// real kube-apiserver holds a fleet of 200 Nodes, then 800 (no node
// selector: the fleet is the cluster, K = 40, then 160); 30% of them
// fault at one instant and run the slot protocol alone, each with its own
// clients, counting the response bytes on its transport (apicount, as the
// fleet simulation does): a node that holds a slot writes its taint, a
// refused node asks again once (as the tainter does after writing its
// condition) and then whenever its safeguard signals Room. In both
// fleets exactly K nodes end up tainted (never more on the way, as a
// watch of the Nodes saw it), and the bytes per faulting node at 800 are
// within 1.5 times those at 200; a protocol listing every slot per
// asking node reads about five times as much at 800, and fails it.
func TestSlotsReadsFlatWithFleet(t *testing.T) {
	t.Parallel()
	const (
		ns          = "gpu-node-agent-scale"
		maxFraction = 0.2
		faultShare  = 0.3
		maxGrowth   = 1.5
	)
	c, admin := scaleCluster(t, ns)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	fleet := followTaints(t, c.Client, "fleet=scale")
	var waves []scaleWave
	created := 0
	for _, size := range []int{200, 800} {
		names := make([]string, 0, size)
		for i := range size {
			names = append(names, fmt.Sprintf("scale-%04d", i))
		}
		if err := createFleetNodes(ctx, admin, names[created:], "scale"); err != nil {
			t.Fatal(err)
		}
		created = size
		w := slotsWave(ctx, t, c, admin, fleet, names, scaleConfig(ns, size, maxFraction), int(float64(size)*faultShare+0.5))
		t.Logf("fleet %d, K %d: %d faulting, %d tainted (max seen %d), %.1f KiB received per faulting node; per faulting node by kind: %s",
			w.fleet, w.limit, w.faulting, w.tainted, w.maxSeen, w.perFaulting()/1024, w.received.DescribePerNode(w.faulting))
		t.Logf("fleet %d requests: %s; answers other than success: %s", w.fleet, w.received.Describe(func(string) bool { return true }), w.received.DescribeAnswers())
		if w.tainted != w.limit || w.maxSeen > w.limit || w.resyncs > 0 {
			t.Errorf("fleet %d: %d tainted at the end (after %d resyncs), at most %d at once; want exactly K = %d within the wave, never more",
				w.fleet, w.tainted, w.resyncs, w.maxSeen, w.limit)
		}
		waves = append(waves, w)
	}
	small, large := waves[0], waves[1]
	if growth := large.perFaulting() / small.perFaulting(); growth > maxGrowth {
		t.Errorf("bytes received per faulting node grew %.2fx from a fleet of %d (%.1f KiB) to %d (%.1f KiB), want at most %.1fx",
			growth, small.fleet, small.perFaulting()/1024, large.fleet, large.perFaulting()/1024, maxGrowth)
	}
}

// scaleCluster starts a kube-apiserver for a fleet and creates the
// namespace of its slots; admin is the admin's clientset with a rate
// limit that creates a fleet in seconds.
func scaleCluster(t *testing.T, ns string) (*cluster.Cluster, kubernetes.Interface) {
	t.Helper()
	c := cluster.Start(t, cluster.Options{})
	admin := fastAdmin(t, c.RESTConfig)
	if _, err := admin.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace %s: %v", ns, err)
	}
	return c, admin
}

// scaleConfig is the safeguard's config for one fleet size: its own slot
// prefix, so that the sizes' slots never mix.
func scaleConfig(ns string, size int, maxFraction float64) safeguard.Config {
	return safeguard.Config{Namespace: ns, Prefix: fmt.Sprintf("scale-%d", size), MaxFraction: maxFraction, TaintKey: taintKey}.WithDefaults()
}

// fastAdmin is the admin's clientset with a rate limit that creates a
// fleet in seconds.
func fastAdmin(t *testing.T, base *rest.Config) kubernetes.Interface {
	t.Helper()
	cfg := rest.CopyConfig(base)
	cfg.QPS, cfg.Burst = 500, 1000
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// createFleetNodes creates the named Nodes labelled fleet, 16 at a time.
func createFleetNodes(ctx context.Context, c kubernetes.Interface, names []string, fleet string) error {
	work := make(chan string)
	errs := make([]error, 16)
	var wg sync.WaitGroup
	for w := range errs {
		wg.Go(func() {
			for name := range work {
				n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"fleet": fleet}}}
				if _, err := c.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil && errs[w] == nil {
					errs[w] = fmt.Errorf("create node %s: %w", name, err)
				}
			}
		})
	}
	for _, n := range names {
		work <- n
	}
	close(work)
	wg.Wait()
	return errors.Join(errs...)
}

// slotsWave faults faulting of names at one instant and runs each
// faulting node's safeguard (own clients and transport, the agent's rate
// limit, bytes counted) until K of them are tainted and every other one
// was refused at least twice; then every node untaints and releases, the
// wave waits for every slot Lease and every watch of them to be gone,
// and returns its counts.
func slotsWave(ctx context.Context, t *testing.T, c *cluster.Cluster, admin kubernetes.Interface, fleet *taintCount,
	names []string, cfg safeguard.Config, faulting int) scaleWave {
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	w := scaleWave{fleet: len(names), faulting: faulting, limit: safeguard.Limit(len(names), cfg.MaxFraction)}
	type node struct {
		name  string
		ctr   *apicount.Counter
		slots *safeguard.Slots
		held  atomic.Bool
		asks  atomic.Int32
		// resync asks the node again, as its Node informer's resync makes
		// the tainter do.
		resync chan struct{}
	}
	nodes := make([]*node, w.faulting)
	for i, idx := range rand.Perm(len(names))[:w.faulting] {
		n := &node{name: names[idx], ctr: apicount.New(), resync: make(chan struct{}, 1)}
		rc := rest.CopyConfig(c.RESTConfig)
		kubeapi.ConfigureREST(rc, "slots-scale/"+n.name, kubeapi.ClientConfig{})
		rc.WrapTransport = n.ctr.Wrap
		// A Proxy func gives the node a transport of its own.
		rc.Proxy = func(*http.Request) (*url.URL, error) { return nil, nil }
		clients := clientsFor(t, rc)
		n.slots = safeguard.New(clients.Core, clients.Meta, n.name, cfg, discard())
		// As the tainter at a fit start: nothing held, two LISTs of its
		// own Leases.
		if err := n.slots.Release(ctx); err != nil {
			t.Fatalf("release at start %s: %v", n.name, err)
		}
		nodes[i] = n
	}
	var before []*apicount.Counter
	for _, n := range nodes {
		before = append(before, n.ctr)
	}
	start := apicount.Sum(before)
	fleet.reset()
	faultAt := time.Now()

	// Each node asks, as the tainter does: at the fault, once more right
	// after a refusal (its condition write changes its Node), then on
	// every Room signal and every resync.
	runCtx, stop := context.WithCancel(ctx)
	var (
		wg          sync.WaitGroup
		inFlight    atomic.Int32
		lastTainted atomic.Int64
	)
	for _, n := range nodes {
		wg.Go(func() {
			room := n.slots.Room()
			for runCtx.Err() == nil {
				inFlight.Add(1)
				d, err := n.slots.Acquire(runCtx)
				if err == nil && d.Held {
					if err = taintNode(runCtx, admin, n.name); err == nil {
						n.held.Store(true)
						now := time.Now().UnixNano()
						for cur := lastTainted.Load(); cur < now && !lastTainted.CompareAndSwap(cur, now); cur = lastTainted.Load() {
						}
					}
				}
				inFlight.Add(-1)
				if err != nil {
					if runCtx.Err() == nil {
						t.Errorf("node %s: %v", n.name, err)
					}
					return
				}
				if d.Held {
					return
				}
				if n.asks.Add(1) == 1 {
					continue
				}
				select {
				case <-runCtx.Done():
					return
				case <-room:
				case <-n.resync:
				}
			}
		})
	}
	want := min(w.limit, w.faulting)
	// settled: every node holds a slot or was refused twice, none is
	// asking, and want are tainted.
	settled := func() bool {
		for _, n := range nodes {
			if !n.held.Load() && n.asks.Load() < 2 {
				return false
			}
		}
		tainted, _, _ := fleet.read()
		return inFlight.Load() == 0 && len(tainted) >= want
	}
	// A wave that does not settle within 60 s gets a resync: every
	// refused node asks once more. Two at most. (The refused nodes' own
	// asks come 4-8 s after their refusal, then 8-16 s after that, then
	// 16-32 s, each reading a bucket the full-bucket hint leaves open;
	// their hint writes come within 1 s.)
	const settle = 60 * time.Second
	for deadline := time.Now().Add(settle); !settled(); time.Sleep(20 * time.Millisecond) {
		if time.Now().Before(deadline) {
			continue
		}
		if w.resyncs == 2 {
			stop()
			wg.Wait()
			t.Fatalf("fleet %d: not %d tainted after the wave and %d resyncs: %s", w.fleet, want, w.resyncs, slotsState(ctx, t, admin, cfg, w.limit))
		}
		if w.resyncs == 0 {
			tainted, _, _ := fleet.read()
			w.unusedAfterWave = want - len(tainted)
		}
		w.resyncs++
		for _, n := range nodes {
			if !n.held.Load() {
				select {
				case n.resync <- struct{}{}:
				default:
				}
			}
		}
		deadline = time.Now().Add(settle)
	}
	tainted, _, maxSeen := fleet.read()
	w.tainted, w.maxSeen = len(tainted), maxSeen
	w.allTainted = time.Unix(0, lastTainted.Load()).Sub(faultAt)
	stop()
	wg.Wait()

	// Recovery: every holder untaints and releases; every refused node
	// releases too (it stops following a bucket), as the tainter does.
	for _, n := range nodes {
		if n.held.Load() {
			if err := untaintNode(ctx, admin, n.name); err != nil {
				t.Fatal(err)
			}
		}
		if err := n.slots.Release(ctx); err != nil {
			t.Fatalf("release %s: %v", n.name, err)
		}
	}
	testutil.WaitForWithin(t, time.Minute, fmt.Sprintf("fleet %d: every slot Lease released and no slot Lease watched", w.fleet), func() bool {
		if apicount.Sum(before).Open["WATCH leases"] != 0 {
			return false
		}
		leases, err := admin.CoordinationV1().Leases(cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: safeguard.SlotLabel + "=" + cfg.Prefix})
		return err == nil && len(leases.Items) == 0
	})
	// The releases expired the full-bucket hint's marks, so that the next
	// wave looks everywhere.
	testutil.WaitForWithin(t, time.Minute, fmt.Sprintf("fleet %d: the full-bucket hint marks no bucket after the recovery", w.fleet), func() bool {
		return hintMarks(ctx, admin, cfg) == ""
	})
	// Every write of the hint but its Create resets its managedFields,
	// which would repeat each annotation key.
	if l, err := admin.CoordinationV1().Leases(cfg.Namespace).Get(ctx, cfg.Prefix+"-full", metav1.GetOptions{}); err == nil && len(l.ManagedFields) > 0 {
		t.Errorf("fleet %d: the full-bucket hint carries managedFields %v after the wave", w.fleet, l.ManagedFields)
	}
	w.received = apicount.Sum(before).Minus(start)
	return w
}

// hintMarks are the buckets the full-bucket hint marks full now ("" when
// none, or no hint).
func hintMarks(ctx context.Context, c kubernetes.Interface, cfg safeguard.Config) string {
	l, err := c.CoordinationV1().Leases(cfg.Namespace).Get(ctx, cfg.Prefix+"-full", metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return ""
	}
	if err != nil {
		return err.Error()
	}
	if full := safeguard.FullBuckets(l, time.Now()); len(full) > 0 {
		return fmt.Sprint(full)
	}
	return ""
}

// TestSlotsUseEverySlotAtTheLimit: exactly K of a fleet of 800 fault at
// one instant (K = 160, ten buckets), so every one of them must get a
// slot. Reading a few buckets each, the last nodes of a wave may miss the
// last free slots and be refused beside them; the full-bucket hint, which
// the wave brings up to date, makes the refused nodes' own asks look
// where they are: every slot is used within the wave, with no resync.
// The two waves use the same slots: the second starts right after the
// first's recovery, whose releases expired the hint's marks (a mark left
// on a bucket whose slots were released would hide them from the
// second).
// (A model of the protocol without the hint needs about 20 resyncs at
// K = 200 and about 180 at K = 1,500.) How long after the fault the
// last slot was taken is logged.
func TestSlotsUseEverySlotAtTheLimit(t *testing.T) {
	t.Parallel()
	const (
		ns          = "gpu-node-agent-at-limit"
		size        = 800
		maxFraction = 0.2
	)
	c, admin := scaleCluster(t, ns)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	fleet := followTaints(t, c.Client, "fleet=limit")
	names := make([]string, size)
	for i := range names {
		names[i] = fmt.Sprintf("limit-%04d", i)
	}
	if err := createFleetNodes(ctx, admin, names, "limit"); err != nil {
		t.Fatal(err)
	}
	k := safeguard.Limit(size, maxFraction)
	for rep := range 2 {
		cfg := safeguard.Config{Namespace: ns, Prefix: "limit", MaxFraction: maxFraction, TaintKey: taintKey}.WithDefaults()
		w := slotsWave(ctx, t, c, admin, fleet, names, cfg, k)
		t.Logf("repetition %d: %d of %d faulting tainted (K %d, max seen %d), the last %.1f s after the fault; %d slots unused after the wave, %d resyncs to use them; %.1f KiB received per faulting node",
			rep, w.tainted, w.faulting, w.limit, w.maxSeen, w.allTainted.Seconds(), w.unusedAfterWave, w.resyncs, w.perFaulting()/1024)
		if w.tainted != k || w.maxSeen > k || w.resyncs > 0 {
			t.Errorf("repetition %d: %d tainted after %d resyncs, at most %d at once; want all %d faulting nodes within the wave (the nodes' own asks), never more",
				rep, w.tainted, w.resyncs, w.maxSeen, k)
		}
	}
}

// slotsState says which slots under k are free, bucket by bucket, and
// what the full-bucket hint says (for a failure message).
func slotsState(ctx context.Context, t *testing.T, c kubernetes.Interface, cfg safeguard.Config, k int) string {
	t.Helper()
	leases, err := c.CoordinationV1().Leases(cfg.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	held := map[string]bool{}
	hint := map[string]string{}
	for _, l := range leases.Items {
		held[l.Name] = true
		if l.Name == cfg.Prefix+"-full" {
			hint = l.Annotations
		}
	}
	free := map[int][]int{}
	for i := range k {
		if !held[fmt.Sprintf("%s-%d", cfg.Prefix, i)] {
			free[i/safeguard.BucketSize] = append(free[i/safeguard.BucketSize], i)
		}
	}
	return fmt.Sprintf("free slots by bucket %v; full-bucket hint %v", free, hint)
}
