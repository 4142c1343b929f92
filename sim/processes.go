package sim

import (
	"errors"
	"fmt"
	"math"
	"path"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// Simulated processes on the GPUs: what NVML lists as the processes with a
// compute or graphics context on a GPU or MIG device, the device memory
// they hold (with memory leaked by no process at all), and their /proc
// entries under the host root (procfs.go) with cgroups in the formats the
// kubelet and the container runtimes produce (cgroup.go). Processes live
// in the simulator's memory: a new Node in the same host root starts with
// none and removes the /proc entries an earlier one left.

// FirstPID is the first PID the simulator hands out; PIDs count up from it
// and are never reused. It stands clear of the PIDs a default kernel hands
// out (pid_max 32768, or 4194304 where systemd raises it: a real PID can
// reach it there, which matters only to code that would signal a
// simulated PID on the real host; the simulator's signals go through
// SignalProcess).
const FirstPID = 3000000

// Kinds of simulated process.
const (
	ProcessPod  = "pod"  // a container's process of a pod (running, or long gone)
	ProcessHost = "host" // a process outside any pod: a systemd service, a login session
)

// Defaults of a ProcessSpec.
const (
	defaultComm       = "python3"
	defaultHostCgroup = "/user.slice/user-1000.slice/session-1.scope"
)

// memoryNotAvailable is nvml.h's NVML_VALUE_NOT_AVAILABLE ("(-1)") as
// nvmlProcessInfo_t's unsigned long long usedGpuMemory holds it.
const memoryNotAvailable = math.MaxUint64

// ProcessSpec describes a simulated process to start. GPU, MemoryMiB and
// Kind are required; the rest has defaults.
type ProcessSpec struct {
	// GPU is the index of the GPU in the order of the spec the node was
	// built from (as Fault.GPU).
	GPU int `json:"gpu"`
	// MIG is the UUID of the MIG device of that GPU the process runs on;
	// required when the GPU has MIG enabled, refused otherwise.
	MIG string `json:"mig,omitempty"`
	// MemoryMiB is the device memory the process holds; at most what the
	// device has free.
	MemoryMiB uint64 `json:"memoryMiB"`
	// Compute and Graphics say which contexts the process has, i.e. which
	// of NVML's lists it is on; neither means compute only. MIG devices
	// have no graphics.
	Compute  bool `json:"compute,omitempty"`
	Graphics bool `json:"graphics,omitempty"`
	// Kind is ProcessPod or ProcessHost.
	Kind string `json:"kind"`
	// PodUID is the UID of the pod (metadata.uid; a static pod's 32 hex
	// digits too); empty: a UID of a pod that no longer exists, derived
	// from the PID. Pod only.
	PodUID string `json:"podUID,omitempty"`
	// ContainerID is the container's 64-hex-digit ID, bare or as the pod
	// status shows it ("containerd://...", "cri-o://..."); empty: derived.
	// Pod only.
	ContainerID string `json:"containerID,omitempty"`
	// QOS is the pod's QoS class: guaranteed, burstable (default) or
	// besteffort (status.qosClass spellings accepted). Pod only.
	QOS string `json:"qos,omitempty"`
	// CgroupVersion is v2 (default), v1 or hybrid.
	CgroupVersion string `json:"cgroupVersion,omitempty"`
	// CgroupDriver is the kubelet's and runtime's cgroup driver: systemd
	// (default) or cgroupfs. Pod only.
	CgroupDriver string `json:"cgroupDriver,omitempty"`
	// Runtime is containerd (default) or crio. Pod only.
	Runtime string `json:"runtime,omitempty"`
	// OCIRuntime is runc (default) or crun. Pod only.
	OCIRuntime string `json:"ociRuntime,omitempty"`
	// HostCgroup is the cgroup of a host process, e.g.
	// "/system.slice/train.service"; default a login session
	// (/user.slice/user-1000.slice/session-1.scope). Host only.
	HostCgroup string `json:"hostCgroup,omitempty"`
	// Comm is the process name (/proc/<pid>/comm, at most 15 bytes);
	// default python3.
	Comm string `json:"comm,omitempty"`
	// Uninterruptible: the process is in uninterruptible sleep (state D)
	// and no signal ends it; StopProcess still does (the sleep ended).
	Uninterruptible bool `json:"uninterruptible,omitempty"`
	// IgnoreTerm: the process ignores SIGTERM (and ends on SIGKILL).
	IgnoreTerm bool `json:"ignoreTerm,omitempty"`
	// ProcessUtilization is what the process keeps busy from its start
	// (process_util.go); SetProcessUtilization changes it. Default idle.
	ProcessUtilization
}

// Process is a running simulated process: its spec with every default
// filled in, and what the simulator gave it.
type Process struct {
	PID uint32 `json:"pid"`
	ProcessSpec
	// Cgroup is the process's cgroup path (the unified hierarchy's, or
	// name=systemd's under v1); CgroupFile is its /proc/<pid>/cgroup.
	Cgroup     string `json:"cgroup"`
	CgroupFile string `json:"cgroupFile"`
	// StartTime is /proc/<pid>/stat field 22: clock ticks since boot.
	StartTime uint64 `json:"startTime"`
	// State is /proc/<pid>/stat field 3: S, or D when uninterruptible.
	State string `json:"state"`

	// started is when the process started; history is its utilisation
	// since then (at most utilBuffer back), oldest first. Guarded by
	// procState.mu.
	started time.Time
	history []utilPoint
}

// procState is the simulated processes and leaked memory of a node. It has
// its own lock; the NVML answers read it under that lock alone. Control
// actions that change it hold Node.layoutMu as well, which keeps them
// serialised with MIG layout changes (lock order: layoutMu, procState.mu,
// Node.mu).
type procState struct {
	mu    sync.Mutex
	next  uint32
	procs map[uint32]*Process
	// leaked is device memory held by no process, in bytes, by GPU and
	// MIG device ("" for the whole GPU).
	leaked map[leakKey]uint64
	// boot is when the simulated host booted (StartTime counts from it);
	// lastStart keeps start times increasing.
	boot      time.Time
	lastStart uint64
	// now is the clock of utilisation samples (time.Now; tests set it).
	now func() time.Time
}

type leakKey struct {
	gpu int
	mig string
}

// bootUptime is how long the simulated host had been up when the node was
// created: start times look like those of a host up for a day.
const bootUptime = 24 * time.Hour

// installProcesses makes every GPU's and MIG device's process lists and
// memory answer from the node's processes and leaked memory, and removes
// the /proc entries an earlier simulator left in the host root.
func (n *Node) installProcesses() error {
	ps := &procState{next: FirstPID, procs: map[uint32]*Process{}, leaked: map[leakKey]uint64{}, boot: time.Now().Add(-bootUptime),
		now: time.Now}
	n.procs = ps
	for i, d := range n.devices {
		g := n.gpus[i]
		total := d.MemoryInfo.Total
		// nvml.h nvmlMemory_v2_t: reserved is "Device memory (in bytes)
		// reserved for system use (driver or firmware)"; simulated as
		// 1/256 of the memory.
		reserved := total >> 8
		d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
			// nvml.h nvmlMemory_t: used is the "Sum of Reserved and
			// Allocated device memory".
			used := min(reserved+ps.allocated(i, nil), total)
			return nvml.Memory{Total: total, Used: used, Free: total - used}, nvml.SUCCESS
		}
		d.GetMemoryInfo_v2Func = func() (nvml.Memory_v2, nvml.Return) {
			// nvml.h nvmlMemory_v2_t: used is "Allocated device memory";
			// nvmlDeviceGetMemoryInfo_v2 "accounts separately for reserved
			// memory".
			used := min(ps.allocated(i, nil), total-reserved)
			return nvml.Memory_v2{Version: nvml.STRUCT_VERSION(nvml.Memory_v2{}, 2), Total: total,
				Reserved: reserved, Used: used, Free: total - reserved - used}, nvml.SUCCESS
		}
		migEnabled := func() bool {
			n.mu.RLock()
			defer n.mu.RUnlock()
			return g.migEnabled && len(g.mig) > 0
		}
		instances := func() map[string][2]uint32 {
			n.mu.RLock()
			defer n.mu.RUnlock()
			out := make(map[string][2]uint32, len(g.mig))
			for _, m := range g.mig {
				out[m.info.UUID] = [2]uint32{uint32(m.info.GPUInstance), uint32(m.info.ComputeInstance)}
			}
			return out
		}
		list := func(graphics bool) func() ([]nvml.ProcessInfo, nvml.Return) {
			return func() ([]nvml.ProcessInfo, nvml.Return) {
				// nvml.h: "In MIG mode, if device handle is provided, the
				// API returns aggregate information" with each process's
				// GPU and compute instance IDs (nvmlProcessInfo_t: "If
				// MIG is enabled, stores a valid GPU instance ID",
				// 0xFFFFFFFF otherwise). Per-process memory is the
				// per-instance information that "can be queried by using
				// specific MIG device handles": through the parent the
				// simulator reports it NVML_VALUE_NOT_AVAILABLE, so the
				// agent must cope with an unknown process memory.
				var ids map[string][2]uint32
				if migEnabled() {
					ids = instances()
				}
				all := ps.infos(func(p *Process) (nvml.ProcessInfo, bool) {
					if p.GPU != i || (graphics && !p.Graphics) || (!graphics && !p.Compute) {
						return nvml.ProcessInfo{}, false
					}
					info := nvml.ProcessInfo{Pid: p.PID, UsedGpuMemory: p.MemoryMiB << 20, GpuInstanceId: noInstance, ComputeInstanceId: noInstance}
					if p.MIG != "" {
						id, ok := ids[p.MIG]
						if !ok {
							return nvml.ProcessInfo{}, false
						}
						info.GpuInstanceId, info.ComputeInstanceId = id[0], id[1]
						info.UsedGpuMemory = memoryNotAvailable
					}
					return info, true
				})
				return goNVMLList(func(count *uint32, infos []nvml.ProcessInfo) nvml.Return {
					return runningProcesses(all, count, infos)
				})
			}
		}
		d.GetComputeRunningProcessesFunc = list(false)
		d.GetGraphicsRunningProcessesFunc = list(true)
		d.GetProcessUtilizationFunc = func(lastSeen uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
			return n.processUtilization(i, lastSeen)
		}
	}
	// MIG devices are built after the install hooks (New), so the hook
	// reaches the initial layout too.
	n.addMIGHook(n.installMIGProcesses)
	if err := n.removeStaleProcEntries(); err != nil {
		return fmt.Errorf("stale simulated processes under %s: %w", n.procDir(), err)
	}
	return nil
}

