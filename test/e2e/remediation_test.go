package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/gpu-node-agent/gpu-node-agent/test/e2e/agentdeploy"
	"github.com/gpu-node-agent/gpu-node-agent/test/internal/agentproc"
)

// e2eSentinelDir is where the remediation scenario's agent writes its
// reboot sentinel on the node (this machine): a directory of its own, so
// that no real kured or package manager sees the request.
const e2eSentinelDir = "/var/run/gna-e2e-reboot"

// rebootCondition is the Node condition of a reboot request.
const rebootCondition = "GPURebootRequired"

// slotPrefix and slotLabel are the fleet safeguard's slot Leases
// (safeguard.DefaultSlotPrefix, safeguard.SlotLabel).
const (
	slotPrefix = "gpu-node-agent-taint-slot"
	slotLabel  = "gpu-node-agent.io/taint-slot"
)

// TestRemediation runs the self-healing loop on the real single-node
// cluster with every step enabled, and measures each scenario from the
// fault to the GPU allocatable again:
//  1. the fleet safeguard's only slot held by another node: the reset is
//     refused (Event, counter) and the GPU stays unhealthy; once the slot
//     is free the GPU is reset and offered again;
//  2. a reset-class XID on an idle GPU: reset, allocatable again;
//  3. the same on a GPU a pod holds, with a PodDisruptionBudget that
//     allows no disruption: the eviction is blocked, then allowed once
//     the budget is relaxed; the pod evicted, the GPU reset, allocatable;
//  4. a reboot-class XID: kured's sentinel file on the node and the
//     GPURebootRequired condition on the Node; an operator's clear
//     withdraws both.
func TestRemediation(t *testing.T) {
	a := needAgent(t)
	waitDemoResources(t, time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	if err := os.MkdirAll(e2eSentinelDir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(e2eSentinelDir) })
	sentinel := filepath.Join(e2eSentinelDir, "reboot-required")

	defaults := a.Options
	opts := defaults
	opts.Values = withConfig(defaults.Values, "remediation", map[string]any{
		"retryInterval": "2s",
		"reset":         map[string]any{"enabled": true, "timeout": "20s"},
		"drain":         map[string]any{"enabled": true, "gracePeriod": "1s"},
		"reboot":        map[string]any{"enabled": true, "sentinelPath": sentinel},
	})
	if _, err := a.Reinstall(ctx, shared, opts); err != nil {
		t.Fatalf("install the agent with remediation: %v\nagent log:\n%s", err, agentLog(a))
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if _, err := a.Reinstall(ctx, shared, defaults); err != nil {
			t.Errorf("reinstall the default agent: %v", err)
		}
	})
	waitDemoResources(t, time.Minute)
	index := map[string]int{}
	for i, uuid := range simState(t, a) {
		index[uuid] = i
	}
	uuid := func(i int) string {
		for u, j := range index {
			if j == i {
				return u
			}
		}
		t.Fatalf("no simulated GPU %d", i)
		return ""
	}
	degraded := func() map[string]int64 {
		d := make(map[string]int64, len(agentdeploy.DemoResources))
		for k, v := range agentdeploy.DemoResources {
			d[k] = v
		}
		d["nvidia.com/gpu"]--
		return d
	}

	t.Run("safeguard refuses", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		defer cancel()
		// Another node holds the fleet's only slot (K = 1 for a fleet of
		// one node at taint.maxFraction 0.2).
		now := metav1.NewMicroTime(time.Now())
		lease := &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: slotPrefix + "-0", Namespace: a.Namespace, Labels: map[string]string{slotLabel: slotPrefix}},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptrTo("other-gpu-node"), LeaseDurationSeconds: ptrTo(int32(900)), AcquireTime: &now, RenewTime: &now},
		}
		leases := shared.Client.CoordinationV1().Leases(a.Namespace)
		if _, err := leases.Create(ctx, lease, metav1.CreateOptions{}); err != nil {
			t.Fatalf("occupy the slot: %v", err)
		}
		freed := false
		t.Cleanup(func() {
			if !freed {
				_ = leases.Delete(context.Background(), lease.Name, metav1.DeleteOptions{})
			}
		})
		gpu := 4
		start := time.Now()
		injectFault(ctx, t, a, agentproc.Fault{Kind: "xid", GPU: gpu, XID: 48})
		ev := waitEventSince(ctx, t, "RemediationRefused", uuid(gpu), start)
		t.Logf("refused %s after the fault: %s", time.Since(start).Round(time.Millisecond), ev.Message)
		waitMetric(ctx, t, a, `gpu_node_agent_remediation_total{action="reset",result="refused"} 1`)
		if err := shared.WaitNodeResources(ctx, "nvidia.com/", agentdeploy.DemoResources, degraded()); err != nil {
			t.Fatalf("the faulty GPU is allocatable: %v", err)
		}
		// Refused means not reset: no reset Event for it.
		time.Sleep(3 * time.Second) // over a retry interval
		if hasEventSince(ctx, t, "GPUResetStarted", uuid(gpu), start) {
			t.Fatal("the GPU was reset while the safeguard refused")
		}
		freedAt := time.Now()
		if err := leases.Delete(ctx, lease.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		freed = true
		waitEventSince(ctx, t, "GPUResetSucceeded", uuid(gpu), start)
		if err := shared.WaitNodeResources(ctx, "nvidia.com/", agentdeploy.DemoResources, agentdeploy.DemoResources); err != nil {
			t.Fatalf("GPU not allocatable again after the slot was freed: %v", err)
		}
		t.Logf("slot freed: GPU %d reset and allocatable again %s later", gpu, time.Since(freedAt).Round(time.Millisecond))
		noRebootSince(ctx, t, start)
	})

	t.Run("idle GPU reset", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		defer cancel()
		gpu := 5
		start := time.Now()
		injectFault(ctx, t, a, agentproc.Fault{Kind: "xid", GPU: gpu, XID: 48})
		if err := shared.WaitNodeResources(ctx, "nvidia.com/", agentdeploy.DemoResources, degraded()); err != nil {
			t.Fatalf("the faulty GPU is still allocatable: %v", err)
		}
		ev := waitEventSince(ctx, t, "GPUResetSucceeded", uuid(gpu), start)
		reset := time.Since(start)
		if err := shared.WaitNodeResources(ctx, "nvidia.com/", agentdeploy.DemoResources, agentdeploy.DemoResources); err != nil {
			t.Fatalf("GPU not allocatable again after its reset: %v", err)
		}
		t.Logf("XID 48 on idle GPU %d: reset %s after the fault (%s), allocatable again after %s (recovery period 10s)",
			gpu, reset.Round(time.Millisecond), ev.Message, time.Since(start).Round(time.Millisecond))
		noRebootSince(ctx, t, start)
	})

	t.Run("held GPU drained with a budget", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(ctx, 4*time.Minute)
		defer cancel()
		labels := map[string]string{"app": "remediation-held"}
		pod := labelledWorkloadPod(t, "remediation-held", map[string]int64{"nvidia.com/gpu": 1}, labels)
		pod = waitPodRunning(t, pod.Name, 2*time.Minute)
		gpu := index[podGPU(t, pod, index)]
		pdbs := shared.Client.PolicyV1().PodDisruptionBudgets(testNamespace)
		// minAvailable, since a bare pod has no controller to count
		// maxUnavailable against.
		one := intstr.FromInt32(1)
		pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: "remediation-held"},
			Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: &one, Selector: &metav1.LabelSelector{MatchLabels: labels}}}
		if _, err := pdbs.Create(ctx, pdb, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = pdbs.Delete(context.Background(), pdb.Name, metav1.DeleteOptions{}) })
		// The disruption controller must have counted the pod first.
		if err := poll(ctx, func(ctx context.Context) (bool, error) {
			p, err := pdbs.Get(ctx, pdb.Name, metav1.GetOptions{})
			return err == nil && p.Status.ObservedGeneration == p.Generation && p.Status.CurrentHealthy == 1, nil
		}); err != nil {
			t.Fatalf("PodDisruptionBudget never observed the pod: %v", err)
		}

		start := time.Now()
		injectFault(ctx, t, a, agentproc.Fault{Kind: "xid", GPU: gpu, XID: 48})
		ev := waitEventSince(ctx, t, "GPUPodEvictionBlocked", pod.Name, start)
		t.Logf("eviction blocked %s after the fault: %s", time.Since(start).Round(time.Millisecond), ev.Message)
		if hasEventSince(ctx, t, "GPUResetStarted", uuid(gpu), start) {
			t.Fatal("a GPU a pod holds was reset")
		}
		allowed := time.Now()
		zero := intstr.FromInt32(0)
		if err := poll(ctx, func(ctx context.Context) (bool, error) {
			p, err := pdbs.Get(ctx, pdb.Name, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			p.Spec.MinAvailable = &zero
			_, err = pdbs.Update(ctx, p, metav1.UpdateOptions{})
			return err == nil, nil
		}); err != nil {
			t.Fatalf("relax the budget: %v", err)
		}
		waitEventSince(ctx, t, "GPUPodEvicted", pod.Name, start)
		if err := poll(ctx, func(ctx context.Context) (bool, error) {
			_, err := shared.Client.CoreV1().Pods(testNamespace).Get(ctx, pod.Name, metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		}); err != nil {
			t.Fatalf("evicted pod not gone: %v", err)
		}
		waitEventSince(ctx, t, "GPUResetSucceeded", uuid(gpu), start)
		if err := shared.WaitNodeResources(ctx, "nvidia.com/", agentdeploy.DemoResources, agentdeploy.DemoResources); err != nil {
			t.Fatalf("GPU not allocatable again after drain and reset: %v", err)
		}
		t.Logf("XID 48 on GPU %d held by pod %s: allocatable again %s after the fault, %s after the budget allowed the eviction",
			gpu, pod.Name, time.Since(start).Round(time.Millisecond), time.Since(allowed).Round(time.Millisecond))
		noRebootSince(ctx, t, start)
	})

	t.Run("reboot handed to kured", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		defer cancel()
		gpu := 6
		start := time.Now()
		injectFault(ctx, t, a, agentproc.Fault{Kind: "xid", GPU: gpu, XID: 79})
		// kured's own check (kubereboot/kured 1.23.0, pkg/checkers/checker.go):
		// os.Stat of --reboot-sentinel, default /var/run/reboot-required;
		// here the path the agent was configured with, on the node.
		if err := poll(ctx, func(ctx context.Context) (bool, error) {
			_, err := os.Stat(sentinel)
			return err == nil, nil
		}); err != nil {
			t.Fatalf("no sentinel at %s: %v\nagent log:\n%s", sentinel, err, agentLog(a))
		}
		requested := time.Since(start)
		// kured's --reboot-sentinel-command form: a command whose exit 0
		// means a reboot is required, run in the host's mount namespace.
		if out, err := exec.CommandContext(ctx, "sh", "-c", "test -f "+sentinel).CombinedOutput(); err != nil {
			t.Errorf("sentinel command form: %v %s", err, out)
		}
		var cond *corev1.NodeCondition
		if err := poll(ctx, func(ctx context.Context) (bool, error) {
			var err error
			_, cond, err = nodeTaintAndCondition(ctx, "", rebootCondition)
			return err == nil && cond != nil && cond.Status == corev1.ConditionTrue, nil
		}); err != nil {
			t.Fatalf("Node condition %s: %v, want True", rebootCondition, cond)
		}
		if !strings.Contains(cond.Message, uuid(gpu)) {
			t.Errorf("%s message %q does not name GPU %s", rebootCondition, cond.Message, uuid(gpu))
		}
		body, _ := os.ReadFile(sentinel)
		t.Logf("XID 79 on GPU %d: sentinel %s written %s after the fault (%q), %s=True (%s)",
			gpu, sentinel, requested.Round(time.Millisecond), strings.SplitN(string(body), "\n", 2)[0], rebootCondition, cond.Message)
		if hasEventSince(ctx, t, "GPUResetStarted", uuid(gpu), start) {
			t.Error("a reboot-class fault was answered with a reset")
		}

		// The operator clears the fault instead of rebooting: the request
		// is withdrawn (the file removed, the condition False).
		nodes := shared.Client.CoreV1().Nodes()
		patch := fmt.Sprintf(`{"metadata":{"annotations":{"gpu-node-agent.io/clear-faults":%q}}}`, uuid(gpu))
		if _, err := nodes.Patch(ctx, shared.NodeName, "application/merge-patch+json", []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := poll(ctx, func(ctx context.Context) (bool, error) {
			_, err := os.Stat(sentinel)
			_, cond, cerr := nodeTaintAndCondition(ctx, "", rebootCondition)
			return errors.Is(err, os.ErrNotExist) && cerr == nil && cond != nil && cond.Status == corev1.ConditionFalse, nil
		}); err != nil {
			t.Fatalf("reboot request not withdrawn after the clear: %v", err)
		}
		waitDemoResources(t, time.Minute)
	})
}

