package conformance

import (
	"context"
	"encoding/json"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-node-agent/gpu-node-agent/test/internal/agentproc"
	"github.com/gpu-node-agent/gpu-node-agent/test/internal/devicemanager"
)

// topologyKubelet is the kubelet's topology manager with its device
// manager as the hint provider, wired as the kubelet's container manager
// wires them (pkg/kubelet/cm/container_manager_linux.go: NewManager, then
// NewManagerImpl with the topology manager as its affinity store, then
// AddHintProvider, then the device manager's Start). version_test.go
// builds it from its module's k8s.io/kubernetes.
type topologyKubelet interface {
	// Admit is the topology manager's pod admission (lifecycle
	// PodAdmitHandler): the device manager's hints for each resource, the
	// policy's merge, then the device manager's Allocate, which asks the
	// plugin for a preferred allocation within the chosen NUMA node and
	// calls Allocate on it.
	Admit(pod *v1.Pod) admitResult
	// Allocatable is every healthy device the device manager has from the
	// plugins, by resource, with the TopologyInfo they reported.
	Allocatable() map[string][]*pluginapi.Device
	// Devices is what the device manager allocated to a container, by
	// resource (what the pod-resources API reports).
	Devices(podUID, container string) map[string][]*pluginapi.Device
	// Envs is the environment the device manager hands the container
	// runtime for a container, from the plugins' Allocate responses.
	Envs(pod *v1.Pod, container string) (map[string]string, error)
}

// admitResult is the kubelet's lifecycle.PodAdmitResult.
type admitResult struct {
	Admit   bool
	Reason  string
	Message string
}

// topologyAffinityError is the Reason the topology manager gives a pod it
// cannot align (topologymanager.ErrorTopologyAffinity, the Type() of its
// TopologyAffinityError).
const topologyAffinityError = "TopologyAffinityError"

// dgxH100Machine is cadvisor's MachineInfo (the JSON of
// github.com/google/cadvisor/info/v1 in Kubernetes 1.34 and of
// github.com/google/cadvisor/lib/model in 1.37: the same fields and tags)
// for a DGX H100: two Xeon Platinum 8480C sockets of 56 cores with two
// threads each, one NUMA node per socket with 1 TiB, the SLIT distances a
// two-socket Sapphire Rapids reports. The simulated dgx-h100 puts GPUs 0-3
// and their four InfiniBand NICs on NUMA node 0 and the rest on node 1
// (TestDeviceLists, TestRDMAResources). The topology and device managers
// read only the nodes' IDs (and distances with prefer-closest-numa-nodes).
func dgxH100Machine(t *testing.T) []byte {
	t.Helper()
	type core struct {
		ID       int   `json:"core_id"`
		Threads  []int `json:"thread_ids"`
		SocketID int   `json:"socket_id"`
	}
	type node struct {
		ID        int      `json:"node_id"`
		Memory    uint64   `json:"memory"`
		Cores     []core   `json:"cores"`
		Distances []uint64 `json:"distances"`
	}
	const sockets, coresPerSocket, memPerNode = 2, 56, 1 << 40
	m := struct {
		NumCores       int    `json:"num_cores"`
		NumPhysical    int    `json:"num_physical_cores"`
		NumSockets     int    `json:"num_sockets"`
		MemoryCapacity uint64 `json:"memory_capacity"`
		Topology       []node `json:"topology"`
	}{NumCores: sockets * coresPerSocket * 2, NumPhysical: sockets * coresPerSocket, NumSockets: sockets, MemoryCapacity: sockets * memPerNode}
	for s := range sockets {
		n := node{ID: s, Memory: memPerNode, Distances: []uint64{10, 21}}
		if s == 1 {
			n.Distances = []uint64{21, 10}
		}
		// Linux numbers the first thread of every core first, socket by
		// socket, then the second threads.
		for c := range coresPerSocket {
			cpu := s*coresPerSocket + c
			n.Cores = append(n.Cores, core{ID: c, SocketID: s, Threads: []int{cpu, cpu + sockets*coresPerSocket}})
		}
		m.Topology = append(m.Topology, n)
	}
	data, err := json.Marshal(m)
	if err != nil {
		t.Fatalf("encode machine info: %v", err)
	}
	return data
}

// devicePod is a pod with one container "main" that asks for the given
// device counts (as limits, which is what the device manager reads).
func devicePod(name string, want map[string]int) *v1.Pod {
	res := v1.ResourceList{}
	for name, n := range want {
		res[v1.ResourceName(name)] = *resource.NewQuantity(int64(n), resource.DecimalSI)
	}
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name)},
		Spec: v1.PodSpec{Containers: []v1.Container{{
			Name:      "main",
			Resources: v1.ResourceRequirements{Limits: res, Requests: res},
		}}},
	}
}

