package usage

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/utils/clock"

	"github.com/gpu-node-agent/gpu-node-agent/dra"
	"github.com/gpu-node-agent/gpu-node-agent/health"
	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// SnapshotSource is the NVML sampler the tracker follows
// (*nvmlowner.Sampler): it reads the latest cycle after each signal.
type SnapshotSource interface {
	Subscribe() <-chan struct{}
	Latest() *nvmlowner.Snapshot
}

// HealthObserver takes the GPU process check's observations
// (*health.Monitor).
type HealthObserver interface {
	Observe(health.Observation)
}

// EventRecorder posts an Event about this node; it must not block (the
// node object queues them: kubeapi.NodeObject).
type EventRecorder interface {
	Event(eventType, reason, message string)
}

// AllocationObserver is told, once per cycle in which the kubelet
// answered, the node, which device IDs are offered to the kubelet and the
// cycle's assignments (never nil): which device IDs the kubelet has
// allocated (Assignments.Allocated: GPU UUIDs, MIG UUIDs, replicas
// "<uuid>::<n>") and which pod holds each (Assignments.Holds): the
// fragmentation collector and its move advice.
type AllocationObserver interface {
	Update(n *topology.Node, offered func(id string) bool, a *Assignments)
}

// Event types and reasons the tracker posts.
const (
	eventWarning = "Warning"

	ReasonZombie         = "GPUZombieProcess"
	ReasonLeaked         = "GPULeakedMemory"
	ReasonForeign        = "GPUForeignProcess"
	ReasonKilled         = "GPUZombieKilled"
	ReasonKillFailed     = "GPUZombieKillFailed"
	ReasonKillNotAllowed = "GPUZombieKillDisabled"
)

var findingReasons = map[Class]string{ClassZombie: ReasonZombie, ClassLeaked: ReasonLeaked, ClassForeign: ReasonForeign}

// Config configures a Tracker.
type Config struct {
	// Zombies is the health.zombies section.
	Zombies ZombiesConfig
	// Judge runs the GPU process check (it is not in
	// health.disabledChecks): findings become health observations and
	// Events, and action kill acts. Without it the tracker only lists
	// the kubelet's pods (pod attribution) and reports processes in its
	// metrics.
	Judge bool
	// HostRoot is where the host's / is mounted: /proc, the kubelet's
	// pod log directories and its pod-resources socket are under it.
	HostRoot string
	// DevicePluginDir is the kubelet's device-plugin directory, which
	// holds the device manager's checkpoint.
	DevicePluginDir string
	// PodResourcesSocket is the kubelet's pod-resources socket; empty:
	// no kubelet, so no attribution and no judgement.
	PodResourcesSocket string
	// MIGDevicesServed says MIG devices are served as devices of their
	// own (--mig-strategy single or mixed); otherwise a process on a MIG
	// device counts against its GPU, which is what the kubelet assigns.
	MIGDevicesServed bool
	// SimulatedPIDs says the PIDs NVML reports are a simulated node's,
	// whose /proc files are under HostRoot: no host PID namespace is
	// needed to read them.
	SimulatedPIDs bool
	// DRAPool is this node's pool of our DRA driver (dra.DriverName):
	// the node's name. When set, the devices of that driver and pool a
	// container's pod-resources dynamic resources name count as assigned
	// to its pod and container exactly as device-plugin devices do (for
	// the process check, the fragmentation collector and the metrics' pod
	// labels). Empty: dynamic resources are ignored.
	DRAPool string
}

// Options are the tracker's collaborators; all but Samples may be nil.
type Options struct {
	Samples SnapshotSource
	Health  HealthObserver
	Events  EventRecorder
	// Signaller kills zombies (action kill); nil: NewPidfdSignaller.
	Signaller Signaller
	// Allocations and Offered feed the fragmentation collector: Offered
	// is called once per cycle for the device IDs served to the kubelet
	// as healthy (nil: every device counts as offered).
	Allocations AllocationObserver
	Offered     func() map[string]bool
	Clock       clock.PassiveClock
	Logger      *slog.Logger
	Registerer  prometheus.Registerer
}

