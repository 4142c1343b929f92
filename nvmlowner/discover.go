package nvmlowner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-node-agent/gpu-node-agent/internal/sysfsattr"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// Discoverer reads a node's topology through an Owner, again and again:
// GPUs (UUID, bus ID, NUMA node, model, memory, minor, PCI path, NVLink
// fabric registration), MIG mode and MIG devices, NVLink counts per GPU
// pair (direct links, and links through NVSwitch: a pair on the switch
// fabric gets the smaller of the two GPUs' switch link counts) and the PCIe
// common-ancestor level of every pair.
//
// Every NVML call is the Owner's: bounded by the call timeout and run on
// the lane of its GPU (by index until the UUID is known, then by UUID, the
// lane the sampler uses). A GPU whose call times out, or whose lane is held
// by a call that hangs, is kept Lost with LostReason "nvml-timeout: <call>"
// and not read further in that discovery, so a hung GPU costs a discovery
// about one call timeout and never delays the other GPUs, which are read in
// parallel. One GPU's failure never fails discovery: a GPU that NVML
// reports lost, or whose identity cannot be read, is kept with Lost set.
// Only NVML failing to report the device count is an error.
//
// The links (most of a discovery's calls) are reused from the previous
// discovery while the GPU set is unchanged. Discoveries are serialised.
type Discoverer struct {
	o        *Owner
	hostRoot string
	log      *slog.Logger

	// run serialises discoveries, and guards opts.
	run  sync.Mutex
	opts DiscoverOptions
}

// DiscoverOptions says what a discovery reads beyond what it always reads.
// The zero value reads nothing more.
type DiscoverOptions struct {
	// MIGProfiles fills GPU.MIGProfiles of every GPU in MIG mode: each GPU
	// instance profile the GPU offers (nvmlDeviceGetGpuInstanceProfileInfo
	// over NVML_GPU_INSTANCE_PROFILE_*) with every placement the driver
	// allows for it (nvmlDeviceGetGpuInstancePossiblePlacements_v2), what
	// a DRA driver making MIG devices on demand publishes. nvml.h calls
	// the profile information "immutable throughout the lifetime of a MIG
	// mode", so a GPU that stays in MIG mode keeps the profiles of the
	// previous discovery; about two calls per profile otherwise.
	MIGProfiles bool
}

// SetOptions sets what the next discoveries read beyond the default.
func (x *Discoverer) SetOptions(opts DiscoverOptions) {
	x.run.Lock()
	defer x.run.Unlock()
	x.opts = opts
}

// NewDiscoverer returns a Discoverer over o (initialised) and the sysfs
// under hostRoot ("/" when empty; "/host" in a container that mounts the
// host's /sys there). log may be nil.
func NewDiscoverer(o *Owner, hostRoot string, log *slog.Logger) *Discoverer {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if hostRoot == "" {
		hostRoot = "/"
	}
	return &Discoverer{o: o, hostRoot: hostRoot, log: log}
}

// Discover is one discovery over lib (initialised) with the default call
// timeout: for tools and tests. A process that rediscovers keeps one Owner
// and one Discoverer.
func Discover(lib Library, hostRoot string, log *slog.Logger) (*topology.Node, error) {
	return NewDiscoverer(New(lib, Config{}, log), hostRoot, log).Discover(context.Background(), nil)
}

