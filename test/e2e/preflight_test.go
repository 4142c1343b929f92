package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"k8s.io/client-go/util/retry"

	"github.com/gpu-node-agent/gpu-node-agent/test/e2e/agentdeploy"
	"github.com/gpu-node-agent/gpu-node-agent/test/internal/agentproc"
)

const (
	preflightTaint     = "gpu-node-agent.io/preflight"
	preflightCondition = "GPUPreflight"
	preflightRerun     = "gpu-node-agent.io/preflight-rerun"
)

// TestPreflightGate: with preflight.enabled, a node that never passed is
// tainted until its preflight passes.
//
//  1. A new node (no GPUPreflight record) whose GPUs are healthy: the
//     agent taints it, runs the preflight and removes the taint; the time
//     from the agent's start to the removal is logged.
//  2. A new node whose GPU 3 came up with a degraded PCIe link (the
//     simulator's --sim-faults, present before the agent starts): the node
//     stays tainted with GPUPreflight=False naming the item, the GPU and
//     its link, and a GPU pod stays Pending; once the link trains at its
//     maximum again (the fault cleared), the next run passes, the taint
//     goes and the pod runs.
//  3. The link degrades again on the proven node and an operator asks for
//     a re-run (annotation gpu-node-agent.io/preflight-rerun): the agent
//     removes the annotation (through the admission policy), runs every
//     item and taints the node failed; once the link is back it passes.
//
// The e2e kubelet registers without --register-with-taints (the other
// tests share its node): the taint here is the one the agent adds to a
// node that has never passed.
func TestPreflightGate(t *testing.T) {
	a := needAgent(t)
	waitDemoResources(t, time.Minute)
	requireNoDevicePluginPods(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	defaults := a.Options
	restoreAtEnd(t, a, forgetPreflight)
	gpu3 := simTopology(t, a).GPUs[3]
	gated := func(simFaults ...string) agentdeploy.Options {
		opts := defaults
		opts.Values = withConfig(defaults.Values, "preflight", map[string]any{"enabled": true, "retryInterval": "2s"})
		args := []any{fmt.Sprintf("--sim-control-address=127.0.0.1:%d", defaults.ControlPort)}
		for _, f := range simFaults {
			args = append(args, "--sim-faults="+f)
		}
		opts.Values["extraArgs"] = args
		return opts
	}

	// 1. A healthy new node.
	forgetPreflight(ctx, t)
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	gate := watchPreflightTaint(wctx, t)
	pod, err := a.Reinstall(ctx, shared, gated())
	if err != nil {
		t.Fatalf("install the agent with preflight.enabled: %v\nagent log:\n%s", err, agentLog(a))
	}
	_, cond := waitPreflight(ctx, t, a, corev1.ConditionTrue, "a healthy node's preflight")
	var untainted time.Time
	select {
	case untainted = <-gate:
	case <-time.After(30 * time.Second):
		t.Fatalf("GPUPreflight is True but the node's watch never showed the preflight taint added and then removed\nagent log:\n%s", agentLog(a))
	}
	started := agentStarted(ctx, t, a, pod.Name)
	t.Logf("healthy simulated DGX H100: preflight taint removed %s after the agent started (%s: %s)",
		untainted.Sub(started).Round(time.Millisecond), cond.Reason, cond.Message)
	if cond.Reason != "PreflightPassed" {
		t.Errorf("GPUPreflight reason %q, want PreflightPassed", cond.Reason)
	}
	if !sawNodeEvent(ctx, t, "PreflightPassed") {
		t.Errorf("no PreflightPassed Event for the node")
	}

	// 2. A new node with GPU 3's link degraded from boot.
	if _, err := a.Reinstall(ctx, shared, defaults); err != nil {
		t.Fatalf("reinstall the default agent: %v", err)
	}
	forgetPreflight(ctx, t)
	if _, err := a.Reinstall(ctx, shared, gated("pcie-degraded:3")); err != nil {
		t.Fatalf("install the agent with preflight.enabled and GPU 3's link degraded: %v\nagent log:\n%s", err, agentLog(a))
	}
	taint, cond := waitPreflight(ctx, t, a, corev1.ConditionFalse, "GPU 3's link degraded")
	if taint == nil || taint.Effect != corev1.TaintEffectNoSchedule || taint.Value != "failed" {
		t.Errorf("preflight taint %v; want %s=failed:NoSchedule", taint, preflightTaint)
	}
	want := []string{"pcie-link", fmt.Sprintf("GPU 3 (%s)", strings.ToLower(gpu3.PCIBusID)), "x8", "max gen 5 x16"}
	for _, w := range want {
		if cond.Reason != "PreflightFailed" || !strings.Contains(strings.ToLower(cond.Message), strings.ToLower(w)) {
			t.Errorf("GPUPreflight %s %q: want PreflightFailed naming %q", cond.Reason, cond.Message, w)
		}
	}
	t.Logf("degraded link: node tainted %s=%s:%s, GPUPreflight=False: %s", taint.Key, taint.Value, taint.Effect, cond.Message)
	workloadPod(t, "before-preflight", map[string]int64{"nvidia.com/gpu": 1})
	defer deletePod(t, "before-preflight")
	waitPodHeldByTaint(ctx, t, "before-preflight")
	// The scheduler's message names no key (1.37: "had untolerated
	// taint(s)"): the preflight taint is the node's only one.
	if n, err := shared.Client.CoreV1().Nodes().Get(ctx, shared.NodeName, metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	} else if len(n.Spec.Taints) != 1 || n.Spec.Taints[0].Key != preflightTaint {
		t.Errorf("node taints %v; want only %s", n.Spec.Taints, preflightTaint)
	}
	// Still tainted after further runs: a failure is run again, not
	// forgotten.
	rctx, rcancel := context.WithTimeout(ctx, time.Minute)
	defer rcancel()
	if err := poll(rctx, func(ctx context.Context) (bool, error) { return preflightRuns(ctx, t, a) >= 3, nil }); err != nil {
		t.Fatalf("the failed preflight was not run again (retryInterval 2s): %d runs logged", preflightRuns(ctx, t, a))
	}
	if !sawNodeEvent(ctx, t, "PreflightFailed") {
		t.Errorf("no PreflightFailed Event for the node")
	}
	if taint, _, _ := nodeTaintAndCondition(ctx, preflightTaint, preflightCondition); taint == nil {
		t.Fatal("preflight taint gone while GPU 3's link is still degraded")
	}

	cleared := time.Now()
	if err := a.Control.ClearFault(ctx, agentproc.Fault{Kind: "pcie-degraded", GPU: 3}); err != nil {
		t.Fatal(err)
	}
	waitPreflight(ctx, t, a, corev1.ConditionTrue, "the link trained at its maximum again")
	t.Logf("link restored: preflight passed and taint removed %s later (retryInterval 2s)", time.Since(cleared).Round(time.Millisecond))
	waitPodRunning(t, "before-preflight", 2*time.Minute)

	// 3. An operator's re-run request on the proven node.
	if err := a.Control.InjectFault(ctx, agentproc.Fault{Kind: "pcie-degraded", GPU: 3}); err != nil {
		t.Fatal(err)
	}
	requested := time.Now()
	err = retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		n, err := shared.Client.CoreV1().Nodes().Get(ctx, shared.NodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if n.Annotations == nil {
			n.Annotations = map[string]string{}
		}
		n.Annotations[preflightRerun] = "e2e: link reseated"
		_, err = shared.Client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("annotate the node %s: %v", preflightRerun, err)
	}
	_, cond = waitPreflight(ctx, t, a, corev1.ConditionFalse, "a re-run request with GPU 3's link degraded")
	t.Logf("re-run request: node tainted failed %s later: %s", time.Since(requested).Round(time.Millisecond), cond.Message)
	if n, err := shared.Client.CoreV1().Nodes().Get(ctx, shared.NodeName, metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	} else if v, ok := n.Annotations[preflightRerun]; ok {
		t.Errorf("annotation %s=%q still on the node after the re-run", preflightRerun, v)
	}
	if !sawNodeEvent(ctx, t, "PreflightRerun") {
		t.Errorf("no PreflightRerun Event for the node")
	}
	if err := a.Control.ClearFault(ctx, agentproc.Fault{Kind: "pcie-degraded", GPU: 3}); err != nil {
		t.Fatal(err)
	}
	waitPreflight(ctx, t, a, corev1.ConditionTrue, "the link restored after the re-run")
}

// waitPreflight waits until GPUPreflight has status want, with the
// preflight taint present exactly while it is not True.
func waitPreflight(ctx context.Context, t *testing.T, a *agentdeploy.Agent, want corev1.ConditionStatus, after string) (*corev1.Taint, *corev1.NodeCondition) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var taint *corev1.Taint
	var cond *corev1.NodeCondition
	err := poll(ctx, func(ctx context.Context) (bool, error) {
		var err error
		taint, cond, err = nodeTaintAndCondition(ctx, preflightTaint, preflightCondition)
		if err != nil || cond == nil || cond.Status != want {
			return false, nil
		}
		if want == corev1.ConditionTrue {
			return taint == nil, nil
		}
		return taint != nil && cond.Reason == "PreflightFailed", nil
	})
	if err != nil {
		t.Fatalf("after %s: preflight taint %v, condition %v; want GPUPreflight %s\nagent log:\n%s", after, taint, cond, want, agentLog(a))
	}
	return taint, cond
}

