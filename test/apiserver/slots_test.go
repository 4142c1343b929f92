package apiserver

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"

	"github.com/gpu-node-agent/gpu-node-agent/kubeapi"
	"github.com/gpu-node-agent/gpu-node-agent/safeguard"
	"github.com/gpu-node-agent/gpu-node-agent/test/e2e/cluster"
	"github.com/gpu-node-agent/gpu-node-agent/test/internal/apicount"
)

// slotRequests records one agent's requests as "METHOD path": a watch as
// WATCH, and the first LIST of a watch (an informer's reflector lists a
// collection at resourceVersion "0", which Slots' own LISTs never ask
// for) as WATCHLIST, so that a watch's setup, which runs on its own
// goroutine and may land in any window, counts with the watches.
type slotRequests struct {
	mu   sync.Mutex
	reqs []string
}

func (c *slotRequests) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		method := r.Method
		switch q := r.URL.Query(); {
		case q.Get("watch") == "true":
			method = "WATCH"
		case method == http.MethodGet && q.Get("resourceVersion") == "0" && strings.HasSuffix(r.URL.Path, "/leases"):
			method = "WATCHLIST"
		}
		c.mu.Lock()
		c.reqs = append(c.reqs, method+" "+r.URL.Path)
		c.mu.Unlock()
		return rt.RoundTrip(r)
	})
}

// since returns the requests made after the first n.
func (c *slotRequests) since(n int) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.reqs[n:])
}

func (c *slotRequests) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.reqs)
}

// requestShape is how many requests, LISTs, writes and watches reqs
// holds (a GET of a collection path is a LIST).
type requestShape struct{ requests, lists, writes, watches int }

func shapeOf(reqs []string) requestShape {
	var s requestShape
	for _, r := range reqs {
		method, path, _ := strings.Cut(r, " ")
		s.requests++
		switch {
		case strings.HasPrefix(method, "WATCH"):
			s.watches++
		case method != http.MethodGet:
			s.writes++
		case strings.HasSuffix(path, "/leases") || strings.HasSuffix(path, "/nodes"):
			s.lists++
		}
	}
	return s
}

// slotAgent is one node's safeguard with its own clients and transport:
// the agent's (kubeapi.Clients) for the safeguard, and a clientset for the
// node's taint, which the test writes in place of the tainter.
type slotAgent struct {
	node   string
	agent  kubernetes.Interface
	meta   metadata.Interface
	client kubernetes.Interface
	reqs   *slotRequests
}

// newSlotAgent builds the agent's clients and a clientset of their own on
// a copy of cfg: a Proxy func makes client-go give the copy its own
// transport (and connection pool) rather than the cached shared one.
func newSlotAgent(t *testing.T, cfg *rest.Config, node string) *slotAgent {
	t.Helper()
	a := &slotAgent{node: node, reqs: &slotRequests{}}
	cfg = rest.CopyConfig(cfg)
	cfg.WrapTransport = a.reqs.wrap
	cfg.Proxy = func(*http.Request) (*url.URL, error) { return nil, nil }
	cfg.UserAgent = "slots-test/" + node
	clients, err := kubeapi.ClientsForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	a.agent, a.meta = clients.Core, clients.Meta
	if a.client, err = kubernetes.NewForConfig(cfg); err != nil {
		t.Fatal(err)
	}
	return a
}

