package sim

import (
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// GPU and compute instances made and destroyed through NVML, as nvml.h
// says (go-nvml v0.13.3-1's copy): what a DRA driver making MIG devices on
// demand does. Each change holds layoutMu (it is serialised with layout
// changes and process starts, and rewrites the capability files), checks
// under Node.mu, publishes under Node.mu, and signals Changed. The calls
// reach here through the GPU's gate (counted, held while the GPU hangs);
// a lost GPU answers ERROR_GPU_IS_LOST.

// migFault is the "mig-create-fails" fault of a GPU: call (one of
// migCreateCalls) answers ret.
type migFault struct {
	call string
	ret  nvml.Return
}

// The calls a "mig-create-fails" fault makes fail.
const (
	callCreateGpuInstance     = "CreateGpuInstanceWithPlacement"
	callCreateComputeInstance = "CreateComputeInstance"
)

// migCreateFault is the return GPU i's call answers under a
// "mig-create-fails" fault, SUCCESS without one.
func (n *Node) migCreateFault(i int, call string) nvml.Return {
	fs := n.faults
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if f := fs.gpus[i].migCreate; f != nil && f.call == call {
		return f.ret
	}
	return nvml.SUCCESS
}

// createGPUInstance makes a GPU instance of profile info on GPU i at
// placement at (nvml.h nvmlDeviceCreateGpuInstanceWithPlacement):
//   - NOT_SUPPORTED "If device doesn't have MIG mode enabled";
//   - INVALID_ARGUMENT "If device, profile, profileId, placement or
//     gpuInstance are invalid": a profile the GPU lacks, a placement that
//     is not one nvmlDeviceGetGpuInstancePossiblePlacements_v2 lists for
//     it (start and size);
//   - INSUFFICIENT_RESOURCES "If the requested GPU instance could not be
//     created": the profile's instance count reached, or the placement
//     overlapping an existing GPU instance ("Creation of new GPU instance
//     will fail if there is overlap with the already occupied memory
//     slices", nvmlDeviceGetGpuInstancePossiblePlacements_v2).
//
// The GPU instance ID is the driver's for that placement (giIDFor).
func (n *Node) createGPUInstance(i int, info *nvml.GpuInstanceProfileInfo, at *nvml.GpuInstancePlacement) (*gpuInstance, nvml.Return) {
	if info == nil || at == nil {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	g := n.gpus[i]
	n.layoutMu.Lock()
	defer n.layoutMu.Unlock()
	if !n.migOn(i) {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	p, ok := n.giProfile(i, info.Id)
	if !ok {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	if !slices.Contains(g.cfg.MIGProfiles.GpuInstancePlacements[p.enum], *at) {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	if ret := n.migCreateFault(i, callCreateGpuInstance); ret != nvml.SUCCESS {
		return nil, ret
	}
	n.mu.RLock()
	count, used := 0, map[int]bool{}
	overlap := false
	for _, other := range g.gis {
		used[other.id] = true
		if other.profile.gi.Id == p.gi.Id {
			count++
		}
		if slicesOf(other.placement)&slicesOf(*at) != 0 && other.placement.Size > 0 {
			overlap = true
		}
	}
	lost := g.lost
	n.mu.RUnlock()
	switch {
	case lost:
		return nil, nvml.ERROR_GPU_IS_LOST
	case count >= int(p.gi.InstanceCount), overlap:
		return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
	}
	gi := n.newGPUInstance(i, giIDFor(int(p.gi.SliceCount), int(at.Start), used), p, *at)
	n.mu.Lock()
	g.gis = append(g.gis, gi)
	n.mu.Unlock()
	n.migChanged("simulated gpu instance created", i, "gi", gi.id, "profile", p.name, "start", at.Start, "size", at.Size)
	return gi, nvml.SUCCESS
}

// migOn says whether GPU i has MIG mode on.
func (n *Node) migOn(i int) bool {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.gpus[i].migEnabled
}

// migChanged follows a change of GPU i's instances: the capability files,
// a log line, the change signal. Caller holds layoutMu.
func (n *Node) migChanged(msg string, i int, args ...any) {
	if err := n.writeMIGCaps(); err != nil {
		n.log.Error("simulated mig capability files not updated", "gpu", i, "err", err)
	}
	n.log.Info(msg, append([]any{"gpu", i}, args...)...)
	n.notifyChanged()
}

// instanceState answers a call on a GPU or compute instance handle whose
// GPU is lost (ERROR_GPU_IS_LOST) or that was destroyed (nvml.h:
// INVALID_ARGUMENT "If gpuInstance is invalid", "If computeInstance is
// invalid"; "If the parent device is unbound, reset or the GPU instance is
// destroyed explicitly, the GPU instance handle would become invalid").
// Caller holds n.mu.
func (n *Node) instanceState(gpu int, destroyed bool) nvml.Return {
	switch {
	case n.gpus[gpu].lost:
		return nvml.ERROR_GPU_IS_LOST
	case destroyed:
		return nvml.ERROR_INVALID_ARGUMENT
	}
	return nvml.SUCCESS
}

// giInfo is GPU instance gi's nvmlGpuInstanceInfo_t: the parent's mock
// device (as go-nvml's mock server sets it), its ID, its profile's
// per-device ID and its placement.
func (n *Node) giInfo(gi *gpuInstance) (nvml.GpuInstanceInfo, nvml.Return) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	if ret := n.instanceState(gi.gpu, gi.destroyed); ret != nvml.SUCCESS {
		return nvml.GpuInstanceInfo{}, ret
	}
	return nvml.GpuInstanceInfo{
		Device:    &n.devices[gi.gpu].Device,
		Id:        uint32(gi.id),
		ProfileId: gi.profile.gi.Id,
		Placement: gi.placement,
	}, nvml.SUCCESS
}

// ciProfiles are the compute instance profiles of GPU instance gi by
// COMPUTE_INSTANCE_PROFILE_* value: the model's table, or for a model
// without one the profile spanning the instance.
func (n *Node) ciProfiles(gi *gpuInstance) map[int]nvml.ComputeInstanceProfileInfo {
	if t, ok := n.gpus[gi.gpu].cfg.MIGProfiles.ComputeInstanceProfiles[gi.profile.enum]; ok {
		return t
	}
	return map[int]nvml.ComputeInstanceProfileInfo{int(gi.profile.ci.Id): gi.profile.ci}
}

// ciProfileInfo answers nvmlGpuInstanceGetComputeInstanceProfileInfo:
// INVALID_ARGUMENT "If gpuInstance, profile, engProfile or info are
// invalid" (outside the NVML_COMPUTE_INSTANCE_PROFILE_* and
// NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_* ranges), NOT_SUPPORTED "If
// profile isn't supported".
func (n *Node) ciProfileInfo(gi *gpuInstance, profile, eng int) (nvml.ComputeInstanceProfileInfo, nvml.Return) {
	n.mu.RLock()
	ret := n.instanceState(gi.gpu, gi.destroyed)
	n.mu.RUnlock()
	switch {
	case ret != nvml.SUCCESS:
		return nvml.ComputeInstanceProfileInfo{}, ret
	case profile < 0 || profile >= nvml.COMPUTE_INSTANCE_PROFILE_COUNT,
		eng < 0 || eng >= nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_COUNT:
		return nvml.ComputeInstanceProfileInfo{}, nvml.ERROR_INVALID_ARGUMENT
	}
	p, ok := n.ciProfiles(gi)[profile]
	if !ok || eng != nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED {
		return nvml.ComputeInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
	}
	return p, nvml.SUCCESS
}

// createComputeInstance makes a compute instance of profile info in GPU
// instance gi (nvml.h nvmlGpuInstanceCreateComputeInstance): a new MIG
// device, listed after the others, with a UUID of its own.
//   - INVALID_ARGUMENT "If gpuInstance, profile, profileId or
//     computeInstance are invalid" (a destroyed GPU instance);
//   - NOT_SUPPORTED "If profileId isn't supported";
//   - INSUFFICIENT_RESOURCES "If the requested compute instance could not
//     be created": the profile's instance count reached, or no placement
//     of it free in the GPU instance.
func (n *Node) createComputeInstance(gi *gpuInstance, info *nvml.ComputeInstanceProfileInfo) (*migDevice, nvml.Return) {
	if info == nil {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	i := gi.gpu
	g := n.gpus[i]
	n.layoutMu.Lock()
	defer n.layoutMu.Unlock()
	n.mu.RLock()
	ret := n.instanceState(i, gi.destroyed)
	var siblings []*migDevice
	for _, m := range g.mig {
		if m.gi == gi {
			siblings = append(siblings, m)
		}
	}
	parentUUID := n.spec.GPUs[i].UUID
	n.mu.RUnlock()
	if ret != nvml.SUCCESS {
		return nil, ret
	}
	var enum int
	var ci nvml.ComputeInstanceProfileInfo
	found := false
	for e, p := range n.ciProfiles(gi) {
		if p.Id == info.Id {
			enum, ci, found = e, p, true
			break
		}
	}
	if !found {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	if ret := n.migCreateFault(i, callCreateComputeInstance); ret != nvml.SUCCESS {
		return nil, ret
	}
	at, ok := n.ciPlacementFor(gi, enum, ci, siblings)
	if !ok {
		return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
	}
	usedIDs := map[int]bool{}
	for _, m := range siblings {
		usedIDs[m.info.ComputeInstance] = true
	}
	id := 0
	for usedIDs[id] {
		id++
	}
	name, err := topology.MIGProfileNameOf(gi.profile.enum, int(gi.profile.gi.SliceCount), int(ci.SliceCount),
		gi.profile.gi.MemorySizeMB, g.memBytes)
	if err != nil {
		name = gi.profile.name
	}
	g.made++
	m := n.newMIGDevice(i, gi, ci, at, topology.MIGDevice{
		UUID:            deterministicUUID("MIG", parentUUID, "made", g.made, gi.id, id, name),
		Profile:         name,
		GPUInstance:     gi.id,
		ComputeInstance: id,
	})
	n.mu.Lock()
	g.mig = append(g.mig, m)
	n.syncMIGSpecLocked(i)
	n.mu.Unlock()
	n.migChanged("simulated compute instance created", i, "gi", gi.id, "ci", id, "uuid", m.info.UUID, "profile", name)
	return m, nvml.SUCCESS
}

// ciPlacementFor finds where a compute instance of profile ci (enum) fits
// in GPU instance gi beside its compute instances siblings: the first
// placement of the model's table
// (nvmlGpuInstanceGetComputeInstancePossiblePlacements) free of them, or
// for a model without one the slices after theirs. It is false when the
// profile's instance count is reached or nothing fits.
func (n *Node) ciPlacementFor(gi *gpuInstance, enum int, ci nvml.ComputeInstanceProfileInfo, siblings []*migDevice) (nvml.ComputeInstancePlacement, bool) {
	var busy uint64
	count, usedSlices := 0, uint32(0)
	for _, m := range siblings {
		busy |= slicesOf(nvml.GpuInstancePlacement(m.ciPlacement))
		usedSlices += m.ci.SliceCount
		if m.ci.Id == ci.Id {
			count++
		}
	}
	if (ci.InstanceCount > 0 && count >= int(ci.InstanceCount)) || usedSlices+ci.SliceCount > gi.profile.gi.SliceCount {
		return nvml.ComputeInstancePlacement{}, false
	}
	table, ok := n.gpus[gi.gpu].cfg.MIGProfiles.ComputeInstancePlacements[gi.profile.enum][enum]
	if !ok {
		return nvml.ComputeInstancePlacement{Start: usedSlices, Size: ci.SliceCount}, true
	}
	for _, pl := range table {
		if slicesOf(nvml.GpuInstancePlacement(pl))&busy == 0 {
			return pl, true
		}
	}
	return nvml.ComputeInstancePlacement{}, false
}

// computeInstanceByID answers nvmlGpuInstanceGetComputeInstanceById:
// NOT_FOUND "If the compute instance is not found".
func (n *Node) computeInstanceByID(gi *gpuInstance, id int) (*migDevice, nvml.Return) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	if ret := n.instanceState(gi.gpu, gi.destroyed); ret != nvml.SUCCESS {
		return nil, ret
	}
	for _, m := range n.gpus[gi.gpu].mig {
		if m.gi == gi && m.info.ComputeInstance == id {
			return m, nvml.SUCCESS
		}
	}
	return nil, nvml.ERROR_NOT_FOUND
}

// destroyGPUInstance destroys gi (nvml.h nvmlGpuInstanceDestroy): IN_USE
// "If the GPU instance is in use. This error would be returned if
// processes (e.g. CUDA application) or compute instances are active on the
// GPU instance" (processes run on compute instances, so its compute
// instances are the test).
func (n *Node) destroyGPUInstance(gi *gpuInstance) nvml.Return {
	i := gi.gpu
	g := n.gpus[i]
	n.layoutMu.Lock()
	defer n.layoutMu.Unlock()
	n.mu.Lock()
	if ret := n.instanceState(i, gi.destroyed); ret != nvml.SUCCESS {
		n.mu.Unlock()
		return ret
	}
	if slices.ContainsFunc(g.mig, func(m *migDevice) bool { return m.gi == gi }) {
		n.mu.Unlock()
		return nvml.ERROR_IN_USE
	}
	gi.destroyed = true
	g.gis = slices.DeleteFunc(g.gis, func(x *gpuInstance) bool { return x == gi })
	n.mu.Unlock()
	n.migChanged("simulated gpu instance destroyed", i, "gi", gi.id)
	return nvml.SUCCESS
}

// destroyComputeInstance destroys the compute instance of MIG device m
// (nvml.h nvmlComputeInstanceDestroy): IN_USE "If the compute instance is
// in use. This error would be returned if processes (e.g. CUDA
// application) are active on the compute instance". The MIG devices after
// it move down one index; memory leaked on it goes with it.
func (n *Node) destroyComputeInstance(m *migDevice) nvml.Return {
	i := m.gi.gpu
	g := n.gpus[i]
	uuid := m.info.UUID
	n.layoutMu.Lock()
	defer n.layoutMu.Unlock()
	n.mu.RLock()
	ret := n.instanceState(i, m.destroyed)
	n.mu.RUnlock()
	if ret != nvml.SUCCESS {
		return ret
	}
	ps := n.procs
	ps.mu.Lock()
	busy := false
	for _, p := range ps.procs {
		if p.GPU == i && p.MIG == uuid {
			busy = true
		}
	}
	if !busy {
		delete(ps.leaked, leakKey{gpu: i, mig: uuid})
	}
	ps.mu.Unlock()
	if busy {
		return nvml.ERROR_IN_USE
	}
	n.mu.Lock()
	m.destroyed = true
	g.mig = slices.DeleteFunc(g.mig, func(x *migDevice) bool { return x == m })
	n.syncMIGSpecLocked(i)
	n.mu.Unlock()
	n.migChanged("simulated compute instance destroyed", i, "gi", m.gi.id, "ci", m.info.ComputeInstance, "uuid", uuid)
	return nvml.SUCCESS
}