// Tracker follows who uses each GPU and MIG device. After every sampling
// cycle it asks the kubelet for its pods' devices (one pod-resources List
// per cycle, shared with the GPU metrics through Assignments), reads the
// device manager's checkpoint and each listed process's /proc entry,
// judges every process and reports what lasted the grace period. Nothing
// here runs on a scrape or gRPC path.
type Tracker struct {
	cfg     Config
	opts    Options
	log     *slog.Logger
	clock   clock.PassiveClock
	updates <-chan struct{}
	pods    *podResourcesClient
	procs   *procReader
	signal  Signaller
	metrics *trackerMetrics

	// pidView says whether NVML's PIDs resolve under HostRoot/proc;
	// action is the effective action (kill falls back to report
	// without it).
	pidView bool
	pidWhy  string
	action  string

	node        atomic.Pointer[topology.Node]
	assignments atomic.Pointer[Assignments]

	subsMu sync.Mutex
	subs   []chan struct{}

	// mu serialises cycles and guards the state below.
	mu      sync.Mutex
	lastSeq uint64
	ran     bool
	// findings are the current findings by key.
	findings map[findingKey]*finding
	// reported is, per device and class, the verdict last sent to the
	// health monitor (absent: nothing sent since start).
	reported map[string]map[Class]string
	// names remembers pods' names by UID, for naming a pod in an Event
	// after it is gone.
	names map[string]namedPod
	// announced tells whether the kill fallback was announced.
	announced bool
	// unresolved are the DRA device names the last List named that the
	// node does not have, so each is logged once while it lasts.
	unresolved map[string]bool
}

// findingKey identifies one finding: a process (by PID and start time) of
// a class on a device, or a device's leaked memory.
type findingKey struct {
	device string
	class  Class
	pid    uint32
	start  uint64
}

// finding is one finding's history.
type finding struct {
	first   time.Time
	flagged bool
	verdict Verdict
	// kill is the cleanup's progress (action kill).
	termAt, killAt time.Time
	killDone       bool
}

type namedPod struct {
	name podName
	seen time.Time
}

// namesTTL is how long a pod's name is remembered after it was last seen
// running (a zombie reported later still names its pod).
const namesTTL = 24 * time.Hour

// NewTracker returns a tracker; nothing is read until Run (or Cycle).
func NewTracker(cfg Config, opts Options) (*Tracker, error) {
	if opts.Samples == nil {
		return nil, errors.New("gpu usage tracker: no NVML sampler")
	}
	if err := cfg.Zombies.Validate(); err != nil {
		return nil, fmt.Errorf("gpu usage tracker: %w", err)
	}
	cfg.Zombies = cfg.Zombies.WithDefaults()
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	t := &Tracker{
		cfg: cfg, opts: opts, log: opts.Logger, clock: opts.Clock,
		updates:    opts.Samples.Subscribe(),
		procs:      newProcReader(cfg.HostRoot),
		signal:     opts.Signaller,
		findings:   map[findingKey]*finding{},
		reported:   map[string]map[Class]string{},
		names:      map[string]namedPod{},
		unresolved: map[string]bool{},
		action:     cfg.Zombies.Action,
	}
	if t.signal == nil {
		t.signal = NewPidfdSignaller(cfg.HostRoot)
	}
	if cfg.PodResourcesSocket != "" {
		t.pods = newPodResourcesClient(cfg.PodResourcesSocket, opts.Logger)
	}
	if cfg.SimulatedPIDs {
		t.pidView = true
	} else {
		t.pidView, t.pidWhy = HostPIDView(cfg.HostRoot)
	}
	var err error
	if t.metrics, err = newTrackerMetrics(opts.Registerer, t.pods); err != nil {
		return nil, fmt.Errorf("gpu usage tracker metrics: %w", err)
	}
	if t.action == ActionKill && (!cfg.Judge || !t.pidView || cfg.SimulatedPIDs && opts.Signaller == nil) {
		// Fail closed: never kill without knowing whose processes they
		// are. The agent keeps serving (a DaemonSet crash-looping over a
		// chart setting would stop every node's GPUs) and reports.
		t.action = ActionReport
	}
	return t, nil
}

