package rdma

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/prometheus/procfs/sysfs"

	"github.com/gpu-node-agent/gpu-node-agent/internal/sysfsattr"
)

// DiscoverOptions says where and how to look for RDMA devices.
type DiscoverOptions struct {
	// Root is the host root that sys/ and dev/ hang off ("/" on a host,
	// "/host" in the DaemonSet, a fixture or simulator directory in tests).
	Root string
	// HostDevPrefix is prepended to /dev/infiniband/* for DeviceSpec host
	// paths: the container runtime resolves those on the real host, so this
	// is "" in production and the simulator root when simulating.
	HostDevPrefix string
	// Links, when set, is used for the RDMA netns mode and netdev state.
	Links Links
	// AllowExclusiveNetns accepts the "exclusive" RDMA netns mode, in which
	// pods in their own network namespace cannot use the host's devices.
	AllowExclusiveNetns bool
	Logger              *slog.Logger
}

// ErrExclusiveNetns is returned by Discover when the RDMA subsystem is in
// exclusive netns mode and the configuration does not accept it.
var ErrExclusiveNetns = errors.New(`rdma netns mode is "exclusive": RDMA devices stay in the host network namespace and pods cannot open them; run "rdma system set netns shared" or set rdma.allowExclusiveNetns`)

// Discover lists the RDMA devices under opts.Root, sorted by name with
// numbers in numeric order (mlx5_2 before mlx5_10). A host
// without /sys/class/infiniband has no RDMA: that is an empty result, not
// an error. A device whose attributes cannot be read is logged and
// skipped so it does not hide the others.
func Discover(ctx context.Context, opts DiscoverOptions) ([]Device, error) {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	sysRoot := filepath.Join(opts.Root, "sys")
	classDir := filepath.Join(sysRoot, "class", "infiniband")
	if _, err := os.Stat(classDir); errors.Is(err, fs.ErrNotExist) {
		log.Info("no RDMA devices", "reason", "directory absent", "path", classDir)
		return nil, nil
	}
	sfs, err := sysfs.NewFS(sysRoot)
	if err != nil {
		return nil, fmt.Errorf("open sysfs %s: %w", sysRoot, err)
	}
	names, err := sfs.InfiniBandClassDevices()
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", classDir, err)
	}
	sort.Slice(names, func(i, j int) bool { return naturalLess(names[i], names[j]) })
	if len(names) == 0 {
		log.Info("no RDMA devices", "reason", "directory empty", "path", classDir)
		return nil, nil
	}
	chars, err := readCharDevs(sysRoot, opts.HostDevPrefix)
	if err != nil {
		return nil, err
	}
	var rdmaCM *CharDev
	if _, err := os.Stat(filepath.Join(opts.Root, "dev", "infiniband", "rdma_cm")); err == nil {
		rdmaCM = newCharDev("rdma_cm", opts.HostDevPrefix)
	}

	devs := make([]Device, 0, len(names))
	for _, name := range names {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		d, err := readDevice(sfs, sysRoot, name, chars)
		if err != nil {
			log.Warn("skipping RDMA device", "device", name, "err", err)
			continue
		}
		d.RDMACM = rdmaCM
		devs = append(devs, d)
	}

	if opts.Links != nil && len(devs) > 0 {
		mode, err := opts.Links.NetnsMode()
		switch {
		case err != nil:
			// Old kernels and simulated trees have no RDMA netlink family;
			// the devices are still usable in the default shared mode.
			log.Warn("cannot read RDMA netns mode, assuming shared", "err", err)
		case mode == "exclusive" && !opts.AllowExclusiveNetns:
			return nil, ErrExclusiveNetns
		default:
			log.Debug("RDMA netns mode", "mode", mode)
		}
	}
	states := netDevStater{sfs: sfs, links: opts.Links}
	for i := range devs {
		states.fill(devs[i].NetDevs)
		for j := range devs[i].Ports {
			states.fill(devs[i].Ports[j].NetDevs)
		}
	}
	log.Info("discovered RDMA devices", "count", len(devs), "devices", deviceNames(devs))
	return devs, nil
}

func deviceNames(devs []Device) []string {
	names := make([]string, len(devs))
	for i, d := range devs {
		names[i] = d.Name
	}
	return names
}

