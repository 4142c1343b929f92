package apiserver

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpu-node-agent/gpu-node-agent/health"
	"github.com/gpu-node-agent/gpu-node-agent/internal/testutil"
	"github.com/gpu-node-agent/gpu-node-agent/kubeapi"
	"github.com/gpu-node-agent/gpu-node-agent/sim/simtest"
	"github.com/gpu-node-agent/gpu-node-agent/test/e2e/cluster"
)

// TestRunAPIServerRestartMidFault stops kube-apiserver, injects a fault
// (the monitor records it, the tainter's writes fail), starts the API
// server again on the same address, and expects the taint, condition and
// event to land from the tainter's retry, without a new health change.
func TestRunAPIServerRestartMidFault(t *testing.T) {
	t.Parallel()
	c := cluster.Start(t, cluster.Options{})
	const name = "gpu-restart"
	createNode(t, c.Client, name)
	h := startSimMonitor(t, health.Config{PollInterval: time.Second,
		RecoveryPeriod: 300 * time.Millisecond, FlapWindow: time.Millisecond})
	counter := newAPICounter()
	tainter, err := newTainter(t, countedClients(t, c.RESTConfig, counter), name,
		kubeapi.TaintConfig{MaxFraction: 1, Resync: time.Hour}, discard(), nil)
	if err != nil {
		t.Fatal(err)
	}
	runTainter(t, tainter, h.mon)
	testutil.WaitForWithin(t, 30*time.Second, "GPUHealthy=True at start", func() bool { return conditionIs(getNode(t, c.Client, name), corev1.ConditionTrue) })

	if err := c.StopAPIServer(); err != nil {
		// The tainter's informer holds a watch open, which can keep
		// kube-apiserver's graceful shutdown past the harness's 15s; it
		// is then killed, and down all the same.
		if !strings.Contains(err.Error(), "did not stop within") {
			t.Fatalf("stop kube-apiserver: %v", err)
		}
		t.Logf("stop kube-apiserver: %v", err)
	}
	counter.reset()
	// A row-remap failure lasts until cleared, however long the outage.
	gpu := h.gpu(4)
	simtest.Fault(t, h.node, http.MethodPost, `{"kind":"row-remap-failure","gpu":4}`)
	testutil.WaitForWithin(t, 30*time.Second, "the monitor to record the fault", func() bool { return !h.mon.Healthy(gpu) })
	testutil.WaitForWithin(t, 30*time.Second, "the tainter to fail against the stopped API server", func() bool { return counter.errorCount() > 0 })

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	restart := time.Now()
	if err := c.RestartAPIServer(ctx); err != nil {
		t.Fatalf("restart kube-apiserver: %v", err)
	}
	ready := time.Now()
	testutil.WaitForWithin(t, time.Minute, "the taint after the restart", func() bool {
		n := getNode(t, c.Client, name)
		return tainted(n) && conditionIs(n, corev1.ConditionFalse)
	})
	_, _, summary := counter.counts()
	t.Logf("apiserver restart took %s; taint landed %s after it was ready (tainter backoff 1s doubling, jittered); tainter requests since the stop: %s",
		ready.Sub(restart).Round(time.Millisecond), time.Since(ready).Round(time.Millisecond), summary)
	ev := awaitEvent(t, c.Client, name, "GPUUnhealthy")
	checkEvent(t, ev, name, corev1.EventTypeWarning, gpu)
}
