package rdma

import (
	"flag"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/gpu-node-agent/gpu-node-agent/rdma/fakesys"
)

var update = flag.Bool("update", false, "rewrite the sysfs fixture trees under testdata/")

// fixtures are the sysfs trees under testdata/<name>. They are committed
// as real files and relative symlinks; `go test ./rdma -run
// TestFixturesUpToDate -update` regenerates them from these descriptions.
var fixtures = map[string]fakesys.Tree{
	// One InfiniBand HCA below a PCIe switch: ib0, uverbs/umad/issm, rdma_cm.
	"ib": {RDMACM: true, HCAs: []fakesys.HCA{{
		Name: "mlx5_0", PCIPath: []string{"0000:00:01.0", "0000:01:00.0", "0000:02:00.0", "0000:03:00.0"},
		Vendor: "15b3", DeviceID: "101b", Driver: "mlx5_core", NUMANode: 0,
		NodeGUID: "b859:9f03:00a1:0000", BoardID: "MT_0000000223",
		NetDevs: []fakesys.NetDev{{Name: "ib0", MTU: 4092}},
		Ports:   []fakesys.Port{{Number: 1, LinkLayer: "InfiniBand", UMAD: "umad0", ISSM: "issm0"}},
		UVerbs:  "uverbs0",
	}}},
	// A RoCE port: the netdev is both in device/net and gid_attrs/ndevs;
	// no issm (InfiniBand only).
	"roce": {RDMACM: true, HCAs: []fakesys.HCA{{
		Name: "mlx5_4", PCIPath: []string{"0000:e0:03.1", "0000:e1:00.0"},
		Vendor: "15b3", DeviceID: "101d", Driver: "mlx5_core", NUMANode: 1,
		NetDevs: []fakesys.NetDev{{Name: "enp225s0f0np0", MTU: 9000}},
		Ports: []fakesys.Port{{Number: 1, LinkLayer: "Ethernet", Rate: "100 Gb/sec (2X HDR)",
			GIDNetDevs: []string{"enp225s0f0np0", "enp225s0f0np0", "vlan100"}, UMAD: "umad4"}},
		UVerbs: "uverbs4",
	}}},
	// A dual-port HCA (mlx4 style: one ibdev, two ports, two netdevs told
	// apart by dev_port).
	"multiport": {RDMACM: true, HCAs: []fakesys.HCA{{
		Name: "mlx4_0", PCIPath: []string{"0000:80:02.0", "0000:81:00.0"},
		Vendor: "15b3", DeviceID: "1003", Driver: "mlx4_core", NUMANode: 1,
		NetDevs: []fakesys.NetDev{{Name: "ib0", DevPort: 0}, {Name: "ib1", DevPort: 1}},
		Ports: []fakesys.Port{
			{Number: 1, LinkLayer: "InfiniBand", Rate: "56 Gb/sec (4X FDR)", UMAD: "umad0", ISSM: "issm0"},
			{Number: 2, LinkLayer: "InfiniBand", Rate: "56 Gb/sec (4X FDR)", UMAD: "umad1", ISSM: "issm1"},
		},
		UVerbs: "uverbs0",
	}}},
	// An SR-IOV VF (physfn link) of a ConnectX-6 Dx.
	"vf": {RDMACM: true, HCAs: []fakesys.HCA{{
		Name: "mlx5_2", PCIPath: []string{"0000:3a:00.0", "0000:3b:00.2"}, PhysFn: "0000:3b:00.0",
		Vendor: "15b3", DeviceID: "101e", Driver: "mlx5_core", NUMANode: 0,
		NetDevs: []fakesys.NetDev{{Name: "enp59s0f0v0"}},
		Ports:   []fakesys.Port{{Number: 1, LinkLayer: "Ethernet", GIDNetDevs: []string{"enp59s0f0v0"}, UMAD: "umad2"}},
		UVerbs:  "uverbs2",
	}}},
	// A platform that reports no NUMA node (numa_node -1).
	"nonuma": {RDMACM: true, HCAs: []fakesys.HCA{{
		Name: "mlx5_0", PCIPath: []string{"0000:00:03.0", "0000:04:00.0"},
		Vendor: "15b3", DeviceID: "101b", Driver: "mlx5_core", NUMANode: -1,
		NetDevs: []fakesys.NetDev{{Name: "ib0"}},
		Ports:   []fakesys.Port{{Number: 1, LinkLayer: "InfiniBand", UMAD: "umad0", ISSM: "issm0"}},
		UVerbs:  "uverbs0",
	}}},
	// Two HCAs, the second with its port down.
	"portdown": {RDMACM: true, HCAs: []fakesys.HCA{
		{
			Name: "mlx5_0", PCIPath: []string{"0000:00:01.0", "0000:01:00.0"},
			Vendor: "15b3", DeviceID: "101b", Driver: "mlx5_core", NUMANode: 0,
			NetDevs: []fakesys.NetDev{{Name: "ib0"}},
			Ports:   []fakesys.Port{{Number: 1, LinkLayer: "InfiniBand", UMAD: "umad0", ISSM: "issm0"}},
			UVerbs:  "uverbs0",
		},
		{
			Name: "mlx5_1", PCIPath: []string{"0000:00:02.0", "0000:02:00.0"},
			Vendor: "15b3", DeviceID: "101b", Driver: "mlx5_core", NUMANode: 0,
			NetDevs: []fakesys.NetDev{{Name: "ib1", OperState: "down"}},
			Ports:   []fakesys.Port{{Number: 1, LinkLayer: "InfiniBand", Down: true, UMAD: "umad1", ISSM: "issm1"}},
			UVerbs:  "uverbs1",
		},
	}},
	// No /dev/infiniband/rdma_cm (rdma_ucm not loaded).
	"nordmacm": {RDMACM: false, HCAs: []fakesys.HCA{{
		Name: "mlx5_0", PCIPath: []string{"0000:00:01.0", "0000:01:00.0"},
		Vendor: "15b3", DeviceID: "101b", Driver: "mlx5_core", NUMANode: 0,
		NetDevs: []fakesys.NetDev{{Name: "ib0"}},
		Ports:   []fakesys.Port{{Number: 1, LinkLayer: "InfiniBand", UMAD: "umad0", ISSM: "issm0"}},
		UVerbs:  "uverbs0",
	}}},
}

