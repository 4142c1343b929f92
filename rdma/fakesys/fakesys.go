// Package fakesys writes RDMA sysfs trees under a root directory: PCI
// functions with their bridges, /sys/class/infiniband devices and ports,
// infiniband_verbs/mad class entries, netdevs and /dev/infiniband nodes.
// It builds package rdma's fixtures and the simulator's NICs.
package fakesys

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Tree is the RDMA part of a host.
type Tree struct {
	HCAs []HCA
	// RDMACM creates /dev/infiniband/rdma_cm.
	RDMACM bool
	// DeviceNodes makes /dev/infiniband/* character devices with the
	// kernel's numbers (uverbsN 231:192+N, umadN 231:N, issmN 231:64+N,
	// rdma_cm 10:255, a misc minor no driver owns) so a container runtime
	// accepts them as device specs. It needs CAP_MKNOD; without it, or when
	// false, the nodes are empty regular files.
	DeviceNodes bool
}

// HCA is one RDMA device and the PCI function behind it.
type HCA struct {
	Name string // ibdev, e.g. "mlx5_0"
	// PCIPath is the chain of BDFs from the root port down to the function;
	// the host bridge is pci<domain:bus of the root port>.
	PCIPath  []string
	Vendor   string // e.g. "15b3"
	DeviceID string // e.g. "101b"
	Driver   string // e.g. "mlx5_core"; empty for no driver link
	// NUMANode is written to numa_node as is (-1 for none).
	NUMANode int
	// PhysFn, when set, makes this function a VF of the PF at that BDF
	// (a physfn link); the PF need not be in the tree.
	PhysFn   string
	NodeGUID string
	FWVer    string // default "20.35.1012"
	BoardID  string
	NetDevs  []NetDev // device/net/*
	Ports    []Port
	// UVerbs names the verbs node, e.g. "uverbs0"; empty for none.
	UVerbs string
}

// Port is one port of an HCA.
type Port struct {
	Number    int
	Down      bool   // state DOWN / phys_state Polling instead of ACTIVE / LinkUp
	LinkLayer string // "InfiniBand" or "Ethernet"
	Rate      string // default "200 Gb/sec (4X HDR)"
	// GIDNetDevs are written to gid_attrs/ndevs/0..N (RoCE).
	GIDNetDevs []string
	UMAD, ISSM string // e.g. "umad0", "issm0"; empty for none
	// Counters are written to counters/<name> (e.g. "symbol_error": 0);
	// nil writes no counters directory, as for a device without a PMA.
	Counters map[string]uint64
}

// PortCounterNames are the error counters of ports/N/counters the
// simulator writes (Documentation/ABI/stable/sysfs-class-infiniband).
var PortCounterNames = []string{
	"symbol_error", "link_downed", "link_error_recovery", "port_rcv_errors",
	"excessive_buffer_overrun_errors", "local_link_integrity_errors", "port_xmit_discards",
}

// NetDev is an interface under device/net and /sys/class/net.
type NetDev struct {
	Name string
	// DevPort is written to dev_port (0-based port index).
	DevPort   int
	OperState string // default "up"
	MTU       int    // default 1500
}

// Write creates the tree under root. Existing directories (e.g. the
// simulator's GPU bridges) are kept.
func Write(root string, t Tree) error {
	for _, h := range t.HCAs {
		if err := writeHCA(root, h, t.DeviceNodes); err != nil {
			return fmt.Errorf("write hca %s: %w", h.Name, err)
		}
	}
	if t.RDMACM {
		if err := writeDevNode(root, "rdma_cm", t.DeviceNodes); err != nil {
			return err
		}
	}
	return nil
}

// HostBridge is the "pciDDDD:BB" element above a root port.
func HostBridge(rootPort string) string {
	if i := strings.LastIndexByte(rootPort, ':'); i >= 0 {
		return "pci" + rootPort[:i]
	}
	return "pci" + rootPort
}

// DevicePath is the sysfs path (relative to root) of a PCI function.
func DevicePath(pciPath []string) string {
	return filepath.Join(append([]string{"sys", "devices", HostBridge(pciPath[0])}, pciPath...)...)
}

