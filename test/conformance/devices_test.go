package conformance

import (
	"maps"
	"strings"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// repeat joins n copies of a MIG profile with '+', the --simulate syntax.
func repeat(profile string, n int) string {
	return strings.TrimSuffix(strings.Repeat(profile+"+", n), "+")
}

// allMIG puts the same MIG layout on every GPU of an 8-GPU profile.
func allMIG(profile, layout string) string {
	s := profile
	for i := 0; i < 8; i++ {
		s += ",mig=" + string(rune('0'+i)) + ":" + layout
	}
	return s
}

// TestDeviceLists checks, per simulated profile and MIG strategy, which
// resources register with the kubelet, how many devices each lists, that
// they are healthy, and their NUMA nodes (2 sockets, GPUs split evenly and
// in index order; MIG devices sit on their parent GPU's node).
func TestDeviceLists(t *testing.T) {
	type want struct {
		count int
		numa  map[int]int
	}
	half := func(n int) map[int]int { return map[int]int{0: n / 2, 1: n / 2} }
	cases := []struct {
		name     string
		simulate string
		strategy string
		want     map[string]want
	}{
		{"dgx-a100", "dgx-a100", "none", map[string]want{"nvidia.com/gpu": {8, half(8)}}},
		{"dgx-h100", "dgx-h100", "none", map[string]want{"nvidia.com/gpu": {8, half(8)}}},
		{"dgx-h200", "dgx-h200", "none", map[string]want{"nvidia.com/gpu": {8, half(8)}}},
		{"dgx-b200", "dgx-b200", "none", map[string]want{"nvidia.com/gpu": {8, half(8)}}},
		{"dgx-1v", "dgx-1v", "none", map[string]want{"nvidia.com/gpu": {8, half(8)}}},
		{"dgx-2", "dgx-2", "none", map[string]want{"nvidia.com/gpu": {16, half(16)}}},
		{"pcie-8gpu", "pcie-8gpu", "none", map[string]want{"nvidia.com/gpu": {8, half(8)}}},
		{"no MIG with mixed strategy", "dgx-h100", "mixed", map[string]want{"nvidia.com/gpu": {8, half(8)}}},
		{"no MIG with single strategy", "dgx-b200", "single", map[string]want{"nvidia.com/gpu": {8, half(8)}}},
		// NVIDIA's none strategy serves MIG-enabled GPUs whole.
		{"demo node none", demoNode, "none", map[string]want{"nvidia.com/gpu": {8, half(8)}}},
		{"demo node mixed", demoNode, "mixed", map[string]want{
			"nvidia.com/gpu":         {6, map[int]int{0: 2, 1: 4}},
			"nvidia.com/mig-3g.40gb": {1, map[int]int{0: 1}},
			"nvidia.com/mig-2g.20gb": {1, map[int]int{0: 1}},
			"nvidia.com/mig-1g.10gb": {9, map[int]int{0: 9}},
		}},
		{"dgx-h100 all 1g.10gb single", allMIG("dgx-h100", repeat("1g.10gb", 7)), "single", map[string]want{
			"nvidia.com/gpu": {56, half(56)},
		}},
		{"dgx-h100 all 1g.10gb mixed", allMIG("dgx-h100", repeat("1g.10gb", 7)), "mixed", map[string]want{
			"nvidia.com/mig-1g.10gb": {56, half(56)},
		}},
		{"dgx-a100 mixed", "dgx-a100,mig=0:3g.20gb+3g.20gb,mig=5:1g.5gb+2g.10gb+4g.20gb", "mixed", map[string]want{
			"nvidia.com/gpu":         {6, map[int]int{0: 3, 1: 3}},
			"nvidia.com/mig-3g.20gb": {2, map[int]int{0: 2}},
			"nvidia.com/mig-1g.5gb":  {1, map[int]int{1: 1}},
			"nvidia.com/mig-2g.10gb": {1, map[int]int{1: 1}},
			"nvidia.com/mig-4g.20gb": {1, map[int]int{1: 1}},
		}},
		{"dgx-a100 single 7g.40gb", allMIG("dgx-a100", "7g.40gb"), "single", map[string]want{
			"nvidia.com/gpu": {8, half(8)},
		}},
		{"dgx-h200 mixed", "dgx-h200,mig=7:" + repeat("1g.18gb", 7), "mixed", map[string]want{
			"nvidia.com/gpu":         {7, map[int]int{0: 4, 1: 3}},
			"nvidia.com/mig-1g.18gb": {7, map[int]int{1: 7}},
		}},
		{"dgx-b200 mixed", "dgx-b200,mig=4:7g.180gb", "mixed", map[string]want{
			"nvidia.com/gpu":          {7, map[int]int{0: 4, 1: 3}},
			"nvidia.com/mig-7g.180gb": {1, map[int]int{1: 1}},
		}},
		{"pcie-8gpu mixed", "pcie-8gpu,mig=2:3g.40gb+4g.40gb", "mixed", map[string]want{
			"nvidia.com/gpu":         {7, map[int]int{0: 3, 1: 4}},
			"nvidia.com/mig-3g.40gb": {1, map[int]int{0: 1}},
			"nvidia.com/mig-4g.40gb": {1, map[int]int{0: 1}},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			n := startNode(t, tc.simulate, tc.strategy)
			wantCounts := map[string]int{}
			for name, w := range tc.want {
				wantCounts[name] = w.count
			}
			got := n.waitCounts(t, wantCounts)

			numaOf := map[string]int{}
			for _, g := range n.state(t).GPUs {
				numaOf[g.UUID] = g.NUMANode
				for _, m := range g.MIG {
					numaOf[m.UUID] = g.NUMANode
				}
			}
			seen := map[string]string{}
			for name, devs := range got {
				if h := numaHistogram(devs); !maps.Equal(h, tc.want[name].numa) {
					t.Errorf("%s: devices per NUMA node = %v, want %v", name, h, tc.want[name].numa)
				}
				for _, d := range devs {
					if prev, dup := seen[d.ID]; dup {
						t.Errorf("device %s listed by %s and %s", d.ID, prev, name)
					}
					seen[d.ID] = name
					if d.Health != pluginapi.Healthy {
						t.Errorf("%s: device %s health = %q, want Healthy", name, d.ID, d.Health)
					}
					wantPrefix := "GPU-"
					if strings.HasPrefix(name, "nvidia.com/mig-") || (tc.strategy == "single" && strings.Contains(tc.simulate, "mig=")) {
						wantPrefix = "MIG-"
					}
					if !strings.HasPrefix(d.ID, wantPrefix) {
						t.Errorf("%s: device ID %q does not start with %q", name, d.ID, wantPrefix)
					}
					numa, known := numaOf[d.ID]
					if !known {
						t.Errorf("%s: device %s is not a GPU or MIG device of the simulated node", name, d.ID)
						continue
					}
					if h := numaHistogram([]*pluginapi.Device{d}); h[numa] != 1 {
						t.Errorf("%s: device %s NUMA = %v, want node %d", name, d.ID, h, numa)
					}
				}
			}
		})
	}
}

// TestSingleStrategyRefusesMixedLayouts: with --mig-strategy single, GPUs
// with different MIG modes or layouts are refused with an error naming the
// strategy: the agent either exits non-zero or (it keeps running so a later
// MIG change can fix the node) serves none of the GPU resources.
func TestSingleStrategyRefusesMixedLayouts(t *testing.T) {
	cases := []struct{ name, simulate string }{
		{"MIG on some GPUs only", demoNode},
		{"different layouts", "dgx-h100,mig=0:1g.10gb,mig=1:1g.10gb,mig=2:1g.10gb,mig=3:1g.10gb,mig=4:1g.10gb,mig=5:1g.10gb,mig=6:1g.10gb,mig=7:3g.40gb"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			n := startNode(t, tc.simulate, "single")
			deadline := time.After(waitTimeout)
			for !strings.Contains(n.agent.Output(), "mig-strategy single") {
				select {
				case <-n.agent.Exited():
					if n.agent.Err() == nil {
						t.Fatal("agent exited 0 on an inconsistent MIG layout with --mig-strategy single")
					}
					t.Fatalf("agent exited (%v) without naming the strategy; output:\n%s", n.agent.Err(), n.agent.Output())
				case <-deadline:
					t.Fatalf("agent did not report the inconsistent layout within %s; output:\n%s", waitTimeout, n.agent.Output())
				case <-time.After(100 * time.Millisecond):
				}
			}
			// Give a registration that would follow the error a moment to
			// arrive before checking that nothing is served.
			time.Sleep(500 * time.Millisecond)
			if got := served(n.kubelet.Plugins(), n.kubelet.Generation()); len(got) != 0 {
				t.Errorf("served %s despite the refused layout", fmtCounts(counts(got)))
			}
		})
	}
}
