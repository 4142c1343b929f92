package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// nodeLabels are what the kubelet puts on the node at registration.
var nodeLabels = map[string]string{}

// nicsAnnotation is the agent's node annotation describing each RDMA NIC
// and its PCIe distance to each GPU (topology.AnnotationNICs). The test
// spells the key and reads the value as an operator's script would.
const nicsAnnotation = "gpu-node-agent.io/nics"

// nicEntry is one NIC's entry in nicsAnnotation.
type nicEntry struct {
	NUMANode   int              `json:"numaNode"`
	LinkLayer  string           `json:"linkLayer"`
	PCIBusID   string           `json:"pciBusID"`
	GPUsByPCIe map[string][]int `json:"gpusByPCIe"`
}

// TestNodeNICAnnotation: the agent annotates the Node with its NICs' PCIe
// distance to the GPUs. The simulated DGX H100 has eight ConnectX-7
// InfiniBand NICs, mlx5_i under GPU i's PCIe switch (NUMA node 0 for GPUs
// 0-3, 1 for 4-7): each NIC has exactly that GPU at single-switch and every
// GPU at some level.
func TestNodeNICAnnotation(t *testing.T) {
	needAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var value string
	err := poll(ctx, func(ctx context.Context) (bool, error) {
		node, err := shared.Client.CoreV1().Nodes().Get(ctx, shared.NodeName, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		value = node.Annotations[nicsAnnotation]
		return value != "", nil
	})
	if err != nil {
		t.Fatalf("node %s has no %s annotation: %v", shared.NodeName, nicsAnnotation, err)
	}
	t.Logf("%s: %s", nicsAnnotation, value)
	var nics map[string]nicEntry
	if err := json.Unmarshal([]byte(value), &nics); err != nil {
		t.Fatalf("%s is not the documented JSON: %v", nicsAnnotation, err)
	}
	if len(nics) != 8 {
		t.Errorf("%d NICs in the annotation, want 8", len(nics))
	}
	for i := range 8 {
		name := fmt.Sprintf("mlx5_%d", i)
		nic, ok := nics[name]
		if !ok {
			t.Errorf("no NIC %s in the annotation", name)
			continue
		}
		if nic.LinkLayer != "InfiniBand" || nic.NUMANode != i/4 || nic.PCIBusID == "" {
			t.Errorf("%s: link layer %q, NUMA node %d, PCI bus ID %q; want InfiniBand, %d, set", name, nic.LinkLayer, nic.NUMANode, nic.PCIBusID, i/4)
		}
		if got := nic.GPUsByPCIe["single-switch"]; !slices.Equal(got, []int{i}) {
			t.Errorf("%s: GPUs at single-switch %v, want [%d]", name, got, i)
		}
		var all []int
		for _, gpus := range nic.GPUsByPCIe {
			all = append(all, gpus...)
		}
		slices.Sort(all)
		if !slices.Equal(all, []int{0, 1, 2, 3, 4, 5, 6, 7}) {
			t.Errorf("%s: GPUs by PCIe level %v, want each of the 8 GPUs once", name, nic.GPUsByPCIe)
		}
	}
}
