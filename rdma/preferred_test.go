package rdma

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/gpu-node-agent/gpu-node-agent/plugin"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

type recent []string

func (r recent) RecentAllocation() []string { return r }

// dgxLike builds a DGX A100-like layout: 4 switches, each with 2 GPUs and
// 2 NICs; switches 0-1 on socket 0 (separate host bridges), 2-3 on socket 1.
func dgxLike() ([]Device, []topology.GPU) {
	var devs []Device
	var gpus []topology.GPU
	for sw := 0; sw < 4; sw++ {
		numa := sw / 2
		root := fmt.Sprintf("0000:%02x:01.1", sw*0x20)
		up := fmt.Sprintf("0000:%02x:00.0", sw*0x20+1)
		down := func(k int) string { return fmt.Sprintf("0000:%02x:%02x.0", sw*0x20+2, k) }
		ep := func(k int) string { return fmt.Sprintf("0000:%02x:00.0", sw*0x20+3+k) }
		for k := 0; k < 2; k++ {
			gpus = append(gpus, topology.GPU{Index: sw*2 + k, UUID: fmt.Sprintf("GPU-%d", sw*2+k), NUMANode: numa,
				PCIPath: []string{root, up, down(k), ep(k)}})
		}
		for k := 2; k < 4; k++ {
			devs = append(devs, Device{Name: fmt.Sprintf("mlx5_%d", sw*2+k-2),
				PCI:   PCIFunction{NUMANode: numa, Path: []string{root, up, down(k), ep(k)}},
				Ports: []Port{{Number: 1, LinkLayer: LinkLayerInfiniBand}}})
		}
	}
	return devs, gpus
}

func TestPreferredAllocation(t *testing.T) {
	devs, gpus := dgxLike()
	all := []string{"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7"}
	tests := []struct {
		name        string
		recent      []string
		available   []string
		mustInclude []string
		size        int
		want        []string
		wantErr     bool
	}{
		{name: "no gpus: nearest pair is one switch", available: all, size: 2, want: []string{"mlx5_0", "mlx5_1"}},
		{name: "one nic next to the gpu", recent: []string{"GPU-5"}, available: all, size: 1, want: []string{"mlx5_4"}},
		{name: "two gpus on two switches get one rail each", recent: []string{"GPU-2", "GPU-6"}, available: all, size: 2,
			want: []string{"mlx5_2", "mlx5_6"}},
		{name: "gpus on one switch keep both nics there", recent: []string{"GPU-0", "GPU-1"}, available: all, size: 2,
			want: []string{"mlx5_0", "mlx5_1"}},
		{name: "nearest free nic when the switch's are taken", recent: []string{"GPU-0"},
			available: []string{"mlx5_2", "mlx5_4", "mlx5_7"}, size: 1, want: []string{"mlx5_2"}},
		{name: "must include is kept", recent: []string{"GPU-0"}, available: all, mustInclude: []string{"mlx5_7"}, size: 2,
			want: []string{"mlx5_7", "mlx5_0"}},
		{name: "stale recent gpus are ignored", recent: []string{"GPU-unknown"}, available: []string{"mlx5_6", "mlx5_2", "mlx5_3"}, size: 2,
			want: []string{"mlx5_2", "mlx5_3"}},
		{name: "size larger than available", available: []string{"mlx5_0"}, size: 2, wantErr: true},
		{name: "unknown id", available: []string{"mlx5_0", "eth9"}, size: 1, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := Resources(devs, []ResourceConfig{{Name: "ib"}}, nil, false, WithGPUAffinity(gpus, recent(tt.recent)))
			if err != nil {
				t.Fatal(err)
			}
			got, err := res[0].(plugin.PreferredAllocator).PreferredAllocation(context.Background(), tt.available, tt.mustInclude, tt.size)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("PreferredAllocation = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestPreferredAllocationGreedy covers the greedy path used when the
// exhaustive search would be too large.
func TestPreferredAllocationGreedy(t *testing.T) {
	var devs []Device
	var ids []string
	for i := 0; i < 24; i++ {
		sw := i / 4
		devs = append(devs, Device{Name: fmt.Sprintf("mlx5_%d", i),
			PCI: PCIFunction{NUMANode: sw / 3, Path: []string{
				fmt.Sprintf("0000:%02x:01.1", sw*0x10), fmt.Sprintf("0000:%02x:00.0", sw*0x10+1),
				fmt.Sprintf("0000:%02x:%02x.0", sw*0x10+2, i%4), fmt.Sprintf("0000:%02x:00.0", sw*0x10+3+i%4)}},
			Ports: []Port{{Number: 1}}})
		ids = append(ids, fmt.Sprintf("mlx5_%d", i))
	}
	if binomial(24, 12) <= maxCombinations {
		t.Fatal("test does not reach the greedy path")
	}
	res, err := Resources(devs, []ResourceConfig{{Name: "ib"}}, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	got, err := res[0].(plugin.PreferredAllocator).PreferredAllocation(context.Background(), ids, []string{"mlx5_5"}, 12)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 12 || got[0] != "mlx5_5" {
		t.Fatalf("got %v, want 12 ids starting with mlx5_5", got)
	}
	// Greedy fills mlx5_5's switch (4..7) first, then whole switches.
	for _, id := range []string{"mlx5_4", "mlx5_6", "mlx5_7"} {
		if !slices.Contains(got, id) {
			t.Errorf("got %v, want it to contain %s (same switch as mlx5_5)", got, id)
		}
	}
	seen := map[string]bool{}
	for _, id := range got {
		if seen[id] {
			t.Errorf("duplicate %s in %v", id, got)
		}
		seen[id] = true
	}
}