// installMIGProcesses answers MIG device d's memory and process lists from
// the processes on it: per-instance information, with each process's
// memory (nvml.h: "Per-instance information can be queried by using
// specific MIG device handles"). A MIG device has no graphics (MIG
// supports no graphics APIs): its graphics list is empty.
func (n *Node) installMIGProcesses(gpu int, d *mock.Device) {
	ps := n.procs
	uuid, _ := d.GetUUIDFunc()
	gi, _ := d.GetGpuInstanceIdFunc()
	ci, _ := d.GetComputeInstanceIdFunc()
	attrs, _ := d.GetAttributesFunc()
	total := attrs.MemorySizeMB << 20
	d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
		used := min(ps.allocated(gpu, &uuid), total)
		return nvml.Memory{Total: total, Used: used, Free: total - used}, nvml.SUCCESS
	}
	d.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		all := ps.infos(func(p *Process) (nvml.ProcessInfo, bool) {
			if p.GPU != gpu || p.MIG != uuid || !p.Compute {
				return nvml.ProcessInfo{}, false
			}
			return nvml.ProcessInfo{Pid: p.PID, UsedGpuMemory: p.MemoryMiB << 20, GpuInstanceId: uint32(gi), ComputeInstanceId: uint32(ci)}, true
		})
		return goNVMLList(func(count *uint32, infos []nvml.ProcessInfo) nvml.Return {
			return runningProcesses(all, count, infos)
		})
	}
	d.GetGraphicsRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		return goNVMLList(func(count *uint32, infos []nvml.ProcessInfo) nvml.Return {
			return runningProcesses(nil, count, infos)
		})
	}
}

