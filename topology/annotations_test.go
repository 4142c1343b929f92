package topology

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

// loadProfile loads the simulator profile snapshot testdata/profiles/<name>.json
// (kept equal to package sim's profiles by its tests).
func loadProfile(t *testing.T, name string) *Node {
	t.Helper()
	n, err := LoadSnapshot(filepath.Join("testdata", "profiles", name+".json"))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestAnnotations(t *testing.T) {
	tests := []struct {
		name    string
		node    func(t *testing.T) *Node
		wantNIC map[string]string // NIC name → its exact JSON entry; nil: no annotation
		nics    int
	}{
		{
			name: "dgx-h100: one NIC per GPU under its switch",
			node: func(t *testing.T) *Node { return loadProfile(t, "dgx-h100") },
			wantNIC: map[string]string{
				"mlx5_0": `{"numaNode":0,"linkLayer":"InfiniBand","pciBusID":"0000:04:00.0","gpusByPCIe":{"single-switch":[0],"host-bridge":[1],"same-cpu":[2,3],"cross-cpu":[4,5,6,7]}}`,
				"mlx5_7": `{"numaNode":1,"linkLayer":"InfiniBand","pciBusID":"0000:b4:00.0","gpusByPCIe":{"single-switch":[7],"host-bridge":[6],"same-cpu":[4,5],"cross-cpu":[0,1,2,3]}}`,
			},
			nics: 8,
		},
		{
			name: "dgx-a100: two NICs per GPU pair, RoCE storage NIC on socket 1",
			node: func(t *testing.T) *Node { return loadProfile(t, "dgx-a100") },
			wantNIC: map[string]string{
				"mlx5_0": `{"numaNode":0,"linkLayer":"InfiniBand","pciBusID":"0000:05:00.0","gpusByPCIe":{"single-switch":[0,1],"same-cpu":[2,3],"cross-cpu":[4,5,6,7]}}`,
				"mlx5_9": `{"numaNode":1,"linkLayer":"Ethernet","pciBusID":"0000:c1:00.1","gpusByPCIe":{"same-cpu":[4,5,6,7],"cross-cpu":[0,1,2,3]}}`,
			},
			nics: 10,
		},
		{
			name: "unknown numa, no gpus, levels given in any order",
			node: func(*testing.T) *Node {
				return &Node{NICs: []NIC{
					{Name: "b", NUMANode: -1},
					{Name: "a", NUMANode: 1, GPUs: []NICGPULink{{3, PCIeCrossCPU}, {1, PCIeSameBoard}, {2, PCIeCrossCPU}, {0, "odd"}}},
				}}
			},
			wantNIC: map[string]string{
				"a": `{"numaNode":1,"gpusByPCIe":{"same-board":[1],"cross-cpu":[2,3],"odd":[0]}}`,
				"b": `{"numaNode":-1}`,
			},
			nics: 2,
		},
		{
			name: "no NICs",
			node: func(t *testing.T) *Node { return loadProfile(t, "pcie-8gpu") },
		},
		{
			name: "nil node",
			node: func(*testing.T) *Node { return nil },
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Annotations(tc.node(t))
			if tc.wantNIC == nil {
				if len(got) != 0 {
					t.Fatalf("Annotations = %v, want none", got)
				}
				return
			}
			if len(got) != 1 {
				t.Fatalf("Annotations has %d keys, want only %s: %v", len(got), AnnotationNICs, got)
			}
			v := got[AnnotationNICs]
			var entries map[string]json.RawMessage
			if err := json.Unmarshal([]byte(v), &entries); err != nil {
				t.Fatalf("%s is not a JSON object: %v\n%s", AnnotationNICs, err, v)
			}
			if len(entries) != tc.nics {
				t.Errorf("%d NICs in the annotation, want %d", len(entries), tc.nics)
			}
			for name, want := range tc.wantNIC {
				if got := string(entries[name]); got != want {
					t.Errorf("NIC %s:\n got %s\nwant %s", name, got, want)
				}
			}
			// Compact, and the same value for the same node.
			if strings.ContainsAny(v, " \n") {
				t.Errorf("value is not compact: %s", v)
			}
			if again := Annotations(tc.node(t))[AnnotationNICs]; again != v {
				t.Errorf("second call differs:\n%s\n%s", v, again)
			}
		})
	}
}

// TestAnnotationsSize: a large node (16 NICs × 16 GPUs, every GPU at a
// different level than its neighbours) stays far below the 256 KiB the API
// server allows for all of a node's annotations together.
func TestAnnotationsSize(t *testing.T) {
	n := &Node{}
	for i := range 16 {
		nic := NIC{Name: fmt.Sprintf("mlx5_%d", i), PCIBusID: fmt.Sprintf("0000:%02x:00.0", i), NUMANode: i % 2, LinkLayer: "InfiniBand"}
		for g := range 16 {
			nic.GPUs = append(nic.GPUs, NICGPULink{GPU: g, PCIe: pcieLevels[(i+g)%len(pcieLevels)]})
		}
		n.NICs = append(n.NICs, nic)
	}
	v := Annotations(n)[AnnotationNICs]
	t.Logf("16 NICs x 16 GPUs: %d bytes", len(v))
	if len(v) > 8<<10 {
		t.Errorf("annotation is %d bytes, want at most 8 KiB", len(v))
	}
}
