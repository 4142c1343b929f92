package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-node-agent/gpu-node-agent/test/e2e/agentdeploy"
)

// moveAdviceAnnotation is the agent's Node annotation naming the pods
// whose moving elsewhere would free a larger NVLink block
// (kubeapi.MoveAdviceAnnotation). The test spells the key and reads the
// value as a descheduler would.
const moveAdviceAnnotation = "gpu-node-agent.io/move-advice"

// moveAdvice is the annotation's documented JSON (docs/placement.md).
type moveAdvice struct {
	BlockNow     int   `json:"blockNow"`
	BlockIfMoved int   `json:"blockIfMoved"`
	WholeNode    bool  `json:"wholeNode"`
	GPUs         []int `json:"gpus"`
	Pods         []struct {
		Namespace string  `json:"namespace"`
		Name      string  `json:"name"`
		Priority  *int32  `json:"priority"`
		OwnerKind *string `json:"ownerKind"`
		GPUs      []int   `json:"gpus"`
	} `json:"pods"`
}

// podNames lists the advice's pods as namespace/name.
func (a moveAdvice) podNames() []string {
	var out []string
	for _, p := range a.Pods {
		out = append(out, p.Namespace+"/"+p.Name)
	}
	return out
}

// waitMoveAdvice polls the Node until done says the advice (nil: no
// annotation) is the one awaited, and returns it.
func waitMoveAdvice(t *testing.T, what string, done func(*moveAdvice) bool) *moveAdvice {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var last *moveAdvice
	var raw string
	err := poll(ctx, func(ctx context.Context) (bool, error) {
		node, err := shared.Client.CoreV1().Nodes().Get(ctx, shared.NodeName, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		v, ok := node.Annotations[moveAdviceAnnotation]
		raw, last = v, nil
		if ok {
			var a moveAdvice
			if err := json.Unmarshal([]byte(v), &a); err != nil {
				return false, fmt.Errorf("%s %q is not the documented JSON: %w", moveAdviceAnnotation, v, err)
			}
			last = &a
		}
		return done(last), nil
	})
	if err != nil {
		t.Fatalf("%s: %v; the annotation is %q", what, err, raw)
	}
	return last
}

// TestMoveAdvice: two pods of one GPU each on the demo node (a DGX H100
// whose GPUs 0 and 1 are in MIG mode: six GPUs can serve a whole-GPU pod,
// all on one NVSwitch fabric) leave a free NVLink block of 4; the Node's
// move advice names both (moving them frees all six, the whole node), each
// with its priority and owner kind (a bare pod: ""); with one deleted it
// names the other; with both gone it is removed. Nothing is evicted: the
// pods stay until the test deletes them. The times from the pods running
// (or gone) to the annotation following are logged.
func TestMoveAdvice(t *testing.T) {
	needAgent(t)
	// The kubelet offers the demo node's resources: its whole GPUs are
	// those not in MIG mode, all on the NVSwitch fabric.
	waitDemoResources(t, 2*time.Minute)
	whole := int(agentdeploy.DemoResources["nvidia.com/gpu"])
	// A pod another test deleted just before (waiting until it was gone)
	// may still be in the advice: the agent notices the freed GPUs on its
	// next usage update and writes the advice at most every 5 s.
	var raw string
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := poll(ctx, func(ctx context.Context) (bool, error) {
		node, err := shared.Client.CoreV1().Nodes().Get(ctx, shared.NodeName, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		var ok bool
		raw, ok = node.Annotations[moveAdviceAnnotation]
		return !ok, nil
	})
	if err != nil {
		t.Fatalf("the node still has a move advice before the test's pods start (a pod of another test left?): %s (%v)", raw, err)
	}

	const a, b = "move-advice-a", "move-advice-b"
	created := time.Now()
	workloadPod(t, a, map[string]int64{"nvidia.com/gpu": 1})
	workloadPod(t, b, map[string]int64{"nvidia.com/gpu": 1})
	adv := waitMoveAdvice(t, "the move advice naming both pods", func(m *moveAdvice) bool { return m != nil && len(m.Pods) == 2 })
	advised := time.Now()
	// Both Running: the later container start (the API's 1 s
	// resolution). The kubelet lists a pod's devices from admission on,
	// so the advice may come before the containers run (a negative time).
	var started time.Time
	for _, name := range []string{a, b} {
		pod := waitPodRunning(t, name, 2*time.Minute)
		for _, cs := range pod.Status.ContainerStatuses {
			if cs.State.Running != nil && cs.State.Running.StartedAt.After(started) {
				started = cs.State.Running.StartedAt.Time
			}
		}
	}
	t.Logf("move advice naming both pods %s after they were created, %s after both were Running (container start, 1 s resolution): %s",
		advised.Sub(created).Round(10*time.Millisecond), advised.Sub(started).Round(10*time.Millisecond), adv.podNames())
	want := []string{testNamespace + "/" + a, testNamespace + "/" + b}
	if got := adv.podNames(); !slices.Equal(got, want) {
		t.Errorf("pods %v, want %v", got, want)
	}
	if adv.BlockNow != whole-2 || adv.BlockIfMoved != whole || !adv.WholeNode || len(adv.GPUs) != whole {
		t.Errorf("advice %+v: want the block %d now, %d (all %d whole GPUs, the whole node) once both moved", adv, whole-2, whole, whole)
	}
	for _, p := range adv.Pods {
		if len(p.GPUs) != 1 || !slices.Contains(adv.GPUs, p.GPUs[0]) {
			t.Errorf("pod %s holds GPUs %v, want one of the freed block %v", p.Name, p.GPUs, adv.GPUs)
		}
		// Bare pods of the default priority: both read from the API.
		if p.Priority == nil || *p.Priority != 0 || p.OwnerKind == nil || *p.OwnerKind != "" {
			t.Errorf("pod %s: priority %v, ownerKind %v; want 0 and \"\" read from the API server", p.Name, p.Priority, p.OwnerKind)
		}
	}

	deletePod(t, a)
	gone := time.Now()
	adv = waitMoveAdvice(t, "the move advice naming "+b+" alone", func(m *moveAdvice) bool {
		return m != nil && slices.Equal(m.podNames(), []string{testNamespace + "/" + b})
	})
	t.Logf("move advice naming %s alone %s after %s was gone", b, time.Since(gone).Round(10*time.Millisecond), a)
	if adv.BlockNow != whole-1 || adv.BlockIfMoved != whole || !adv.WholeNode {
		t.Errorf("advice %+v: want the block %d now, %d once %s moved", adv, whole-1, whole, b)
	}

	deletePod(t, b)
	gone = time.Now()
	waitMoveAdvice(t, "the move advice removed", func(m *moveAdvice) bool { return m == nil })
	t.Logf("move advice removed %s after %s was gone", time.Since(gone).Round(10*time.Millisecond), b)
}