// SetNode sets the topology (after every discovery): the devices judged.
func (t *Tracker) SetNode(n *topology.Node) { t.node.Store(n) }

// Assignments is the kubelet's answer of the last cycle (nil: unknown,
// before the first or when it failed).
func (t *Tracker) Assignments() *Assignments { return t.assignments.Load() }

// Subscribe returns a channel signalled (coalesced) after every cycle,
// when Assignments and the tracker's metrics are fresh.
func (t *Tracker) Subscribe() <-chan struct{} {
	ch := make(chan struct{}, 1)
	t.subsMu.Lock()
	t.subs = append(t.subs, ch)
	t.subsMu.Unlock()
	return ch
}

// Run runs a cycle after every sampling cycle until ctx ends.
func (t *Tracker) Run(ctx context.Context) error {
	defer t.pods.close()
	t.announce()
	for {
		t.Cycle(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.updates:
		}
	}
}

// announce logs (once) what the check can do on this node.
func (t *Tracker) announce() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.announced {
		return
	}
	t.announced = true
	switch {
	case !t.cfg.Judge:
		t.log.Info("gpu process check disabled (health.disabledChecks): processes are only counted")
	case !t.pidView:
		t.log.Warn("gpu process check cannot attribute processes on this node: no zombie, leaked or foreign findings", "reason", t.pidWhy)
	}
	if t.cfg.Zombies.Action == ActionKill && t.action != ActionKill {
		why := t.pidWhy
		switch {
		case !t.cfg.Judge:
			why = "the gpu-processes check is disabled"
		case why == "":
			why = "the simulated node cannot signal its processes"
		}
		t.log.Error("health.zombies.action kill refused, reporting only", "reason", why)
		t.event(ReasonKillNotAllowed, "zombie GPU processes will be reported, not killed: "+why)
	}
}

// Cycle runs one cycle on the sampler's latest snapshot, unless that
// snapshot was handled already. Run calls it; tests call it after
// publishing a snapshot.
func (t *Tracker) Cycle(ctx context.Context) {
	snap := t.opts.Samples.Latest()
	t.mu.Lock()
	defer t.mu.Unlock()
	if snap != nil && t.ran && snap.Seq == t.lastSeq {
		return
	}
	node := t.node.Load()
	if node == nil {
		return
	}
	t.ran = true
	if snap != nil {
		t.lastSeq = snap.Seq
	}
	now := t.clock.Now()

	attr, resp := t.attribute(ctx, node, now)
	if ctx.Err() != nil {
		return
	}
	devices := t.devicesOf(node, snap, attr.pids)
	verdicts := make([]deviceVerdict, 0, len(devices))
	for _, d := range devices {
		verdicts = append(verdicts, judge(d, attr, t.cfg.Zombies.LeakedThresholdMiB<<20))
	}
	t.track(node, verdicts, now)
	t.metrics.render(verdicts, t.findings, attr, resp != nil)

	if attr.assignments != nil {
		attr.assignments.uses = holderUses(attr.assignments, devices, verdicts)
		attr.assignments.listed = now
	}
	t.assignments.Store(attr.assignments)
	if attr.assignments != nil && t.opts.Allocations != nil {
		offered := func(string) bool { return true }
		if t.opts.Offered != nil {
			set := t.opts.Offered()
			offered = func(id string) bool { return set[id] }
		}
		t.opts.Allocations.Update(node, offered, attr.assignments)
	}
	t.subsMu.Lock()
	for _, ch := range t.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	t.subsMu.Unlock()
}

