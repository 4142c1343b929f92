package apiserver

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
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

// TestRunFaultAndRecovery runs Monitor (with its sampler) and Tainter.Run
// together on a simulated node: XID 79 taints the Node, sets
// GPUHealthy=False naming the device and posts a Warning event; the fault
// is held past the recovery period until the GPU is reset, then the taint
// goes, the condition is True again and a Normal event is posted.
func TestRunFaultAndRecovery(t *testing.T) {
	t.Parallel()
	c := cluster.Start(t, cluster.Options{})
	const name = "gpu-run"
	createNode(t, c.Client, name)
	const recovery = 3 * time.Second
	h := startSimMonitor(t, health.Config{PollInterval: 200 * time.Millisecond,
		RecoveryPeriod: recovery, MaxRecoveryPeriod: recovery})
	reg := prometheus.NewPedanticRegistry()
	tainter, err := newTainter(t, countedClients(t, c.RESTConfig, newAPICounter()), name,
		kubeapi.TaintConfig{MaxFraction: 1, Resync: 5 * time.Second}, discard(), reg)
	if err != nil {
		t.Fatal(err)
	}
	w := watchNode(t, c.Client, name)
	runTainter(t, tainter, h.mon)

	// The first reconcile reports the healthy node, without an event.
	awaitNode(t, w, 30*time.Second, "GPUHealthy=True at start", func(n *corev1.Node) bool { return conditionIs(n, corev1.ConditionTrue) })

	gpu := h.gpu(2)
	simtest.Fault(t, h.node, http.MethodPost, `{"kind":"xid","gpu":2,"xid":79}`)
	// Two causes: the XID event, and the driver's request for a GPU reset
	// that the next sampling cycle reads (the simulator sets it with every
	// reset-class XID, as the driver does). They may reach the Node in one
	// reconcile or two.
	n := awaitNode(t, w, 30*time.Second, "taint and GPUHealthy=False naming the XID and the reset request", func(n *corev1.Node) bool {
		c := condition(n, "GPUHealthy")
		return tainted(n) && conditionIs(n, corev1.ConditionFalse) &&
			strings.Contains(c.Message, "xid 79") && strings.Contains(c.Message, "driver requests a gpu reset")
	})
	// The taint value names the check behind the fault, "multiple" for
	// two checks (xid and recovery-action).
	if got := ours(n); len(got) != 1 || got[0].Value != "multiple" || got[0].Effect != corev1.TaintEffectNoSchedule {
		t.Errorf("taints with our key = %v, want one %s=multiple:NoSchedule", got, taintKey)
	}
	cond := condition(n, "GPUHealthy")
	if cond.Reason != "DevicesUnhealthy" || !strings.Contains(cond.Message, gpu) {
		t.Errorf("GPUHealthy=False reason %q message %q, want DevicesUnhealthy naming %s", cond.Reason, cond.Message, gpu)
	}
	ev := awaitEvent(t, c.Client, name, "GPUUnhealthy")
	checkEvent(t, ev, name, corev1.EventTypeWarning, gpu)

	// XID 79 waits for a reset: still tainted after the recovery period.
	h.heldThenReset(t, 2, recovery)
	if n := getNode(t, c.Client, name); !tainted(n) {
		t.Errorf("taint removed before the GPU was reset: taints %v", n.Spec.Taints)
	}

	n = awaitNode(t, w, 30*time.Second+recovery, "taint removed and GPUHealthy=True after recovery", func(n *corev1.Node) bool {
		return !tainted(n) && conditionIs(n, corev1.ConditionTrue)
	})
	if cond := condition(n, "GPUHealthy"); cond.Reason != "AllDevicesHealthy" {
		t.Errorf("GPUHealthy=True reason %q, want AllDevicesHealthy", cond.Reason)
	}
	ev = awaitEvent(t, c.Client, name, "GPUHealthy")
	checkEvent(t, ev, name, corev1.EventTypeNormal, "")

	// How many times the False condition's message changed (the XID, the
	// reset request, both released by the reset) depends on which of
	// them each reconcile saw; every change of the condition but the
	// first healthy report posts exactly one event.
	unhealthy, healthy := len(nodeEvents(t, c.Client, name, "GPUUnhealthy")), len(nodeEvents(t, c.Client, name, "GPUHealthy"))
	// The tainter counts an event once the API server has answered its
	// create, a moment after the event can be listed here: wait until the
	// count has caught up with the events the server holds.
	testutil.WaitForWithin(t, 30*time.Second, "the tainter to count the events the API server holds", func() bool {
		return metricByLabel(t, reg, "gpu_node_agent_kube_api_writes_total", "kind")["event"] >= float64(unhealthy+healthy)
	})
	writes := metricByLabel(t, reg, "gpu_node_agent_kube_api_writes_total", "kind")
	t.Logf("writes by kind: %v", writes)
	if writes["taint"] < 2 || writes["taint"] > 3 {
		t.Errorf("%v taint writes, want 2 or 3 (added, maybe xid -> multiple, removed)", writes["taint"])
	}
	if writes["condition"] < 3 {
		t.Errorf("%v condition writes, want at least 3 (True, False, True)", writes["condition"])
	}
	if writes["event"] != writes["condition"]-1 {
		t.Errorf("%v events for %v condition writes, want one per change after the first", writes["event"], writes["condition"])
	}
	if healthy != 1 || float64(unhealthy) != writes["condition"]-2 {
		t.Errorf("%d GPUUnhealthy and %d GPUHealthy events for %v condition writes, want %v and 1",
			unhealthy, healthy, writes["condition"], writes["condition"]-2)
	}
}