// TestSlotsHoldUnderConcurrency: in a fleet of 40 Nodes with MaxFraction
// 0.2 (K = 8), 20 agents, each with its own client, ask for a taint slot
// at the same instant, and each that gets one renews it and taints its
// Node. Whatever the interleaving, at least 1 and at most 8 hold a slot,
// no slot has two holders, and exactly the holders' Nodes are tainted.
// The losers asking again make at most one LIST each and no write.
// Repeated with a fresh slot prefix per repetition on one API server.
// Even repetitions select the fleet by label and start cold (their own
// Leases looked up, a bucket listed, the fleet size read from the Nodes);
// odd ones take the chart's
// default (no selector: the whole cluster, counted by the API server)
// and start as the tainter does, after a Release at start, so they
// probe: create two random slots blind before reading any.
func TestSlotsHoldUnderConcurrency(t *testing.T) {
	t.Parallel()
	const (
		fleetSize   = 40
		faulting    = 20
		limit       = 8
		repetitions = 25
		ns          = "gpu-node-agent-slots"
		fleet       = "slots"
	)
	c := cluster.Start(t, cluster.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace %s: %v", ns, err)
	}
	agents := make([]*slotAgent, fleetSize)
	for i := range fleetSize {
		name := fmt.Sprintf("%s-%02d", fleet, i)
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"fleet": fleet}}}
		if _, err := c.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create node %s: %v", name, err)
		}
		agents[i] = newSlotAgent(t, c.RESTConfig, name)
	}
	// Tainted Nodes outside the fleet count neither in N nor in K.
	createNode(t, c.Client, "slots-outsider", corev1.Taint{Key: taintKey, Value: "xid", Effect: corev1.TaintEffectNoSchedule})

	// With no selector the fleet is every Node: the 40, the outsider.
	all, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if k := safeguard.Limit(len(all.Items), 0.2); k != limit {
		t.Fatalf("a cluster of %d Nodes has K = %d, want %d", len(all.Items), k, limit)
	}

	heldCounts := map[int]int{}
	granted, refused, again := map[string]int{}, map[string]int{}, map[requestShape]int{}
	for rep := range repetitions {
		probing := rep%2 == 1
		cfg := safeguard.Config{Namespace: ns, Prefix: fmt.Sprintf("slot-r%d", rep), MaxFraction: 0.2,
			NodeSelector: "fleet=" + fleet, TaintKey: taintKey}.WithDefaults()
		wantFleet := fleetSize
		if probing {
			cfg.NodeSelector, wantFleet = "", len(all.Items)
		}
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		type result struct {
			agent    *slotAgent
			slots    *safeguard.Slots
			decision safeguard.Decision
			reqs     []string
			err      error
		}
		results := make([]result, faulting)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i, idx := range rand.Perm(fleetSize)[:faulting] {
			a := agents[idx]
			s := safeguard.New(a.agent, a.meta, a.node, cfg, discard())
			if probing {
				// As the tainter at start: nothing held (two LISTs of
				// its own Leases).
				if err := s.Release(ctx); err != nil {
					t.Fatalf("repetition %d: release at start %s: %v", rep, a.node, err)
				}
			}
			wg.Go(func() {
				<-start
				before := a.reqs.count()
				d, err := s.Acquire(ctx)
				r := result{agent: a, slots: s, decision: d, reqs: a.reqs.since(before), err: err}
				if err == nil && d.Held {
					r.err = s.Renew(ctx)
					if r.err == nil {
						r.err = taintNode(ctx, a.client, a.node)
					}
				}
				results[i] = r
			})
		}
		close(start)
		wg.Wait()

		var holders []result
		slotOf := map[int]string{}
		unlisted := 0
		for _, r := range results {
			if r.err != nil {
				t.Fatalf("repetition %d: node %s: %v", rep, r.agent.node, r.err)
			}
			mode := "cold"
			if probing {
				mode = "probing"
			}
			if !r.decision.Held {
				refused[fmt.Sprintf("%s %+v", mode, shapeOf(r.reqs))]++
				continue
			}
			granted[fmt.Sprintf("%s %+v", mode, shapeOf(r.reqs))]++
			if !listsLeases(r.reqs) {
				unlisted++
			}
			holders = append(holders, r)
			if other, dup := slotOf[r.decision.Slot]; dup {
				t.Errorf("repetition %d: slot %d held by both %s and %s", rep, r.decision.Slot, other, r.agent.node)
			}
			slotOf[r.decision.Slot] = r.agent.node
			if r.decision.Slot < 0 || r.decision.Slot >= limit || r.decision.Limit != limit || r.decision.Fleet != wantFleet {
				t.Errorf("repetition %d: node %s decision %+v, want a slot under %d of a fleet of %d", rep, r.agent.node, r.decision, limit, wantFleet)
			}
		}
		heldCounts[len(holders)]++
		// The first Create to reach the API server wins whatever slot it
		// names, so in a probing repetition at least one holder took its
		// slot without reading the slots.
		if probing && unlisted == 0 {
			t.Errorf("repetition %d: every holder listed the slots, want at least one probe to win", rep)
		}
		if len(holders) < 1 || len(holders) > limit {
			t.Errorf("repetition %d: %d of %d nodes hold a slot, want 1..%d", rep, len(holders), faulting, limit)
		}
		if n := countTainted(ctx, t, c.Client, fleet); n != len(holders) {
			t.Errorf("repetition %d: %d fleet nodes tainted, want the %d holders", rep, n, len(holders))
		}
		leases, err := c.Client.CoordinationV1().Leases(ns).List(ctx, metav1.ListOptions{LabelSelector: safeguard.SlotLabel + "=" + cfg.Prefix})
		if err != nil {
			t.Fatal(err)
		}
		if len(leases.Items) != len(holders) {
			t.Errorf("repetition %d: %d slot leases, want one per holder (%d)", rep, len(leases.Items), len(holders))
		}
		for _, l := range leases.Items {
			idx := strings.TrimPrefix(l.Name, cfg.Prefix+"-")
			if h := *l.Spec.HolderIdentity; slotOf[atoi(t, idx)] != h {
				t.Errorf("repetition %d: lease %s held by %s, Acquire said %q", rep, l.Name, h, slotOf[atoi(t, idx)])
			}
		}

		// The refused ask again while every slot is held: no write, and
		// at most one LIST each (K = 8 is one bucket: read from the watch
		// the refusal started once it has synced, listed before). Only
		// when all K slots are held: with fewer, the ask may rightly
		// succeed.
		if len(holders) == limit {
			for _, r := range results {
				if r.decision.Held {
					continue
				}
				before := r.agent.reqs.count()
				d, err := r.slots.Acquire(ctx)
				if err != nil || d.Held {
					t.Fatalf("repetition %d: %s asking again with all slots held: %+v, %v; want refused", rep, r.agent.node, d, err)
				}
				sh := shapeOf(withoutWatches(r.agent.reqs.since(before)))
				again[sh]++
				if sh.writes != 0 || sh.lists > 1 || sh.requests != sh.lists {
					t.Errorf("repetition %d: refused re-ask made %+v, want no write and at most one LIST", rep, sh)
				}
			}
		}

		// Untaint and release, as the tainter does on recovery; the
		// refused release too (it stops the watch each follows).
		for _, r := range results {
			if r.decision.Held {
				if err := untaintNode(ctx, r.agent.client, r.agent.node); err != nil {
					t.Fatal(err)
				}
			}
			if err := r.slots.Release(ctx); err != nil {
				t.Fatalf("repetition %d: release %s: %v", rep, r.agent.node, err)
			}
		}
		leases, err = c.Client.CoordinationV1().Leases(ns).List(ctx, metav1.ListOptions{LabelSelector: safeguard.SlotLabel + "=" + cfg.Prefix})
		if err != nil {
			t.Fatal(err)
		}
		if len(leases.Items) != 0 {
			t.Errorf("repetition %d: %d slot leases left after every holder released", rep, len(leases.Items))
		}
	}
	t.Logf("holders per repetition (count: repetitions): %v", heldCounts)
	t.Logf("granted Acquire (first ask, fleet size measured): %v", granted)
	t.Logf("refused Acquire (first ask, fleet size measured): %v", refused)
	t.Logf("refused Acquire (asking again, all slots held): %v", again)
}