// waitEventSince waits for a Node Event with reason whose message contains
// s, posted at or after since (second resolution), and returns it.
func waitEventSince(ctx context.Context, t *testing.T, reason, s string, since time.Time) corev1.Event {
	t.Helper()
	var found corev1.Event
	var seen []string
	err := poll(ctx, func(ctx context.Context) (bool, error) {
		seen = seen[:0]
		for _, e := range nodeEvents(ctx, t) {
			if e.LastTimestamp.Time.Before(since.Truncate(time.Second)) {
				continue
			}
			seen = append(seen, e.Reason+": "+e.Message)
			if e.Reason == reason && strings.Contains(e.Message, s) {
				found = e
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no %s Event naming %s: %v; events since:\n%s\nagent log:\n%s", reason, s, err, strings.Join(seen, "\n"), agentLog(agent))
	}
	return found
}

// hasEventSince says whether the node has such an Event now.
func hasEventSince(ctx context.Context, t *testing.T, reason, s string, since time.Time) bool {
	t.Helper()
	for _, e := range nodeEvents(ctx, t) {
		if !e.LastTimestamp.Time.Before(since.Truncate(time.Second)) && e.Reason == reason && strings.Contains(e.Message, s) {
			return true
		}
	}
	return false
}

// noRebootSince fails the test when a reboot was requested since start:
// a reset that worked asks for none.
func noRebootSince(ctx context.Context, t *testing.T, start time.Time) {
	t.Helper()
	if hasEventSince(ctx, t, "RebootRequested", "", start) {
		t.Errorf("a reboot was requested after a reset that worked")
	}
	if _, err := os.Stat(filepath.Join(e2eSentinelDir, "reboot-required")); err == nil {
		t.Errorf("a reboot sentinel stands after a reset that worked")
	}
}
