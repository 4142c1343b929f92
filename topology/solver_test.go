package topology

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// loadSolverNode reads (and validates) a snapshot fixture from testdata/solver.
func loadSolverNode(t testing.TB, name string) *Node {
	t.Helper()
	n, err := LoadSnapshot(filepath.Join("testdata", "solver", name+".json"))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// gpuIDs maps GPU indices to the fixture's UUIDs.
func gpuIDs(n *Node, idx ...int) []string {
	out := []string{}
	for _, i := range idx {
		for _, g := range n.GPUs {
			if g.Index == i {
				out = append(out, g.UUID)
			}
		}
	}
	return out
}

func allIdx(n *Node) []int {
	var out []int
	for _, g := range n.GPUs {
		out = append(out, g.Index)
	}
	return out
}

func TestPreferredFixtures(t *testing.T) {
	// Pair scores used in the derivations (100 x NVLinks + PCIe score):
	// DGX-1V: 0-1 150, 0-2 130, 0-3 230, 0-4 210, 1-2 230, 1-3 130, 1-5 210,
	//   2-3 250, 2-6 110, 3-7 110, 4-5 150, 4-6 130, 4-7 230, 5-6 230,
	//   5-7 130, 6-7 250, every other pair 10 (cross-cpu).
	// DGX-1P: 0-2 1-3 4-6 5-7 150; 0-1 0-3 1-2 2-3 4-5 4-7 5-6 6-7 130;
	//   0-4 1-5 2-6 3-7 110; others 10.
	// 4xRTX8000: 0-3 1-2 200, 0-1 2-3 20, 0-2 1-3 10.
	tests := []struct {
		name      string
		fixture   string
		available []int // nil: every GPU
		must      []int
		size      int
		want      []int
	}{
		// From go-gpuallocator's TestBestEffortAllocate.
		{"dgx1v pair prefers same switch", "dgx1-volta", []int{0, 2, 4, 5}, nil, 2,
			// {0,2}+{4,5}=130+150=280 beats {0,4}+{2,5}=220 and {0,5}+{2,4}=20; best set {4,5}.
			[]int{4, 5}},
		{"dgx1v pair prefers same socket", "dgx1-volta", []int{0, 4, 5, 6}, nil, 2,
			// {0,4}+{5,6}=210+230=440 is the best partition; {5,6} scores higher.
			[]int{5, 6}},
		{"dgx1v dual nvlink same socket", "dgx1-volta", []int{0, 3, 1}, nil, 2,
			// pair + leftover single: {0,3}=230 > {0,1}=150 > {1,3}=130.
			[]int{0, 3}},
		{"dgx1v dual nvlink cross socket", "dgx1-volta", []int{0, 1, 4}, nil, 2,
			// {0,4}=210 > {0,1}=150 > {1,4}=10.
			[]int{0, 4}},
		{"dgx1v must include size 1", "dgx1-volta", nil, []int{4}, 1, []int{4}},
		{"dgx1v must include size 2", "dgx1-volta", nil, []int{4}, 2,
			// Best matchings total 920: {0,3}{1,2}{4,7}{5,6} (first in order) and
			// {0,4}{1,5}{2,3}{6,7}; the first puts 4 with 7.
			[]int{4, 7}},
		{"dgx1v must include size 4", "dgx1-volta", nil, []int{4}, 4,
			// {0,1,2,3}+{4,5,6,7}=1120+1120 beats every other split.
			[]int{4, 5, 6, 7}},
		{"dgx1v must include full set", "dgx1-volta", nil, []int{0, 2, 4, 6}, 4, []int{0, 2, 4, 6}},
		// Successive allocations from go-gpuallocator's AllocTwo/AllocFour tests.
		{"dgx1v size 2 first", "dgx1-volta", nil, nil, 2,
			// Both 920 matchings; {0,3}{1,2}{4,7}{5,6} comes first, all its pairs 230: {0,3}.
			[]int{0, 3}},
		{"dgx1v size 2 second", "dgx1-volta", []int{1, 2, 4, 5, 6, 7}, nil, 2,
			// {1,2}230+{4,7}230+{5,6}230=690 beats {1,5}210+{2,6}110+{4,7}230=550.
			[]int{1, 2}},
		{"dgx1v size 2 third", "dgx1-volta", []int{4, 5, 6, 7}, nil, 2,
			// {4,7}+{5,6}=460 beats {4,5}+{6,7}=400; tie 230/230 -> first {4,7}.
			[]int{4, 7}},
		{"dgx1v size 4", "dgx1-volta", nil, nil, 4, []int{0, 1, 2, 3}},
		{"dgx1v size 8", "dgx1-volta", nil, nil, 8, []int{0, 1, 2, 3, 4, 5, 6, 7}},
		{"dgx1v size 3 of quad", "dgx1-volta", []int{0, 1, 2, 3}, nil, 3,
			// triple + leftover: {0,2,3}=610 and {1,2,3}=610 beat 510; in order
			// {0,2,3}+{1} precedes {0}+{1,2,3}.
			[]int{0, 2, 3}},
		{"dgx1v size 1 least connected", "dgx1-volta", []int{0, 1, 2, 3, 4}, nil, 1,
			// sums to the others: 0:720 1:520 2:620 3:620 4:240 -> 4.
			[]int{4}},
		{"dgx1p size 2", "dgx1-pascal", nil, nil, 2,
			// {0,2}{1,3}{4,6}{5,7} = 4x150, the maximum per pair; first {0,2}.
			[]int{0, 2}},
		{"dgx1p size 2 second", "dgx1-pascal", []int{1, 3, 4, 5, 6, 7}, nil, 2, []int{1, 3}},
		{"dgx1p size 4", "dgx1-pascal", nil, nil, 4,
			// each quad: 2x150+4x130=820; mixed quads carry 10s.
			[]int{0, 1, 2, 3}},
		{"dgx1p size 4 second", "dgx1-pascal", []int{4, 5, 6, 7}, nil, 4, []int{4, 5, 6, 7}},
		{"rtx8000 size 2", "rtx8000x4", nil, nil, 2,
			// {0,3}+{1,2}=400 beats {0,1}+{2,3}=40 and {0,2}+{1,3}=20.
			[]int{0, 3}},
		{"rtx8000 size 2 second", "rtx8000x4", []int{1, 2}, nil, 2, []int{1, 2}},
		{"rtx8000 size 4", "rtx8000x4", nil, nil, 4, []int{0, 1, 2, 3}},
		// NVSwitch: every pair has the same NVLink count, so PCIe decides.
		{"a100 size 2", "dgx-a100", nil, nil, 2,
			// every pair 1200 + PCIe; the multi-switch pairs (1240) partition the node.
			[]int{0, 1}},
		{"a100 size 2 partition", "dgx-a100", []int{1, 2, 3, 4, 5, 6}, nil, 2,
			// {1,6}1210+{2,3}1240+{4,5}1240=3690 beats {1,2}1220+{3,4}1210+{5,6}1220;
			// best set: {2,3} (first of the two 1240s).
			[]int{2, 3}},
		{"a100 size 4", "dgx-a100", nil, nil, 4,
			// a socket quad: 6x1200+2x40+4x20=7360; any mixed quad carries cross-cpu 10s.
			[]int{0, 1, 2, 3}},
		{"a100 must include", "dgx-a100", nil, []int{5}, 2, []int{4, 5}},
		{"h100 size 4", "dgx-h100", nil, nil, 4, []int{0, 1, 2, 3}},
		{"h100 size 2 with leftover", "dgx-h100", []int{0, 4, 5}, nil, 2,
			// {4,5}=1820 same-cpu beats {0,4}=1810 and {0,5}=1810.
			[]int{4, 5}},
		{"dgx2 size 8", "dgx2", nil, nil, 8,
			// a baseboard: 28x600 + 4x50 + 8x40 + 16x20; mixing boards brings 10s.
			[]int{0, 1, 2, 3, 4, 5, 6, 7}},
		{"dgx2 size 2", "dgx2", []int{0, 2, 3, 8}, nil, 2,
			// {0,8}610+{2,3}650=1260 beats {0,2}640+{3,8}610=1250; best set {2,3}.
			[]int{2, 3}},
		{"dgx2 size 4 must include", "dgx2", nil, []int{9}, 4, []int{8, 9, 10, 11}},
		// PCIe tree: pairs on one switch 50, 6-7 one board 60, host bridge 30
		// (socket 0), same cpu 20 (socket 1), cross cpu 10.
		{"pcie size 2", "pcie8", nil, nil, 2,
			// {0,1}{2,3}{4,5}{6,7}=50+50+50+60; the best set is the shared board.
			[]int{6, 7}},
		{"pcie size 4", "pcie8", nil, nil, 4,
			// {0..3}=2x50+4x30=220, {4..7}=50+60+4x20=190; best set {0..3}.
			[]int{0, 1, 2, 3}},
		{"pcie size 3 leftover", "pcie8", []int{0, 1, 4, 5, 6}, nil, 3,
			// leftover {0,1}=50 + {4,5,6}=90 -> 140 beats {0,1,6}70+{4,5}50=120;
			// the leftover group is never the answer.
			[]int{4, 5, 6}},
		{"pcie size 1", "pcie8", nil, nil, 1,
			// sums: 0-3: 50+60+40=150, 4,5: 50+40+40=130, 6,7: 60+40+40=140 -> 4.
			[]int{4}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := loadSolverNode(t, tc.fixture)
			avail := tc.available
			if avail == nil {
				avail = allIdx(n)
			}
			a := NewAllocator(n)
			got, err := a.Preferred(gpuIDs(n, avail...), gpuIDs(n, tc.must...), tc.size)
			if err != nil {
				t.Fatal(err)
			}
			if want := gpuIDs(n, tc.want...); !slices.Equal(got, want) {
				t.Errorf("Preferred = %v, want %v", got, want)
			}
		})
	}
}

