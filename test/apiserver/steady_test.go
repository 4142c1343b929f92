package apiserver

import (
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpu-node-agent/gpu-node-agent/health"
	"github.com/gpu-node-agent/gpu-node-agent/internal/testutil"
	"github.com/gpu-node-agent/gpu-node-agent/kubeapi"
	"github.com/gpu-node-agent/gpu-node-agent/sim/simtest"
	"github.com/gpu-node-agent/gpu-node-agent/test/e2e/cluster"
)

// steadyStateEnv sets how long TestRunSteadyStateWrites watches a tainted
// node (a Go duration, default 30s). Runs over 9m need -timeout.
const steadyStateEnv = "GNA_STEADY_STATE"

// TestRunSteadyStateWrites: once the taint, condition and event of a
// lasting fault have landed, Monitor + Tainter.Run (resync 5s) make no
// further writes and no reads besides their watch, counted both at the transport (POST/PUT/PATCH/DELETE)
// and by gpu_node_agent_kube_api_writes_total; the Node's
// resourceVersion does not move.
//
//	GNA_STEADY_STATE=10m go test -count=1 -timeout 20m -run TestRunSteadyStateWrites -v ./apiserver/
func TestRunSteadyStateWrites(t *testing.T) {
	t.Parallel()
	period := 30 * time.Second
	if v := os.Getenv(steadyStateEnv); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("%s=%q: want a positive Go duration (%v)", steadyStateEnv, v, err)
		}
		period = d
	}
	c := cluster.Start(t, cluster.Options{})
	const name = "gpu-steady"
	createNode(t, c.Client, name)
	h := startSimMonitor(t, health.Config{PollInterval: time.Second,
		RecoveryPeriod: 300 * time.Millisecond, FlapWindow: time.Millisecond})
	counter := newAPICounter()
	reg := prometheus.NewPedanticRegistry()
	const resync = 5 * time.Second
	tainter, err := newTainter(t, countedClients(t, c.RESTConfig, counter), name,
		kubeapi.TaintConfig{MaxFraction: 0.2, Resync: resync}, discard(), reg)
	if err != nil {
		t.Fatal(err)
	}
	runTainter(t, tainter, h.mon)

	// A row-remap failure lasts until cleared; the monitor keeps polling it.
	simtest.Fault(t, h.node, http.MethodPost, `{"kind":"row-remap-failure","gpu":3}`)
	// Initial condition True, then taint, condition False and the event.
	testutil.WaitForWithin(t, time.Minute, "taint, condition and event written", func() bool {
		w := metricByLabel(t, reg, "gpu_node_agent_kube_api_writes_total", "kind")
		return w["taint"] == 1 && w["condition"] == 2 && w["event"] == 1
	})
	n := getNode(t, c.Client, name)
	if !tainted(n) || !conditionIs(n, corev1.ConditionFalse) {
		t.Fatalf("after the writes: taints %v, GPUHealthy %+v", n.Spec.Taints, condition(n, "GPUHealthy"))
	}
	rv := n.ResourceVersion
	metricBase := metricSum(t, reg, "gpu_node_agent_kube_api_writes_total")
	counter.reset()

	time.Sleep(period)

	writes, reads, summary := counter.counts()
	metricWrites := metricSum(t, reg, "gpu_node_agent_kube_api_writes_total") - metricBase
	t.Logf("steady state %s (resync %s, health poll 1s): transport writes %d, reads %d (%s); kube_api_writes_total +%v",
		period, resync, writes, reads, summary, metricWrites)
	if writes != 0 || metricWrites != 0 {
		t.Errorf("tainter wrote at steady state: %d writes at the transport, +%v in gpu_node_agent_kube_api_writes_total (%s)",
			writes, metricWrites, summary)
	}
	// The Node comes from the tainter's informer: no GET, only the
	// watch re-opened when the server ends it (every 5-10 minutes).
	if watches := counter.watchCount(); reads != watches {
		t.Errorf("%d reads besides %d watch (re)opens at steady state: the tainter polls (%s)", reads-watches, watches, summary)
	}
	if got := getNode(t, c.Client, name).ResourceVersion; got != rv {
		t.Errorf("node resourceVersion moved %s -> %s at steady state", rv, got)
	}
	if fit, _ := h.mon.NodeFit(); fit {
		t.Errorf("node fit at the end: the fault did not last the steady-state period")
	}
}
