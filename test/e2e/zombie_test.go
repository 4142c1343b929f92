package e2e

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/gpu-node-agent/gpu-node-agent/test/e2e/agentdeploy"
	"github.com/gpu-node-agent/gpu-node-agent/test/internal/agentproc"
)

// zombieValues is the GPU process check's configuration of the e2e agent:
// a short grace so the scenario fits in the test, and kill mode, so the
// test sees a zombie found, killed and its GPU offered again.
var zombieValues = map[string]any{"grace": "5s", "action": "kill", "killGrace": "5s"}

// TestZombieGPUProcess: a GPU pod is deleted while a simulated process of
// that pod keeps memory on its GPU. After the grace the GPU is Unhealthy
// (allocatable drops by one) and a Warning Event on the Node names the PID
// and the pod; with action kill the agent signals the process, which ends,
// and the GPU is offered again after the recovery period. Meanwhile a
// running pod's own process on its own GPU, older than the grace, is
// never flagged.
func TestZombieGPUProcess(t *testing.T) {
	a := needAgent(t)
	waitDemoResources(t, time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	index := map[string]int{}
	for i, uuid := range simState(t, a) {
		index[uuid] = i
	}

	workloadPod(t, "zombie-owner", map[string]int64{"nvidia.com/gpu": 1})
	workloadPod(t, "zombie-bystander", map[string]int64{"nvidia.com/gpu": 1})
	owner := waitPodRunning(t, "zombie-owner", 2*time.Minute)
	bystander := waitPodRunning(t, "zombie-bystander", 2*time.Minute)
	ownerGPU := podGPU(t, owner, index)
	bystanderGPU := podGPU(t, bystander, index)

	// The bystander's own process on its own GPU: never flagged.
	own := startProcess(ctx, t, a, agentproc.Process{
		GPU: index[bystanderGPU], MemoryMiB: 2048, Kind: "pod",
		PodUID: string(bystander.UID), ContainerID: containerID(bystander),
	})
	// The owner's process, which outlives its pod.
	zombie := startProcess(ctx, t, a, agentproc.Process{
		GPU: index[ownerGPU], MemoryMiB: 4096, Kind: "pod",
		PodUID: string(owner.UID), ContainerID: containerID(owner),
	})

	// Both are their pods' own before the owner goes (so the agent also
	// knows the owner's name when its process turns zombie).
	for _, gpu := range []string{bystanderGPU, ownerGPU} {
		waitMetric(ctx, t, a, fmt.Sprintf(`gpu_node_agent_gpu_processes{class="own",device=%q} 1`, gpu))
	}

	deleted := time.Now()
	deletePod(t, owner.Name)
	t.Logf("pod %s deleted in %s; its process %d keeps 4096 MiB on GPU %d (%s)",
		owner.Name, time.Since(deleted).Round(time.Millisecond), zombie, index[ownerGPU], ownerGPU)

	ev := waitNodeEvent(ctx, t, "GPUZombieProcess", strconv.FormatUint(uint64(zombie), 10))
	found := time.Since(deleted)
	for _, want := range []string{ownerGPU, string(owner.UID), testNamespace + "/" + owner.Name} {
		if !strings.Contains(ev.Message, want) {
			t.Errorf("GPUZombieProcess Event %q does not name %s", ev.Message, want)
		}
	}
	if ev.Type != corev1.EventTypeWarning {
		t.Errorf("GPUZombieProcess Event type %s, want Warning", ev.Type)
	}
	t.Logf("zombie observed %s after the pod's deletion (grace %s): %s", found.Round(time.Millisecond), zombieValues["grace"], ev.Message)

	// The zombie's GPU is Unhealthy (allocatable one less); the
	// bystander's is not.
	degraded := maps.Clone(agentdeploy.DemoResources)
	degraded["nvidia.com/gpu"]--
	if err := shared.WaitNodeResources(ctx, "nvidia.com/", agentdeploy.DemoResources, degraded); err != nil {
		t.Fatalf("the zombie's GPU is still allocatable: %v", err)
	}

	// action kill: the process is signalled and ends; the GPU comes back.
	killed := waitNodeEvent(ctx, t, "GPUZombieKilled", strconv.FormatUint(uint64(zombie), 10))
	t.Logf("kill Event %s after the deletion: %s", time.Since(deleted).Round(time.Millisecond), killed.Message)
	if err := poll(ctx, func(ctx context.Context) (bool, error) {
		pids, err := a.Control.ProcessPIDs(ctx)
		return err == nil && !slices.Contains(pids, zombie), nil
	}); err != nil {
		t.Fatalf("zombie process %d still running after its kill Event: %v", zombie, err)
	}
	if err := shared.WaitNodeResources(ctx, "nvidia.com/", agentdeploy.DemoResources, agentdeploy.DemoResources); err != nil {
		t.Fatalf("the GPU is not offered again after its zombie was killed: %v", err)
	}
	t.Logf("GPU %s offered again %s after the deletion", ownerGPU, time.Since(deleted).Round(time.Millisecond))

	// The bystander's process was older than the grace all along.
	pids, err := a.Control.ProcessPIDs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(pids, own) {
		t.Errorf("the running pod's own process %d was killed", own)
	}
	for _, e := range nodeEvents(ctx, t) {
		if strings.HasPrefix(e.Reason, "GPU") && containsWord(e.Message, strconv.FormatUint(uint64(own), 10)) {
			t.Errorf("the running pod's own process was flagged: %s: %s", e.Reason, e.Message)
		}
	}
}

// waitMetric waits until the agent's /metrics has the line want.
func waitMetric(ctx context.Context, t *testing.T, a *agentdeploy.Agent, want string) {
	t.Helper()
	var last string
	err := poll(ctx, func(ctx context.Context) (bool, error) {
		body, ok := scrapeAgent(ctx, a)
		if !ok {
			return false, nil
		}
		last = body
		return slices.Contains(strings.Split(last, "\n"), want), nil
	})
	if err != nil {
		var fam []string
		for _, l := range strings.Split(last, "\n") {
			if name, _, _ := strings.Cut(want, "{"); strings.HasPrefix(l, name) {
				fam = append(fam, l)
			}
		}
		t.Fatalf("agent metrics lack %s: %v; have:\n%s", want, err, strings.Join(fam, "\n"))
	}
}

// podGPU returns the one GPU the kubelet gave pod (its container's
// NVIDIA_VISIBLE_DEVICES), which must be a simulated whole GPU.
func podGPU(t *testing.T, pod *corev1.Pod, index map[string]int) string {
	t.Helper()
	ids := podEnv(t, pod.Name)["NVIDIA_VISIBLE_DEVICES"]
	if _, ok := index[ids]; !ok {
		t.Fatalf("pod %s: NVIDIA_VISIBLE_DEVICES %q is not one simulated GPU", pod.Name, ids)
	}
	return ids
}

// containerID is the pod's container ID as its status shows it
// ("containerd://<64 hex>").
func containerID(pod *corev1.Pod) string {
	if len(pod.Status.ContainerStatuses) == 0 {
		return ""
	}
	return pod.Status.ContainerStatuses[0].ContainerID
}

// startProcess starts a simulated GPU process, stopped at the test's end
// if it still runs.
func startProcess(ctx context.Context, t *testing.T, a *agentdeploy.Agent, p agentproc.Process) uint32 {
	t.Helper()
	pid, err := a.Control.StartProcess(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if pids, err := a.Control.ProcessPIDs(ctx); err == nil && slices.Contains(pids, pid) {
			if err := a.Control.StopProcess(ctx, pid); err != nil {
				t.Errorf("stop simulated process %d: %v", pid, err)
			}
		}
	})
	return pid
}

