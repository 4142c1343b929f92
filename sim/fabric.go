package sim

import (
	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/google/uuid"

	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// installFabric answers GetGpuFabricInfo from each GPU's spec
// (topology.GPU.Fabric). nvml.h nvmlDeviceGetGpuFabricInfo: "For Hopper or
// newer fully supported devices. On Hopper + NVSwitch systems, GPU is
// registered with the NVIDIA Fabric Manager. Upon successful registration,
// the GPU is added to the NVLink fabric"; it documents
// NVML_ERROR_NOT_SUPPORTED "If device doesn't support gpu fabric", which is
// what a GPU without a fabric in its spec (and every MIG device) answers.
//
// A spec without fabric information (a snapshot written before the model
// carried it) gets one for each Hopper or later GPU whose NVLinks go to
// NVSwitches: probe state NVML_GPU_FABRIC_STATE_COMPLETED, status SUCCESS
// and an all-zero cluster UUID with clique 0, what a single-node NVSwitch
// system (DGX/HGX H100, H200, B200) reports. NVIDIA's DRA driver expects
// that zero UUID "for systems which are NVLink-capable, but not
// MNNVL-capable" (k8s-dra-driver-gpu
// cmd/compute-domain-kubelet-plugin/nvlib.go getCliqueIDStrict); the
// clique ID such a system reports was not confirmed on hardware, and no
// consumer reads it beside a zero UUID. A multi-node NVLink profile
// (gb200-nvl72) gives its domain's cluster UUID and clique ID instead.
//
// While fabric-not-ready holds, the GPU answers
// NVML_GPU_FABRIC_STATE_IN_PROGRESS with NVML_ERROR_NOT_READY (the status
// "Must be checked only if state returns complete") and no cluster UUID or
// clique yet.
//
// Only the v1 call is simulated: go-nvml's GetGpuFabricInfoV returns a
// GpuFabricInfoHandler, a struct around an unexported real nvmlDevice, which
// a mock cannot build; the simulator's V-handler stays the zero handler of
// fillUnsupported, and calling its V1/V2 would reach the real library.
func (n *Node) installFabric() {
	fs := n.faults
	for i, d := range n.devices {
		spec := &n.spec.GPUs[i]
		if spec.Fabric == nil && n.onFabric(i) {
			spec.Fabric = &topology.Fabric{State: topology.FabricCompleted}
		}
		if spec.Fabric != nil {
			f := *spec.Fabric
			n.gpus[i].fabric = &f
		}
		if n.gpus[i].fabric == nil {
			d.GetGpuFabricInfoFunc = func() (nvml.GpuFabricInfo, nvml.Return) {
				return nvml.GpuFabricInfo{}, nvml.ERROR_NOT_SUPPORTED
			}
			continue
		}
		registered := fabricInfo(n.gpus[i].fabric)
		d.GetGpuFabricInfoFunc = func() (nvml.GpuFabricInfo, nvml.Return) {
			fs.mu.Lock()
			notReady, failed := fs.gpus[i].fabricNotReady, fs.nvmlFailed
			fs.mu.Unlock()
			if failed {
				return nvml.GpuFabricInfo{}, nvml.ERROR_UNKNOWN
			}
			if notReady {
				return nvml.GpuFabricInfo{State: nvml.GPU_FABRIC_STATE_IN_PROGRESS, Status: uint32(nvml.ERROR_NOT_READY)}, nvml.SUCCESS
			}
			return registered, nvml.SUCCESS
		}
	}
}

// fabricInfo is the nvmlGpuFabricInfo_t of a GPU's fabric spec (which
// Validate has checked).
func fabricInfo(f *topology.Fabric) nvml.GpuFabricInfo {
	state, _ := f.State.NVML()
	info := nvml.GpuFabricInfo{State: state, Status: f.Status, CliqueId: f.CliqueID}
	if f.ClusterUUID != "" {
		u, _ := uuid.Parse(f.ClusterUUID)
		info.ClusterUuid = u
	}
	return info
}

// multiNodeNVLink says whether the node's GPUs sit in a multi-node NVLink
// domain (a fabric with a cluster UUID): their NVSwitches are then in the
// rack's NVLink switch trays, not on this node.
func (n *Node) multiNodeNVLink() bool {
	for _, g := range n.gpus {
		if g.fabric != nil && g.fabric.ClusterUUID != "" {
			return true
		}
	}
	return false
}

// onFabric says whether GPU i is a Hopper or later GPU whose NVLinks go to
// NVSwitches (the dgx-h100, dgx-h200, dgx-b200 and gb200-nvl72 profiles),
// the GPUs that register with the Fabric Manager.
func (n *Node) onFabric(i int) bool {
	g := n.gpus[i]
	if !fabricArch(g.cfg.Architecture) {
		return false
	}
	for _, l := range g.links {
		if l.remoteType == nvml.NVLINK_DEVICE_TYPE_SWITCH {
			return true
		}
	}
	return false
}

// fabricArch says whether GPUs of an architecture register with the Fabric
// Manager when on an NVSwitch: Hopper and later (nvml.h "For Hopper or
// newer fully supported devices").
func fabricArch(a nvml.DeviceArchitecture) bool {
	switch a {
	case nvml.DEVICE_ARCH_HOPPER, nvml.DEVICE_ARCH_BLACKWELL, nvml.DEVICE_ARCH_RUBIN:
		return true
	}
	return false
}
