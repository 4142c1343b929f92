package fakesys

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func TestDeviceNodes(t *testing.T) {
	tree := Tree{RDMACM: true, DeviceNodes: true, HCAs: []HCA{{
		Name: "mlx5_3", PCIPath: []string{"0000:00:01.0", "0000:01:00.0"}, Vendor: "15b3", DeviceID: "101b",
		Ports:  []Port{{Number: 1, LinkLayer: "InfiniBand", UMAD: "umad3", ISSM: "issm3"}},
		UVerbs: "uverbs3",
	}}}
	root := t.TempDir()
	if err := Write(root, tree); err != nil {
		t.Fatal(err)
	}
	canMknod := os.Geteuid() == 0
	tests := []struct {
		name         string
		major, minor uint32
		perm         uint32
	}{
		{"uverbs3", 231, 195, 0o666},
		{"umad3", 231, 3, 0o600},
		{"issm3", 231, 67, 0o600},
		{"rdma_cm", 10, 255, 0o666},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var st unix.Stat_t
			if err := unix.Lstat(filepath.Join(root, "dev", "infiniband", tt.name), &st); err != nil {
				t.Fatal(err)
			}
			if got := st.Mode & 0o777; got != tt.perm {
				t.Errorf("permissions %o, want %o (rdma-core's udev rules)", got, tt.perm)
			}
			if !canMknod {
				if st.Mode&unix.S_IFMT != unix.S_IFREG {
					t.Errorf("mode %o, want a regular file without CAP_MKNOD", st.Mode)
				}
				return
			}
			if st.Mode&unix.S_IFMT != unix.S_IFCHR {
				t.Fatalf("mode %o, want a character device", st.Mode)
			}
			if got := [2]uint32{unix.Major(st.Rdev), unix.Minor(st.Rdev)}; got != [2]uint32{tt.major, tt.minor} {
				t.Errorf("device %d:%d, want %d:%d", got[0], got[1], tt.major, tt.minor)
			}
		})
	}
	// Writing again over existing nodes is fine (the simulator rewrites).
	if err := Write(root, tree); err != nil {
		t.Errorf("second Write: %v", err)
	}
}

func TestSetStateErrors(t *testing.T) {
	root := t.TempDir()
	if err := SetPortState(root, "mlx5_0", 1, false); err == nil {
		t.Error("SetPortState on a missing device succeeded")
	}
	if err := SetNetDevOperState(root, "ib0", "down"); err == nil {
		t.Error("SetNetDevOperState on a missing netdev succeeded")
	}
}