// watchPreflightTaint returns a channel that receives the time the node's
// watch shows the preflight taint removed after showing it added. The
// removal is timed from the watch, not from waitPreflight: Reinstall
// returns once the agent's pod is Ready, and the readiness probe runs
// every 5 s, so a gate quicker than that looked 5 s long.
func watchPreflightTaint(ctx context.Context, t *testing.T) <-chan time.Time {
	t.Helper()
	nodes := shared.Client.CoreV1().Nodes()
	sel := fields.OneTermEqualSelector("metadata.name", shared.NodeName).String()
	n, err := nodes.Get(ctx, shared.NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get node %s: %v", shared.NodeName, err)
	}
	// A RetryWatcher re-opens the watch from the last event it delivered
	// if the server ends it, so no change of the node is missed.
	w, err := watchtools.NewRetryWatcherWithContext(ctx, n.ResourceVersion, &cache.ListWatch{
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = sel
			return nodes.Watch(ctx, o)
		},
	})
	if err != nil {
		t.Fatalf("watch node %s: %v", shared.NodeName, err)
	}
	out := make(chan time.Time, 1)
	go func() {
		defer w.Stop()
		added := false
		for ev := range w.ResultChan() {
			node, ok := ev.Object.(*corev1.Node)
			if !ok {
				continue
			}
			tainted := slices.ContainsFunc(node.Spec.Taints, func(taint corev1.Taint) bool { return taint.Key == preflightTaint })
			switch {
			case tainted:
				added = true
			case added:
				out <- time.Now()
				return
			}
		}
	}()
	return out
}