// attribute gathers this cycle's attribution: the kubelet's List, the
// checkpoint, the running pods' UIDs.
func (t *Tracker) attribute(ctx context.Context, node *topology.Node, now time.Time) (attribution, *podresourcesv1.ListPodResourcesResponse) {
	attr := attribution{pids: t.pidView, pidsWhy: t.pidWhy, running: map[string]bool{}}
	if t.pods == nil {
		return attr, nil
	}
	resp, err := t.pods.list(ctx, PodResourcesTimeout)
	if err != nil {
		return attr, nil
	}
	devs := newDRADevices(t.cfg.DRAPool, node)
	if !t.cfg.Judge {
		// Pod labels and allocations need the List alone.
		attr.assignments = newAssignments(resp, nil, devs, nil)
		t.noteUnresolved(attr.assignments)
		return attr, resp
	}
	entries, cpErr := ReadCheckpoint(CheckpointPath(t.cfg.DevicePluginDir))
	dirs, logErr := readPodLogDirs(PodLogsDir(t.cfg.HostRoot))
	if errors.Is(logErr, fs.ErrNotExist) {
		logErr = fmt.Errorf("%w (not mounted?)", logErr)
	}
	attr.assignments = newAssignments(resp, entries, devs, dirs)
	t.noteUnresolved(attr.assignments)
	if cpErr != nil && !attr.assignments.dpDevices && checkpointNotWritten(t.cfg.DevicePluginDir, cpErr) {
		// No device plugin has registered with this kubelet yet (a node
		// whose devices are all served through DRA): no checkpoint,
		// and no assignment needs one.
		cpErr = nil
	}
	attr.checkpointOK = cpErr == nil
	t.metrics.noteSource(t.log, SourceCheckpoint, cpErr)
	byName := map[podName]string{}
	for _, l := range attr.assignments.byBase {
		for _, as := range l {
			if as.PodUID != "" {
				p := podName{namespace: as.Namespace, name: as.Pod}
				attr.running[as.PodUID] = true
				byName[p] = as.PodUID
				t.names[as.PodUID] = namedPod{name: p, seen: now}
			}
		}
	}
	complete := logErr == nil && attr.checkpointOK
	for _, p := range runningPods(resp) {
		uids := dirs[p]
		if uid, ok := byName[p]; ok && !slices.Contains(uids, uid) {
			uids = append(uids, uid)
		}
		if len(uids) == 0 {
			if complete {
				logErr = fmt.Errorf("no pod log directory for running pod %s", p)
			}
			complete = false
			continue
		}
		for _, uid := range uids {
			attr.running[uid] = true
			t.names[uid] = namedPod{name: p, seen: now}
		}
	}
	attr.runningComplete = complete
	t.metrics.noteSource(t.log, SourcePodLogs, logErr)
	for uid, n := range t.names {
		if now.Sub(n.seen) > namesTTL {
			delete(t.names, uid)
		}
	}
	return attr, resp
}

// noteUnresolved logs, once while the kubelet keeps listing it, each
// device name of our DRA pool that the node's model does not have (a MIG
// re-layout or a rediscovery since the claim was prepared). Such a device
// is ignored: there is no device of the model to count it against.
func (t *Tracker) noteUnresolved(a *Assignments) {
	now := make(map[string]bool, len(a.unresolved))
	for _, d := range a.unresolved {
		now[d.name] = true
		if !t.unresolved[d.name] {
			t.log.Debug("dra device of a pod not on this node, ignored", "driver", dra.DriverName, "pool", t.cfg.DRAPool,
				"device", d.name, "claim", d.claim)
		}
	}
	t.unresolved = now
}

