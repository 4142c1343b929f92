package rdma

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpu-node-agent/gpu-node-agent/rdma/fakesys"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// TestNICs opens the NICs of a simulated tree (two InfiniBand HCAs, one
// port down) and checks what the agent wires from them: the resources, the
// NICs in the node model, the port watcher and the CDI spec, each only
// when a resource is configured.
func TestNICs(t *testing.T) {
	ib := []ResourceConfig{{Name: "ib", Selectors: Selectors{LinkTypes: []string{"infiniband"}}}}
	tests := []struct {
		name        string
		resources   []ResourceConfig
		wantServed  bool
		wantDevices int
	}{
		{name: "no rdma resource configured", wantDevices: 0},
		{name: "rdma/ib configured", resources: ib, wantServed: true, wantDevices: 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			if err := fakesys.Write(root, fixtures["portdown"]); err != nil {
				t.Fatal(err)
			}
			n := OpenNICs(Config{Resources: tc.resources}, NICsOptions{Root: root, Simulated: true})
			defer n.Close()
			if len(n.Devices()) != 2 {
				t.Fatalf("%d devices discovered, want 2", len(n.Devices()))
			}
			if n.Served() != tc.wantServed {
				t.Errorf("Served = %v, want %v", n.Served(), tc.wantServed)
			}

			node := &topology.Node{}
			n.AddToNode(node)
			if len(node.NICs) != 2 {
				t.Errorf("node model has %d NICs, want 2", len(node.NICs))
			}
			n.AddToNode(nil) // a failed GPU discovery: nothing to add to

			rs, err := n.Resources(nil, nil, false, nil)
			if err != nil {
				t.Fatal(err)
			}
			devices := 0
			for _, r := range rs {
				devices += len(r.Devices())
				if !tc.wantServed {
					t.Errorf("resource %s served without configuration", r.Name())
				}
			}
			if devices != tc.wantDevices {
				t.Errorf("%d devices served, want %d", devices, tc.wantDevices)
			}
			if tc.wantServed {
				// On a simulated node the host paths are under its root.
				resp, err := rs[0].Allocate(t.Context(), []string{rs[0].Devices()[0].ID})
				if err != nil {
					t.Fatal(err)
				}
				if len(resp.Devices) == 0 || !strings.HasPrefix(resp.Devices[0].HostPath, root+"/dev/infiniband/") {
					t.Errorf("device specs %v, want host paths under %s/dev/infiniband", resp.Devices, root)
				}
			}

			w, err := n.Watcher(func(string, bool, string) {}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if (w != nil) != tc.wantServed {
				t.Errorf("watcher %v, want one only when served", w)
			}

			if err := n.WriteCDISpec(); err != nil {
				t.Fatal(err)
			}
			specs, _ := filepath.Glob(filepath.Join(root, "var/run/cdi/*"))
			if (len(specs) > 0) != tc.wantServed {
				t.Errorf("CDI specs %v, want one only when served", specs)
			}
		})
	}
}

// TestNICsDiscoveryError: a failed discovery drops only the rdma
// resources, with the error, and the node model gets no NICs.
func TestNICsDiscoveryError(t *testing.T) {
	root := t.TempDir()
	// A file where the class directory should be: not "no RDMA", a failure.
	if err := os.MkdirAll(filepath.Join(root, "sys/class"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "sys/class/infiniband"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	n := OpenNICs(Config{Resources: []ResourceConfig{{Name: "ib"}}}, NICsOptions{Root: root, Simulated: true})
	defer n.Close()
	if _, err := n.Resources(nil, nil, false, nil); err == nil || !strings.Contains(err.Error(), "rdma discovery") {
		t.Fatalf("Resources error = %v, want the rdma discovery error", err)
	}
	node := &topology.Node{}
	n.AddToNode(node)
	if len(node.NICs) != 0 {
		t.Errorf("node model has %d NICs after a failed discovery", len(node.NICs))
	}
}