// Discover builds the node model. previous is the node of the last
// discovery, or nil: while the GPU set is the same (UUIDs, bus IDs and
// lost flags, in the same order) its Links are reused and the NVLink remote
// and PCIe common-ancestor queries are skipped.
func (x *Discoverer) Discover(ctx context.Context, previous *topology.Node) (*topology.Node, error) {
	x.run.Lock()
	defer x.run.Unlock()
	var count int
	if err := x.o.Lib(ctx, "DeviceGetCount", func(lib Library) nvml.Return {
		n, ret := lib.DeviceGetCount()
		count = n
		return ret
	}); err != nil {
		// count is not read after a timeout: the call may still write it.
		return nil, fmt.Errorf("discover gpus: device count: %w", err)
	}
	d := &discovery{x: x, ctx: ctx, opts: x.opts, previous: previous, node: &topology.Node{GPUs: make([]topology.GPU, count)}}
	var wg sync.WaitGroup
	for i := range count {
		wg.Go(func() { d.node.GPUs[i] = d.gpu(i) })
	}
	wg.Wait()
	d.node.Host = d.host()
	slices.Sort(d.unread)
	d.node.Unread = d.unread
	reused := previous != nil && sameGPUs(previous.GPUs, d.node.GPUs)
	if reused {
		// The wiring of an unchanged GPU set does not change: skipping
		// its queries makes a steady-state rescan a few calls per GPU.
		d.node.Links = slices.Clone(previous.Links)
	} else {
		d.links()
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
func sameGPUs(a, b []topology.GPU) bool {
	return slices.EqualFunc(a, b, func(x, y topology.GPU) bool {
		return x.UUID == y.UUID && x.PCIBusID == y.PCIBusID && x.Lost == y.Lost
	})
}

// discovery is one discovery's state. Each GPU's reads run on a goroutine
// of their own, which writes only its own element of node.GPUs.
type discovery struct {
	x    *Discoverer
	ctx  context.Context
	opts DiscoverOptions
	// previous is the last discovery's node, or nil (read only).
	previous *topology.Node
	node     *topology.Node

	// unread collects Node.Unread from every GPU's goroutine.
	mu     sync.Mutex
	unread []string
}

// finished says whether a call ran to its end: its fn's writes may be
// read. After a timeout (or a cancelled context) the fn may still be
// running and writing, so nothing it writes is read.
func finished(err error) bool {
	return err == nil || !(errors.Is(err, ErrTimeout) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded))
}

// ret is the nvml.Return inside a finished call's error (SUCCESS for nil).
func ret(err error) nvml.Return {
	var r nvml.Return
	if errors.As(err, &r) {
		return r
	}
	if err == nil {
		return nvml.SUCCESS
	}
	return nvml.ERROR_UNKNOWN
}

// call runs one NVML call on GPU uuid's lane and hands back its value when
// the call finished (see finished).
func call[T any](d *discovery, uuid, what string, fn func(Device) (T, nvml.Return)) (T, error) {
	return finishedValue(fn, func(f func(Device) nvml.Return) error { return d.x.o.Do(d.ctx, uuid, what, f) })
}

// callIndex is call on the lane of GPU index i (handle by index).
func callIndex[T any](d *discovery, i int, what string, fn func(Device) (T, nvml.Return)) (T, error) {
	return finishedValue(fn, func(f func(Device) nvml.Return) error { return d.x.o.DoIndex(d.ctx, i, what, f) })
}

// finishedValue runs fn through run and returns its value only when the call
// finished: after a timeout fn may still be running and writing it.
func finishedValue[T any](fn func(Device) (T, nvml.Return), run func(func(Device) nvml.Return) error) (T, error) {
	var out T
	err := run(func(dev Device) nvml.Return {
		v, r := fn(dev)
		out = v
		return r
	})
	if !finished(err) {
		var zero T
		return zero, err
	}
	return out, err
}

// timeoutReason is the LostReason of a GPU whose call did not finish:
// "nvml-timeout: <call>", naming the call that hangs (an earlier one still
// holding the GPU's lane, when that is why).
func timeoutReason(err error) string {
	var ce *CallError
	if errors.As(err, &ce) {
		if ce.Running != "" {
			return fmt.Sprintf("nvml-timeout: %s (an earlier call on this gpu is still running)", ce.Running)
		}
		return "nvml-timeout: " + ce.What
	}
	return "nvml-timeout: " + err.Error()
}

// lost records why a GPU is considered lost (the first reason) and marks it.
func (d *discovery) lost(g *topology.GPU, reason string) {
	if !g.Lost {
		d.x.log.Warn("gpu marked lost during discovery", "index", g.Index, "uuid", g.UUID, "reason", reason)
		g.LostReason = reason
	}
	g.Lost = true
}

// check handles an optional query's result and says whether it has a
// value and the GPU may be read further: a call that did not finish
// marks the GPU lost (nvml-timeout) and stops its reads, GPU_IS_LOST marks
// it lost, anything else but success is logged at debug and the field
// stays empty.
func (d *discovery) check(g *topology.GPU, what string, err error) (ok, more bool) {
	if !finished(err) {
		d.lost(g, timeoutReason(err))
		return false, false
	}
	switch r := ret(err); r {
	case nvml.SUCCESS:
		return true, true
	case nvml.ERROR_GPU_IS_LOST:
		d.lost(g, what+": "+r.Error())
		return false, false
	default:
		d.x.log.Debug("gpu query failed", "index", g.Index, "call", what, "err", r.Error())
		if !noData(r) {
			d.noteUnread(fmt.Sprintf("gpu %d: %s: %s", g.Index, what, r.Error()))
		}
		return false, true
	}
}

// noData says whether r means the hardware does not give a reading
// (NOT_SUPPORTED, NO_PERMISSION): no data, which stays so, rather than a
// read that failed this time.
func noData(r nvml.Return) bool {
	return r == nvml.ERROR_NOT_SUPPORTED || r == nvml.ERROR_NO_PERMISSION
}

// noteUnread records a read that failed this time (Node.Unread).
func (d *discovery) noteUnread(what string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.unread = append(d.unread, what)
}

// gpu reads GPU i: its identity by index, then the rest by UUID.
func (d *discovery) gpu(i int) (g topology.GPU) {
	g = topology.GPU{Index: i, NUMANode: -1}
	// A GPU lost before its UUID could be read still needs a device ID, or
	// it would vanish from the device lists instead of being advertised
	// Unhealthy (and two such GPUs would share the empty ID).
	defer func() {
		if g.UUID == "" {
			g.UUID = topology.LostGPUID(i)
		}
	}()
	uuid, err := callIndex(d, i, "GetUUID", func(dev Device) (string, nvml.Return) { return dev.GetUUID() })
	if !finished(err) {
		d.lost(&g, timeoutReason(err))
		return g
	}
	if err != nil {
		// No handle, or no UUID: the GPU is lost (its bus ID is still
		// worth reading, to name it).
		d.lost(&g, strings.TrimPrefix(err.Error(), "nvml "))
	}
	g.UUID = uuid
	pci, err := callIndex(d, i, "GetPciInfo", func(dev Device) (nvml.PciInfo, nvml.Return) { return dev.GetPciInfo() })
	if !finished(err) {
		d.lost(&g, timeoutReason(err))
		return g
	}
	if err == nil {
		g.PCIBusID = busIDFromPciInfo(pci)
		g.NUMANode = d.numaNode(g.PCIBusID)
		g.PCIPath = d.pciPath(g.PCIBusID)
		g.PCIClass = pciClass(d.x.hostRoot, g.PCIBusID)
	} else {
		d.lost(&g, strings.TrimPrefix(err.Error(), "nvml "))
	}
	if g.Lost {
		return g
	}
	name, err := call(d, uuid, "GetName", func(dev Device) (string, nvml.Return) { return dev.GetName() })
	if ok, more := d.check(&g, "GetName", err); ok {
		g.Model = name
	} else if !more {
		return g
	}
	brand, err := call(d, uuid, "GetBrand", func(dev Device) (nvml.BrandType, nvml.Return) { return dev.GetBrand() })
	if ok, more := d.check(&g, "GetBrand", err); ok {
		g.Brand = topology.BrandName(brand)
	} else if !more {
		return g
	}
	var totalMemory uint64
	mem, err := call(d, uuid, "GetMemoryInfo", func(dev Device) (nvml.Memory, nvml.Return) { return dev.GetMemoryInfo() })
	if ok, more := d.check(&g, "GetMemoryInfo", err); ok {
		totalMemory = mem.Total
		g.MemoryMiB = mem.Total >> 20
	} else if !more {
		return g
	}
	minor, err := call(d, uuid, "GetMinorNumber", func(dev Device) (int, nvml.Return) { return dev.GetMinorNumber() })
	if ok, more := d.check(&g, "GetMinorNumber", err); ok {
		g.Minor = minor
	} else if !more {
		return g
	}
	cc, err := call(d, uuid, "GetCudaComputeCapability", func(dev Device) ([2]int, nvml.Return) {
		major, minor, r := dev.GetCudaComputeCapability()
		return [2]int{major, minor}, r
	})
	if ok, more := d.check(&g, "GetCudaComputeCapability", err); ok {
		g.ComputeMajor, g.ComputeMinor = cc[0], cc[1]
	} else if !more {
		return g
	}
	// The v1 call, as the sampler makes it (go-nvml's GetGpuFabricInfoV
	// returns a handler around the real C handle, which a simulated
	// library cannot answer). NOT_SUPPORTED (no fabric) leaves Fabric
	// nil; any other failure is Unread, so the node's labels, gpu.clique
	// among them, are kept rather than recomputed (topology.Clique).
	fi, err := call(d, uuid, "GetGpuFabricInfo", func(dev Device) (nvml.GpuFabricInfo, nvml.Return) { return dev.GetGpuFabricInfo() })
	if ok, more := d.check(&g, "GetGpuFabricInfo", err); ok {
		g.Fabric = fabricOf(fi)
	} else if !more {
		return g
	}
	d.mig(&g, totalMemory)
	return g
}

// fabricOf is the model of a GPU's nvmlGpuFabricInfo_t, read as it is:
// the status too, which nvml.h says to check only once the state is
// completed.
func fabricOf(fi nvml.GpuFabricInfo) *topology.Fabric {
	return &topology.Fabric{
		State:       topology.FabricStateOf(fi.State),
		Status:      fi.Status,
		ClusterUUID: topology.FabricClusterUUID(fi.ClusterUuid),
		CliqueID:    fi.CliqueId,
	}
}

// migRead is what the MIG call batch hands back.
type migRead struct {
	capable, enabled bool
	devices          []topology.MIGDevice
	// profiles are the GPU instance profiles (DiscoverOptions.MIGProfiles).
	profiles []topology.MIGProfile
	// lost is the call that reported the GPU lost, if one did.
	lost string
	// unread are the calls that failed otherwise (Node.Unread).
	unread []string
}

// mig reads MIG mode and, when enabled, the MIG devices, in one batch on
// the GPU's lane.
func (d *discovery) mig(g *topology.GPU, parentMemory uint64) {
	var known []topology.MIGProfile
	if d.opts.MIGProfiles {
		known = d.previousMIGProfiles(g.UUID)
	}
	r, err := call(d, g.UUID, "MIG mode and devices", func(dev Device) (migRead, nvml.Return) {
		return d.readMIG(g.Index, dev, parentMemory, known), nvml.SUCCESS
	})
	if !finished(err) {
		d.lost(g, timeoutReason(err))
		return
	}
	if err != nil {
		// The handle lookup failed before the batch ran.
		d.check(g, "MIG mode and devices", err)
		return
	}
	g.MIGCapable, g.MIGEnabled, g.MIG, g.MIGProfiles = r.capable, r.enabled, r.devices, r.profiles
	if r.lost != "" {
		d.lost(g, r.lost)
	}
	for _, u := range r.unread {
		d.noteUnread(fmt.Sprintf("gpu %d: %s", g.Index, u))
	}
}

// previousMIGProfiles are the MIG profiles the previous discovery read for
// GPU uuid while it was in MIG mode, or nil.
func (d *discovery) previousMIGProfiles(uuid string) []topology.MIGProfile {
	if d.previous == nil {
		return nil
	}
	for _, g := range d.previous.GPUs {
		if g.UUID == uuid && g.MIGEnabled && len(g.MIGProfiles) > 0 {
			out := slices.Clone(g.MIGProfiles)
			for i := range out {
				out[i].Placements = slices.Clone(out[i].Placements)
			}
			return out
		}
	}
	return nil
}

// readMIG runs on the GPU's lane and touches nothing but its result.
// known are the GPU's MIG profiles from the previous discovery, if it was
// in MIG mode then (DiscoverOptions.MIGProfiles).
func (d *discovery) readMIG(index int, dev Device, parentMemory uint64, known []topology.MIGProfile) migRead {
	var r migRead
	current, _, ret := dev.GetMigMode()
	if ret != nvml.SUCCESS {
		if ret == nvml.ERROR_GPU_IS_LOST {
			r.lost = "GetMigMode: " + ret.Error()
		} else if !noData(ret) {
			r.unread = append(r.unread, "GetMigMode: "+ret.Error())
		}
		return r
	}
	r.capable = true
	r.enabled = current == nvml.DEVICE_MIG_ENABLE
	if !r.enabled {
		return r
	}
	maxCount, ret := dev.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		if ret == nvml.ERROR_GPU_IS_LOST {
			r.lost = "GetMaxMigDeviceCount: " + ret.Error()
		}
		d.x.log.Debug("gpu query failed", "index", index, "call", "GetMaxMigDeviceCount", "err", ret.Error())
		r.unread = append(r.unread, "GetMaxMigDeviceCount: "+ret.Error())
		return r
	}
	for idx := 0; idx < maxCount; idx++ {
		md, ret := dev.GetMigDeviceHandleByIndex(idx)
		if ret == nvml.ERROR_NOT_FOUND || ret == nvml.ERROR_INVALID_ARGUMENT {
			continue
		}
		if ret == nvml.ERROR_GPU_IS_LOST {
			r.lost = "GetMigDeviceHandleByIndex: " + ret.Error()
			return r
		}
		if ret != nvml.SUCCESS {
			d.x.log.Debug("gpu query failed", "index", index, "call", "GetMigDeviceHandleByIndex", "err", ret.Error())
			r.unread = append(r.unread, fmt.Sprintf("GetMigDeviceHandleByIndex(%d): %s", idx, ret.Error()))
			continue
		}
		m, err := migDevice(dev, md, idx, parentMemory)
		if err != nil {
			if errors.Is(err, nvml.ERROR_GPU_IS_LOST) {
				r.lost = "mig device: " + nvml.ERROR_GPU_IS_LOST.Error()
				return r
			}
			d.x.log.Warn("skipping unreadable mig device", "gpu", index, "index", idx, "err", err)
			r.unread = append(r.unread, err.Error())
			continue
		}
		r.devices = append(r.devices, m)
	}
	if !d.opts.MIGProfiles {
		return r
	}
	if known != nil {
		r.profiles = known
		return r
	}
	var unread []string
	r.profiles, r.lost, unread = readMIGProfiles(dev, parentMemory)
	if len(unread) > 0 {
		// A partial table would be carried into every later discovery
		// (previousMIGProfiles) and offer a part of the GPU as if it
		// were all: none until a discovery reads it whole.
		r.profiles = nil
	}
	r.unread = append(r.unread, unread...)
	return r
}

