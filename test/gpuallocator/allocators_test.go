// Package gpuallocator compares the agent's preferred-allocation solver with
// NVIDIA's go-gpuallocator BestEffort policy on the same topologies and
// queries: speed (ns/op, p99) and whether both answers score the same.
package gpuallocator

import (
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	nvidia "github.com/NVIDIA/go-gpuallocator/gpuallocator"

	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// Topologies go-gpuallocator can see in full: direct NVLinks and PCIe
// levels (it counts no NVLinks through NVSwitch, so NVSwitch nodes would
// not be a like-for-like comparison).
var cases = []struct {
	fixture string
	sizes   []int
}{
	{"dgx1-volta", []int{1, 2, 3, 4, 5, 6, 7, 8}}, // 8 GPUs, hybrid cube mesh
	{"dgx1v-x2", []int{2, 3, 4, 8}},               // 16 GPUs, two meshes joined
}

type subject struct {
	node   *topology.Node
	ours   *topology.Allocator
	uuids  []string         // available, in GPU index order
	theirs []*nvidia.Device // the same GPUs, same order
}

func load(tb testing.TB, fixture string) *subject {
	tb.Helper()
	n, err := topology.LoadSnapshot(filepath.Join("..", "..", "topology", "testdata", "solver", fixture+".json"))
	if err != nil {
		tb.Fatal(err)
	}
	s := &subject{node: n, ours: topology.NewAllocator(n)}
	s.theirs = bestEffortDevices(n)
	for _, g := range n.GPUs {
		s.uuids = append(s.uuids, g.UUID)
	}
	return s
}

// bestEffortDevices builds go-gpuallocator Devices for n the way its own
// NewDevices does from NVML: per ordered pair, one P2P link for the PCIe
// level and one NVLink entry for the link count.
func bestEffortDevices(n *topology.Node) []*nvidia.Device {
	devs := make([]*nvidia.Device, len(n.GPUs))
	pos := map[int]int{}
	for i, g := range n.GPUs {
		devs[i] = &nvidia.Device{Index: g.Index, Links: map[int][]nvidia.P2PLink{}}
		devs[i].UUID = g.UUID
		pos[g.Index] = i
	}
	add := func(from, to *nvidia.Device, typ int) {
		// P2PLinkType lives in go-gpuallocator's internal package: count up
		// to the value (CrossCPU=1 ... SameBoard=6, SingleNVLINKLink=7, ...).
		l := nvidia.P2PLink{GPU: to}
		for range typ {
			l.Type++
		}
		from.Links[to.Index] = append(from.Links[to.Index], l)
	}
	pcie := map[topology.PCIeLevel]int{
		topology.PCIeCrossCPU: 1, topology.PCIeSameCPU: 2, topology.PCIeHostBridge: 3,
		topology.PCIeMultiSwitch: 4, topology.PCIeSingleSwitch: 5, topology.PCIeSameBoard: 6,
	}
	for _, l := range n.Links {
		a, b := devs[pos[l.A]], devs[pos[l.B]]
		if t, ok := pcie[l.PCIe]; ok {
			add(a, b, t)
			add(b, a, t)
		}
		if l.NVLinks > 0 {
			add(a, b, 6+l.NVLinks)
			add(b, a, 6+l.NVLinks)
		}
	}
	return devs
}

func (s *subject) bestEffort(size int) []string {
	var out []string
	for _, d := range nvidia.NewBestEffortPolicy().Allocate(s.theirs, nil, size) {
		if d == nil {
			out = append(out, "<nil>") // BestEffort's padding
			continue
		}
		out = append(out, d.UUID)
	}
	return out
}

func (s *subject) score(tb testing.TB, ids []string) int {
	if slices.Contains(ids, "<nil>") {
		return -1
	}
	v, err := s.ours.SetScore(ids)
	if err != nil {
		tb.Fatal(err)
	}
	return v
}

// BenchmarkAllocators runs every query through both allocators. Compare
// with `benchstat -col /impl`: ns/op and cpu-ns/op give the ratio, and the
// score metric shows whether both chose sets of equal score. cpu-ns/op is
// the benchmark thread's own CPU time per call: on a shared machine wall
// time mostly measures the other tenants. Ours also reports p99 per call
// (wall and CPU).
func BenchmarkAllocators(b *testing.B) {
	for _, c := range cases {
		s := load(b, c.fixture)
		for _, size := range c.sizes {
			name := fmt.Sprintf("topo=%s/gpus=%d/size=%d", c.fixture, len(s.uuids), size)
			b.Run(name+"/impl=besteffort", func(b *testing.B) {
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				var got []string
				cpu0 := threadCPU()
				for b.Loop() {
					got = s.bestEffort(size)
				}
				b.ReportMetric(float64((threadCPU()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
				b.ReportMetric(float64(s.score(b, got)), "score")
			})
			b.Run(name+"/impl=ours", func(b *testing.B) {
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				var got []string
				var err error
				var wall, cpu []time.Duration
				for b.Loop() {
					start, cpu0 := time.Now(), threadCPU()
					got, err = s.ours.Preferred(s.uuids, nil, size)
					cpu = append(cpu, threadCPU()-cpu0)
					wall = append(wall, time.Since(start))
					if err != nil {
						b.Fatal(err)
					}
				}
				var sum time.Duration
				for _, d := range cpu {
					sum += d
				}
				b.ReportMetric(float64(sum.Nanoseconds())/float64(len(cpu)), "cpu-ns/op")
				b.ReportMetric(float64(s.score(b, got)), "score")
				b.ReportMetric(float64(p99(wall).Nanoseconds()), "p99-ns")
				b.ReportMetric(float64(p99(cpu).Nanoseconds()), "p99-cpu-ns")
			})
		}
	}
}

// threadCPU is the CPU time consumed by the calling OS thread.
func threadCPU() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

func p99(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(d))
	return s[len(s)*99/100]
}

// TestSameScores checks, for every benchmark query, that both allocators
// answer with exactly size GPUs of equal score, and that both see the
// fixture's pairs with the same scores.
func TestSameScores(t *testing.T) {
	for _, c := range cases {
		s := load(t, c.fixture)
		for _, size := range c.sizes {
			t.Run(fmt.Sprintf("%s/size=%d", c.fixture, size), func(t *testing.T) {
				start := time.Now()
				theirs := s.bestEffort(size)
				tTheirs := time.Since(start)
				start = time.Now()
				ours, err := s.ours.Preferred(s.uuids, nil, size)
				tOurs := time.Since(start)
				if err != nil {
					t.Fatal(err)
				}
				if len(ours) != size {
					t.Fatalf("ours returned %d GPUs, want %d", len(ours), size)
				}
				so, st := s.score(t, ours), s.score(t, theirs)
				t.Logf("besteffort %v (score %d, %v); ours %v (score %d, %v)", theirs, st, tTheirs, ours, so, tOurs)
				if so != st {
					t.Errorf("scores differ: ours %d, besteffort %d", so, st)
				}
			})
		}
	}
}

// TestPairScoresAgree checks the device conversion: go-gpuallocator's pair
// score (via a two-GPU allocation from each pair it scores highest) is only
// observable through Allocate, so compare the sets each picks for size 2
// from every 3-GPU subset.
func TestPairScoresAgree(t *testing.T) {
	s := load(t, "dgx1-volta")
	n := len(s.theirs)
	for i := 0; i < n; i++ {
		for j := i + 1; j < n; j++ {
			for k := j + 1; k < n; k++ {
				avail := []*nvidia.Device{s.theirs[i], s.theirs[j], s.theirs[k]}
				var theirs []string
				for _, d := range nvidia.NewBestEffortPolicy().Allocate(avail, nil, 2) {
					theirs = append(theirs, d.UUID)
				}
				ours, err := s.ours.Preferred([]string{s.uuids[i], s.uuids[j], s.uuids[k]}, nil, 2)
				if err != nil {
					t.Fatal(err)
				}
				if s.score(t, ours) != s.score(t, theirs) {
					t.Errorf("GPUs %d,%d,%d: ours %v, besteffort %v", i, j, k, ours, theirs)
				}
			}
		}
	}
}