// checkEvent checks an event's type, object and source, and that its
// message names device (when not empty).
func checkEvent(t *testing.T, ev corev1.Event, node, typ, device string) {
	t.Helper()
	if ev.Type != typ {
		t.Errorf("event %s type %q, want %q", ev.Reason, ev.Type, typ)
	}
	if o := ev.InvolvedObject; o.Kind != "Node" || o.Name != node || o.APIVersion != "v1" || o.UID == "" {
		t.Errorf("event %s is about %+v, want Node %s with its UID", ev.Reason, o, node)
	}
	if ev.Source.Component != "gpu-node-agent" || ev.ReportingController != "gpu-node-agent.io/health" {
		t.Errorf("event %s source %+v, reporting controller %q", ev.Reason, ev.Source, ev.ReportingController)
	}
	if device != "" && !strings.Contains(ev.Message, device) {
		t.Errorf("event %s message %q does not name %s", ev.Reason, ev.Message, device)
	}
}

// TestRunFaultToTaintLatency measures an XID injected into the simulator
// -> the taint seen on a watch of the Node, through the monitor, the
// tainter (Node from its informer's cache, LIST nodes for the safeguard,
// PATCH) and the real
// API server. Logged, not asserted:
//
//	go test -count=1 -run TestRunFaultToTaintLatency -v ./apiserver/
func TestRunFaultToTaintLatency(t *testing.T) {
	t.Parallel()
	c := cluster.Start(t, cluster.Options{})
	const name = "gpu-latency"
	createNode(t, c.Client, name)
	const recovery = 300 * time.Millisecond
	h := startSimMonitor(t, health.Config{PollInterval: 200 * time.Millisecond,
		RecoveryPeriod: recovery, MaxRecoveryPeriod: recovery})
	tainter, err := newTainter(t, countedClients(t, c.RESTConfig, newAPICounter()), name,
		kubeapi.TaintConfig{MaxFraction: 0.2, Resync: 5 * time.Second}, discard(), nil)
	if err != nil {
		t.Fatal(err)
	}
	w := watchNode(t, c.Client, name)
	runTainter(t, tainter, h.mon)
	awaitNode(t, w, 30*time.Second, "GPUHealthy=True at start", func(n *corev1.Node) bool { return conditionIs(n, corev1.ConditionTrue) })

	const injections = 24
	var lat []time.Duration
	for i := range injections {
		gpu := 1 + i%7
		start := time.Now()
		simtest.Fault(t, h.node, http.MethodPost, fmt.Sprintf(`{"kind":"xid","gpu":%d,"xid":79}`, gpu))
		awaitNode(t, w, 30*time.Second, fmt.Sprintf("taint for XID %d on GPU %d", i, gpu), tainted)
		lat = append(lat, time.Since(start))
		// XID 79 holds until the GPU is reset.
		h.heldThenReset(t, gpu, recovery)
		awaitNode(t, w, 30*time.Second+recovery, fmt.Sprintf("recovery %d", i), func(n *corev1.Node) bool {
			return !tainted(n) && conditionIs(n, corev1.ConditionTrue)
		})
	}
	slices.Sort(lat)
	t.Logf("fault->taint (XID in sim -> taint on a Node watch, real kube-apiserver), %d injections: min %s median %s p99 %s max %s",
		len(lat), lat[0], lat[len(lat)/2], lat[(len(lat)*99+99)/100-1], lat[len(lat)-1])
}
