package usage

import (
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/gpu-node-agent/gpu-node-agent/sim"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// fragmentationNames are the families Fragmentation serves.
var fragmentationNames = []string{
	"gpu_node_agent_free_gpus",
	"gpu_node_agent_free_gpus_by_numa",
	"gpu_node_agent_largest_free_nvlink_block_gpus",
	"gpu_node_agent_free_mig_devices",
}

func loadProfileSnapshot(t *testing.T, name string) *topology.Node {
	t.Helper()
	n, err := topology.LoadSnapshot(filepath.Join("..", "topology", "testdata", "profiles", name+".json"))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func fragmentationRegistry(t *testing.T, f *Fragmentation) *prometheus.Registry {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(f); err != nil {
		t.Fatal(err)
	}
	return reg
}

// TestFragmentationExposition renders hand-derived values (the
// derivations are in topology/free_test.go).
func TestFragmentationExposition(t *testing.T) {
	dgx1v := loadProfileSnapshot(t, "dgx-1v")
	h100mig, err := sim.Profile("dgx-h100",
		sim.WithMIG(0, "3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"),
		sim.WithMIG(1, "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb"))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		node      *topology.Node
		unhealthy []string
		allocated []string
		want      string
	}{
		{
			// free {2,3,6,7}: two per quad of the cube-mesh plus the
			// cross pairs 2-6 and 3-7, no three pairwise linked.
			name:      "dgx-1v, 0 1 4 5 allocated",
			node:      dgx1v,
			allocated: []string{dgx1v.GPUs[0].UUID, dgx1v.GPUs[1].UUID, dgx1v.GPUs[4].UUID + "::1", dgx1v.GPUs[5].UUID},
			want: `
# HELP gpu_node_agent_free_gpus Whole GPUs the kubelet could give a new pod now: healthy, not lost, not in MIG mode, and neither they nor a replica or MIG device of them allocated to any pod.
# TYPE gpu_node_agent_free_gpus gauge
gpu_node_agent_free_gpus{Hostname="node-a"} 4
# HELP gpu_node_agent_free_gpus_by_numa Free whole GPUs by the NUMA node they are attached to (numa_node -1: the platform reports none); what a pod needing its GPUs on one NUMA node can get.
# TYPE gpu_node_agent_free_gpus_by_numa gauge
gpu_node_agent_free_gpus_by_numa{Hostname="node-a",numa_node="0"} 2
gpu_node_agent_free_gpus_by_numa{Hostname="node-a",numa_node="1"} 2
# HELP gpu_node_agent_largest_free_nvlink_block_gpus The most free GPUs of which every pair is NVLink-connected (directly or through one NVSwitch fabric): the largest all-NVLink job a single pod could start on this node now.
# TYPE gpu_node_agent_largest_free_nvlink_block_gpus gauge
gpu_node_agent_largest_free_nvlink_block_gpus{Hostname="node-a"} 2
`,
		},
		{
			// Whole: 0 and 1 in MIG mode, 2 allocated, 7 unhealthy: free
			// {3,4,5,6}, one NVSwitch block. MIG: 3g.40gb allocated;
			// 1g.10gb 2 + 7 - 1 allocated.
			name:      "dgx-h100 demo MIG layout",
			node:      h100mig,
			unhealthy: []string{h100mig.GPUs[7].UUID},
			allocated: []string{h100mig.GPUs[2].UUID, h100mig.GPUs[0].MIG[0].UUID, h100mig.GPUs[1].MIG[3].UUID},
			want: `
# HELP gpu_node_agent_free_gpus Whole GPUs the kubelet could give a new pod now: healthy, not lost, not in MIG mode, and neither they nor a replica or MIG device of them allocated to any pod.
# TYPE gpu_node_agent_free_gpus gauge
gpu_node_agent_free_gpus{Hostname="node-a"} 4
# HELP gpu_node_agent_free_gpus_by_numa Free whole GPUs by the NUMA node they are attached to (numa_node -1: the platform reports none); what a pod needing its GPUs on one NUMA node can get.
# TYPE gpu_node_agent_free_gpus_by_numa gauge
gpu_node_agent_free_gpus_by_numa{Hostname="node-a",numa_node="0"} 1
gpu_node_agent_free_gpus_by_numa{Hostname="node-a",numa_node="1"} 3
# HELP gpu_node_agent_free_mig_devices Free MIG devices by profile (healthy, their GPU not lost, allocated to no pod); 0 for a profile configured on the node with none free.
# TYPE gpu_node_agent_free_mig_devices gauge
gpu_node_agent_free_mig_devices{Hostname="node-a",profile="1g.10gb"} 8
gpu_node_agent_free_mig_devices{Hostname="node-a",profile="2g.20gb"} 1
gpu_node_agent_free_mig_devices{Hostname="node-a",profile="3g.40gb"} 0
# HELP gpu_node_agent_largest_free_nvlink_block_gpus The most free GPUs of which every pair is NVLink-connected (directly or through one NVSwitch fabric): the largest all-NVLink job a single pod could start on this node now.
# TYPE gpu_node_agent_largest_free_nvlink_block_gpus gauge
gpu_node_agent_largest_free_nvlink_block_gpus{Hostname="node-a"} 4
`,
		},
		{
			name: "empty node",
			node: &topology.Node{},
			want: `
# HELP gpu_node_agent_free_gpus Whole GPUs the kubelet could give a new pod now: healthy, not lost, not in MIG mode, and neither they nor a replica or MIG device of them allocated to any pod.
# TYPE gpu_node_agent_free_gpus gauge
gpu_node_agent_free_gpus{Hostname="node-a"} 0
# HELP gpu_node_agent_largest_free_nvlink_block_gpus The most free GPUs of which every pair is NVLink-connected (directly or through one NVSwitch fabric): the largest all-NVLink job a single pod could start on this node now.
# TYPE gpu_node_agent_largest_free_nvlink_block_gpus gauge
gpu_node_agent_largest_free_nvlink_block_gpus{Hostname="node-a"} 0
`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := NewFragmentation("node-a")
			reg := fragmentationRegistry(t, f)
			unhealthy := map[string]bool{}
			for _, id := range tc.unhealthy {
				unhealthy[id] = true
			}
			allocated := map[string]bool{}
			for _, id := range tc.allocated {
				allocated[id] = true
			}
			f.Update(tc.node, func(id string) bool { return !unhealthy[id] }, allocated)
			if err := testutil.GatherAndCompare(reg, strings.NewReader(tc.want), fragmentationNames...); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestFragmentationLifecycle: nothing before the first Update, each
// Update replaces the whole set (a profile gone takes its series along),
// and a nil node withdraws everything.
func TestFragmentationLifecycle(t *testing.T) {
	f := NewFragmentation("node-a")
	reg := fragmentationRegistry(t, f)
	if n, err := testutil.GatherAndCount(reg, fragmentationNames...); err != nil || n != 0 {
		t.Fatalf("before Update: %d series (err %v), want none", n, err)
	}
	withMIG, err := sim.Profile("dgx-a100", sim.WithMIG(3, "1g.5gb", "1g.5gb", "3g.20gb"))
	if err != nil {
		t.Fatal(err)
	}
	f.Update(withMIG, nil, nil)
	// free_gpus, block, 2 NUMA nodes, 2 profiles.
	if n, err := testutil.GatherAndCount(reg, fragmentationNames...); err != nil || n != 6 {
		t.Fatalf("a100 with MIG on GPU 3: %d series (err %v), want 6", n, err)
	}
	if got := onlyGauge(t, reg, "gpu_node_agent_free_gpus"); got != 7 {
		t.Errorf("free GPUs = %v, want 7 (GPU 3 is in MIG mode)", got)
	}
	f.Update(loadProfileSnapshot(t, "dgx-a100"), nil, nil)
	if n, err := testutil.GatherAndCount(reg, "gpu_node_agent_free_mig_devices"); err != nil || n != 0 {
		t.Errorf("after MIG is gone: %d free_mig_devices series (err %v), want none", n, err)
	}
	if got := onlyGauge(t, reg, "gpu_node_agent_free_gpus"); got != 8 {
		t.Errorf("free GPUs = %v, want 8", got)
	}
	f.Update(nil, nil, nil)
	if n, err := testutil.GatherAndCount(reg, fragmentationNames...); err != nil || n != 0 {
		t.Errorf("after a nil node: %d series (err %v), want none", n, err)
	}
}

// onlyGauge is the value of the only series of family name in reg.
func onlyGauge(t *testing.T, reg prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no single series of %s", name)
	return 0
}

// TestFragmentationPromlint lints every family with series, as `promtool
// check metrics` does.
func TestFragmentationPromlint(t *testing.T) {
	n, err := sim.Profile("dgx-h100", sim.WithMIG(0, "1g.10gb+me", "1g.10gb"))
	if err != nil {
		t.Fatal(err)
	}
	f := NewFragmentation("node-a")
	reg := fragmentationRegistry(t, f)
	f.Update(n, nil, map[string]bool{n.GPUs[1].UUID: true})
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(mfs) != len(fragmentationNames) {
		t.Fatalf("gathered %d families, want %d", len(mfs), len(fragmentationNames))
	}
	problems, err := promlint.NewWithMetricFamilies(mfs).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
}

// TestFragmentationConcurrentUpdateAndCollect runs scrapes while the
// sampler updates (the race detector checks the hand-over).
func TestFragmentationConcurrentUpdateAndCollect(t *testing.T) {
	a := loadProfileSnapshot(t, "dgx-1v")
	b := loadProfileSnapshot(t, "dgx-h100")
	f := NewFragmentation("node-a")
	reg := fragmentationRegistry(t, f)
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range 200 {
			if i%2 == 0 {
				f.Update(a, nil, map[string]bool{a.GPUs[i%8].UUID: true})
			} else {
				f.Update(b, nil, nil)
			}
		}
	})
	for range 200 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "gpu_node_agent_largest_free_nvlink_block_gpus" {
				continue
			}
			// dgx-1v with one GPU allocated: 4 (the other quad); dgx-h100: 8.
			if v := mf.GetMetric()[0].GetGauge().GetValue(); v != 4 && v != 8 {
				t.Fatalf("largest block %v mid-update, want 4 or 8", v)
			}
		}
	}
	wg.Wait()
}
