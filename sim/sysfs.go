package sim

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// pciFunction is what the simulator writes for one PCI function in sysfs.
type pciFunction struct {
	vendor, device, class uint32
}

var (
	rootPortFn   = pciFunction{vendor: 0x1022, device: 0x1483, class: 0x060400} // AMD root port
	switchPortFn = pciFunction{vendor: 0x10b5, device: 0xc010, class: 0x060400} // Broadcom/PLX switch port
)

// nicFunction is a ConnectX NIC: InfiniBand or Ethernet controller class.
func nicFunction(linkLayer string) pciFunction {
	if strings.EqualFold(linkLayer, "Ethernet") {
		return pciFunction{vendor: 0x15b3, device: 0x101b, class: 0x020000}
	}
	return pciFunction{vendor: 0x15b3, device: 0x101b, class: 0x020700}
}

// writeHostTree writes the simulated /sys PCI tree and /dev nodes.
func (n *Node) writeHostTree() error {
	for i, g := range n.spec.GPUs {
		path := g.PCIPath
		if len(path) == 0 {
			path = []string{g.PCIBusID}
		}
		gpuFn := pciFunction{vendor: 0x10de, device: n.gpus[i].cfg.PciDeviceId >> 16, class: 0x030200}
		if err := n.addPCIDevice(path, g.NUMANode, gpuFn); err != nil {
			return fmt.Errorf("gpu %d: %w", i, err)
		}
		cfg := pciConfig(gpuFn, n.spec.Host.VGPU)
		if err := os.WriteFile(filepath.Join(n.hostRoot, "sys", "bus", "pci", "devices", g.PCIBusID, "config"), cfg, 0o644); err != nil {
			return fmt.Errorf("gpu %d: %w", i, err)
		}
	}
	if m := n.spec.Host.MachineType; m != "" {
		dmi := filepath.Join(n.hostRoot, "sys", "class", "dmi", "id")
		if err := os.MkdirAll(dmi, 0o755); err != nil {
			return err
		}
		// Read-only as the kernel's; replaced by rename so a restarted
		// container without CAP_DAC_OVERRIDE starts in the same root.
		if err := writeReadOnly(filepath.Join(dmi, "product_name"), []byte(m+"\n")); err != nil {
			return err
		}
	}
	for i, nic := range n.spec.NICs {
		path := nic.PCIPath
		if len(path) == 0 && nic.PCIBusID != "" {
			path = []string{nic.PCIBusID}
		}
		if len(path) == 0 {
			continue
		}
		if err := n.addPCIDevice(path, nic.NUMANode, nicFunction(nic.LinkLayer)); err != nil {
			return fmt.Errorf("nic %d (%s): %w", i, nic.Name, err)
		}
	}
	dev := filepath.Join(n.hostRoot, "dev")
	if err := os.MkdirAll(filepath.Join(dev, "nvidia-caps"), 0o755); err != nil {
		return err
	}
	nodes := []string{"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-caps/nvidia-cap1", "nvidia-caps/nvidia-cap2"}
	for _, g := range n.spec.GPUs {
		nodes = append(nodes, fmt.Sprintf("nvidia%d", g.Minor))
	}
	for _, name := range nodes {
		if err := placeholder(filepath.Join(dev, name)); err != nil {
			return err
		}
	}
	return n.writeMIGMinors()
}

// addPCIDevice creates the sysfs directories of a PCI path (root port first,
// the device last) under /sys/devices/pci<domain:bus>/, each with vendor,
// device, class and numa_node files, and the /sys/bus/pci/devices/<bdf>
// symlink, reusing whatever part of the path exists already. Bridges get
// switchPortFn (rootPortFn for the root port); the last element gets fn.
func (n *Node) addPCIDevice(path []string, numa int, fn pciFunction) error {
	sys := filepath.Join(n.hostRoot, "sys")
	dir := filepath.Join(sys, "devices", "pci"+path[0][:7])
	busDir := filepath.Join(sys, "bus", "pci", "devices")
	if err := os.MkdirAll(busDir, 0o755); err != nil {
		return err
	}
	for k, addr := range path {
		dir = filepath.Join(dir, addr)
		if _, err := os.Stat(dir); err == nil {
			continue
		}
		f := switchPortFn
		switch {
		case k == len(path)-1:
			f = fn
		case k == 0:
			f = rootPortFn
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		files := map[string]string{
			"vendor":    fmt.Sprintf("0x%04x\n", f.vendor),
			"device":    fmt.Sprintf("0x%04x\n", f.device),
			"class":     fmt.Sprintf("0x%06x\n", f.class),
			"numa_node": fmt.Sprintf("%d\n", numa),
		}
		for name, content := range files {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
				return err
			}
		}
		rel, err := filepath.Rel(busDir, dir)
		if err != nil {
			return err
		}
		link := filepath.Join(busDir, addr)
		if err := os.Symlink(rel, link); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
	}
	return nil
}