// TestNUMAAlignment: the kubelet's own topology manager (single-numa-node
// policy, container and pod scope) and device manager, on the machine info
// of a two-socket DGX H100, against the agent's real sockets on a
// simulated dgx-h100 serving nvidia.com/gpu and rdma/ib. The hints come
// from the TopologyInfo the agent reports, the choice within a NUMA node
// from its GetPreferredAllocation. Steps run in order on one node:
//   - 5 GPUs (4 per NUMA node) are refused with a TopologyAffinityError
//     while every device is free, and nothing is allocated;
//   - 4 GPUs and 4 rdma/ib are admitted with all eight on one NUMA node;
//   - 2 GPUs and 2 rdma/ib are admitted on the other node (the first is
//     full), the GPUs being the ones the agent prefers among that node's
//     four: the kubelet asked it, since fewer are needed than are aligned.
func TestNUMAAlignment(t *testing.T) {
	t.Logf("kubelet code: k8s.io/kubernetes %s", kubeletVersion)
	const gpu, ib = "nvidia.com/gpu", "rdma/ib"
	for _, scope := range []string{"container", "pod"} {
		t.Run("single-numa-node/"+scope, func(t *testing.T) {
			dir := pluginDir(t)
			pods := &admitted{}
			kl := startTopologyKubelet(t, filepath.Join(dir, devicemanager.KubeletSocket), dgxH100Machine(t), "single-numa-node", scope, pods.active)
			agent, control := startAgent(t, dir, "dgx-h100", "none", "--config", "testdata/rdma-ib.yaml")
			all := waitAllocatable(t, kl, agent, map[string]int{gpu: 8, ib: 8})

			// The NUMA node of every device, from the agent's TopologyInfo,
			// checked against the simulated node's own layout.
			numaOf := map[string]int{}
			for res, devs := range all {
				for _, d := range devs {
					h := numaHistogram([]*pluginapi.Device{d})
					if h[0]+h[1] != 1 {
						t.Fatalf("%s device %s: NUMA nodes %v, want exactly one of the machine's nodes 0 and 1", res, d.ID, d.Topology)
					}
					numaOf[d.ID] = int(d.Topology.Nodes[0].ID)
				}
			}
			st := getState(t, control)
			simNUMA := map[string]int{}
			for _, g := range st.GPUs {
				simNUMA[g.UUID] = g.NUMANode
			}
			for _, nic := range st.NICs {
				simNUMA[nic.Name] = nic.NUMANode
			}
			for id, n := range numaOf {
				if want, ok := simNUMA[id]; !ok || n != want {
					t.Errorf("device %s: TopologyInfo NUMA node %d; the simulated node has it on %d (known %v)", id, n, want, ok)
				}
			}

			admit := func(pod *v1.Pod) admitResult { return pods.admit(kl, pod) }
			// allocated checks what the device manager gave the container
			// against the request and returns its NUMA nodes and GPUs.
			allocated := func(pod *v1.Pod, want map[string]int) (nodes []int, gpus []string) {
				t.Helper()
				got := kl.Devices(string(pod.UID), "main")
				if !maps.Equal(counts(got), want) {
					t.Fatalf("pod %s: allocated %s, want %s", pod.Name, fmtCounts(counts(got)), fmtCounts(want))
				}
				for res, devs := range got {
					for _, d := range devs {
						n := numaOf[d.ID]
						t.Logf("pod %s: %s %s on NUMA node %d", pod.Name, res, d.ID, n)
						if !slices.Contains(nodes, n) {
							nodes = append(nodes, n)
						}
					}
				}
				gpus = ids(got[gpu])
				envs, err := kl.Envs(pod, "main")
				if err != nil {
					t.Fatalf("pod %s: container options: %v", pod.Name, err)
				}
				if vis := strings.Split(envs["NVIDIA_VISIBLE_DEVICES"], ","); !slices.Equal(sorted(vis), gpus) {
					t.Errorf("pod %s: NVIDIA_VISIBLE_DEVICES = %v, want the allocated GPUs %v", pod.Name, vis, gpus)
				}
				if n := len(strings.Split(envs["RDMA_DEVICES"], ",")); n != want[ib] && want[ib] > 0 {
					t.Errorf("pod %s: RDMA_DEVICES = %q, want %d devices", pod.Name, envs["RDMA_DEVICES"], want[ib])
				}
				return nodes, gpus
			}

			// 5 GPUs: no single NUMA node has them, every device is free.
			five := devicePod("five-gpus", map[string]int{gpu: 5})
			if r := admit(five); r.Admit || r.Reason != topologyAffinityError {
				t.Fatalf("pod asking for 5 GPUs: admit %v, reason %q (%s); want refused with %s", r.Admit, r.Reason, r.Message, topologyAffinityError)
			} else {
				t.Logf("pod asking for 5 GPUs refused: %s: %s", r.Reason, r.Message)
			}
			if got := kl.Devices(string(five.UID), "main"); len(got) != 0 {
				t.Errorf("refused pod was allocated %s", fmtCounts(counts(got)))
			}

			// 4 GPUs and 4 rdma/ib: all eight on one NUMA node.
			want := map[string]int{gpu: 4, ib: 4}
			first := devicePod("four-and-four", want)
			if r := admit(first); !r.Admit {
				t.Fatalf("pod asking for 4 GPUs and 4 rdma/ib refused: %s: %s", r.Reason, r.Message)
			}
			nodes, _ := allocated(first, want)
			if len(nodes) != 1 {
				t.Fatalf("pod asking for 4 GPUs and 4 rdma/ib got devices on NUMA nodes %v, want one node", nodes)
			}
			full := nodes[0]

			// 2 GPUs and 2 rdma/ib: the other node; the GPUs the agent
			// prefers among its four.
			want = map[string]int{gpu: 2, ib: 2}
			second := devicePod("two-and-two", want)
			if r := admit(second); !r.Admit {
				t.Fatalf("pod asking for 2 GPUs and 2 rdma/ib refused: %s: %s", r.Reason, r.Message)
			}
			nodes, gpus := allocated(second, want)
			if len(nodes) != 1 || nodes[0] == full {
				t.Fatalf("pod asking for 2 GPUs and 2 rdma/ib got devices on NUMA nodes %v, want the one node other than %d", nodes, full)
			}
			var offered []string
			for _, d := range all[gpu] {
				if numaOf[d.ID] == nodes[0] {
					offered = append(offered, d.ID)
				}
			}
			if pref := preferredAllocation(t, dir, gpu, offered, 2); !slices.Equal(pref, gpus) {
				t.Errorf("pod asking for 2 GPUs got %v; the agent prefers %v of NUMA node %d's %v", gpus, pref, nodes[0], sorted(offered))
			}
		})
	}
}

