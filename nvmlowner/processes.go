package nvmlowner

import (
	"cmp"
	"fmt"
	"math"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// What nvmlProcessInfo_t holds when a value is missing (nvml.h):
//   - usedGpuMemory is NVML_VALUE_NOT_AVAILABLE, "(-1)" stored in an
//     unsigned long long, when the driver cannot tell a process's memory
//     (the header names WDDM; the simulator also answers it for processes
//     on MIG devices listed through their parent GPU, see sim/processes.go);
//   - gpuInstanceId and computeInstanceId are "set to 0xFFFFFFFF" unless
//     MIG is enabled.
const (
	memoryNotAvailable = math.MaxUint64
	noInstanceID       = math.MaxUint32
)

// readProcesses reads the processes holding a context on GPU dev into r:
// nvmlDeviceGetComputeRunningProcesses_v3 and
// nvmlDeviceGetGraphicsRunningProcesses_v3, two calls on the parent GPU
// (go-nvml's wrapper sizes the buffer: it retries with a larger one while
// NVML answers ERROR_INSUFFICIENT_SIZE). nvml.h: "In MIG mode, if device
// handle is provided, the API returns aggregate information, only if the
// caller has appropriate privileges", each process carrying its GPU and
// compute instance IDs; those name the MIG device among t.MIG. Without
// the privileges a MIG-enabled GPU answers NO_PERMISSION: no data.
//
// A process on both lists is one Process (Compute and Graphics): "The
// usedGpuMemory field returned is all of the memory used by the
// application" on each list, so its memory is counted once. A list that
// fails does not fail the sample (only GPU_IS_LOST does, through note):
// ProcessesRead then says Failed and Processes holds what the other list
// gave. Instance IDs that match no MIG target mean the layout changed since
// discovery: the read is Failed and a rediscovery is asked for.
func readProcesses(dev Device, t Target, r *Sample, note func(nvml.Return) nvml.Return) {
	compute, cret := dev.GetComputeRunningProcesses()
	note(cret)
	graphics, gret := dev.GetGraphicsRunningProcesses()
	note(gret)

	read := listsRead(cret, gret)
	if r.MIGChanged && len(compute)+len(graphics) > 0 {
		// The MIG handle indexes no longer hold the devices asked for:
		// instance IDs may name other devices now.
		read = Value{Status: Failed, Err: fmt.Errorf("processes: the mig layout changed since discovery")}
	}
	instances := make(map[[2]uint32]string, len(t.MIG))
	for _, m := range t.MIG {
		instances[[2]uint32{uint32(m.GPUInstance), uint32(m.ComputeInstance)}] = m.UUID
	}
	type key struct {
		pid uint32
		mig string
	}
	byKey := map[key]int{}
	var procs []Process
	add := func(infos []nvml.ProcessInfo, graphics bool) {
		for _, info := range infos {
			mig := ""
			if len(t.MIG) > 0 && info.GpuInstanceId != noInstanceID {
				var ok bool
				if mig, ok = instances[[2]uint32{info.GpuInstanceId, info.ComputeInstanceId}]; !ok {
					if read.Status == OK {
						read = Value{Status: Failed, Err: fmt.Errorf("process %d: gpu instance %d compute instance %d is no mig device sampled (the layout changed)",
							info.Pid, info.GpuInstanceId, info.ComputeInstanceId)}
					}
					r.MIGChanged = true
					continue
				}
			}
			mem := Value{V: info.UsedGpuMemory, Status: OK}
			if info.UsedGpuMemory == memoryNotAvailable {
				mem = Value{Status: NotSupported}
			}
			k := key{info.Pid, mig}
			i, seen := byKey[k]
			if !seen {
				byKey[k] = len(procs)
				procs = append(procs, Process{PID: info.Pid, MIG: mig, UsedMemory: mem})
				i = len(procs) - 1
			} else if mem.Status == OK && (procs[i].UsedMemory.Status != OK || mem.V > procs[i].UsedMemory.V) {
				procs[i].UsedMemory = mem
			}
			if graphics {
				procs[i].Graphics = true
			} else {
				procs[i].Compute = true
			}
		}
	}
	add(compute, false)
	add(graphics, true)
	slices.SortFunc(procs, func(a, b Process) int {
		return cmp.Or(cmp.Compare(a.MIG, b.MIG), cmp.Compare(a.PID, b.PID))
	})
	if read.Status == OK {
		read.V = uint64(len(procs))
	}
	r.Processes, r.ProcessesRead = procs, read
}

// listsRead is what the two list calls' returns say together. The compute
// list decides whether there is data at all; a device without graphics
// (NOT_SUPPORTED) has no graphics processes to miss, but a graphics list
// that fails or is refused leaves the picture incomplete.
func listsRead(compute, graphics nvml.Return) Value {
	c := valueOf(0, compute)
	if c.Status != OK {
		if g := valueOf(0, graphics); g.Status == Failed && c.Status != Failed {
			return Value{Status: Failed, Err: fmt.Errorf("graphics processes: %w", graphics)}
		}
		if c.Status == Failed {
			return Value{Status: Failed, Err: fmt.Errorf("compute processes: %w", compute)}
		}
		return c
	}
	switch g := valueOf(0, graphics); g.Status {
	case OK, NotSupported:
		return Value{Status: OK}
	case Failed:
		return Value{Status: Failed, Err: fmt.Errorf("graphics processes: %w", graphics)}
	default:
		return g
	}
}
