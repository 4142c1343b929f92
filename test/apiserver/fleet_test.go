package apiserver

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/gpu-node-agent/gpu-node-agent/health"
	"github.com/gpu-node-agent/gpu-node-agent/internal/testutil"
	"github.com/gpu-node-agent/gpu-node-agent/kubeapi"
	"github.com/gpu-node-agent/gpu-node-agent/safeguard"
	"github.com/gpu-node-agent/gpu-node-agent/test/e2e/cluster"
	"github.com/gpu-node-agent/gpu-node-agent/test/internal/apicount"
)

// flipHealth is a node's fitness that the test flips.
type flipHealth struct {
	mu   sync.Mutex
	f    health.Fitness
	subs []chan struct{}
}

func (h *flipHealth) Fitness() health.Fitness {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.f
}

func (h *flipHealth) Subscribe() <-chan struct{} {
	ch := make(chan struct{}, 1)
	h.mu.Lock()
	h.subs = append(h.subs, ch)
	h.mu.Unlock()
	return ch
}

func (h *flipHealth) set(f health.Fitness) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.f = f
	for _, ch := range h.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// taintCount follows the fleet's Nodes with one informer and keeps the
// tainted count after every event and its maximum. One watch delivers
// events in etcd revision order, so the running count is the fleet's
// count at each revision and the maximum is exact.
type taintCount struct {
	mu      sync.Mutex
	tainted map[string]bool
	cond    map[string]corev1.ConditionStatus
	max     int
}

func followTaints(t *testing.T, c kubernetes.Interface, selector string) *taintCount {
	t.Helper()
	tc := &taintCount{tainted: map[string]bool{}, cond: map[string]corev1.ConditionStatus{}}
	f := informers.NewSharedInformerFactoryWithOptions(c, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.LabelSelector = selector
	}))
	inf := f.Core().V1().Nodes().Informer()
	seen := func(obj any) {
		n, ok := obj.(*corev1.Node)
		if !ok {
			return
		}
		tc.mu.Lock()
		defer tc.mu.Unlock()
		if tainted(n) {
			tc.tainted[n.Name] = true
		} else {
			delete(tc.tainted, n.Name)
		}
		if cond := condition(n, "GPUHealthy"); cond != nil {
			tc.cond[n.Name] = cond.Status
		}
		tc.max = max(tc.max, len(tc.tainted))
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: seen, UpdateFunc: func(_, obj any) { seen(obj) },
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); f.Shutdown() })
	f.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("fleet node informer not synced")
	}
	return tc
}

// reset starts a new maximum from the current count.
func (tc *taintCount) reset() {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	tc.max = len(tc.tainted)
}

func (tc *taintCount) read() (tainted map[string]bool, cond map[string]corev1.ConditionStatus, maxSeen int) {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	tainted, cond = map[string]bool{}, map[string]corev1.ConditionStatus{}
	for k, v := range tc.tainted {
		tainted[k] = v
	}
	for k, v := range tc.cond {
		cond[k] = v
	}
	return tainted, cond, tc.max
}

// fleetAgent is one node's agent API side: own clients and transport,
// NodeWatch, Tainter and a fitness the test flips.
type fleetAgent struct {
	name   string
	health *flipHealth
	reg    *prometheus.Registry
}

// fleetAgentClients are clients of their own on a copy of cfg: a Proxy
// func makes client-go give the copy its own transport and connections
// rather than the cached shared one.
func fleetAgentClients(t *testing.T, cfg *rest.Config, node string) kubeapi.Clients {
	t.Helper()
	cfg = rest.CopyConfig(cfg)
	kubeapi.ConfigureREST(cfg, "fleet-test/"+node, kubeapi.ClientConfig{})
	cfg.Proxy = func(*http.Request) (*url.URL, error) { return nil, nil }
	return clientsFor(t, cfg)
}

