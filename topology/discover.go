package topology

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"

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
// path.
func Discover(lib nvml.Interface, hostRoot string, log *slog.Logger) (*Node, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if hostRoot == "" {
		hostRoot = "/"
	}
	count, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("discover gpus: device count: %w", ret)
	}
	d := discovery{lib: lib, hostRoot: hostRoot, log: log, node: &Node{}}
	d.handles = make([]nvml.Device, count)
	d.switchLinks = make([]int, count)
	for i := 0; i < count; i++ {
		d.gpu(i)
	}
	d.links()
	lost := 0
	for _, g := range d.node.GPUs {
		if g.Lost {
			lost++
		}
	}
	log.Info("discovered gpu topology", "gpus", count, "lost", lost, "links", len(d.node.Links))
	return d.node, nil
}

type discovery struct {
	lib      nvml.Interface
	hostRoot string
	log      *slog.Logger
	node     *Node
	handles  []nvml.Device
	// switchLinks counts each GPU's active NVLinks into an NVSwitch;
	// directRaw lists GPU-GPU links by the far end's bus ID.
	switchLinks []int
	directRaw   []directLink
}

type directLink struct {
	from  int
	toBus string
}

// lost records why a GPU is considered lost (once) and marks it.
func (d *discovery) lost(g *GPU, what string, ret nvml.Return) {
	if !g.Lost {
		d.log.Warn("gpu marked lost during discovery", "index", g.Index, "uuid", g.UUID, "call", what, "err", ret.Error())
	}
	g.Lost = true
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

func (d *discovery) gpu(i int) {
	d.node.GPUs = append(d.node.GPUs, GPU{Index: i, NUMANode: -1})
	g := &d.node.GPUs[len(d.node.GPUs)-1]
	// A GPU lost before its UUID could be read still needs a device ID, or
	// it would vanish from the device lists instead of being advertised
	// Unhealthy (and two such GPUs would share the empty ID).
	defer func() {
		if g.UUID == "" {
			g.UUID = LostGPUID(i)
		}
	}()
	dev, ret := d.lib.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		d.lost(g, "DeviceGetHandleByIndex", ret)
		return
	}
	d.handles[i] = dev
	uuid, ret := dev.GetUUID()
	if ret != nvml.SUCCESS {
		d.lost(g, "GetUUID", ret)
	}
	g.UUID = uuid
	if pci, ret := dev.GetPciInfo(); ret == nvml.SUCCESS {
		g.PCIBusID = busIDFromPciInfo(pci)
	} else {
		d.lost(g, "GetPciInfo", ret)
	}
	if g.PCIBusID != "" {
		g.NUMANode = d.numaNode(g.PCIBusID)
		g.PCIPath = d.pciPath(g.PCIBusID)
	}
	if name, ret := dev.GetName(); d.check(g, "GetName", ret) {
		g.Model = name
	}
	var totalMemory uint64
	if mem, ret := dev.GetMemoryInfo(); d.check(g, "GetMemoryInfo", ret) {
		totalMemory = mem.Total
		g.MemoryMiB = mem.Total >> 20
	}
	if minor, ret := dev.GetMinorNumber(); d.check(g, "GetMinorNumber", ret) {
		g.Minor = minor
	}
	d.mig(g, dev, totalMemory)
	d.nvlinks(g, dev)
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

func migDevice(parent, md nvml.Device, idx int, parentMemory uint64) (MIGDevice, error) {
	m := MIGDevice{Index: idx}
	var ret nvml.Return
	if m.UUID, ret = md.GetUUID(); ret != nvml.SUCCESS {
		return m, fmt.Errorf("uuid: %w", ret)
	}
	if m.GPUInstance, ret = md.GetGpuInstanceId(); ret != nvml.SUCCESS {
		return m, fmt.Errorf("%s: gpu instance id: %w", m.UUID, ret)
	}
	if m.ComputeInstance, ret = md.GetComputeInstanceId(); ret != nvml.SUCCESS {
		return m, fmt.Errorf("%s: compute instance id: %w", m.UUID, ret)
	}
	attrs, ret := md.GetAttributes()
	if ret != nvml.SUCCESS {
		return m, fmt.Errorf("%s: attributes: %w", m.UUID, ret)
	}
	m.MemoryMiB = attrs.MemorySizeMB
	m.Profile = MIGProfileName(int(attrs.GpuInstanceSliceCount), int(attrs.ComputeInstanceSliceCount),
		attrs.MemorySizeMB, parentMemory, migAttributes(parent, m.GPUInstance)...)
	return m, nil
}

// migAttributes returns the profile attributes ("me" for the media
// extension profiles) of a GPU instance, which its attributes alone do not
// tell; none when the GPU instance cannot be read.
func migAttributes(parent nvml.Device, giID int) []string {
	gi, ret := parent.GetGpuInstanceById(giID)
	if ret != nvml.SUCCESS || gi == nil {
		return nil
	}
	info, ret := gi.GetInfo()
	if ret != nvml.SUCCESS {
		return nil
	}
	switch info.ProfileId {
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, nvml.GPU_INSTANCE_PROFILE_2_SLICE_REV1:
		return []string{"me"}
	}
	return nil
}

// nvlinks counts a GPU's active NVLinks by what is at the far end.
func (d *discovery) nvlinks(g *GPU, dev nvml.Device) {
	if g.Lost {
		return
	}
	for l := 0; l < nvml.NVLINK_MAX_LINKS; l++ {
		state, ret := dev.GetNvLinkState(l)
		if ret == nvml.ERROR_NOT_SUPPORTED && l == 0 {
			// No NVLink on this GPU.
			return
		}
		if ret == nvml.ERROR_GPU_IS_LOST {
			d.lost(g, "GetNvLinkState", ret)
			return
		}
		if ret != nvml.SUCCESS || state != nvml.FEATURE_ENABLED {
			continue
		}
		remoteType, typeRet := dev.GetNvLinkRemoteDeviceType(l)
		if typeRet == nvml.SUCCESS && remoteType == nvml.NVLINK_DEVICE_TYPE_SWITCH {
			d.switchLinks[g.Index]++
			continue
		}
		if typeRet == nvml.SUCCESS && remoteType != nvml.NVLINK_DEVICE_TYPE_GPU {
			continue
		}
		// A GPU peer (or a driver that cannot tell): match the far end's
		// bus ID against the GPUs, which are all listed once discovery of
		// every GPU is done.
		remote, ret := dev.GetNvLinkRemotePciInfo(l)
		if ret != nvml.SUCCESS {
			continue
		}
		d.directRaw = append(d.directRaw, directLink{from: g.Index, toBus: busIDFromPciInfo(remote)})
	}
}

// links fills the pair list: NVLink counts (direct links, resolved by the
// far end's bus ID, plus the shared NVSwitch links) and the PCIe level of
// every pair whose handles NVML gave.
func (d *discovery) links() {
	byBus := map[string]int{}
	for _, g := range d.node.GPUs {
		if g.PCIBusID != "" {
			byBus[g.PCIBusID] = g.Index
		}
	}
	direct := map[[2]int]int{}
	for _, l := range d.directRaw {
		to, ok := byBus[l.toBus]
		if !ok || to == l.from {
			d.log.Debug("nvlink to a device that is not a known gpu", "gpu", l.from, "remoteBusID", l.toBus)
			continue
		}
		direct[[2]int{l.from, to}]++
	}
	count := len(d.node.GPUs)
	for a := 0; a < count; a++ {
		for b := a + 1; b < count; b++ {
			// Each direct link is seen from both ends; either end alone
			// (the other may be lost) is enough.
			nv := max(direct[[2]int{a, b}], direct[[2]int{b, a}])
			nv += min(d.switchLinks[a], d.switchLinks[b])
			l := Link{A: a, B: b, NVLinks: nv}
			if d.handles[a] != nil && d.handles[b] != nil && !d.node.GPUs[a].Lost && !d.node.GPUs[b].Lost {
				lvl, ret := d.handles[a].GetTopologyCommonAncestor(d.handles[b])
				if ret == nvml.SUCCESS {
					l.PCIe, _ = PCIeLevelFromNVML(lvl)
				} else {
					d.log.Debug("no pcie common ancestor", "a", a, "b", b, "err", ret.Error())
				}
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