func writeHCA(root string, h HCA, nodes bool) error {
	if len(h.PCIPath) == 0 {
		return errors.New("no pci path")
	}
	bdf := h.PCIPath[len(h.PCIPath)-1]
	devRel := DevicePath(h.PCIPath)
	dev := filepath.Join(root, devRel)
	files := map[string]string{
		"vendor":    "0x" + h.Vendor,
		"device":    "0x" + h.DeviceID,
		"class":     "0x020700",
		"numa_node": strconv.Itoa(h.NUMANode),
	}
	for name, v := range files {
		// Keep attributes someone else (the simulator's PCI tree) wrote.
		if _, err := os.Stat(filepath.Join(dev, name)); err == nil {
			continue
		}
		if err := writeFile(filepath.Join(dev, name), v); err != nil {
			return err
		}
	}
	if err := symlinkRel(root, filepath.Join("sys", "bus", "pci", "devices", bdf), devRel); err != nil {
		return err
	}
	if h.Driver != "" {
		drv := filepath.Join("sys", "bus", "pci", "drivers", h.Driver)
		if err := os.MkdirAll(filepath.Join(root, drv), 0o755); err != nil {
			return err
		}
		if err := symlinkRel(root, filepath.Join(devRel, "driver"), drv); err != nil {
			return err
		}
	}
	if h.PhysFn != "" {
		pf := make([]string, len(h.PCIPath))
		copy(pf, h.PCIPath)
		pf[len(pf)-1] = h.PhysFn
		pfRel := DevicePath(pf)
		if err := os.MkdirAll(filepath.Join(root, pfRel), 0o755); err != nil {
			return err
		}
		if err := symlinkRel(root, filepath.Join(devRel, "physfn"), pfRel); err != nil {
			return err
		}
	}
	for _, n := range h.NetDevs {
		if err := writeNetDev(root, devRel, n, h.Ports); err != nil {
			return err
		}
	}

	ibRel := filepath.Join(devRel, "infiniband", h.Name)
	fw := h.FWVer
	if fw == "" {
		fw = "20.35.1012"
	}
	attrs := map[string]string{"fw_ver": fw, "node_guid": h.NodeGUID, "board_id": h.BoardID, "hca_type": "MT4123"}
	for name, v := range attrs {
		if v == "" {
			continue
		}
		if err := writeFile(filepath.Join(root, ibRel, name), v); err != nil {
			return err
		}
	}
	if err := symlinkRel(root, filepath.Join(ibRel, "device"), devRel); err != nil {
		return err
	}
	if err := symlinkRel(root, filepath.Join("sys", "class", "infiniband", h.Name), ibRel); err != nil {
		return err
	}
	for _, p := range h.Ports {
		if err := writePort(root, ibRel, p); err != nil {
			return err
		}
		if err := writeCharClass(root, devRel, "infiniband_mad", p.UMAD, h.Name, p.Number, nodes); err != nil {
			return err
		}
		if err := writeCharClass(root, devRel, "infiniband_mad", p.ISSM, h.Name, p.Number, nodes); err != nil {
			return err
		}
	}
	return writeCharClass(root, devRel, "infiniband_verbs", h.UVerbs, h.Name, 0, nodes)
}

func writePort(root, ibRel string, p Port) error {
	dir := filepath.Join(root, ibRel, "ports", strconv.Itoa(p.Number))
	rate := p.Rate
	if rate == "" {
		rate = "200 Gb/sec (4X HDR)"
	}
	files := map[string]string{"link_layer": p.LinkLayer, "rate": rate}
	for name, v := range files {
		if err := writeFile(filepath.Join(dir, name), v); err != nil {
			return err
		}
	}
	if err := writePortState(dir, !p.Down); err != nil {
		return err
	}
	for i, nd := range p.GIDNetDevs {
		if err := writeFile(filepath.Join(dir, "gid_attrs", "ndevs", strconv.Itoa(i)), nd); err != nil {
			return err
		}
	}
	for name, v := range p.Counters {
		if err := writeFile(filepath.Join(dir, "counters", name), strconv.FormatUint(v, 10)); err != nil {
			return err
		}
	}
	return nil
}

