package gpu

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/gpu-node-agent/gpu-node-agent/plugin"
	"github.com/gpu-node-agent/gpu-node-agent/sim"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// migNames are the smallest and the 3-slice MIG profile of each simulated
// MIG-capable GPU model; the V100 profiles have none.
var migNames = map[string][2]string{
	"dgx-a100":    {"1g.5gb", "3g.20gb"},
	"dgx-h100":    {"1g.10gb", "3g.40gb"},
	"dgx-h200":    {"1g.18gb", "3g.71gb"},
	"dgx-b200":    {"1g.23gb", "3g.90gb"},
	"gb200-nvl72": {"1g.23gb", "3g.90gb"},
	"pcie-8gpu":   {"1g.10gb", "3g.40gb"},
}

func repeat(s string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = s
	}
	return out
}

// TestResourcesOnSimProfiles checks device counts, names and NUMA for every
// simulator profile under every MIG strategy, and logs the table of devices
// served (go test -v -run TestResourcesOnSimProfiles ./gpu).
func TestResourcesOnSimProfiles(t *testing.T) {
	type layout struct {
		name string
		opts func(n int, small, mid string) []sim.ProfileOption
		// want returns the expected resource counts for n GPUs, or an
		// error substring for the strategy.
		want func(strategy string, n int, small, mid string) (map[string]int, string)
	}
	layouts := []layout{
		{
			name: "no MIG",
			opts: func(int, string, string) []sim.ProfileOption { return nil },
			want: func(_ string, n int, _, _ string) (map[string]int, string) {
				return map[string]int{ResourceGPU: n}, ""
			},
		},
		{
			name: "MIG on GPUs 0,1",
			opts: func(_ int, small, mid string) []sim.ProfileOption {
				return []sim.ProfileOption{sim.WithMIG(0, mid, small, small), sim.WithMIG(1, repeat(small, 7)...)}
			},
			want: func(strategy string, n int, small, mid string) (map[string]int, string) {
				switch strategy {
				case MIGStrategyNone:
					return map[string]int{ResourceGPU: n}, ""
				case MIGStrategySingle:
					return nil, "all GPUs must have the same MIG mode"
				}
				return map[string]int{ResourceGPU: n - 2, "nvidia.com/mig-" + small: 9, "nvidia.com/mig-" + mid: 1}, ""
			},
		},
		{
			name: "7 small MIG on every GPU",
			opts: func(n int, small, _ string) []sim.ProfileOption {
				var o []sim.ProfileOption
				for i := 0; i < n; i++ {
					o = append(o, sim.WithMIG(i, repeat(small, 7)...))
				}
				return o
			},
			want: func(strategy string, n int, small, _ string) (map[string]int, string) {
				switch strategy {
				case MIGStrategyNone:
					return map[string]int{ResourceGPU: n}, ""
				case MIGStrategySingle:
					return map[string]int{ResourceGPU: 7 * n}, ""
				}
				return map[string]int{"nvidia.com/mig-" + small: 7 * n}, ""
			},
		},
	}

	var table []string
	for _, profile := range sim.Profiles() {
		names, migCapable := migNames[profile]
		whole, err := sim.Profile(profile)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range layouts {
			if !migCapable && l.name != "no MIG" {
				continue
			}
			node, err := sim.Profile(profile, l.opts(len(whole.GPUs), names[0], names[1])...)
			if err != nil {
				t.Fatalf("%s %s: %v", profile, l.name, err)
			}
			for _, strategy := range MIGStrategies {
				t.Run(profile+"/"+l.name+"/"+strategy, func(t *testing.T) {
					want, wantErr := l.want(strategy, len(node.GPUs), names[0], names[1])
					rs, err := Resources(node, Config{MIGStrategy: strategy, HostRoot: t.TempDir()}, healthMap{}, nil)
					if wantErr != "" {
						if err == nil || !strings.Contains(err.Error(), wantErr) {
							t.Fatalf("error = %v, want one containing %q", err, wantErr)
						}
						table = append(table, fmt.Sprintf("%-10s %-24s %-7s refused: %v", profile, l.name, strategy, err))
						return
					}
					if err != nil {
						t.Fatal(err)
					}
					got := counts(rs)
					if fmt.Sprint(got) != fmt.Sprint(want) {
						t.Errorf("resources = %v, want %v", got, want)
					}
					checkNUMA(t, node, rs)
					table = append(table, fmt.Sprintf("%-10s %-24s %-7s %s", profile, l.name, strategy, countString(got)))
				})
			}
		}
	}
	t.Logf("devices served per profile, layout and MIG strategy:\n%-10s %-24s %-7s %s\n%s", "PROFILE", "MIG LAYOUT", "MIG", "RESOURCES (devices)", strings.Join(table, "\n"))
}

// checkNUMA checks every device carries its GPU's NUMA node, which every
// simulated profile sets.
func checkNUMA(t *testing.T, node *topology.Node, rs []plugin.Resource) {
	t.Helper()
	want := map[string]int64{}
	for _, g := range node.GPUs {
		if g.NUMANode < 0 {
			t.Fatalf("gpu %d has no NUMA node in the profile", g.Index)
		}
		want[g.UUID] = int64(g.NUMANode)
		for _, m := range g.MIG {
			want[m.UUID] = int64(g.NUMANode)
		}
	}
	for _, r := range rs {
		for _, d := range r.Devices() {
			n, ok := want[d.ID]
			if !ok {
				t.Errorf("%s: device %s is not in the model", r.Name(), d.ID)
				continue
			}
			if !slices.Equal(d.NUMANodes, []int64{n}) {
				t.Errorf("%s: device %s NUMA %v, want [%d]", r.Name(), d.ID, d.NUMANodes, n)
			}
		}
	}
}

func countString(m map[string]int) string {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	sort.Strings(names)
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = fmt.Sprintf("%s=%d", n, m[n])
	}
	return strings.Join(parts, " ")
}

// TestPreferredWithTopologySolver wires the real solver: on a DGX-1V the
// best pair for GPU 0 is one of its NV2 peers (3 or 4), and an unhealthy
// peer is never chosen.
func TestPreferredWithTopologySolver(t *testing.T) {
	node, err := sim.Profile("dgx-1v")
	if err != nil {
		t.Fatal(err)
	}
	uuid := func(i int) string { return node.GPUs[i].UUID }
	var all []string
	for i := range node.GPUs {
		all = append(all, uuid(i))
	}
	tests := []struct {
		name      string
		unhealthy healthMap
		want      [][]string // any of these
	}{
		{name: "NV2 peer", unhealthy: healthMap{}, want: [][]string{{uuid(0), uuid(3)}, {uuid(0), uuid(4)}}},
		{name: "sick NV2 peers are skipped", unhealthy: healthMap{uuid(3): true, uuid(4): true}, want: [][]string{{uuid(0), uuid(1)}, {uuid(0), uuid(2)}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rs, err := Resources(node, Config{HostRoot: t.TempDir()}, tc.unhealthy, topology.NewAllocator(node))
			if err != nil {
				t.Fatal(err)
			}
			pa, ok := rs[0].(plugin.PreferredAllocator)
			if !ok {
				t.Fatal("nvidia.com/gpu is not a PreferredAllocator with a solver")
			}
			got, err := pa.PreferredAllocation(context.Background(), all, []string{uuid(0)}, 2)
			if err != nil {
				t.Fatal(err)
			}
			slices.Sort(got)
			for _, w := range tc.want {
				w = slices.Clone(w)
				slices.Sort(w)
				if slices.Equal(got, w) {
					return
				}
			}
			t.Errorf("got %v, want one of %v", got, tc.want)
		})
	}
}