func TestPreferredErrors(t *testing.T) {
	n := loadSolverNode(t, "dgx-a100-mig")
	a := NewAllocator(n)
	all := gpuIDs(n, allIdx(n)...)
	tests := []struct {
		name      string
		available []string
		must      []string
		size      int
		wantErr   string
	}{
		{"unknown available", append(slices.Clone(all), "GPU-nope"), nil, 2, `unknown device "GPU-nope"`},
		{"duplicate available", append(slices.Clone(all), all[0]), nil, 2, `listed twice`},
		{"size zero", all, nil, 0, "size 0 out of range"},
		{"size too big", all, nil, 9, "size 9 out of range"},
		{"must include unavailable", all[1:], all[:1], 2, `must-include device "` + all[0] + `" is not available`},
		{"must include unknown", all, []string{"GPU-nope"}, 2, `unknown must-include device "GPU-nope"`},
		{"must include exceeds size", all, all[:3], 2, "3 must-include devices exceed size 2"},
		{"gpu and mig mixed", []string{all[0], "MIG-a100-0-0"}, nil, 1, "cannot be mixed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := a.Preferred(tc.available, tc.must, tc.size)
			if err == nil {
				t.Fatalf("Preferred = %v, want error %q", got, tc.wantErr)
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("error %q does not contain %q", err, tc.wantErr)
			}
		})
	}
}

