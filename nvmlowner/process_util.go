package nvmlowner

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// readProcessUtil reads, in one call, the utilisation of the processes
// already in r (readProcesses) and returns the lastSeenTimeStamp for the
// GPU's next read. nvml.h nvmlDeviceGetProcessUtilization:
//   - "For Maxwell or newer fully supported devices", and "On MIG-enabled
//     GPUs, querying process utilization is not currently supported":
//     NOT_SUPPORTED is no data.
//   - "One utilization sample structure is returned per process running,
//     that had some non-zero utilization during the last sample period";
//     "If no valid sample entries are found since the lastSeenTimeStamp,
//     NVML_ERROR_NOT_FOUND is returned": a listed process without a
//     sample was idle, and NOT_FOUND means every one was.
//   - lastSeenTimeStamp is "the CPU timestamp in microseconds at which
//     utilization samples were last read": lastSeen is the newest sample
//     timestamp of the GPU's last read (0 at first: "all the samples
//     maintained by the driver's internal sample buffer"), so each read
//     covers the time since the one before. nvtop (issue #91) found a read
//     without it averages over the driver's whole buffer and lags.
//
// It is asked only of a GPU whose process lists were read and name a
// process (nvtop does the same): an idle GPU costs no call, and a sample
// is kept only for a listed process. Real drivers also return samples of
// processes no longer running, with timestamps older than asked for or
// values over 100% (nvtop issue #110, whose filter this follows): those
// are dropped, and a listed process whose only sample is out of range has
// a Failed utilisation rather than a made-up 0. Among a process's valid
// samples the newest counts. go-nvml sizes the buffer with one call and
// fills it with a second; a process that starts in between makes the fill
// answer INSUFFICIENT_SIZE, retried once.
func readProcessUtil(dev Device, r *Sample, lastSeen uint64, note func(nvml.Return) nvml.Return) uint64 {
	r.ProcessUtilRead = Value{}
	if len(r.Processes) == 0 || (r.ProcessesRead.Status != OK && r.ProcessesRead.Status != Failed) {
		return lastSeen
	}
	samples, ret := dev.GetProcessUtilization(lastSeen)
	if ret == nvml.ERROR_INSUFFICIENT_SIZE {
		samples, ret = dev.GetProcessUtilization(lastSeen)
	}
	note(ret)
	switch ret {
	case nvml.SUCCESS:
	case nvml.ERROR_NOT_FOUND:
		samples = nil
	default:
		r.ProcessUtilRead = valueOf(0, ret)
		if r.ProcessUtilRead.Status == Failed {
			r.ProcessUtilRead.Err = fmt.Errorf("process utilization: %w", ret)
		}
		return lastSeen
	}
	listed := make(map[uint32]bool, len(r.Processes))
	for _, p := range r.Processes {
		listed[p.PID] = true
	}
	newest := lastSeen
	best := map[uint32]nvml.ProcessUtilizationSample{}
	bad := map[uint32]nvml.ProcessUtilizationSample{}
	for _, s := range samples {
		if s.TimeStamp <= lastSeen || !listed[s.Pid] {
			continue
		}
		if s.SmUtil > 100 || s.MemUtil > 100 || s.EncUtil > 100 || s.DecUtil > 100 {
			bad[s.Pid] = s
			continue
		}
		if b, ok := best[s.Pid]; !ok || s.TimeStamp > b.TimeStamp {
			best[s.Pid] = s
		}
		newest = max(newest, s.TimeStamp)
	}
	for i := range r.Processes {
		p := &r.Processes[i]
		s, ok := best[p.PID]
		if b, isBad := bad[p.PID]; !ok && isBad {
			f := Value{Status: Failed, Err: fmt.Errorf("process %d utilization sample out of range: sm %d%%, memory %d%%, encoder %d%%, decoder %d%%",
				p.PID, b.SmUtil, b.MemUtil, b.EncUtil, b.DecUtil)}
			p.Util = ProcessUtil{SM: f, Memory: f, Encoder: f, Decoder: f}
			continue
		}
		p.Util = ProcessUtil{
			SM:      Value{V: uint64(s.SmUtil), Status: OK},
			Memory:  Value{V: uint64(s.MemUtil), Status: OK},
			Encoder: Value{V: uint64(s.EncUtil), Status: OK},
			Decoder: Value{V: uint64(s.DecUtil), Status: OK},
		}
	}
	r.ProcessUtilRead = Value{V: uint64(len(best)), Status: OK}
	return newest
}

// readMIGProcessMemory fills in the memory of processes on MIG devices
// that the parent GPU's lists gave as NVML_VALUE_NOT_AVAILABLE, from the
// MIG device's own compute list: nvml.h, "In MIG mode, if device handle is
// provided, the API returns aggregate information ... Per-instance
// information can be queried by using specific MIG device handles". One
// call per MIG device with such a process (MIG devices have no graphics
// contexts); a list that fails leaves the memory unknown.
func readMIGProcessMemory(migs map[string]Device, r *Sample, note func(nvml.Return) nvml.Return) {
	want := map[string]bool{}
	for _, p := range r.Processes {
		if p.MIG != "" && p.UsedMemory.Status != OK && migs[p.MIG] != nil {
			want[p.MIG] = true
		}
	}
	for i := 0; i < len(r.Processes); {
		uuid := r.Processes[i].MIG
		j := i
		for j < len(r.Processes) && r.Processes[j].MIG == uuid {
			j++
		}
		if want[uuid] {
			infos, ret := migs[uuid].GetComputeRunningProcesses()
			if note(ret) == nvml.SUCCESS {
				mem := make(map[uint32]uint64, len(infos))
				for _, info := range infos {
					if info.UsedGpuMemory != memoryNotAvailable {
						mem[info.Pid] = info.UsedGpuMemory
					}
				}
				for k := i; k < j; k++ {
					if m, ok := mem[r.Processes[k].PID]; ok && r.Processes[k].UsedMemory.Status != OK {
						r.Processes[k].UsedMemory = Value{V: m, Status: OK}
					}
				}
			}
		}
		i = j
	}
}