// nodeEvents lists the Events about the node, in every namespace.
func nodeEvents(ctx context.Context, t *testing.T) []corev1.Event {
	t.Helper()
	sel := fields.Set{"involvedObject.kind": "Node", "involvedObject.name": shared.NodeName}.AsSelector().String()
	list, err := shared.Client.CoreV1().Events(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		t.Fatalf("list node events: %v", err)
	}
	return list.Items
}

// waitNodeEvent waits for an Event on the node with the reason whose
// message names pid, and returns it.
func waitNodeEvent(ctx context.Context, t *testing.T, reason, pid string) corev1.Event {
	t.Helper()
	var found *corev1.Event
	var seen []string
	err := poll(ctx, func(ctx context.Context) (bool, error) {
		seen = seen[:0]
		for _, e := range nodeEvents(ctx, t) {
			seen = append(seen, fmt.Sprintf("%s: %s", e.Reason, e.Message))
			if e.Reason == reason && containsWord(e.Message, pid) {
				found = &e
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no %s Event naming PID %s on the node: %v; events:\n%s", reason, pid, err, strings.Join(seen, "\n"))
	}
	return *found
}

// containsWord reports whether s holds w with no digit on either side (a
// PID inside a longer number does not count).
func containsWord(s, w string) bool {
	for i := 0; ; {
		j := strings.Index(s[i:], w)
		if j < 0 {
			return false
		}
		j += i
		before := j == 0 || s[j-1] < '0' || s[j-1] > '9'
		end := j + len(w)
		after := end == len(s) || s[end] < '0' || s[end] > '9'
		if before && after {
			return true
		}
		i = j + 1
	}
}
