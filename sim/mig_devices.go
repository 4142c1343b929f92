package sim

import (
	"errors"
	"fmt"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"

	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// installMIG answers GPU i's MIG queries from the simulator's MIG state.
// MIG mode changes only through SetMIGLayout and EnableMIG (SetMigMode is
// refused: the agent never changes it); GPU and compute instances are made
// and destroyed through NVML as nvml.h says (mig_make.go) or replaced by a
// layout.
func (n *Node) installMIG(i int) {
	d := n.devices[i]
	g := n.gpus[i]
	// A snapshot may say a GPU of a model the mocks do not know is MIG
	// capable; it then gets the common maximum of seven MIG devices.
	g.migCapable = len(g.cfg.MIGProfiles.GpuInstanceProfiles) > 0 || n.spec.GPUs[i].MIGCapable
	g.maxMIG = 7
	if len(g.cfg.MIGProfiles.GpuInstanceProfiles) > 0 {
		g.maxMIG = 0
	}
	for _, p := range g.cfg.MIGProfiles.GpuInstanceProfiles {
		g.maxMIG = max(g.maxMIG, int(p.InstanceCount))
	}
	capable, maxDevices := g.migCapable, g.maxMIG
	d.GetMigModeFunc = func() (int, int, nvml.Return) {
		if !capable {
			return 0, 0, nvml.ERROR_NOT_SUPPORTED
		}
		n.mu.RLock()
		defer n.mu.RUnlock()
		if g.migEnabled {
			return nvml.DEVICE_MIG_ENABLE, nvml.DEVICE_MIG_ENABLE, nvml.SUCCESS
		}
		return nvml.DEVICE_MIG_DISABLE, nvml.DEVICE_MIG_DISABLE, nvml.SUCCESS
	}
	d.SetMigModeFunc = func(int) (nvml.Return, nvml.Return) {
		return nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_NOT_SUPPORTED
	}
	d.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) {
		if !capable {
			return 0, nvml.ERROR_NOT_SUPPORTED
		}
		return maxDevices, nvml.SUCCESS
	}
	d.GetMigDeviceHandleByIndexFunc = func(idx int) (nvml.Device, nvml.Return) {
		if !capable {
			return nil, nvml.ERROR_NOT_SUPPORTED
		}
		if idx < 0 || idx >= maxDevices {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		n.mu.RLock()
		defer n.mu.RUnlock()
		if !g.migEnabled || idx >= len(g.mig) {
			return nil, nvml.ERROR_NOT_FOUND
		}
		// The mock device; the handle wraps it (direct.go).
		return g.mig[idx].dev, nvml.SUCCESS
	}
	// nvml.h nvmlDeviceGetGpuInstancePossiblePlacements_v2: "This API
	// only returns all the possible placements for the given profile
	// regardless of whether MIG is enabled or not"; NOT_SUPPORTED "If
	// device doesn't support MIG or profileId isn't supported".
	d.GetGpuInstancePossiblePlacementsFunc = func(info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstancePlacement, nvml.Return) {
		if !capable {
			return nil, nvml.ERROR_NOT_SUPPORTED
		}
		if info == nil {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		p, ok := n.giProfile(i, info.Id)
		if !ok {
			return nil, nvml.ERROR_NOT_SUPPORTED
		}
		placements, ok := g.cfg.MIGProfiles.GpuInstancePlacements[p.enum]
		if !ok {
			return nil, nvml.ERROR_NOT_SUPPORTED
		}
		return slices.Clone(placements), nvml.SUCCESS
	}
	// nvml.h nvmlDeviceGetGpuInstances: NOT_SUPPORTED "If device doesn't
	// have MIG mode enabled", INVALID_ARGUMENT "If device, profileId,
	// gpuInstances or count are invalid". Listed by ID.
	d.GetGpuInstancesFunc = func(info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstance, nvml.Return) {
		if !capable {
			return nil, nvml.ERROR_NOT_SUPPORTED
		}
		if info == nil {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		if _, ok := n.giProfile(i, info.Id); !ok {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		n.mu.RLock()
		defer n.mu.RUnlock()
		if !g.migEnabled {
			return nil, nvml.ERROR_NOT_SUPPORTED
		}
		out := []nvml.GpuInstance{}
		for _, gi := range g.gis {
			if gi.profile.gi.Id == info.Id {
				out = append(out, gi)
			}
		}
		slices.SortFunc(out, func(a, b nvml.GpuInstance) int { return a.(*gpuInstance).id - b.(*gpuInstance).id })
		return out, nvml.SUCCESS
	}
	// nvml.h nvmlDeviceGetGpuInstanceById: NOT_SUPPORTED "If device
	// doesn't have MIG mode enabled", NOT_FOUND "If the GPU instance is
	// not found".
	d.GetGpuInstanceByIdFunc = func(id int) (nvml.GpuInstance, nvml.Return) {
		if !capable {
			return nil, nvml.ERROR_NOT_SUPPORTED
		}
		n.mu.RLock()
		defer n.mu.RUnlock()
		if !g.migEnabled {
			return nil, nvml.ERROR_NOT_SUPPORTED
		}
		for _, gi := range g.gis {
			if gi.id == id {
				return gi, nvml.SUCCESS
			}
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
	d.CreateGpuInstanceWithPlacementFunc = func(info *nvml.GpuInstanceProfileInfo, at *nvml.GpuInstancePlacement) (nvml.GpuInstance, nvml.Return) {
		if !capable {
			return nil, nvml.ERROR_NOT_SUPPORTED
		}
		gi, ret := n.createGPUInstance(i, info, at)
		if gi == nil {
			// A nil *gpuInstance in an interface would not be nil.
			return nil, ret
		}
		return gi, ret
	}
	// Without a placement the driver would choose one; the agent always
	// gives one (nvmlDeviceCreateGpuInstanceWithPlacement), so this is
	// refused as before.
	d.CreateGpuInstanceFunc = func(*nvml.GpuInstanceProfileInfo) (nvml.GpuInstance, nvml.Return) {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	d.IsMigDeviceHandleFunc = func() (bool, nvml.Return) { return false, nvml.SUCCESS }
	d.GetDeviceHandleFromMigDeviceHandleFunc = func() (nvml.Device, nvml.Return) {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	if len(g.cfg.MIGProfiles.GpuInstanceProfiles) == 0 && capable {
		// A model the mocks do not know (a snapshot's GH200, say) has no
		// profile table; a real driver always describes the profile of
		// an instance that exists (nvmlDeviceGetGpuInstanceProfileInfo),
		// so answer from the instances the snapshot made up.
		d.GetGpuInstanceProfileInfoFunc = func(profile int) (nvml.GpuInstanceProfileInfo, nvml.Return) {
			n.mu.RLock()
			defer n.mu.RUnlock()
			for _, gi := range g.gis {
				if gi.profile.enum == profile {
					return gi.profile.gi, nvml.SUCCESS
				}
			}
			return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
		}
	}
}

// giProfile finds GPU i's GPU instance profile of per-device profile ID id
// (nvmlGpuInstanceProfileInfo_t.id): from the model's table, or, for a
// model without one, from the instances a snapshot made up.
func (n *Node) giProfile(i int, id uint32) (migProfile, bool) {
	g := n.gpus[i]
	for enum, p := range g.cfg.MIGProfiles.GpuInstanceProfiles {
		if p.Id != id {
			continue
		}
		ci, _ := fullComputeInstance(g.cfg, enum, p.SliceCount)
		name, err := topology.MIGProfileNameOf(enum, int(p.SliceCount), int(p.SliceCount), p.MemorySizeMB, g.memBytes)
		if err != nil {
			name = ""
		}
		return migProfile{name: name, enum: enum, gi: p, ci: ci}, true
	}
	n.mu.RLock()
	defer n.mu.RUnlock()
	for _, gi := range g.gis {
		if gi.profile.gi.Id == id {
			return gi.profile, true
		}
	}
	return migProfile{}, false
}

// newGPUInstance builds (but does not publish) a GPU instance of GPU i.
func (n *Node) newGPUInstance(i, id int, p migProfile, at nvml.GpuInstancePlacement) *gpuInstance {
	gi := &gpuInstance{n: n, gpu: i, id: id, profile: p, placement: at}
	// go-nvml's own functions, for callers of the mock (Device(i)):
	// the handle's answers without its gate.
	gi.GetInfoFunc = func() (nvml.GpuInstanceInfo, nvml.Return) { return n.giInfo(gi) }
	fillUnsupported(&gi.GpuInstance)
	return gi
}

// newMIGDevice builds (but does not publish) the MIG device of compute
// instance info.ComputeInstance of profile ci at ciAt in GPU instance gi
// of GPU i: its mock device with every MIG hook applied.
func (n *Node) newMIGDevice(i int, gi *gpuInstance, ci nvml.ComputeInstanceProfileInfo, ciAt nvml.ComputeInstancePlacement,
	info topology.MIGDevice) *migDevice {
	if info.MemoryMiB == 0 {
		info.MemoryMiB = gi.profile.gi.MemorySizeMB
	}
	info.Placement = topology.MIGPlacement{Start: gi.placement.Start, Size: gi.placement.Size}
	// A snapshot of a real node keeps what its GPU answered.
	a := info.Attributes
	if a == (topology.MIGAttributes{}) {
		a = migAttributes(gi.profile.gi, ci)
		info.Attributes = a
	}
	m := &migDevice{
		dev:  &mock.Device{},
		info: info,
		// nvml.h nvmlDeviceAttributes_t: the shared* counts are the
		// engines of the GPU instance, which its compute instances
		// share; go-nvml's mock compute instance profiles leave them
		// zero, so they come from the GPU instance profile
		// (migAttributes).
		attrs: nvml.DeviceAttributes{
			MultiprocessorCount:       a.Multiprocessors,
			SharedCopyEngineCount:     a.CopyEngines,
			SharedDecoderCount:        a.Decoders,
			SharedEncoderCount:        a.Encoders,
			SharedJpegCount:           a.JPEGs,
			SharedOfaCount:            a.OFAs,
			GpuInstanceSliceCount:     a.GPUInstanceSlices,
			ComputeInstanceSliceCount: a.ComputeInstanceSlices,
			MemorySizeMB:              info.MemoryMiB,
		},
		gi:          gi,
		ci:          ci,
		ciPlacement: ciAt,
	}
	n.installMIGDevice(i, m)
	for _, hook := range n.migHooks {
		hook(i, m.dev)
	}
	fillUnsupported(m.dev)
	n.wrapLost(m.dev, i)
	return m
}

// newMIGDevices builds (but does not publish) the GPU instances and MIG
// devices of a layout of GPU i: one GPU instance per MIG device, with the
// compute instance that spans it.
func (n *Node) newMIGDevices(i int, infos []topology.MIGDevice) ([]*gpuInstance, []*migDevice, error) {
	g := n.gpus[i]
	seenGI := map[int]bool{}
	gis := make([]*gpuInstance, 0, len(infos))
	out := make([]*migDevice, 0, len(infos))
	for k, info := range infos {
		p, err := migProfileFor(g.cfg, info.Profile)
		if err != nil {
			return nil, nil, fmt.Errorf("mig[%d]: %w", k, err)
		}
		if seenGI[info.GPUInstance] {
			return nil, nil, fmt.Errorf("mig[%d]: gpu instance %d used twice", k, info.GPUInstance)
		}
		seenGI[info.GPUInstance] = true
		info.Index = k
		gi := n.newGPUInstance(i, info.GPUInstance, p, nvml.GpuInstancePlacement{Start: info.Placement.Start, Size: info.Placement.Size})
		gis = append(gis, gi)
		out = append(out, n.newMIGDevice(i, gi, p.ci, nvml.ComputeInstancePlacement{Start: 0, Size: p.ci.SliceCount}, info))
	}
	return gis, out, nil
}

func (n *Node) installMIGDevice(i int, m *migDevice) {
	g := n.gpus[i]
	d := m.dev
	info := m.info
	d.GetUUIDFunc = func() (string, nvml.Return) { return info.UUID, nvml.SUCCESS }
	d.IsMigDeviceHandleFunc = func() (bool, nvml.Return) { return true, nvml.SUCCESS }
	d.GetDeviceHandleFromMigDeviceHandleFunc = func() (nvml.Device, nvml.Return) { return &n.devices[i].Device, nvml.SUCCESS }
	d.GetGpuInstanceIdFunc = func() (int, nvml.Return) { return info.GPUInstance, nvml.SUCCESS }
	d.GetComputeInstanceIdFunc = func() (int, nvml.Return) { return info.ComputeInstance, nvml.SUCCESS }
	d.GetAttributesFunc = func() (nvml.DeviceAttributes, nvml.Return) { return m.attrs, nvml.SUCCESS }
	d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
		total := info.MemoryMiB << 20
		return nvml.Memory{Total: total, Free: total}, nvml.SUCCESS
	}
	d.GetNameFunc = func() (string, nvml.Return) { return g.cfg.Name + " MIG " + info.Profile, nvml.SUCCESS }
	d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) { return pciInfo(g.busID, g.cfg.PciDeviceId), nvml.SUCCESS }
	// The index moves down when a MIG device before it is destroyed.
	d.GetIndexFunc = func() (int, nvml.Return) {
		n.mu.RLock()
		defer n.mu.RUnlock()
		return m.info.Index, nvml.SUCCESS
	}
	d.GetArchitectureFunc = func() (nvml.DeviceArchitecture, nvml.Return) { return g.cfg.Architecture, nvml.SUCCESS }
}

// buildMIG installs GPU i's initial MIG devices from the spec (MIG enabled;
// an empty list is MIG mode with no instance). Placements the spec leaves
// out are filled in (placeSpecLayout).
func (n *Node) buildMIG(i int, infos []topology.MIGDevice) error {
	g := n.gpus[i]
	cfg := g.cfg
	if len(cfg.MIGProfiles.GpuInstanceProfiles) == 0 && slices.ContainsFunc(knownConfigs, func(c gpus.Config) bool { return c.Name == cfg.Name }) {
		return fmt.Errorf("%s does not support MIG", cfg.Name)
	}
	profiles := make([]migProfile, len(infos))
	for k, info := range infos {
		p, err := migProfileFor(cfg, info.Profile)
		if err != nil {
			return fmt.Errorf("mig[%d]: %w", k, err)
		}
		profiles[k] = p
	}
	infos = slices.Clone(infos)
	if !placeSpecLayout(cfg, profiles, infos) {
		n.log.Debug("simulated mig layout has instances without a legal placement; they collide with nothing", "gpu", i)
	}
	gis, devs, err := n.newMIGDevices(i, infos)
	if err != nil {
		return err
	}
	// New has not published the node yet; the lock keeps the rule.
	n.mu.Lock()
	defer n.mu.Unlock()
	g.migEnabled = true
	g.gis = gis
	g.mig = devs
	n.spec.GPUs[i].MIGEnabled = true
	n.spec.GPUs[i].MIGCapable = true
	n.syncMIGSpecLocked(i)
	return nil
}

// SetMIGLayout reconfigures MIG on GPU gpu at run time, as an operator with
// nvidia-smi or mig-parted would: an empty list turns MIG off, otherwise MIG
// is turned on with one MIG device per profile name, all with new UUIDs.
// The layout is validated against the GPU model first; on success the
// /dev/nvidia-caps and /proc capability files follow and Changed is
// signalled.
func (n *Node) SetMIGLayout(gpu int, profiles []string) error {
	return n.setMIG(gpu, len(profiles) > 0, profiles)
}

// EnableMIG turns MIG mode on for GPU gpu with no GPU or compute instance
// (any it has are destroyed, as by a layout change): what a GPU whose
// instances are made on demand looks like. Changed is signalled.
func (n *Node) EnableMIG(gpu int) error {
	return n.setMIG(gpu, true, nil)
}

// setMIG sets GPU gpu's MIG mode (on) and layout (profiles, which need MIG
// on), replacing every GPU and compute instance it had.
func (n *Node) setMIG(gpu int, on bool, profiles []string) error {
	if gpu < 0 || gpu >= len(n.gpus) {
		return fmt.Errorf("set mig layout: gpu %d: no such gpu (node has %d)", gpu, len(n.gpus))
	}
	if !on && len(profiles) > 0 {
		return errors.New("set mig layout: MIG devices need MIG mode on")
	}
	g := n.gpus[gpu]
	if len(g.cfg.MIGProfiles.GpuInstanceProfiles) == 0 {
		return fmt.Errorf("set mig layout: gpu %d: %s does not support MIG", gpu, g.cfg.Name)
	}
	n.layoutMu.Lock()
	defer n.layoutMu.Unlock()
	if err := n.checkIdle(gpu, "set mig layout"); err != nil {
		return err
	}

	n.mu.RLock()
	gen := g.generation + 1
	uuid := n.spec.GPUs[gpu].UUID
	n.mu.RUnlock()
	infos, err := planMIG(g.cfg, uuid, gen, profiles)
	if err != nil {
		return fmt.Errorf("set mig layout: gpu %d: %w", gpu, err)
	}
	gis, devs, err := n.newMIGDevices(gpu, infos)
	if err != nil {
		return fmt.Errorf("set mig layout: gpu %d: %w", gpu, err)
	}
	n.mu.Lock()
	// The instances replaced are gone: handles to them are invalid.
	for _, gi := range g.gis {
		gi.destroyed = true
	}
	for _, m := range g.mig {
		m.destroyed = true
	}
	g.generation = gen
	g.migEnabled = on
	g.gis = gis
	g.mig = devs
	n.spec.GPUs[gpu].MIGEnabled = on
	n.syncMIGSpecLocked(gpu)
	n.mu.Unlock()
	// The instances' memory is new: no leak survives them.
	n.clearLeaks(gpu)
	if err := n.writeMIGCaps(); err != nil {
		// The NVML view has changed already; the files are a best-effort
		// mirror and their absence shows up as missing device nodes.
		n.log.Error("simulated mig capability files not updated", "gpu", gpu, "err", err)
	}
	n.log.Info("simulated mig layout changed", "gpu", gpu, "migMode", on, "profiles", profiles, "generation", gen)
	n.notifyChanged()
	return nil
}

// syncMIGSpecLocked makes the spec's MIG devices of GPU i those NVML lists,
// numbered in order. Caller holds n.mu for writing.
func (n *Node) syncMIGSpecLocked(i int) {
	g := n.gpus[i]
	var list []topology.MIGDevice
	for k, m := range g.mig {
		m.info.Index = k
		list = append(list, m.info)
	}
	n.spec.GPUs[i].MIG = list
}