// readMIGProfiles reads the GPU instance profiles of a GPU in MIG mode, in
// NVML_GPU_INSTANCE_PROFILE_* order (nvml.h: enumerate "on profile values
// starting from 0"; NOT_SUPPORTED "If device doesn't have MIG mode enabled
// or profile isn't supported", INVALID_ARGUMENT for a profile the driver
// does not know: the GPU lacks it), each named as its MIG devices are
// named and with every placement the driver allows
// (nvmlDeviceGetGpuInstancePossiblePlacements_v2 "returns all the possible
// placements for the given profile", occupied or not). A name already
// taken (a profile only another's twin) keeps the first. A profile whose
// placements cannot be read is kept without them. lost is the call that
// reported the GPU lost; unread the calls that failed otherwise.
func readMIGProfiles(dev Device, parentMemory uint64) (profiles []topology.MIGProfile, lost string, unread []string) {
	seen := map[string]bool{}
	for p := range nvml.GPU_INSTANCE_PROFILE_COUNT {
		info, ret := dev.GetGpuInstanceProfileInfo(p)
		switch {
		case ret == nvml.ERROR_NOT_SUPPORTED, ret == nvml.ERROR_INVALID_ARGUMENT, ret == nvml.ERROR_NO_PERMISSION:
			continue
		case ret == nvml.ERROR_GPU_IS_LOST:
			return nil, "GetGpuInstanceProfileInfo: " + ret.Error(), unread
		case ret != nvml.SUCCESS:
			unread = append(unread, fmt.Sprintf("GetGpuInstanceProfileInfo(%d): %s", p, ret.Error()))
			continue
		}
		slices := int(info.SliceCount)
		name, err := topology.MIGProfileNameOf(p, slices, slices, info.MemorySizeMB, parentMemory)
		if err != nil || seen[name] {
			continue
		}
		seen[name] = true
		prof := topology.MIGProfile{
			Name:      name,
			ID:        p,
			MemoryMiB: info.MemorySizeMB,
			Instances: info.InstanceCount,
			Attributes: topology.MIGAttributes{
				Multiprocessors:       info.MultiprocessorCount,
				GPUInstanceSlices:     info.SliceCount,
				ComputeInstanceSlices: info.SliceCount,
				CopyEngines:           info.CopyEngineCount,
				Decoders:              info.DecoderCount,
				Encoders:              info.EncoderCount,
				JPEGs:                 info.JpegCount,
				OFAs:                  info.OfaCount,
			},
		}
		placements, ret := dev.GetGpuInstancePossiblePlacements(&info)
		switch {
		case ret == nvml.SUCCESS:
			for _, pl := range placements {
				prof.Placements = append(prof.Placements, topology.MIGPlacement{Start: pl.Start, Size: pl.Size})
			}
		case ret == nvml.ERROR_GPU_IS_LOST:
			return nil, "GetGpuInstancePossiblePlacements: " + ret.Error(), unread
		case !noData(ret):
			unread = append(unread, fmt.Sprintf("GetGpuInstancePossiblePlacements(%s): %s", name, ret.Error()))
		}
		profiles = append(profiles, prof)
	}
	return profiles, "", unread
}