// devicesOf lists the served devices of node with their use in snap.
func (t *Tracker) devicesOf(node *topology.Node, snap *nvmlowner.Snapshot, resolve bool) []deviceUse {
	samples := map[string]*nvmlowner.Sample{}
	if snap != nil {
		for i := range snap.Samples {
			samples[snap.Samples[i].UUID] = &snap.Samples[i]
		}
	}
	var out []deviceUse
	for i := range node.GPUs {
		g := &node.GPUs[i]
		s := samples[g.UUID]
		read := s != nil && s.Err == nil && s.ProcessesRead.Status == nvmlowner.OK
		// The processes' utilisation is known when it was read, or
		// when there is no process (nothing to be busy); never on a GPU
		// with MIG devices (nvml.h: not supported there), so a MIG
		// device's holders never show it, idle or not.
		utilRead := read && len(g.MIG) == 0 && (s.ProcessUtilRead.Status == nvmlowner.OK || len(s.Processes) == 0)
		procs := map[string][]procUse{}
		if read {
			for _, p := range s.Processes {
				pu := procUse{PID: p.PID, Memory: p.UsedMemory.V, MemoryKnown: p.UsedMemory.Status == nvmlowner.OK, Util: p.Util}
				if resolve {
					pu.Proc, pu.procErr = t.procs.read(p.PID)
				}
				pu.Proc.PID = p.PID
				procs[p.MIG] = append(procs[p.MIG], pu)
			}
		}
		all := []string{g.UUID}
		for _, m := range g.MIG {
			all = append(all, m.UUID)
		}
		if len(g.MIG) == 0 || !t.cfg.MIGDevicesServed {
			d := deviceUse{ID: g.UUID, assignIDs: all, read: read, utilRead: utilRead}
			for _, l := range procs {
				d.processes = append(d.processes, l...)
			}
			sortProcs(d.processes)
			if read && len(g.MIG) == 0 && leakJudgeable(g.Model) {
				used, reserved := s.Get(nvmlowner.FieldFBUsed), s.Get(nvmlowner.FieldFBReserved)
				if used.Status == nvmlowner.OK && reserved.Status == nvmlowner.OK && used.V >= reserved.V {
					d.memory, d.memoryKnown = used.V-reserved.V, true
				}
			}
			out = append(out, d)
			continue
		}
		// MIG devices served: each MIG device is a device; processes
		// NVML did not place on one of them count against the GPU.
		for _, m := range g.MIG {
			d := deviceUse{ID: m.UUID, assignIDs: []string{m.UUID}, read: read, utilRead: utilRead, processes: procs[m.UUID]}
			delete(procs, m.UUID)
			if read && leakJudgeable(g.Model) {
				for _, ms := range s.MIG {
					if ms.UUID == m.UUID && ms.FBUsed.Status == nvmlowner.OK {
						d.memory, d.memoryKnown = ms.FBUsed.V, true
					}
				}
			}
			out = append(out, d)
		}
		var rest []procUse
		for _, l := range procs {
			rest = append(rest, l...)
		}
		if len(rest) > 0 {
			sortProcs(rest)
			out = append(out, deviceUse{ID: g.UUID, assignIDs: all, read: read, utilRead: utilRead, processes: rest})
		}
	}
	t.procs.endCycle()
	return out
}

func sortProcs(p []procUse) {
	slices.SortFunc(p, func(a, b procUse) int { return int(a.PID) - int(b.PID) })
}

// leakJudgeable says whether a GPU's memory without processes means a
// leak. Not on GPUs whose memory the OS manages as NUMA memory (Grace
// Hopper / Grace Blackwell superchips): nvml.h nvmlDeviceGetMemoryInfo
// says pages allocated from FB memory there "are not released even after
// the process terminates".
func leakJudgeable(model string) bool {
	for _, m := range []string{"GH200", "GB200", "GB300"} {
		if strings.Contains(model, m) {
			return false
		}
	}
	return true
}

// track updates the findings with this cycle's verdicts and acts on what
// changed: health observations, Events, kills.
func (t *Tracker) track(node *topology.Node, verdicts []deviceVerdict, now time.Time) {
	known := map[string]bool{}
	for _, g := range node.GPUs {
		known[g.UUID] = true
		for _, m := range g.MIG {
			known[m.UUID] = true
		}
	}
	for k := range t.findings {
		if !known[k.device] {
			delete(t.findings, k)
		}
	}
	for dev := range t.reported {
		if !known[dev] {
			delete(t.reported, dev)
		}
	}
	if !t.cfg.Judge {
		// The check is off: processes are only counted.
		clear(t.findings)
		return
	}
	for _, dv := range verdicts {
		if !dv.judged {
			// Missing data: no finding starts, none clears.
			continue
		}
		current := map[findingKey]Verdict{}
		for _, v := range dv.verdicts {
			if slices.Contains(findingClasses, v.Class) {
				current[findingKey{dv.ID, v.Class, v.Process.PID, v.Process.StartTime}] = v
			}
		}
		for k, f := range t.findings {
			if k.device != dv.ID {
				continue
			}
			if _, ok := current[k]; !ok {
				if f.flagged {
					t.log.Info("gpu process finding gone", "device", k.device, "class", k.class, "pid", k.pid)
				}
				delete(t.findings, k)
			}
		}
		var fresh []*finding
		for k, v := range current {
			f := t.findings[k]
			if f == nil {
				f = &finding{first: now}
				t.findings[k] = f
				t.log.Debug("gpu process finding pending", "device", k.device, "class", k.class, "pid", k.pid, "why", v.Why)
			}
			f.verdict = v
			if !f.flagged && now.Sub(f.first) >= t.cfg.Zombies.Grace {
				f.flagged = true
				fresh = append(fresh, f)
			}
		}
		t.report(dv.ID, fresh, now)
		if t.action == ActionKill {
			t.kill(dv.ID, now)
		}
	}
}