// counterPath is ports/N/counters/<name> of an ibdev under root.
func counterPath(root, ibdev string, port int, name string) string {
	return filepath.Join(root, "sys", "class", "infiniband", ibdev, "ports", strconv.Itoa(port), "counters", name)
}

// SetPortCounter rewrites ports/N/counters/<name> of an ibdev under root
// (a lower value than before is what a driver reload leaves). The
// counters directory must exist (Port.Counters).
func SetPortCounter(root, ibdev string, port int, name string, v uint64) error {
	p := counterPath(root, ibdev, port, name)
	if _, err := os.Stat(filepath.Dir(p)); err != nil {
		return fmt.Errorf("set counter %s of %s port %d: %w", name, ibdev, port, err)
	}
	return writeFileAtomic(p, strconv.FormatUint(v, 10))
}

// AddPortCounter adds delta to ports/N/counters/<name> of an ibdev under
// root (a missing file counts as 0) and returns the new value.
func AddPortCounter(root, ibdev string, port int, name string, delta uint64) (uint64, error) {
	var v uint64
	b, err := os.ReadFile(counterPath(root, ibdev, port, name))
	switch {
	case err == nil:
		if v, err = strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); err != nil {
			return 0, fmt.Errorf("counter %s of %s port %d: %w", name, ibdev, port, err)
		}
	case !errors.Is(err, os.ErrNotExist):
		return 0, err
	}
	v += delta
	return v, SetPortCounter(root, ibdev, port, name, v)
}

// SetPortState rewrites ports/N/state and phys_state of an ibdev under
// root: up is "4: ACTIVE" / "5: LinkUp", down is "1: DOWN" / "2: Polling"
// (what a port with its cable pulled shows).
func SetPortState(root, ibdev string, port int, up bool) error {
	dir := filepath.Join(root, "sys", "class", "infiniband", ibdev, "ports", strconv.Itoa(port))
	if _, err := os.Stat(dir); err != nil {
		return fmt.Errorf("set port state of %s port %d: %w", ibdev, port, err)
	}
	return writePortState(dir, up)
}

func writePortState(dir string, up bool) error {
	state, phys := "4: ACTIVE", "5: LinkUp"
	if !up {
		state, phys = "1: DOWN", "2: Polling"
	}
	// Each file is replaced by rename, so a concurrent reader never sees a
	// half-written attribute. The order keeps "state is DOWN" the reason a
	// reader sees throughout a transition: state goes down first and comes
	// up last.
	files := []string{"state", "phys_state"}
	vals := []string{state, phys}
	if up {
		files[0], files[1] = files[1], files[0]
		vals[0], vals[1] = vals[1], vals[0]
	}
	for i, f := range files {
		if err := writeFileAtomic(filepath.Join(dir, f), vals[i]); err != nil {
			return err
		}
	}
	return nil
}

// SetNetDevOperState rewrites /sys/class/net/<name>/operstate.
func SetNetDevOperState(root, name, state string) error {
	p := filepath.Join(root, "sys", "class", "net", name, "operstate")
	if _, err := os.Stat(p); err != nil {
		return fmt.Errorf("set operstate of %s: %w", name, err)
	}
	return writeFileAtomic(p, state)
}

func writeNetDev(root, devRel string, n NetDev, ports []Port) error {
	rel := filepath.Join(devRel, "net", n.Name)
	state := n.OperState
	if state == "" {
		state = "up"
	}
	mtu := n.MTU
	if mtu == 0 {
		mtu = 1500
	}
	typ := "1" // ARPHRD_ETHER
	for _, p := range ports {
		if p.Number == n.DevPort+1 && p.LinkLayer == "InfiniBand" {
			typ = "32" // ARPHRD_INFINIBAND
		}
	}
	files := map[string]string{"operstate": state, "mtu": strconv.Itoa(mtu), "dev_port": strconv.Itoa(n.DevPort), "type": typ, "carrier": "1"}
	for name, v := range files {
		if err := writeFile(filepath.Join(root, rel, name), v); err != nil {
			return err
		}
	}
	if err := symlinkRel(root, filepath.Join(rel, "device"), devRel); err != nil {
		return err
	}
	return symlinkRel(root, filepath.Join("sys", "class", "net", n.Name), rel)
}

