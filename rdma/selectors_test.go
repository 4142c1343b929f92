package rdma

import "testing"

func TestSelectorsMatch(t *testing.T) {
	ib := Device{Name: "mlx5_0",
		PCI:     PCIFunction{Address: "0000:0c:00.0", Vendor: "15b3", DeviceID: "101b", Driver: "mlx5_core", NUMANode: 0},
		NetDevs: []NetDev{{Name: "ib0"}},
		Ports:   []Port{{Number: 1, LinkLayer: LinkLayerInfiniBand}},
	}
	roce := Device{Name: "mlx5_4",
		PCI:   PCIFunction{Address: "0000:e1:00.0", Vendor: "15b3", DeviceID: "101d", Driver: "mlx5_core", NUMANode: 1},
		Ports: []Port{{Number: 1, LinkLayer: LinkLayerEthernet, NetDevs: []NetDev{{Name: "enp225s0f0np0"}, {Name: "vlan100", Virtual: true}}}},
	}
	tests := []struct {
		name     string
		sel      Selectors
		wantIB   bool
		wantRoCE bool
	}{
		{name: "empty matches all", wantIB: true, wantRoCE: true},
		{name: "vendor with 0x and upper case", sel: Selectors{Vendors: []string{"0x15B3"}}, wantIB: true, wantRoCE: true},
		{name: "other vendor", sel: Selectors{Vendors: []string{"8086"}}},
		{name: "device id", sel: Selectors{DeviceIDs: []string{"101d"}}, wantRoCE: true},
		{name: "driver", sel: Selectors{Drivers: []string{"mlx4_core", "mlx5_core"}}, wantIB: true, wantRoCE: true},
		{name: "link type ib", sel: Selectors{LinkTypes: []string{"infiniband"}}, wantIB: true},
		{name: "link type ether", sel: Selectors{LinkTypes: []string{"ether"}}, wantRoCE: true},
		{name: "ifname from device/net", sel: Selectors{IfNames: []string{"ib0"}}, wantIB: true},
		{name: "ifname of the port", sel: Selectors{IfNames: []string{"enp225s0f0np0"}}, wantRoCE: true},
		{name: "ifname of a vlan from gid ndevs", sel: Selectors{IfNames: []string{"vlan100"}}, wantRoCE: true},
		{name: "short pci address", sel: Selectors{PCIAddresses: []string{"0C:00.0"}}, wantIB: true},
		{name: "numa", sel: Selectors{NUMANodes: []int{1}}, wantRoCE: true},
		{name: "fields are ANDed", sel: Selectors{LinkTypes: []string{"ib"}, NUMANodes: []int{1}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.sel.Match(ib, ib.Ports[0]); got != tt.wantIB {
				t.Errorf("Match(ib) = %v, want %v", got, tt.wantIB)
			}
			if got := tt.sel.Match(roce, roce.Ports[0]); got != tt.wantRoCE {
				t.Errorf("Match(roce) = %v, want %v", got, tt.wantRoCE)
			}
		})
	}
}
