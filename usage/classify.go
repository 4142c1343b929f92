package usage

import (
	"fmt"
	"slices"
	"strings"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
)

// Class is what a process (or memory without one) on a device is.
type Class string

// Classes of use. Own is never flagged; zombie, leaked and foreign are
// findings once they have lasted the grace period; unknown is use that
// could not be judged (missing data: never a finding).
const (
	// ClassOwn is a process of a pod assigned the device.
	ClassOwn Class = "own"
	// ClassZombie is a process of a pod that is gone, or of the host,
	// holding a device no running pod is assigned.
	ClassZombie Class = "zombie"
	// ClassLeaked is device memory in use with no process at all.
	ClassLeaked Class = "leaked"
	// ClassForeign is a process of another pod, or of the host, on a
	// device assigned to a pod; or a running pod's process on a device
	// not assigned to it.
	ClassForeign Class = "foreign"
	// ClassUnknown is a process that could not be attributed this cycle.
	ClassUnknown Class = "unknown"
)

// findingClasses are the classes that are findings, in report order.
var findingClasses = []Class{ClassZombie, ClassLeaked, ClassForeign}

// attribution is what is known, this cycle, about who may use devices.
type attribution struct {
	// assignments are the kubelet's running pods' devices; nil when the
	// pod-resources List failed (then nothing is judged).
	assignments *Assignments
	// checkpointOK says the device manager's checkpoint was read, so
	// every assignment carries its pod UID.
	checkpointOK bool
	// running are the UIDs of pods the kubelet lists, as far as known:
	// from the checkpoint (pods holding devices) and the pod log
	// directories (every pod). runningComplete says every listed pod's
	// UID is among them, so a UID not in it is a pod that is gone.
	running         map[string]bool
	runningComplete bool
	// pids says whether NVML's PIDs can be looked up under the host
	// root (see HostPIDView); why says why not.
	pids    bool
	pidsWhy string
}

// deviceUse is one served device's use in one sample.
type deviceUse struct {
	// ID is the served device (a GPU UUID, or a MIG UUID when MIG
	// devices are served).
	ID string
	// assignIDs are the device IDs whose assignment makes a pod the
	// device's owner: the device itself and, for a GPU with MIG devices,
	// those too (a pod assigned a MIG device owns its processes on the
	// GPU).
	assignIDs []string
	// read says the processes were read (ProcessesRead OK); without it
	// nothing about the device is judged.
	read bool
	// utilRead says the processes' utilisation was read (ProcessUtilRead
	// OK): each procUse's Util holds it.
	utilRead bool
	// processes on the device, each with what /proc says about it.
	processes []procUse
	// memory is the device memory allocated (used minus what the driver
	// reserves), when known, for the leaked judgement.
	memory      uint64
	memoryKnown bool
}

// procUse is one NVML process with its /proc information.
type procUse struct {
	PID uint32
	// Memory is what NVML reports the process holds on the device.
	Memory      uint64
	MemoryKnown bool
	// Util is the process's utilisation of the GPU this cycle.
	Util nvmlowner.ProcessUtil
	// Proc is the process as /proc shows it; procErr says why it could
	// not be read.
	Proc    Process
	procErr error
}

// Verdict is the judgement of one process, or of memory without one.
type Verdict struct {
	Device string
	Class  Class
	// Process is the process (zero for leaked memory).
	Process Process
	// Memory is the memory held (for leaked: allocated on the device).
	Memory      uint64
	MemoryKnown bool
	// Owners are the containers the device is assigned to.
	Owners []Assignment
	// Why says how the class was reached (for logs and Events).
	Why string
	// KillSafe is set on a zombie whose pod is known to be gone (or
	// that is a host process): one the optional cleanup may kill.
	KillSafe bool
}

// deviceVerdict is everything judged about one device this cycle.
type deviceVerdict struct {
	ID string
	// judged says the device's data were complete enough to judge: a
	// finding is started or cleared only on a judged cycle.
	judged   bool
	verdicts []Verdict
}

