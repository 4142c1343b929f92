package nvmlowner

import (
	"bufio"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gpu-node-agent/gpu-node-agent/sim"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// TestGFDLabelsGolden discovers simulated nodes and compares their labels
// with testdata/labels/<case>.labels: the label sets gpu-feature-discovery
// v0.20.0 sets on such a node (no sharing configured, no timestamp), derived
// by hand from its rules in internal/lm and internal/resource (each file
// says how), plus the agent's own gpu-node-agent.io labels. They are never
// regenerated from this code.
func TestGFDLabelsGolden(t *testing.T) {
	h100MIG := []sim.ProfileOption{
		sim.WithMIG(0, "3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"),
		sim.WithMIG(1, "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb"),
	}
	var a100MIG []sim.ProfileOption
	for g := range 8 {
		a100MIG = append(a100MIG, sim.WithMIG(g, "1g.5gb", "1g.5gb", "1g.5gb", "1g.5gb", "1g.5gb", "1g.5gb", "1g.5gb"))
	}
	tests := []struct {
		golden   string
		profile  string
		opts     []sim.ProfileOption
		strategy string
	}{
		{"dgx-h100-mig-none", "dgx-h100", h100MIG, "none"},
		{"dgx-h100-mig-single", "dgx-h100", h100MIG, "single"},
		{"dgx-h100-mig-mixed", "dgx-h100", h100MIG, "mixed"},
		{"dgx-a100-mig-none", "dgx-a100", a100MIG, "none"},
		{"dgx-a100-mig-single", "dgx-a100", a100MIG, "single"},
		{"dgx-a100-mig-mixed", "dgx-a100", a100MIG, "mixed"},
		{"pcie-8gpu-none", "pcie-8gpu", nil, "none"},
		{"pcie-8gpu-single", "pcie-8gpu", nil, "single"},
		{"pcie-8gpu-mixed", "pcie-8gpu", nil, "mixed"},
		{"dgx-1v-none", "dgx-1v", nil, "none"},
		{"gb200-nvl72-none", "gb200-nvl72", nil, "none"},
	}
	for _, tc := range tests {
		t.Run(tc.golden, func(t *testing.T) {
			spec, err := sim.Profile(tc.profile, tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			node := discoverSim(t, spec)
			if why := topology.LabelsComplete(node); why != "" {
				t.Fatalf("discovered node is incomplete: %s", why)
			}
			got := topology.Labels(node, tc.strategy, nil)
			want := readLabels(t, filepath.Join("testdata", "labels", tc.golden+".labels"))
			for _, k := range slices.Sorted(maps.Keys(want)) {
				if g, ok := got[k]; !ok {
					t.Errorf("missing %s=%s", k, want[k])
				} else if g != want[k] {
					t.Errorf("%s=%s, want %s", k, g, want[k])
				}
			}
			for _, k := range slices.Sorted(maps.Keys(got)) {
				if _, ok := want[k]; !ok {
					t.Errorf("unexpected %s=%s", k, got[k])
				}
			}
		})
	}
}

// TestVGPULabels: a node whose GPUs carry the vGPU capability in their PCI
// configuration space is labelled vgpu.present with the host driver the
// capability names; a configuration space that cannot be read wholly (a
// caller without root reads 64 bytes) gives no vgpu label, as in GFD.
func TestVGPULabels(t *testing.T) {
	spec, err := sim.Profile("pcie-8gpu")
	if err != nil {
		t.Fatal(err)
	}
	spec.Host.VGPU = &topology.VGPU{Present: true, HostDriverVersion: "550.54.16", HostDriverBranch: "r550_00"}
	root := t.TempDir()
	n, err := sim.New(spec, root, nil)
	if err != nil {
		t.Fatal(err)
	}
	node, err := Discover(n.NVML(), root, nil)
	if err != nil {
		t.Fatal(err)
	}
	l := topology.Labels(node, "none", nil)
	for k, v := range map[string]string{
		topology.LabelVGPUPresent:    "true",
		topology.LabelVGPUHostDriver: "550.54.16",
		topology.LabelVGPUHostBranch: "r550_00",
	} {
		if l[k] != v {
			t.Errorf("%s=%q, want %q", k, l[k], v)
		}
	}

	cfg := filepath.Join(root, "sys", "bus", "pci", "devices", node.GPUs[0].PCIBusID, "config")
	if err := os.Chmod(cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg, make([]byte, 64), 0o644); err != nil {
		t.Fatal(err)
	}
	node, err = Discover(n.NVML(), root, nil)
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := topology.Labels(node, "none", nil)[topology.LabelVGPUPresent]; ok {
		t.Errorf("short config space: vgpu.present=%s, want no label", v)
	}
}

// discoverSim builds spec as a simulated node and discovers it.
func discoverSim(t *testing.T, spec *topology.Node) *topology.Node {
	t.Helper()
	root := t.TempDir()
	n, err := sim.New(spec, root, nil)
	if err != nil {
		t.Fatal(err)
	}
	node, err := Discover(n.NVML(), root, nil)
	if err != nil {
		t.Fatal(err)
	}
	return node
}

// readLabels reads key=value lines; # starts a comment line.
func readLabels(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("%s: %q is not key=value", path, line)
		}
		out[k] = v
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
