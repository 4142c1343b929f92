package health

import (
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpu-node-agent/gpu-node-agent/health"
	"github.com/gpu-node-agent/gpu-node-agent/test/e2e/cluster"
)

// TestRunFaultAndRecovery runs Monitor and Tainter.Run together on a
// simulated node: an XID taints the Node, sets GPUHealthy=False naming the
// device and posts a Warning event; after the recovery period the taint
// goes, the condition is True again and a Normal event is posted.
func TestRunFaultAndRecovery(t *testing.T) {
	c := cluster.Start(t, cluster.Options{})
	const name = "gpu-run"
	createNode(t, c.Client, name)
	const recovery = 3 * time.Second
	simNode, mon := startSimMonitor(t, health.Config{PollInterval: 200 * time.Millisecond,
		RecoveryPeriod: recovery, MaxRecoveryPeriod: recovery})
	reg := prometheus.NewPedanticRegistry()
	tainter, err := health.NewTainter(countedClient(t, c.RESTConfig, newAPICounter()), name,
		health.TaintConfig{MaxFraction: 1, Resync: 5 * time.Second}, discard(), reg)
	if err != nil {
		t.Fatal(err)
	}
	w := watchNode(t, c.Client, name)
	runTainter(t, tainter, mon)

	// The first reconcile reports the healthy node, without an event.
	awaitNode(t, w, 30*time.Second, "GPUHealthy=True at start", func(n *corev1.Node) bool { return conditionIs(n, corev1.ConditionTrue) })

	gpu := simNode.Spec().GPUs[2].UUID
	simFault(t, simNode, http.MethodPost, `{"kind":"xid","gpu":2,"xid":79}`)
	n := awaitNode(t, w, 30*time.Second, "taint and GPUHealthy=False", func(n *corev1.Node) bool {
		return tainted(n) && conditionIs(n, corev1.ConditionFalse)
	})
	if got := ours(n); len(got) != 1 || got[0].Value != "xid" || got[0].Effect != corev1.TaintEffectNoSchedule {
		t.Errorf("taints with our key = %v, want one %s=xid:NoSchedule", got, taintKey)
	}
	cond := condition(n, "GPUHealthy")
	if cond.Reason != "DevicesUnhealthy" || !strings.Contains(cond.Message, gpu) || !strings.Contains(cond.Message, "xid 79") {
		t.Errorf("GPUHealthy=False reason %q message %q, want DevicesUnhealthy naming %s and xid 79", cond.Reason, cond.Message, gpu)
	}
	ev := awaitEvent(t, c.Client, name, "GPUUnhealthy")
	checkEvent(t, ev, name, corev1.EventTypeWarning, gpu)

	n = awaitNode(t, w, 30*time.Second+recovery, "taint removed and GPUHealthy=True after recovery", func(n *corev1.Node) bool {
		return !tainted(n) && conditionIs(n, corev1.ConditionTrue)
	})
	if cond := condition(n, "GPUHealthy"); cond.Reason != "AllDevicesHealthy" {
		t.Errorf("GPUHealthy=True reason %q, want AllDevicesHealthy", cond.Reason)
	}
	ev = awaitEvent(t, c.Client, name, "GPUHealthy")
	checkEvent(t, ev, name, corev1.EventTypeNormal, "")
	if got := len(nodeEvents(t, c.Client, name, "GPUUnhealthy")); got != 1 {
		t.Errorf("%d GPUUnhealthy events, want 1 (one per transition)", got)
	}

	// taint added + removed; condition True, False, True; two events.
	want := map[string]float64{"taint": 2, "condition": 3, "event": 2}
	if got := metricByLabel(t, reg, "gpu_node_agent_kube_api_writes_total", "kind"); !maps.Equal(got, want) {
		t.Errorf("gpu_node_agent_kube_api_writes_total by kind = %v, want %v", got, want)
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
// tainter (GET node, LIST nodes for the safeguard, PATCH) and the real
// API server. Logged, not asserted:
//
//	go test -count=1 -run TestRunFaultToTaintLatency -v ./health/
func TestRunFaultToTaintLatency(t *testing.T) {
	c := cluster.Start(t, cluster.Options{})
	const name = "gpu-latency"
	createNode(t, c.Client, name)
	const recovery = 300 * time.Millisecond
	simNode, mon := startSimMonitor(t, health.Config{PollInterval: time.Second,
		RecoveryPeriod: recovery, MaxRecoveryPeriod: recovery})
	tainter, err := health.NewTainter(countedClient(t, c.RESTConfig, newAPICounter()), name,
		health.TaintConfig{MaxFraction: 0.2, Resync: 5 * time.Second}, discard(), nil)
	if err != nil {
		t.Fatal(err)
	}
	w := watchNode(t, c.Client, name)
	runTainter(t, tainter, mon)
	awaitNode(t, w, 30*time.Second, "GPUHealthy=True at start", func(n *corev1.Node) bool { return conditionIs(n, corev1.ConditionTrue) })

	const injections = 24
	var lat []time.Duration
	for i := range injections {
		gpu := 1 + i%7
		start := time.Now()
		simFault(t, simNode, http.MethodPost, fmt.Sprintf(`{"kind":"xid","gpu":%d,"xid":79}`, gpu))
		awaitNode(t, w, 30*time.Second, fmt.Sprintf("taint for XID %d on GPU %d", i, gpu), tainted)
		lat = append(lat, time.Since(start))
		awaitNode(t, w, 30*time.Second+recovery, fmt.Sprintf("recovery %d", i), func(n *corev1.Node) bool {
			return !tainted(n) && conditionIs(n, corev1.ConditionTrue)
		})
	}
	slices.Sort(lat)
	t.Logf("fault->taint (XID in sim -> taint on a Node watch, real kube-apiserver), %d injections: min %s median %s p99 %s max %s",
		len(lat), lat[0], lat[len(lat)/2], lat[(len(lat)*99+99)/100-1], lat[len(lat)-1])
}