func fixtureRoot(name string) string { return filepath.Join("testdata", name) }

// TestFixturesUpToDate regenerates every fixture into a temporary
// directory and compares it with the committed tree, so the descriptions
// above and testdata/ cannot drift apart.
func TestFixturesUpToDate(t *testing.T) {
	for name, tree := range fixtures {
		t.Run(name, func(t *testing.T) {
			if *update {
				if err := os.RemoveAll(fixtureRoot(name)); err != nil {
					t.Fatal(err)
				}
				if err := fakesys.Write(fixtureRoot(name), tree); err != nil {
					t.Fatal(err)
				}
			}
			tmp := t.TempDir()
			if err := fakesys.Write(tmp, tree); err != nil {
				t.Fatal(err)
			}
			want, got := snapshotTree(t, tmp), snapshotTree(t, fixtureRoot(name))
			for p, w := range want {
				if g, ok := got[p]; !ok {
					t.Errorf("testdata/%s/%s missing (run with -update)", name, p)
				} else if g != w {
					t.Errorf("testdata/%s/%s = %q, want %q (run with -update)", name, p, g, w)
				}
			}
			for p := range got {
				if _, ok := want[p]; !ok {
					t.Errorf("testdata/%s/%s is not generated (run with -update)", name, p)
				}
			}
		})
	}
}

// snapshotTree maps each file to its content and each symlink to "-> target".
func snapshotTree(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			out[rel] = "-> " + target
		case d.Type().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			out[rel] = string(b)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walk %s: %v", root, err)
	}
	return out
}