// writeCharClass writes a class entry (uverbsN, umadN, issmN) below the
// PCI function, the /sys/class link to it and the /dev/infiniband node.
func writeCharClass(root, devRel, class, name, ibdev string, port int, nodes bool) error {
	if name == "" {
		return nil
	}
	rel := filepath.Join(devRel, class, name)
	if err := writeFile(filepath.Join(root, rel, "ibdev"), ibdev); err != nil {
		return err
	}
	if class == "infiniband_mad" {
		if err := writeFile(filepath.Join(root, rel, "port"), strconv.Itoa(port)); err != nil {
			return err
		}
	}
	if err := symlinkRel(root, filepath.Join("sys", "class", class, name), rel); err != nil {
		return err
	}
	return writeDevNode(root, name, nodes)
}

// devNumbers are the major and minor of an RDMA character device name.
func devNumbers(name string) (major, minor uint32, ok bool) {
	num := func(prefix string) (uint32, bool) {
		n, err := strconv.ParseUint(strings.TrimPrefix(name, prefix), 10, 32)
		return uint32(n), err == nil && strings.HasPrefix(name, prefix)
	}
	if n, ok := num("uverbs"); ok {
		return 231, 192 + n, true
	}
	if n, ok := num("umad"); ok {
		return 231, n, true
	}
	if n, ok := num("issm"); ok {
		return 231, 64 + n, true
	}
	if name == "rdma_cm" {
		return 10, 255, true
	}
	return 0, 0, false
}

// devMode is the permission rdma-core's udev rules give an RDMA device
// node: verbs and the connection manager are open to everyone, the
// management datagram nodes (umad, issm) to root only.
func devMode(name string) os.FileMode {
	if strings.HasPrefix(name, "umad") || strings.HasPrefix(name, "issm") {
		return 0o600
	}
	return 0o666
}

// writeDevNode creates /dev/infiniband/<name>: a character device when
// nodes is set and allowed, else an empty file. Either has the mode of
// devMode, whatever the umask.
func writeDevNode(root, name string, nodes bool) error {
	path := filepath.Join(root, "dev", "infiniband", name)
	if !nodes {
		return writeFile(path, "")
	}
	major, minor, ok := devNumbers(name)
	if !ok {
		return fmt.Errorf("device node %s: unknown RDMA device name", name)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != unix.Mkdev(major, minor) {
		_ = os.Remove(path)
		err := unix.Mknod(path, unix.S_IFCHR|uint32(devMode(name)), int(unix.Mkdev(major, minor)))
		if errors.Is(err, unix.EPERM) {
			if err := writeFile(path, ""); err != nil {
				return err
			}
		} else if err != nil {
			return fmt.Errorf("mknod %s: %w", path, err)
		}
	}
	return os.Chmod(path, devMode(name))
}

// symlinkRel makes root/link point at root/target with a relative target,
// as sysfs does, so the tree can be moved and read under any root.
func symlinkRel(root, link, target string) error {
	abs := filepath.Join(root, link)
	if err := os.MkdirAll(filepath.Dir(abs), 0o755); err != nil {
		return err
	}
	rel, err := filepath.Rel(filepath.Dir(link), target)
	if err != nil {
		return err
	}
	if cur, err := os.Readlink(abs); err == nil && cur == rel {
		return nil
	}
	return os.Symlink(rel, abs)
}

func writeFile(path, content string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	if content != "" {
		content += "\n"
	}
	return os.WriteFile(path, []byte(content), 0o644)
}

func writeFileAtomic(path, content string) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content+"\n"), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
