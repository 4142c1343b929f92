package conformance

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-node-agent/gpu-node-agent/test/internal/agentproc"
	"github.com/gpu-node-agent/gpu-node-agent/test/internal/devicemanager"
)

// TestRDMAResources: with an RDMA resource in the config file, the agent
// registers rdma/ib next to the GPU resources: one device per simulated
// InfiniBand NIC (8 on a DGX H100, 4 per socket), and Allocate hands the
// container the RDMA device nodes.
func TestRDMAResources(t *testing.T) {
	n := startNode(t, "dgx-h100", "none", "--config", "testdata/rdma-ib.yaml")
	got := n.waitCounts(t, map[string]int{"nvidia.com/gpu": 8, "rdma/ib": 8})
	if h := numaHistogram(got["rdma/ib"]); !maps.Equal(h, map[int]int{0: 4, 1: 4}) {
		t.Errorf("rdma/ib devices per NUMA node = %v, want 4 and 4", h)
	}
	client, err := n.kubelet.Client("rdma/ib")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	id := ids(got["rdma/ib"])[0]
	resp, err := client.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{id}}}})
	if err != nil {
		t.Fatalf("Allocate(%s): %v", id, err)
	}
	cr := resp.ContainerResponses[0]
	if len(cr.Devices) == 0 && len(cr.CdiDevices) == 0 {
		t.Errorf("Allocate(%s) gave the container no device nodes or CDI devices: %+v", id, cr)
	}
	for _, d := range cr.Devices {
		t.Logf("rdma/ib %s: device %s -> %s (%s)", id, d.HostPath, d.ContainerPath, d.Permissions)
	}
}

// allocateRDMA allocates ids of resource for one container through the
// kubelet's plugin client and returns the ibdevs it was given (from
// RDMA_DEVICES) and its device specs, checked for shape: every node under
// /dev/infiniband, rw, with a host path ending in the container path.
func allocateRDMA(t *testing.T, n *node, resource string, ids ...string) ([]string, []*pluginapi.DeviceSpec) {
	t.Helper()
	client, err := n.kubelet.Client(resource)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := client.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}}})
	if err != nil {
		t.Fatalf("Allocate(%s %v): %v", resource, ids, err)
	}
	cr := resp.ContainerResponses[0]
	for _, d := range cr.Devices {
		if !strings.HasPrefix(d.ContainerPath, "/dev/infiniband/") || !strings.HasSuffix(d.HostPath, d.ContainerPath) || d.Permissions != "rw" {
			t.Errorf("%s device spec %+v", resource, d)
		}
	}
	ibdevs := strings.Split(cr.Envs["RDMA_DEVICES"], ",")
	sort.Strings(ibdevs)
	return ibdevs, cr.Devices
}

// TestRDMAModes: an exclusive and a shared RDMA resource side by side,
// through the kubelet's device-manager code. The exclusive one serves one
// device per NUMA-0 port and allocates just that port's nodes; the shared
// one serves its 10 slots on NUMA node 1 and any slot gives every NUMA-1
// port. A port going down makes every shared slot Unhealthy (a pod placed
// then would miss a rail) and leaves the exclusive resource alone; all
// slots are Healthy again once it is back.
func TestRDMAModes(t *testing.T) {
	n := startNode(t, "dgx-h100", "none", "--config", "testdata/rdma-modes.yaml")
	got := n.waitCounts(t, map[string]int{"nvidia.com/gpu": 8, "rdma/rail0": 4, "rdma/shared1": 10})
	if h := numaHistogram(got["rdma/rail0"]); !maps.Equal(h, map[int]int{0: 4}) {
		t.Errorf("rdma/rail0 devices per NUMA node = %v, want 4 on node 0", h)
	}
	if h := numaHistogram(got["rdma/shared1"]); !maps.Equal(h, map[int]int{1: 10}) {
		t.Errorf("rdma/shared1 slots per NUMA node = %v, want 10 on node 1", h)
	}
	rail0 := ids(got["rdma/rail0"])

	// Exclusive: one port, its own nodes (uverbs, umad, issm) and rdma_cm.
	ibdevs, specs := allocateRDMA(t, n, "rdma/rail0", rail0[2])
	if !slices.Equal(ibdevs, []string{rail0[2]}) || len(specs) != 4 {
		t.Errorf("rdma/rail0 Allocate(%s): RDMA_DEVICES %v, %d device specs; want just that port and 4 nodes", rail0[2], ibdevs, len(specs))
	}

	// Shared: any two slots give all four NUMA-1 ports, none of rail0's.
	slots := ids(got["rdma/shared1"])
	shared, specs := allocateRDMA(t, n, "rdma/shared1", slots[0], slots[7])
	if len(shared) != 4 || slices.ContainsFunc(shared, func(d string) bool { return slices.Contains(rail0, d) }) {
		t.Errorf("rdma/shared1 gave RDMA_DEVICES %v, want the 4 NUMA-1 ports and none of rail0 %v", shared, rail0)
	}
	if len(specs) != 4*3+1 {
		t.Errorf("rdma/shared1 gave %d device specs, want 13 (4 ports x uverbs/umad/issm + rdma_cm)", len(specs))
	}

	// A shared port goes down: every slot Unhealthy, rail0 untouched.
	fault := agentproc.Fault{Kind: "port-down", NIC: shared[1]}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := n.control.InjectFault(ctx, fault); err != nil {
		t.Fatal(err)
	}
	health := func(p map[string]devicemanager.Plugin, res string) (healthy, unhealthy int) {
		for _, d := range p[res].Devices {
			if d.Health == pluginapi.Healthy {
				healthy++
			} else {
				unhealthy++
			}
		}
		return healthy, unhealthy
	}
	wantHealth := func(what string, sharedHealthy bool) {
		t.Helper()
		var last string
		_, err := n.kubelet.WaitFor(ctx, func(p map[string]devicemanager.Plugin) bool {
			sh, su := health(p, "rdma/shared1")
			eh, eu := health(p, "rdma/rail0")
			last = fmt.Sprintf("shared1 %d healthy/%d unhealthy, rail0 %d/%d", sh, su, eh, eu)
			want := su == 10
			if sharedHealthy {
				want = sh == 10
			}
			return want && eh == 4
		})
		if err != nil {
			t.Fatalf("%s: %s: %v", what, last, err)
		}
	}
	wantHealth("port "+shared[1]+" down", false)
	if err := n.control.ClearFault(ctx, fault); err != nil {
		t.Fatal(err)
	}
	wantHealth("port "+shared[1]+" back", true)
}