// judge classifies every process on d, and d's memory, under a: one
// verdict per process, in d.processes' order, then the leaked memory's.
// It never flags from missing data: processes not read, the kubelet not
// answering, PIDs that cannot be looked up make the device unjudged (its
// processes ClassUnknown); a process that cannot be attributed alone is
// unknown.
func judge(d deviceUse, a attribution, leakedThreshold uint64) deviceVerdict {
	out := deviceVerdict{ID: d.ID}
	var owners []Assignment
	for _, id := range d.assignIDs {
		owners = append(owners, a.assignments.Of(id)...)
	}
	unknown := func(p procUse, why string) Verdict {
		return Verdict{Device: d.ID, Class: ClassUnknown, Process: p.Proc, Memory: p.Memory, MemoryKnown: p.MemoryKnown,
			Owners: owners, Why: why}
	}
	var why string
	switch {
	case !d.read:
		why = "NVML's process list was not read"
	case a.assignments == nil:
		why = "the kubelet's pod-resources List failed"
	case !a.pids:
		why = "NVML's PIDs cannot be looked up: " + a.pidsWhy
	}
	if why != "" {
		for _, p := range d.processes {
			out.verdicts = append(out.verdicts, unknown(p, why))
		}
		return out
	}
	out.judged = true
	for _, p := range d.processes {
		if p.procErr != nil {
			// Exited since NVML listed it, most likely.
			out.verdicts = append(out.verdicts, unknown(p, p.procErr.Error()))
			continue
		}
		v := classify(p, owners, a)
		v.Device, v.Process, v.Memory, v.MemoryKnown, v.Owners = d.ID, p.Proc, p.Memory, p.MemoryKnown, owners
		out.verdicts = append(out.verdicts, v)
	}
	if len(d.processes) == 0 && d.memoryKnown && d.memory >= leakedThreshold {
		out.verdicts = append(out.verdicts, Verdict{Device: d.ID, Class: ClassLeaked, Memory: d.memory, MemoryKnown: true,
			Owners: owners, Why: fmt.Sprintf("%s allocated and no process on the device", formatBytes(d.memory))})
	}
	return out
}

// classify judges one resolved process on a device assigned to owners.
// A process is its pod's own when any owner has the process's pod UID;
// another pod's process on an assigned device is foreign only when every
// owner's UID is known (else it may be an owner's: unknown).
func classify(p procUse, owners []Assignment, a attribution) Verdict {
	uid := p.Proc.Cgroup.PodUID
	assigned := len(owners) > 0
	var uidUnknown []Assignment
	for _, o := range owners {
		if uid != "" && o.PodUID == uid {
			return Verdict{Class: ClassOwn, Why: "a process of the pod assigned the device"}
		}
		if o.PodUID == "" {
			uidUnknown = append(uidUnknown, o)
		}
	}
	switch {
	case uid == "" && assigned:
		return Verdict{Class: ClassForeign, Why: "a host process on a device assigned to " + ownerNames(owners)}
	case uid == "":
		return Verdict{Class: ClassZombie, KillSafe: true, Why: "a host process (outside every pod) on a device no running pod is assigned"}
	case len(uidUnknown) > 0:
		return Verdict{Class: ClassUnknown, Why: ownerUIDUnknown(uidUnknown, a)}
	case assigned:
		return Verdict{Class: ClassForeign, Why: "a process of pod " + uid + " on a device assigned to " + ownerNames(owners)}
	case !a.checkpointOK:
		// Without the checkpoint the pods holding device-plugin devices
		// may not all be known to run: this process's pod may be one.
		return Verdict{Class: ClassUnknown, Why: "the kubelet's device checkpoint is unreadable: the device's pod UID is unknown"}
	case a.running[uid]:
		return Verdict{Class: ClassForeign, Why: "a process of running pod " + uid + " on a device not assigned to it"}
	case a.runningComplete:
		return Verdict{Class: ClassZombie, KillSafe: true, Why: "a process of pod " + uid + ", which the kubelet no longer runs, on a device no running pod is assigned"}
	}
	return Verdict{Class: ClassZombie, Why: "a process of pod " + uid + ", which is not among the pods whose UID is known to run (the pod log directories are not readable), " +
		"on a device no running pod is assigned; not killed: the pod may still run without a device assigned"}
}

// ownerUIDUnknown says why owners' pod UIDs are not known.
func ownerUIDUnknown(owners []Assignment, a attribution) string {
	var dp, viaDRA []Assignment
	for _, o := range owners {
		if o.Claim != "" {
			viaDRA = append(viaDRA, o)
		} else {
			dp = append(dp, o)
		}
	}
	var why []string
	switch {
	case len(dp) > 0 && !a.checkpointOK:
		why = append(why, "the kubelet's device checkpoint is unreadable: the device's pod UID is unknown")
	case len(dp) > 0:
		why = append(why, "the checkpoint does not (yet) hold the assignment to "+ownerNames(dp))
	}
	if len(viaDRA) > 0 {
		why = append(why, "the UID of "+ownerNames(viaDRA)+", assigned the device through DRA, is unknown: "+
			"not one pod log directory names the pod")
	}
	return strings.Join(why, "; ")
}

// ownerNames lists owners as namespace/pod (container), once each.
func ownerNames(owners []Assignment) string {
	var names []string
	for _, o := range owners {
		n := o.Namespace + "/" + o.Pod + " (" + o.Container + ")"
		if !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	return strings.Join(names, ", ")
}

// formatBytes is a byte count as people read it (MiB, GiB).
func formatBytes(b uint64) string {
	const mib, gib = 1 << 20, 1 << 30
	if b >= gib {
		return fmt.Sprintf("%.1f GiB", float64(b)/gib)
	}
	return fmt.Sprintf("%d MiB", b/mib)
}