func TestPreferredLostGPU(t *testing.T) {
	n := loadSolverNode(t, "dgx1-volta")
	n.GPUs[3].Lost = true
	a := NewAllocator(n)
	all := gpuIDs(n, allIdx(n)...)

	got, err := a.Preferred(all, nil, 2)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(got, all[3]) {
		t.Errorf("Preferred = %v offers the lost GPU %s", got, all[3])
	}
	// Without 3: groups with 0 first; {0,1} and {0,2} reach only 610 and 590,
	// {0,4}210+{1,2}230+{6,7}250 (+ leftover {5}) = 690 is the first maximum
	// ({1,2}{4,7}{5,6} + leftover {0} also makes 690 but comes later). Its
	// best set is {6,7}.
	if want := gpuIDs(n, 6, 7); !slices.Equal(got, want) {
		t.Errorf("Preferred = %v, want %v", got, want)
	}
	if _, err := a.Preferred(all, all[3:4], 2); err == nil || !strings.Contains(err.Error(), "is lost") {
		t.Errorf("must-include lost GPU: err = %v, want an error saying it is lost", err)
	}
	// Seven healthy GPUs: size 8 cannot be met and must not be padded.
	if got, err := a.Preferred(all, nil, 8); err == nil {
		t.Errorf("size 8 with a lost GPU = %v, want an error", got)
	}
}

