package usage

import (
	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
)

// Holder is a container the kubelet has assigned a device: the whole GPU
// or MIG device, or time-slicing replicas of it ("<uuid>::<n>", several
// containers holding replicas of one device share it), with what its
// processes used of the device in the cycle.
type Holder struct {
	Pod, Namespace, Container string
	// PodUID is the pod's UID when known (see Assignment.PodUID).
	PodUID string
	// IDs are the device IDs assigned to the container, as the kubelet
	// assigned them (a replica keeps its "::<n>"), in List order.
	IDs []string
	// Use is what the container's processes used of the device this
	// cycle; nil when that is not known (see Use).
	Use *Use
}

// Use is what one container's processes used of one device in one cycle:
// NVML's per-process readings (nvmlowner.Process) of the processes whose
// cgroup names the container's pod, summed. It is known only when every
// process NVML listed on the device was attributed: the lists were read,
// the kubelet answered, the agent sees the host's PIDs, and no process is
// of class unknown (each pod process's pod UID matched against the
// holders' UIDs from the device manager's checkpoint: the GPU process
// check's attribution, so only while that check runs). When two
// containers of one pod hold the same device, the kubelet does not say
// which of them a PID belongs to: neither has a Use. A field is nil when a
// process's reading is missing: its memory (NVML_VALUE_NOT_AVAILABLE), or
// its utilisation (not read on the GPU: MIG enabled, before Maxwell, a
// failed read; or a sample out of range).
type Use struct {
	// Processes counts the container's processes on the device.
	Processes int
	// MemoryBytes is the device memory they hold (usedGpuMemory).
	MemoryBytes *uint64
	// SMUtil, MemUtil, EncUtil and DecUtil are the sums of their
	// utilisation samples since the previous cycle, in percent of the
	// time (SM, frame-buffer memory, encoder, decoder).
	SMUtil, MemUtil, EncUtil, DecUtil *uint64
}

// holderKey is a container by namespace, pod and name.
type holderKey struct{ namespace, pod, container string }

// Holders returns the containers the kubelet assigned device id (a whole
// GPU, a MIG device, or any replica of a time-sliced one), once each, in
// List order, with each one's Use when the tracker worked it out this
// cycle. More than one holder means the device is shared.
func (a *Assignments) Holders(id string) []Holder {
	if a == nil {
		return nil
	}
	base := baseID(id)
	var out []Holder
	index := map[holderKey]int{}
	for _, as := range a.byBase[base] {
		k := holderKey{as.Namespace, as.Pod, as.Container}
		i, ok := index[k]
		if !ok {
			i = len(out)
			index[k] = i
			out = append(out, Holder{Pod: as.Pod, Namespace: as.Namespace, Container: as.Container, PodUID: as.PodUID})
			if u := a.uses[base][k]; u != nil {
				out[i].Use = u.clone()
			}
		}
		if out[i].PodUID == "" {
			out[i].PodUID = as.PodUID
		}
		out[i].IDs = append(out[i].IDs, as.DeviceID)
	}
	return out
}

// holderUses works out, for each judged device of the cycle, what each
// container holding it used: devices[i] was judged into verdicts[i], one
// verdict per process in order (judge). A device is left out (its holders
// get no Use) unless every process on it was attributed.
func holderUses(a *Assignments, devices []deviceUse, verdicts []deviceVerdict) map[string]map[holderKey]*Use {
	out := map[string]map[holderKey]*Use{}
	for i, d := range devices {
		dv := verdicts[i]
		if !dv.judged || len(dv.verdicts) < len(d.processes) {
			continue
		}
		// The containers holding the device (or, for a GPU, one of its
		// MIG devices when those are not served), by pod UID.
		uses := map[holderKey]*Use{}
		byUID := map[string][]holderKey{}
		for _, id := range d.assignIDs {
			for _, h := range a.Holders(id) {
				k := holderKey{h.Namespace, h.Pod, h.Container}
				if _, ok := uses[k]; ok {
					continue
				}
				uses[k] = newUse(d.utilRead)
				if h.PodUID != "" {
					byUID[h.PodUID] = append(byUID[h.PodUID], k)
				}
			}
		}
		if len(uses) == 0 {
			continue
		}
		complete := true
		for j, p := range d.processes {
			v := dv.verdicts[j]
			if v.Class == ClassUnknown || v.Process.PID != p.PID {
				complete = false
				break
			}
			if v.Class != ClassOwn {
				continue
			}
			ks := byUID[v.Process.Cgroup.PodUID]
			if len(ks) != 1 {
				// Two containers of the pod hold the device: which one
				// runs the process is not known.
				for _, k := range ks {
					uses[k] = nil
				}
				continue
			}
			if u := uses[ks[0]]; u != nil {
				u.add(p)
			}
		}
		if complete {
			out[d.ID] = uses
		}
	}
	return out
}

// clone is a deep copy of u: a Holder's Use is the caller's.
func (u *Use) clone() *Use {
	c := *u
	for _, p := range []**uint64{&c.MemoryBytes, &c.SMUtil, &c.MemUtil, &c.EncUtil, &c.DecUtil} {
		if *p != nil {
			v := **p
			*p = &v
		}
	}
	return &c
}

// newUse is the use of a container with no process yet: zero memory and,
// when the device's utilisation was read, zero utilisation.
func newUse(utilRead bool) *Use {
	u := &Use{MemoryBytes: new(uint64)}
	if utilRead {
		u.SMUtil, u.MemUtil, u.EncUtil, u.DecUtil = new(uint64), new(uint64), new(uint64), new(uint64)
	}
	return u
}

// add counts process p into u.
func (u *Use) add(p procUse) {
	u.Processes++
	if p.MemoryKnown && u.MemoryBytes != nil {
		*u.MemoryBytes += p.Memory
	} else {
		u.MemoryBytes = nil
	}
	for _, f := range []struct {
		sum **uint64
		v   nvmlowner.Value
	}{{&u.SMUtil, p.Util.SM}, {&u.MemUtil, p.Util.Memory}, {&u.EncUtil, p.Util.Encoder}, {&u.DecUtil, p.Util.Decoder}} {
		if *f.sum == nil {
			continue
		}
		if f.v.Status != nvmlowner.OK {
			*f.sum = nil
			continue
		}
		**f.sum += f.v.V
	}
}
