package topology

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Discover builds the node model from NVML and the sysfs under hostRoot
// ("/" on a host, "/host" in a container that mounts the host's /sys there).
// It reads GPUs (UUID, bus ID, NUMA node, model, memory, minor, PCI path),
// MIG mode and MIG devices, NVLink counts per GPU pair (direct links and
// links through NVSwitch: a pair on the switch fabric gets the smaller of
// the two GPUs' switch link counts) and the PCIe common-ancestor level of
// every pair. lib must be initialised.
//
// One GPU's failure never fails discovery: a GPU that NVML reports lost, or
// whose identity cannot be read, is kept with Lost set. Only NVML failing to
// report the device count is an error. Discovery is slow-ish (hundreds of
// NVML calls); call it at start and when devices change, never on a request
// path. Discover waits for every call however long it takes; a process
// that rediscovers uses a Discoverer with a CallTimeout instead.
func Discover(lib nvml.Interface, hostRoot string, log *slog.Logger) (*Node, error) {
	return NewDiscoverer(lib, hostRoot, log).Discover(Options{})
}

// Discover builds the node model as the package-level Discover does, with
// each GPU's reads on their own goroutine bounded by opts.CallTimeout and
// the links reused from opts.Previous while the GPU set is unchanged.
func (x *Discoverer) Discover(opts Options) (*Node, error) {
	x.run.Lock()
	defer x.run.Unlock()
	count, ret := x.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("discover gpus: device count: %w", ret)
	}
	d := discovery{lib: x.lib, hostRoot: x.hostRoot, log: x.log, node: &Node{}}
	d.handles = make([]nvml.Device, count)
	for i, o := range bounded(x, count, opts.CallTimeout, nil, d.gpu) {
		if o.ok {
			d.node.GPUs = append(d.node.GPUs, o.val.gpu)
			d.handles[i] = o.val.dev
			continue
		}
		d.node.GPUs = append(d.node.GPUs, d.timedOut(i, o.uuid, o.busID, o.lostReason()))
	}
	reused := opts.Previous != nil && sameGPUs(opts.Previous.GPUs, d.node.GPUs)
	if reused {
		// The wiring of an unchanged GPU set does not change: skipping
		// its queries makes a steady-state rescan a few calls per GPU.
		d.node.Links = slices.Clone(opts.Previous.Links)
	} else {
		d.links(x, opts.CallTimeout)
	}
	lost := 0
	for _, g := range d.node.GPUs {
		if g.Lost {
			lost++
		}
	}
	x.log.Info("discovered gpu topology", "gpus", count, "lost", lost, "links", len(d.node.Links), "linksReused", reused)
	return d.node, nil
}

// sameGPUs says whether two discoveries found the same GPUs in the same
// order, lost or not alike (a GPU that is lost, or back, changes the links).
func sameGPUs(a, b []GPU) bool {
	return slices.EqualFunc(a, b, func(x, y GPU) bool {
		return x.UUID == y.UUID && x.PCIBusID == y.PCIBusID && x.Lost == y.Lost
	})
}

// discovery is one discovery's state. Its methods that take a *GPU run on
// that GPU's own goroutine and touch only that GPU value; node and handles
// are written on the discovering goroutine only.
type discovery struct {
	lib      nvml.Interface
	hostRoot string
	log      *slog.Logger
	node     *Node
	handles  []nvml.Device
}

type directLink struct {
	from  int
	toBus string
}

// lost records why a GPU is considered lost (once) and marks it.
func (d *discovery) lost(g *GPU, what string, ret nvml.Return) {
	if !g.Lost {
		d.log.Warn("gpu marked lost during discovery", "index", g.Index, "uuid", g.UUID, "call", what, "err", ret.Error())
		g.LostReason = what + ": " + ret.Error()
	}
	g.Lost = true
}

// timedOut is GPU i whose reads did not return in time: kept, Lost, with
// the identity it had got to (a device ID either way, as in gpu).
func (d *discovery) timedOut(i int, uuid, busID, reason string) GPU {
	if uuid == "" {
		uuid = LostGPUID(i)
	}
	d.log.Warn("gpu marked lost during discovery", "index", i, "uuid", uuid, "reason", reason)
	return GPU{Index: i, UUID: uuid, PCIBusID: busID, NUMANode: -1, Lost: true, LostReason: reason}
}

// check handles an optional query's result: GPU_IS_LOST marks the GPU lost,
// anything else but success is logged at debug and the field stays empty.
func (d *discovery) check(g *GPU, what string, ret nvml.Return) bool {
	switch ret {
	case nvml.SUCCESS:
		return true
	case nvml.ERROR_GPU_IS_LOST:
		d.lost(g, what, ret)
	default:
		d.log.Debug("gpu query failed", "index", g.Index, "call", what, "err", ret.Error())
	}
	return false
}

