package e2e

import (
	"context"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpu-node-agent/gpu-node-agent/dra"
	"github.com/gpu-node-agent/gpu-node-agent/test/e2e/agentdeploy"
	"github.com/gpu-node-agent/gpu-node-agent/test/internal/agentproc"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// sharedResource is the time-sliced resource of the sharing scenario: two
// replicas of one whole GPU, renamed so the other GPUs stay unshared under
// nvidia.com/gpu.
const sharedResource = "nvidia.com/gpu.shared"

// sharedGPU is the GPU the sharing scenarios share: the first whole GPU of
// the demo node (GPUs 0 and 1 are in MIG mode).
const sharedGPU = 2

// timeSliced is values with the agent's time-slicing section sharing
// sharedGPU: 2 replicas, served as sharedResource.
func timeSliced(values map[string]any) map[string]any {
	return withConfig(values, "sharing", map[string]any{"timeSlicing": map[string]any{
		"resources": []any{map[string]any{"name": "nvidia.com/gpu", "replicas": 2, "rename": sharedResource, "devices": []any{sharedGPU}}},
	}})
}

// gpuIndexes is the simulated node's GPU index by UUID.
func gpuIndexes(t *testing.T, a *agentdeploy.Agent) map[string]int {
	index := map[string]int{}
	for i, uuid := range simState(t, a) {
		index[uuid] = i
	}
	return index
}

// sharer is a pod of a sharing scenario and its simulated process's use
// of the shared GPU.
type sharer struct {
	name      string
	memoryMiB uint64
	smUtil    uint32
}

// TestSharedGPU: with time-slicing configured for one GPU (2 replicas),
// two pods each asking for one replica share that GPU; each pod's
// simulated process on it shows in the agent's per-pod series with its own
// pod label and its own memory and utilisation, while the device's DCGM
// series carry no pod label (no pod is credited with the whole device's
// value) and the holder count is 2.
func TestSharedGPU(t *testing.T) {
	a := needAgent(t)
	waitDemoResources(t, time.Minute)
	requireNoDevicePluginPods(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	index := gpuIndexes(t, a)

	defaults := a.Options
	restoreAtEnd(t, a, nil)
	opts := defaults
	opts.Values = timeSliced(defaults.Values)
	start := time.Now()
	if _, err := a.Reinstall(ctx, shared, opts); err != nil {
		t.Fatalf("reinstall the agent with time-slicing: %v\nagent log:\n%s", err, agentLog(a))
	}
	want := maps.Clone(agentdeploy.DemoResources)
	want["nvidia.com/gpu"]--
	want[sharedResource] = 2
	if err := shared.WaitNodeResources(ctx, "nvidia.com/", want, want); err != nil {
		t.Fatalf("time-sliced resources: %v", err)
	}
	t.Logf("agent reinstalled with GPU %d time-sliced (2 replicas as %s) in %s", sharedGPU, sharedResource, time.Since(start).Round(time.Millisecond))

	sharers := []sharer{{"share-a", 1024, 30}, {"share-b", 3072, 60}}
	for _, s := range sharers {
		workloadPod(t, s.name, map[string]int64{sharedResource: 1})
	}
	gpuUUID := ""
	for _, s := range sharers {
		pod := waitPodRunning(t, s.name, 2*time.Minute)
		uuid := podGPU(t, pod, index)
		if index[uuid] != sharedGPU {
			t.Fatalf("pod %s got GPU %d (%s), want the shared GPU %d", s.name, index[uuid], uuid, sharedGPU)
		}
		gpuUUID = uuid
		startProcess(ctx, t, a, agentproc.Process{
			GPU: sharedGPU, MemoryMiB: s.memoryMiB, SMUtil: s.smUtil, Kind: "pod",
			PodUID: string(pod.UID), ContainerID: containerID(pod),
		})
	}
	t.Logf("pods %s and %s both run on GPU %d (%s)", sharers[0].name, sharers[1].name, sharedGPU, gpuUUID)

	// Each pod's own series, with its own values.
	for _, s := range sharers {
		labels := []string{`UUID="` + gpuUUID + `"`, `pod="` + s.name + `"`, `namespace="` + testNamespace + `"`, `container="workload"`}
		waitSeries(ctx, t, a, "gpu_node_agent_pod_gpu_memory_used_bytes", labels, float64(s.memoryMiB)*1024*1024)
		waitSeries(ctx, t, a, "gpu_node_agent_pod_gpu_replicas", labels, 1)
		waitSeries(ctx, t, a, "gpu_node_agent_pod_gpu_sm_utilization_ratio", labels, float64(s.smUtil)/100)
	}
	waitSeries(ctx, t, a, "gpu_node_agent_gpu_holders", []string{`UUID="` + gpuUUID + `"`}, 2)
	// The device's own series name no pod: neither is credited with the
	// whole GPU's memory.
	body, _ := scrapeAgent(ctx, a)
	found := false
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, "DCGM_FI_DEV_FB_USED{") || !strings.Contains(line, `UUID="`+gpuUUID+`"`) {
			continue
		}
		found = true
		if strings.Contains(line, `pod="share-`) {
			t.Errorf("the shared GPU's device series names one of its pods: %s", line)
		}
	}
	if !found {
		t.Errorf("no DCGM_FI_DEV_FB_USED series for the shared GPU %s", gpuUUID)
	}
	for _, s := range sharers {
		deletePod(t, s.name)
	}
}

