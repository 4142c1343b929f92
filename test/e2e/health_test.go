package e2e

import (
	"context"
	"maps"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-node-agent/gpu-node-agent/test/e2e/agentdeploy"
	"github.com/gpu-node-agent/gpu-node-agent/test/internal/agentproc"
)

const unhealthyTaint = "gpu-node-agent.io/unhealthy"

// nodeHealth returns the agent's taint (nil if absent) and GPUHealthy
// condition (nil if absent).
func nodeHealth(ctx context.Context) (*corev1.Taint, *corev1.NodeCondition, error) {
	return nodeTaintAndCondition(ctx, unhealthyTaint, "GPUHealthy")
}

// nodeTaintAndCondition is the node's taint with key and its condition of
// type ctype (nil when it has none).
func nodeTaintAndCondition(ctx context.Context, key, ctype string) (*corev1.Taint, *corev1.NodeCondition, error) {
	node, err := shared.Client.CoreV1().Nodes().Get(ctx, shared.NodeName, metav1.GetOptions{})
	if err != nil {
		return nil, nil, err
	}
	var taint *corev1.Taint
	for i := range node.Spec.Taints {
		if node.Spec.Taints[i].Key == key {
			taint = &node.Spec.Taints[i]
		}
	}
	var cond *corev1.NodeCondition
	for i := range node.Status.Conditions {
		if string(node.Status.Conditions[i].Type) == ctype {
			cond = &node.Status.Conditions[i]
		}
	}
	return taint, cond, nil
}

// injectFault injects f on the simulated node and returns what clears it;
// a fault the test leaves injected is cleared at its end.
func injectFault(ctx context.Context, t *testing.T, a *agentdeploy.Agent, f agentproc.Fault) (clearFault func()) {
	t.Helper()
	if err := a.Control.InjectFault(ctx, f); err != nil {
		t.Fatal(err)
	}
	cleared := false
	t.Cleanup(func() {
		if !cleared {
			_ = a.Control.ClearFault(context.Background(), f)
		}
	})
	return func() {
		t.Helper()
		if err := a.Control.ClearFault(ctx, f); err != nil {
			t.Fatal(err)
		}
		cleared = true
	}
}

// waitNodeHealth waits until the node is healthy (no taint of the agent,
// GPUHealthy True) or unfit (tainted, GPUHealthy False) and returns the
// taint and condition; after says what led there, for the failure message.
func waitNodeHealth(ctx context.Context, t *testing.T, healthy bool, after string) (*corev1.Taint, *corev1.NodeCondition) {
	t.Helper()
	var taint *corev1.Taint
	var cond *corev1.NodeCondition
	want := corev1.ConditionFalse
	if healthy {
		want = corev1.ConditionTrue
	}
	err := poll(ctx, func(ctx context.Context) (bool, error) {
		var err error
		taint, cond, err = nodeHealth(ctx)
		return err == nil && (taint == nil) == healthy && cond != nil && cond.Status == want, nil
	})
	if err != nil {
		t.Fatalf("after %s: node taint %v, condition %v; want GPUHealthy %s", after, taint, cond, want)
	}
	return taint, cond
}

// TestGPUFaultTaintsNode: a GPU lost on the simulated node (fault injected
// through the simulator's control endpoint) leaves the node's allocatable,
// the agent taints the node and says why in its GPUHealthy condition, and a
// GPU pod stays Pending; once the fault is cleared and the recovery period
// has passed, the taint goes, the GPU is back and the pod runs.
func TestGPUFaultTaintsNode(t *testing.T) {
	a := needAgent(t)
	waitDemoResources(t, time.Minute)
	whole, _ := simGPUs(t, a)
	st := simState(t, a)
	lost := st[3]
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	clearFault := injectFault(ctx, t, a, agentproc.Fault{Kind: "gpu-lost", GPU: 3})

	degraded := maps.Clone(agentdeploy.DemoResources)
	degraded["nvidia.com/gpu"]--
	if err := shared.WaitNodeResources(ctx, "nvidia.com/", agentdeploy.DemoResources, degraded); err != nil {
		t.Fatalf("lost GPU still allocatable: %v", err)
	}
	taint, cond := waitNodeHealth(ctx, t, false, "a lost GPU")
	if taint.Effect != corev1.TaintEffectNoSchedule {
		t.Errorf("taint effect %s, want NoSchedule", taint.Effect)
	}
	if !strings.Contains(cond.Message, lost) {
		t.Errorf("GPUHealthy message %q does not name the lost GPU %s", cond.Message, lost)
	}

	workloadPod(t, "during-fault", map[string]int64{"nvidia.com/gpu": 1})
	waitPodHeldByTaint(ctx, t, "during-fault")

	start := time.Now()
	clearFault()
	waitNodeHealth(ctx, t, true, "the fault cleared")
	waitDemoResources(t, time.Minute)
	t.Logf("fault cleared: node untainted and GPU back after %s (recovery period 10s)", time.Since(start).Round(time.Millisecond))
	pod := waitPodRunning(t, "during-fault", 2*time.Minute)
	checkAllocated(t, pod, "nvidia.com/gpu", 1, whole)
}
