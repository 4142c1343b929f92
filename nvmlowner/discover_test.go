package nvmlowner_test

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
	"github.com/gpu-node-agent/gpu-node-agent/sim"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

func simulate(t *testing.T, spec *topology.Node) *sim.Node {
	t.Helper()
	n, err := sim.New(spec, t.TempDir(), nil)
	if err != nil {
		t.Fatalf("sim.New: %v", err)
	}
	return n
}

func discover(t *testing.T, n *sim.Node) *topology.Node {
	t.Helper()
	got, err := nvmlowner.Discover(n.NVML(), n.HostRoot(), nil)
	if err != nil {
		t.Fatalf("Discover: %v", err)
	}
	return got
}

type pairWant struct {
	a, b    int
	nvlinks int
	pcie    topology.PCIeLevel
}

// TestDiscoverProfiles checks discovery on every simulated profile twice:
// against facts about the real machines written out here (so a mistake the
// simulator and discovery share cannot pass), and field by field against
// the profile's own spec (round trip).
func TestDiscoverProfiles(t *testing.T) {
	tests := []struct {
		profile string
		gpus    int
		// everyPair is the NVLink count of every pair (NVSwitch fabrics);
		// -1 when pairs differ.
		everyPair int
		pairs     []pairWant
	}{
		{"dgx-a100", 8, 12, []pairWant{
			{0, 1, 12, topology.PCIeSingleSwitch}, {0, 2, 12, topology.PCIeSameCPU}, {0, 4, 12, topology.PCIeCrossCPU}, {6, 7, 12, topology.PCIeSingleSwitch},
		}},
		{"dgx-h100", 8, 18, []pairWant{
			{0, 1, 18, topology.PCIeHostBridge}, {0, 2, 18, topology.PCIeSameCPU}, {3, 4, 18, topology.PCIeCrossCPU},
		}},
		{"dgx-h200", 8, 18, []pairWant{{0, 1, 18, topology.PCIeHostBridge}, {1, 5, 18, topology.PCIeCrossCPU}}},
		{"dgx-b200", 8, 18, []pairWant{{2, 3, 18, topology.PCIeHostBridge}, {0, 7, 18, topology.PCIeCrossCPU}}},
		{"gb200-nvl72", 4, 18, []pairWant{{0, 1, 18, topology.PCIeSameCPU}, {1, 2, 18, topology.PCIeCrossCPU}}},
		{"dgx-2", 16, 6, []pairWant{
			{0, 1, 6, topology.PCIeSingleSwitch}, {0, 2, 6, topology.PCIeMultiSwitch}, {0, 4, 6, topology.PCIeHostBridge},
			{0, 8, 6, topology.PCIeCrossCPU}, {7, 15, 6, topology.PCIeCrossCPU}, {14, 15, 6, topology.PCIeSingleSwitch},
		}},
		{"dgx-1v", 8, -1, []pairWant{
			{0, 1, 1, topology.PCIeSingleSwitch}, {0, 2, 1, topology.PCIeHostBridge}, {0, 3, 2, topology.PCIeHostBridge},
			{0, 4, 2, topology.PCIeCrossCPU}, {0, 5, 0, topology.PCIeCrossCPU},
		}},
		{"pcie-8gpu", 8, 0, []pairWant{
			{0, 1, 0, topology.PCIeSingleSwitch}, {0, 2, 0, topology.PCIeMultiSwitch}, {1, 3, 0, topology.PCIeMultiSwitch},
			{0, 4, 0, topology.PCIeCrossCPU}, {4, 5, 0, topology.PCIeSingleSwitch},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.profile, func(t *testing.T) {
			spec, err := sim.Profile(tc.profile)
			if err != nil {
				t.Fatal(err)
			}
			got := discover(t, simulate(t, spec))
			if len(got.GPUs) != tc.gpus {
				t.Fatalf("discovered %d gpus, want %d", len(got.GPUs), tc.gpus)
			}
			for i, g := range got.GPUs {
				wantNUMA := 0
				if i >= tc.gpus/2 {
					wantNUMA = 1
				}
				if g.NUMANode != wantNUMA {
					t.Errorf("gpu %d numa node %d, want %d", i, g.NUMANode, wantNUMA)
				}
				if g.Lost {
					t.Errorf("gpu %d marked lost", i)
				}
				if !reflect.DeepEqual(g, spec.GPUs[i]) {
					t.Errorf("gpu %d:\n got  %+v\n want %+v", i, g, spec.GPUs[i])
				}
			}
			for a := 0; a < tc.gpus; a++ {
				for b := a + 1; b < tc.gpus; b++ {
					if l := got.Link(a, b); tc.everyPair >= 0 && l.NVLinks != tc.everyPair {
						t.Errorf("pair %d-%d: %d nvlinks, want %d", a, b, l.NVLinks, tc.everyPair)
					}
				}
			}
			for _, p := range tc.pairs {
				l := got.Link(p.a, p.b)
				if l.NVLinks != p.nvlinks || l.PCIe != p.pcie {
					t.Errorf("pair %d-%d: nvlinks %d pcie %q, want %d %q", p.a, p.b, l.NVLinks, l.PCIe, p.nvlinks, p.pcie)
				}
			}
			if !reflect.DeepEqual(got.Links, spec.Links) {
				t.Errorf("links differ from the profile:\n got  %+v\n want %+v", got.Links, spec.Links)
			}
		})
	}
}

// TestDiscoverDGX1VCubeMesh pins the DGX-1 hybrid cube-mesh exactly: the
// eight NV2 pairs, the eight NV1 pairs, and nothing else.
func TestDiscoverDGX1VCubeMesh(t *testing.T) {
	spec, err := sim.Profile("dgx-1v")
	if err != nil {
		t.Fatal(err)
	}
	got := discover(t, simulate(t, spec))
	want := map[[2]int]int{}
	for _, p := range [][2]int{{0, 3}, {0, 4}, {1, 2}, {1, 5}, {2, 3}, {4, 7}, {5, 6}, {6, 7}} {
		want[p] = 2
	}
	for _, p := range [][2]int{{0, 1}, {0, 2}, {1, 3}, {2, 6}, {3, 7}, {4, 5}, {4, 6}, {5, 7}} {
		want[p] = 1
	}
	for a := 0; a < 8; a++ {
		for b := a + 1; b < 8; b++ {
			if n := got.Link(a, b).NVLinks; n != want[[2]int{a, b}] {
				t.Errorf("pair %d-%d: %d nvlinks, want %d", a, b, n, want[[2]int{a, b}])
			}
		}
	}
}

func TestDiscoverBusIDAndPCIPath(t *testing.T) {
	spec, err := sim.Profile("dgx-a100")
	if err != nil {
		t.Fatal(err)
	}
	n := simulate(t, spec)
	got := discover(t, n)
	g := got.GPUs[0]
	// NVML reports "00000000:03:00.0"; the model keeps sysfs' spelling.
	dev, _ := n.NVML().DeviceGetHandleByIndex(0)
	pci, _ := dev.GetPciInfo()
	var raw []byte
	for _, c := range pci.BusId {
		if c == 0 {
			break
		}
		raw = append(raw, byte(c))
	}
	if string(raw) != "00000000:03:00.0" {
		t.Fatalf("simulated NVML bus id %q, want the driver's eight-digit domain form", raw)
	}
	if g.PCIBusID != "0000:03:00.0" {
		t.Errorf("bus id %q, want 0000:03:00.0", g.PCIBusID)
	}
	wantPath := []string{"0000:00:01.1", "0000:01:00.0", "0000:02:00.0", "0000:03:00.0"}
	if !slices.Equal(g.PCIPath, wantPath) {
		t.Errorf("pci path %v, want %v", g.PCIPath, wantPath)
	}
}

func TestNormalizeBusID(t *testing.T) {
	tests := []struct{ in, want string }{
		{"00000000:0A:00.0", "0000:0a:00.0"},
		{"0000:0a:00.0", "0000:0a:00.0"},
		{"00000001:B7:1f.3", "0001:b7:1f.3"},
		{"garbage", "garbage"},
	}
	for _, tc := range tests {
		if got := topology.NormalizeBusID(tc.in); got != tc.want {
			t.Errorf("NormalizeBusID(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func migNames(g topology.GPU) []string {
	var out []string
	for _, m := range g.MIG {
		out = append(out, m.Profile)
	}
	return out
}

func TestDiscoverMIG(t *testing.T) {
	spec, err := sim.Profile("dgx-h100",
		sim.WithMIG(0, "1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"),
		sim.WithMIG(1, "7g.80gb"))
	if err != nil {
		t.Fatal(err)
	}
	n := simulate(t, spec)
	got := discover(t, n)
	if g := got.GPUs[0]; !g.MIGCapable || !g.MIGEnabled || !slices.Equal(migNames(g), []string{"1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"}) {
		t.Fatalf("gpu 0: capable %t enabled %t profiles %v", g.MIGCapable, g.MIGEnabled, migNames(g))
	}
	if !reflect.DeepEqual(got.GPUs[0].MIG, spec.GPUs[0].MIG) {
		t.Errorf("gpu 0 mig devices:\n got  %+v\n want %+v", got.GPUs[0].MIG, spec.GPUs[0].MIG)
	}
	if g := got.GPUs[2]; !g.MIGCapable || g.MIGEnabled || len(g.MIG) != 0 {
		t.Errorf("gpu 2: capable %t enabled %t mig %v, want capable, MIG off", g.MIGCapable, g.MIGEnabled, g.MIG)
	}
	gis := map[int]bool{}
	for _, m := range got.GPUs[0].MIG {
		if gis[m.GPUInstance] {
			t.Errorf("gpu instance %d reported twice", m.GPUInstance)
		}
		gis[m.GPUInstance] = true
		if _, parent, ok := got.MIGParent(m.UUID); !ok || parent.UUID != m.UUID {
			t.Errorf("MIGParent(%s) not found", m.UUID)
		}
		giMinor := 3 + 0*135 + m.GPUInstance*9
		if _, err := os.Stat(filepath.Join(n.HostRoot(), "dev", "nvidia-caps", "nvidia-cap"+strconv.Itoa(giMinor))); err != nil {
			t.Errorf("mig %s: capability node: %v", m.Profile, err)
		}
	}
	before := got.GPUs[0].MIG

	// Reconfigure at run time: new layout, new UUIDs, Changed signalled.
	if err := n.SetMIGLayout(0, []string{"3g.40gb", "3g.40gb"}); err != nil {
		t.Fatal(err)
	}
	if err := n.SetMIGLayout(1, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case <-n.Changed():
	case <-time.After(5 * time.Second):
		t.Fatal("Changed not signalled after SetMIGLayout")
	}
	again := discover(t, n)
	if g := again.GPUs[0]; !slices.Equal(migNames(g), []string{"3g.40gb", "3g.40gb"}) {
		t.Errorf("after change gpu 0 profiles %v, want [3g.40gb 3g.40gb]", migNames(g))
	}
	for _, m := range again.GPUs[0].MIG {
		for _, old := range before {
			if m.UUID == old.UUID {
				t.Errorf("mig uuid %s survived a layout change", m.UUID)
			}
		}
	}
	if g := again.GPUs[1]; g.MIGEnabled || len(g.MIG) != 0 {
		t.Errorf("gpu 1 after MIG off: enabled %t, %d devices", g.MIGEnabled, len(g.MIG))
	}
	if !reflect.DeepEqual(again.GPUs, n.Spec().GPUs) {
		t.Errorf("re-discovery differs from the simulator's layout")
	}
	// The capability nodes of the old layout are gone.
	old := 3 + before[0].GPUInstance*9
	stillUsed := false
	for _, m := range again.GPUs[0].MIG {
		stillUsed = stillUsed || 3+m.GPUInstance*9 == old
	}
	if _, err := os.Stat(filepath.Join(n.HostRoot(), "dev", "nvidia-caps", "nvidia-cap"+strconv.Itoa(old))); err == nil && !stillUsed {
		t.Errorf("capability node %d of a destroyed gpu instance still exists", old)
	}
}

// TestDiscoverMIGNames checks that every MIG profile each simulated model
// offers is discovered under the name NVIDIA's tools give it.
func TestDiscoverMIGNames(t *testing.T) {
	tests := []struct {
		profile string
		names   []string
	}{
		{"dgx-a100", []string{"1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb", "1g.5gb+me", "1g.10gb"}},
		{"dgx-h100", []string{"1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb", "1g.10gb+me", "1g.20gb"}},
		{"dgx-h200", []string{"1g.18gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb", "1g.18gb+me", "1g.35gb"}},
		{"dgx-b200", []string{"1g.23gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb", "1g.23gb+me", "1g.45gb"}},
		{"pcie-8gpu", []string{"1g.10gb", "3g.40gb", "7g.80gb"}},
	}
	for _, tc := range tests {
		t.Run(tc.profile, func(t *testing.T) {
			var opts []sim.ProfileOption
			for i, name := range tc.names {
				opts = append(opts, sim.WithMIG(i, name))
			}
			spec, err := sim.Profile(tc.profile, opts...)
			if err != nil {
				t.Fatal(err)
			}
			got := discover(t, simulate(t, spec))
			for i, name := range tc.names {
				if p := migNames(got.GPUs[i]); !slices.Equal(p, []string{name}) {
					t.Errorf("gpu %d: discovered %v, want [%s]", i, p, name)
				}
			}
		})
	}
}

// lostLib fails every call for one GPU index's handle.
type lostLib struct {
	nvmlowner.Library
	index int
}

func (l lostLib) DeviceGetHandleByIndex(i int) (nvmlowner.Device, nvml.Return) {
	if i == l.index {
		return nil, nvml.ERROR_GPU_IS_LOST
	}
	return l.Library.DeviceGetHandleByIndex(i)
}

func TestDiscoverLostGPU(t *testing.T) {
	spec, err := sim.Profile("dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	spec.GPUs[3].Lost = true
	n := simulate(t, spec)
	tests := []struct {
		name     string
		lib      nvmlowner.Library
		lost     int
		wantUUID bool
	}{
		{"identity readable, everything else lost", n.NVML(), 3, true},
		{"no handle at all", lostLib{n.NVML(), 5}, 5, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := nvmlowner.Discover(tc.lib, n.HostRoot(), nil)
			if err != nil {
				t.Fatalf("Discover failed for one lost gpu: %v", err)
			}
			if len(got.GPUs) != 8 {
				t.Fatalf("%d gpus, want all 8 kept", len(got.GPUs))
			}
			g := got.GPUs[tc.lost]
			if !g.Lost {
				t.Errorf("gpu %d not marked lost", tc.lost)
			}
			if (g.UUID == spec.GPUs[tc.lost].UUID) != tc.wantUUID {
				t.Errorf("gpu %d uuid %q", tc.lost, g.UUID)
			}
			if !tc.wantUUID && g.UUID != topology.LostGPUID(tc.lost) {
				t.Errorf("gpu %d with no readable uuid has id %q, want %q", tc.lost, g.UUID, topology.LostGPUID(tc.lost))
			}
			for i, other := range got.GPUs {
				if other.Lost && i != tc.lost && i != 3 {
					t.Errorf("gpu %d marked lost too", i)
				}
			}
			// The healthy GPUs keep their NVSwitch links to each other, and
			// the lost one has none.
			if l := got.Link(0, 1); l.NVLinks != 18 {
				t.Errorf("pair 0-1: %d nvlinks, want 18", l.NVLinks)
			}
			if l := got.Link(tc.lost, 0); l.NVLinks != 0 {
				t.Errorf("lost gpu still has %d nvlinks to gpu 0", l.NVLinks)
			}
		})
	}
}

// TestDiscoverMinimalSnapshot simulates the minimal snapshot format (no PCI
// paths, direct links only) and reads it back.
func TestDiscoverMinimalSnapshot(t *testing.T) {
	spec, err := topology.ParseSnapshot([]byte(`{"gpus":[
		{"index":0,"uuid":"GPU-aaaaaaaa-0000-0000-0000-000000000000","numaNode":0,"pciBusID":"0000:07:00.0"},
		{"index":1,"uuid":"GPU-aaaaaaaa-0000-0000-0000-000000000001","numaNode":0,"pciBusID":"0000:0f:00.0"},
		{"index":2,"uuid":"GPU-aaaaaaaa-0000-0000-0000-000000000002","numaNode":1,"pciBusID":"0000:87:00.0"},
		{"index":3,"uuid":"GPU-aaaaaaaa-0000-0000-0000-000000000003","numaNode":-1,"pciBusID":"0000:90:00.0"}],
	 "links":[{"a":0,"b":3,"nvlinks":2,"pcie":"single-switch"},{"a":1,"b":0,"nvlinks":4,"pcie":"host-bridge"},{"a":2,"b":1,"pcie":"cross-cpu"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	got := discover(t, simulate(t, spec))
	for i, g := range got.GPUs {
		if g.UUID != spec.GPUs[i].UUID || g.PCIBusID != spec.GPUs[i].PCIBusID || g.NUMANode != spec.GPUs[i].NUMANode {
			t.Errorf("gpu %d: got %s %s numa %d, want %s %s numa %d", i, g.UUID, g.PCIBusID, g.NUMANode,
				spec.GPUs[i].UUID, spec.GPUs[i].PCIBusID, spec.GPUs[i].NUMANode)
		}
	}
	for _, want := range spec.Links {
		if l := got.Link(want.A, want.B); l.NVLinks != want.NVLinks || l.PCIe != want.PCIe {
			t.Errorf("pair %d-%d: got %d %q, want %d %q", want.A, want.B, l.NVLinks, l.PCIe, want.NVLinks, want.PCIe)
		}
	}
	// Pairs the snapshot leaves out are derived from NUMA: 0-2 cross CPUs.
	if l := got.Link(0, 2); l.NVLinks != 0 || l.PCIe != topology.PCIeCrossCPU {
		t.Errorf("pair 0-2: got %d %q, want 0 cross-cpu", l.NVLinks, l.PCIe)
	}
}

// TestDiscoverRealDumpWithMIG simulates what `topology dump` prints on real
// machines: driver model names (not the mocks' "Mock ..." ones), real
// memory sizes, and a model the mocks do not know, each with MIG devices.
func TestDiscoverRealDumpWithMIG(t *testing.T) {
	spec, err := topology.ParseSnapshot([]byte(`{"gpus":[
		{"index":0,"uuid":"GPU-10000000-0000-0000-0000-000000000000","numaNode":0,"pciBusID":"0000:07:00.0",
		 "model":"NVIDIA A100-SXM4-40GB","memoryMiB":40536,"migCapable":true,"migEnabled":true,
		 "mig":[{"uuid":"MIG-10000000-0000-0000-0000-000000000001","profile":"1g.5gb","gi":9,"ci":0,"memoryMiB":4864,"index":0},
		        {"uuid":"MIG-10000000-0000-0000-0000-000000000002","profile":"3g.20gb","gi":2,"ci":0,"memoryMiB":19968,"index":1}]},
		{"index":1,"uuid":"GPU-10000000-0000-0000-0000-000000000001","numaNode":1,"pciBusID":"0000:87:00.0",
		 "model":"NVIDIA GH200 96GB HBM3","memoryMiB":97871,"migCapable":true,"migEnabled":true,
		 "mig":[{"uuid":"MIG-20000000-0000-0000-0000-000000000001","profile":"1g.12gb","gi":11,"ci":0,"memoryMiB":11776,"index":0}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	got := discover(t, simulate(t, spec))
	for i, g := range got.GPUs {
		want := spec.GPUs[i]
		if g.Model != want.Model || !g.MIGCapable || !g.MIGEnabled {
			t.Errorf("gpu %d: model %q capable %t enabled %t", i, g.Model, g.MIGCapable, g.MIGEnabled)
		}
		// The dump has no attributes: the simulator derives them from
		// the profile (the mocks know the A100's, not the GH200's).
		if i == 0 && g.MIG[0].Attributes.Multiprocessors != 14 {
			t.Errorf("gpu 0 mig 0 attributes %+v, want the A100 1g.5gb's 14 SMs", g.MIG[0].Attributes)
		}
		// Nor placements: the simulator places the instances where their
		// GPU instance IDs say (A100: 1g GI 9 at slice 2, 3g GI 2 at 4),
		// and the GI's info answers them; a model without placement
		// tables (GH200) has none.
		wantPlaced := map[int][]topology.MIGPlacement{0: {{Start: 2, Size: 1}, {Start: 4, Size: 4}}, 1: {{}}}[i]
		for k := range g.MIG {
			if g.MIG[k].Placement != wantPlaced[k] {
				t.Errorf("gpu %d mig %d placement %+v, want %+v", i, k, g.MIG[k].Placement, wantPlaced[k])
			}
			g.MIG[k].Attributes = topology.MIGAttributes{}
			g.MIG[k].Placement = topology.MIGPlacement{}
		}
		if !reflect.DeepEqual(g.MIG, want.MIG) {
			t.Errorf("gpu %d mig:\n got  %+v\n want %+v", i, g.MIG, want.MIG)
		}
	}
}