// runningProcesses answers as nvmlDeviceGetComputeRunningProcesses_v3 and
// nvmlDeviceGetGraphicsRunningProcesses_v3 do with the processes all, for
// a caller whose buffer infos holds *count entries (nvml.h):
//   - "call this function with *infoCount = 0. The return code will be
//     NVML_ERROR_INSUFFICIENT_SIZE, or NVML_SUCCESS if none are running.
//     For this call infos is allowed to be NULL";
//   - INSUFFICIENT_SIZE "if infoCount indicates that the infos array is
//     too small; infoCount will contain minimal amount of space necessary
//     for the call to complete";
//   - INVALID_ARGUMENT "if ... either of infoCount or infos is NULL";
//   - SUCCESS "if infoCount and infos have been populated", *count being
//     "the number of returned elements".
func runningProcesses(all []nvml.ProcessInfo, count *uint32, infos []nvml.ProcessInfo) nvml.Return {
	if count == nil {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	need := uint32(len(all))
	if *count < need {
		*count = need
		return nvml.ERROR_INSUFFICIENT_SIZE
	}
	if need > 0 && (infos == nil || uint32(len(infos)) < need) {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	copy(infos, all)
	*count = need
	return nvml.SUCCESS
}

// goNVMLList calls list as go-nvml v0.13.3-1's deviceGetComputeRunningProcesses_v3
// (and the graphics one) drive the C call: a buffer of one entry, doubled
// after every ERROR_INSUFFICIENT_SIZE (which set the count to what was
// needed), the first other answer returned.
func goNVMLList(list func(count *uint32, infos []nvml.ProcessInfo) nvml.Return) ([]nvml.ProcessInfo, nvml.Return) {
	var count uint32 = 1
	for {
		infos := make([]nvml.ProcessInfo, count)
		ret := list(&count, infos)
		if ret == nvml.SUCCESS {
			return infos[:count], ret
		}
		if ret != nvml.ERROR_INSUFFICIENT_SIZE {
			return nil, ret
		}
		count *= 2
	}
}

// infos lists, in PID order, what f makes of each process it selects.
func (ps *procState) infos(f func(p *Process) (nvml.ProcessInfo, bool)) []nvml.ProcessInfo {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	var out []nvml.ProcessInfo
	for _, p := range ps.procs {
		if info, ok := f(p); ok {
			out = append(out, info)
		}
	}
	slices.SortFunc(out, func(a, b nvml.ProcessInfo) int { return int(a.Pid) - int(b.Pid) })
	return out
}

// allocated is the memory (bytes) held on GPU gpu by processes and leaks:
// all of it (mig nil) or that of one MIG device.
func (ps *procState) allocated(gpu int, mig *string) uint64 {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return ps.allocatedLocked(gpu, mig)
}

func (ps *procState) allocatedLocked(gpu int, mig *string) uint64 {
	var sum uint64
	for _, p := range ps.procs {
		if p.GPU == gpu && (mig == nil || p.MIG == *mig) {
			sum += p.MemoryMiB << 20
		}
	}
	for k, b := range ps.leaked {
		if k.gpu == gpu && (mig == nil || k.mig == *mig) {
			sum += b
		}
	}
	return sum
}

// onGPULocked lists the PIDs on GPU gpu. Caller holds ps.mu.
func (ps *procState) onGPULocked(gpu int) []uint32 {
	var pids []uint32
	for pid, p := range ps.procs {
		if p.GPU == gpu {
			pids = append(pids, pid)
		}
	}
	slices.Sort(pids)
	return pids
}

// memDevice is where a process or a leak sits: GPU gpu, or MIG device mig
// of it, with its total and free memory in bytes.
type memDevice struct {
	gpu         int
	mig         string
	total, free uint64
}

// memoryDevice resolves (gpu, mig) for a process or a leak and says how
// much memory it has free; with replacingLeak the device's current leak
// counts as free (SetLeakedMemory replaces it). Caller holds layoutMu.
func (n *Node) memoryDevice(gpu int, mig string, replacingLeak bool) (memDevice, error) {
	if gpu < 0 || gpu >= len(n.gpus) {
		return memDevice{}, fmt.Errorf("gpu: no such gpu %d (node has %d)", gpu, len(n.gpus))
	}
	g := n.gpus[gpu]
	d := memDevice{gpu: gpu, mig: mig}
	n.mu.RLock()
	lost, missing, migOn := g.lost, g.missing, g.migEnabled && len(g.mig) > 0
	var migs []string
	for _, m := range g.mig {
		migs = append(migs, m.info.UUID)
		if m.info.UUID == mig {
			d.total = m.info.MemoryMiB << 20
		}
	}
	n.mu.RUnlock()
	switch {
	case lost:
		return memDevice{}, fmt.Errorf("gpu: gpu %d is lost (fallen off the bus)", gpu)
	case missing:
		return memDevice{}, fmt.Errorf("gpu: gpu %d is not listed by NVML (gpu-missing)", gpu)
	case mig == "" && migOn:
		return memDevice{}, fmt.Errorf("mig: required: gpu %d has MIG enabled, its memory belongs to its MIG devices (%s)", gpu, strings.Join(migs, ", "))
	case mig != "" && !migOn:
		return memDevice{}, fmt.Errorf("mig: gpu %d has MIG disabled; no MIG device %q", gpu, mig)
	case mig != "" && d.total == 0:
		return memDevice{}, fmt.Errorf("mig: no MIG device %q on gpu %d (it has %s)", mig, gpu, strings.Join(migs, ", "))
	}
	ps := n.procs
	ps.mu.Lock()
	defer ps.mu.Unlock()
	var used uint64
	if mig == "" {
		d.total = n.devices[gpu].MemoryInfo.Total
		used = d.total>>8 + ps.allocatedLocked(gpu, nil)
	} else {
		used = ps.allocatedLocked(gpu, &mig)
	}
	if replacingLeak {
		used -= ps.leaked[leakKey{gpu, mig}]
	}
	d.free = d.total - min(used, d.total)
	return d, nil
}

// StartProcess starts a simulated process as spec says and returns its
// PID: from then on NVML lists it on its device with its memory, which the
// device's memory information counts as used, and proc/<pid>/cgroup, stat
// and comm exist under the host root. Errors name the field at fault.
func (n *Node) StartProcess(spec ProcessSpec) (uint32, error) {
	n.layoutMu.Lock()
	defer n.layoutMu.Unlock()
	p, err := n.newProcess(spec)
	if err != nil {
		return 0, fmt.Errorf("start process: %w", err)
	}
	if err := n.writeProcEntry(*p, p.CgroupFile); err != nil {
		return 0, fmt.Errorf("start process %d: /proc entry under %s: %w", p.PID, n.hostRoot, err)
	}
	ps := n.procs
	ps.mu.Lock()
	ps.procs[p.PID] = p
	ps.mu.Unlock()
	n.log.Info("simulated process started", "pid", p.PID, "gpu", p.GPU, "mig", p.MIG, "memoryMiB", p.MemoryMiB,
		"kind", p.Kind, "podUID", p.PodUID, "cgroup", p.Cgroup)
	return p.PID, nil
}

// newProcess validates spec, fills its defaults and gives it a PID and a
// start time. Caller holds layoutMu.
func (n *Node) newProcess(spec ProcessSpec) (*Process, error) {
	if spec.MemoryMiB == 0 {
		return nil, errors.New("memoryMiB: required (a process with a context holds device memory)")
	}
	if !spec.Compute && !spec.Graphics {
		spec.Compute = true
	}
	if spec.Graphics && spec.MIG != "" {
		return nil, errors.New("graphics: MIG devices have no graphics contexts")
	}
	if err := spec.ProcessUtilization.validate(); err != nil {
		return nil, err
	}
	dev, err := n.memoryDevice(spec.GPU, spec.MIG, false)
	if err != nil {
		return nil, err
	}
	if spec.MemoryMiB<<20 > dev.free || spec.MemoryMiB > math.MaxUint64>>20 {
		return nil, fmt.Errorf("memoryMiB: %d MiB is more than the %d MiB free on %s", spec.MemoryMiB, dev.free>>20, deviceName(dev.gpu, dev.mig))
	}
	if spec.Comm == "" {
		spec.Comm = defaultComm
	}
	if len(spec.Comm) > 15 || strings.ContainsAny(spec.Comm, "\n\x00") {
		return nil, fmt.Errorf("comm: %q: at most 15 bytes, no newline or NUL (TASK_COMM_LEN)", spec.Comm)
	}
	switch spec.CgroupVersion {
	case "":
		spec.CgroupVersion = CgroupV2
	case CgroupV1, CgroupV2, CgroupHybrid:
	default:
		return nil, fmt.Errorf("cgroupVersion: %q: want %s, %s or %s", spec.CgroupVersion, CgroupV2, CgroupV1, CgroupHybrid)
	}
	// The next PID is taken only once the spec is valid; control actions
	// are serialised by layoutMu, so no other start takes it meanwhile.
	ps := n.procs
	ps.mu.Lock()
	pid := ps.next
	ps.mu.Unlock()

	p := &Process{PID: pid, State: "S"}
	if spec.Uninterruptible {
		p.State = "D"
	}
	switch spec.Kind {
	case ProcessPod:
		if err := fillPodSpec(&spec, pid); err != nil {
			return nil, err
		}
		p.Cgroup = podCgroup(spec.PodUID, spec.ContainerID, spec.QOS, spec.CgroupDriver, spec.Runtime, spec.OCIRuntime, spec.CgroupVersion)
		service := "containerd.service"
		if spec.Runtime == RuntimeCRIO {
			service = "crio.service"
		}
		p.CgroupFile = cgroupFile(p.Cgroup, spec.CgroupVersion, spec.CgroupDriver == DriverCgroupfs, service)
	case ProcessHost:
		for field, v := range map[string]string{"podUID": spec.PodUID, "containerID": spec.ContainerID, "qos": spec.QOS,
			"cgroupDriver": spec.CgroupDriver, "runtime": spec.Runtime, "ociRuntime": spec.OCIRuntime} {
			if v != "" {
				return nil, fmt.Errorf("%s: only for kind %q, not %q", field, ProcessPod, ProcessHost)
			}
		}
		if spec.HostCgroup == "" {
			spec.HostCgroup = defaultHostCgroup
		}
		if !strings.HasPrefix(spec.HostCgroup, "/") || path.Clean(spec.HostCgroup) != spec.HostCgroup || strings.ContainsAny(spec.HostCgroup, "\n\x00:") {
			return nil, fmt.Errorf("hostCgroup: %q: want a clean absolute cgroup path such as /system.slice/train.service", spec.HostCgroup)
		}
		p.Cgroup = spec.HostCgroup
		p.CgroupFile = cgroupFile(p.Cgroup, spec.CgroupVersion, false, "")
	case "":
		return nil, fmt.Errorf("kind: required (%s or %s)", ProcessPod, ProcessHost)
	default:
		return nil, fmt.Errorf("kind: %q: want %s or %s", spec.Kind, ProcessPod, ProcessHost)
	}
	p.ProcessSpec = spec
	ps.mu.Lock()
	ps.next++
	p.StartTime = max(uint64(time.Since(ps.boot)/(time.Second/clockTicks)), ps.lastStart+1)
	ps.lastStart = p.StartTime
	p.started = ps.now()
	p.history = []utilPoint{{at: p.started, util: spec.ProcessUtilization}}
	ps.mu.Unlock()
	return p, nil
}

// fillPodSpec validates the pod fields of spec and fills their defaults.
func fillPodSpec(spec *ProcessSpec, pid uint32) error {
	if spec.HostCgroup != "" {
		return fmt.Errorf("hostCgroup: only for kind %q, not %q", ProcessHost, ProcessPod)
	}
	switch spec.Runtime {
	case "":
		spec.Runtime = RuntimeContainerd
	case RuntimeContainerd, RuntimeCRIO:
	default:
		return fmt.Errorf("runtime: %q: want %s or %s", spec.Runtime, RuntimeContainerd, RuntimeCRIO)
	}
	switch spec.CgroupDriver {
	case "":
		spec.CgroupDriver = DriverSystemd
	case DriverSystemd, DriverCgroupfs:
	default:
		return fmt.Errorf("cgroupDriver: %q: want %s or %s", spec.CgroupDriver, DriverSystemd, DriverCgroupfs)
	}
	switch spec.OCIRuntime {
	case "":
		spec.OCIRuntime = OCIRunc
	case OCIRunc, OCICrun:
	default:
		return fmt.Errorf("ociRuntime: %q: want %s or %s", spec.OCIRuntime, OCIRunc, OCICrun)
	}
	switch q := strings.ToLower(spec.QOS); q {
	case "":
		spec.QOS = QOSBurstable
	case QOSGuaranteed, QOSBurstable, QOSBestEffort:
		spec.QOS = q
	default:
		return fmt.Errorf("qos: %q: want %s, %s or %s", spec.QOS, QOSGuaranteed, QOSBurstable, QOSBestEffort)
	}
	if spec.PodUID == "" {
		spec.PodUID = derivedUID("gone-pod", fmt.Sprint(pid))
	} else if !podUIDPattern.MatchString(spec.PodUID) {
		return fmt.Errorf("podUID: %q: want a pod's metadata.uid (a lower-case UUID, or a static pod's 32 hex digits)", spec.PodUID)
	}
	id := spec.ContainerID
	if scheme, rest, ok := strings.Cut(id, "://"); ok {
		if want := runtimeScheme[spec.Runtime]; scheme+"://" != want {
			return fmt.Errorf("containerID: %q is a %s:// ID; runtime %s shows %s IDs", id, scheme, spec.Runtime, want)
		}
		id = rest
	}
	if id == "" {
		id = derivedID(64, "container", spec.PodUID, fmt.Sprint(pid))
	} else if !containerIDPattern.MatchString(id) {
		return fmt.Errorf("containerID: %q: want 64 lower-case hex digits (as the runtime names containers)", spec.ContainerID)
	}
	spec.ContainerID = id
	return nil
}

func deviceName(gpu int, mig string) string {
	if mig == "" {
		return fmt.Sprintf("gpu %d", gpu)
	}
	return fmt.Sprintf("gpu %d MIG device %s", gpu, mig)
}

// errNoProcess is the error of an action on a PID that is not running:
// errors.Is(err, syscall.ESRCH), as kill(2) answers.
func errNoProcess(action string, pid uint32) error {
	return fmt.Errorf("%s %d: no such simulated process: %w", action, pid, syscall.ESRCH)
}

// StopProcess ends process pid as a normal exit: NVML no longer lists it,
// its memory is free and its /proc entry is gone. It ends an
// uninterruptible process too (its sleep ended). A PID that is not
// running is an error wrapping syscall.ESRCH.
func (n *Node) StopProcess(pid uint32) error {
	n.layoutMu.Lock()
	defer n.layoutMu.Unlock()
	if err := n.endProcess(pid, "exited"); err != nil {
		return fmt.Errorf("stop process: %w", err)
	}
	return nil
}

// endProcess removes process pid and its /proc entry. Caller holds
// layoutMu.
func (n *Node) endProcess(pid uint32, how string) error {
	ps := n.procs
	ps.mu.Lock()
	p, ok := ps.procs[pid]
	delete(ps.procs, pid)
	ps.mu.Unlock()
	if !ok {
		return errNoProcess("process", pid)
	}
	if err := n.removeProcEntry(pid); err != nil {
		// NVML no longer lists it: the process is gone; a file left
		// behind reads as a process without GPU memory.
		n.log.Error("simulated process /proc entry not removed", "pid", pid, "err", err)
	}
	n.log.Info("simulated process ended", "pid", pid, "how", how, "gpu", p.GPU, "mig", p.MIG, "memoryMiB", p.MemoryMiB)
	return nil
}

// SignalProcess sends sig to process pid as kill(2) would: signal 0 only
// checks that it runs; SIGTERM, SIGINT, SIGHUP and SIGQUIT end it unless
// it is uninterruptible, or ignores SIGTERM (IgnoreTerm, SIGTERM only);
// SIGKILL ends it unless it is uninterruptible. A signal that does not end
// the process still succeeds, as kill(2) does. A PID that is not running
// is an error wrapping syscall.ESRCH; another signal one wrapping
// syscall.EINVAL.
func (n *Node) SignalProcess(pid uint32, sig syscall.Signal) error {
	switch sig {
	case 0, syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGTERM, syscall.SIGKILL:
	default:
		return fmt.Errorf("signal process %d: signal %d (%v) is not simulated (0, SIGHUP, SIGINT, SIGQUIT, SIGTERM and SIGKILL are): %w",
			pid, int(sig), sig, syscall.EINVAL)
	}
	n.layoutMu.Lock()
	defer n.layoutMu.Unlock()
	ps := n.procs
	ps.mu.Lock()
	p, ok := ps.procs[pid]
	var uninterruptible, ignoreTerm bool
	if ok {
		uninterruptible, ignoreTerm = p.Uninterruptible, p.IgnoreTerm
	}
	ps.mu.Unlock()
	if !ok {
		return fmt.Errorf("signal process: %w", errNoProcess("process", pid))
	}
	switch {
	case sig == 0:
		return nil
	case uninterruptible:
		n.log.Info("simulated process in uninterruptible sleep: signal pending", "pid", pid, "signal", sig.String())
		return nil
	case sig == syscall.SIGTERM && ignoreTerm:
		n.log.Info("simulated process ignores SIGTERM", "pid", pid)
		return nil
	}
	return n.endProcess(pid, "killed by "+sig.String())
}

// SetLeakedMemory makes mib MiB of the memory of GPU gpu (or of its MIG
// device mig) used by no process at all, as memory a driver never freed:
// the device's memory information counts it as used, no process list
// shows it. It replaces the leak set before; 0 frees it. It lasts until
// changed, a GPU reset (gpu-reset) or a MIG layout change of the GPU.
func (n *Node) SetLeakedMemory(gpu int, mig string, mib uint64) error {
	n.layoutMu.Lock()
	defer n.layoutMu.Unlock()
	dev, err := n.memoryDevice(gpu, mig, true)
	if err != nil {
		return fmt.Errorf("set leaked memory: %w", err)
	}
	if mib > math.MaxUint64>>20 || mib<<20 > dev.free {
		return fmt.Errorf("set leaked memory: memoryMiB: %d MiB is more than the %d MiB free on %s", mib, dev.free>>20, deviceName(gpu, mig))
	}
	ps := n.procs
	ps.mu.Lock()
	if mib == 0 {
		delete(ps.leaked, leakKey{gpu, mig})
	} else {
		ps.leaked[leakKey{gpu, mig}] = mib << 20
	}
	ps.mu.Unlock()
	n.log.Info("simulated leaked memory set", "gpu", gpu, "mig", mig, "memoryMiB", mib)
	return nil
}

// Processes lists the running simulated processes by PID.
func (n *Node) Processes() []Process {
	ps := n.procs
	ps.mu.Lock()
	defer ps.mu.Unlock()
	out := make([]Process, 0, len(ps.procs))
	for _, p := range ps.procs {
		c := *p
		c.started, c.history = time.Time{}, nil
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b Process) int { return int(a.PID) - int(b.PID) })
	return out
}

// LeakedMemory is memory held by no process on a GPU or MIG device.
type LeakedMemory struct {
	GPU       int    `json:"gpu"`
	MIG       string `json:"mig,omitempty"`
	MemoryMiB uint64 `json:"memoryMiB"`
}

// Leaks lists the leaked memory by GPU and MIG device.
func (n *Node) Leaks() []LeakedMemory {
	ps := n.procs
	ps.mu.Lock()
	defer ps.mu.Unlock()
	out := make([]LeakedMemory, 0, len(ps.leaked))
	for k, b := range ps.leaked {
		out = append(out, LeakedMemory{GPU: k.gpu, MIG: k.mig, MemoryMiB: b >> 20})
	}
	slices.SortFunc(out, func(a, b LeakedMemory) int {
		if a.GPU != b.GPU {
			return a.GPU - b.GPU
		}
		return strings.Compare(a.MIG, b.MIG)
	})
	return out
}

// checkIdle refuses an action that needs GPU gpu without processes (a
// reset, a MIG reconfiguration): nvml.h answers NVML_ERROR_IN_USE, "An
// operation cannot be performed because the GPU is currently in use"
// (nvmlGpuInstanceDestroy: "if processes (e.g. CUDA application) ... are
// active on the GPU instance"). Caller holds layoutMu.
func (n *Node) checkIdle(gpu int, action string) error {
	ps := n.procs
	ps.mu.Lock()
	pids := ps.onGPULocked(gpu)
	ps.mu.Unlock()
	if len(pids) == 0 {
		return nil
	}
	return fmt.Errorf("%s: gpu %d is in use by simulated processes %v (NVML_ERROR_IN_USE); stop or kill them first", action, gpu, pids)
}

// clearLeaks frees the leaked memory of GPU gpu and its MIG devices (a
// reset or a reconfiguration re-initialises its memory). Caller holds
// layoutMu.
func (n *Node) clearLeaks(gpu int) {
	ps := n.procs
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for k := range ps.leaked {
		if k.gpu == gpu {
			delete(ps.leaked, k)
		}
	}
}