type directLink struct {
	from  int
	toBus string
}

// linkRead is what one GPU's link queries hand back: its NVLinks into an
// NVSwitch, its direct GPU links (by the far end's bus ID), the PCIe level
// to each later GPU by index, and why the GPU was found lost, if it was.
type linkRead struct {
	switchLinks int
	direct      []directLink
	pcie        map[int]topology.PCIeLevel
	lost        string
}

// links fills the pair list: NVLink counts (direct links, resolved by the
// far end's bus ID, plus the shared NVSwitch links) and the PCIe level of
// every pair of GPUs that are not lost. Each GPU's queries run on its own
// goroutine, on its own lane; a GPU whose queries do not finish is marked
// lost, like one whose reads did not.
func (d *discovery) links() {
	gpus := d.node.GPUs
	count := len(gpus)
	reads := make([]linkRead, count)
	var wg sync.WaitGroup
	for a := range count {
		if gpus[a].Lost {
			continue
		}
		wg.Go(func() { reads[a] = d.readLinks(a) })
	}
	wg.Wait()
	switchLinks := make([]int, count)
	var directRaw []directLink
	for a, r := range reads {
		if r.lost != "" {
			d.lost(&d.node.GPUs[a], r.lost)
			continue
		}
		switchLinks[a] = r.switchLinks
		directRaw = append(directRaw, r.direct...)
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
			d.x.log.Debug("nvlink to a device that is not a known gpu", "gpu", l.from, "remoteBusID", l.toBus)
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
			l := topology.Link{A: a, B: b, NVLinks: nv}
			if !d.node.GPUs[a].Lost && !d.node.GPUs[b].Lost {
				l.PCIe = reads[a].pcie[b]
			}
			if l.NVLinks > 0 || l.PCIe != "" {
				d.node.Links = append(d.node.Links, l)
			}
		}
	}
}

