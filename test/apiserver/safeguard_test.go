package apiserver

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-node-agent/gpu-node-agent/health"
	"github.com/gpu-node-agent/gpu-node-agent/kubeapi"
	"github.com/gpu-node-agent/gpu-node-agent/test/e2e/cluster"
)

// TestTainterFleetSafeguardLimit puts an unfit node in a fleet of 10 with
// MaxFraction 0.2 (K = 2 slots): with 1 other node tainted (holding a
// slot) it is tainted (just under the limit); with 2 it is refused, with
// one TaintRefused event and gpu_node_agent_taint_refused 1. Each case is
// its own fleet (label, and namespace for its slots) on one API server,
// so NodeSelector is exercised too.
func TestTainterFleetSafeguardLimit(t *testing.T) {
	t.Parallel()
	c := cluster.Start(t, cluster.Options{})
	tests := []struct {
		name        string
		fleet       string
		preTainted  int
		wantTainted bool
	}{
		{"1 of 10 tainted: under the limit, taints", "under", 1, true},
		{"2 of 10 tainted: at the limit, refuses", "at", 2, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			theirs := corev1.Taint{Key: taintKey, Value: "xid", Effect: corev1.TaintEffectNoSchedule}
			for i := range 10 {
				node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", tc.fleet, i),
					Labels: map[string]string{"fleet": tc.fleet}}}
				if i < tc.preTainted {
					node.Spec.Taints = []corev1.Taint{theirs}
				}
				if _, err := c.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
					t.Fatalf("create node %s: %v", node.Name, err)
				}
			}
			// Nodes outside the fleet make it no larger.
			createNode(t, c.Client, tc.fleet+"-outsider", theirs)
			if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tc.fleet}},
				metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			cfg := kubeapi.TaintConfig{MaxFraction: 0.2, NodeSelector: "fleet=" + tc.fleet, LeaseNamespace: tc.fleet}
			cs := clientsFor(t, c.RESTConfig)
			for i := range tc.preTainted {
				holdSlots(t, cs, cfg, fmt.Sprintf("%s-%d", tc.fleet, i))
			}
			self := tc.fleet + "-5"
			reg := prometheus.NewPedanticRegistry()
			tainter, err := newTainter(t, cs, self, cfg, discard(), reg)
			if err != nil {
				t.Fatal(err)
			}
			unfit := health.Fitness{Reason: "gpu-lost", Message: "GPU-s5: gpu lost", Devices: []string{"GPU-s5"}}
			// Twice: a refusal is announced once, not per reconcile.
			for range 2 {
				if err := tainter.Reconcile(ctx, unfit); err != nil {
					t.Fatalf("reconcile: %v", err)
				}
			}
			n := getNode(t, c.Client, self)
			if got := tainted(n); got != tc.wantTainted {
				t.Errorf("node tainted = %v (taints %v), want %v", got, n.Spec.Taints, tc.wantTainted)
			}
			if cond := condition(n, "GPUHealthy"); cond == nil || cond.Status != corev1.ConditionFalse || !strings.Contains(cond.Message, "GPU-s5") {
				t.Errorf("GPUHealthy = %+v, want False naming GPU-s5 whether or not the taint is refused", cond)
			}
			refusals := nodeEvents(t, c.Client, self, "TaintRefused")
			wantRefusals, wantGauge := 1, 1.0
			if tc.wantTainted {
				wantRefusals, wantGauge = 0, 0
			}
			if len(refusals) != wantRefusals {
				t.Errorf("%d TaintRefused events, want %d", len(refusals), wantRefusals)
			}
			for _, ev := range refusals {
				if ev.Type != corev1.EventTypeWarning || !strings.Contains(ev.Message, "GPU-s5") {
					t.Errorf("TaintRefused event type %q message %q, want Warning naming GPU-s5", ev.Type, ev.Message)
				}
			}
			if got := metricSum(t, reg, "gpu_node_agent_taint_refused"); got != wantGauge {
				t.Errorf("gpu_node_agent_taint_refused = %v, want %v", got, wantGauge)
			}
		})
	}
}
