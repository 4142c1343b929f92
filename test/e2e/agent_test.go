package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-node-agent/gpu-node-agent/test/e2e/agentdeploy"
	"github.com/gpu-node-agent/gpu-node-agent/test/e2e/cluster"
)

// waitDemoResources waits until the node offers exactly the demo node's
// nvidia.com resources and returns how long that took.
func waitDemoResources(t *testing.T, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := shared.WaitNodeResources(ctx, "nvidia.com/", agentdeploy.DemoResources, agentdeploy.DemoResources); err != nil {
		t.Fatal(err)
	}
	return time.Since(start)
}

// TestAgentDaemonSet: the chart's DaemonSet runs the agent on the node,
// its pod is Ready, and the node's capacity and allocatable list every GPU
// and MIG resource with the simulated node's counts.
func TestAgentDaemonSet(t *testing.T) {
	a := needAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pod, err := a.WaitReady(ctx, shared)
	if err != nil {
		t.Fatal(err)
	}
	if pod.Spec.NodeName != shared.NodeName {
		t.Errorf("agent pod on node %q, want %q", pod.Spec.NodeName, shared.NodeName)
	}
	// The DaemonSet controller counts the Ready pod in its own time.
	var ds appsv1.DaemonSet
	err = poll(ctx, func(ctx context.Context) (bool, error) {
		got, err := shared.Client.AppsV1().DaemonSets(a.Namespace).Get(ctx, a.DaemonSet, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		ds = *got
		return ds.Status.NumberReady == 1 && ds.Status.DesiredNumberScheduled == 1, nil
	})
	if err != nil {
		t.Errorf("daemonset ready %d of %d desired, want 1 of 1: %v", ds.Status.NumberReady, ds.Status.DesiredNumberScheduled, err)
	}
	d := waitDemoResources(t, time.Minute)
	capacity, alloc, err := shared.NodeResources(ctx, "nvidia.com/")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("node capacity %s, allocatable %s (matched after %s)", cluster.FormatResources(capacity), cluster.FormatResources(alloc), d.Round(time.Millisecond))
}

// simGPU is a GPU of the simulator's GET /state (a topology snapshot).
type simGPU struct {
	Index      int    `json:"index"`
	UUID       string `json:"uuid"`
	MIGEnabled bool   `json:"migEnabled"`
	MIG        []struct {
		UUID string `json:"uuid"`
	} `json:"mig"`
}

// simNodeGPUs reads the simulated node's GPUs from the agent's control
// endpoint.
func simNodeGPUs(t *testing.T, a *agentdeploy.Agent) []simGPU {
	t.Helper()
	resp, err := http.Get(a.Control.Base + "/state")
	if err != nil {
		t.Fatalf("simulator state: %v", err)
	}
	defer resp.Body.Close()
	var st struct {
		GPUs []simGPU `json:"gpus"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatalf("decode simulator state: %v", err)
	}
	return st.GPUs
}

// simGPUs returns the whole-GPU UUIDs of GPUs without MIG, and every MIG
// device UUID, of the simulated node.
func simGPUs(t *testing.T, a *agentdeploy.Agent) (whole, mig []string) {
	t.Helper()
	for _, g := range simNodeGPUs(t, a) {
		if !g.MIGEnabled {
			whole = append(whole, g.UUID)
		}
		for _, m := range g.MIG {
			mig = append(mig, m.UUID)
		}
	}
	return whole, mig
}

// simState returns the simulated GPUs' UUIDs by index.
func simState(t *testing.T, a *agentdeploy.Agent) map[int]string {
	t.Helper()
	out := map[int]string{}
	for _, g := range simNodeGPUs(t, a) {
		out[g.Index] = g.UUID
	}
	return out
}

// checkAllocated checks that the container's NVIDIA_VISIBLE_DEVICES holds
// exactly the devices the kubelet's device manager allocated to it, n of
// them, all from the given set.
func checkAllocated(t *testing.T, pod *corev1.Pod, resource string, n int, from []string) {
	t.Helper()
	env := podEnv(t, pod.Name)
	got := strings.Split(env["NVIDIA_VISIBLE_DEVICES"], ",")
	sort.Strings(got)
	if env["NVIDIA_VISIBLE_DEVICES"] == "" || len(got) != n {
		t.Fatalf("NVIDIA_VISIBLE_DEVICES = %q, want %d devices", env["NVIDIA_VISIBLE_DEVICES"], n)
	}
	for i, id := range got {
		if !slices.Contains(from, id) {
			t.Errorf("visible device %s is not one of the node's %s devices %v", id, resource, from)
		}
		if i > 0 && got[i-1] == id {
			t.Errorf("device %s visible twice", id)
		}
	}
	allocs, err := shared.DeviceAllocations()
	if err != nil {
		t.Fatal(err)
	}
	var recorded []string
	for _, a := range allocs {
		if a.PodUID == string(pod.UID) && a.Resource == resource {
			recorded = append(recorded, a.DeviceIDs...)
		}
	}
	sort.Strings(recorded)
	if !slices.Equal(got, recorded) {
		t.Errorf("NVIDIA_VISIBLE_DEVICES %v, but the kubelet allocated %v", got, recorded)
	}
}

// TestGPUPod: a pod asking for nvidia.com/gpu: 2 is scheduled and runs,
// and its environment holds exactly the 2 UUIDs the kubelet allocated.
func TestGPUPod(t *testing.T) {
	a := needAgent(t)
	waitDemoResources(t, time.Minute)
	whole, _ := simGPUs(t, a)
	workloadPod(t, "two-gpus", map[string]int64{"nvidia.com/gpu": 2})
	pod := waitPodRunning(t, "two-gpus", 2*time.Minute)
	checkAllocated(t, pod, "nvidia.com/gpu", 2, whole)
	checkPodAttribution(t, a, pod, strings.Split(podEnv(t, pod.Name)["NVIDIA_VISIBLE_DEVICES"], ","))
}

// checkPodAttribution: the agent's GPU metrics for the pod's devices carry
// the pod, namespace and container labels, which the agent learns from the
// real kubelet's pod-resources API (refreshed every collection interval).
func checkPodAttribution(t *testing.T, a *agentdeploy.Agent, pod *corev1.Pod, uuids []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var missing []string
	err := poll(ctx, func(ctx context.Context) (bool, error) {
		body, ok := scrapeAgent(ctx, a)
		if !ok {
			return false, nil
		}
		missing = missing[:0]
		for _, uuid := range uuids {
			found := false
			for _, line := range strings.Split(body, "\n") {
				if strings.HasPrefix(line, "DCGM_FI_DEV_FB_USED{") &&
					strings.Contains(line, `UUID="`+uuid+`"`) &&
					strings.Contains(line, `pod="`+pod.Name+`"`) &&
					strings.Contains(line, `namespace="`+pod.Namespace+`"`) &&
					strings.Contains(line, `container="workload"`) {
					found = true
					break
				}
			}
			if !found {
				missing = append(missing, uuid)
			}
		}
		return len(missing) == 0, nil
	})
	if err != nil {
		t.Fatalf("no DCGM_FI_DEV_FB_USED series attributed to pod %s/%s for GPUs %v: %v", pod.Namespace, pod.Name, missing, err)
	}
}

// scrapeAgent returns the agent's /metrics, ok false when it did not
// answer (the caller polls again).
func scrapeAgent(ctx context.Context, a *agentdeploy.Agent) (string, bool) {
	url := fmt.Sprintf("http://127.0.0.1:%d/metrics", a.MetricsPort)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", false
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return string(body), err == nil && resp.StatusCode == http.StatusOK
}

// TestMIGPod: a pod asking for one MIG slice gets a MIG device.
func TestMIGPod(t *testing.T) {
	a := needAgent(t)
	waitDemoResources(t, time.Minute)
	_, mig := simGPUs(t, a)
	workloadPod(t, "one-mig", map[string]int64{"nvidia.com/mig-3g.40gb": 1})
	pod := waitPodRunning(t, "one-mig", 2*time.Minute)
	checkAllocated(t, pod, "nvidia.com/mig-3g.40gb", 1, mig)
}

// TestTooManyGPUsStaysPending: a pod asking for more GPUs than the node
// has is not scheduled, and the scheduler says why.
func TestTooManyGPUsStaysPending(t *testing.T) {
	needAgent(t)
	waitDemoResources(t, time.Minute)
	workloadPod(t, "too-many", map[string]int64{"nvidia.com/gpu": agentdeploy.DemoResources["nvidia.com/gpu"] + 1})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var pod *corev1.Pod
	err := poll(ctx, func(ctx context.Context) (bool, error) {
		var err error
		if pod, err = shared.Client.CoreV1().Pods(testNamespace).Get(ctx, "too-many", metav1.GetOptions{}); err != nil {
			return false, nil
		}
		for _, c := range pod.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("pod not reported unschedulable: %v; %s", err, podSummary(pod))
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && !strings.Contains(c.Message, "Insufficient nvidia.com/gpu") {
			t.Errorf("scheduler's reason %q does not name the missing resource", c.Message)
		}
	}
	if pod.Status.Phase != corev1.PodPending || pod.Spec.NodeName != "" {
		t.Errorf("pod phase %s on node %q, want Pending and unbound", pod.Status.Phase, pod.Spec.NodeName)
	}
}

// registrations reads the kubelet's device-plugin registration counter
// per resource.
func registrations(t *testing.T) map[string]float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m, err := shared.KubeletMetric(ctx, "kubelet_device_plugin_registration_total")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for labels, v := range m {
		// labels is resource_name="nvidia.com/gpu"
		_, name, _ := strings.Cut(labels, `resource_name="`)
		out[strings.TrimSuffix(name, `"`)] = v
	}
	return out
}

// TestKubeletRestart: the kubelet restarts while the agent runs; every
// resource comes back to the node and a new GPU pod is admitted.
func TestKubeletRestart(t *testing.T) {
	needAgent(t)
	waitDemoResources(t, time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	if err := shared.RestartKubelet(ctx); err != nil {
		t.Fatal(err)
	}
	ready := time.Since(start)
	back := waitDemoResources(t, time.Minute)
	t.Logf("kubelet restart: node Ready again after %s, all GPU resources back %s later", ready.Round(time.Millisecond), back.Round(time.Millisecond))
	reg := registrations(t)
	for res := range agentdeploy.DemoResources {
		if reg[res] < 1 {
			t.Errorf("restarted kubelet counted %v registrations of %s, want >= 1", reg[res], res)
		}
	}
	workloadPod(t, "after-kubelet-restart", map[string]int64{"nvidia.com/gpu": 1})
	pod := waitPodRunning(t, "after-kubelet-restart", 2*time.Minute)
	whole, _ := simGPUs(t, agent)
	checkAllocated(t, pod, "nvidia.com/gpu", 1, whole)
}

// TestAgentPodDeleted: deleting the agent's pod makes the DaemonSet start a
// new one, which registers every resource again with the kubelet.
func TestAgentPodDeleted(t *testing.T) {
	a := needAgent(t)
	waitDemoResources(t, time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	old, err := a.Pod(ctx, shared)
	if err != nil {
		t.Fatal(err)
	}
	before := registrations(t)
	if err := shared.Client.CoreV1().Pods(a.Namespace).Delete(ctx, old.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var fresh *corev1.Pod
	err = poll(ctx, func(ctx context.Context) (bool, error) {
		p, err := a.WaitReady(ctx, shared)
		if err != nil {
			return false, err
		}
		fresh = p
		return p.UID != old.UID, nil
	})
	if err != nil {
		t.Fatalf("no new agent pod: %v", err)
	}
	var after map[string]float64
	err = poll(ctx, func(context.Context) (bool, error) {
		after = registrations(t)
		for res := range agentdeploy.DemoResources {
			if after[res] <= before[res] {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("new agent pod %s did not re-register every resource: registrations before %v, after %v", fresh.Name, before, after)
	}
	t.Logf("agent pod %s replaced by %s, Ready and re-registered in %s", old.Name, fresh.Name, time.Since(start).Round(time.Millisecond))
	waitDemoResources(t, time.Minute)
	workloadPod(t, "after-agent-restart", map[string]int64{"nvidia.com/mig-1g.10gb": 2})
	pod := waitPodRunning(t, "after-agent-restart", 2*time.Minute)
	_, mig := simGPUs(t, a)
	checkAllocated(t, pod, "nvidia.com/mig-1g.10gb", 2, mig)
}