// readLinks runs GPU a's link queries: its NVLinks, then the PCIe common
// ancestor with every later GPU that is not lost. It reads d.node.GPUs,
// which no one writes while links run.
func (d *discovery) readLinks(a int) linkRead {
	gpus := d.node.GPUs
	uuid := gpus[a].UUID
	r, err := call(d, uuid, "NVLink remote devices", func(dev Device) (linkRead, nvml.Return) {
		return readNVLinks(a, dev), nvml.SUCCESS
	})
	if !finished(err) {
		return linkRead{lost: timeoutReason(err)}
	}
	if err != nil || r.lost != "" {
		if ret(err) == nvml.ERROR_GPU_IS_LOST {
			r.lost = "NVLink remote devices: " + ret(err).Error()
		}
		return r
	}
	r.pcie = map[int]topology.PCIeLevel{}
	for b := a + 1; b < len(gpus); b++ {
		if gpus[b].Lost {
			continue
		}
		other := gpus[b].UUID
		lvl, err := call(d, uuid, "GetTopologyCommonAncestor", func(dev Device) (nvml.GpuTopologyLevel, nvml.Return) {
			// The other GPU's handle comes from the cache its own reads
			// filled: looking it up here could hang on its lane's behalf.
			h := d.x.o.cachedHandle(other)
			if h == nil {
				return 0, nvml.ERROR_NOT_FOUND
			}
			return dev.GetTopologyCommonAncestor(h)
		})
		if !finished(err) {
			return linkRead{lost: timeoutReason(err)}
		}
		if err != nil {
			d.x.log.Debug("no pcie common ancestor", "a", a, "b", b, "err", err)
			continue
		}
		if l, ok := PCIeLevelFromNVML(lvl); ok {
			r.pcie[b] = l
		}
	}
	return r
}

