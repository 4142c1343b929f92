package sim

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Per-process utilisation, as nvmlDeviceGetProcessUtilization answers it
// (nvml.h; the only per-process utilisation call go-nvml v0.13.3-1 can
// drive with a lastSeenTimeStamp):
//   - "For Maxwell or newer fully supported devices"; older GPUs answer
//     NOT_SUPPORTED, and so does a GPU with MIG enabled ("On MIG-enabled
//     GPUs, querying process utilization is not currently supported") and
//     a MIG device handle.
//   - "One utilization sample structure is returned per process running,
//     that had some non-zero utilization during the last sample period",
//     with "the CPU timestamp at which the samples were recorded" in
//     microseconds (since the Unix epoch: nvtop issue #110 shows real
//     samples stamped 1623157629331552 on 2021-06-08).
//   - lastSeenTimeStamp: "Return only samples with timestamp greater than
//     lastSeenTimeStamp"; 0 reads "all the samples maintained by the
//     driver's internal sample buffer". nvtop (PR #91) and nvitop (issue
//     #83, PR #85) found the values are then the process's utilisation
//     over that whole period, so the simulator answers each process's
//     time-weighted average over the window: from lastSeenTimeStamp (or
//     the oldest buffered sample) to now, within the process's lifetime.
//   - "If no valid sample entries are found since the lastSeenTimeStamp,
//     NVML_ERROR_NOT_FOUND is returned" (an idle GPU answers NotFound:
//     nvml-wrapper issue #56).
//
// How long the driver buffers samples nvml.h does not say; the simulator
// keeps utilBuffer. A process's utilisation is what its spec (or the last
// SetProcessUtilization) says; the simulator does not derive the GPU's own
// utilisation (GetUtilizationRates, counters.go) from it.

// utilBuffer is how far back a read with lastSeenTimeStamp 0 reaches.
const utilBuffer = 20 * time.Second

// ProcessUtilization is what a simulated process keeps busy on its GPU, in
// percent of the sample period, as nvmlProcessUtilizationSample_t names
// them: SM (3D/compute), frame-buffer memory, video encoder and decoder.
// NVML reports it for processes on whole GPUs only.
type ProcessUtilization struct {
	SMUtil  uint32 `json:"smUtil,omitempty"`
	MemUtil uint32 `json:"memUtil,omitempty"`
	EncUtil uint32 `json:"encUtil,omitempty"`
	DecUtil uint32 `json:"decUtil,omitempty"`
}

// validate refuses a percentage over 100, naming the field.
func (u ProcessUtilization) validate() error {
	for _, f := range []struct {
		name string
		v    uint32
	}{{"smUtil", u.SMUtil}, {"memUtil", u.MemUtil}, {"encUtil", u.EncUtil}, {"decUtil", u.DecUtil}} {
		if f.v > 100 {
			return fmt.Errorf("%s: %d: a percentage, at most 100", f.name, f.v)
		}
	}
	return nil
}

func (u ProcessUtilization) values() [4]uint64 {
	return [4]uint64{uint64(u.SMUtil), uint64(u.MemUtil), uint64(u.EncUtil), uint64(u.DecUtil)}
}

// utilPoint is a process's utilisation from at on.
type utilPoint struct {
	at   time.Time
	util ProcessUtilization
}

// SetUtilizationClock makes now the clock that stamps utilisation samples
// and utilisation changes (time.Now by default), so a test can move time
// between reads. Call it before starting processes.
func (n *Node) SetUtilizationClock(now func() time.Time) {
	n.procs.mu.Lock()
	defer n.procs.mu.Unlock()
	n.procs.now = now
}

// SetProcessUtilization changes what running process pid keeps busy from
// now on. Errors name the field at fault; a process that is not running is
// ESRCH.
func (n *Node) SetProcessUtilization(pid uint32, u ProcessUtilization) error {
	if err := u.validate(); err != nil {
		return fmt.Errorf("process %d utilization: %w", pid, err)
	}
	ps := n.procs
	ps.mu.Lock()
	defer ps.mu.Unlock()
	p, ok := ps.procs[pid]
	if !ok {
		return errNoProcess("set utilization of", pid)
	}
	p.ProcessUtilization = u
	now := ps.now()
	// Points older than the buffer are never read again; keep the last
	// of them, which holds from the buffer's start.
	keep := 0
	for keep+1 < len(p.history) && !p.history[keep+1].at.After(now.Add(-utilBuffer)) {
		keep++
	}
	p.history = append(p.history[keep:], utilPoint{at: now, util: u})
	return nil
}

