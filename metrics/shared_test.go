package metrics

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpu-node-agent/gpu-node-agent/sim"
	"github.com/gpu-node-agent/gpu-node-agent/usage"
	"github.com/gpu-node-agent/gpu-node-agent/usage/usagetest"
)

// Pods as NVIDIA's GPU Operator time-slicing guide runs them (a Deployment
// "time-slicing-verification" asking nvidia.com/gpu: 1 on a node whose
// GPUs are replicated), named as a ReplicaSet names its pods.
const (
	podTSA = "time-slicing-verification-7cdc7f87c5-lkd9d"
	podTSB = "time-slicing-verification-7cdc7f87c5-s8qwk"
)

// TestSharedDeviceLabels: a device's DCGM_ series name the pod holding it
// only when one container does; replicas of one device held by several
// containers label it with what they have in common (nothing for two
// pods), and gpu_node_agent_gpu_holders and gpu_node_agent_pod_gpu_replicas
// list them. The answer carries no per-pod values (NewAssignments has no
// NVML processes), so no gpu_node_agent_pod_gpu_processes series.
func TestSharedDeviceLabels(t *testing.T) {
	mn := newMockNode(t, 5, migLayout{4: {"3g.40gb", "1g.10gb"}})
	g := func(i int) string { return mn.node.GPUs[i].UUID }
	mig0 := mn.node.GPUs[4].MIG[0].UUID
	pods := newFakePods()
	c, reg := newTestCollector(t, mn, Config{Pods: pods})
	pods.set(
		&podresourcesv1.PodResources{Name: "train-0", Namespace: "ml", Containers: []*podresourcesv1.ContainerResources{
			container("trainer", "nvidia.com/gpu", g(0))}},
		// GPU 1: two pods of a Deployment, one replica each.
		&podresourcesv1.PodResources{Name: podTSA, Namespace: "default", Containers: []*podresourcesv1.ContainerResources{
			container("cuda-sample-vector-add", "nvidia.com/gpu", g(1)+"::0")}},
		&podresourcesv1.PodResources{Name: podTSB, Namespace: "default", Containers: []*podresourcesv1.ContainerResources{
			container("cuda-sample-vector-add", "nvidia.com/gpu", g(1)+"::3")}},
		// GPU 2: two containers of one pod.
		&podresourcesv1.PodResources{Name: "pair", Namespace: "ml", Containers: []*podresourcesv1.ContainerResources{
			container("left", "nvidia.com/gpu.shared", g(2)+"::0"), container("right", "nvidia.com/gpu.shared", g(2)+"::1")}},
		// GPU 3: one container with two replicas (failRequestsGreaterThanOne off).
		&podresourcesv1.PodResources{Name: "greedy", Namespace: "ml", Containers: []*podresourcesv1.ContainerResources{
			container("main", "nvidia.com/gpu.shared", g(3)+"::4", g(3)+"::5")}},
		// GPU 4: MIG replicas (mixed strategy).
		&podresourcesv1.PodResources{Name: "infer-a", Namespace: "serving", Containers: []*podresourcesv1.ContainerResources{
			container("server", "nvidia.com/mig-3g.40gb.shared", mig0+"::0")}},
		&podresourcesv1.PodResources{Name: "infer-b", Namespace: "serving", Containers: []*podresourcesv1.ContainerResources{
			container("server", "nvidia.com/mig-3g.40gb.shared", mig0+"::1")}},
	)
	collectNow(t, c)

	for _, tt := range []struct {
		name     string
		uuid, gi string
		want     [3]string
	}{
		{"one holder", g(0), "", [3]string{"train-0", "ml", "trainer"}},
		{"two pods share replicas", g(1), "", [3]string{}},
		{"two containers of one pod", g(2), "", [3]string{"pair", "ml", ""}},
		{"one container with two replicas", g(3), "", [3]string{"greedy", "ml", "main"}},
		{"two pods share a MIG device", g(4), "1", [3]string{}},
		{"unassigned MIG device", g(4), "2", [3]string{}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := podLabels(t, c, tt.uuid, tt.gi); got != tt.want {
				t.Errorf("DCGM_FI_DEV_FB_USED pod labels = %v, want %v", got, tt.want)
			}
		})
	}
	// A DCGM_ series per device, never one per holder.
	if n := testutil.CollectAndCount(c, "DCGM_FI_DEV_FB_USED"); n != 7 {
		t.Errorf("DCGM_FI_DEV_FB_USED series = %d, want 7 (5 GPUs, 2 MIG devices)", n)
	}
	dev := func(i int, gi, profile string) string {
		return `GPU_I_ID="` + gi + `",GPU_I_PROFILE="` + profile + `",UUID="` + g(i) + `",gpu="` + strconv.Itoa(i) + `"`
	}
	holder := func(i int, gi, profile, ctr, ns, pod string) string {
		return `GPU_I_ID="` + gi + `",GPU_I_PROFILE="` + profile + `",UUID="` + g(i) + `",container="` + ctr +
			`",gpu="` + strconv.Itoa(i) + `",namespace="` + ns + `",pod="` + pod + `"`
	}
	want := `# HELP gpu_node_agent_gpu_holders Containers the kubelet has assigned a GPU or MIG device (by UUID and GPU_I_ID) or replicas of it: above 1 the device is shared (time-slicing), and its DCGM_ series name no single pod.
# TYPE gpu_node_agent_gpu_holders gauge
gpu_node_agent_gpu_holders{` + dev(0, "", "") + `} 1
gpu_node_agent_gpu_holders{` + dev(1, "", "") + `} 2
gpu_node_agent_gpu_holders{` + dev(2, "", "") + `} 2
gpu_node_agent_gpu_holders{` + dev(3, "", "") + `} 1
gpu_node_agent_gpu_holders{` + dev(4, "", "") + `} 0
gpu_node_agent_gpu_holders{` + dev(4, "1", "3g.40gb") + `} 2
gpu_node_agent_gpu_holders{` + dev(4, "2", "1g.10gb") + `} 0
# HELP gpu_node_agent_pod_gpu_replicas Device IDs of a GPU or MIG device (by UUID and GPU_I_ID) the kubelet assigned to the container: 1 for the device itself or one time-slicing replica (<uuid>::<n>), n for n replicas.
# TYPE gpu_node_agent_pod_gpu_replicas gauge
gpu_node_agent_pod_gpu_replicas{` + holder(0, "", "", "trainer", "ml", "train-0") + `} 1
gpu_node_agent_pod_gpu_replicas{` + holder(1, "", "", "cuda-sample-vector-add", "default", podTSA) + `} 1
gpu_node_agent_pod_gpu_replicas{` + holder(1, "", "", "cuda-sample-vector-add", "default", podTSB) + `} 1
gpu_node_agent_pod_gpu_replicas{` + holder(2, "", "", "left", "ml", "pair") + `} 1
gpu_node_agent_pod_gpu_replicas{` + holder(2, "", "", "right", "ml", "pair") + `} 1
gpu_node_agent_pod_gpu_replicas{` + holder(3, "", "", "main", "ml", "greedy") + `} 2
gpu_node_agent_pod_gpu_replicas{` + holder(4, "1", "3g.40gb", "server", "serving", "infer-a") + `} 1
gpu_node_agent_pod_gpu_replicas{` + holder(4, "1", "3g.40gb", "server", "serving", "infer-b") + `} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "gpu_node_agent_gpu_holders", "gpu_node_agent_pod_gpu_replicas",
		"gpu_node_agent_pod_gpu_processes"); err != nil {
		t.Error(err)
	}

	// The kubelet does not answer: no holder series, DCGM_ series unlabelled.
	pods.set()
	collectNow(t, c)
	if n := testutil.CollectAndCount(c, "gpu_node_agent_gpu_holders", "gpu_node_agent_pod_gpu_replicas"); n != 0 {
		t.Errorf("holder series without a kubelet answer: %d", n)
	}
	if got := podLabels(t, c, g(0), ""); got != [3]string{} {
		t.Errorf("labels without a kubelet answer = %v", got)
	}
}

// TestSharedGPUPerPodUse is the whole chain on a simulated node, from the
// replica IDs alone: NVML processes (simulated, with utilisation), the
// sampler, the usage tracker attributing them through /proc/<pid>/cgroup
// and the kubelet's pod-resources answer and checkpoint (replica IDs
// "<uuid>::<n>", as the kubelet lists time-sliced devices), and the
// collector. Each pod sharing GPU 1 gets its own processes' memory and
// utilisation; the device's DCGM_ series name no pod; the MIG device's
// holders get memory only (NVML has no per-process utilisation with MIG).
func TestSharedGPUPerPodUse(t *testing.T) {
	spec, err := sim.Profile("dgx-h100", sim.WithMIG(2, "3g.40gb", "3g.40gb"))
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	node, err := sim.New(spec, root, nil)
	if err != nil {
		t.Fatal(err)
	}
	clk := clocktesting.NewFakeClock(time.Date(2026, 5, 4, 10, 0, 0, 0, time.UTC))
	node.SetUtilizationClock(clk.Now)
	layout := node.Spec()
	gpu0, gpu1, gpu2 := layout.GPUs[0].UUID, layout.GPUs[1].UUID, layout.GPUs[2].UUID
	mig := layout.GPUs[2].MIG[0].UUID

	const (
		uidTrain = "513cb897-0262-4868-826f-aa943ee45a38"
		uidA     = "0b6d5c1e-3c1f-4a8e-9a43-2f0d4a8e7c11"
		uidB     = "7f3e2d1c-9b8a-4c6d-8e5f-1a2b3c4d5e6f"
		uidInfA  = "94283d1b-ce5a-4797-bff8-0cf0c7143b2b"
		uidInfB  = "c3d4e5f6-a7b8-4c9d-8e0f-1a2b3c4d5e6f"
		ctr      = "cuda-sample-vector-add"
	)
	start := func(spec sim.ProcessSpec) {
		t.Helper()
		if _, err := node.StartProcess(spec); err != nil {
			t.Fatal(err)
		}
	}
	util := func(sm, mem, dec uint32) sim.ProcessUtilization {
		return sim.ProcessUtilization{SMUtil: sm, MemUtil: mem, DecUtil: dec}
	}
	start(sim.ProcessSpec{GPU: 0, MemoryMiB: 8000, Kind: sim.ProcessPod, PodUID: uidTrain, ProcessUtilization: util(90, 40, 0)})
	start(sim.ProcessSpec{GPU: 1, MemoryMiB: 3000, Kind: sim.ProcessPod, PodUID: uidA, ProcessUtilization: util(30, 12, 0)})
	start(sim.ProcessSpec{GPU: 1, MemoryMiB: 1000, Kind: sim.ProcessPod, PodUID: uidA, ProcessUtilization: util(10, 3, 5)})
	start(sim.ProcessSpec{GPU: 1, MemoryMiB: 2000, Kind: sim.ProcessPod, PodUID: uidB, ProcessUtilization: util(45, 15, 0)})
	// nvidia-smi run on the host: a foreign process, nobody's.
	start(sim.ProcessSpec{GPU: 1, MemoryMiB: 64, Kind: sim.ProcessHost, Comm: "nvidia-smi"})
	start(sim.ProcessSpec{GPU: 2, MIG: mig, MemoryMiB: 700, Kind: sim.ProcessPod, PodUID: uidInfA, ProcessUtilization: util(50, 0, 0)})

	pluginDir := filepath.Join(root, "var/lib/kubelet/device-plugins")
	writeCheckpoint(t, pluginDir, []checkpointEntry{
		{uidTrain, "trainer", "nvidia.com/gpu", gpu0},
		{uidA, ctr, "nvidia.com/gpu", gpu1 + "::0"},
		{uidB, ctr, "nvidia.com/gpu", gpu1 + "::2"},
		{uidInfA, "server", "nvidia.com/mig-3g.40gb", mig + "::0"},
		{uidInfB, "server", "nvidia.com/mig-3g.40gb", mig + "::1"},
	})
	socket := usage.PodResourcesSocketPath(root)
	usagetest.ServePodResources(t, socket,
		&podresourcesv1.PodResources{Name: "train-0", Namespace: "ml", Containers: []*podresourcesv1.ContainerResources{container("trainer", "nvidia.com/gpu", gpu0)}},
		&podresourcesv1.PodResources{Name: podTSA, Namespace: "default", Containers: []*podresourcesv1.ContainerResources{container(ctr, "nvidia.com/gpu", gpu1+"::0")}},
		&podresourcesv1.PodResources{Name: podTSB, Namespace: "default", Containers: []*podresourcesv1.ContainerResources{container(ctr, "nvidia.com/gpu", gpu1+"::2")}},
		&podresourcesv1.PodResources{Name: "infer-a", Namespace: "serving", Containers: []*podresourcesv1.ContainerResources{container("server", "nvidia.com/mig-3g.40gb", mig+"::0")}},
		&podresourcesv1.PodResources{Name: "infer-b", Namespace: "serving", Containers: []*podresourcesv1.ContainerResources{container("server", "nvidia.com/mig-3g.40gb", mig+"::1")}})

	sampler := newLibSampler(t, node.NVML(), layout, patientTimeout)
	tracker, err := usage.NewTracker(usage.Config{Judge: true, HostRoot: root, DevicePluginDir: pluginDir, PodResourcesSocket: socket,
		MIGDevicesServed: true, SimulatedPIDs: true}, usage.Options{Samples: sampler, Logger: testLogger(t), Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	tracker.SetNode(layout)
	reg := prometheus.NewPedanticRegistry()
	c, err := NewCollector(sampler, Config{Hostname: "node-1", Pods: tracker}, reg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	c.SetNode(layout)

	clk.Step(10 * time.Second)
	if sampler.SampleNow(context.Background()) == nil {
		t.Fatal("no sampling cycle")
	}
	tracker.Cycle(context.Background())
	c.Refresh(context.Background())

	if got := podLabels(t, c, gpu1, ""); got != [3]string{} {
		t.Errorf("shared GPU 1's DCGM_FI_DEV_FB_USED labels = %v, want none", got)
	}
	if got := podLabels(t, c, gpu0, ""); got != [3]string{"train-0", "ml", "trainer"} {
		t.Errorf("GPU 0's DCGM_FI_DEV_FB_USED labels = %v, want train-0's", got)
	}
	pod := func(gpu int, uuid, gi, profile, container, namespace, name string) string {
		return `GPU_I_ID="` + gi + `",GPU_I_PROFILE="` + profile + `",UUID="` + uuid + `",container="` + container +
			`",gpu="` + strconv.Itoa(gpu) + `",namespace="` + namespace + `",pod="` + name + `"`
	}
	train := pod(0, gpu0, "", "", "trainer", "ml", "train-0")
	a := pod(1, gpu1, "", "", ctr, "default", podTSA)
	b := pod(1, gpu1, "", "", ctr, "default", podTSB)
	gi := strconv.Itoa(layout.GPUs[2].MIG[0].GPUInstance)
	infA := pod(2, gpu2, gi, "3g.40gb", "server", "serving", "infer-a")
	infB := pod(2, gpu2, gi, "3g.40gb", "server", "serving", "infer-b")
	want := `# HELP gpu_node_agent_pod_gpu_decoder_utilization_ratio Share of the time the video decoder of a GPU (by UUID) ran work of the container's processes since the previous sampling cycle (NVML's per-process samples, summed over the container's processes). Not given for MIG devices or GPUs in MIG mode (NVML does not), nor when a process on the device could not be attributed.
# TYPE gpu_node_agent_pod_gpu_decoder_utilization_ratio gauge
gpu_node_agent_pod_gpu_decoder_utilization_ratio{` + train + `} 0
gpu_node_agent_pod_gpu_decoder_utilization_ratio{` + a + `} 0.05
gpu_node_agent_pod_gpu_decoder_utilization_ratio{` + b + `} 0
# HELP gpu_node_agent_pod_gpu_memory_used_bytes Device memory held by the container's processes on a GPU or MIG device it was assigned (by UUID and GPU_I_ID): NVML's per-process used memory, summed; absent when a process's is not known.
# TYPE gpu_node_agent_pod_gpu_memory_used_bytes gauge
gpu_node_agent_pod_gpu_memory_used_bytes{` + train + `} 8.388608e+09
gpu_node_agent_pod_gpu_memory_used_bytes{` + a + `} 4.194304e+09
gpu_node_agent_pod_gpu_memory_used_bytes{` + b + `} 2.097152e+09
gpu_node_agent_pod_gpu_memory_used_bytes{` + infA + `} 7.340032e+08
gpu_node_agent_pod_gpu_memory_used_bytes{` + infB + `} 0
# HELP gpu_node_agent_pod_gpu_memory_utilization_ratio Share of the time the memory controller (frame-buffer reads and writes) of a GPU (by UUID) ran work of the container's processes since the previous sampling cycle (NVML's per-process samples, summed over the container's processes). Not given for MIG devices or GPUs in MIG mode (NVML does not), nor when a process on the device could not be attributed.
# TYPE gpu_node_agent_pod_gpu_memory_utilization_ratio gauge
gpu_node_agent_pod_gpu_memory_utilization_ratio{` + train + `} 0.4
gpu_node_agent_pod_gpu_memory_utilization_ratio{` + a + `} 0.15
gpu_node_agent_pod_gpu_memory_utilization_ratio{` + b + `} 0.15
# HELP gpu_node_agent_pod_gpu_processes Processes of the container on a GPU or MIG device it was assigned (by UUID and GPU_I_ID), as NVML lists them; absent when a process on the device could not be attributed this cycle.
# TYPE gpu_node_agent_pod_gpu_processes gauge
gpu_node_agent_pod_gpu_processes{` + train + `} 1
gpu_node_agent_pod_gpu_processes{` + a + `} 2
gpu_node_agent_pod_gpu_processes{` + b + `} 1
gpu_node_agent_pod_gpu_processes{` + infA + `} 1
gpu_node_agent_pod_gpu_processes{` + infB + `} 0
# HELP gpu_node_agent_pod_gpu_sm_utilization_ratio Share of the time the SMs (3D/compute) of a GPU (by UUID) ran work of the container's processes since the previous sampling cycle (NVML's per-process samples, summed over the container's processes). Not given for MIG devices or GPUs in MIG mode (NVML does not), nor when a process on the device could not be attributed.
# TYPE gpu_node_agent_pod_gpu_sm_utilization_ratio gauge
gpu_node_agent_pod_gpu_sm_utilization_ratio{` + train + `} 0.9
gpu_node_agent_pod_gpu_sm_utilization_ratio{` + a + `} 0.4
gpu_node_agent_pod_gpu_sm_utilization_ratio{` + b + `} 0.45
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "gpu_node_agent_pod_gpu_decoder_utilization_ratio",
		"gpu_node_agent_pod_gpu_memory_used_bytes", "gpu_node_agent_pod_gpu_memory_utilization_ratio", "gpu_node_agent_pod_gpu_processes",
		"gpu_node_agent_pod_gpu_sm_utilization_ratio"); err != nil {
		t.Error(err)
	}
	// Every family, the new ones included, is promlint-clean (DCGM_'s
	// compatibility exceptions aside).
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	problems, err := promlint.NewWithMetricFamilies(mfs).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		if !strings.HasPrefix(p.Metric, "DCGM_FI_") || !dcgmCompatLint[p.Text] {
			t.Errorf("promlint: %s: %s", p.Metric, p.Text)
		}
	}
	// NVML gives no per-process utilisation on the MIG-enabled GPU 2,
	// and the no-data gauge says so; GPU 1's was read.
	for _, tt := range []struct {
		uuid string
		want bool
	}{{gpu2, true}, {gpu1, false}} {
		if got := hasSeries(t, reg, "gpu_node_agent_nvml_field_unavailable",
			map[string]string{"device": tt.uuid, "field": "process-utilization", "reason": "not-supported"}); got != tt.want {
			t.Errorf("%s: process-utilization unavailable series %v, want %v", tt.uuid, got, tt.want)
		}
	}
}

// checkpointEntry is one PodDeviceEntries entry of the kubelet's device
// manager checkpoint.
type checkpointEntry struct{ podUID, container, resource, id string }

// writeCheckpoint writes the device manager's checkpoint in the kubelet's
// format (per-NUMA DeviceIDs, as in usage/testdata/checkpoint).
func writeCheckpoint(t *testing.T, dir string, entries []checkpointEntry) {
	t.Helper()
	type entry struct {
		PodUID, ContainerName, ResourceName string
		DeviceIDs                           map[string][]string
		AllocResp                           []byte
	}
	var es []entry
	for _, e := range entries {
		es = append(es, entry{e.podUID, e.container, e.resource, map[string][]string{"0": {e.id}}, []byte("resp")})
	}
	b, err := json.Marshal(map[string]any{"Data": map[string]any{"PodDeviceEntries": es}, "Checksum": 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(usage.CheckpointPath(dir), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// hasSeries says whether reg has a series of family name with (at least)
// the given labels.
func hasSeries(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string) bool {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			for k, v := range labels {
				if got[k] != v {
					continue series
				}
			}
			return true
		}
	}
	return false
}
