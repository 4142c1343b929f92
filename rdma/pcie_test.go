package rdma

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

func TestParsePCIPath(t *testing.T) {
	tests := []struct {
		name      string
		path      string
		wantHB    string
		wantChain []string
		wantErr   bool
	}{
		{name: "switch chain", path: "/r/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0",
			wantHB: "pci0000:00", wantChain: []string{"0000:00:01.0", "0000:01:00.0", "0000:02:00.0", "0000:03:00.0"}},
		{name: "stops at a subdirectory", path: "/sys/devices/pci0000:e0/0000:e0:03.1/0000:E1:00.0/infiniband/mlx5_4",
			wantHB: "pci0000:e0", wantChain: []string{"0000:e0:03.1", "0000:e1:00.0"}},
		{name: "virtual device", path: "/sys/devices/virtual/net/rxe0", wantErr: true},
		{name: "host bridge without devices", path: "/sys/devices/pci0000:00/firmware_node", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hb, chain, err := parsePCIPath(tt.path)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if hb != tt.wantHB || !cmp.Equal(chain, tt.wantChain) {
				t.Errorf("got %q %v, want %q %v", hb, chain, tt.wantHB, tt.wantChain)
			}
		})
	}
}

func TestDistance(t *testing.T) {
	// A DGX-like socket 0: root port 00:01.1 -> switch 01 (up) -> 02 (down
	// ports) -> GPU 03, GPU 04, NIC 05; root port 00:03.1 -> two-level
	// switch; root port 20:01.1 on another host bridge; socket 1 at 80.
	var (
		gpuA   = []string{"0000:00:01.1", "0000:01:00.0", "0000:02:00.0", "0000:03:00.0"}
		nicA   = []string{"0000:00:01.1", "0000:01:00.0", "0000:02:02.0", "0000:05:00.0"}
		nicA1  = []string{"0000:00:01.1", "0000:01:00.0", "0000:02:02.0", "0000:05:00.1"}
		leaf1  = []string{"0000:00:03.1", "0000:10:00.0", "0000:11:00.0", "0000:12:00.0", "0000:13:00.0", "0000:14:00.0"}
		leaf2  = []string{"0000:00:03.1", "0000:10:00.0", "0000:11:01.0", "0000:15:00.0", "0000:16:00.0", "0000:17:00.0"}
		top    = []string{"0000:00:03.1", "0000:10:00.0", "0000:11:02.0", "0000:18:00.0"}
		otherB = []string{"0000:20:01.1", "0000:21:00.0"}
		sock1  = []string{"0000:80:01.1", "0000:81:00.0"}
	)
	tests := []struct {
		name  string
		a     []string
		numaA int
		b     []string
		numaB int
		want  topology.PCIeLevel
	}{
		{name: "functions of one device", a: nicA, b: nicA1, want: topology.PCIeSameBoard},
		{name: "downstream ports of one switch", a: gpuA, b: nicA, want: topology.PCIeSingleSwitch},
		{name: "different leaves under one top switch", a: leaf1, b: leaf2, want: topology.PCIeMultiSwitch},
		{name: "top-switch port vs leaf", a: top, b: leaf1, want: topology.PCIeMultiSwitch},
		{name: "root ports of one host bridge", a: gpuA, b: leaf1, want: topology.PCIeHostBridge},
		{name: "host bridges of one socket", a: gpuA, b: otherB, want: topology.PCIeSameCPU},
		{name: "across sockets", a: gpuA, b: sock1, numaB: 1, want: topology.PCIeCrossCPU},
		{name: "unknown numa on another host bridge", a: gpuA, numaA: -1, b: otherB, numaB: -1, want: topology.PCIeCrossCPU},
		{name: "no path, same numa", a: nil, b: gpuA, want: topology.PCIeSameCPU},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Distance(tt.a, tt.numaA, tt.b, tt.numaB); got != tt.want {
				t.Errorf("Distance(a, b) = %s, want %s", got, tt.want)
			}
			if got := Distance(tt.b, tt.numaB, tt.a, tt.numaA); got != tt.want {
				t.Errorf("Distance(b, a) = %s, want %s (not symmetric)", got, tt.want)
			}
		})
	}
}

func TestToTopology(t *testing.T) {
	devs := []Device{{
		Name:    "mlx5_0",
		PCI:     PCIFunction{Address: "0000:05:00.0", NUMANode: 0, Path: []string{"0000:00:01.1", "0000:01:00.0", "0000:02:02.0", "0000:05:00.0"}},
		NetDevs: []NetDev{{Name: "ib0"}},
		Ports:   []Port{{Number: 1, LinkLayer: LinkLayerInfiniBand, NetDevs: []NetDev{{Name: "ib0"}, {Name: "ib0.8001"}, {Name: "vlan7", Virtual: true}}}},
	}}
	gpus := []topology.GPU{
		{Index: 0, NUMANode: 0, PCIPath: []string{"0000:00:01.1", "0000:01:00.0", "0000:02:00.0", "0000:03:00.0"}},
		{Index: 1, NUMANode: 1, PCIPath: []string{"0000:80:01.1", "0000:81:00.0"}},
	}
	want := []topology.NIC{{
		Name: "mlx5_0", PCIBusID: "0000:05:00.0", NUMANode: 0,
		PCIPath: []string{"0000:00:01.1", "0000:01:00.0", "0000:02:02.0", "0000:05:00.0"},
		NetDevs: []string{"ib0", "ib0.8001"}, LinkLayer: "InfiniBand",
		GPUs: []topology.NICGPULink{{GPU: 0, PCIe: topology.PCIeSingleSwitch}, {GPU: 1, PCIe: topology.PCIeCrossCPU}},
	}}
	if diff := cmp.Diff(want, ToTopology(devs, gpus)); diff != "" {
		t.Errorf("ToTopology (-want +got):\n%s", diff)
	}
}
