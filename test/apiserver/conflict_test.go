package apiserver

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-node-agent/gpu-node-agent/health"
	"github.com/gpu-node-agent/gpu-node-agent/kubeapi"
	"github.com/gpu-node-agent/gpu-node-agent/test/e2e/cluster"
)

// TestTainterConflictRetry makes another client add its taint between the
// tainter's read of the Node and its taint PATCH: the API server answers
// 409 Conflict (the patch carries the resourceVersion read), the tainter
// reads again, and both taints end up on the Node.
func TestTainterConflictRetry(t *testing.T) {
	t.Parallel()
	c := cluster.Start(t, cluster.Options{})
	const name = "gpu-conflict"
	createNode(t, c.Client, name)
	foreign := corev1.Taint{Key: "example.com/drain", Value: "true", Effect: corev1.TaintEffectNoSchedule}

	counter := newAPICounter()
	var once sync.Once
	var foreignErr error
	counter.before = func(r *http.Request) {
		if r.Method != http.MethodPatch || !strings.HasSuffix(r.URL.Path, "/nodes/"+name) {
			return // only the taint patch, not the status subresource
		}
		once.Do(func() {
			ctx := context.Background()
			n, err := c.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				foreignErr = err
				return
			}
			n.Spec.Taints = append(n.Spec.Taints, foreign)
			_, foreignErr = c.Client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		})
	}
	reg := prometheus.NewPedanticRegistry()
	tainter, err := newTainter(t, countedClients(t, c.RESTConfig, counter), name, kubeapi.TaintConfig{MaxFraction: 1}, discard(), reg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := tainter.Reconcile(ctx, health.Fitness{Reason: "xid", Message: "GPU-c0: xid 79", Devices: []string{"GPU-c0"}}); err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	if foreignErr != nil {
		t.Fatalf("foreign taint update: %v", foreignErr)
	}
	_, _, summary := counter.counts()
	if counter.statusCount(http.StatusConflict) == 0 {
		t.Errorf("no 409 Conflict answered to the tainter (%s): the interleaved write did not race its patch", summary)
	}
	t.Logf("tainter requests: %s", summary)
	n := getNode(t, c.Client, name)
	if got := ours(n); len(got) != 1 || got[0].Value != "xid" {
		t.Errorf("our taints = %v, want one with value xid", got)
	}
	if !slices.ContainsFunc(n.Spec.Taints, func(x corev1.Taint) bool { return x.Key == foreign.Key && x.Value == foreign.Value }) {
		t.Errorf("taints %v: the foreign taint added during the conflict was lost", n.Spec.Taints)
	}
	if got := metricByLabel(t, reg, "gpu_node_agent_kube_api_writes_total", "kind")["taint"]; got != 1 {
		t.Errorf("taint writes counted = %v, want 1 (the conflicted patch is not a write)", got)
	}
}
