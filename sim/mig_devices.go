package sim

import (
	"fmt"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// installMIG answers GPU i's MIG queries from the simulator's MIG state.
// Layouts change only through SetMIGLayout, so the NVML calls that would
// create or destroy instances are refused.
func (n *Node) installMIG(i int) {
	d := n.devices[i]
	g := n.gpus[i]
	// A snapshot may say a GPU of a model the mocks do not know is MIG
	// capable; it then gets the common maximum of seven MIG devices.
	capable := len(g.cfg.MIGProfiles.GpuInstanceProfiles) > 0 || n.spec.GPUs[i].MIGCapable
	maxDevices := 7
	if len(g.cfg.MIGProfiles.GpuInstanceProfiles) > 0 {
		maxDevices = 0
	}
	for _, p := range g.cfg.MIGProfiles.GpuInstanceProfiles {
		maxDevices = max(maxDevices, int(p.InstanceCount))
	}
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
	d.GetGpuInstancesFunc = func(info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstance, nvml.Return) {
		if !capable {
			return nil, nvml.ERROR_NOT_SUPPORTED
		}
		if info == nil {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		n.mu.RLock()
		defer n.mu.RUnlock()
		var out []nvml.GpuInstance
		for _, m := range g.mig {
			if m.gi.Info.ProfileId == info.Id {
				out = append(out, m.gi)
			}
		}
		return out, nvml.SUCCESS
	}
	d.GetGpuInstanceByIdFunc = func(id int) (nvml.GpuInstance, nvml.Return) {
		if !capable {
			return nil, nvml.ERROR_NOT_SUPPORTED
		}
		n.mu.RLock()
		defer n.mu.RUnlock()
		for _, m := range g.mig {
			if int(m.gi.Info.Id) == id {
				return m.gi, nvml.SUCCESS
			}
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
	refuse := func(*nvml.GpuInstanceProfileInfo) (nvml.GpuInstance, nvml.Return) {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	d.CreateGpuInstanceFunc = refuse
	d.CreateGpuInstanceWithPlacementFunc = func(info *nvml.GpuInstanceProfileInfo, _ *nvml.GpuInstancePlacement) (nvml.GpuInstance, nvml.Return) {
		return refuse(info)
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
			for _, m := range g.mig {
				if int(m.profile.Id) == profile {
					return m.profile, nvml.SUCCESS
				}
			}
			return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
		}
	}
}

// newMIGDevices builds (but does not publish) the MIG devices of GPU i.
func (n *Node) newMIGDevices(i int, infos []topology.MIGDevice) ([]*migDevice, error) {
	g := n.gpus[i]
	seenGI := map[int]bool{}
	out := make([]*migDevice, 0, len(infos))
	for k, info := range infos {
		p, err := migProfileFor(g.cfg, info.Profile)
		if err != nil {
			return nil, fmt.Errorf("mig[%d]: %w", k, err)
		}
		if seenGI[info.GPUInstance] {
			return nil, fmt.Errorf("mig[%d]: gpu instance %d used twice", k, info.GPUInstance)
		}
		seenGI[info.GPUInstance] = true
		if info.MemoryMiB == 0 {
			info.MemoryMiB = p.gi.MemorySizeMB
		}
		info.Index = k
		gi := server.NewGpuInstanceFromInfo(nvml.GpuInstanceInfo{
			Device:    &n.devices[i].Device,
			Id:        uint32(info.GPUInstance),
			ProfileId: p.gi.Id,
		}, g.cfg.MIGProfiles)
		ci := server.NewComputeInstanceFromInfo(nvml.ComputeInstanceInfo{
			Device:      &n.devices[i].Device,
			GpuInstance: gi,
			Id:          uint32(info.ComputeInstance),
			ProfileId:   p.ci.Id,
		})
		gi.ComputeInstances[ci] = struct{}{}
		gi.ComputeInstanceCounter = uint32(info.ComputeInstance) + 1
		gi.GetComputeInstanceByIdFunc = func(id int) (nvml.ComputeInstance, nvml.Return) {
			if id == info.ComputeInstance {
				return ci, nvml.SUCCESS
			}
			return nil, nvml.ERROR_NOT_FOUND
		}
		gi.DestroyFunc = func() nvml.Return { return nvml.ERROR_NOT_SUPPORTED }
		ci.DestroyFunc = func() nvml.Return { return nvml.ERROR_NOT_SUPPORTED }
		fillUnsupported(&gi.GpuInstance)
		fillUnsupported(&ci.ComputeInstance)

		// A snapshot of a real node keeps what its GPU answered.
		a := info.Attributes
		if a == (topology.MIGAttributes{}) {
			a = migAttributes(p.gi, p.ci)
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
			gi:      gi,
			ci:      ci,
			profile: p.gi,
		}
		n.installMIGDevice(i, m)
		for _, hook := range n.migHooks {
			hook(i, m.dev)
		}
		fillUnsupported(m.dev)
		n.wrapLost(m.dev, i)
		out = append(out, m)
	}
	return out, nil
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
	d.GetIndexFunc = func() (int, nvml.Return) { return info.Index, nvml.SUCCESS }
	d.GetArchitectureFunc = func() (nvml.DeviceArchitecture, nvml.Return) { return g.cfg.Architecture, nvml.SUCCESS }
}

// buildMIG installs GPU i's initial MIG devices from the spec.
func (n *Node) buildMIG(i int, infos []topology.MIGDevice) error {
	cfg := n.gpus[i].cfg
	if len(cfg.MIGProfiles.GpuInstanceProfiles) == 0 && slices.ContainsFunc(knownConfigs, func(c gpus.Config) bool { return c.Name == cfg.Name }) {
		return fmt.Errorf("%s does not support MIG", cfg.Name)
	}
	devs, err := n.newMIGDevices(i, infos)
	if err != nil {
		return err
	}
	g := n.gpus[i]
	g.migEnabled = true
	g.mig = devs
	for k := range infos {
		n.spec.GPUs[i].MIG[k] = devs[k].info
	}
	n.spec.GPUs[i].MIGCapable = true
	return nil
}

// SetMIGLayout reconfigures MIG on GPU gpu at run time, as an operator with
// nvidia-smi or mig-parted would: an empty list turns MIG off, otherwise MIG
// is turned on with one MIG device per profile name, all with new UUIDs.
// The layout is validated against the GPU model first; on success the
// /dev/nvidia-caps and /proc capability files follow and Changed is
// signalled.
func (n *Node) SetMIGLayout(gpu int, profiles []string) error {
	if gpu < 0 || gpu >= len(n.gpus) {
		return fmt.Errorf("set mig layout: gpu %d: no such gpu (node has %d)", gpu, len(n.gpus))
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
	devs, err := n.newMIGDevices(gpu, infos)
	if err != nil {
		return fmt.Errorf("set mig layout: gpu %d: %w", gpu, err)
	}
	n.mu.Lock()
	g.generation = gen
	g.migEnabled = len(devs) > 0
	g.mig = devs
	n.spec.GPUs[gpu].MIGEnabled = g.migEnabled
	n.spec.GPUs[gpu].MIG = nil
	for _, m := range devs {
		n.spec.GPUs[gpu].MIG = append(n.spec.GPUs[gpu].MIG, m.info)
	}
	n.mu.Unlock()
	// The instances' memory is new: no leak survives them.
	n.clearLeaks(gpu)
	if err := n.writeMIGCaps(); err != nil {
		// The NVML view has changed already; the files are a best-effort
		// mirror and their absence shows up as missing device nodes.
		n.log.Error("simulated mig capability files not updated", "gpu", gpu, "err", err)
	}
	n.log.Info("simulated mig layout changed", "gpu", gpu, "profiles", profiles, "generation", gen)
	n.notifyChanged()
	return nil
}
