package dra

import (
	"fmt"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpu-node-agent/gpu-node-agent/sim"
)

func TestSplit(t *testing.T) {
	for _, tc := range []struct {
		devices int
		want    []int
	}{
		{0, nil},
		{1, []int{1}},
		{64, []int{64}},
		{65, []int{64, 1}},
		{130, []int{64, 64, 2}},
	} {
		t.Run(fmt.Sprint(tc.devices), func(t *testing.T) {
			devs := make([]resourceapi.Device, tc.devices)
			for i := range devs {
				devs[i].Name = fmt.Sprintf("d-%d", i)
			}
			got := Split(devs)
			if len(got) != len(tc.want) {
				t.Fatalf("%d slices, want %d", len(got), len(tc.want))
			}
			next := 0
			for i, s := range got {
				if len(s) != tc.want[i] {
					t.Errorf("slice %d: %d devices, want %d", i, len(s), tc.want[i])
				}
				for _, d := range s {
					if want := fmt.Sprintf("d-%d", next); d.Name != want {
						t.Fatalf("slice %d: %s where %s belongs", i, d.Name, want)
					}
					next++
				}
			}
			// Each slice is capped at its length, so appending to one
			// cannot write into the next.
			for i, s := range got {
				if cap(s) != len(s) {
					t.Errorf("slice %d: capacity %d beyond its %d devices", i, cap(s), len(s))
				}
			}
		})
	}
}

// TestSplitFullMIGNode: a DGX A100 with every GPU cut into seven MIG
// devices, plus its ten NICs, is 66 devices, over the 64 a slice with taints
// may hold: two slices of one pool.
func TestSplitFullMIGNode(t *testing.T) {
	var opts []sim.ProfileOption
	for g := range 8 {
		opts = append(opts, sim.WithMIG(g, repeat("1g.5gb", 7)...))
	}
	_, res := buildSim(t, "dgx-a100", opts...)
	if len(res.Devices) != 66 {
		t.Fatalf("%d devices, want 56 MIG + 10 NICs", len(res.Devices))
	}
	checkAPILimits(t, res.Devices)
	if s := Split(res.Devices); len(s) != 2 || len(s[0]) != 64 || len(s[1]) != 2 {
		t.Fatalf("slices of %d devices: %d", len(res.Devices), len(s))
	}
}

// TestSplitCounters: counter sets go eight to a slice, in order.
func TestSplitCounters(t *testing.T) {
	var sets []resourceapi.CounterSet
	for i := range 9 {
		sets = append(sets, resourceapi.CounterSet{Name: CounterSetName(i)})
	}
	got := SplitCounters(sets)
	if len(got) != 2 || len(got[0]) != MaxCounterSetsPerSlice || len(got[1]) != 1 || got[1][0].Name != CounterSetName(8) {
		t.Fatalf("9 counter sets split as %v", got)
	}
	if SplitCounters(nil) != nil {
		t.Errorf("no counter set makes a slice")
	}
}
