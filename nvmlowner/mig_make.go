package nvmlowner

import (
	"context"
	"errors"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// MIG devices made on demand: a GPU instance at a placement and the
// compute instance that spans it, as NVIDIA's DRA driver makes them
// (k8s-dra-driver-gpu, cmd/gpu-kubelet-plugin/nvlib.go createMigDevice and
// deleteMigDevice), on a GPU already in MIG mode (the agent never changes
// MIG mode). Each runs as one batch on the parent GPU's lane, bounded by
// the call timeout like any other call there. Return codes are nvml.h's
// (go-nvml v0.13.3-1's copy).

// ErrMaybeMade marks a MakeMIG error after which a GPU or compute
// instance may be left on the GPU: the call did not return in time (it
// may still run), or what it had made could not be destroyed again.
// UnmakeMIG of the same place clears it away. After any other MakeMIG
// error the GPU is as it was.
var ErrMaybeMade = errors.New("a mig device may be left behind")

// MakeMIG makes a MIG device on GPU parent (by UUID): the GPU instance of
// profile (a GPU_INSTANCE_PROFILE_* value) at placement at, then the
// compute instance spanning it, and returns the MIG device as discovery
// reads one. It is all or nothing: when a step after the GPU instance's
// creation fails, what was made is destroyed again. Errors name the step
// and wrap its nvml.Return: errors.Is(err, nvml.ERROR_INSUFFICIENT_RESOURCES)
// says the placement is taken ("If the requested GPU instance could not be
// created"), nvml.ERROR_NOT_SUPPORTED that the GPU is not in MIG mode,
// nvml.ERROR_INVALID_ARGUMENT that the profile or placement is not one the
// GPU has; ErrTimeout that the GPU hangs. Where what was made is unknown
// the error also wraps ErrMaybeMade.
func (o *Owner) MakeMIG(ctx context.Context, parent string, profile int, at topology.MIGPlacement) (topology.MIGDevice, error) {
	what := fmt.Sprintf("make mig device %v at slice %d+%d on %s", gpuInstanceProfileName(profile), at.Start, at.Size, parent)
	var (
		m   topology.MIGDevice
		err error
		ran bool
	)
	callErr := o.Do(ctx, parent, what, func(dev Device) nvml.Return {
		ran = true
		m, err = makeMIG(dev, what, profile, at)
		return ret(err)
	})
	if !finished(callErr) {
		// Timed out or cancelled: the batch may still be running, and
		// nothing it writes is read.
		return topology.MIGDevice{}, fmt.Errorf("%w: %w", callErr, ErrMaybeMade)
	}
	if !ran {
		// The GPU's handle was not found: nothing was called.
		return topology.MIGDevice{}, callErr
	}
	if err != nil {
		return topology.MIGDevice{}, err
	}
	o.log.Info("mig device made", "gpu", parent, "uuid", m.UUID, "profile", m.Profile, "gi", m.GPUInstance, "ci", m.ComputeInstance,
		"start", m.Placement.Start, "size", m.Placement.Size)
	return m, nil
}

// UnmakeMIG destroys the MIG device MakeMIG made on GPU parent: every
// compute instance of the GPU instance of profile whose placement starts
// at at.Start, then the GPU instance. With uuid, only if that GPU
// instance holds the MIG device of that UUID: a device made at the same
// place since (for another claim) is left alone. Without it (a make whose
// outcome is unknown), whatever of that profile starts there goes.
// Nothing there (no such GPU instance, a profile the GPU lacks, MIG mode
// off) is success, and so is a GPU that is gone or lost (its MIG devices
// are gone with it), so it is idempotent and cleans up after a crash
// between MakeMIG and the caller recording it. nvml.ERROR_IN_USE means
// processes still run on the device (nvml.h nvmlComputeInstanceDestroy:
// "If the compute instance is in use").
func (o *Owner) UnmakeMIG(ctx context.Context, parent string, profile int, at topology.MIGPlacement, uuid string) error {
	what := fmt.Sprintf("destroy mig device %v at slice %d on %s", gpuInstanceProfileName(profile), at.Start, parent)
	var (
		err     error
		ran     bool
		removed bool
	)
	callErr := o.Do(ctx, parent, what, func(dev Device) nvml.Return {
		ran = true
		removed, err = unmakeMIG(dev, what, profile, at, uuid)
		return ret(err)
	})
	if finished(callErr) && (errors.Is(callErr, nvml.ERROR_GPU_IS_LOST) || !ran && errors.Is(callErr, nvml.ERROR_NOT_FOUND)) {
		o.log.Warn("mig device not destroyed: its gpu is gone or lost, and its mig devices with it", "gpu", parent,
			"profile", gpuInstanceProfileName(profile), "start", at.Start, "err", callErr)
		return nil
	}
	if !finished(callErr) || !ran {
		return callErr
	}
	if err != nil {
		return err
	}
	if removed {
		o.log.Info("mig device destroyed", "gpu", parent, "profile", gpuInstanceProfileName(profile), "start", at.Start)
	}
	return nil
}

// stepError is the error of step (an NVML call) of the batch what.
func stepError(what, step string, r nvml.Return) error {
	return &CallError{What: what + ": " + step, Err: r}
}

// makeMIG runs on the GPU's lane: createMigDevice's steps.
func makeMIG(dev Device, what string, profile int, at topology.MIGPlacement) (topology.MIGDevice, error) {
	// nvml.h nvmlDeviceGetGpuInstanceProfileInfo: NOT_SUPPORTED "If device
	// doesn't support MIG or profile isn't supported", INVALID_ARGUMENT
	// "If device, profile or info are invalid".
	info, r := dev.GetGpuInstanceProfileInfo(profile)
	if r != nvml.SUCCESS {
		return topology.MIGDevice{}, stepError(what, "GetGpuInstanceProfileInfo", r)
	}
	// nvml.h nvmlDeviceCreateGpuInstanceWithPlacement: NOT_SUPPORTED "If
	// device doesn't have MIG mode enabled", INVALID_ARGUMENT for a
	// profile or placement that is invalid, INSUFFICIENT_RESOURCES "If
	// the requested GPU instance could not be created".
	gi, r := dev.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: at.Start, Size: at.Size})
	if r != nvml.SUCCESS {
		return topology.MIGDevice{}, stepError(what, "CreateGpuInstanceWithPlacement", r)
	}
	if gi == nil {
		return topology.MIGDevice{}, stepError(what, "CreateGpuInstanceWithPlacement", nvml.ERROR_UNKNOWN)
	}
	m, err := makeComputeInstance(dev, gi, what, info)
	if err != nil {
		// nvml.h nvmlGpuInstanceDestroy: IN_USE "if processes ... or
		// compute instances are active on the GPU instance";
		// makeComputeInstance destroyed its compute instance already.
		if r := gi.Destroy(); r != nvml.SUCCESS {
			return topology.MIGDevice{}, fmt.Errorf("%w (and destroying the gpu instance again: GpuInstance.Destroy: %w): %w", err, r, ErrMaybeMade)
		}
		return topology.MIGDevice{}, err
	}
	return m, nil
}

