package rdma

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestResourcePorts(t *testing.T) {
	devs := fixtureDevices(t, "portdown", "multiport", "roce")
	cfgs := []ResourceConfig{
		{Name: "ib", Selectors: Selectors{LinkTypes: []string{"ib"}, Vendors: []string{"15b3"}}},
		{Name: "roce", Mode: ModeShared, Selectors: Selectors{LinkTypes: []string{"ethernet"}}},
	}
	type row struct {
		Resource, ID, State, PhysState string
		Gbps                           uint64
		Up                             bool
		Why                            string
	}
	var got []row
	for _, p := range ResourcePorts(devs, cfgs) {
		up, why := p.Port.Up()
		got = append(got, row{p.Resource, p.ID, p.Port.State, p.Port.PhysState, p.Port.Rate * 8 / 1e9, up, why})
	}
	// The kernel's rate files: 200 Gb/sec (4X HDR), 56 Gb/sec (4X FDR),
	// 100 Gb/sec (2X HDR); procfs reads them in bytes per second.
	want := []row{
		{"rdma/ib", "mlx5_0", "ACTIVE", "LinkUp", 200, true, ""},
		{"rdma/ib", "mlx5_1", "DOWN", "Polling", 200, false, "port 1 state is DOWN"},
		{"rdma/ib", "mlx4_0:1", "ACTIVE", "LinkUp", 56, true, ""},
		{"rdma/ib", "mlx4_0:2", "ACTIVE", "LinkUp", 56, true, ""},
		{"rdma/roce", "mlx5_4", "ACTIVE", "LinkUp", 100, true, ""},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ports (-want +got):\n%s", diff)
	}
}

// TestExclusiveResourceOf: a whole NIC stands for the first exclusive
// resource selecting all its ports; a shared resource's NICs and a NIC
// whose ports two resources split stand for none.
func TestExclusiveResourceOf(t *testing.T) {
	devs := fixtureDevices(t, "portdown", "multiport", "roce")
	tests := []struct {
		name string
		cfgs []ResourceConfig
		want map[string]string
	}{
		{name: "ib exclusive, roce shared", cfgs: []ResourceConfig{
			{Name: "ib", Selectors: Selectors{LinkTypes: []string{"ib"}, Vendors: []string{"15b3"}}},
			{Name: "roce", Mode: ModeShared, Selectors: Selectors{LinkTypes: []string{"ethernet"}}},
		}, want: map[string]string{"mlx5_0": "rdma/ib", "mlx5_1": "rdma/ib", "mlx4_0": "rdma/ib"}},
		{name: "the first resource wins", cfgs: []ResourceConfig{
			{Name: "all"},
			{Name: "ib", Selectors: Selectors{LinkTypes: []string{"ib"}}},
		}, want: map[string]string{"mlx5_0": "rdma/all", "mlx5_1": "rdma/all", "mlx4_0": "rdma/all", "mlx5_4": "rdma/all"}},
		{name: "by driver: the mlx4 NIC stands for none", cfgs: []ResourceConfig{
			{Name: "mlx5", Selectors: Selectors{Drivers: []string{"mlx5_core"}}},
		}, want: map[string]string{"mlx5_0": "rdma/mlx5", "mlx5_1": "rdma/mlx5", "mlx5_4": "rdma/mlx5"}},
		{name: "none", cfgs: nil, want: nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, ExclusiveResourceOf(devs, tc.cfgs)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}