// TestFleetSafeguardUnderConcurrency: 40 agents (NodeWatch + Tainter
// each, own clients, MaxFraction 0.2: K = 8); 20 of them turn unfit at
// the same instant. Once every faulted agent has decided (condition False,
// and tainted or refused), at least 1 and at most 8 Nodes are tainted, and
// the count never went above 8 on the way, as a watch on the fleet saw
// it. Then all turn fit, and every taint and slot Lease is gone before the
// next of 20 repetitions.
func TestFleetSafeguardUnderConcurrency(t *testing.T) {
	t.Parallel()
	const (
		fleetSize   = 40
		faulting    = 20
		limit       = 8
		repetitions = 20
		ns          = "fleet-concurrency"
		fleet       = "concurrency"
	)
	c := cluster.Start(t, cluster.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace %s: %v", ns, err)
	}
	cfg := kubeapi.TaintConfig{MaxFraction: 0.2, NodeSelector: "fleet=" + fleet, LeaseNamespace: ns}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if k := safeguard.Limit(fleetSize, cfg.MaxFraction); k != limit {
		t.Fatalf("SlotLimit(%d, %g) = %d, want %d", fleetSize, cfg.MaxFraction, k, limit)
	}
	agents := make([]*fleetAgent, fleetSize)
	for i := range fleetSize {
		name := fmt.Sprintf("%s-%02d", fleet, i)
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"fleet": fleet}}}
		if _, err := c.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create node %s: %v", name, err)
		}
	}
	fleetNodes := followTaints(t, c.Client, "fleet="+fleet)
	for i := range fleetSize {
		a := &fleetAgent{name: fmt.Sprintf("%s-%02d", fleet, i), health: &flipHealth{f: health.Fitness{Fit: true}},
			reg: prometheus.NewPedanticRegistry()}
		tainter, err := newTainter(t, fleetAgentClients(t, c.RESTConfig, a.name), a.name, cfg, discard(), a.reg)
		if err != nil {
			t.Fatal(err)
		}
		runTainter(t, tainter, a.health)
		agents[i] = a
	}
	testutil.WaitForWithin(t, time.Minute, "every agent's first GPUHealthy=True", func() bool {
		_, cond, _ := fleetNodes.read()
		for _, a := range agents {
			if cond[a.name] != corev1.ConditionTrue {
				return false
			}
		}
		return true
	})

	unfit := health.Fitness{Reason: "gpu-lost", Message: "GPU-0: gpu lost", Devices: []string{"GPU-0"}}
	heldCounts := map[int]int{}
	for rep := range repetitions {
		faulted := make([]*fleetAgent, 0, faulting)
		for _, i := range rand.Perm(fleetSize)[:faulting] {
			faulted = append(faulted, agents[i])
		}
		fleetNodes.reset()
		for _, a := range faulted {
			a.health.set(unfit)
		}
		// Every faulted agent has decided: its condition is False and
		// it carries the taint or its safeguard refused it.
		testutil.WaitForWithin(t, time.Minute, fmt.Sprintf("repetition %d: every faulted agent tainted or refused", rep), func() bool {
			tainted, cond, _ := fleetNodes.read()
			for _, a := range faulted {
				if cond[a.name] != corev1.ConditionFalse {
					return false
				}
				if !tainted[a.name] && metricSum(t, a.reg, "gpu_node_agent_taint_refused") != 1 {
					return false
				}
			}
			return true
		})
		tainted, _, maxSeen := fleetNodes.read()
		heldCounts[len(tainted)]++
		if len(tainted) < 1 || len(tainted) > limit {
			t.Errorf("repetition %d: %d of %d faulted nodes tainted, want 1..%d", rep, len(tainted), faulting, limit)
		}
		if maxSeen > limit {
			t.Errorf("repetition %d: the fleet watch saw %d nodes tainted at once, limit %d", rep, maxSeen, limit)
		}
		for _, a := range faulted {
			delete(tainted, a.name)
		}
		if len(tainted) > 0 {
			t.Errorf("repetition %d: nodes that stayed fit are tainted: %v", rep, tainted)
		}

		for _, a := range faulted {
			a.health.set(health.Fitness{Fit: true})
		}
		testutil.WaitForWithin(t, time.Minute, fmt.Sprintf("repetition %d: every taint and slot Lease gone", rep), func() bool {
			tainted, cond, _ := fleetNodes.read()
			for _, a := range faulted {
				if cond[a.name] != corev1.ConditionTrue {
					return false
				}
			}
			if len(tainted) > 0 {
				return false
			}
			leases, err := c.Client.CoordinationV1().Leases(ns).List(ctx, metav1.ListOptions{LabelSelector: safeguard.SlotLabel})
			return err == nil && len(leases.Items) == 0
		})
	}
	t.Logf("tainted nodes per repetition (count: repetitions): %v", heldCounts)
}