// gpuRead is what one GPU's read hands back: the GPU and its handle (nil
// when NVML gave none).
type gpuRead struct {
	gpu GPU
	dev nvml.Device
}

// gpu reads GPU i on its own goroutine (see bounded), recording each call
// in p before making it so a discovery that stops waiting can say where
// the GPU hung.
func (d *discovery) gpu(i int, p *progress) gpuRead {
	g := GPU{Index: i, NUMANode: -1}
	p.at("DeviceGetHandleByIndex")
	dev, ret := d.lib.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		d.lost(&g, "DeviceGetHandleByIndex", ret)
		g.UUID = LostGPUID(i)
		return gpuRead{gpu: g}
	}
	p.at("GetUUID")
	uuid, ret := dev.GetUUID()
	if ret != nvml.SUCCESS {
		d.lost(&g, "GetUUID", ret)
	}
	g.UUID = uuid
	p.identity(uuid, "")
	p.at("GetPciInfo")
	if pci, ret := dev.GetPciInfo(); ret == nvml.SUCCESS {
		g.PCIBusID = busIDFromPciInfo(pci)
		p.identity("", g.PCIBusID)
	} else {
		d.lost(&g, "GetPciInfo", ret)
	}
	if g.PCIBusID != "" {
		p.at("sysfs numa_node and pci path")
		g.NUMANode = d.numaNode(g.PCIBusID)
		g.PCIPath = d.pciPath(g.PCIBusID)
	}
	p.at("GetName")
	if name, ret := dev.GetName(); d.check(&g, "GetName", ret) {
		g.Model = name
	}
	var totalMemory uint64
	p.at("GetMemoryInfo")
	if mem, ret := dev.GetMemoryInfo(); d.check(&g, "GetMemoryInfo", ret) {
		totalMemory = mem.Total
		g.MemoryMiB = mem.Total >> 20
	}
	p.at("GetMinorNumber")
	if minor, ret := dev.GetMinorNumber(); d.check(&g, "GetMinorNumber", ret) {
		g.Minor = minor
	}
	p.at("MIG mode and devices")
	d.mig(&g, dev, totalMemory)
	// A GPU lost before its UUID could be read still needs a device ID, or
	// it would vanish from the device lists instead of being advertised
	// Unhealthy (and two such GPUs would share the empty ID).
	if g.UUID == "" {
		g.UUID = LostGPUID(i)
	}
	return gpuRead{gpu: g, dev: dev}
}

// busIDFromPciInfo returns NVML's bus ID in the form sysfs and Kubernetes
// use: "0000:07:00.0", lower case. NVML's BusId carries an eight-digit
// domain ("00000000:07:00.0"); like the NVIDIA device plugin we drop the
// extra leading zeros.
func busIDFromPciInfo(p nvml.PciInfo) string {
	id := cString(p.BusId[:])
	if id == "" {
		id = cString(p.BusIdLegacy[:])
	}
	if id == "" {
		return fmt.Sprintf("%04x:%02x:%02x.0", p.Domain, p.Bus, p.Device)
	}
	return NormalizeBusID(id)
}

// NormalizeBusID turns an NVML or sysfs spelling of a PCI address
// ("00000000:0A:00.0", "0000:0a:00.0") into "0000:0a:00.0"; strings that do
// not parse are returned lower-cased.
func NormalizeBusID(s string) string {
	s = strings.ToLower(strings.TrimSpace(s))
	var dom, bus, dev, fn uint64
	if _, err := fmt.Sscanf(s, "%x:%x:%x.%x", &dom, &bus, &dev, &fn); err != nil {
		return s
	}
	return fmt.Sprintf("%04x:%02x:%02x.%x", dom, bus, dev, fn)
}

func cString(b []int8) string {
	var sb strings.Builder
	for _, c := range b {
		if c == 0 {
			break
		}
		sb.WriteByte(byte(c))
	}
	return sb.String()
}