// withoutWatches is reqs less the watch requests (WATCH, WATCHLIST),
// which the watch of a bucket a refusal starts makes on its own goroutine:
// its initial state streamed by the watch itself (client-go's
// WatchListClient) or, where etcd cannot stream it, listed first.
func withoutWatches(reqs []string) []string {
	var out []string
	for _, r := range reqs {
		if !strings.HasPrefix(r, "WATCH") {
			out = append(out, r)
		}
	}
	return out
}

// listsLeases says whether reqs hold a LIST of Leases.
func listsLeases(reqs []string) bool {
	for _, r := range reqs {
		method, path, _ := strings.Cut(r, " ")
		if method == http.MethodGet && strings.HasSuffix(path, "/leases") {
			return true
		}
	}
	return false
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	var i int
	if _, err := fmt.Sscan(s, &i); err != nil {
		t.Fatalf("slot index %q: %v", s, err)
	}
	return i
}

// taintNode adds our taint to a Node that has none (a merge patch
// replaces the whole list; the test Nodes carry no other taint).
func taintNode(ctx context.Context, c kubernetes.Interface, name string) error {
	patch := fmt.Sprintf(`{"spec":{"taints":[{"key":%q,"value":"xid","effect":"NoSchedule"}]}}`, taintKey)
	if _, err := c.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("taint node %s: %w", name, err)
	}
	return nil
}

