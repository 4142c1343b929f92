package gpu

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gpu-node-agent/gpu-node-agent/plugin"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// healthMap is a HealthView for tests: IDs in it are unhealthy.
type healthMap map[string]bool

func (h healthMap) Healthy(id string) bool { return !h[id] }

func loadNode(t *testing.T, name string) *topology.Node {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	var n topology.Node
	if err := json.Unmarshal(b, &n); err != nil {
		t.Fatalf("parse %s: %v", name, err)
	}
	return &n
}

// counts is resource name -> device count.
func counts(rs []plugin.Resource) map[string]int {
	m := map[string]int{}
	for _, r := range rs {
		m[r.Name()] = len(r.Devices())
	}
	return m
}

func TestResourcesByStrategy(t *testing.T) {
	// One MIG-enabled GPU with no MIG devices yet, next to plain GPUs.
	emptyMIG := func(t *testing.T) *topology.Node {
		n := loadNode(t, "h100-no-mig.json")
		n.GPUs[3].MIGEnabled = true
		return n
	}
	// All GPUs MIG-enabled but GPU 5 carries a different profile.
	unevenUniform := func(t *testing.T) *topology.Node {
		n := loadNode(t, "h100-mig-uniform.json")
		n.GPUs[5].MIG[0].Profile = "2g.20gb"
		return n
	}
	fixture := func(name string) func(*testing.T) *topology.Node {
		return func(t *testing.T) *topology.Node { return loadNode(t, name) }
	}
	tests := []struct {
		name     string
		node     func(*testing.T) *topology.Node
		strategy string
		want     map[string]int
		wantErr  string
	}{
		{name: "no MIG, none", node: fixture("h100-no-mig.json"), strategy: MIGStrategyNone, want: map[string]int{"nvidia.com/gpu": 8}},
		{name: "no MIG, single", node: fixture("h100-no-mig.json"), strategy: MIGStrategySingle, want: map[string]int{"nvidia.com/gpu": 8}},
		{name: "no MIG, mixed", node: fixture("h100-no-mig.json"), strategy: MIGStrategyMixed, want: map[string]int{"nvidia.com/gpu": 8}},
		{name: "default strategy is none", node: fixture("h100-mig-mixed.json"), strategy: "", want: map[string]int{"nvidia.com/gpu": 8}},
		{name: "MIG on two GPUs, none serves them whole", node: fixture("h100-mig-mixed.json"), strategy: MIGStrategyNone, want: map[string]int{"nvidia.com/gpu": 8}},
		{name: "MIG on two GPUs, mixed", node: fixture("h100-mig-mixed.json"), strategy: MIGStrategyMixed, want: map[string]int{
			"nvidia.com/gpu":            6,
			"nvidia.com/mig-1g.10gb":    3,
			"nvidia.com/mig-3g.40gb":    1,
			"nvidia.com/mig-2g.20gb":    2,
			"nvidia.com/mig-1g.10gb.me": 1,
		}},
		{name: "MIG on two GPUs, single refused", node: fixture("h100-mig-mixed.json"), strategy: MIGStrategySingle, wantErr: "GPUs 0,1 have MIG enabled and GPUs 2,3,4,5,6,7 do not"},
		{name: "uniform MIG, single", node: fixture("h100-mig-uniform.json"), strategy: MIGStrategySingle, want: map[string]int{"nvidia.com/gpu": 56}},
		{name: "uniform MIG, mixed", node: fixture("h100-mig-uniform.json"), strategy: MIGStrategyMixed, want: map[string]int{"nvidia.com/mig-1g.10gb": 56}},
		{name: "uniform MIG, none", node: fixture("h100-mig-uniform.json"), strategy: MIGStrategyNone, want: map[string]int{"nvidia.com/gpu": 8}},
		{name: "two profiles, single refused", node: unevenUniform, strategy: MIGStrategySingle, wantErr: "MIG devices must all have one profile, but GPU 0 has 1g.10gb and GPU 5 has 2g.20gb"},
		{name: "two profiles, mixed", node: unevenUniform, strategy: MIGStrategyMixed, want: map[string]int{"nvidia.com/mig-1g.10gb": 55, "nvidia.com/mig-2g.20gb": 1}},
		{name: "MIG enabled without devices, mixed leaves that GPU out", node: emptyMIG, strategy: MIGStrategyMixed, want: map[string]int{"nvidia.com/gpu": 7}},
		{name: "MIG enabled without devices, none serves it whole", node: emptyMIG, strategy: MIGStrategyNone, want: map[string]int{"nvidia.com/gpu": 8}},
		{name: "empty node has no resources", node: func(*testing.T) *topology.Node { return &topology.Node{} }, strategy: MIGStrategyMixed, want: map[string]int{}},
		{name: "bad strategy", node: fixture("h100-no-mig.json"), strategy: "dynamic", wantErr: `mig-strategy: "dynamic" is not one of none, single, mixed`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rs, err := Resources(tc.node(t), Config{MIGStrategy: tc.strategy, HostRoot: t.TempDir()}, healthMap{}, nil)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := counts(rs)
			if len(got) != len(tc.want) {
				t.Fatalf("resources = %v, want %v", got, tc.want)
			}
			for name, n := range tc.want {
				if got[name] != n {
					t.Errorf("%s: %d devices, want %d (all: %v)", name, got[name], n, got)
				}
			}
			if !slices.IsSortedFunc(rs, func(a, b plugin.Resource) int { return strings.Compare(a.Name(), b.Name()) }) {
				t.Errorf("resources not sorted by name")
			}
		})
	}
}

