package conformance

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	v1 "k8s.io/api/core/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-node-agent/gpu-node-agent/test/internal/agentproc"
	"github.com/gpu-node-agent/gpu-node-agent/test/internal/devicemanager"
)

// replicaOf splits a time-sliced device ID "<uuid>::<n>" (NVIDIA's
// AnnotatedID) into the device it shares and its replica number.
func replicaOf(t *testing.T, id string) (string, int) {
	t.Helper()
	uuid, n, ok := strings.Cut(id, "::")
	r, err := strconv.Atoi(n)
	if !ok || err != nil {
		t.Fatalf("device ID %q is not <uuid>::<n>", id)
	}
	return uuid, r
}

// TestTimeSlicingRegistration: NVIDIA's time-slicing config file
// (--nvidia-config) on the demo node under mixed: the kubelet's
// registration server gets the replicas of the whole GPUs and of the
// 1g.10gb MIG devices, renamed <name>.shared, each device's replicas
// numbered 0..n-1 with its NUMA node; the other MIG profiles are served
// unshared. A GPU with a fault makes its replicas Unhealthy, and a MIG
// parent's fault its MIG devices' replicas, the rest staying Healthy.
func TestTimeSlicingRegistration(t *testing.T) {
	n := startNode(t, demoNode, "mixed", "--nvidia-config", "testdata/nvidia-time-slicing.yaml")
	got := n.waitCounts(t, map[string]int{
		"nvidia.com/gpu.shared": 6 * 4, "nvidia.com/mig-1g.10gb.shared": 9 * 3,
		"nvidia.com/mig-3g.40gb": 1, "nvidia.com/mig-2g.20gb": 1,
	})
	st := n.state(t)
	numaOf, parentOf := map[string]int{}, map[string]int{}
	for _, g := range st.GPUs {
		numaOf[g.UUID], parentOf[g.UUID] = g.NUMANode, g.Index
		for _, m := range g.MIG {
			numaOf[m.UUID], parentOf[m.UUID] = g.NUMANode, g.Index
		}
	}
	for res, replicas := range map[string]int{"nvidia.com/gpu.shared": 4, "nvidia.com/mig-1g.10gb.shared": 3} {
		perDevice := map[string][]int{}
		for _, d := range got[res] {
			uuid, r := replicaOf(t, d.ID)
			perDevice[uuid] = append(perDevice[uuid], r)
			numa, ok := numaOf[uuid]
			if !ok {
				t.Errorf("%s: %s shares %s, not a device of the node", res, d.ID, uuid)
				continue
			}
			if h := numaHistogram([]*pluginapi.Device{d}); h[numa] != 1 {
				t.Errorf("%s: %s NUMA %v, want its device's node %d", res, d.ID, d.Topology, numa)
			}
			if d.Health != pluginapi.Healthy {
				t.Errorf("%s: %s is %s", res, d.ID, d.Health)
			}
		}
		for uuid, rs := range perDevice {
			slices.Sort(rs)
			if want := []int{0, 1, 2, 3}[:replicas]; !slices.Equal(rs, want) {
				t.Errorf("%s: %s has replicas %v, want %v", res, uuid, rs, want)
			}
		}
	}

	// XID 79 (held until a reset) on GPU 2, a whole GPU, and on GPU 1,
	// whose seven 1g.10gb MIG devices are shared.
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	for _, gpu := range []int{2, 1} {
		if err := n.control.InjectFault(ctx, agentproc.Fault{Kind: "xid", GPU: gpu, XID: 79}); err != nil {
			t.Fatal(err)
		}
	}
	var last string
	_, err := n.kubelet.WaitFor(ctx, func(p map[string]devicemanager.Plugin) bool {
		bad := map[string]int{}
		wrong := 0
		for _, res := range []string{"nvidia.com/gpu.shared", "nvidia.com/mig-1g.10gb.shared"} {
			for _, d := range p[res].Devices {
				uuid, _, _ := strings.Cut(d.ID, "::")
				sick := parentOf[uuid] == 1 || parentOf[uuid] == 2
				if (d.Health != pluginapi.Healthy) != sick {
					wrong++
				}
				if d.Health != pluginapi.Healthy {
					bad[res]++
				}
			}
		}
		last = fmt.Sprintf("unhealthy %v, %d devices in the wrong state", bad, wrong)
		return wrong == 0
	})
	if err != nil {
		t.Fatalf("after XID 79 on GPUs 1 and 2: %s: %v", last, err)
	}
	t.Logf("after XID 79 on GPUs 1 and 2: %s", last)
}

