package conformance

import (
	"context"
	"maps"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
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
