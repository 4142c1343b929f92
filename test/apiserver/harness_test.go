package apiserver

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/gpu-node-agent/gpu-node-agent/health"
	"github.com/gpu-node-agent/gpu-node-agent/internal/testutil"
	"github.com/gpu-node-agent/gpu-node-agent/kubeapi"
	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
	"github.com/gpu-node-agent/gpu-node-agent/safeguard"
	"github.com/gpu-node-agent/gpu-node-agent/sim"
	"github.com/gpu-node-agent/gpu-node-agent/sim/simtest"
)

// apiCounter counts the requests a client makes, by method and by
// response status, and the transport errors (API server down). before,
// when set, runs ahead of each request (to interleave a foreign write).
type apiCounter struct {
	mu      sync.Mutex
	methods map[string]int
	// requests counts completed requests by method and URL path.
	requests map[string]int
	status   map[int]int
	errors   int
	// watches counts the watch requests (?watch=true) among methods.
	watches int
	// inflight is how many requests have been sent and not yet answered
	// (a watch is answered when its response headers arrive).
	inflight int
	before   func(*http.Request)
}

func newAPICounter() *apiCounter {
	return &apiCounter{methods: map[string]int{}, requests: map[string]int{}, status: map[int]int{}}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// wrap is a rest.Config.WrapTransport.
func (c *apiCounter) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		c.mu.Lock()
		before := c.before
		c.mu.Unlock()
		if before != nil {
			before(r)
		}
		c.mu.Lock()
		c.inflight++
		c.mu.Unlock()
		resp, err := rt.RoundTrip(r)
		c.mu.Lock()
		defer c.mu.Unlock()
		c.inflight--
		c.methods[r.Method]++
		c.requests[r.Method+" "+r.URL.Path]++
		if r.URL.Query().Get("watch") == "true" {
			c.watches++
		}
		if err != nil {
			c.errors++
		} else {
			c.status[resp.StatusCode]++
		}
		return resp, err
	})
}

// settle waits until every request sent so far has been answered and
// counted. A write the API server has applied (and a test has read
// back) may still be on its way back to the client: its count lands
// only when the answer does.
func (c *apiCounter) settle(t testing.TB) {
	t.Helper()
	testutil.WaitForWithin(t, 30*time.Second, "the counted requests to be answered", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.inflight == 0
	})
}

// reset zeroes every count.
func (c *apiCounter) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.methods)
	clear(c.requests)
	clear(c.status)
	c.errors = 0
	c.watches = 0
}

// counts returns the writes (POST, PUT, PATCH, DELETE), the reads (GET)
// and a printable summary.
func (c *apiCounter) counts() (writes, reads int, summary string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range []string{http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
		writes += c.methods[m]
	}
	reads = c.methods[http.MethodGet]
	return writes, reads, fmt.Sprintf("methods %v, statuses %v, transport errors %d", c.methods, c.status, c.errors)
}

// watchCount is how many watch requests have been opened.
func (c *apiCounter) watchCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.watches
}

// requestCount is how many method requests for path have completed.
func (c *apiCounter) requestCount(method, path string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.requests[method+" "+path]
}

func (c *apiCounter) statusCount(code int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.status[code]
}

func (c *apiCounter) errorCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.errors
}

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// simHealth is a health monitor and its NVML sampler running on a
// simulated node, as the agent wires them (run.go).
type simHealth struct {
	node    *sim.Node
	mon     *health.Monitor
	sampler *nvmlowner.Sampler
	// reg holds the monitor's metrics: the observations it counts are
	// the tests' signal that it has applied a sampling cycle.
	reg  *prometheus.Registry
	stop func()
}

// newSimNode is a simulated DGX H100.
func newSimNode(t testing.TB) *sim.Node {
	t.Helper()
	spec, err := sim.Profile("dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	node, err := sim.New(spec, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return node
}

// startSimMonitor runs a health monitor and its sampler on a new simulated
// DGX H100 (see runSimMonitor).
func startSimMonitor(t testing.TB, cfg health.Config) *simHealth {
	t.Helper()
	return runSimMonitor(t, newSimNode(t), cfg)
}

// runSimMonitor builds a monitor on node (restoring cfg.StateDir, if set,
// in NewMonitor) and runs it with a sampler whose interval is
// cfg.PollInterval, until stop is called or the test ends. It returns once
// the monitor's XID event set is registered (the simulator, like NVML,
// drops events raised before that) and the sampler has published a cycle.
func runSimMonitor(t testing.TB, node *sim.Node, cfg health.Config) *simHealth {
	t.Helper()
	h := buildSimMonitor(t, node, cfg)
	h.start(t)
	testutil.WaitForWithin(t, time.Minute, "the monitor's XID event set and a first sampling cycle", func() bool {
		return h.mon.Listening() && h.sampler.Latest() != nil
	})
	return h
}

// buildSimMonitor builds the monitor and sampler without running them.
func buildSimMonitor(t testing.TB, node *sim.Node, cfg health.Config) *simHealth {
	t.Helper()
	cfg.DCGMMode = health.DCGMOff
	owner := nvmlowner.New(node.NVML(), nvmlowner.Config{}, discard())
	if err := owner.Init(context.Background()); err != nil {
		t.Fatalf("simulated nvml init: %v", err)
	}
	reg := prometheus.NewPedanticRegistry()
	mon, err := health.NewMonitor(cfg, owner, discard(), reg)
	if err != nil {
		t.Fatal(err)
	}
	interval := cfg.PollInterval
	if interval == 0 {
		interval = health.Config{}.WithDefaults().PollInterval
	}
	sampler := nvmlowner.NewSampler(owner, nvmlowner.SamplerConfig{Interval: interval})
	sampler.SetTargets(nvmlowner.TargetsOf(node.Spec()))
	mon.SetSampler(sampler)
	mon.SetNode(node.Spec())
	return &simHealth{node: node, mon: mon, sampler: sampler, reg: reg, stop: func() {}}
}

// start runs the monitor and the sampler until stop or the test's end.
func (h *simHealth) start(t testing.TB) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = h.mon.Run(ctx) })
	wg.Go(func() { _ = h.sampler.Run(ctx) })
	var once sync.Once
	h.stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	t.Cleanup(h.stop)
}