// makeComputeInstance makes the compute instance spanning GPU instance gi
// (of profile info) and reads its MIG device; on failure it destroys the
// compute instance again, if it made one.
func makeComputeInstance(dev Device, gi GpuInstance, what string, info nvml.GpuInstanceProfileInfo) (topology.MIGDevice, error) {
	giInfo, r := gi.GetInfo()
	if r != nvml.SUCCESS {
		return topology.MIGDevice{}, stepError(what, "GpuInstance.GetInfo", r)
	}
	ciProfile, err := spanningComputeInstance(gi, what, info.SliceCount)
	if err != nil {
		return topology.MIGDevice{}, err
	}
	// nvml.h nvmlGpuInstanceCreateComputeInstance: NOT_SUPPORTED "If
	// profileId isn't supported", INSUFFICIENT_RESOURCES "If the requested
	// compute instance could not be created".
	ci, r := gi.CreateComputeInstance(&ciProfile)
	if r != nvml.SUCCESS {
		return topology.MIGDevice{}, stepError(what, "GpuInstance.CreateComputeInstance", r)
	}
	if ci == nil {
		return topology.MIGDevice{}, stepError(what, "GpuInstance.CreateComputeInstance", nvml.ERROR_UNKNOWN)
	}
	m, err := readMadeMIG(dev, ci, what, int(giInfo.Id))
	if err != nil {
		// nvml.h nvmlComputeInstanceDestroy: IN_USE "If the compute
		// instance is in use" (no process can be on it yet).
		if r := ci.Destroy(); r != nvml.SUCCESS {
			return topology.MIGDevice{}, fmt.Errorf("%w (and destroying the compute instance again: ComputeInstance.Destroy: %w): %w", err, r, ErrMaybeMade)
		}
		return topology.MIGDevice{}, err
	}
	return m, nil
}