// pciConfig is the first 256 bytes of a GPU's PCI configuration space, as
// root reads /sys/bus/pci/devices/<bdf>/config (PCI Local Bus 3.0, 6.1 and
// 6.7): vendor and device IDs, the status register's capabilities-list bit
// (0x10 at 0x06), the capabilities pointer (0x34) and a list of power
// management (ID 0x01), MSI (0x05) and PCI Express (0x10). A vGPU (a GPU
// passed to a guest by NVIDIA's vGPU manager) also carries a
// vendor-specific capability (ID 0x09) whose bytes 3-4 are "VF", followed
// by records of which ID 0 holds the host driver's version and branch, 10
// bytes each (how gpu-feature-discovery v0.20.0 internal/vgpu reads it).
func pciConfig(fn pciFunction, vgpu *topology.VGPU) []byte {
	c := make([]byte, 256)
	binary.LittleEndian.PutUint16(c[0x00:], uint16(fn.vendor))
	binary.LittleEndian.PutUint16(c[0x02:], uint16(fn.device))
	c[0x06] = 0x10
	c[0x09], c[0x0a], c[0x0b] = byte(fn.class), byte(fn.class>>8), byte(fn.class>>16)
	c[0x34] = 0x60
	c[0x60], c[0x61] = 0x01, 0x68 // power management
	c[0x68], c[0x69] = 0x05, 0x78 // MSI
	c[0x78], c[0x79] = 0x10, 0x00 // PCI Express, last
	if vgpu != nil && vgpu.Present {
		c[0x79] = 0xc8
		v := c[0xc8:]
		v[0], v[1], v[2], v[3], v[4] = 0x09, 0x00, 27, 'V', 'F'
		v[5], v[6] = 0, 22 // record 0: host driver version and branch
		copy(v[7:17], vgpu.HostDriverVersion)
		copy(v[17:27], vgpu.HostDriverBranch)
	}
	return c
}

// placeholder makes a GPU device node: a character device with the
// driver's numbers when the process may mknod (so a container runtime
// accepts it as a device spec or CDI device node in end-to-end runs), else
// an empty file. NVIDIA's numbers: major 195 ("nvidia-frontend" in
// /proc/devices), minor N for /dev/nvidiaN and 255 for /dev/nvidiactl
// (nvidia-modprobe's NV_CTL_DEVICE_MINOR); nvidia-uvm and nvidia-caps get
// dynamic majors from the kernel, stood in for here by 510 and 511 (minor
// 0 uvm, 1 uvm-tools; the capability's minor for nvidia-capN).
func placeholder(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	if major, minor, ok := nvidiaDevNumbers(filepath.Base(path)); ok {
		var st unix.Stat_t
		if err := unix.Lstat(path, &st); err == nil && st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == unix.Mkdev(major, minor) {
			return nil
		}
		_ = os.Remove(path)
		err := unix.Mknod(path, unix.S_IFCHR|0o666, int(unix.Mkdev(major, minor)))
		if err == nil {
			return os.Chmod(path, 0o666)
		}
		if !errors.Is(err, unix.EPERM) {
			return fmt.Errorf("mknod %s: %w", path, err)
		}
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o666)
	if err != nil {
		return err
	}
	return f.Close()
}

// nvidiaDevNumbers are the device numbers of a GPU device node by name
// (see placeholder).
func nvidiaDevNumbers(name string) (major, minor uint32, ok bool) {
	num := func(prefix string) (uint32, bool) {
		n, err := strconv.ParseUint(strings.TrimPrefix(name, prefix), 10, 20)
		return uint32(n), err == nil && strings.HasPrefix(name, prefix)
	}
	switch name {
	case "nvidiactl":
		return 195, 255, true
	case "nvidia-uvm":
		return 510, 0, true
	case "nvidia-uvm-tools":
		return 510, 1, true
	}
	if n, ok := num("nvidia-cap"); ok {
		return 511, n, true
	}
	if n, ok := num("nvidia"); ok && n < 255 {
		return 195, n, true
	}
	return 0, 0, false
}

// MIG capability minors as the driver numbers them in
// /proc/driver/nvidia-caps/mig-minors: 1 config, 2 monitor, then for each
// GPU minor (0..31) 15 GPU instances of 1 access + 8 compute instances.
const (
	migCapsGPUs = 32
	migCapsGIs  = 15
	migCapsCIs  = 8
)

