package topology_test

import (
	"fmt"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

const (
	clusterA = "7b968a6d-c8aa-45e1-9e07-e1e51be99c31"
	clusterB = "3f2c8a6e-0b41-4d7e-9c15-5e8b7a1c2d90"
)

// registered is a GPU's fabric after a successful registration in cluster
// with clique.
func registered(cluster string, clique uint32) *topology.Fabric {
	return &topology.Fabric{State: topology.FabricCompleted, ClusterUUID: cluster, CliqueID: clique}
}

// fabricNode is a node of GPUs with the given fabrics, GPU i in MIG mode
// where mig[i] is set.
func fabricNode(fabrics []*topology.Fabric, mig ...int) *topology.Node {
	n := &topology.Node{}
	for i, f := range fabrics {
		n.GPUs = append(n.GPUs, topology.GPU{Index: i, UUID: fmt.Sprintf("GPU-%d", i), Model: "NVIDIA B200", Fabric: f})
	}
	for _, i := range mig {
		n.GPUs[i].MIGCapable, n.GPUs[i].MIGEnabled = true, true
		n.GPUs[i].MIG = []topology.MIGDevice{{UUID: "MIG-x", Profile: "7g.180gb"}}
	}
	return n
}

// TestClique covers the gpu.clique rules (topology.Clique): the label only
// while every GPU reports a completed, successful registration in the same
// multi-node NVLink domain.
func TestClique(t *testing.T) {
	inProgress := &topology.Fabric{State: topology.FabricInProgress, Status: uint32(nvml.ERROR_NOT_READY)}
	failed := &topology.Fabric{State: topology.FabricCompleted, Status: uint32(nvml.ERROR_INSUFFICIENT_RESOURCES), ClusterUUID: clusterA, CliqueID: 1}
	singleNode := &topology.Fabric{State: topology.FabricCompleted}
	tests := []struct {
		name    string
		fabrics []*topology.Fabric
		mig     []int
		want    string
	}{
		{"every gpu in one domain", []*topology.Fabric{registered(clusterA, 1), registered(clusterA, 1), registered(clusterA, 1), registered(clusterA, 1)}, nil, clusterA + ".1"},
		{"clique id in decimal", []*topology.Fabric{registered(clusterB, 4294967295), registered(clusterB, 4294967295)}, nil, clusterB + ".4294967295"},
		{"clique 0 in a multi-node domain", []*topology.Fabric{registered(clusterB, 0)}, nil, clusterB + ".0"},
		{"a gpu in MIG mode counts as its parent", []*topology.Fabric{registered(clusterA, 3), registered(clusterA, 3)}, []int{1}, clusterA + ".3"},
		// GFD skips a GPU still registering and labels from the others;
		// the agent removes the label until every GPU has registered.
		{"one gpu still registering", []*topology.Fabric{registered(clusterA, 1), inProgress, registered(clusterA, 1), registered(clusterA, 1)}, nil, ""},
		{"every gpu registering", []*topology.Fabric{inProgress, inProgress}, nil, ""},
		{"registration not started", []*topology.Fabric{registered(clusterA, 1), {State: topology.FabricNotStarted}}, nil, ""},
		{"registration completed with an error", []*topology.Fabric{registered(clusterA, 1), failed}, nil, ""},
		// GFD: "Clique IDs are non-unique", no label.
		{"two cliques", []*topology.Fabric{registered(clusterA, 1), registered(clusterA, 2)}, nil, ""},
		{"two clusters", []*topology.Fabric{registered(clusterA, 1), registered(clusterB, 1)}, nil, ""},
		// A DGX H100: registered, cluster UUID all zero (NVIDIA's DRA
		// driver: "NVLink-capable, but not MNNVL-capable").
		{"single-node nvswitch system", []*topology.Fabric{singleNode, singleNode, singleNode}, nil, ""},
		{"no fabric (NOT_SUPPORTED)", []*topology.Fabric{nil, nil}, nil, ""},
		// GFD would label from the GPUs that have one.
		{"one gpu without fabric", []*topology.Fabric{registered(clusterA, 1), nil}, nil, ""},
		{"state nvml.h does not name", []*topology.Fabric{{State: "9", ClusterUUID: clusterA}}, nil, ""},
		{"no gpus", nil, nil, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := fabricNode(tc.fabrics, tc.mig...)
			if got := topology.Clique(n); got != tc.want {
				t.Fatalf("Clique = %q, want %q", got, tc.want)
			}
			l := topology.Labels(n, "", nil)
			got, ok := l[topology.LabelGPUClique]
			if tc.want == "" {
				if ok {
					t.Errorf("label %s=%s, want none", topology.LabelGPUClique, got)
				}
				return
			}
			if got != tc.want {
				t.Errorf("label %s=%q, want %q", topology.LabelGPUClique, got, tc.want)
			}
			if errs := validation.IsValidLabelValue(got); len(errs) > 0 {
				t.Errorf("label value %q is not a valid label value: %v", got, errs)
			}
		})
	}
	if got := topology.Clique(nil); got != "" {
		t.Errorf("Clique(nil) = %q", got)
	}
}

func TestFabricState(t *testing.T) {
	for v, want := range map[uint8]topology.FabricState{
		nvml.GPU_FABRIC_STATE_NOT_SUPPORTED: topology.FabricNotSupported,
		nvml.GPU_FABRIC_STATE_NOT_STARTED:   topology.FabricNotStarted,
		nvml.GPU_FABRIC_STATE_IN_PROGRESS:   topology.FabricInProgress,
		nvml.GPU_FABRIC_STATE_COMPLETED:     topology.FabricCompleted,
		200:                                 "200",
	} {
		got := topology.FabricStateOf(v)
		if got != want {
			t.Errorf("FabricStateOf(%d) = %q, want %q", v, got, want)
		}
		if back, ok := got.NVML(); !ok || back != v {
			t.Errorf("%q.NVML() = %d %t, want %d", got, back, ok, v)
		}
	}
	for _, bad := range []topology.FabricState{"", "complete", "-1", "256"} {
		if v, ok := bad.NVML(); ok {
			t.Errorf("%q.NVML() = %d, want not a state", bad, v)
		}
	}
}

func TestFabricClusterUUID(t *testing.T) {
	if got := topology.FabricClusterUUID([16]uint8{}); got != "" {
		t.Errorf("zero bytes: %q, want none", got)
	}
	b := [16]uint8{0x7b, 0x96, 0x8a, 0x6d, 0xc8, 0xaa, 0x45, 0xe1, 0x9e, 0x07, 0xe1, 0xe5, 0x1b, 0xe9, 0x9c, 0x31}
	if got := topology.FabricClusterUUID(b); got != clusterA {
		t.Errorf("FabricClusterUUID = %q, want %q (GFD's form)", got, clusterA)
	}
}