// spanningComputeInstance is the compute instance profile with the GPU
// instance's slice count, shared engines (the one engine profile nvml.h
// defines), lowest NVML_COMPUTE_INSTANCE_PROFILE_* first. nvml.h
// nvmlGpuInstanceGetComputeInstanceProfileInfo: NOT_SUPPORTED "If profile
// isn't supported", INVALID_ARGUMENT for a profile the driver does not
// know: neither is this GPU instance's.
func spanningComputeInstance(gi GpuInstance, what string, slices uint32) (nvml.ComputeInstanceProfileInfo, error) {
	for p := range nvml.COMPUTE_INSTANCE_PROFILE_COUNT {
		info, r := gi.GetComputeInstanceProfileInfo(p, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		switch r {
		case nvml.SUCCESS:
			if info.SliceCount == slices {
				return info, nil
			}
		case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_INVALID_ARGUMENT:
		default:
			return nvml.ComputeInstanceProfileInfo{}, stepError(what, fmt.Sprintf("GpuInstance.GetComputeInstanceProfileInfo(%v)", computeInstanceProfileName(p)), r)
		}
	}
	return nvml.ComputeInstanceProfileInfo{}, fmt.Errorf("nvml %s: no compute instance profile spans the gpu instance's %d slices: %w",
		what, slices, nvml.ERROR_NOT_SUPPORTED)
}

// readMadeMIG reads the MIG device of compute instance ci of GPU instance
// giID as discovery reads it (migDevice), found by its instance IDs among
// the parent's MIG device handles, which also gives its index.
func readMadeMIG(dev Device, ci ComputeInstance, what string, giID int) (topology.MIGDevice, error) {
	// nvml.h nvmlComputeInstanceGetInfo_v2: INVALID_ARGUMENT "If
	// computeInstance or info are invalid".
	ciInfo, r := ci.GetInfo()
	if r != nvml.SUCCESS {
		return topology.MIGDevice{}, stepError(what, "ComputeInstance.GetInfo", r)
	}
	idx, md, err := findMIGDevice(dev, what, giID, int(ciInfo.Id))
	if err != nil {
		return topology.MIGDevice{}, err
	}
	// The parent's memory names the profile as discovery names it (0, as
	// there, when it cannot be read).
	var parentMemory uint64
	if mem, r := dev.GetMemoryInfo(); r == nvml.SUCCESS {
		parentMemory = mem.Total
	}
	m, err := migDevice(dev, md, idx, parentMemory)
	if err != nil {
		return topology.MIGDevice{}, fmt.Errorf("nvml %s: %w", what, err)
	}
	return m, nil
}

// migInstance is one of a parent's MIG device handles with its GPU and
// compute instance IDs.
type migInstance struct {
	index  int
	handle Device
	gi, ci int
}

// migInstances lists the parent's MIG device handles
// (0..GetMaxMigDeviceCount-1; NOT_FOUND and INVALID_ARGUMENT are indexes
// without a device, as discovery reads them) with their instance IDs.
func migInstances(dev Device, what string) ([]migInstance, error) {
	n, r := dev.GetMaxMigDeviceCount()
	if r != nvml.SUCCESS {
		return nil, stepError(what, "GetMaxMigDeviceCount", r)
	}
	var out []migInstance
	for idx := range n {
		md, r := dev.GetMigDeviceHandleByIndex(idx)
		switch {
		case r == nvml.ERROR_NOT_FOUND, r == nvml.ERROR_INVALID_ARGUMENT:
			continue
		case r != nvml.SUCCESS:
			return nil, stepError(what, fmt.Sprintf("GetMigDeviceHandleByIndex(%d)", idx), r)
		case md == nil:
			continue
		}
		gi, r := md.GetGpuInstanceId()
		if r != nvml.SUCCESS {
			return nil, stepError(what, fmt.Sprintf("mig device %d: GetGpuInstanceId", idx), r)
		}
		ci, r := md.GetComputeInstanceId()
		if r != nvml.SUCCESS {
			return nil, stepError(what, fmt.Sprintf("mig device %d: GetComputeInstanceId", idx), r)
		}
		out = append(out, migInstance{index: idx, handle: md, gi: gi, ci: ci})
	}
	return out, nil
}

// findMIGDevice finds the MIG device of GPU instance giID and compute
// instance ciID among the parent's MIG device handles.
func findMIGDevice(dev Device, what string, giID, ciID int) (int, Device, error) {
	ms, err := migInstances(dev, what)
	if err != nil {
		return 0, nil, err
	}
	for _, m := range ms {
		if m.gi == giID && m.ci == ciID {
			return m.index, m.handle, nil
		}
	}
	return 0, nil, fmt.Errorf("nvml %s: no mig device handle has gpu instance %d, compute instance %d: %w", what, giID, ciID, nvml.ERROR_NOT_FOUND)
}

// unmakeMIG runs on the GPU's lane: deleteMigDevice's steps, tolerating
// what is not there. removed says a GPU instance was destroyed.
func unmakeMIG(dev Device, what string, profile int, at topology.MIGPlacement, uuid string) (removed bool, err error) {
	info, r := dev.GetGpuInstanceProfileInfo(profile)
	switch {
	case r == nvml.ERROR_NOT_SUPPORTED, r == nvml.ERROR_INVALID_ARGUMENT:
		// The GPU lacks the profile (or MIG): no instance of it exists.
		return false, nil
	case r != nvml.SUCCESS:
		return false, stepError(what, "GetGpuInstanceProfileInfo", r)
	case info.InstanceCount == 0:
		return false, nil
	}
	// nvml.h nvmlDeviceGetGpuInstances: NOT_SUPPORTED "If device doesn't
	// have MIG mode enabled": then there is nothing to destroy.
	gis, r := dev.GetGpuInstances(&info)
	switch r {
	case nvml.SUCCESS:
	case nvml.ERROR_NOT_SUPPORTED:
		return false, nil
	default:
		return false, stepError(what, "GetGpuInstances", r)
	}
	for _, gi := range gis {
		if gi == nil {
			continue
		}
		giInfo, r := gi.GetInfo()
		switch {
		case r == nvml.ERROR_INVALID_ARGUMENT:
			// Destroyed since it was listed.
			continue
		case r != nvml.SUCCESS:
			return false, stepError(what, "GpuInstance.GetInfo", r)
		case giInfo.Placement.Start != at.Start:
			continue
		}
		if uuid != "" {
			holds, err := giHolds(dev, what, int(giInfo.Id), uuid)
			if err != nil {
				return false, err
			}
			if !holds {
				return false, nil
			}
		}
		if err := destroyComputeInstances(dev, gi, what, int(giInfo.Id)); err != nil {
			return false, err
		}
		// nvml.h nvmlGpuInstanceDestroy: INVALID_ARGUMENT "If gpuInstance
		// is invalid" (already destroyed), IN_USE "If the GPU instance
		// is in use".
		switch r := gi.Destroy(); r {
		case nvml.SUCCESS:
			return true, nil
		case nvml.ERROR_INVALID_ARGUMENT:
			return false, nil
		default:
			return false, stepError(what, "GpuInstance.Destroy", r)
		}
	}
	return false, nil
}

// destroyComputeInstances destroys every compute instance of GPU instance
// gi (ID giID): those of the parent's MIG devices in it, collected before
// any is destroyed (the MIG devices after a destroyed one move down an
// index). nvml.h nvmlGpuInstanceGetComputeInstanceById: NOT_FOUND "If the
// compute instance is not found"; nvmlComputeInstanceDestroy:
// INVALID_ARGUMENT "If computeInstance is invalid" (gone already), IN_USE
// "If the compute instance is in use".
func destroyComputeInstances(dev Device, gi GpuInstance, what string, giID int) error {
	ms, err := migInstances(dev, what)
	if err != nil {
		return err
	}
	var cis []int
	for _, m := range ms {
		if m.gi == giID {
			cis = append(cis, m.ci)
		}
	}
	for _, id := range cis {
		ci, r := gi.GetComputeInstanceById(id)
		switch {
		case r == nvml.ERROR_NOT_FOUND:
			continue
		case r != nvml.SUCCESS:
			return stepError(what, fmt.Sprintf("GpuInstance.GetComputeInstanceById(%d)", id), r)
		case ci == nil:
			continue
		}
		if r := ci.Destroy(); r != nvml.SUCCESS && r != nvml.ERROR_INVALID_ARGUMENT {
			return stepError(what, fmt.Sprintf("ComputeInstance.Destroy(%d)", id), r)
		}
	}
	return nil
}

// giHolds says whether the MIG device of UUID uuid is one of GPU instance
// giID's.
func giHolds(dev Device, what string, giID int, uuid string) (bool, error) {
	ms, err := migInstances(dev, what)
	if err != nil {
		return false, err
	}
	for _, m := range ms {
		if m.gi != giID {
			continue
		}
		id, r := m.handle.GetUUID()
		if r != nvml.SUCCESS {
			return false, stepError(what, fmt.Sprintf("mig device %d: GetUUID", m.index), r)
		}
		if id == uuid {
			return true, nil
		}
	}
	return false, nil
}
