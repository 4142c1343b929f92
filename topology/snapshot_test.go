package topology_test

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/gpu-node-agent/gpu-node-agent/sim"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

func TestParseSnapshotMinimal(t *testing.T) {
	n, err := topology.ParseSnapshot([]byte(`{"gpus":[{"index":0,"uuid":"GPU-0","numaNode":0,"pciBusID":"0000:07:00.0"},
		{"index":1,"uuid":"GPU-1","numaNode":0,"pciBusID":"0000:0f:00.0"},{"index":2,"uuid":"GPU-2","numaNode":1},
		{"index":3,"uuid":"GPU-3","numaNode":1,"mig":[{"uuid":"MIG-a","profile":"3g.40gb","gi":1},{"uuid":"MIG-b","profile":"3g.40gb","gi":2}]}],
		"links":[{"a":0,"b":3,"nvlinks":2,"pcie":"single-switch"},{"a":2,"b":1,"pcie":"cross-cpu"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if len(n.GPUs) != 4 || n.GPUs[0].PCIBusID != "0000:07:00.0" {
		t.Fatalf("parsed %+v", n.GPUs)
	}
	if l := n.Link(3, 0); l.NVLinks != 2 || l.PCIe != topology.PCIeSingleSwitch {
		t.Errorf("Link(3,0) = %+v", l)
	}
	if l := n.Link(1, 2); l.A != 1 || l.B != 2 || l.PCIe != topology.PCIeCrossCPU {
		t.Errorf("a link given as 2-1 is stored as 1-2: %+v", l)
	}
	if l := n.Link(0, 1); l != (topology.Link{A: 0, B: 1}) {
		t.Errorf("Link of an unlisted pair = %+v, want the zero link", l)
	}
	g := n.GPUs[3]
	if !g.MIGEnabled || g.MIG[0].Index != 0 || g.MIG[1].Index != 1 {
		t.Errorf("mig gpu: enabled %t indices %d %d; want enabled, numbered by position", g.MIGEnabled, g.MIG[0].Index, g.MIG[1].Index)
	}
	if parent, m, ok := n.MIGParent("MIG-b"); !ok || parent.Index != 3 || m.GPUInstance != 2 {
		t.Errorf("MIGParent(MIG-b) = %v %v %t", parent, m, ok)
	}
	if g, ok := n.GPUByUUID("GPU-2"); !ok || g.Index != 2 {
		t.Errorf("GPUByUUID(GPU-2) = %v %t", g, ok)
	}
	if _, ok := n.GPUByUUID("GPU-9"); ok {
		t.Error("GPUByUUID found a GPU that is not there")
	}
}

func TestParseSnapshotErrors(t *testing.T) {
	const two = `{"index":0,"uuid":"GPU-a","numaNode":0,"pciBusID":"0000:07:00.0"},{"index":1,"uuid":"GPU-b","numaNode":0,"pciBusID":"0000:0f:00.0"}`
	tests := []struct {
		name string
		json string
		want string // the error must contain this: path and field
	}{
		{"not json", `{"gpus":[`, "invalid JSON"},
		{"top level not an object", `[1]`, "snapshot: want an object, got an array"},
		{"null", `null`, ""},
		{"empty object", `{}`, ""},
		{"trailing data", `{"gpus":[]} {}`, "trailing data"},
		{"unknown top-level field", `{"gpus":[],"colour":"green"}`, "colour: unknown field"},
		{"unknown gpu field", `{"gpus":[` + two + `,{"index":2,"uuid":"GPU-c","numaNode":0,"colour":1}]}`, "gpus[2].colour: unknown field"},
		{"wrong type", `{"gpus":[{"index":0,"uuid":"GPU-a","numaNode":"zero"}]}`, `gpus[0].numaNode: want an integer, got string "zero"`},
		{"fractional index", `{"gpus":[{"index":0.5,"uuid":"GPU-a","numaNode":0}]}`, "gpus[0].index: want an integer"},
		{"gpus not an array", `{"gpus":{}}`, "gpus: want an array"},
		{"duplicate uuid", `{"gpus":[` + two + `,{"index":2,"uuid":"GPU-a","numaNode":0}]}`, `gpus[2].uuid: duplicate "GPU-a"`},
		{"uuid without prefix", `{"gpus":[{"index":0,"uuid":"abc","numaNode":0}]}`, `gpus[0].uuid: "abc" is not a GPU UUID`},
		{"missing uuid", `{"gpus":[{"index":0,"numaNode":0}]}`, `gpus[0].uuid`},
		{"index out of order", `{"gpus":[{"index":1,"uuid":"GPU-a","numaNode":0}]}`, "gpus[0].index: 1, want 0"},
		{"upper-case bus id", `{"gpus":[{"index":0,"uuid":"GPU-a","numaNode":0,"pciBusID":"0000:0F:00.0"}]}`, "gpus[0].pciBusID"},
		{"duplicate bus id", `{"gpus":[{"index":0,"uuid":"GPU-a","numaNode":0,"pciBusID":"0000:07:00.0"},{"index":1,"uuid":"GPU-b","numaNode":0,"pciBusID":"0000:07:00.0"}]}`, `gpus[1].pciBusID: duplicate "0000:07:00.0"`},
		{"bad numa", `{"gpus":[{"index":0,"uuid":"GPU-a","numaNode":-2}]}`, "gpus[0].numaNode: -2"},
		{"path not ending at device", `{"gpus":[{"index":0,"uuid":"GPU-a","numaNode":0,"pciBusID":"0000:07:00.0","pciPath":["0000:00:01.1","0000:08:00.0"]}]}`, "gpus[0].pciPath: ends at 0000:08:00.0"},
		{"bad path element", `{"gpus":[{"index":0,"uuid":"GPU-a","numaNode":0,"pciPath":["root"]}]}`, `gpus[0].pciPath[0]: "root"`},
		{"link to unknown gpu", `{"gpus":[` + two + `],"links":[{"a":0,"b":7,"nvlinks":2}]}`, "links[0].b: unknown gpu index 7"},
		{"negative gpu index", `{"gpus":[` + two + `],"links":[{"a":-1,"b":1}]}`, "links[0].a: unknown gpu index -1"},
		{"link to itself", `{"gpus":[` + two + `],"links":[{"a":1,"b":1,"nvlinks":2}]}`, "links[0].b: a link joins two different gpus"},
		{"bad pcie level", `{"gpus":[` + two + `],"links":[{"a":0,"b":1,"pcie":"pcie-x"}]}`, `links[0].pcie: "pcie-x"`},
		{"duplicate pair", `{"gpus":[` + two + `],"links":[{"a":0,"b":1,"nvlinks":2},{"a":1,"b":0,"nvlinks":4}]}`, "links[1]: duplicate pair 0-1"},
		{"negative nvlinks", `{"gpus":[` + two + `],"links":[{"a":0,"b":1,"nvlinks":-2}]}`, "links[0].nvlinks: -2"},
		{"unknown link field", `{"gpus":[` + two + `],"links":[{"a":0,"b":1,"nvswitch":true}]}`, "links[0].nvswitch: unknown field"},
		{"mig uuid", `{"gpus":[{"index":0,"uuid":"GPU-a","numaNode":0,"mig":[{"uuid":"GPU-x","profile":"1g.10gb"}]}]}`, `gpus[0].mig[0].uuid: "GPU-x" is not a MIG UUID`},
		{"mig profile", `{"gpus":[{"index":0,"uuid":"GPU-a","numaNode":0,"mig":[{"uuid":"MIG-x","profile":"big"}]}]}`, `gpus[0].mig[0].profile: "big"`},
		{"mig instances reused", `{"gpus":[{"index":0,"uuid":"GPU-a","numaNode":0,"mig":[{"uuid":"MIG-x","profile":"1g.10gb","gi":7},{"uuid":"MIG-y","profile":"1g.10gb","gi":7}]}]}`, "gpus[0].mig[1].gi: gpu instance 7 / compute instance 0 used twice"},
		{"mig uuid reused across gpus", `{"gpus":[{"index":0,"uuid":"GPU-a","numaNode":0,"mig":[{"uuid":"MIG-x","profile":"1g.10gb"}]},{"index":1,"uuid":"GPU-b","numaNode":0,"mig":[{"uuid":"MIG-x","profile":"1g.10gb"}]}]}`, `gpus[1].mig[0].uuid: duplicate "MIG-x"`},
		{"mig listed while disabled", `{"gpus":[{"index":0,"uuid":"GPU-a","numaNode":0,"migEnabled":false,"mig":[{"uuid":"MIG-x","profile":"1g.10gb"}]}]}`, ""},
		{"fabric state unknown", `{"gpus":[{"index":0,"uuid":"GPU-a","numaNode":0,"fabric":{"state":"complete"}}]}`, `gpus[0].fabric.state: "complete" is not one of not-supported, not-started, in-progress, completed`},
		{"fabric state beyond nvml.h's names", `{"gpus":[{"index":0,"uuid":"GPU-a","numaNode":0,"fabric":{"state":"9"}}]}`, ""},
		{"fabric state beyond a byte", `{"gpus":[{"index":0,"uuid":"GPU-a","numaNode":0,"fabric":{"state":"256"}}]}`, `gpus[0].fabric.state: "256"`},
		{"fabric status negative", `{"gpus":[{"index":0,"uuid":"GPU-a","numaNode":0,"fabric":{"state":"completed","status":-1}}]}`, "gpus[0].fabric.status: want a non-negative integer, got -1"},
		{"fabric cluster upper case", `{"gpus":[{"index":0,"uuid":"GPU-a","numaNode":0,"fabric":{"state":"completed","clusterUUID":"7B968A6D-C8AA-45E1-9E07-E1E51BE99C31"}}]}`, `gpus[0].fabric.clusterUUID: "7B968A6D-C8AA-45E1-9E07-E1E51BE99C31" is not a non-zero UUID`},
		{"fabric cluster zero", `{"gpus":[{"index":0,"uuid":"GPU-a","numaNode":0,"fabric":{"state":"completed","clusterUUID":"00000000-0000-0000-0000-000000000000"}}]}`, "leave it out for none"},
		{"fabric cluster not a uuid", `{"gpus":[{"index":0,"uuid":"GPU-a","numaNode":0,"fabric":{"state":"completed","clusterUUID":"rack-7"}}]}`, `gpus[0].fabric.clusterUUID: "rack-7"`},
		{"fabric clique negative", `{"gpus":[{"index":0,"uuid":"GPU-a","numaNode":0,"fabric":{"state":"completed","cliqueID":-3}}]}`, "gpus[0].fabric.cliqueID: want a non-negative integer"},
		{"fabric unknown field", `{"gpus":[{"index":0,"uuid":"GPU-a","numaNode":0,"fabric":{"state":"completed","healthMask":1}}]}`, "gpus[0].fabric.healthMask: unknown field"},
		{"nic without name", `{"gpus":[` + two + `],"nics":[{"numaNode":0}]}`, "nics[0].name: required"},
		{"nic to unknown gpu", `{"gpus":[` + two + `],"nics":[{"name":"mlx5_0","numaNode":0,"gpus":[{"gpu":4,"pcie":"single-switch"}]}]}`, "nics[0].gpus[0].gpu: unknown gpu index 4"},
		{"nic bad level", `{"gpus":[` + two + `],"nics":[{"name":"mlx5_0","numaNode":0,"gpus":[{"gpu":0,"pcie":"near"}]}]}`, `nics[0].gpus[0].pcie: "near"`},
		{"duplicate nic", `{"gpus":[` + two + `],"nics":[{"name":"mlx5_0","numaNode":0},{"name":"mlx5_0","numaNode":0}]}`, `nics[1].name: duplicate "mlx5_0"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "snap.json")
			if err := os.WriteFile(path, []byte(tc.json), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := topology.LoadSnapshot(path)
			if tc.want == "" {
				// Accepted: a node without GPUs is a valid node, and a GPU
				// that lists MIG devices has MIG enabled whatever migEnabled
				// says, the devices being the stronger evidence.
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("accepted; want an error containing %q", tc.want)
			}
			if !strings.HasPrefix(err.Error(), path+": ") {
				t.Errorf("error %q does not start with the file name", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not contain %q", err, tc.want)
			}
		})
	}
}

func TestLoadSnapshotMissingFile(t *testing.T) {
	_, err := topology.LoadSnapshot(filepath.Join(t.TempDir(), "nope.json"))
	if err == nil || !strings.Contains(err.Error(), "nope.json") {
		t.Fatalf("error %v does not name the file", err)
	}
}

// TestSnapshotRoundTrip writes every profile (one with MIG), reads it back,
// writes it again, and simulates the written file: a dump must load as the
// same node and behave as the same simulated node.
func TestSnapshotRoundTrip(t *testing.T) {
	for _, name := range sim.Profiles() {
		t.Run(name, func(t *testing.T) {
			var opts []sim.ProfileOption
			if name == "dgx-h100" {
				opts = append(opts, sim.WithMIG(2, "1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"))
			}
			spec, err := sim.Profile(name, opts...)
			if err != nil {
				t.Fatal(err)
			}
			var first bytes.Buffer
			if err := topology.WriteSnapshot(&first, spec); err != nil {
				t.Fatal(err)
			}
			back, err := topology.ParseSnapshot(first.Bytes())
			if err != nil {
				t.Fatalf("parse own dump: %v", err)
			}
			if !reflect.DeepEqual(back, spec) {
				t.Fatalf("round trip changed the node:\n got  %+v\n want %+v", back, spec)
			}
			var second bytes.Buffer
			if err := topology.WriteSnapshot(&second, back); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(first.Bytes(), second.Bytes()) {
				t.Error("writing the same node twice gave different bytes")
			}
			// Discovered dump -> simulated node -> discovered again.
			dumped := discover(t, simulate(t, back))
			again := discover(t, simulate(t, dumped))
			if !reflect.DeepEqual(again.GPUs, dumped.GPUs) || !reflect.DeepEqual(again.Links, dumped.Links) {
				t.Error("simulating a discovered dump does not discover the same node")
			}
		})
	}
}

func TestWriteSnapshotStableOrder(t *testing.T) {
	n := &topology.Node{
		GPUs:  []topology.GPU{{Index: 1, UUID: "GPU-b"}, {Index: 0, UUID: "GPU-a"}},
		Links: []topology.Link{{A: 1, B: 2}, {A: 0, B: 2}, {A: 0, B: 1}},
		NICs:  []topology.NIC{{Name: "mlx5_1"}, {Name: "mlx5_0"}},
	}
	var b bytes.Buffer
	if err := topology.WriteSnapshot(&b, n); err != nil {
		t.Fatal(err)
	}
	s := b.String()
	order := []string{`"GPU-a"`, `"GPU-b"`, `"mlx5_0"`, `"mlx5_1"`}
	last := -1
	for _, want := range order {
		i := strings.Index(s, want)
		if i < last {
			t.Errorf("%s out of order in\n%s", want, s)
		}
		last = i
	}
	if n.GPUs[0].UUID != "GPU-b" {
		t.Error("WriteSnapshot reordered its input")
	}
	if !strings.HasSuffix(s, "}\n") || !strings.Contains(s, "\n  \"gpus\"") {
		t.Errorf("not indented JSON with a trailing newline:\n%s", s)
	}
}