func TestPreferredMIG(t *testing.T) {
	n := loadSolverNode(t, "dgx-a100-mig")
	a := NewAllocator(n)
	mig := func(ids ...string) []string {
		out := []string{}
		for _, id := range ids {
			out = append(out, "MIG-a100-"+id)
		}
		return out
	}
	all := mig("0-0", "0-1", "0-2", "1-0", "1-1", "2-0", "4-0", "4-1")
	tests := []struct {
		name      string
		available []string
		must      []string
		size      int
		want      []string
	}{
		{"size 2 prefers one parent", all, nil, 2,
			// most same-parent pairs: {0-0,0-1}{0-2,2-0}{1-0,1-1}{4-0,4-1};
			// the same-parent groups tie, the first is on GPU 0.
			mig("0-0", "0-1")},
		{"size 2 nvlink-near parents", mig("0-0", "2-0", "4-0"), nil, 2,
			// no shared parent: GPUs 0-2 (same cpu, 1220) beat 0-4 and 2-4 (1210).
			mig("0-0", "2-0")},
		{"size 3 one parent", mig("0-0", "0-1", "0-2", "1-0", "1-1"), nil, 3,
			// {0-0,0-1,0-2} (3 same-parent pairs) + leftover {1-0,1-1} (1) is the only
			// partition with 4 same-parent pairs.
			mig("0-0", "0-1", "0-2")},
		{"size 1 spares full parents", all, nil, 1,
			// 2-0 is the only slice without a sibling: removing it hurts least.
			mig("2-0")},
		{"must include", all, mig("4-1"), 2, mig("4-0", "4-1")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := a.Preferred(tc.available, tc.must, tc.size)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("Preferred = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestPreferredInputOrderDoesNotMatter(t *testing.T) {
	n := loadSolverNode(t, "dgx1-volta")
	a := NewAllocator(n)
	fwd := gpuIDs(n, allIdx(n)...)
	rev := slices.Clone(fwd)
	slices.Reverse(rev)
	for size := 1; size <= 8; size++ {
		x, err1 := a.Preferred(fwd, nil, size)
		y, err2 := a.Preferred(rev, nil, size)
		if err1 != nil || err2 != nil {
			t.Fatal(err1, err2)
		}
		if !slices.Equal(x, y) {
			t.Errorf("size %d: %v forward, %v reversed", size, x, y)
		}
		if len(x) != size {
			t.Errorf("size %d: got %d devices", size, len(x))
		}
	}
}

func TestExplain(t *testing.T) {
	n := loadSolverNode(t, "dgx1-volta")
	a := NewAllocator(n)
	e, err := a.Explain(gpuIDs(n, 0, 2, 4, 5), nil, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(e.Pairs) != 6 {
		t.Errorf("Pairs = %d, want 6", len(e.Pairs))
	}
	got := fmt.Sprint(e.Partition)
	want := fmt.Sprintf("[{%v 130 false} {%v 150 false}]", gpuIDs(n, 0, 2), gpuIDs(n, 4, 5))
	if got != want {
		t.Errorf("Partition = %s, want %s", got, want)
	}
	if e.PartitionScore != 280 || e.ChosenScore != 150 {
		t.Errorf("PartitionScore, ChosenScore = %d, %d, want 280, 150", e.PartitionScore, e.ChosenScore)
	}
}

func TestSetScore(t *testing.T) {
	n := loadSolverNode(t, "dgx1-volta")
	a := NewAllocator(n)
	s, err := a.SetScore(gpuIDs(n, 0, 2, 3))
	if err != nil {
		t.Fatal(err)
	}
	if s != 610 { // 130 + 230 + 250
		t.Errorf("SetScore = %d, want 610", s)
	}
}
