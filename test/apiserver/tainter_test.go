// Package health runs the agent's node tainter (kubeapi.Tainter) against a
// real kube-apiserver (with etcd, Node and RBAC authorization) instead of
// client-go's fake clientset: strategic-merge and JSON patches, conflicts,
// condition and event validation are the API server's own.
package apiserver

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gpu-node-agent/gpu-node-agent/health"
	"github.com/gpu-node-agent/gpu-node-agent/kubeapi"
	"github.com/gpu-node-agent/gpu-node-agent/test/e2e/cluster"
)

const taintKey = "gpu-node-agent.io/unhealthy"

// newClients starts an API server and returns an admin's clients: the
// agent's, and a clientset for the test's own reads and writes.
func newClients(t *testing.T) (kubeapi.Clients, kubernetes.Interface) {
	t.Helper()
	kubeconfig, _ := cluster.StartAPIServer(t)
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return clientsFor(t, cfg), c
}

func createNode(t *testing.T, c kubernetes.Interface, name string, taints ...corev1.Taint) {
	t.Helper()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{Taints: taints}}
	if _, err := c.CoreV1().Nodes().Create(context.Background(), node, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create node %s: %v", name, err)
	}
}

func getNode(t *testing.T, c kubernetes.Interface, name string) *corev1.Node {
	t.Helper()
	n, err := c.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func ours(n *corev1.Node) []corev1.Taint {
	var out []corev1.Taint
	for _, tn := range n.Spec.Taints {
		if tn.Key == taintKey {
			out = append(out, tn)
		}
	}
	return out
}

func condition(n *corev1.Node, typ string) *corev1.NodeCondition {
	for i := range n.Status.Conditions {
		if string(n.Status.Conditions[i].Type) == typ {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

// TestTainterAgainstAPIServer walks one node through unfit -> unfit again
// (no write) -> fit, with a foreign taint that must survive.
func TestTainterAgainstAPIServer(t *testing.T) {
	t.Parallel()
	cs, c := newClients(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	foreign := corev1.Taint{Key: "example.com/maintenance", Value: "true", Effect: corev1.TaintEffectNoSchedule}
	createNode(t, c, "gpu-1", foreign)
	tainter, err := newTainter(t, cs, "gpu-1", kubeapi.TaintConfig{MaxFraction: 1}, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if err != nil {
		t.Fatal(err)
	}

	unfit := health.Fitness{Fit: false, Reason: "xid", Message: "GPU-1234: xid 79", Devices: []string{"GPU-1234"}}
	if err := tainter.Reconcile(ctx, unfit); err != nil {
		t.Fatalf("reconcile unfit: %v", err)
	}
	n := getNode(t, c, "gpu-1")
	if got := ours(n); len(got) != 1 || got[0].Value != "xid" || got[0].Effect != corev1.TaintEffectNoSchedule {
		t.Errorf("taints with our key = %v, want one xid:NoSchedule", got)
	}
	if !slices.ContainsFunc(n.Spec.Taints, func(x corev1.Taint) bool { return x.Key == foreign.Key }) {
		t.Errorf("foreign taint removed: %v", n.Spec.Taints)
	}
	if cond := condition(n, "GPUHealthy"); cond == nil || cond.Status != corev1.ConditionFalse {
		t.Errorf("GPUHealthy condition = %+v, want False", cond)
	}
	evs, err := c.CoreV1().Events("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs.Items) == 0 {
		t.Errorf("no event posted for the node becoming unfit")
	}

	rv := n.ResourceVersion
	if err := tainter.Reconcile(ctx, unfit); err != nil {
		t.Fatalf("reconcile unfit again: %v", err)
	}
	if got := getNode(t, c, "gpu-1").ResourceVersion; got != rv {
		t.Errorf("steady-state reconcile wrote the node (resourceVersion %s -> %s)", rv, got)
	}

	if err := tainter.Reconcile(ctx, health.Fitness{Fit: true}); err != nil {
		t.Fatalf("reconcile fit: %v", err)
	}
	n = getNode(t, c, "gpu-1")
	if got := ours(n); len(got) != 0 {
		t.Errorf("our taint still present when fit: %v", got)
	}
	if !slices.ContainsFunc(n.Spec.Taints, func(x corev1.Taint) bool { return x == foreign }) {
		t.Errorf("taints after recovery = %v, foreign taint %v lost", n.Spec.Taints, foreign)
	}
	if cond := condition(n, "GPUHealthy"); cond == nil || cond.Status != corev1.ConditionTrue {
		t.Errorf("GPUHealthy condition = %+v, want True", cond)
	}
}

// TestTainterFleetSafeguard: with 2 of 10 nodes already tainted (each
// holding one of the K = 2 slots) and MaxFraction 0.2, an unfit node is
// not tainted (the condition still says why).
func TestTainterFleetSafeguard(t *testing.T) {
	t.Parallel()
	cs, c := newClients(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ours := corev1.Taint{Key: taintKey, Value: "xid", Effect: corev1.TaintEffectNoSchedule}
	cfg := kubeapi.TaintConfig{MaxFraction: 0.2}
	for i, name := range []string{"n0", "n1", "n2", "n3", "n4", "n5", "n6", "n7", "n8", "n9"} {
		if i < 2 {
			createNode(t, c, name, ours)
		} else {
			createNode(t, c, name)
		}
	}
	holdSlots(t, cs, cfg, "n0", "n1")
	tainter, err := newTainter(t, cs, "n5", cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := tainter.Reconcile(ctx, health.Fitness{Fit: false, Reason: "gpu-lost", Devices: []string{"GPU-1"}}); err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	n := getNode(t, c, "n5")
	for _, tn := range n.Spec.Taints {
		if tn.Key == taintKey {
			t.Errorf("node tainted although 2 of 10 already are (max fraction 0.2): %v", n.Spec.Taints)
		}
	}
	if cond := condition(n, "GPUHealthy"); cond == nil || cond.Status != corev1.ConditionFalse {
		t.Errorf("GPUHealthy condition = %+v, want False even when the taint is refused", cond)
	}
}
