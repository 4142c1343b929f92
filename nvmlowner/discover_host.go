package nvmlowner

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-node-agent/gpu-node-agent/internal/sysfsattr"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// host reads the node-wide facts the labels carry: the driver and CUDA
// versions (NVML, on the library's lane), the DMI product name and the vGPU
// capability of the NVIDIA PCI functions (sysfs under the host root). A
// version NVML fails to give (other than NOT_SUPPORTED) is noted unread.
func (d *discovery) host() topology.Host {
	var h topology.Host
	var driver string
	err := d.x.o.Lib(d.ctx, "SystemGetDriverVersion", func(lib Library) nvml.Return {
		v, r := lib.SystemGetDriverVersion()
		driver = v
		return r
	})
	if err == nil {
		h.DriverVersion = driver
	} else if !finished(err) || !noData(ret(err)) {
		d.noteUnread("SystemGetDriverVersion: " + err.Error())
	}
	var cuda int
	err = d.x.o.Lib(d.ctx, "SystemGetCudaDriverVersion", func(lib Library) nvml.Return {
		v, r := lib.SystemGetCudaDriverVersion()
		cuda = v
		return r
	})
	if err == nil {
		h.CUDADriverVersion = cuda
	} else if !finished(err) || !noData(ret(err)) {
		d.noteUnread("SystemGetCudaDriverVersion: " + err.Error())
	}
	h.MachineType = machineType(d.x.hostRoot)
	v, err := readVGPU(d.x.hostRoot)
	if err != nil {
		d.x.log.Debug("no vgpu information", "err", err)
	} else {
		h.VGPU = v
	}
	return h
}

// machineType is <hostRoot>/sys/class/dmi/id/product_name, trimmed (GFD's
// default --machine-type-file); "" when it cannot be read.
func machineType(hostRoot string) string {
	s, err := sysfsattr.Read(filepath.Join(hostRoot, "sys", "class", "dmi", "id", "product_name"))
	if err != nil {
		return ""
	}
	return s
}

// pciClass is /sys/bus/pci/devices/<bdf>/class ("0x030200"); 0 when it
// cannot be read.
func pciClass(hostRoot, busID string) uint32 {
	c, err := sysfsattr.Hex(filepath.Join(hostRoot, "sys", "bus", "pci", "devices", busID, "class"))
	if err != nil || c > math.MaxUint32 {
		return 0
	}
	return uint32(c)
}

// PCI configuration space offsets (PCI Local Bus 3.0, 6.1 and 6.7).
const (
	pciStatus          = 0x06
	pciStatusCapList   = 0x10
	pciCapPointer      = 0x34
	pciCapVendorSpecID = 0x09
)

// readVGPU finds whether the NVIDIA PCI functions under hostRoot are vGPUs,
// as GFD v0.20.0 (internal/vgpu) does: a function is a vGPU when its first
// vendor-specific capability carries the "VF" signature (bytes 3-4), and
// record 0 of that capability names the host driver's version and branch
// (10 bytes each). Like GFD it needs each function's whole 256-byte
// configuration space (root reads it; others get 64 bytes) and fails
// rather than guess when one cannot be read.
func readVGPU(hostRoot string) (*topology.VGPU, error) {
	dir := filepath.Join(hostRoot, "sys", "bus", "pci", "devices")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("pci devices: %w", err)
	}
	v := &topology.VGPU{}
	for _, e := range entries {
		vendor, err := sysfsattr.Read(filepath.Join(dir, e.Name(), "vendor"))
		if err != nil {
			return nil, fmt.Errorf("pci device %s vendor: %w", e.Name(), err)
		}
		if vendor != "0x10de" {
			continue
		}
		cfg, err := os.ReadFile(filepath.Join(dir, e.Name(), "config"))
		if err != nil {
			return nil, fmt.Errorf("pci device %s config: %w", e.Name(), err)
		}
		if len(cfg) < 256 {
			return nil, fmt.Errorf("pci device %s config: %d bytes, want 256 (not root?)", e.Name(), len(cfg))
		}
		c := vendorCapability(cfg)
		if len(c) < 5 || c[3] != 'V' || c[4] != 'F' {
			continue
		}
		v.Present = true
		if ver, branch, ok := vgpuHostDriver(c); ok {
			v.HostDriverVersion, v.HostDriverBranch = ver, branch
		}
	}
	return v, nil
}

// vendorCapability returns the first vendor-specific capability in cfg's
// capability list (ID, next, length, then its data), nil when there is
// none. A list that loops or breaks ends the search.
func vendorCapability(cfg []byte) []byte {
	if cfg[pciStatus]&pciStatusCapList == 0 {
		return nil
	}
	var seen [256]bool
	for pos := cfg[pciCapPointer]; pos != 0 && !seen[pos] && int(pos)+2 < len(cfg); {
		seen[pos] = true
		id, next, length := cfg[pos], cfg[pos+1], cfg[pos+2]
		if id == 0xff {
			return nil
		}
		if id == pciCapVendorSpecID {
			end := min(int(pos)+int(length), len(cfg))
			return cfg[pos:end]
		}
		pos = next
	}
	return nil
}

// vgpuHostDriver walks the records of a vGPU capability from byte 5 (ID,
// length) to record 0 and reads its two 10-byte fields.
func vgpuHostDriver(c []byte) (version, branch string, ok bool) {
	pos := 5
	for pos+1 < len(c) && c[pos] != 0 {
		if c[pos+1] == 0 {
			return "", "", false
		}
		pos += int(c[pos+1])
	}
	if pos+22 > len(c) {
		return "", "", false
	}
	trim := func(b []byte) string { return strings.Trim(string(b), "\x00") }
	return trim(c[pos+2 : pos+12]), trim(c[pos+12 : pos+22]), true
}