// report sends the device's health observations that changed and an
// Event per class with newly flagged findings.
func (t *Tracker) report(device string, fresh []*finding, now time.Time) {
	byClass := map[Class][]*finding{}
	for k, f := range t.findings {
		if k.device == device && f.flagged {
			byClass[k.class] = append(byClass[k.class], f)
		}
	}
	if t.reported[device] == nil {
		t.reported[device] = map[Class]string{}
	}
	for _, c := range findingClasses {
		fs := byClass[c]
		sortFindings(fs)
		reason := ""
		if len(fs) > 0 {
			reason = healthReason(c, fs, t.podLabel)
		}
		last, sent := t.reported[device][c]
		if sent && last == reason {
			continue
		}
		if !sent && reason == "" && t.pending(device, c) {
			// After a restart the monitor may hold this cause from the
			// state file: a finding still pending is not "gone", so leave
			// it until the finding is flagged or goes.
			continue
		}
		t.reported[device][c] = reason
		o := health.Observation{DeviceID: device, Check: health.CheckGPUProcesses, Key: string(c), Reason: reason}
		if reason != "" {
			o.Fatal = true
			t.log.Warn("gpu process finding", "device", device, "class", c, "reason", reason)
		} else {
			o.Cleared = true
		}
		if t.opts.Health != nil {
			t.opts.Health.Observe(o)
		}
	}
	freshBy := map[Class][]*finding{}
	for _, f := range fresh {
		freshBy[f.verdict.Class] = append(freshBy[f.verdict.Class], f)
	}
	for _, c := range findingClasses {
		if fs := freshBy[c]; len(fs) > 0 {
			sortFindings(fs)
			t.event(findingReasons[c], t.eventMessage(device, c, fs, now))
		}
	}
}

// pending reports whether device has a finding of class c not flagged yet.
func (t *Tracker) pending(device string, c Class) bool {
	for k, f := range t.findings {
		if k.device == device && k.class == c && !f.flagged {
			return true
		}
	}
	return false
}