// processUtilization answers nvmlDeviceGetProcessUtilization on GPU gpu as
// go-nvml's Device.GetProcessUtilization drives it (see above).
func (n *Node) processUtilization(gpu int, lastSeen uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
	n.mu.RLock()
	mig := n.gpus[gpu].migEnabled
	n.mu.RUnlock()
	if mig {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	samples := n.procs.utilSamples(gpu, lastSeen)
	return goNVMLProcessUtilization(func(buf []nvml.ProcessUtilizationSample, count *uint32) nvml.Return {
		return processUtilizationCall(samples, buf, count)
	})
}

// utilSamples is the sample of every process on GPU gpu (not on a MIG
// device) busy in the window after lastSeen, in PID order.
func (ps *procState) utilSamples(gpu int, lastSeen uint64) []nvml.ProcessUtilizationSample {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	now := ps.now()
	end := now.UnixMicro()
	from := max(int64(lastSeen), now.Add(-utilBuffer).UnixMicro())
	var out []nvml.ProcessUtilizationSample
	for _, p := range ps.procs {
		if p.GPU != gpu || p.MIG != "" {
			continue
		}
		avg, ok := averageUtil(p.history, max(from, p.started.UnixMicro()), end)
		if !ok || avg == [4]uint64{} {
			continue
		}
		out = append(out, nvml.ProcessUtilizationSample{Pid: p.PID, TimeStamp: uint64(end),
			SmUtil: uint32(avg[0]), MemUtil: uint32(avg[1]), EncUtil: uint32(avg[2]), DecUtil: uint32(avg[3])})
	}
	slices.SortFunc(out, func(a, b nvml.ProcessUtilizationSample) int { return cmp.Compare(a.Pid, b.Pid) })
	return out
}

// averageUtil is the time-weighted average (floored) of the utilisation
// history h over the microseconds (from, to]; false for an empty window.
func averageUtil(h []utilPoint, from, to int64) ([4]uint64, bool) {
	if to <= from || len(h) == 0 {
		return [4]uint64{}, false
	}
	var sum [4]uint64
	for i, pt := range h {
		start := max(pt.at.UnixMicro(), from)
		end := to
		if i+1 < len(h) {
			end = min(h[i+1].at.UnixMicro(), to)
		}
		if end <= start {
			continue
		}
		v := pt.util.values()
		for k := range sum {
			sum[k] += v[k] * uint64(end-start)
		}
	}
	var avg [4]uint64
	for k := range avg {
		avg[k] = sum[k] / uint64(to-from)
	}
	return avg, true
}

// processUtilizationCall answers the C call nvmlDeviceGetProcessUtilization
// with the samples all for a caller whose buffer holds *count entries:
// NOT_FOUND when there is no sample; INSUFFICIENT_SIZE with the count
// needed when buf is NULL or too small (nvml.h: "first determine the size
// of buffer required to hold the samples by invoking the function with
// utilization set to NULL"; go-nvml and nvtop both expect this answer);
// else SUCCESS with *count "the number of process utilization sample
// structures that were actually written".
func processUtilizationCall(all, buf []nvml.ProcessUtilizationSample, count *uint32) nvml.Return {
	if count == nil {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	if len(all) == 0 {
		return nvml.ERROR_NOT_FOUND
	}
	if buf == nil || *count < uint32(len(all)) || len(buf) < len(all) {
		*count = uint32(len(all))
		return nvml.ERROR_INSUFFICIENT_SIZE
	}
	copy(buf, all)
	*count = uint32(len(all))
	return nvml.SUCCESS
}

// goNVMLProcessUtilization drives call as go-nvml v0.13.3-1's
// nvmlDevice.GetProcessUtilization drives the C call: once with a NULL
// buffer, returning any answer other than INSUFFICIENT_SIZE as it is (an
// empty slice and INSUFFICIENT_SIZE for a count of 0), then once with a
// buffer of the count asked for.
func goNVMLProcessUtilization(call func(buf []nvml.ProcessUtilizationSample, count *uint32) nvml.Return) ([]nvml.ProcessUtilizationSample, nvml.Return) {
	var count uint32
	ret := call(nil, &count)
	if ret != nvml.ERROR_INSUFFICIENT_SIZE {
		return nil, ret
	}
	if count == 0 {
		return []nvml.ProcessUtilizationSample{}, ret
	}
	buf := make([]nvml.ProcessUtilizationSample, count)
	ret = call(buf, &count)
	return buf[:count], ret
}