// startSharingKubelet runs the kubelet's device manager (with its
// topology manager, policy none) and the agent on a simulated dgx-h100
// with the given config file; it returns the kubelet, the agent's
// plugin directory and a function admitting a pod (recorded as active
// when admitted).
func startSharingKubelet(t *testing.T, config string) (topologyKubelet, string, func(*v1.Pod) admitResult) {
	t.Helper()
	dir := pluginDir(t)
	pods := &admitted{}
	kl := startTopologyKubelet(t, filepath.Join(dir, devicemanager.KubeletSocket), dgxH100Machine(t), "none", "container", pods.active)
	agent, _ := startAgent(t, dir, "dgx-h100", "none", "--config", config)
	waitAllocatable(t, kl, agent, map[string]int{"nvidia.com/gpu": 16})
	return kl, dir, func(pod *v1.Pod) admitResult { return pods.admit(kl, pod) }
}

// pluginClient dials the agent's plugin for resource on its socket in dir
// (named as the agent names it); the connection closes when the test ends.
func pluginClient(t *testing.T, dir, resource string) pluginapi.DevicePluginClient {
	t.Helper()
	sock := filepath.Join(dir, "gpu-node-agent-"+strings.ReplaceAll(resource, "/", "-")+".sock")
	conn, err := grpc.NewClient("unix:"+sock,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", strings.TrimPrefix(addr, "unix:"))
		}))
	if err != nil {
		t.Fatalf("dial %s: %v", sock, err)
	}
	t.Cleanup(func() { conn.Close() })
	return pluginapi.NewDevicePluginClient(conn)
}

// allocateDirect calls Allocate on the agent's nvidia.com/gpu socket with
// one container asking for ids, as the kubelet would.
func allocateDirect(t *testing.T, dir string, ids ...string) (*pluginapi.AllocateResponse, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return pluginClient(t, dir, "nvidia.com/gpu").Allocate(ctx, &pluginapi.AllocateRequest{
		ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}},
	})
}

// TestTimeSlicingFailRequestsGreaterThanOne: with failRequestsGreaterThanOne
// the kubelet's device manager admits a pod asking for one replica and
// refuses one asking for two (Allocate fails: "maximum request size for
// shared resources is 1", NVIDIA's words), allocating it nothing; asked
// directly, Allocate refuses two replicas of one GPU and gives one.
func TestTimeSlicingFailRequestsGreaterThanOne(t *testing.T) {
	t.Logf("kubelet code: k8s.io/kubernetes %s", kubeletVersion)
	kl, dir, admit := startSharingKubelet(t, "testdata/sharing-fail-requests.yaml")
	one := devicePod("one-replica", map[string]int{"nvidia.com/gpu": 1})
	if r := admit(one); !r.Admit {
		t.Fatalf("pod asking for one replica refused: %s: %s", r.Reason, r.Message)
	}
	devs := kl.Devices(string(one.UID), "main")["nvidia.com/gpu"]
	if len(devs) != 1 {
		t.Fatalf("one-replica pod got %v", devs)
	}
	uuid, _ := replicaOf(t, devs[0].ID)
	if env, err := kl.Envs(one, "main"); err != nil || env["NVIDIA_VISIBLE_DEVICES"] != uuid {
		t.Errorf("one-replica pod: NVIDIA_VISIBLE_DEVICES %q (%v), want %s", env["NVIDIA_VISIBLE_DEVICES"], err, uuid)
	}

	two := devicePod("two-replicas", map[string]int{"nvidia.com/gpu": 2})
	r := admit(two)
	if r.Admit || !strings.Contains(r.Message, "maximum request size for shared resources is 1; found 2") {
		t.Fatalf("pod asking for two replicas: admit %v, %s: %s; want refused by Allocate", r.Admit, r.Reason, r.Message)
	}
	t.Logf("pod asking for two replicas refused: %s: %s", r.Reason, r.Message)
	if got := kl.Devices(string(two.UID), "main"); len(got) != 0 {
		t.Errorf("refused pod was allocated %s", fmtCounts(counts(got)))
	}

	// Two replicas of one GPU, asked of Allocate directly.
	var sameGPU []string
	for _, d := range kl.Allocatable()["nvidia.com/gpu"] {
		if u, _ := replicaOf(t, d.ID); u == uuid {
			sameGPU = append(sameGPU, d.ID)
		}
	}
	if len(sameGPU) != 2 {
		t.Fatalf("GPU %s has replicas %v, want 2", uuid, sameGPU)
	}
	if _, err := allocateDirect(t, dir, sameGPU...); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "maximum request size for shared resources is 1") {
		t.Errorf("Allocate(%v), two replicas of one GPU: %v; want InvalidArgument, maximum request size", sameGPU, err)
	}
	if resp, err := allocateDirect(t, dir, sameGPU[0]); err != nil || visible(resp.ContainerResponses[0])[0] != strings.Split(sameGPU[0], "::")[0] {
		t.Errorf("Allocate(%s): %v, %v; want its GPU", sameGPU[0], err, resp)
	}
}