// restoreAtEnd reinstalls the agent as it was (a.Options now) when t
// ends, runs then (nil: nothing) after the reinstall, and waits for the
// demo resources to be back.
func restoreAtEnd(t *testing.T, a *agentdeploy.Agent, then func(context.Context, *testing.T)) {
	defaults := a.Options
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if _, err := a.Reinstall(ctx, shared, defaults); err != nil {
			t.Errorf("restore the default install: %v\nagent log:\n%s", err, agentLog(a))
			return
		}
		if then != nil {
			then(ctx, t)
		}
		if err := shared.WaitNodeResources(ctx, "nvidia.com/", agentdeploy.DemoResources, agentdeploy.DemoResources); err != nil {
			t.Errorf("demo resources after the default install came back: %v", err)
		}
	})
}

// withConfig returns values with config.<key> set to v (values is not
// changed).
func withConfig(values map[string]any, key string, v any) map[string]any {
	out := maps.Clone(values)
	if out == nil {
		out = map[string]any{}
	}
	cfg := map[string]any{}
	if c, ok := out["config"].(map[string]any); ok {
		cfg = maps.Clone(c)
	}
	cfg[key] = v
	out["config"] = cfg
	return out
}

// waitSeries waits until the agent exposes a series of metric whose line
// has every one of labels and the value want.
func waitSeries(ctx context.Context, t *testing.T, a *agentdeploy.Agent, metric string, labels []string, want float64) {
	t.Helper()
	var seen []string
	err := poll(ctx, func(ctx context.Context) (bool, error) {
		body, ok := scrapeAgent(ctx, a)
		if !ok {
			return false, nil
		}
		seen = seen[:0]
		for _, line := range strings.Split(body, "\n") {
			if !strings.HasPrefix(line, metric+"{") {
				continue
			}
			match := true
			for _, l := range labels {
				match = match && strings.Contains(line, l)
			}
			if !match {
				continue
			}
			seen = append(seen, line)
			i := strings.LastIndexByte(line, ' ')
			if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil && v == want {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no %s{%s} %v: %v (matching series: %v)", metric, strings.Join(labels, ","), fmt.Sprint(want), err, seen)
	}
}

// TestDRASharedGPU: with DRA serving the GPUs and dra.sharing on, the GPU
// the time-slicing section shares (2 replicas, renamed nvidia.com/gpu.shared)
// is published once, shared (allowMultipleAllocations, two shares). Two
// unchanged pods asking for nvidia.com/gpu.shared: 1 both run on it, each
// through its own scheduler claim holding its own share; a third finds no
// share left and stays Pending. Each pod's simulated process shows in the
// per-pod series with its own pod label, as with time-slicing, and the
// GPU's holder count is 2.
func TestDRASharedGPU(t *testing.T) {
	a := needAgent(t)
	waitDemoResources(t, time.Minute)
	requireNoDevicePluginPods(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	index := gpuIndexes(t, a)

	defaults := a.Options
	// Registered first, so it runs last: after the pods' cleanups.
	t.Cleanup(func() { restoreDeviceplugin(t, a, defaults) })
	opts := defaults
	opts.DRA = draKinds
	opts.Values = timeSliced(defaults.Values)
	opts.Values["dra"] = map[string]any{"sharing": map[string]any{"enabled": true}}
	start := time.Now()
	if _, err := a.Reinstall(ctx, shared, opts); err != nil {
		t.Fatalf("reinstall the agent with DRA sharing: %v\nagent log:\n%s", err, agentLog(a))
	}
	sharedDev := fmt.Sprintf("gpu-%d", sharedGPU)
	devs := waitSliceDevices(ctx, t, "the DRA sharing install", func(devs map[string]resourcev1.Device) error {
		d, ok := devs[sharedDev]
		if !ok || d.AllowMultipleAllocations == nil || !*d.AllowMultipleAllocations {
			return fmt.Errorf("%s not published shared: %+v", sharedDev, d)
		}
		return nil
	})
	for name, d := range devs {
		if name != sharedDev && d.AllowMultipleAllocations != nil && *d.AllowMultipleAllocations {
			t.Errorf("%s published shared; only %s is", name, sharedDev)
		}
	}
	shares := devs[sharedDev].Capacity[dra.CapShares]
	t.Logf("agent reinstalled with DRA sharing: %s published shared with %s shares after %s", sharedDev, shares.Value.String(), time.Since(start).Round(time.Millisecond))

	sharers := []sharer{{"dra-share-a", 1024, 30}, {"dra-share-b", 3072, 60}}
	for _, s := range sharers {
		workloadPod(t, s.name, map[string]int64{sharedResource: 1})
	}
	gpuUUID := ""
	var claims []string
	shareIDs := map[string]bool{}
	for _, s := range sharers {
		pod := waitPodRunning(t, s.name, 2*time.Minute)
		uuid := podGPU(t, pod, index)
		if index[uuid] != sharedGPU {
			t.Fatalf("pod %s got GPU %d (%s), want the shared GPU %d", s.name, index[uuid], uuid, sharedGPU)
		}
		gpuUUID = uuid
		st := pod.Status.ExtendedResourceClaimStatus
		if st == nil {
			t.Fatalf("pod %s runs without an extended-resource claim", s.name)
		}
		claim := getClaim(ctx, t, st.ResourceClaimName)
		claims = append(claims, claim.Name)
		for _, r := range claim.Status.Allocation.Devices.Results {
			if r.Device != sharedDev || r.ShareID == nil {
				t.Errorf("claim %s: result %+v, want a share of %s", claim.Name, r, sharedDev)
				continue
			}
			shareIDs[string(*r.ShareID)] = true
		}
		startProcess(ctx, t, a, agentproc.Process{
			GPU: sharedGPU, MemoryMiB: s.memoryMiB, SMUtil: s.smUtil, Kind: "pod",
			PodUID: string(pod.UID), ContainerID: containerID(pod),
		})
	}
	if len(shareIDs) != 2 {
		t.Errorf("share IDs %v, want one per pod", shareIDs)
	}
	t.Logf("pods %s and %s both run on GPU %d (%s), claims %v", sharers[0].name, sharers[1].name, sharedGPU, gpuUUID, claims)

	// No share left: a third pod is not scheduled.
	const third = "dra-share-c"
	workloadPod(t, third, map[string]int64{sharedResource: 1})
	pctx, pcancel := context.WithTimeout(ctx, time.Minute)
	err := poll(pctx, func(ctx context.Context) (bool, error) {
		p, err := shared.Client.CoreV1().Pods(testNamespace).Get(ctx, third, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		if p.Spec.NodeName != "" {
			return false, fmt.Errorf("pod %s was scheduled to %s with both shares held", third, p.Spec.NodeName)
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				t.Logf("pod %s unschedulable: %s", third, c.Message)
				return true, nil
			}
		}
		return false, nil
	})
	pcancel()
	if err != nil {
		t.Errorf("third pod: %v", err)
	}
	deletePod(t, third)

	for _, s := range sharers {
		labels := []string{`UUID="` + gpuUUID + `"`, `pod="` + s.name + `"`, `namespace="` + testNamespace + `"`, `container="workload"`}
		waitSeries(ctx, t, a, "gpu_node_agent_pod_gpu_memory_used_bytes", labels, float64(s.memoryMiB)*1024*1024)
		waitSeries(ctx, t, a, "gpu_node_agent_pod_gpu_sm_utilization_ratio", labels, float64(s.smUtil)/100)
	}
	waitSeries(ctx, t, a, "gpu_node_agent_gpu_holders", []string{`UUID="` + gpuUUID + `"`}, 2)

	for _, s := range sharers {
		deletePod(t, s.name)
	}
	gctx, gcancel := context.WithTimeout(ctx, time.Minute)
	defer gcancel()
	if err := poll(gctx, func(ctx context.Context) (bool, error) {
		l, err := shared.Client.ResourceV1().ResourceClaims(testNamespace).List(ctx, metav1.ListOptions{})
		return err == nil && len(l.Items) == 0, nil
	}); err != nil {
		t.Errorf("claims of the deleted pods still exist: %v", err)
	}
}