// gpu is GPU i's UUID.
func (h *simHealth) gpu(i int) string { return h.node.Spec().GPUs[i].UUID }

// recoveryActionSeen counts the sampling cycles in which the monitor read
// a GPU's driver recovery action asking for a reset (NVML_FI_DEV_GET_GPU_
// RECOVERY_ACTION; the simulator sets it with every reset-class XID).
func (h *simHealth) recoveryActionSeen(t testing.TB) float64 {
	t.Helper()
	return metricByLabel(t, h.reg, "gpu_node_agent_fault_observations_total", "check")[health.CheckRecovery]
}

// awaitResetRequested waits until the monitor has applied a sampling
// cycle, begun after this call, that read a GPU asking for a reset: the
// reset evidence the monitor looks for is that field going back to none
// between two of its samples, so a reset before it had seen the request
// would leave no trace.
func (h *simHealth) awaitResetRequested(t testing.TB) {
	t.Helper()
	base := h.recoveryActionSeen(t)
	testutil.WaitForWithin(t, time.Minute, "a sampling cycle reading the GPU's reset request", func() bool {
		return h.recoveryActionSeen(t) >= base+2
	})
}

// heldThenReset checks that GPU i's reset-class fault outlasts the
// recovery period while nothing resets the GPU (the monitor applies
// sampling cycles spanning more than the period, and GPU i is still
// unhealthy and the node unfit), then resets GPU i in the simulator.
func (h *simHealth) heldThenReset(t testing.TB, i int, recovery time.Duration) {
	t.Helper()
	h.awaitResetRequested(t)
	// n cycles are at least (n-1) intervals apart: more than the
	// recovery period plus one interval for the monitor's timer.
	n := int(recovery/h.sampler.Interval()) + 3
	base := h.recoveryActionSeen(t)
	testutil.WaitForWithin(t, time.Minute+time.Duration(n)*h.sampler.Interval(), fmt.Sprintf("%d more sampling cycles", n), func() bool {
		return h.recoveryActionSeen(t) >= base+float64(n)
	})
	if h.mon.Healthy(h.gpu(i)) {
		t.Fatalf("GPU %d healthy again %d sampling cycles (%s each) after a reset-class fault, with recovery period %s and no reset",
			i, n, h.sampler.Interval(), recovery)
	}
	if fit, _ := h.mon.NodeFit(); fit {
		t.Fatalf("node fit again after a reset-class fault on GPU %d without a reset", i)
	}
	simtest.Fault(t, h.node, http.MethodPost, fmt.Sprintf(`{"kind":"gpu-reset","gpu":%d}`, i))
}

// startNodeWatch runs the informer of node name on client until the test
// ends, as the agent does once for its tainter and labeler.
func startNodeWatch(t testing.TB, client kubernetes.Interface, name string, resync time.Duration) *kubeapi.NodeWatch {
	t.Helper()
	w, err := kubeapi.NewNodeWatch(client, name, resync)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return w
}

// newTainter builds the tainter of node name on client, on a node
// informer of its own (resync cfg.Resync) running until the test ends.
func newTainter(t testing.TB, clients kubeapi.Clients, name string, cfg kubeapi.TaintConfig, log *slog.Logger,
	reg prometheus.Registerer) (*kubeapi.Tainter, error) {
	t.Helper()
	return kubeapi.NewTainter(clients, startNodeWatch(t, clients.Core, name, cfg.WithDefaults().Resync), cfg, log, reg)
}