// TestTimeSlicingSharesGPUs: without failRequestsGreaterThanOne, through
// the kubelet's device manager on 8 GPUs time-sliced in two:
//   - a pod asking for two replicas gets two GPUs, not two replicas of one
//     (the agent's preferred allocation);
//   - then fourteen pods asking for one each: the first six land on the
//     six GPUs nobody holds, the others share a GPU with an earlier pod,
//     until every GPU is held by two pods (two pods' containers get the
//     same GPU); a pod asking for one more is refused;
//   - asked directly, Allocate of two replicas of one GPU gives that GPU
//     once.
func TestTimeSlicingSharesGPUs(t *testing.T) {
	t.Logf("kubelet code: k8s.io/kubernetes %s", kubeletVersion)
	kl, dir, admit := startSharingKubelet(t, "testdata/sharing.yaml")
	gpusOf := func(pod *v1.Pod) []string {
		t.Helper()
		var out []string
		for _, d := range kl.Devices(string(pod.UID), "main")["nvidia.com/gpu"] {
			u, _ := replicaOf(t, d.ID)
			out = append(out, u)
		}
		slices.Sort(out)
		env, err := kl.Envs(pod, "main")
		if err != nil {
			t.Fatalf("pod %s: container options: %v", pod.Name, err)
		}
		if vis := sorted(strings.Split(env["NVIDIA_VISIBLE_DEVICES"], ",")); !slices.Equal(vis, slices.Compact(slices.Clone(out))) {
			t.Errorf("pod %s: NVIDIA_VISIBLE_DEVICES %v, want its replicas' GPUs %v", pod.Name, vis, out)
		}
		return out
	}

	two := devicePod("two-replicas", map[string]int{"nvidia.com/gpu": 2})
	if r := admit(two); !r.Admit {
		t.Fatalf("pod asking for two replicas refused: %s: %s", r.Reason, r.Message)
	}
	held := map[string][]string{} // GPU -> pods holding a replica of it
	twoGPUs := gpusOf(two)
	if len(slices.Compact(slices.Clone(twoGPUs))) != 2 {
		t.Fatalf("pod asking for two replicas got %v, want two GPUs", twoGPUs)
	}
	for _, g := range twoGPUs {
		held[g] = append(held[g], two.Name)
	}
	for i := range 14 {
		pod := devicePod(fmt.Sprintf("one-%d", i), map[string]int{"nvidia.com/gpu": 1})
		if r := admit(pod); !r.Admit {
			t.Fatalf("pod %s refused: %s: %s", pod.Name, r.Reason, r.Message)
		}
		g := gpusOf(pod)
		if len(g) != 1 {
			t.Fatalf("pod %s got %v", pod.Name, g)
		}
		if i < 6 && len(held[g[0]]) > 0 {
			t.Errorf("pod %s shares %s with %v while %d GPUs are free", pod.Name, g[0], held[g[0]], 6-i)
		}
		held[g[0]] = append(held[g[0]], pod.Name)
	}
	if len(held) != 8 {
		t.Errorf("pods spread over %d GPUs, want all 8: %v", len(held), held)
	}
	for g, pods := range held {
		if len(pods) != 2 {
			t.Errorf("GPU %s held by %v, want two pods (each GPU has two replicas, all are taken)", g, pods)
		}
	}
	t.Logf("GPU holders: %v", held)
	if n := len(kl.Allocatable()["nvidia.com/gpu"]); n != 16 {
		t.Errorf("allocatable %d, want 16", n)
	}
	full := devicePod("no-replica-left", map[string]int{"nvidia.com/gpu": 1})
	if r := admit(full); r.Admit {
		t.Errorf("pod admitted with every replica held: %v", kl.Devices(string(full.UID), "main"))
	}

	// Directly: two replicas of one GPU are that GPU, once (Allocate does
	// not track what the kubelet allocated).
	var g0 []string
	for _, d := range kl.Allocatable()["nvidia.com/gpu"] {
		if u, _ := replicaOf(t, d.ID); u == twoGPUs[0] {
			g0 = append(g0, d.ID)
		}
	}
	resp, err := allocateDirect(t, dir, g0...)
	if err != nil {
		t.Fatalf("Allocate(%v): %v", g0, err)
	}
	if got := visible(resp.ContainerResponses[0]); !slices.Equal(got, []string{twoGPUs[0]}) {
		t.Errorf("Allocate(%v): NVIDIA_VISIBLE_DEVICES %v, want %s once", g0, got, twoGPUs[0])
	}
}