func untaintNode(ctx context.Context, c kubernetes.Interface, name string) error {
	if _, err := c.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, []byte(`{"spec":{"taints":null}}`), metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("untaint node %s: %w", name, err)
	}
	return nil
}

// countTainted counts the fleet's Nodes carrying our taint.
func countTainted(ctx context.Context, t *testing.T, c kubernetes.Interface, fleet string) int {
	t.Helper()
	list, err := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: "fleet=" + fleet})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for i := range list.Items {
		if tainted(&list.Items[i]) {
			n++
		}
	}
	return n
}

// TestSlotsFleetSizeCounted: with no node selector the real API server
// tells the fleet size through remainingItemCount, so measuring it is one
// metadata LIST of limit 1 however large the fleet (safeguard.Slots.measure).
func TestSlotsFleetSizeCounted(t *testing.T) {
	t.Parallel()
	const fleetSize, ns = 30, "gpu-node-agent-count"
	c := cluster.Start(t, cluster.Options{})
	ctx := t.Context()
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace %s: %v", ns, err)
	}
	for i := range fleetSize {
		createNode(t, c.Client, fmt.Sprintf("count-%02d", i))
	}
	nodes, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var nodeLists []string
	cfg := rest.CopyConfig(c.RESTConfig)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if r.Method == http.MethodGet && r.URL.Path == "/api/v1/nodes" {
				mu.Lock()
				nodeLists = append(nodeLists, r.URL.RawQuery)
				mu.Unlock()
			}
			return rt.RoundTrip(r)
		})
	}
	kubeapi.ConfigureREST(cfg, "count-test", kubeapi.ClientConfig{})
	clients, err := kubeapi.ClientsForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	scfg := safeguard.Config{Namespace: ns, MaxFraction: 0.2, TaintKey: taintKey}.WithDefaults()
	if err := scfg.Validate(); err != nil {
		t.Fatal(err)
	}
	s := safeguard.New(clients.Core, clients.Meta, "count-00", scfg, discard())
	d, err := s.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := len(nodes.Items); d.Fleet != want || d.Limit != safeguard.Limit(want, 0.2) || !d.Held {
		t.Errorf("decision %+v, want a slot of a fleet of %d (limit %d)", d, want, safeguard.Limit(want, 0.2))
	}
	mu.Lock()
	defer mu.Unlock()
	if len(nodeLists) != 1 || !strings.Contains(nodeLists[0], "limit=1") || strings.Contains(nodeLists[0], "continue=") {
		t.Errorf("node LISTs %q, want one of limit 1 (the count in remainingItemCount)", nodeLists)
	}
}