// readNVLinks counts a GPU's active NVLinks by what is at the far end:
// links into an NVSwitch, and GPU-GPU links by the far end's bus ID. It
// runs on the GPU's lane and touches nothing but its result.
func readNVLinks(index int, dev Device) linkRead {
	var r linkRead
	for l := 0; l < nvml.NVLINK_MAX_LINKS; l++ {
		state, ret := dev.GetNvLinkState(l)
		if ret == nvml.ERROR_NOT_SUPPORTED && l == 0 {
			// No NVLink on this GPU.
			return r
		}
		if ret == nvml.ERROR_GPU_IS_LOST {
			return linkRead{lost: "GetNvLinkState: " + ret.Error()}
		}
		if ret != nvml.SUCCESS || state != nvml.FEATURE_ENABLED {
			continue
		}
		remoteType, typeRet := dev.GetNvLinkRemoteDeviceType(l)
		if typeRet == nvml.SUCCESS && remoteType == nvml.NVLINK_DEVICE_TYPE_SWITCH {
			r.switchLinks++
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
		r.direct = append(r.direct, directLink{from: index, toBus: busIDFromPciInfo(remote)})
	}
	return r
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
	return topology.NormalizeBusID(id)
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
	path := filepath.Join(d.x.hostRoot, "sys", "bus", "pci", "devices", busID, "numa_node")
	data, err := sysfsattr.Read(path)
	if err != nil {
		d.x.log.Debug("no numa node for pci device", "busID", busID, "err", err)
		return -1
	}
	n, err := strconv.Atoi(data)
	if err != nil || n < -1 {
		d.x.log.Debug("bad numa_node", "path", path, "content", data)
		return -1
	}
	return n
}

// pciPath resolves /sys/bus/pci/devices/<bdf> (a symlink into
// /sys/devices/pci<domain:bus>/...) and returns the PCI addresses along it,
// root port first and the device itself last.
func (d *discovery) pciPath(busID string) []string {
	link := filepath.Join(d.x.hostRoot, "sys", "bus", "pci", "devices", busID)
	target, err := filepath.EvalSymlinks(link)
	if err != nil {
		d.x.log.Debug("no sysfs entry for pci device", "busID", busID, "err", err)
		return nil
	}
	var path []string
	for _, part := range strings.Split(filepath.ToSlash(target), "/") {
		if topology.IsBusID(part) {
			path = append(path, part)
		}
	}
	if len(path) == 0 || path[len(path)-1] != busID {
		return nil
	}
	return path
}

// PCIeLevelFromNVML maps NVML's topology level to the model's PCIe level.
func PCIeLevelFromNVML(l nvml.GpuTopologyLevel) (topology.PCIeLevel, bool) {
	switch l {
	case nvml.TOPOLOGY_INTERNAL:
		return topology.PCIeSameBoard, true
	case nvml.TOPOLOGY_SINGLE:
		return topology.PCIeSingleSwitch, true
	case nvml.TOPOLOGY_MULTIPLE:
		return topology.PCIeMultiSwitch, true
	case nvml.TOPOLOGY_HOSTBRIDGE:
		return topology.PCIeHostBridge, true
	case nvml.TOPOLOGY_NODE:
		return topology.PCIeSameCPU, true
	case nvml.TOPOLOGY_SYSTEM:
		return topology.PCIeCrossCPU, true
	}
	return "", false
}
