package rdma

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpu-node-agent/gpu-node-agent/rdma/fakesys"
)

func cd(name, prefix string) *CharDev {
	return &CharDev{Name: name, Path: "/dev/infiniband/" + name, HostPath: filepath.Join("/", prefix, "dev/infiniband", name)}
}

func up(name string, mtu int) NetDev {
	return NetDev{Name: name, OperState: "up", AdminUp: true, MTU: mtu}
}

func TestDiscover(t *testing.T) {
	tests := []struct {
		name   string
		root   string
		prefix string
		want   []Device
	}{
		{
			name: "infiniband port below a switch",
			root: fixtureRoot("ib"),
			want: []Device{{
				Name: "mlx5_0", NodeGUID: "b859:9f03:00a1:0000", FirmwareVersion: "20.35.1012", BoardID: "MT_0000000223", HCAType: "MT4123",
				PCI: PCIFunction{Address: "0000:03:00.0", Vendor: "15b3", DeviceID: "101b", Driver: "mlx5_core", NUMANode: 0,
					Path: []string{"0000:00:01.0", "0000:01:00.0", "0000:02:00.0", "0000:03:00.0"}, HostBridge: "pci0000:00"},
				NetDevs: []NetDev{up("ib0", 4092)},
				Ports: []Port{{Number: 1, State: "ACTIVE", PhysState: "LinkUp", LinkLayer: "InfiniBand", Rate: 25_000_000_000,
					NetDevs: []NetDev{up("ib0", 4092)}, UMAD: cd("umad0", ""), ISSM: cd("issm0", "")}},
				UVerbs: cd("uverbs0", ""), RDMACM: cd("rdma_cm", ""),
			}},
		},
		{
			name:   "roce port with gid netdevs and a host dev prefix",
			root:   fixtureRoot("roce"),
			prefix: "/run/sim",
			want: []Device{{
				Name: "mlx5_4", FirmwareVersion: "20.35.1012", HCAType: "MT4123",
				PCI: PCIFunction{Address: "0000:e1:00.0", Vendor: "15b3", DeviceID: "101d", Driver: "mlx5_core", NUMANode: 1,
					Path: []string{"0000:e0:03.1", "0000:e1:00.0"}, HostBridge: "pci0000:e0"},
				NetDevs: []NetDev{up("enp225s0f0np0", 9000)},
				Ports: []Port{{Number: 1, State: "ACTIVE", PhysState: "LinkUp", LinkLayer: "Ethernet", Rate: 12_500_000_000,
					// vlan100 has no sysfs entry in the fixture: name only.
					NetDevs: []NetDev{up("enp225s0f0np0", 9000), {Name: "vlan100", Virtual: true}}, UMAD: cd("umad4", "/run/sim")}},
				UVerbs: cd("uverbs4", "/run/sim"), RDMACM: cd("rdma_cm", "/run/sim"),
			}},
		},
		{
			name: "dual-port hca splits netdevs by dev_port",
			root: fixtureRoot("multiport"),
			want: []Device{{
				Name: "mlx4_0", FirmwareVersion: "20.35.1012", HCAType: "MT4123",
				PCI: PCIFunction{Address: "0000:81:00.0", Vendor: "15b3", DeviceID: "1003", Driver: "mlx4_core", NUMANode: 1,
					Path: []string{"0000:80:02.0", "0000:81:00.0"}, HostBridge: "pci0000:80"},
				NetDevs: []NetDev{up("ib0", 1500), up("ib1", 1500)},
				Ports: []Port{
					{Number: 1, State: "ACTIVE", PhysState: "LinkUp", LinkLayer: "InfiniBand", Rate: 7_000_000_000,
						NetDevs: []NetDev{up("ib0", 1500)}, UMAD: cd("umad0", ""), ISSM: cd("issm0", "")},
					{Number: 2, State: "ACTIVE", PhysState: "LinkUp", LinkLayer: "InfiniBand", Rate: 7_000_000_000,
						NetDevs: []NetDev{up("ib1", 1500)}, UMAD: cd("umad1", ""), ISSM: cd("issm1", "")},
				},
				UVerbs: cd("uverbs0", ""), RDMACM: cd("rdma_cm", ""),
			}},
		},
		{
			name: "sr-iov vf",
			root: fixtureRoot("vf"),
			want: []Device{{
				Name: "mlx5_2", FirmwareVersion: "20.35.1012", HCAType: "MT4123",
				PCI: PCIFunction{Address: "0000:3b:00.2", Vendor: "15b3", DeviceID: "101e", Driver: "mlx5_core", NUMANode: 0,
					PhysFn: "0000:3b:00.0", Path: []string{"0000:3a:00.0", "0000:3b:00.2"}, HostBridge: "pci0000:3a"},
				NetDevs: []NetDev{up("enp59s0f0v0", 1500)},
				Ports: []Port{{Number: 1, State: "ACTIVE", PhysState: "LinkUp", LinkLayer: "Ethernet", Rate: 25_000_000_000,
					NetDevs: []NetDev{up("enp59s0f0v0", 1500)}, UMAD: cd("umad2", "")}},
				UVerbs: cd("uverbs2", ""), RDMACM: cd("rdma_cm", ""),
			}},
		},
		{
			name: "no numa node",
			root: fixtureRoot("nonuma"),
			want: []Device{{
				Name: "mlx5_0", FirmwareVersion: "20.35.1012", HCAType: "MT4123",
				PCI: PCIFunction{Address: "0000:04:00.0", Vendor: "15b3", DeviceID: "101b", Driver: "mlx5_core", NUMANode: -1,
					Path: []string{"0000:00:03.0", "0000:04:00.0"}, HostBridge: "pci0000:00"},
				NetDevs: []NetDev{up("ib0", 1500)},
				Ports: []Port{{Number: 1, State: "ACTIVE", PhysState: "LinkUp", LinkLayer: "InfiniBand", Rate: 25_000_000_000,
					NetDevs: []NetDev{up("ib0", 1500)}, UMAD: cd("umad0", ""), ISSM: cd("issm0", "")}},
				UVerbs: cd("uverbs0", ""), RDMACM: cd("rdma_cm", ""),
			}},
		},
		{
			name: "port down is discovered with its state",
			root: fixtureRoot("portdown"),
			want: []Device{
				{
					Name: "mlx5_0", FirmwareVersion: "20.35.1012", HCAType: "MT4123",
					PCI: PCIFunction{Address: "0000:01:00.0", Vendor: "15b3", DeviceID: "101b", Driver: "mlx5_core", NUMANode: 0,
						Path: []string{"0000:00:01.0", "0000:01:00.0"}, HostBridge: "pci0000:00"},
					NetDevs: []NetDev{up("ib0", 1500)},
					Ports: []Port{{Number: 1, State: "ACTIVE", PhysState: "LinkUp", LinkLayer: "InfiniBand", Rate: 25_000_000_000,
						NetDevs: []NetDev{up("ib0", 1500)}, UMAD: cd("umad0", ""), ISSM: cd("issm0", "")}},
					UVerbs: cd("uverbs0", ""), RDMACM: cd("rdma_cm", ""),
				},
				{
					Name: "mlx5_1", FirmwareVersion: "20.35.1012", HCAType: "MT4123",
					PCI: PCIFunction{Address: "0000:02:00.0", Vendor: "15b3", DeviceID: "101b", Driver: "mlx5_core", NUMANode: 0,
						Path: []string{"0000:00:02.0", "0000:02:00.0"}, HostBridge: "pci0000:00"},
					NetDevs: []NetDev{{Name: "ib1", OperState: "down", AdminUp: true, MTU: 1500}},
					Ports: []Port{{Number: 1, State: "DOWN", PhysState: "Polling", LinkLayer: "InfiniBand", Rate: 25_000_000_000,
						NetDevs: []NetDev{{Name: "ib1", OperState: "down", AdminUp: true, MTU: 1500}}, UMAD: cd("umad1", ""), ISSM: cd("issm1", "")}},
					UVerbs: cd("uverbs1", ""), RDMACM: cd("rdma_cm", ""),
				},
			},
		},
		{
			name: "missing rdma_cm",
			root: fixtureRoot("nordmacm"),
			want: []Device{{
				Name: "mlx5_0", FirmwareVersion: "20.35.1012", HCAType: "MT4123",
				PCI: PCIFunction{Address: "0000:01:00.0", Vendor: "15b3", DeviceID: "101b", Driver: "mlx5_core", NUMANode: 0,
					Path: []string{"0000:00:01.0", "0000:01:00.0"}, HostBridge: "pci0000:00"},
				NetDevs: []NetDev{up("ib0", 1500)},
				Ports: []Port{{Number: 1, State: "ACTIVE", PhysState: "LinkUp", LinkLayer: "InfiniBand", Rate: 25_000_000_000,
					NetDevs: []NetDev{up("ib0", 1500)}, UMAD: cd("umad0", ""), ISSM: cd("issm0", "")}},
				UVerbs: cd("uverbs0", ""),
			}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Discover(context.Background(), DiscoverOptions{Root: tt.root, HostDevPrefix: tt.prefix})
			if err != nil {
				t.Fatalf("Discover: %v", err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Discover mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDiscoverAbsentRDMAIsNotAnError(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "sys", "class", "net"), 0o755); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	got, err := Discover(context.Background(), DiscoverOptions{Root: root, Logger: slog.New(slog.NewTextHandler(&buf, nil))})
	if err != nil {
		t.Fatalf("Discover: %v", err)
	}
	if len(got) != 0 {
		t.Errorf("Discover = %d devices, want none", len(got))
	}
	if n := strings.Count(buf.String(), "\n"); n != 1 || !strings.Contains(buf.String(), "no RDMA devices") {
		t.Errorf("log = %q, want exactly one 'no RDMA devices' line", buf.String())
	}
}

func TestDiscoverSkipsUnreadableDevice(t *testing.T) {
	root := t.TempDir()
	if err := fakesys.Write(root, fixtures["portdown"]); err != nil {
		t.Fatal(err)
	}
	// fw_ver is mandatory for procfs; without it mlx5_1 cannot be parsed.
	if err := os.Remove(filepath.Join(root, "sys/class/infiniband/mlx5_1/fw_ver")); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	got, err := Discover(context.Background(), DiscoverOptions{Root: root, Logger: slog.New(slog.NewTextHandler(&buf, nil))})
	if err != nil {
		t.Fatalf("Discover: %v", err)
	}
	if len(got) != 1 || got[0].Name != "mlx5_0" {
		t.Errorf("Discover = %v, want only mlx5_0", deviceNames(got))
	}
	if !strings.Contains(buf.String(), "skipping RDMA device") || !strings.Contains(buf.String(), "mlx5_1") {
		t.Errorf("log = %q, want a warning naming mlx5_1", buf.String())
	}
}

// fakeLinks is a Links for netns-mode and netdev-state tests.
type fakeLinks struct {
	mode    string
	modeErr error
	links   map[string]LinkInfo
}

func (f fakeLinks) NetnsMode() (string, error) { return f.mode, f.modeErr }
func (f fakeLinks) Link(name string) (LinkInfo, error) {
	if l, ok := f.links[name]; ok {
		return l, nil
	}
	return LinkInfo{}, ErrLinkNotFound
}
func (f fakeLinks) Subscribe(context.Context, chan<- LinkInfo, func(error)) error {
	return errors.New("not supported")
}

func TestDiscoverNetlink(t *testing.T) {
	tests := []struct {
		name      string
		links     fakeLinks
		allowExcl bool
		wantErr   error
		wantNet   NetDev
	}{
		{name: "shared mode, netdev from netlink", links: fakeLinks{mode: "shared", links: map[string]LinkInfo{"ib0": {Name: "ib0", OperState: "lower-layer-down", AdminUp: true, MTU: 2044}}},
			wantNet: NetDev{Name: "ib0", OperState: "lower-layer-down", AdminUp: true, MTU: 2044}},
		{name: "exclusive mode refused", links: fakeLinks{mode: "exclusive"}, wantErr: ErrExclusiveNetns},
		{name: "exclusive mode accepted when configured", links: fakeLinks{mode: "exclusive"}, allowExcl: true,
			wantNet: up("ib0", 4092)},
		{name: "netns mode unreadable is a warning, netdev falls back to sysfs", links: fakeLinks{modeErr: errors.New("protocol not supported")},
			wantNet: up("ib0", 4092)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Discover(context.Background(), DiscoverOptions{Root: fixtureRoot("ib"), Links: tt.links, AllowExclusiveNetns: tt.allowExcl})
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Discover error = %v, want %v", err, tt.wantErr)
			}
			if tt.wantErr != nil {
				return
			}
			if diff := cmp.Diff([]NetDev{tt.wantNet}, got[0].Ports[0].NetDevs); diff != "" {
				t.Errorf("port netdevs (-want +got):\n%s", diff)
			}
		})
	}
}

func TestNaturalLess(t *testing.T) {
	tests := []struct {
		a, b string
		want bool
	}{
		{"mlx5_2", "mlx5_10", true},
		{"mlx5_10", "mlx5_2", false},
		{"mlx4_0", "mlx5_0", true},
		{"mlx5_bond_0", "mlx5_0", false},
		{"rxe0", "rxe0", false},
		{"ibp12s0", "mlx5_0", true},
	}
	for _, tt := range tests {
		if got := naturalLess(tt.a, tt.b); got != tt.want {
			t.Errorf("naturalLess(%q, %q) = %v, want %v", tt.a, tt.b, got, tt.want)
		}
	}
}