func giCapMinor(gpuMinor, gi int) int {
	return 3 + gpuMinor*migCapsGIs*(migCapsCIs+1) + gi*(migCapsCIs+1)
}

func ciCapMinor(gpuMinor, gi, ci int) int { return giCapMinor(gpuMinor, gi) + 1 + ci }

func (n *Node) writeMIGMinors() error {
	var b strings.Builder
	b.WriteString("config 1\nmonitor 2\n")
	for g := 0; g < migCapsGPUs; g++ {
		for gi := 0; gi < migCapsGIs; gi++ {
			fmt.Fprintf(&b, "gpu%d/gi%d/access %d\n", g, gi, giCapMinor(g, gi))
			for ci := 0; ci < migCapsCIs; ci++ {
				fmt.Fprintf(&b, "gpu%d/gi%d/ci%d/access %d\n", g, gi, ci, ciCapMinor(g, gi, ci))
			}
		}
	}
	path := filepath.Join(n.hostRoot, "proc", "driver", "nvidia-caps", "mig-minors")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return writeReadOnly(path, []byte(b.String()))
}

// writeMIGCaps mirrors the current MIG layout into
// /proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<N>[/ci<M>]/access (what
// the NVIDIA device plugin reads for a MIG device's capability minors) and
// /dev/nvidia-caps/nvidia-cap<minor> placeholders, dropping those of
// instances that are gone. A GPU instance without a compute instance yet
// has its gi<N> files alone.
func (n *Node) writeMIGCaps() error {
	n.mu.RLock()
	spec := cloneNode(n.spec)
	gis := make([][]int, len(n.gpus))
	for i, g := range n.gpus {
		for _, gi := range g.gis {
			gis[i] = append(gis[i], gi.id)
		}
	}
	n.mu.RUnlock()
	caps := filepath.Join(n.hostRoot, "proc", "driver", "nvidia", "capabilities")
	devCaps := filepath.Join(n.hostRoot, "dev", "nvidia-caps")
	want := map[string]bool{"nvidia-cap1": true, "nvidia-cap2": true}
	for i, g := range spec.GPUs {
		migDir := filepath.Join(caps, fmt.Sprintf("gpu%d", g.Minor), "mig")
		if err := os.RemoveAll(migDir); err != nil {
			return err
		}
		if !g.MIGEnabled {
			continue
		}
		for _, id := range gis[i] {
			gi := giCapMinor(g.Minor, id)
			if err := writeCap(filepath.Join(migDir, fmt.Sprintf("gi%d", id), "access"), gi); err != nil {
				return err
			}
			name := fmt.Sprintf("nvidia-cap%d", gi)
			want[name] = true
			if err := placeholder(filepath.Join(devCaps, name)); err != nil {
				return err
			}
		}
		for _, m := range g.MIG {
			gi := giCapMinor(g.Minor, m.GPUInstance)
			ci := ciCapMinor(g.Minor, m.GPUInstance, m.ComputeInstance)
			giDir := filepath.Join(migDir, fmt.Sprintf("gi%d", m.GPUInstance))
			ciDir := filepath.Join(giDir, fmt.Sprintf("ci%d", m.ComputeInstance))
			if err := writeCap(filepath.Join(giDir, "access"), gi); err != nil {
				return err
			}
			if err := writeCap(filepath.Join(ciDir, "access"), ci); err != nil {
				return err
			}
			for _, minor := range []int{gi, ci} {
				name := fmt.Sprintf("nvidia-cap%d", minor)
				want[name] = true
				if err := placeholder(filepath.Join(devCaps, name)); err != nil {
					return err
				}
			}
		}
	}
	entries, err := os.ReadDir(devCaps)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !want[e.Name()] {
			if err := os.Remove(filepath.Join(devCaps, e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

func writeCap(path string, minor int) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	content := fmt.Sprintf("DeviceFileMinor: %d\nDeviceFileMode: 292\nDeviceFileModify: 1\n", minor)
	return writeReadOnly(path, []byte(content))
}

// writeReadOnly replaces path with a read-only file holding data, as the
// driver's proc files are. It writes a sibling and renames it over path, so
// a second agent start in the same host root (a restarted container without
// CAP_DAC_OVERRIDE) can still replace the file, and readers never see it
// half-written.
func writeReadOnly(path string, data []byte) error {
	tmp := path + ".tmp"
	_ = os.Remove(tmp)
	if err := os.WriteFile(tmp, data, 0o444); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