// forgetPreflight makes the node one that never passed a preflight: no
// GPUPreflight condition, no preflight taint (what a new node has).
func forgetPreflight(ctx context.Context, t *testing.T) {
	t.Helper()
	nodes := shared.Client.CoreV1().Nodes()
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		n, err := nodes.Get(ctx, shared.NodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, func(x corev1.Taint) bool { return x.Key == preflightTaint })
		if n, err = nodes.Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			return err
		}
		n.Status.Conditions = slices.DeleteFunc(n.Status.Conditions, func(c corev1.NodeCondition) bool { return string(c.Type) == preflightCondition })
		_, err = nodes.UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("remove the node's preflight record: %v", err)
	}
}

// agentStarted is when the agent in pod logged that it was starting.
func agentStarted(ctx context.Context, t *testing.T, a *agentdeploy.Agent, pod string) time.Time {
	t.Helper()
	raw, err := shared.Client.CoreV1().Pods(a.Namespace).GetLogs(pod, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		t.Fatalf("agent log: %v", err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		var rec struct {
			Time time.Time `json:"time"`
			Msg  string    `json:"msg"`
		}
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "gpu-node-agent starting" {
			return rec.Time
		}
	}
	t.Fatalf("no start line in the agent's log:\n%s", raw)
	return time.Time{}
}

// preflightRuns counts the gating runs the current agent logged.
func preflightRuns(ctx context.Context, t *testing.T, a *agentdeploy.Agent) int {
	t.Helper()
	p, err := a.Pod(ctx, shared)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := shared.Client.CoreV1().Pods(a.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		t.Fatalf("agent log: %v", err)
	}
	return strings.Count(string(raw), "node stays tainted: preflight failed")
}

// sawNodeEvent says whether an Event with reason was posted about the
// node (within 30 seconds).
func sawNodeEvent(ctx context.Context, t *testing.T, reason string) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return poll(ctx, func(ctx context.Context) (bool, error) {
		evs, err := shared.Client.CoreV1().Events(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		return slices.ContainsFunc(evs.Items, func(e corev1.Event) bool {
			return e.InvolvedObject.Kind == "Node" && e.InvolvedObject.Name == shared.NodeName && e.Reason == reason
		}), nil
	}) == nil
}

// waitPodHeldByTaint waits (up to two minutes) until the scheduler
// reports pod unschedulable because of an untolerated taint.
func waitPodHeldByTaint(ctx context.Context, t *testing.T, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var pod *corev1.Pod
	err := poll(ctx, func(ctx context.Context) (bool, error) {
		var err error
		if pod, err = shared.Client.CoreV1().Pods(testNamespace).Get(ctx, name, metav1.GetOptions{}); err != nil {
			return false, nil
		}
		for _, c := range pod.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && strings.Contains(c.Message, "untolerated taint") {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("GPU pod %s not held back by a taint: %s", name, podSummary(pod))
	}
}