// waitAllocatable waits until the device manager has exactly want devices
// per resource (the plugins registered and sent their lists). The device
// manager offers no notification, so it is polled.
func waitAllocatable(t *testing.T, kl topologyKubelet, agent *agentproc.Agent, want map[string]int) map[string][]*pluginapi.Device {
	t.Helper()
	deadline := time.After(waitTimeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		got := kl.Allocatable()
		if maps.Equal(counts(got), want) {
			return got
		}
		select {
		case <-tick.C:
		case <-agent.Exited():
			t.Fatalf("agent exited (%v) before serving %s", agent.Err(), fmtCounts(want))
		case <-deadline:
			t.Fatalf("device manager has %s, want %s", fmtCounts(counts(got)), fmtCounts(want))
		}
	}
}

// preferredAllocation asks the agent's plugin for resource directly (on its
// socket in dir, named as the agent names it) which size devices it
// prefers out of available.
func preferredAllocation(t *testing.T, dir, resource string, available []string, size int) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := pluginClient(t, dir, resource).GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{
		ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{AvailableDeviceIDs: available, AllocationSize: int32(size)}},
	})
	if err != nil {
		t.Fatalf("GetPreferredAllocation(%s, %v, %d): %v", resource, available, size, err)
	}
	return sorted(resp.ContainerResponses[0].DeviceIDs)
}

func sorted(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}

// flatten turns the device manager's resource -> device ID -> device maps
// into resource -> devices sorted by ID. The device manager keeps the ID
// only as the key (GetDevices fills in just the topology), so it is set on
// a copy.
func flatten[M ~map[string]D, D ~map[string]*pluginapi.Device](m M) map[string][]*pluginapi.Device {
	out := map[string][]*pluginapi.Device{}
	for res, devs := range m {
		for _, id := range slices.Sorted(maps.Keys(devs)) {
			d := &pluginapi.Device{ID: id}
			if src := devs[id]; src != nil {
				d.Health, d.Topology = src.Health, src.Topology
			}
			out[res] = append(out[res], d)
		}
	}
	return out
}