// numaNode reads /sys/bus/pci/devices/<bdf>/numa_node; -1 when the file is
// missing or says so.
func (d *discovery) numaNode(busID string) int {
	path := filepath.Join(d.hostRoot, "sys", "bus", "pci", "devices", busID, "numa_node")
	data, err := os.ReadFile(path)
	if err != nil {
		d.log.Debug("no numa node for pci device", "busID", busID, "err", err)
		return -1
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || n < -1 {
		d.log.Debug("bad numa_node", "path", path, "content", strings.TrimSpace(string(data)))
		return -1
	}
	return n
}

// pciPath resolves /sys/bus/pci/devices/<bdf> (a symlink into
// /sys/devices/pci<domain:bus>/...) and returns the PCI addresses along it,
// root port first and the device itself last.
func (d *discovery) pciPath(busID string) []string {
	link := filepath.Join(d.hostRoot, "sys", "bus", "pci", "devices", busID)
	target, err := filepath.EvalSymlinks(link)
	if err != nil {
		d.log.Debug("no sysfs entry for pci device", "busID", busID, "err", err)
		return nil
	}
	var path []string
	for _, part := range strings.Split(filepath.ToSlash(target), "/") {
		if isBusID(part) {
			path = append(path, part)
		}
	}
	if len(path) == 0 || path[len(path)-1] != busID {
		return nil
	}
	return path
}

func isBusID(s string) bool {
	return busIDPattern.MatchString(s)
}

// mig reads MIG mode and, when enabled, the MIG devices.
func (d *discovery) mig(g *GPU, dev nvml.Device, parentMemory uint64) {
	current, _, ret := dev.GetMigMode()
	if ret != nvml.SUCCESS {
		if ret == nvml.ERROR_GPU_IS_LOST {
			d.lost(g, "GetMigMode", ret)
		}
		return
	}
	g.MIGCapable = true
	g.MIGEnabled = current == nvml.DEVICE_MIG_ENABLE
	if !g.MIGEnabled {
		return
	}
	maxCount, ret := dev.GetMaxMigDeviceCount()
	if !d.check(g, "GetMaxMigDeviceCount", ret) {
		return
	}
	for idx := 0; idx < maxCount; idx++ {
		md, ret := dev.GetMigDeviceHandleByIndex(idx)
		if ret == nvml.ERROR_NOT_FOUND || ret == nvml.ERROR_INVALID_ARGUMENT {
			continue
		}
		if !d.check(g, "GetMigDeviceHandleByIndex", ret) {
			continue
		}
		m, err := migDevice(dev, md, idx, parentMemory)
		if err != nil {
			if errors.Is(err, nvml.ERROR_GPU_IS_LOST) {
				d.lost(g, "mig device", nvml.ERROR_GPU_IS_LOST)
				return
			}
			d.log.Warn("skipping unreadable mig device", "gpu", g.Index, "index", idx, "err", err)
			continue
		}
		g.MIG = append(g.MIG, m)
	}
}

// linkRead is what one GPU's link queries hand back: its NVLinks into an
// NVSwitch, its direct GPU links (by the far end's bus ID), the PCIe level
// to each later GPU by index, and the GPU itself if a query found it lost.
type linkRead struct {
	switchLinks int
	direct      []directLink
	pcie        map[int]PCIeLevel
	lost        *GPU
}

// readLinks runs GPU a's link queries on its own goroutine (see bounded):
// its NVLinks, then the PCIe common ancestor with every later usable GPU.
// handles and usable are not written while reads run.
func (d *discovery) readLinks(a int, p *progress, g GPU, handles []nvml.Device, usable []bool) linkRead {
	var r linkRead
	r.switchLinks, r.direct = d.nvlinks(&g, handles[a], p)
	if g.Lost {
		r.lost = &g
		return r
	}
	r.pcie = map[int]PCIeLevel{}
	p.at("GetTopologyCommonAncestor")
	for b := a + 1; b < len(handles); b++ {
		if !usable[b] {
			continue
		}
		lvl, ret := handles[a].GetTopologyCommonAncestor(handles[b])
		if ret != nvml.SUCCESS {
			d.log.Debug("no pcie common ancestor", "a", a, "b", b, "err", ret.Error())
			continue
		}
		if l, ok := PCIeLevelFromNVML(lvl); ok {
			r.pcie[b] = l
		}
	}
	return r
}

// nvlinks counts a GPU's active NVLinks by what is at the far end: links
// into an NVSwitch, and GPU-GPU links by the far end's bus ID.
func (d *discovery) nvlinks(g *GPU, dev nvml.Device, p *progress) (switchLinks int, direct []directLink) {
	for l := 0; l < nvml.NVLINK_MAX_LINKS; l++ {
		p.at("GetNvLinkState")
		state, ret := dev.GetNvLinkState(l)
		if ret == nvml.ERROR_NOT_SUPPORTED && l == 0 {
			// No NVLink on this GPU.
			return switchLinks, direct
		}
		if ret == nvml.ERROR_GPU_IS_LOST {
			d.lost(g, "GetNvLinkState", ret)
			return 0, nil
		}
		if ret != nvml.SUCCESS || state != nvml.FEATURE_ENABLED {
			continue
		}
		p.at("GetNvLinkRemoteDeviceType")
		remoteType, typeRet := dev.GetNvLinkRemoteDeviceType(l)
		if typeRet == nvml.SUCCESS && remoteType == nvml.NVLINK_DEVICE_TYPE_SWITCH {
			switchLinks++
			continue
		}
		if typeRet == nvml.SUCCESS && remoteType != nvml.NVLINK_DEVICE_TYPE_GPU {
			continue
		}
		// A GPU peer (or a driver that cannot tell): match the far end's
		// bus ID against the GPUs, which are all listed once discovery of
		// every GPU is done.
		p.at("GetNvLinkRemotePciInfo")
		remote, ret := dev.GetNvLinkRemotePciInfo(l)
		if ret != nvml.SUCCESS {
			continue
		}
		direct = append(direct, directLink{from: g.Index, toBus: busIDFromPciInfo(remote)})
	}
	return switchLinks, direct
}

// links fills the pair list: NVLink counts (direct links, resolved by the
// far end's bus ID, plus the shared NVSwitch links) and the PCIe level of
// every pair whose handles NVML gave. Each GPU's queries run on their own
// goroutine bounded by timeout; a GPU whose queries do not return in time
// is marked lost, like one whose reads did not.
func (d *discovery) links(x *Discoverer, timeout time.Duration) {
	count := len(d.node.GPUs)
	usable := make([]bool, count)
	for i, g := range d.node.GPUs {
		usable[i] = d.handles[i] != nil && !g.Lost
	}
	gpus := slices.Clone(d.node.GPUs)
	reads := bounded(x, count, timeout, func(a int) bool { return !usable[a] },
		func(a int, p *progress) linkRead { return d.readLinks(a, p, gpus[a], d.handles, usable) })
	switchLinks := make([]int, count)
	var directRaw []directLink
	for a, o := range reads {
		switch {
		case o.skipped:
		case !o.ok:
			g := &d.node.GPUs[a]
			g.Lost, g.LostReason = true, o.lostReason()
			d.log.Warn("gpu marked lost during discovery", "index", a, "uuid", g.UUID, "reason", g.LostReason)
		case o.val.lost != nil:
			d.node.GPUs[a].Lost, d.node.GPUs[a].LostReason = true, o.val.lost.LostReason
		default:
			switchLinks[a] = o.val.switchLinks
			directRaw = append(directRaw, o.val.direct...)
		}
	}
	byBus := map[string]int{}
	for _, g := range d.node.GPUs {
		if g.PCIBusID != "" {
			byBus[g.PCIBusID] = g.Index
		}
	}
	direct := map[[2]int]int{}
	for _, l := range directRaw {
		to, ok := byBus[l.toBus]
		if !ok || to == l.from {
			d.log.Debug("nvlink to a device that is not a known gpu", "gpu", l.from, "remoteBusID", l.toBus)
			continue
		}
		direct[[2]int{l.from, to}]++
	}
	for a := 0; a < count; a++ {
		for b := a + 1; b < count; b++ {
			// Each direct link is seen from both ends; either end alone
			// (the other may be lost) is enough.
			nv := max(direct[[2]int{a, b}], direct[[2]int{b, a}])
			nv += min(switchLinks[a], switchLinks[b])
			l := Link{A: a, B: b, NVLinks: nv}
			if !d.node.GPUs[a].Lost && !d.node.GPUs[b].Lost && reads[a].ok {
				l.PCIe = reads[a].val.pcie[b]
			}
			if l.NVLinks > 0 || l.PCIe != "" {
				d.node.Links = append(d.node.Links, l)
			}
		}
	}
}

// PCIeLevelFromNVML maps NVML's topology level to the model's PCIe level.
func PCIeLevelFromNVML(l nvml.GpuTopologyLevel) (PCIeLevel, bool) {
	switch l {
	case nvml.TOPOLOGY_INTERNAL:
		return PCIeSameBoard, true
	case nvml.TOPOLOGY_SINGLE:
		return PCIeSingleSwitch, true
	case nvml.TOPOLOGY_MULTIPLE:
		return PCIeMultiSwitch, true
	case nvml.TOPOLOGY_HOSTBRIDGE:
		return PCIeHostBridge, true
	case nvml.TOPOLOGY_NODE:
		return PCIeSameCPU, true
	case nvml.TOPOLOGY_SYSTEM:
		return PCIeCrossCPU, true
	}
	return "", false
}

// LostGPUID is the device ID of GPU index i when NVML could not report its
// UUID (the GPU was lost before it could be read). It is stable across
// rediscoveries while the GPU stays lost.
func LostGPUID(i int) string { return fmt.Sprintf("GPU-lost-index-%d", i) }
