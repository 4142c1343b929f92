package usage

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
)

// TestMetrics: every series the tracker serves after a cycle with each
// class present, exactly, and promlint-clean.
func TestMetrics(t *testing.T) {
	r := newRig(t, true, func(c *Config, _ *Options) { c.Zombies.Action = ActionKill })
	r.trainRunning()
	r.kubelet.Set(pod("ml", "train-0", container("trainer", "nvidia.com/gpu", gpu0)), pod("ops", "monitor", container("agent", "")))
	r.host.podLogs("ops", "monitor", uidNoGPU)
	r.host.proc(4242, 77001, "python3", "S", podCgroup(uidGone))
	r.host.proc(5000, 88000, "python3", "S", podCgroup(uidTrain))
	r.host.proc(5001, 88001, "nvtop", "S", podCgroup(uidNoGPU))
	r.signals.ignore = map[uint32][]syscall.Signal{4242: {syscall.SIGTERM}}
	noMem := nvmlProc(5001, 0)
	noMem.UsedMemory.Status = nvmlowner.NotSupported // NVML_VALUE_NOT_AVAILABLE: no data
	samples := []nvmlowner.Sample{
		gpuSample(gpu0, 30000, 500, nvmlProc(5000, 28000), noMem, nvmlProc(5002, 100)),
		gpuSample(gpu1, 8500, 500, nvmlProc(4242, 8000)),
		gpuSample(gpu2, 0, 0),
	}
	samples[2].MIG = []nvmlowner.MIGSample{{UUID: mig0, FBUsed: nvmlowner.Value{V: 2048 * mib, Status: nvmlowner.OK}}}
	r.cycle(samples...)
	r.clock.Step(DefaultGrace)
	r.cycle(samples...)
	want := `
# HELP gpu_node_agent_gpu_process_findings Findings of the GPU process check that have lasted health.zombies.grace on a device (by UUID), by class (zombie, leaked, foreign): the device is unhealthy while one lasts.
# TYPE gpu_node_agent_gpu_process_findings gauge
gpu_node_agent_gpu_process_findings{class="foreign",device="` + gpu0 + `"} 1
gpu_node_agent_gpu_process_findings{class="leaked",device="` + mig0 + `"} 1
gpu_node_agent_gpu_process_findings{class="zombie",device="` + gpu1 + `"} 1
# HELP gpu_node_agent_gpu_process_memory_bytes Device memory held on a GPU or MIG device (by UUID), by class of the processes holding it; class leaked is memory allocated with no process on the device.
# TYPE gpu_node_agent_gpu_process_memory_bytes gauge
gpu_node_agent_gpu_process_memory_bytes{class="own",device="` + gpu0 + `"} 2.9360128e+10
gpu_node_agent_gpu_process_memory_bytes{class="unknown",device="` + gpu0 + `"} 1.048576e+08
gpu_node_agent_gpu_process_memory_bytes{class="zombie",device="` + gpu1 + `"} 8.388608e+09
gpu_node_agent_gpu_process_memory_bytes{class="leaked",device="` + mig0 + `"} 2.147483648e+09
# HELP gpu_node_agent_gpu_processes Processes NVML lists on a GPU or MIG device (by UUID), by class: own (of a pod assigned the device), zombie (of a pod that is gone, or of the host, on a device no running pod is assigned), foreign (of another pod or the host on an assigned device, or of a running pod on a device not assigned to it), unknown (not attributable this cycle). Current classes, before the grace period.
# TYPE gpu_node_agent_gpu_processes gauge
gpu_node_agent_gpu_processes{class="foreign",device="` + gpu0 + `"} 1
gpu_node_agent_gpu_processes{class="own",device="` + gpu0 + `"} 1
gpu_node_agent_gpu_processes{class="unknown",device="` + gpu0 + `"} 1
gpu_node_agent_gpu_processes{class="zombie",device="` + gpu1 + `"} 1
# HELP gpu_node_agent_gpu_process_attribution 1 when a source the GPU process check attributes processes from was usable in the last cycle: pod-resources (the kubelet's List), checkpoint (its device-manager checkpoint), pod-logs (its pod log directories: every running pod's UID), host-pids (the agent sees the host's PIDs).
# TYPE gpu_node_agent_gpu_process_attribution gauge
gpu_node_agent_gpu_process_attribution{source="checkpoint"} 1
gpu_node_agent_gpu_process_attribution{source="host-pids"} 1
gpu_node_agent_gpu_process_attribution{source="pod-logs"} 1
gpu_node_agent_gpu_process_attribution{source="pod-resources"} 1
# HELP gpu_node_agent_zombie_kills_total Signals sent to zombie GPU processes (health.zombies.action kill), by signal.
# TYPE gpu_node_agent_zombie_kills_total counter
gpu_node_agent_zombie_kills_total{signal="SIGTERM"} 1
# HELP gpu_node_agent_pod_resources_errors_total Failed kubelet pod-resources List calls (pod attribution).
# TYPE gpu_node_agent_pod_resources_errors_total counter
gpu_node_agent_pod_resources_errors_total 0
`
	if err := testutil.GatherAndCompare(r.reg, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
	problems, err := testutil.GatherAndLint(r.reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
}

// TestPodResourcesKubeletGone: a socket file nobody listens on (a crashed
// kubelet) is an error counted once per cycle; the tracker keeps going
// and its Assignments are unknown.
func TestPodResourcesKubeletGone(t *testing.T) {
	h := newHostTree(t)
	socket := PodResourcesSocketPath(h.root)
	if err := os.MkdirAll(filepath.Dir(socket), 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	if ul, ok := l.(*net.UnixListener); ok {
		ul.SetUnlinkOnClose(false)
	}
	l.Close()
	samples := newFakeSamples()
	tr, err := NewTracker(Config{Judge: true, HostRoot: h.root, DevicePluginDir: h.pluginDir(), PodResourcesSocket: socket},
		Options{Samples: samples, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	tr.SetNode(testNode())
	samples.publish(gpuSample(gpu0, 500, 500))
	tr.Cycle(t.Context())
	if got := testutil.ToFloat64(tr.pods.errors); got != 1 {
		t.Errorf("pod_resources_errors_total = %v, want 1", got)
	}
	if tr.Assignments() != nil {
		t.Error("Assignments with the kubelet down must be nil")
	}
	// No socket at all: not an error, attribution simply off.
	if err := os.Remove(socket); err != nil {
		t.Fatal(err)
	}
	samples.publish(gpuSample(gpu0, 500, 500))
	tr.Cycle(t.Context())
	if got := testutil.ToFloat64(tr.pods.errors); got != 1 {
		t.Errorf("pod_resources_errors_total without a socket = %v, want still 1", got)
	}
}
