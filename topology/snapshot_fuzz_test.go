package topology_test

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// FuzzParseSnapshot: no input panics, and whatever is accepted writes out
// and reads back as the same node.
func FuzzParseSnapshot(f *testing.F) {
	seeds, _ := filepath.Glob(filepath.Join("testdata", "*", "*.json"))
	for _, path := range seeds {
		if data, err := os.ReadFile(path); err == nil {
			f.Add(data)
		}
	}
	f.Add([]byte(`{"gpus":[{"index":0,"uuid":"GPU-0","numaNode":0,"pciBusID":"0000:07:00.0"}],"links":[{"a":0,"b":0}]}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, data []byte) {
		n, err := topology.ParseSnapshot(data)
		if err != nil {
			return
		}
		var b bytes.Buffer
		if err := topology.WriteSnapshot(&b, n); err != nil {
			t.Fatal(err)
		}
		back, err := topology.ParseSnapshot(b.Bytes())
		if err != nil {
			t.Fatalf("own output refused: %v\n%s", err, b.String())
		}
		if !reflect.DeepEqual(normalizeEmpty(back), normalizeEmpty(n)) {
			t.Fatalf("round trip changed the node:\n%+v\n%+v", n, back)
		}
	})
}

// normalizeEmpty makes empty and nil slices alike, as JSON does.
func normalizeEmpty(n *topology.Node) *topology.Node {
	out := *n
	if len(out.GPUs) == 0 {
		out.GPUs = nil
	}
	if len(out.Links) == 0 {
		out.Links = nil
	}
	if len(out.NICs) == 0 {
		out.NICs = nil
	}
	out.GPUs = append([]topology.GPU(nil), out.GPUs...)
	for i := range out.GPUs {
		g := &out.GPUs[i]
		if len(g.MIG) == 0 {
			g.MIG = nil
		}
		if len(g.PCIPath) == 0 {
			g.PCIPath = nil
		}
	}
	out.NICs = append([]topology.NIC(nil), out.NICs...)
	for i := range out.NICs {
		c := &out.NICs[i]
		if len(c.PCIPath) == 0 {
			c.PCIPath = nil
		}
		if len(c.NetDevs) == 0 {
			c.NetDevs = nil
		}
		if len(c.GPUs) == 0 {
			c.GPUs = nil
		}
	}
	return &out
}