func TestResourcesNilInputs(t *testing.T) {
	if _, err := Resources(nil, Config{}, healthMap{}, nil); err == nil {
		t.Error("nil node: no error")
	}
	if _, err := Resources(&topology.Node{}, Config{}, nil, nil); err == nil || !strings.Contains(err.Error(), "health view is nil") {
		t.Errorf("nil health: error = %v", err)
	}
}

func TestDevicesNUMAAndIDs(t *testing.T) {
	node := loadNode(t, "h100-mig-mixed.json")
	node.GPUs[6].NUMANode = -1
	rs, err := Resources(node, Config{MIGStrategy: MIGStrategyMixed}, healthMap{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]int64{
		"GPU-00000002-0000-0000-0000-000000000000": {0},
		"GPU-00000004-0000-0000-0000-000000000000": {1},
		"GPU-00000006-0000-0000-0000-000000000000": nil,
		"MIG-00000000-0000-0000-0000-000000000000": {0},
		"MIG-00000001-0002-0000-0000-000000000000": {0},
		"GPU-00000007-0000-0000-0000-000000000000": {1},
	}
	seen := map[string][]int64{}
	for _, r := range rs {
		for _, d := range r.Devices() {
			seen[d.ID] = d.NUMANodes
		}
	}
	for id, numa := range want {
		got, ok := seen[id]
		if !ok {
			t.Errorf("device %s not served", id)
			continue
		}
		if !slices.Equal(got, numa) {
			t.Errorf("device %s NUMA = %v, want %v", id, got, numa)
		}
	}
	// MIG-enabled parents are not served whole under mixed.
	for _, id := range []string{"GPU-00000000-0000-0000-0000-000000000000", "GPU-00000001-0000-0000-0000-000000000000"} {
		if _, ok := seen[id]; ok {
			t.Errorf("MIG-enabled GPU %s served whole", id)
		}
	}
}

func TestDevicesHealth(t *testing.T) {
	const (
		gpu0 = "GPU-00000000-0000-0000-0000-000000000000"
		mig0 = "MIG-00000000-0000-0000-0000-000000000000" // on GPU 0
		mig1 = "MIG-00000001-0000-0000-0000-000000000000" // on GPU 1
		gpu3 = "GPU-00000003-0000-0000-0000-000000000000"
		gpu4 = "GPU-00000004-0000-0000-0000-000000000000"
	)
	tests := []struct {
		name      string
		unhealthy healthMap
		lost      int // GPU index marked lost, -1 for none
		wantSick  []string
	}{
		{name: "all healthy", unhealthy: healthMap{}, lost: -1},
		{name: "sick parent takes its MIG devices down", unhealthy: healthMap{gpu0: true}, lost: -1, wantSick: []string{
			mig0, "MIG-00000000-0001-0000-0000-000000000000", "MIG-00000000-0002-0000-0000-000000000000", "MIG-00000000-0003-0000-0000-000000000000"}},
		{name: "sick MIG device alone", unhealthy: healthMap{mig1: true}, lost: -1, wantSick: []string{mig1}},
		{name: "sick whole GPU", unhealthy: healthMap{gpu3: true}, lost: -1, wantSick: []string{gpu3}},
		{name: "lost GPU is unhealthy whatever health says", unhealthy: healthMap{}, lost: 4, wantSick: []string{gpu4}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			node := loadNode(t, "h100-mig-mixed.json")
			if tc.lost >= 0 {
				node.GPUs[tc.lost].Lost = true
			}
			rs, err := Resources(node, Config{MIGStrategy: MIGStrategyMixed}, tc.unhealthy, nil)
			if err != nil {
				t.Fatal(err)
			}
			var sick []string
			for _, r := range rs {
				for _, d := range r.Devices() {
					if !d.Healthy {
						sick = append(sick, d.ID)
					}
				}
			}
			slices.Sort(sick)
			want := slices.Clone(tc.wantSick)
			slices.Sort(want)
			if !slices.Equal(sick, want) {
				t.Errorf("unhealthy = %v, want %v", sick, want)
			}
		})
	}
}

func TestMIGResourceName(t *testing.T) {
	tests := []struct {
		profile, want, wantErr string
	}{
		{profile: "1g.10gb", want: "nvidia.com/mig-1g.10gb"},
		{profile: "1g.10gb+me", want: "nvidia.com/mig-1g.10gb.me"},
		{profile: "1c.3g.40gb", want: "nvidia.com/mig-1c.3g.40gb"},
		{profile: "", wantErr: "empty"},
		{profile: "bad profile", wantErr: "invalid resource name"},
	}
	for _, tc := range tests {
		t.Run(tc.profile, func(t *testing.T) {
			got, err := migResourceName(tc.profile)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{name: "zero value", cfg: Config{}},
		{name: "all set", cfg: Config{MIGStrategy: "mixed", DeviceListStrategy: "cdi-cri"}},
		{name: "bad mig", cfg: Config{MIGStrategy: "foo"}, wantErr: `mig-strategy: "foo" is not one of none, single, mixed`},
		{name: "bad list", cfg: Config{DeviceListStrategy: "cdi-annotations"}, wantErr: `device-list-strategy: "cdi-annotations" is not one of envvar, volume-mounts, cdi-cri`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.wantErr == "" && err != nil {
				t.Fatal(err)
			}
			if tc.wantErr != "" && (err == nil || err.Error() != tc.wantErr) {
				t.Fatalf("error = %v, want %q", err, tc.wantErr)
			}
		})
	}
}
