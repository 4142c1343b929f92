package agent

import (
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpu-node-agent/gpu-node-agent/health"
	"github.com/gpu-node-agent/gpu-node-agent/internal/freeport"
	"github.com/gpu-node-agent/gpu-node-agent/internal/testutil"
	"github.com/gpu-node-agent/gpu-node-agent/kubeapi"
	"github.com/gpu-node-agent/gpu-node-agent/sim"
	"github.com/gpu-node-agent/gpu-node-agent/usage"
	"github.com/gpu-node-agent/gpu-node-agent/usage/usagetest"
)

// TestUsageTrackerWiring: the usage tracker runs on the sampler's cycles,
// asks the kubelet's pod-resources socket under the host root, and the
// GPU metrics carry its pods; on a simulated node the PIDs are the
// simulator's, which signals them itself (kill mode stays on), and the
// fragmentation gauges count the GPUs no pod holds.
func TestUsageTrackerWiring(t *testing.T) {
	dir := testutil.ShortTempDir(t)
	startFakeKubelet(t, dir)
	cfg := defaults()
	cfg.Simulate = "pcie-8gpu"
	cfg.DevicePluginDir = dir
	cfg.MetricsAddress = freeport.Addr(t)
	cfg.SimControlAddress = ""
	cfg.MetricsInterval = 200 * time.Millisecond
	cfg.Zombies = usage.ZombiesConfig{Action: usage.ActionKill}
	logs := &syncBuffer{}
	a, err := openAgent(cfg, slog.New(slog.NewTextHandler(logs, nil)), nil)
	if err != nil {
		t.Fatal(err)
	}
	gpu0 := simOf(a).Spec().GPUs[0].UUID
	usagetest.ServePodResources(t, usage.PodResourcesSocketPath(a.hw.HostRoot()),
		&podresourcesv1.PodResources{Name: "train-0", Namespace: "ml", Containers: []*podresourcesv1.ContainerResources{
			{Name: "trainer", Devices: []*podresourcesv1.ContainerDevices{{ResourceName: "nvidia.com/gpu", DeviceIds: []string{gpu0}}}},
		}})
	startAgent(t, a)
	base := "http://" + cfg.MetricsAddress
	testutil.WaitFor(t, "GPU 0's series labelled with its pod", func() bool {
		_, body := httpGet(base + "/metrics")
		for _, line := range strings.Split(body, "\n") {
			if strings.HasPrefix(line, "DCGM_FI_DEV_FB_USED{") && strings.Contains(line, `UUID="`+gpu0+`"`) &&
				strings.Contains(line, `pod="train-0"`) && strings.Contains(line, `namespace="ml"`) && strings.Contains(line, `container="trainer"`) {
				return true
			}
		}
		return false
	})
	_, body := httpGet(base + "/metrics")
	for _, want := range []string{
		`gpu_node_agent_gpu_process_attribution{source="pod-resources"} 1`,
		`gpu_node_agent_gpu_process_attribution{source="host-pids"} 1`,
		"gpu_node_agent_pod_resources_errors_total 0",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	// The simulator signals its own processes: kill mode stays on.
	if strings.Contains(logs.String(), "health.zombies.action kill refused") {
		t.Errorf("kill mode refused on the simulator, which signals its processes; log:\n%s", logs)
	}
	// The fragmentation gauges follow the same cycle's assignments: GPU 0
	// is train-0's, the other seven are free.
	testutil.WaitFor(t, "gpu_node_agent_free_gpus 7", func() bool {
		_, body := httpGet(base + "/metrics")
		for _, line := range strings.Split(body, "\n") {
			if strings.HasPrefix(line, "gpu_node_agent_free_gpus{") && strings.HasSuffix(line, "} 7") {
				return true
			}
		}
		return false
	})
}

// TestUsageCheckDisabled: gpu-processes in health.disabledChecks leaves
// the tracker listing pods for the metrics only.
func TestUsageCheckDisabled(t *testing.T) {
	cfg := defaults()
	cfg.Simulate = "pcie-8gpu"
	cfg.DevicePluginDir = testutil.ShortTempDir(t)
	cfg.MetricsAddress = ""
	cfg.SimControlAddress = ""
	cfg.Health.DisabledChecks = []string{health.CheckGPUProcesses}
	logs := &syncBuffer{}
	a, err := openAgent(cfg, slog.New(slog.NewTextHandler(logs, nil)), nil)
	if err != nil {
		t.Fatal(err)
	}
	startAgent(t, a)
	testutil.WaitFor(t, "the check's disabled notice", func() bool {
		return strings.Contains(logs.String(), "gpu process check disabled")
	})
}

// TestUsageEventsOnly: with a node name but tainting, labels and the move
// advice off, the GPU process check still posts its Events about the Node
// (a host process's zombie memory on a GPU no pod holds, then its kill
// through the simulator), and nothing else is requested (no Node
// informer).
func TestUsageEventsOnly(t *testing.T) {
	cfg := defaults()
	cfg.Simulate = "pcie-8gpu"
	cfg.DevicePluginDir = testutil.ShortTempDir(t)
	cfg.MetricsAddress = ""
	cfg.SimControlAddress = ""
	cfg.MetricsInterval = 100 * time.Millisecond
	cfg.NodeName = "gpu-node-1"
	cfg.Taint.Mode = kubeapi.TaintOff
	cfg.NodeLabels = false
	cfg.MoveAdvice = false
	cfg.Zombies = usage.ZombiesConfig{Action: usage.ActionKill, Grace: 200 * time.Millisecond, KillGrace: time.Second}
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: cfg.NodeName}})
	cfg.KubeClients = func() (kubeapi.Clients, error) {
		return kubeapi.Clients{Core: client, Meta: fakeMetadata(t, cfg.NodeName)}, nil
	}
	a, err := openAgent(cfg, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	if a.node == nil {
		t.Fatal("no node object for the GPU process check's Events")
	}
	// The kubelet lists no pod: every GPU is unassigned.
	usagetest.ServePodResources(t, usage.PodResourcesSocketPath(a.hw.HostRoot()))
	pid, err := simOf(a).StartProcess(sim.ProcessSpec{GPU: 2, MemoryMiB: 1024, Kind: "host", HostCgroup: "/system.slice/train.service"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, _ := startAgent(t, a)
	for _, reason := range []string{usage.ReasonZombie, usage.ReasonKilled} {
		testutil.WaitFor(t, reason+" Event naming PID "+strconv.Itoa(int(pid)), func() bool {
			l, err := client.CoreV1().Events("default").List(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range l.Items {
				if e.Reason == reason && e.InvolvedObject.Name == cfg.NodeName && strings.Contains(e.Message, strconv.Itoa(int(pid))) {
					return true
				}
			}
			return false
		})
	}
	testutil.WaitFor(t, "the killed process gone from the simulator", func() bool {
		for _, p := range simOf(a).Processes() {
			if p.PID == pid {
				return false
			}
		}
		return true
	})
	for _, act := range client.Actions() {
		if act.GetResource().Resource == "nodes" {
			t.Errorf("events only, yet a Node request: %s", act.GetVerb())
		}
	}
}