// clientsFor are an agent's clients over cfg.
func clientsFor(t testing.TB, cfg *rest.Config) kubeapi.Clients {
	t.Helper()
	c, err := kubeapi.ClientsForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// countedClients are an agent's clients whose requests counter counts.
func countedClients(t testing.TB, cfg *rest.Config, counter *apiCounter) kubeapi.Clients {
	t.Helper()
	cfg = rest.CopyConfig(cfg)
	cfg.WrapTransport = counter.wrap
	return clientsFor(t, cfg)
}

// holdSlots has each named node take a fleet safeguard slot, as its
// agent does before it taints.
func holdSlots(t testing.TB, clients kubeapi.Clients, cfg kubeapi.TaintConfig, names ...string) {
	t.Helper()
	for _, n := range names {
		d, err := safeguard.New(clients.Core, clients.Meta, n, cfg.SafeguardConfig(), discard()).Acquire(context.Background())
		if err != nil || !d.Held {
			t.Fatalf("node %s takes a slot: %+v, %v", n, d, err)
		}
	}
}

// countingHealth is a monitor whose Fitness calls are counted: the
// tainter's Run calls it once at the start of every reconcile, so the
// count going up by 2 means a whole reconcile began after the call.
type countingHealth struct {
	*health.Monitor
	calls atomic.Int64
}

func (h *countingHealth) Fitness() health.Fitness {
	h.calls.Add(1)
	return h.Monitor.Fitness()
}

func (h *countingHealth) reconciles() int64 { return h.calls.Load() }

// runTainter runs tainter.Run(mon) until stop is called or the test ends.
func runTainter(t testing.TB, tainter *kubeapi.Tainter, mon kubeapi.Health) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := tainter.Run(ctx, mon); err != nil {
			t.Errorf("tainter run: %v", err)
		}
	})
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	t.Cleanup(stop)
	return stop
}

// nodeWatch watches one Node and re-opens the watch when the API server
// ends it or sends an ERROR event (a busy apiserver may do either); each
// (re)opened watch starts with the Node's current state, so no state is
// missed.
type nodeWatch struct {
	t    testing.TB
	c    kubernetes.Interface
	name string
	w    watch.Interface
}

// watchNode watches one Node; the first event is its current state.
func watchNode(t testing.TB, c kubernetes.Interface, name string) *nodeWatch {
	t.Helper()
	nw := &nodeWatch{t: t, c: c, name: name}
	nw.open()
	t.Cleanup(func() { nw.w.Stop() })
	return nw
}

func (nw *nodeWatch) open() {
	nw.t.Helper()
	if nw.w != nil {
		nw.w.Stop()
	}
	w, err := nw.c.CoreV1().Nodes().Watch(context.Background(), metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("metadata.name", nw.name).String(),
	})
	if err != nil {
		nw.t.Fatalf("watch node %s: %v", nw.name, err)
	}
	nw.w = w
}

// awaitNode reads w until the Node satisfies cond and returns it.
func awaitNode(t testing.TB, w *nodeWatch, timeout time.Duration, what string, cond func(*corev1.Node) bool) *corev1.Node {
	t.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		select {
		case ev, ok := <-w.w.ResultChan():
			n, isNode := ev.Object.(*corev1.Node)
			if !ok || !isNode {
				t.Logf("node watch ended (%s event, %T) while waiting for %s; re-opening", ev.Type, ev.Object, what)
				w.open()
				continue
			}
			if cond(n) {
				return n
			}
		case <-timer.C:
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
	}
}

func tainted(n *corev1.Node) bool { return len(ours(n)) > 0 }

func conditionIs(n *corev1.Node, status corev1.ConditionStatus) bool {
	c := condition(n, "GPUHealthy")
	return c != nil && c.Status == status
}

// nodeEvents lists the events about node with the given reason.
func nodeEvents(t testing.TB, c kubernetes.Interface, node, reason string) []corev1.Event {
	t.Helper()
	sel := fields.Set{"involvedObject.kind": "Node", "involvedObject.name": node, "reason": reason}.AsSelector().String()
	list, err := c.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		t.Fatalf("list events: %v", err)
	}
	return list.Items
}

// awaitEvent waits for an event about node with reason and returns it.
func awaitEvent(t testing.TB, c kubernetes.Interface, node, reason string) corev1.Event {
	t.Helper()
	var evs []corev1.Event
	testutil.WaitForWithin(t, 30*time.Second, "event "+reason+" on node "+node, func() bool {
		evs = nodeEvents(t, c, node, reason)
		return len(evs) > 0
	})
	return evs[len(evs)-1]
}

// metricSum is the sum of every series of metric name in g (0 if absent).
func metricSum(t testing.TB, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	fams, err := g.Gather()
	if err != nil {
		t.Fatalf("gather metrics: %v", err)
	}
	var sum float64
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			switch {
			case m.GetCounter() != nil:
				sum += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				sum += m.GetGauge().GetValue()
			}
		}
	}
	return sum
}

// metricByLabel is metric name's values keyed by the value of label.
func metricByLabel(t testing.TB, g prometheus.Gatherer, name, label string) map[string]float64 {
	t.Helper()
	fams, err := g.Gather()
	if err != nil {
		t.Fatalf("gather metrics: %v", err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label {
					out[l.GetValue()] += m.GetCounter().GetValue() + m.GetGauge().GetValue()
				}
			}
		}
	}
	return out
}