// kill moves every flagged, kill-safe zombie of device one step through
// SIGTERM, SIGKILL after the kill grace, and a report if even that fails.
func (t *Tracker) kill(device string, now time.Time) {
	var keys []findingKey
	for k, f := range t.findings {
		if k.device == device && k.class == ClassZombie && f.flagged && f.verdict.KillSafe && !f.killDone {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, func(a, b findingKey) int { return int(a.pid) - int(b.pid) })
	for _, k := range keys {
		f := t.findings[k]
		sig := syscall.SIGTERM
		switch {
		case f.termAt.IsZero():
		case f.killAt.IsZero() && now.Sub(f.termAt) >= t.cfg.Zombies.KillGrace:
			sig = syscall.SIGKILL
		case !f.killAt.IsZero() && now.Sub(f.killAt) >= t.cfg.Zombies.KillGrace:
			f.killDone = true
			t.event(ReasonKillFailed, fmt.Sprintf("%s still there %s after SIGKILL%s; the device stays unhealthy until its memory is freed",
				t.processLabel(device, f.verdict), t.cfg.Zombies.KillGrace, stateNote(f.verdict.Process.State)))
			continue
		default:
			continue
		}
		ref := ProcessRef{PID: k.pid, StartTime: k.start}
		err := t.signal.Signal(ref, sig)
		switch {
		case errors.Is(err, ErrProcessGone):
			t.log.Info("zombie gpu process gone before it was signalled", "device", device, "pid", k.pid, "signal", signalName(sig))
			f.killDone = true
			continue
		case err != nil:
			f.killDone = true
			t.log.Error("killing zombie gpu process failed", "device", device, "pid", k.pid, "signal", signalName(sig), "err", err)
			t.event(ReasonKillFailed, fmt.Sprintf("%s: %s failed: %v", t.processLabel(device, f.verdict), signalName(sig), err))
			continue
		}
		t.metrics.kills.WithLabelValues(signalName(sig)).Inc()
		msg := fmt.Sprintf("sent %s to %s", signalName(sig), t.processLabel(device, f.verdict))
		if sig == syscall.SIGTERM {
			f.termAt = now
			msg += fmt.Sprintf("; SIGKILL follows in %s if it is still there", t.cfg.Zombies.KillGrace)
		} else {
			f.killAt = now
		}
		t.log.Warn("zombie gpu process signalled", "device", device, "pid", k.pid, "signal", signalName(sig))
		t.event(ReasonKilled, msg)
	}
}

func (t *Tracker) event(reason, msg string) {
	if t.opts.Events != nil {
		t.opts.Events.Event(eventWarning, reason, msg)
	}
}

// podLabel names a pod by UID: namespace/name when it was ever seen
// running, with the UID.
func (t *Tracker) podLabel(uid string) string {
	if n, ok := t.names[uid]; ok {
		return n.name.String() + " (uid " + uid + ")"
	}
	return "uid " + uid
}

// processLabel describes a verdict's process for an Event.
func (t *Tracker) processLabel(device string, v Verdict) string {
	p := v.Process
	s := fmt.Sprintf("%s process %d (%s) on %s", v.Class, p.PID, p.Comm, device)
	if uid := p.Cgroup.PodUID; uid != "" {
		s += " of pod " + t.podLabel(uid)
		if p.Cgroup.ContainerID != "" {
			s += ", container " + shortID(p.Cgroup.ContainerID)
		}
	} else {
		s += " of the host"
	}
	return s
}

// eventMessage describes newly flagged findings of one class on a device.
func (t *Tracker) eventMessage(device string, c Class, fs []*finding, now time.Time) string {
	if c == ClassLeaked {
		v := fs[0].verdict
		return fmt.Sprintf("%s of memory allocated on %s with no process on it for %s; the device is unhealthy until it is freed",
			formatBytes(v.Memory), device, now.Sub(fs[0].first).Round(time.Second))
	}
	parts := make([]string, 0, len(fs))
	for _, f := range fs {
		v := f.verdict
		mem := "memory unknown"
		if v.MemoryKnown {
			mem = "holding " + formatBytes(v.Memory)
		}
		parts = append(parts, fmt.Sprintf("%s, %s, for %s: %s", t.processLabel(device, v), mem, now.Sub(f.first).Round(time.Second), v.Why))
	}
	return strings.Join(parts, "; ") + "; the device is unhealthy until it is freed"
}

// healthReason is the cause shown in the device's health (short: it goes
// into the Node condition). It names no memory amount: a process's memory
// moves every cycle, and a reason that changed would be a new observation
// and a Node condition update each time; the Event and the metrics carry
// the amounts.
func healthReason(c Class, fs []*finding, podLabel func(string) string) string {
	if c == ClassLeaked {
		return "memory allocated with no process"
	}
	var pids []string
	for _, f := range fs {
		pids = append(pids, fmt.Sprint(f.verdict.Process.PID))
	}
	who := "pid " + strings.Join(pids, ",")
	if uid := fs[0].verdict.Process.Cgroup.PodUID; uid != "" && len(fs) == 1 {
		who += " of pod " + podLabel(uid)
	}
	return fmt.Sprintf("%s process %s holds GPU memory", c, who)
}

func sortFindings(fs []*finding) {
	slices.SortFunc(fs, func(a, b *finding) int { return int(a.verdict.Process.PID) - int(b.verdict.Process.PID) })
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

func stateNote(state string) string {
	if state == "D" {
		return " (state D, uninterruptible sleep: no signal reaches it until the driver call returns)"
	}
	return ""
}