// TestSlotsRestartReadsOwnLease: an agent that restarts while it holds a
// slot and 100 slots are held by others finds its own Lease with the two
// LISTs of its own Leases (by its holder label, and those without one)
// and renews it, and a restart that only releases finds and deletes it
// the same way: each reads its own Lease, far less than the 101 slot
// Leases one LIST of every slot returns (measured here with the same
// protobuf client, on each agent's transport, as the fleet simulation
// counts bytes).
func TestSlotsRestartReadsOwnLease(t *testing.T) {
	t.Parallel()
	const (
		ns     = "gpu-node-agent-restart-slots"
		self   = "restart-self"
		others = 100
	)
	c := cluster.Start(t, cluster.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin := fastAdmin(t, c.RESTConfig)
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace %s: %v", ns, err)
	}
	for i := range 5 {
		createNode(t, admin, fmt.Sprintf("restart-%d", i))
	}
	createNode(t, admin, self)
	cfg := safeguard.Config{Namespace: ns, MaxFraction: 0.2, TaintKey: taintKey}.WithDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	// start is one run of the agent: its own clients and transport,
	// counted.
	start := func() (*safeguard.Slots, *apicount.Counter, kubernetes.Interface) {
		ctr := apicount.New()
		rc := rest.CopyConfig(c.RESTConfig)
		kubeapi.ConfigureREST(rc, "slots-restart/"+self, kubeapi.ClientConfig{})
		rc.WrapTransport = ctr.Wrap
		rc.Proxy = func(*http.Request) (*url.URL, error) { return nil, nil }
		clients := clientsFor(t, rc)
		return safeguard.New(clients.Core, clients.Meta, self, cfg, discard()), ctr, clients.Core
	}

	// The first run takes a slot.
	first, _, _ := start()
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	d, err := first.Acquire(ctx)
	if err != nil || !d.Held {
		t.Fatalf("first run: %+v, %v; want a slot held", d, err)
	}
	ours := d.Slot
	// Then 100 other nodes hold the slots around it, labelled and
	// annotated as the agent writes them.
	now := metav1.NewMicroTime(time.Now())
	for i, idx := 0, 0; i < others; idx++ {
		if idx == ours {
			continue
		}
		holder := fmt.Sprintf("restart-other-%03d", i)
		l := &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", cfg.Prefix, idx), Namespace: ns,
				Labels: map[string]string{safeguard.SlotLabel: cfg.Prefix, safeguard.BucketLabel: strconv.Itoa(idx / safeguard.BucketSize),
					safeguard.HolderLabel: safeguard.HolderValue(holder)},
				Annotations: map[string]string{safeguard.FleetSizeAnnotation: "7500",
					safeguard.FleetSizeMeasuredAtAnnotation: now.UTC().Format(time.RFC3339)}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: new(int32(900)),
				AcquireTime: &now, RenewTime: &now, LeaseTransitions: new(int32(0))},
		}
		if _, err := admin.CoordinationV1().Leases(ns).Create(ctx, l, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		i++
	}

	// What one LIST of every slot reads, on the agent's kind of client.
	_, allCtr, lister := start()
	all, err := lister.CoordinationV1().Leases(ns).List(ctx, metav1.ListOptions{LabelSelector: safeguard.SlotLabel + "=" + cfg.Prefix})
	if err != nil {
		t.Fatal(err)
	}
	if len(all.Items) != others+1 {
		t.Fatalf("%d slot Leases, want %d", len(all.Items), others+1)
	}
	allBytes := apicount.Sum([]*apicount.Counter{allCtr}).Bytes
	perLease := float64(allBytes) / float64(len(all.Items))

	check := func(run string, ctr *apicount.Counter, wantKinds map[string]int) {
		t.Helper()
		got := apicount.Sum([]*apicount.Counter{ctr})
		t.Logf("%s: %d bytes received (%s); one LIST of every slot: %d bytes, %.0f per Lease", run, got.Received(),
			got.Describe(func(string) bool { return true }), allBytes, perLease)
		if !maps.Equal(got.Kinds, wantKinds) {
			t.Errorf("%s: requests %v, want %v", run, got.Kinds, wantKinds)
		}
		if float64(got.Received()) >= 10*perLease {
			t.Errorf("%s: received %d bytes, want under 10 Leases' worth (%.0f): its own Lease, not the %d slots",
				run, got.Received(), 10*perLease, len(all.Items))
		}
	}

	// A restart while unfit: its Lease found and renewed.
	second, ctr, _ := start()
	if d, err := second.Acquire(ctx); err != nil || d != (safeguard.Decision{Held: true, Slot: ours}) {
		t.Fatalf("after a restart: %+v, %v; want slot %d renewed", d, err, ours)
	}
	check("restart, Acquire", ctr, map[string]int{"LIST leases": 2, "PUT leases": 1})

	// A restart while fit: its Lease found and released.
	third, ctr, _ := start()
	if err := third.Release(ctx); err != nil {
		t.Fatal(err)
	}
	check("restart, Release", ctr, map[string]int{"LIST leases": 2, "DELETE leases": 1})
	if _, err := admin.CoordinationV1().Leases(ns).Get(ctx, fmt.Sprintf("%s-%d", cfg.Prefix, ours), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("our slot %d after the release: %v, want NotFound", ours, err)
	}
}