// readDevice reads one ibdev: procfs for the class attributes and ports,
// then what procfs does not parse (PCI function, netdevs, char devices).
func readDevice(sfs sysfs.FS, sysRoot, name string, chars charDevs) (Device, error) {
	ib, err := sfs.InfiniBandDevice(name)
	if err != nil {
		return Device{}, fmt.Errorf("read infiniband device %s: %w", name, err)
	}
	d := Device{
		Name:            name,
		NodeGUID:        ib.NodeGUID,
		FirmwareVersion: ib.FirmwareVersion,
		BoardID:         ib.BoardID,
		HCAType:         ib.HCAType,
		UVerbs:          chars.uverbs[name],
	}
	devDir := filepath.Join(sysRoot, "class", "infiniband", name, "device")
	pci, pciDir, err := readPCIFunction(devDir)
	if err != nil {
		return Device{}, fmt.Errorf("infiniband device %s: %w", name, err)
	}
	d.PCI = pci
	var devNet []netDevPort
	if pciDir != "" {
		devNet = readDevNet(filepath.Join(pciDir, "net"))
	}
	for _, n := range devNet {
		d.NetDevs = append(d.NetDevs, NetDev{Name: n.name})
	}

	nums := make([]uint, 0, len(ib.Ports))
	for n := range ib.Ports {
		nums = append(nums, n)
	}
	sort.Slice(nums, func(i, j int) bool { return nums[i] < nums[j] })
	for _, n := range nums {
		ibp := ib.Ports[n]
		p := Port{
			Number:    n,
			State:     ibp.State,
			PhysState: ibp.PhysState,
			LinkLayer: ibp.LinkLayer,
			Rate:      ibp.Rate,
			UMAD:      chars.umad[portKey{name, n}],
		}
		if p.LinkLayer == LinkLayerInfiniBand {
			p.ISSM = chars.issm[portKey{name, n}]
		}
		portDir := filepath.Join(sysRoot, "class", "infiniband", name, "ports", strconv.FormatUint(uint64(n), 10))
		seen := map[string]bool{}
		for _, nd := range devNet {
			// dev_port is 0-based; without it a single-port device owns
			// all of device/net.
			if (nd.devPort < 0 && len(nums) == 1) || nd.devPort == int(n)-1 {
				if !seen[nd.name] {
					seen[nd.name] = true
					p.NetDevs = append(p.NetDevs, NetDev{Name: nd.name})
				}
			}
		}
		for _, nd := range readGIDNetDevs(portDir) {
			if !seen[nd] {
				seen[nd] = true
				p.NetDevs = append(p.NetDevs, NetDev{Name: nd, Virtual: true})
			}
		}
		d.Ports = append(d.Ports, p)
	}
	return d, nil
}

// readPCIFunction resolves the "device" link of an ibdev. procfs parses
// PCI devices only as a whole /sys/bus/pci listing, so the few attributes
// needed here are read directly.
func readPCIFunction(devLink string) (PCIFunction, string, error) {
	pci := PCIFunction{NUMANode: -1}
	dir, err := filepath.EvalSymlinks(devLink)
	if errors.Is(err, fs.ErrNotExist) {
		return pci, "", nil // software RDMA (rxe, siw) has no PCI parent
	}
	if err != nil {
		return pci, "", fmt.Errorf("resolve %s: %w", devLink, err)
	}
	hb, chain, err := parsePCIPath(filepath.ToSlash(dir))
	if err != nil {
		return pci, "", nil // not a PCI parent
	}
	pci.HostBridge = hb
	pci.Path = chain
	pci.Address = chain[len(chain)-1]
	pci.Vendor = readHex(filepath.Join(dir, "vendor"))
	pci.DeviceID = readHex(filepath.Join(dir, "device"))
	if s, err := sysfsattr.Read(filepath.Join(dir, "numa_node")); err == nil {
		if n, err := strconv.Atoi(s); err == nil && n >= 0 {
			pci.NUMANode = n
		}
	}
	if t, err := os.Readlink(filepath.Join(dir, "driver")); err == nil {
		pci.Driver = filepath.Base(t)
	}
	if t, err := os.Readlink(filepath.Join(dir, "physfn")); err == nil {
		pci.PhysFn = filepath.Base(t)
	}
	return pci, dir, nil
}

type netDevPort struct {
	name    string
	devPort int // -1 when dev_port is absent
}

// readDevNet lists device/net/* with each interface's dev_port.
func readDevNet(dir string) []netDevPort {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []netDevPort
	for _, e := range entries {
		nd := netDevPort{name: e.Name(), devPort: -1}
		if s, err := sysfsattr.Read(filepath.Join(dir, e.Name(), "dev_port")); err == nil {
			if n, err := strconv.Atoi(s); err == nil {
				nd.devPort = n
			}
		}
		out = append(out, nd)
	}
	return out
}

