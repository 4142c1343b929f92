package sim

import (
	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner/nvmlapi"
)

// giHandle and ciHandle are the GPU and compute instance handles NVML()
// hands out (nvmlapi.GpuInstance, nvmlapi.ComputeInstance). Like device
// handles they are values, so two handles of one instance compare equal,
// and every call passes the GPU's gate (counted, held while the GPU
// hangs); the answers are mig_make.go's.
type (
	giHandle struct {
		gi *gpuInstance
		g  *gpuGate
	}
	ciHandle struct {
		m *migDevice
		g *gpuGate
	}
)

var (
	_ nvmlapi.GpuInstance     = giHandle{}
	_ nvmlapi.ComputeInstance = ciHandle{}
)

// giHandleOf is the handle of the GPU instance a mock function answered
// (nil for none), sharing gate g.
func giHandleOf(gi nvml.GpuInstance, g *gpuGate) nvmlapi.GpuInstance {
	s, ok := gi.(*gpuInstance)
	if !ok || s == nil {
		return nil
	}
	return giHandle{gi: s, g: g}
}

func (h giHandle) GetInfo() (nvml.GpuInstanceInfo, nvml.Return) {
	h.g.enter(giGetInfo)
	return h.gi.n.giInfo(h.gi)
}

func (h giHandle) GetComputeInstanceProfileInfo(profile, engProfile int) (nvml.ComputeInstanceProfileInfo, nvml.Return) {
	h.g.enter(giGetComputeInstanceProfileInfo)
	return h.gi.n.ciProfileInfo(h.gi, profile, engProfile)
}

func (h giHandle) CreateComputeInstance(info *nvml.ComputeInstanceProfileInfo) (nvmlapi.ComputeInstance, nvml.Return) {
	h.g.enter(giCreateComputeInstance)
	m, ret := h.gi.n.createComputeInstance(h.gi, info)
	if m == nil {
		return nil, ret
	}
	return ciHandle{m: m, g: h.g}, ret
}

func (h giHandle) GetComputeInstanceById(id int) (nvmlapi.ComputeInstance, nvml.Return) {
	h.g.enter(giGetComputeInstanceById)
	m, ret := h.gi.n.computeInstanceByID(h.gi, id)
	if m == nil {
		return nil, ret
	}
	return ciHandle{m: m, g: h.g}, ret
}

func (h giHandle) Destroy() nvml.Return {
	h.g.enter(giDestroy)
	return h.gi.n.destroyGPUInstance(h.gi)
}

// GetInfo answers nvmlComputeInstanceGetInfo_v2 with the MIG device's
// handle as Device (go-nvml's info carries the MIG device's handle) and
// the GPU instance's handle.
func (h ciHandle) GetInfo() (nvmlapi.ComputeInstanceInfo, nvml.Return) {
	h.g.enter(ciGetInfo)
	n := h.m.gi.n
	n.mu.RLock()
	defer n.mu.RUnlock()
	if ret := n.instanceState(h.m.gi.gpu, h.m.destroyed); ret != nvml.SUCCESS {
		return nvmlapi.ComputeInstanceInfo{}, ret
	}
	return nvmlapi.ComputeInstanceInfo{
		Device:      device{m: h.m.dev, g: h.g},
		GpuInstance: giHandle{gi: h.m.gi, g: h.g},
		Id:          uint32(h.m.info.ComputeInstance),
		ProfileId:   h.m.ci.Id,
		Placement:   h.m.ciPlacement,
	}, nvml.SUCCESS
}

func (h ciHandle) Destroy() nvml.Return {
	h.g.enter(ciDestroy)
	return h.m.gi.n.destroyComputeInstance(h.m)
}
