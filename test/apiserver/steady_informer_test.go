package apiserver

import (
	"context"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpu-node-agent/gpu-node-agent/health"
	"github.com/gpu-node-agent/gpu-node-agent/internal/testutil"
	"github.com/gpu-node-agent/gpu-node-agent/kubeapi"
	"github.com/gpu-node-agent/gpu-node-agent/test/e2e/cluster"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// TestSteadyStateNoPolling wires the agent's node API side as cmd does:
// one NodeWatch on a counted client shared by the Tainter (on a healthy
// simulated node) and the Labeler (its topology labels), resync 2s. Once
// the first writes (condition True, labels) have landed, 20s pass (or
// $GNA_STEADY_PERIOD: 10m gives the full ten minutes) with a resync every
// 2s re-checking the cached Node: the transport sees no request at all,
// the watch staying open, and the API server's own
// apiserver_request_total for Nodes and Events does not move. The startup requests are
// logged: the informer's LIST and WATCH (or one watch-list WATCH) and the
// two writes, and no GET of the Node.
func TestSteadyStateNoPolling(t *testing.T) {
	t.Parallel()
	c := cluster.Start(t, cluster.Options{})
	const name = "gpu-no-polling"
	createNode(t, c.Client, name)
	h := startSimMonitor(t, health.Config{PollInterval: time.Second})
	counter := newAPICounter()
	clients := countedClients(t, c.RESTConfig, counter)
	client := clients.Core
	const resync = 2 * time.Second
	watch := startNodeWatch(t, client, name, resync)
	tainter, err := kubeapi.NewTainter(clients, watch, kubeapi.TaintConfig{MaxFraction: 1, Resync: resync}, discard(), prometheus.NewPedanticRegistry())
	if err != nil {
		t.Fatal(err)
	}
	labeler := kubeapi.NewLabeler(client, watch, discard())
	resyncs := watch.Subscribe()

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	wg.Go(func() {
		if err := tainter.Run(ctx, h.mon); err != nil {
			t.Errorf("tainter run: %v", err)
		}
	})
	spec := h.node.Spec()
	labels := topology.Labels(spec, "none", nil) // gpu.MIGStrategyNone
	wg.Go(func() {
		labeler.Run(ctx, nil, func() (map[string]string, map[string]string, bool) {
			return labels, topology.Annotations(spec), true
		})
	})
	testutil.WaitForWithin(t, 30*time.Second, "GPUHealthy=True and the topology labels on the node", func() bool {
		n := getNode(t, c.Client, name)
		return conditionIs(n, corev1.ConditionTrue) && n.Labels[topology.LabelGPUCount] == labels[topology.LabelGPUCount]
	})
	// The writes' own watch events come back to both: let them settle
	// (one resync delivered after the writes) before counting.
	drain(resyncs)
	<-resyncs
	rv := getNode(t, c.Client, name).ResourceVersion
	_, _, startup := counter.counts()
	startGets := counter.requestCount(http.MethodGet, "/api/v1/nodes/"+name)
	t.Logf("startup requests (informer list/watch and first writes): %s; watches %d; GETs of the node %d",
		startup, counter.watchCount(), startGets)
	if startGets != 0 {
		t.Errorf("%d GETs of the node at startup: it should come from the informer", startGets)
	}
	counter.reset()
	served := apiserverRequests(t, c)
	if served == 0 {
		// The Node's creation and the agent's first writes were counted:
		// a zero means the metric was not read.
		t.Fatal("kube-apiserver apiserver_request_total counts no node or event request before the window")
	}

	period := steadyPeriod(t)
	timer := time.NewTimer(period)
	delivered := 0
	for wait := true; wait; {
		select {
		case <-resyncs:
			delivered++
		case <-timer.C:
			wait = false
		}
	}
	writes, reads, summary := counter.counts()
	// A watch that times out (client-go's 5-10 minute watch timeout) is
	// opened again: that is the watch, not a poll. A relist would be a
	// GET without watch=true and counts as a read.
	reopened := counter.watchCount()
	reads -= reopened
	// The API server's own count of what it served in the window: no
	// other client touches Nodes or Events here (no kubelet, no
	// controllers; the test's own reads come after this).
	servedInWindow := apiserverRequests(t, c) - served
	t.Logf("kube-apiserver apiserver_request_total for nodes and events (not WATCH) in the window: %d", servedInWindow)
	if servedInWindow != 0 {
		t.Errorf("the API server served %d node/event requests at steady state, want none", servedInWindow)
	}
	t.Logf("steady state %s (resync %s, %d informer deliveries): requests %s, watches (re)opened %d",
		period, resync, delivered, summary, reopened)
	if writes != 0 || reads != 0 {
		t.Errorf("%d writes and %d reads besides the watch at steady state, want none (%s)", writes, reads, summary)
	}
	if delivered < int(period/resync)/2 {
		t.Errorf("only %d informer deliveries in %s with resync %s: the resync that re-checks drift is not running", delivered, period, resync)
	}
	if got := getNode(t, c.Client, name).ResourceVersion; got != rv {
		t.Errorf("node resourceVersion moved %s -> %s at steady state", rv, got)
	}
}

// SteadyPeriodEnv sets TestSteadyStateNoPolling's window (default 20s,
// as CI runs it; e.g. GNA_STEADY_PERIOD=10m for the full ten minutes).
const SteadyPeriodEnv = "GNA_STEADY_PERIOD"

func steadyPeriod(t *testing.T) time.Duration {
	v := os.Getenv(SteadyPeriodEnv)
	if v == "" {
		return 20 * time.Second
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		t.Fatalf("%s=%q: want a positive duration", SteadyPeriodEnv, v)
	}
	return d
}

// apiserverRequests sums the API server's apiserver_request_total over
// the Nodes and Events resources, watches excluded, from its /metrics.
func apiserverRequests(t *testing.T, c *cluster.Cluster) int {
	t.Helper()
	raw, err := c.Client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(t.Context())
	if err != nil {
		t.Fatalf("kube-apiserver /metrics: %v", err)
	}
	n := 0
	for line := range strings.Lines(string(raw)) {
		if !strings.HasPrefix(line, "apiserver_request_total{") || strings.Contains(line, `verb="WATCH"`) ||
			!(strings.Contains(line, `resource="nodes"`) || strings.Contains(line, `resource="events"`)) {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			t.Fatalf("kube-apiserver /metrics line %q: %v", line, err)
		}
		n += int(v)
	}
	return n
}

// drain empties a coalesced signal channel.
func drain(ch <-chan struct{}) {
	select {
	case <-ch:
	default:
	}
}
