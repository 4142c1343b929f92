package health

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
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
	"github.com/gpu-node-agent/gpu-node-agent/sim"
)

// apiCounter counts the requests a client makes, by method and by
// response status, and the transport errors (API server down). before,
// when set, runs ahead of each request (to interleave a foreign write).
type apiCounter struct {
	mu      sync.Mutex
	methods map[string]int
	status  map[int]int
	errors  int
	before  func(*http.Request)
}

func newAPICounter() *apiCounter {
	return &apiCounter{methods: map[string]int{}, status: map[int]int{}}
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
		resp, err := rt.RoundTrip(r)
		c.mu.Lock()
		defer c.mu.Unlock()
		c.methods[r.Method]++
		if err != nil {
			c.errors++
		} else {
			c.status[resp.StatusCode]++
		}
		return resp, err
	})
}

// reset zeroes every count.
func (c *apiCounter) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.methods)
	clear(c.status)
	c.errors = 0
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

// countedClient is a clientset on cfg whose requests counter sees.
func countedClient(t testing.TB, cfg *rest.Config, counter *apiCounter) kubernetes.Interface {
	t.Helper()
	cfg = rest.CopyConfig(cfg)
	cfg.WrapTransport = counter.wrap
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// startSimMonitor runs a health monitor on a simulated DGX H100 and waits
// until it receives XID events: the simulator drops events injected
// before the monitor's event set is registered, so it injects XID 79 on
// GPU 0 until the monitor sees one, then waits for GPU 0 to recover
// (cfg.RecoveryPeriod should be short, or the test waits that long).
func startSimMonitor(t testing.TB, cfg health.Config) (*sim.Node, *health.Monitor) {
	t.Helper()
	spec, err := sim.Profile("dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	node, err := sim.New(spec, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg.DCGMMode = health.DCGMOff
	mon, err := health.NewMonitor(cfg, node.NVML(), discard(), nil)
	if err != nil {
		t.Fatal(err)
	}
	mon.SetNode(node.Spec())
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = mon.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })

	gpu0 := node.Spec().GPUs[0].UUID
	waitFor(t, time.Minute, "the monitor to receive simulated XID events", func() bool {
		simFault(t, node, http.MethodPost, `{"kind":"xid","gpu":0,"xid":79}`)
		deadline := time.Now().Add(500 * time.Millisecond)
		for time.Now().Before(deadline) {
			if !mon.Healthy(gpu0) {
				return true
			}
			time.Sleep(5 * time.Millisecond)
		}
		return false
	})
	waitFor(t, time.Minute+cfg.RecoveryPeriod, "GPU 0 to recover from the warm-up XID", func() bool {
		fit, _ := mon.NodeFit()
		return fit
	})
	return node, mon
}

// simFault posts or deletes a fault through the simulator's control API.
func simFault(t testing.TB, n *sim.Node, method, body string) {
	t.Helper()
	rec := httptest.NewRecorder()
	n.ControlHandler().ServeHTTP(rec, httptest.NewRequest(method, "/faults", strings.NewReader(body)))
	if rec.Code != http.StatusNoContent {
		t.Fatalf("%s /faults %s: %d %s", method, body, rec.Code, rec.Body.String())
	}
}

// runTainter runs tainter.Run(mon) until the test ends.
func runTainter(t testing.TB, tainter *health.Tainter, mon *health.Monitor) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := tainter.Run(ctx, mon); err != nil {
			t.Errorf("tainter run: %v", err)
		}
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
}

// waitFor polls cond every 20ms until it holds, failing after timeout.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
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
	waitFor(t, 30*time.Second, "event "+reason+" on node "+node, func() bool {
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