// TestFleetRefusedTakeFreedSlots: 40 agents (K = 8), 12 unfit at once: 8
// tainted, 4 refused. Then 3 of the tainted turn fit: their slots are
// freed and 3 of the refused take them, promptly and with no resync (the
// node informers' resync is an hour), because a refused node follows its
// bucket of slots with a watch and reconciles when a slot of it is freed.
// The fleet watch never sees more than 8 tainted. When every node is fit
// again no slot Lease is left and no agent still watches slot Leases.
func TestFleetRefusedTakeFreedSlots(t *testing.T) {
	t.Parallel()
	const (
		fleetSize = 40
		faulting  = 12
		recovered = 3
		limit     = 8
		ns        = "fleet-freed"
		fleet     = "freed"
	)
	c := cluster.Start(t, cluster.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace %s: %v", ns, err)
	}
	cfg := kubeapi.TaintConfig{MaxFraction: 0.2, NodeSelector: "fleet=" + fleet, LeaseNamespace: ns, Resync: time.Hour}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	for i := range fleetSize {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%02d", fleet, i), Labels: map[string]string{"fleet": fleet}}}
		if _, err := c.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create node %s: %v", node.Name, err)
		}
	}
	fleetNodes := followTaints(t, c.Client, "fleet="+fleet)
	agents := make([]*fleetAgent, fleetSize)
	ctrs := make([]*apicount.Counter, fleetSize)
	for i := range fleetSize {
		a := &fleetAgent{name: fmt.Sprintf("%s-%02d", fleet, i), health: &flipHealth{f: health.Fitness{Fit: true}},
			reg: prometheus.NewPedanticRegistry()}
		rc := rest.CopyConfig(c.RESTConfig)
		kubeapi.ConfigureREST(rc, "fleet-test/"+a.name, kubeapi.ClientConfig{})
		rc.Proxy = func(*http.Request) (*url.URL, error) { return nil, nil }
		ctrs[i] = apicount.New()
		rc.WrapTransport = ctrs[i].Wrap
		tainter, err := newTainter(t, clientsFor(t, rc), a.name, cfg, discard(), a.reg)
		if err != nil {
			t.Fatal(err)
		}
		runTainter(t, tainter, a.health)
		agents[i] = a
	}
	testutil.WaitForWithin(t, time.Minute, "every agent's first GPUHealthy=True", func() bool {
		_, cond, _ := fleetNodes.read()
		for _, a := range agents {
			if cond[a.name] != corev1.ConditionTrue {
				return false
			}
		}
		return true
	})

	unfit := health.Fitness{Reason: "gpu-lost", Message: "GPU-0: gpu lost", Devices: []string{"GPU-0"}}
	faulted := make([]*fleetAgent, 0, faulting)
	for _, i := range rand.Perm(fleetSize)[:faulting] {
		faulted = append(faulted, agents[i])
	}
	fleetNodes.reset()
	for _, a := range faulted {
		a.health.set(unfit)
	}
	refusedOf := func() (tainted, refused []*fleetAgent) {
		taints, _, _ := fleetNodes.read()
		for _, a := range faulted {
			switch {
			case taints[a.name]:
				tainted = append(tainted, a)
			case metricSum(t, a.reg, "gpu_node_agent_taint_refused") == 1:
				refused = append(refused, a)
			}
		}
		return tainted, refused
	}
	testutil.WaitForWithin(t, time.Minute, "8 tainted and 4 refused", func() bool {
		tainted, refused := refusedOf()
		return len(tainted) == limit && len(refused) == faulting-limit
	})
	tainted, refused := refusedOf()
	for _, a := range tainted[:recovered] {
		a.health.set(health.Fitness{Fit: true})
	}
	testutil.WaitForWithin(t, time.Minute, "3 of the refused tainted in the freed slots", func() bool {
		taints, _, _ := fleetNodes.read()
		took := 0
		for _, a := range refused {
			if taints[a.name] {
				took++
			}
		}
		return took == recovered && len(taints) == limit
	})
	if _, _, maxSeen := fleetNodes.read(); maxSeen > limit {
		t.Errorf("the fleet watch saw %d nodes tainted at once, limit %d", maxSeen, limit)
	}

	for _, a := range faulted {
		a.health.set(health.Fitness{Fit: true})
	}
	testutil.WaitForWithin(t, time.Minute, "every taint, slot Lease and watch of slot Leases gone", func() bool {
		taints, _, _ := fleetNodes.read()
		if len(taints) > 0 || apicount.Sum(ctrs).Open["WATCH leases"] != 0 {
			return false
		}
		leases, err := c.Client.CoordinationV1().Leases(ns).List(ctx, metav1.ListOptions{LabelSelector: safeguard.SlotLabel})
		return err == nil && len(leases.Items) == 0
	})
}
