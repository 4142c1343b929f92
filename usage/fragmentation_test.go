package usage

import (
	"fmt"
	"maps"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

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

// holding is the kubelet's assignments of one pod per device ID
// (pod-<i> in namespace ml, as the device plugin assigns nvidia.com/gpu).
func holding(ids ...string) *Assignments {
	var pods []*podresourcesv1.PodResources
	for i, id := range ids {
		pods = append(pods, pod("ml", "pod-"+strconv.Itoa(i), container("main", "nvidia.com/gpu", id)))
	}
	return NewAssignments(&podresourcesv1.ListPodResourcesResponse{PodResources: pods}, nil)
}

// adviceNames are the families of the move advice.
var adviceNames = []string{
	"gpu_node_agent_largest_free_nvlink_block_if_moved_gpus",
	"gpu_node_agent_move_advice_pods",
	"gpu_node_agent_whole_node_free_if_moved_gpus",
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
			f := NewFragmentation("node-a", FragmentationOptions{})
			reg := fragmentationRegistry(t, f)
			unhealthy := map[string]bool{}
			for _, id := range tc.unhealthy {
				unhealthy[id] = true
			}
			f.Update(tc.node, func(id string) bool { return !unhealthy[id] }, holding(tc.allocated...))
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
	f := NewFragmentation("node-a", FragmentationOptions{})
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
	f := NewFragmentation("node-a", FragmentationOptions{})
	reg := fragmentationRegistry(t, f)
	f.Update(n, nil, holding(n.GPUs[1].UUID))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if want := len(fragmentationNames) + len(adviceNames); len(mfs) != want {
		t.Fatalf("gathered %d families, want %d (%v and %v)", len(mfs), want, fragmentationNames, adviceNames)
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
	f := NewFragmentation("node-a", FragmentationOptions{})
	reg := fragmentationRegistry(t, f)
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range 200 {
			if i%2 == 0 {
				f.Update(a, nil, holding(a.GPUs[i%8].UUID))
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

// fixedAdvice is an Advise that returns adv and records what it was given.
type fixedAdvice struct {
	mu      sync.Mutex
	adv     topology.MoveAdvice
	node    *topology.Node
	offered func(string) bool
	holds   []topology.PodHold
}

func (f *fixedAdvice) set(adv topology.MoveAdvice) {
	f.mu.Lock()
	f.adv = adv
	f.mu.Unlock()
}

func (f *fixedAdvice) advise(n *topology.Node, offered func(string) bool, holds []topology.PodHold) topology.MoveAdvice {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.node, f.offered, f.holds = n, offered, holds
	return f.adv
}

// TestFragmentationMoveAdviceMetrics renders the advice's three gauges
// from a stand-in advice (topology.AdviseMoves has its own tests): the
// block once the pods moved, how many pods, and the node's whole-GPU
// capable GPUs when all would be free (healthy, not lost, not in MIG
// mode), else 0.
func TestFragmentationMoveAdviceMetrics(t *testing.T) {
	h100 := loadProfileSnapshot(t, "dgx-h100")
	h100mig, err := sim.Profile("dgx-h100", sim.WithMIG(0, "3g.40gb"), sim.WithMIG(1, "1g.10gb"))
	if err != nil {
		t.Fatal(err)
	}
	lost := loadProfileSnapshot(t, "dgx-h100")
	lost.GPUs[5].Lost = true
	pods := []topology.PodHold{{Namespace: "ml", Name: "a", Devices: []string{h100.GPUs[0].UUID}},
		{Namespace: "ml", Name: "b", Devices: []string{h100.GPUs[7].UUID}}}
	tests := []struct {
		name      string
		node      *topology.Node
		unhealthy int // a GPU index not offered; -1: none
		advice    topology.MoveAdvice
		// want: the block once moved, pods, whole node free once moved.
		block, pods, whole float64
	}{
		{name: "two pods free the whole node", node: h100, unhealthy: -1,
			advice: topology.MoveAdvice{BlockNow: 6, BlockIfMoved: 8, Block: []int{0, 1, 2, 3, 4, 5, 6, 7}, Pods: pods, WholeNode: true},
			block:  8, pods: 2, whole: 8},
		{name: "an unhealthy GPU is not counted", node: h100, unhealthy: 3,
			advice: topology.MoveAdvice{BlockNow: 5, BlockIfMoved: 7, Block: []int{0, 1, 2, 4, 5, 6, 7}, Pods: pods, WholeNode: true},
			block:  7, pods: 2, whole: 7},
		{name: "a lost GPU is not counted", node: lost, unhealthy: -1,
			advice: topology.MoveAdvice{BlockNow: 5, BlockIfMoved: 7, Block: []int{0, 1, 2, 3, 4, 6, 7}, Pods: pods, WholeNode: true},
			block:  7, pods: 2, whole: 7},
		{name: "one pod frees a block of two", node: h100, unhealthy: -1,
			advice: topology.MoveAdvice{BlockNow: 1, BlockIfMoved: 2, Block: []int{0, 1}, Pods: pods[:1]},
			block:  2, pods: 1, whole: 0},
		{name: "wholly free now: no pods, MIG GPUs not counted", node: h100mig, unhealthy: -1,
			advice: topology.MoveAdvice{BlockNow: 6, BlockIfMoved: 6, WholeNode: true},
			block:  6, pods: 0, whole: 6},
		{name: "no advice", node: h100, unhealthy: -1,
			advice: topology.MoveAdvice{BlockNow: 3, BlockIfMoved: 3},
			block:  3, pods: 0, whole: 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fa := &fixedAdvice{adv: tc.advice}
			f := NewFragmentation("node-a", FragmentationOptions{Advise: fa.advise})
			reg := fragmentationRegistry(t, f)
			offered := func(id string) bool { return tc.unhealthy < 0 || id != tc.node.GPUs[tc.unhealthy].UUID }
			f.Update(tc.node, offered, holding(tc.node.GPUs[0].UUID))
			want := fmt.Sprintf(`
# HELP gpu_node_agent_largest_free_nvlink_block_if_moved_gpus The largest free NVLink block once the pods of the move advice moved elsewhere (the next usable block size above the largest free block now); equal to gpu_node_agent_largest_free_nvlink_block_gpus when there is no advice. Advice only: the agent moves nothing.
# TYPE gpu_node_agent_largest_free_nvlink_block_if_moved_gpus gauge
gpu_node_agent_largest_free_nvlink_block_if_moved_gpus{Hostname="node-a"} %v
# HELP gpu_node_agent_move_advice_pods Pods the move advice suggests moving elsewhere to free a larger NVLink block on this node (the fewest that do); 0 when there is no advice. Advice only: the agent evicts nothing.
# TYPE gpu_node_agent_move_advice_pods gauge
gpu_node_agent_move_advice_pods{Hostname="node-a"} %v
# HELP gpu_node_agent_whole_node_free_if_moved_gpus The node's GPUs that could serve a whole-GPU pod (healthy, not lost, not in MIG mode) when all of them are free once the advice's pods moved, or are free now; 0 otherwise.
# TYPE gpu_node_agent_whole_node_free_if_moved_gpus gauge
gpu_node_agent_whole_node_free_if_moved_gpus{Hostname="node-a"} %v
`, tc.block, tc.pods, tc.whole)
			if err := testutil.GatherAndCompare(reg, strings.NewReader(want), adviceNames...); err != nil {
				t.Error(err)
			}
			if fa.node != tc.node {
				t.Errorf("advise called with node %p, want %p", fa.node, tc.node)
			}
			for _, g := range tc.node.GPUs {
				if fa.offered == nil || fa.offered(g.UUID) != offered(g.UUID) {
					t.Errorf("advise not given the offered devices (GPU %d)", g.Index)
				}
			}
		})
	}
}

// TestFragmentationAdviseHolds: the advice is computed on every pod's
// holds as the kubelet listed them, device plugin and DRA devices alike,
// one hold per pod with its devices sorted and each once (a replica keeps
// its suffix, a device of another resource is passed on for the advice to
// ignore).
func TestFragmentationAdviseHolds(t *testing.T) {
	n := draNode()
	resp := &podresourcesv1.ListPodResourcesResponse{PodResources: []*podresourcesv1.PodResources{
		pod("ml", "train-0", container("trainer", "nvidia.com/gpu", gpu1+"::2"),
			draContainer("worker", claim("ml", "train-0-gpus-x7k2p", ours(claimTrain, draPool, devGPU0, "gpus")))),
		pod("serving", "infer-1", draContainer("server", claim("serving", "infer-1-mig-n4w8d",
			ours(claimInfer, draPool, devMIG1, "mig"), ours(claimInfer, draPool, devNIC0, "nic")))),
		pod("ml", "idle", container("main", "")),
	}}
	a := newAssignments(resp, nil, newDRADevices(draPool, n), nil)
	fa := &fixedAdvice{}
	f := NewFragmentation("node-a", FragmentationOptions{Advise: fa.advise})
	f.Update(n, nil, a)
	want := []topology.PodHold{
		{Namespace: "ml", Name: "train-0", Devices: []string{gpu0, gpu1 + "::2"}},
		{Namespace: "serving", Name: "infer-1", Devices: []string{mig1, "mlx5_0"}},
	}
	slices.SortFunc(want[0].Devices, strings.Compare)
	if !reflect.DeepEqual(fa.holds, want) {
		t.Errorf("advise got holds\n%+v\nwant\n%+v", fa.holds, want)
	}
}

// adviceCall is one SetMoveAdvice.
type adviceCall struct {
	node   *topology.Node
	advice topology.MoveAdvice
	uids   map[string]string
}

type recordAdvice struct {
	mu    sync.Mutex
	calls []adviceCall
}

func (r *recordAdvice) SetMoveAdvice(n *topology.Node, a topology.MoveAdvice, uids map[string]string) {
	r.mu.Lock()
	r.calls = append(r.calls, adviceCall{n, a, uids})
	r.mu.Unlock()
}

// TestFragmentationAdviceObserver: the advice is recomputed every cycle
// and handed on after the first cycle and then only when it changed
// (its pods, blocks or their UIDs); a withdrawn node withdraws it.
func TestFragmentationAdviceObserver(t *testing.T) {
	n := loadProfileSnapshot(t, "dgx-h100")
	rec := &recordAdvice{}
	fa := &fixedAdvice{adv: topology.MoveAdvice{BlockNow: 8, BlockIfMoved: 8, WholeNode: true}}
	f := NewFragmentation("node-a", FragmentationOptions{Advise: fa.advise, Advice: rec})
	twoPods := func(uidA string) *Assignments {
		resp := &podresourcesv1.ListPodResourcesResponse{PodResources: []*podresourcesv1.PodResources{
			pod("ml", "a", container("main", "nvidia.com/gpu", n.GPUs[0].UUID)),
			pod("ml", "b", container("main", "nvidia.com/gpu", n.GPUs[7].UUID)),
		}}
		return NewAssignments(resp, []CheckpointEntry{{PodUID: uidA, Container: "main", Resource: "nvidia.com/gpu", DeviceIDs: []string{n.GPUs[0].UUID}}})
	}
	moveBoth := topology.MoveAdvice{BlockNow: 6, BlockIfMoved: 8, Block: []int{0, 1, 2, 3, 4, 5, 6, 7}, WholeNode: true,
		Pods: []topology.PodHold{{Namespace: "ml", Name: "a", Devices: []string{n.GPUs[0].UUID}},
			{Namespace: "ml", Name: "b", Devices: []string{n.GPUs[7].UUID}}}}
	steps := []struct {
		name   string
		node   *topology.Node
		a      *Assignments
		advice topology.MoveAdvice
		told   bool
		uids   map[string]string
	}{
		{name: "first cycle: no advice, told", node: n, a: holding(), advice: fa.adv, told: true},
		{name: "unchanged: not told", node: n, a: holding(), advice: fa.adv},
		{name: "two pods to move", node: n, a: twoPods("uid-a1"), advice: moveBoth, told: true, uids: map[string]string{"ml/a": "uid-a1"}},
		{name: "recomputed, the same: not told", node: n, a: twoPods("uid-a1"), advice: moveBoth},
		{name: "a pod of the same name, another UID", node: n, a: twoPods("uid-a2"), advice: moveBoth, told: true, uids: map[string]string{"ml/a": "uid-a2"}},
		{name: "the same with fresh but equal slices", node: n, a: twoPods("uid-a2"), advice: topology.MoveAdvice{
			BlockNow: 6, BlockIfMoved: 8, Block: slices.Clone(moveBoth.Block), WholeNode: true, Pods: slices.Clone(moveBoth.Pods)}},
		{name: "the node withdrawn", node: nil, a: nil, advice: topology.MoveAdvice{}, told: true},
		{name: "withdrawn again: not told", node: nil, a: nil, advice: topology.MoveAdvice{}},
	}
	for _, st := range steps {
		before := len(rec.calls)
		fa.set(st.advice)
		f.Update(st.node, nil, st.a)
		got := rec.calls[before:]
		if !st.told {
			if len(got) != 0 {
				t.Errorf("%s: told %d times, want none", st.name, len(got))
			}
			continue
		}
		if len(got) != 1 {
			t.Errorf("%s: told %d times, want once", st.name, len(got))
			continue
		}
		c := got[0]
		if c.node != st.node || !sameAdvice(c.advice, st.advice) || !maps.Equal(c.uids, st.uids) {
			t.Errorf("%s: told node %p, %+v, uids %v; want node %p, %+v, uids %v", st.name, c.node, c.advice, c.uids, st.node, st.advice, st.uids)
		}
	}
}