// readGIDNetDevs reads ports/N/gid_attrs/ndevs/*: the netdev of each RoCE
// GID. Unused GID entries fail to read (EINVAL) or are empty.
func readGIDNetDevs(portDir string) []string {
	dir := filepath.Join(portDir, "gid_attrs", "ndevs")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	sort.Slice(entries, func(i, j int) bool { return gidIndex(entries[i].Name()) < gidIndex(entries[j].Name()) })
	var out []string
	for _, e := range entries {
		s, err := sysfsattr.Read(filepath.Join(dir, e.Name()))
		if err == nil && s != "" {
			out = append(out, s)
		}
	}
	return out
}

func gidIndex(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		return 1 << 30
	}
	return n
}

type portKey struct {
	dev  string
	port uint
}

type charDevs struct {
	uverbs     map[string]*CharDev
	umad, issm map[portKey]*CharDev
}

// readCharDevs maps ibdevs to /sys/class/infiniband_verbs/uverbsN (file
// ibdev) and ports to /sys/class/infiniband_mad/{umad,issm}N (files ibdev
// and port).
func readCharDevs(sysRoot, hostPrefix string) (charDevs, error) {
	c := charDevs{uverbs: map[string]*CharDev{}, umad: map[portKey]*CharDev{}, issm: map[portKey]*CharDev{}}
	verbs := filepath.Join(sysRoot, "class", "infiniband_verbs")
	entries, err := os.ReadDir(verbs)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return c, fmt.Errorf("list %s: %w", verbs, err)
	}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "uverbs") {
			continue // abi_version
		}
		ibdev, err := sysfsattr.Read(filepath.Join(verbs, e.Name(), "ibdev"))
		if err == nil {
			c.uverbs[ibdev] = newCharDev(e.Name(), hostPrefix)
		}
	}
	mad := filepath.Join(sysRoot, "class", "infiniband_mad")
	entries, err = os.ReadDir(mad)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return c, fmt.Errorf("list %s: %w", mad, err)
	}
	for _, e := range entries {
		var m map[portKey]*CharDev
		switch {
		case strings.HasPrefix(e.Name(), "umad"):
			m = c.umad
		case strings.HasPrefix(e.Name(), "issm"):
			m = c.issm
		default:
			continue
		}
		ibdev, err1 := sysfsattr.Read(filepath.Join(mad, e.Name(), "ibdev"))
		port, err2 := sysfsattr.Read(filepath.Join(mad, e.Name(), "port"))
		n, err3 := strconv.ParseUint(port, 10, 32)
		if err1 != nil || err2 != nil || err3 != nil {
			continue
		}
		m[portKey{ibdev, uint(n)}] = newCharDev(e.Name(), hostPrefix)
	}
	return c, nil
}

func newCharDev(name, hostPrefix string) *CharDev {
	p := "/dev/infiniband/" + name
	return &CharDev{Name: name, Path: p, HostPath: filepath.Join("/", hostPrefix, p)}
}

// readHex reads a sysfs hex attribute ("0x15b3") as lower-case "15b3".
func readHex(path string) string {
	s, err := sysfsattr.Read(path)
	if err != nil {
		return ""
	}
	return strings.TrimPrefix(strings.ToLower(s), "0x")
}

// netDevStater fills NetDev state from netlink when the interface lives in
// the handle's namespace, else from /sys/class/net (simulated trees).
type netDevStater struct {
	sfs   sysfs.FS
	links Links
}

func (s netDevStater) state(name string) NetDev {
	nd := NetDev{Name: name}
	if s.links != nil {
		li, err := s.links.Link(name)
		if err == nil {
			nd.OperState, nd.AdminUp, nd.MTU = li.OperState, li.AdminUp, li.MTU
			return nd
		}
	}
	if c, err := s.sfs.NetClassByIface(name); err == nil {
		nd.OperState = c.OperState
		nd.AdminUp = true // sysfs flags are not parsed; operstate says enough
		if c.MTU != nil {
			nd.MTU = int(*c.MTU)
		}
	}
	return nd
}

func (s netDevStater) fill(nds []NetDev) {
	for i := range nds {
		virtual := nds[i].Virtual
		nds[i] = s.state(nds[i].Name)
		nds[i].Virtual = virtual
	}
}

// naturalLess orders names by their text and then the number they end in,
// so mlx5_2 sorts before mlx5_10.
func naturalLess(a, b string) bool {
	pa, na := splitNumber(a)
	pb, nb := splitNumber(b)
	if pa != pb || na < 0 || nb < 0 {
		return a < b
	}
	return na < nb
}

// splitNumber splits "mlx5_10" into "mlx5_" and 10; n is -1 when the name
// does not end in digits.
func splitNumber(s string) (prefix string, n int) {
	i := len(s)
	for i > 0 && s[i-1] >= '0' && s[i-1] <= '9' {
		i--
	}
	v, err := strconv.Atoi(s[i:])
	if err != nil {
		return s, -1
	}
	return s[:i], v
}
