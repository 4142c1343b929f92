package nvmlowner

import (
	"context"
	"errors"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// PreflightSample is what the preflight (package preflight) reads from one
// GPU: what a node must show before it takes work and the sampler does not
// read every cycle. Values are NotSupported / NoPermission where the GPU
// does not give them ("no data", never a fault), as in Sample.
type PreflightSample struct {
	UUID string
	// Err is set when the GPU could not be read at all: its handle lookup
	// failed, NVML answered GPU_IS_LOST, or the reads did not finish
	// within the call timeout (errors.Is ErrTimeout). Values are then
	// Absent.
	Err error

	// PCIe link as trained (nvmlDeviceGetCurrPcieLinkGeneration/Width)
	// and at the maximum possible "with this device and system"
	// (nvmlDeviceGetMaxPcieLinkGeneration/Width). nvml.h: "For Fermi or
	// newer fully supported devices"; NOT_SUPPORTED "if PCIe link
	// information is not available".
	PCIeGen, PCIeWidth, PCIeMaxGen, PCIeMaxWidth Value
	// Persistence is nvmlDeviceGetPersistenceMode, 1 enabled ("For all
	// products. For Linux only.").
	Persistence Value
	// ECCCurrent and ECCPending are nvmlDeviceGetEccMode, 1 enabled; the
	// pending mode is the one after the next reboot. NOT_SUPPORTED on a GPU
	// without ECC ("Only applicable to devices with ECC").
	ECCCurrent, ECCPending Value
	// ClocksEventReasons is the mask of nvmlDeviceGetCurrentClocksEventReasons
	// (nvmlapi.ClocksEventReasons names its bits), read through the
	// deprecated nvmlDeviceGetCurrentClocksThrottleReasons on a driver
	// that lacks the new name (before R535).
	ClocksEventReasons Value
	// RetiredPending is nvmlDeviceGetRetiredPagesPendingStatus, 1 pending
	// (Kepler to Volta; Ampere and later answer NOT_SUPPORTED).
	RetiredPending Value
	// RemapPending and RemapFailure are nvmlDeviceGetRemappedRows'
	// isPending and failureOccurred, 1 set ("For Ampere or newer fully
	// supported devices", NOT_SUPPORTED "If MIG is enabled").
	RemapPending, RemapFailure Value
	// FabricState and FabricStatus are nvmlDeviceGetGpuFabricInfo's state
	// (nvml.GPU_FABRIC_STATE_*) and status (an nvml.Return): NVSwitch
	// systems, Hopper and later.
	FabricState, FabricStatus Value
	// NVLinks are the GPU's links that exist (nvmlDeviceGetNvLinkState did
	// not answer NOT_SUPPORTED / INVALID_ARGUMENT), by link number; Up is
	// 1 when the link is active. Empty on a GPU without NVLink.
	NVLinks []NVLinkState
}

// NVLinkState is one NVLink's state.
type NVLinkState struct {
	Link int
	Up   Value
}

// Lost reports whether the GPU is lost (fallen off the bus) or no longer
// known to NVML.
func (s *PreflightSample) Lost() bool {
	return errors.Is(s.Err, nvml.ERROR_GPU_IS_LOST) || errors.Is(s.Err, nvml.ERROR_NOT_FOUND)
}

// TimedOut reports whether the GPU did not answer within the call timeout.
func (s *PreflightSample) TimedOut() bool { return errors.Is(s.Err, ErrTimeout) }

// eventReasonsSymbol is the R535+ name of the clocks event reasons call.
const eventReasonsSymbol = "nvmlDeviceGetCurrentClocksEventReasons"

// hasEventReasons says the driver exports the clocks event reasons call
// (R535 and later). go-nvml links NVML lazily and exits the process on a
// call the driver lacks, so it is looked up before every use (a driver
// reload may bring an older one); without the library's answer the
// deprecated name, which every driver exports, is read. The answer comes
// back as the call's return, not through a variable the call sets: a
// lookup that outlives the call timeout still runs on the lane after Lib
// has returned.
func (o *Owner) hasEventReasons(ctx context.Context) bool {
	err := o.Lib(ctx, "LookupSymbol "+eventReasonsSymbol, func(lib Library) nvml.Return {
		if ext := lib.Extensions(); ext != nil && ext.LookupSymbol(eventReasonsSymbol) == nil {
			return nvml.SUCCESS
		}
		return nvml.ERROR_FUNCTION_NOT_FOUND
	})
	return err == nil
}

// ReadPreflight reads the preflight's values of every GPU in uuids, each
// on its own lane at the same time, so a GPU that hangs costs its own
// sample the call timeout and delays no other. Samples are in uuids'
// order.
func (o *Owner) ReadPreflight(ctx context.Context, uuids []string) []PreflightSample {
	eventReasons := o.hasEventReasons(ctx)
	out := make([]PreflightSample, len(uuids))
	var wg sync.WaitGroup
	for i, uuid := range uuids {
		out[i].UUID = uuid
		wg.Go(func() { o.readPreflightGPU(ctx, uuid, eventReasons, &out[i]) })
	}
	wg.Wait()
	return out
}

// readPreflightGPU reads one GPU on its lane into out. The read fills a
// sample of its own; out is written only if the read finished in time, so
// a late reader never races with the caller.
func (o *Owner) readPreflightGPU(ctx context.Context, uuid string, eventReasons bool, out *PreflightSample) {
	var (
		mu   sync.Mutex
		done *PreflightSample
	)
	err := o.Do(ctx, uuid, "preflight", func(dev Device) nvml.Return {
		r := &PreflightSample{UUID: uuid}
		ret := readPreflight(dev, r, eventReasons)
		mu.Lock()
		done = r
		mu.Unlock()
		return ret
	})
	mu.Lock()
	defer mu.Unlock()
	if err != nil {
		*out = PreflightSample{UUID: uuid, Err: err}
		return
	}
	*out = *done
}

// readPreflight reads every value of one GPU. It returns non-SUCCESS only
// when the GPU as a whole is gone (GPU_IS_LOST); a value that fails
// otherwise fails alone.
func readPreflight(dev Device, r *PreflightSample, eventReasons bool) nvml.Return {
	lost := false
	note := func(ret nvml.Return) nvml.Return {
		if ret == nvml.ERROR_GPU_IS_LOST {
			lost = true
		}
		return ret
	}
	integer := func(f func() (int, nvml.Return)) Value {
		v, ret := f()
		return valueOf(uint64(max(v, 0)), note(ret))
	}
	enabled := func(s nvml.EnableState, ret nvml.Return) Value {
		return valueOf(boolValue(s == nvml.FEATURE_ENABLED), note(ret))
	}
	r.PCIeGen = integer(dev.GetCurrPcieLinkGeneration)
	r.PCIeWidth = integer(dev.GetCurrPcieLinkWidth)
	r.PCIeMaxGen = integer(dev.GetMaxPcieLinkGeneration)
	r.PCIeMaxWidth = integer(dev.GetMaxPcieLinkWidth)
	r.Persistence = enabled(dev.GetPersistenceMode())
	cur, pending, ret := dev.GetEccMode()
	r.ECCCurrent, r.ECCPending = enabled(cur, ret), enabled(pending, ret)
	var mask uint64
	if eventReasons {
		mask, ret = dev.GetCurrentClocksEventReasons()
	} else {
		mask, ret = dev.GetCurrentClocksThrottleReasons()
	}
	r.ClocksEventReasons = valueOf(mask, note(ret))
	r.RetiredPending = enabled(dev.GetRetiredPagesPendingStatus())
	_, _, remapPending, remapFailed, ret := dev.GetRemappedRows()
	r.RemapPending, r.RemapFailure = valueOf(boolValue(remapPending), note(ret)), valueOf(boolValue(remapFailed), ret)
	// The v1 call, as the sampler (go-nvml's V handler wraps the real C
	// handle, which a simulated library cannot answer).
	fi, ret := dev.GetGpuFabricInfo()
	r.FabricState, r.FabricStatus = valueOf(uint64(fi.State), note(ret)), valueOf(uint64(fi.Status), ret)
	for l := range nvml.NVLINK_MAX_LINKS {
		state, ret := dev.GetNvLinkState(l)
		if ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_INVALID_ARGUMENT || ret == nvml.ERROR_FUNCTION_NOT_FOUND {
			if l == 0 && ret != nvml.ERROR_INVALID_ARGUMENT {
				// No NVLink on this GPU.
				break
			}
			continue
		}
		r.NVLinks = append(r.NVLinks, NVLinkState{Link: l, Up: enabled(state, ret)})
	}
	if lost {
		return nvml.ERROR_GPU_IS_LOST
	}
	return nvml.SUCCESS
}
