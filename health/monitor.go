package health

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"github.com/gpu-node-agent/gpu-node-agent/kernlog"
	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// Status is the health of one device as the rest of the agent sees it.
type Status struct {
	// Kind is gpu, mig, node or nic.
	Kind string
	// Healthy includes the parent GPU's and the node's health.
	Healthy bool
	// Reasons are the causes of the current (or recovering) fault, own
	// first, then the parent's and the node's, prefixed with their ID.
	Reasons []string
	// Since is when Healthy last changed (or the device was first seen).
	Since time.Time
	// Flaps counts how often the device failed again soon after recovering.
	Flaps int
	// Causes are short codes of the same causes, own first, then the
	// parent's and the node's: the check and its key ("xid-79",
	// "gpu-lost"), valid in a label value.
	Causes []string
	// NodeWide is set while the device shares a node-wide fault (NVML
	// failing; not the state file's unverified start).
	NodeWide bool
}

// Fitness is the node's fitness as the tainter needs it.
type Fitness struct {
	Fit bool
	// Reason is a short code, valid as a taint value: the check behind the
	// fault (e.g. "xid", "gpu-lost", "nvml") or "multiple".
	Reason string
	// Message lists the unfit devices and their causes.
	Message string
	// NodeWide is set while the node itself is unfit (NVML failing).
	NodeWide bool
	// Devices are the IDs of the unfit devices, sorted (NodeID excluded).
	Devices []string
}

// Monitor turns observations from its checks (and external sources via
// Observe) into per-device health with hysteresis. It is safe for
// concurrent use; Healthy, Status, Snapshot and NodeFit never touch NVML.
type Monitor struct {
	cfg Config
	// owner is the process's NVML owner (events, through it); nil
	// without NVML.
	owner   *nvmlowner.Owner
	log     *slog.Logger
	clock   clock.WithTicker
	metrics *monitorMetrics
	// corr keeps the correlation rules' rolling windows (correlate.go).
	corr *correlator
	// dcgm is the optional DCGM source; nil until Run decides (tests set
	// a fake before Run).
	dcgm DCGM

	mu        sync.Mutex
	gpus      []topology.GPU
	kinds     map[string]string // GPU and MIG IDs in the node model
	parents   map[string]string // MIG UUID -> parent GPU UUID
	states    map[string]*deviceState
	effective map[string]bool // last published effective health
	effSince  map[string]time.Time
	nodeFit   bool
	// causeSeries are the device_unhealthy series last published.
	causeSeries map[unhealthySeries]bool
	// lastXID is the most recent XID seen per GPU (a MIG device's XID is
	// also its parent's), for DCGM_FI_DEV_XID_ERRORS.
	lastXID map[string]uint64
	// xids counts an XID that NVML and the kernel log both report once
	// (xiddedup.go).
	xids *xidDedup

	// baselines are the sample checks' counter baselines per GPU UUID,
	// persisted with the state (Baseline, SetBaseline).
	baselines map[string]map[string]uint64
	// persist is the state-file bookkeeping; saveMu serialises writes.
	persist *persistence
	saveMu  sync.Mutex

	// events is the running XID watcher's event set (xid.go).
	events eventsHook
	// kernelLog is the kernel-log check (kernlog.go); nil when off.
	kernelLog *kernelLogCheck

	changes     chan struct{}
	subsMu      sync.Mutex
	subs        []chan struct{} // internal consumers (the tainter)
	wake        chan struct{}
	nodeChanged chan struct{}

	// sampler publishes the NVML readings the polled checks run on
	// (poll.go); nil when there is no NVML.
	sampler *nvmlowner.Sampler
	// pollMu serialises snapshot handling; prev and lastSeq are the
	// previous sample per GPU and the last snapshot handled.
	pollMu  sync.Mutex
	prev    map[string]*nvmlowner.Sample
	lastSeq uint64
}

// NewMonitor builds a monitor over the NVML owner (nil: no NVML, external
// observations only). reg may be nil (no metrics).
// Call SetNode before (or soon after) Run; Run does the NVML work.
//
// With cfg.StateDir set, NewMonitor restores the persisted state before it
// returns, so devices that were unhealthy (or held) before a restart are
// unhealthy from the first Healthy, Snapshot or Fitness call; an unusable
// state file is set aside and every GPU fails closed until Verified.
func NewMonitor(cfg Config, owner *nvmlowner.Owner, log *slog.Logger, reg prometheus.Registerer) (*Monitor, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("health config: %w", err)
	}
	cfg = cfg.WithDefaults()
	met, err := newMonitorMetrics(reg)
	if err != nil {
		return nil, fmt.Errorf("health metrics: %w", err)
	}
	corr, err := newCorrelator(cfg.Correlation, reg)
	if err != nil {
		return nil, fmt.Errorf("health metrics: %w", err)
	}
	per, err := newPersistence(cfg.StateDir, cfg.HostRoot, reg)
	if err != nil {
		return nil, fmt.Errorf("health metrics: %w", err)
	}
	var clk clock.WithTicker = clock.RealClock{}
	if cfg.clock != nil {
		clk = cfg.clock
	}
	m := &Monitor{
		cfg:         cfg,
		owner:       owner,
		log:         log,
		clock:       clk,
		metrics:     met,
		corr:        corr,
		persist:     per,
		baselines:   map[string]map[string]uint64{},
		kinds:       map[string]string{},
		parents:     map[string]string{},
		states:      map[string]*deviceState{},
		effective:   map[string]bool{},
		effSince:    map[string]time.Time{},
		causeSeries: map[unhealthySeries]bool{},
		lastXID:     map[string]uint64{},
		xids:        newXIDDedup(xidDedupWindow),
		nodeFit:     true,
		changes:     make(chan struct{}, 1),
		wake:        make(chan struct{}, 1),
		nodeChanged: make(chan struct{}, 1),
		prev:        map[string]*nvmlowner.Sample{},
	}
	m.metrics.nodeFit.Set(1)
	if cfg.enabled(CheckKernelLog) && cfg.KernelLog != kernlog.ModeOff {
		if m.kernelLog, err = newKernelLogCheck(m, reg); err != nil {
			return nil, fmt.Errorf("kernel log: %w", err)
		}
	}
	m.mu.Lock()
	now := m.clock.Now()
	m.restoreLocked(now)
	m.publishLocked(now)
	m.mu.Unlock()
	m.save()
	return m, nil
}

// SetNode tells the monitor which devices the node has; call it on every
// (re)discovery. State, last XID and per-device metric series of GPUs and
// MIG devices that are gone are dropped, so MIG reconfigurations do not
// accumulate old UUIDs. NIC states come from external sources via Observe
// and are left alone.
func (m *Monitor) SetNode(node *topology.Node) {
	m.mu.Lock()
	gone := slices.Collect(maps.Keys(m.kinds))
	m.gpus = nil
	clear(m.kinds)
	clear(m.parents)
	if node != nil {
		m.gpus = slices.Clone(node.GPUs)
		for _, g := range node.GPUs {
			m.kinds[g.UUID] = KindGPU
			for _, mig := range g.MIG {
				m.kinds[mig.UUID] = KindMIG
				m.parents[mig.UUID] = g.UUID
			}
		}
	}
	for id, s := range m.states {
		if (s.kind == KindGPU || s.kind == KindMIG) && m.kinds[id] == "" {
			delete(m.states, id)
			gone = append(gone, id)
			m.markDirtyLocked()
		}
	}
	for uuid := range m.baselines {
		if m.kinds[uuid] == "" {
			delete(m.baselines, uuid)
			m.markDirtyLocked()
		}
	}
	// Only GPUs and MIG devices report XIDs, so any ID outside the node
	// model is a device that has gone.
	for id := range m.lastXID {
		if m.kinds[id] == "" {
			delete(m.lastXID, id)
			gone = append(gone, id)
		}
	}
	m.xids.forget(func(id string) bool { return m.kinds[id] != "" })
	for _, id := range gone {
		if id != NodeID && m.kinds[id] == "" {
			m.metrics.forget(id)
			m.corr.forget(id)
			m.corr.forgetSeries(id)
		}
	}
	// publishLocked drops the gone devices' device_healthy series.
	changed := m.publishLocked(m.clock.Now())
	m.mu.Unlock()
	m.save()
	signal(m.nodeChanged)
	m.events.nodeChanged(m)
	if changed {
		m.notify()
	}
}

// Run runs the checks until ctx ends: the NVML event watcher, the polled
// checks every PollInterval, DCGM if present, and the recovery timers.
// NVML failing is a health finding, not an error: Run returns nil when ctx
// ends. Call it once.
func (m *Monitor) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	if m.cfg.enabled(CheckXID) && m.owner != nil {
		w := newXIDWatcher(m)
		wg.Go(func() { w.run(ctx) })
	}
	wg.Go(func() { m.pollLoop(ctx) })
	if m.cfg.enabled(CheckDCGM) {
		wg.Go(func() { m.runDCGM(ctx) })
	}
	if m.kernelLog != nil {
		wg.Go(func() { m.kernelLog.run(ctx) })
	}
	m.timerLoop(ctx)
	wg.Wait()
	return nil
}

// Changes signals (coalesced, never blocking the monitor) whenever a
// device's effective health or the node's fitness changes. It always
// returns the same channel, meant for one consumer (the agent's reconcile
// loop); the tainter has its own subscription.
func (m *Monitor) Changes() <-chan struct{} { return m.changes }

// Subscribe returns a further coalesced change channel for another
// consumer (the tainter), so it never steals Changes' signals.
func (m *Monitor) Subscribe() <-chan struct{} {
	ch := make(chan struct{}, 1)
	m.subsMu.Lock()
	m.subs = append(m.subs, ch)
	m.subsMu.Unlock()
	return ch
}

// notify signals Changes and every subscriber.
func (m *Monitor) notify() {
	signal(m.changes)
	m.subsMu.Lock()
	for _, ch := range m.subs {
		signal(ch)
	}
	m.subsMu.Unlock()
}

// duplicateXID says whether XID observation o is one another source
// already reported (xiddedup.go), and records it.
func (m *Monitor) duplicateXID(o Observation) bool {
	now := m.clock.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.xids.duplicate(o.DeviceID, o.XID, o.Source, now)
}

// Observe feeds one observation into the state machine. Checks call it,
// and so can external sources (RDMA port health) with their own Check
// name and Kind.
func (m *Monitor) Observe(o Observation) {
	if o.DeviceID == "" {
		o.DeviceID = NodeID
	}
	if o.XID != 0 && m.duplicateXID(o) {
		// The same XID through another source: counted, and acted on
		// (XID counters, lastXID, correlation windows, health events),
		// once.
		m.log.Debug("xid already counted from another source", "device", o.DeviceID, "xid", o.XID, "source", o.Source)
		return
	}
	o, after := m.correlate(o)
	defer m.afterCorrelation(after)
	if o.Reset {
		m.reset(o)
		return
	}
	if o.Fatal && o.XID != 0 && ClassifyXID(o.XID).holds() {
		// Whoever reports a reset-class XID, it waits for a reset.
		o.HoldUntilReset = true
	}
	if o.Fatal && o.HoldUntilReset && o.Check != CheckRecovery && o.Check != CheckECC && m.sampler != nil {
		// Sample at once: what the driver says now (its recovery action,
		// the ECC counts) is what a later reset will be seen to change.
		m.sampler.Kick()
	}
	now := m.clock.Now()
	m.mu.Lock()
	kind := m.kindLocked(o.DeviceID, o.Kind)
	m.metrics.observed(o, kind)
	if o.XID != 0 {
		m.lastXID[o.DeviceID] = o.XID
		if p, ok := m.parents[o.DeviceID]; ok {
			m.lastXID[p] = o.XID
		}
	}
	s := m.states[o.DeviceID]
	if s == nil {
		if !o.Fatal {
			m.mu.Unlock()
			if o.XID != 0 {
				m.log.Info("counted XID", "device", o.DeviceID, "xid", o.XID)
			}
			return
		}
		s = newDeviceState(kind, now)
		m.states[o.DeviceID] = s
	}
	wasActive := s.causes[o.causeKey()] != nil && s.causes[o.causeKey()].active
	wentUnhealthy, stateChanged := s.apply(o, now, m.cfg)
	if stateChanged {
		m.markDirtyLocked()
	}
	if wentUnhealthy {
		m.metrics.transitions.WithLabelValues(o.DeviceID, "unhealthy").Inc()
		m.log.Warn("device unhealthy", "device", o.DeviceID, "kind", kind, "check", o.Check, "reason", o.Reason, "flaps", s.flaps)
	} else if o.Fatal && !wasActive {
		m.log.Info("device fault", "device", o.DeviceID, "check", o.Check, "reason", o.Reason)
	} else if o.Cleared && wasActive {
		m.log.Info("device fault cleared", "device", o.DeviceID, "check", o.Check, "key", o.Key)
	}
	changed := m.publishLocked(now)
	m.mu.Unlock()
	m.save()
	if o.Fatal || o.Cleared {
		signal(m.wake)
	}
	if changed {
		m.notify()
	}
}

// familyLocked is id and, for a GPU, its MIG devices, sorted.
func (m *Monitor) familyLocked(id string) []string {
	ids := []string{id}
	for mig, parent := range m.parents {
		if parent == id {
			ids = append(ids, mig)
		}
	}
	slices.Sort(ids[1:])
	return ids
}

// reset applies a Reset observation: the held causes of the GPU and its
// MIG devices are released and their recovery period starts now.
func (m *Monitor) reset(o Observation) {
	if o.DeviceID == NodeID {
		m.log.Warn("reset evidence for the node ignored: node-wide holds are released by ClearFaults or a reboot", "evidence", o.Reason)
		return
	}
	now := m.clock.Now()
	m.mu.Lock()
	released := 0
	for _, id := range m.familyLocked(o.DeviceID) {
		s := m.states[id]
		if s == nil {
			continue
		}
		if r := s.release(now); len(r) > 0 {
			released += len(r)
			m.log.Info("reset evidence releases held faults; recovery starts", "device", id, "evidence", o.Reason, "released", r)
		}
	}
	if released == 0 {
		m.mu.Unlock()
		m.log.Debug("reset evidence with no held fault", "device", o.DeviceID, "evidence", o.Reason)
		return
	}
	m.commitLocked(now)
}

// ClearFaults is an operator's clear: for target (a GPU or MIG UUID, any
// other device ID the monitor has state for, or "all") and, for a GPU,
// its MIG devices, every held cause is released (its recovery period
// starts now) and every cause that no longer blocks recovery (events,
// cleared causes waiting out the period) is dropped. Causes a check still
// reports (a lost GPU, NVML failing, an unverified state file) stay. It
// returns the IDs of the devices it changed, sorted; an unknown target is
// an error naming it. With "all", held node-wide causes are released too.
func (m *Monitor) ClearFaults(target string) (cleared []string, err error) {
	now := m.clock.Now()
	m.mu.Lock()
	var ids []string
	switch {
	case target == "all":
		ids = slices.Sorted(maps.Keys(m.states))
	case target != "" && (m.kinds[target] != "" || m.states[target] != nil):
		ids = m.familyLocked(target)
	default:
		m.mu.Unlock()
		return nil, fmt.Errorf("clear faults: unknown device %q (want a GPU or MIG UUID, or all)", target)
	}
	for _, id := range ids {
		s := m.states[id]
		if s == nil {
			continue
		}
		dropped := s.dropEvents()
		released := s.release(now)
		if len(dropped)+len(released) == 0 {
			continue
		}
		cleared = append(cleared, id)
		m.corr.forget(id)
		m.log.Info("operator cleared device faults", "target", target, "device", id, "released", released, "dropped", dropped)
	}
	if len(cleared) == 0 {
		m.mu.Unlock()
		m.log.Info("operator clear found no fault to clear", "target", target)
		return nil, nil
	}
	m.commitLocked(now)
	return cleared, nil
}

// commitLocked ends a change of device state made under m.mu: it marks the
// state for saving, republishes health, unlocks, saves, wakes the recovery
// timer and notifies consumers if anything they see changed.
func (m *Monitor) commitLocked(now time.Time) {
	m.markDirtyLocked()
	changed := m.publishLocked(now)
	m.mu.Unlock()
	m.save()
	signal(m.wake)
	if changed {
		m.notify()
	}
}

// Verified tells the monitor that every GPU has been checked afresh (the
// poll loop calls it after its first complete poll), which ends the fail
// closed state of an unreadable state file: the node-wide "state" cause
// goes at once, without a recovery period, since it was never a fault.
// Without that cause it does nothing.
func (m *Monitor) Verified() {
	now := m.clock.Now()
	m.mu.Lock()
	s := m.states[NodeID]
	if s == nil || s.causes[CheckState] == nil {
		m.mu.Unlock()
		return
	}
	delete(s.causes, CheckState)
	if len(s.causes) == 0 && !s.healthy {
		s.healthy = true
		s.since = now
	}
	m.log.Info("every GPU verified after an unreadable health state")
	m.commitLocked(now)
}

// Listening reports whether the XID watcher has an NVML event set
// registered. An XID raised before that is not seen (NVML queues events
// only for registered sets), which callers that inject faults, such as
// tests and the simulator demo, need to know.
func (m *Monitor) Listening() bool { return m.events.listening() }

// LastXID returns the most recent XID observed on GPU uuid (XIDs on its MIG
// devices included), as dcgm-exporter's DCGM_FI_DEV_XID_ERRORS reports it.
func (m *Monitor) LastXID(uuid string) (uint64, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	x, ok := m.lastXID[uuid]
	return x, ok
}

// Healthy reports whether device id is fit for work. Unknown IDs are
// healthy: the monitor has no evidence against them.
func (m *Monitor) Healthy(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.effectiveLocked(id)
}

// Status is the full health of device id.
func (m *Monitor) Status(id string) Status {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.statusLocked(id)
}

// Snapshot is the Status of every device the monitor knows, by ID.
func (m *Monitor) Snapshot() map[string]Status {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]Status{}
	for _, id := range m.idsLocked() {
		out[id] = m.statusLocked(id)
	}
	return out
}

// NodeFit reports whether every device (and the node) is healthy, and if
// not, one "<device>: <causes>" line per unfit device.
func (m *Monitor) NodeFit() (bool, []string) {
	f := m.Fitness()
	if f.Fit {
		return true, nil
	}
	return false, strings.Split(f.Message, "; ")
}

// Fitness is NodeFit with what the tainter needs: a short reason code and
// whether the fault is node-wide. A device counts as unfit from its first
// fatal observation until it has recovered, its own state only (a MIG
// device is listed only for its own faults, not its parent's).
func (m *Monitor) Fitness() Fitness {
	m.mu.Lock()
	defer m.mu.Unlock()
	var lines, checks []string
	f := Fitness{Fit: true}
	for _, id := range slices.Sorted(maps.Keys(m.states)) {
		s := m.states[id]
		if s.healthy {
			continue
		}
		f.Fit = false
		if id == NodeID {
			// An unreadable state file is no fault of the node's: every
			// GPU is unfit until verified, but it is no reason for
			// NoExecute evictions.
			f.NodeWide = slices.ContainsFunc(s.checks(), func(c string) bool { return c != CheckState })
		} else {
			f.Devices = append(f.Devices, id)
		}
		lines = append(lines, id+": "+strings.Join(s.reasons(), ", "))
		for _, c := range s.checks() {
			if !slices.Contains(checks, c) {
				checks = append(checks, c)
			}
		}
	}
	switch {
	case f.NodeWide:
		// A node-wide fault (NVML failing) explains the device errors
		// that come with it.
		f.Reason = strings.Join(m.states[NodeID].checks(), "-")
	case len(checks) == 0:
	case len(checks) == 1:
		f.Reason = checks[0]
	default:
		f.Reason = "multiple"
	}
	f.Message = strings.Join(lines, "; ")
	return f
}

func (m *Monitor) gpuList() []topology.GPU {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.gpus)
}

func (m *Monitor) kindLocked(id, hint string) string {
	switch {
	case id == NodeID:
		return KindNode
	case m.kinds[id] != "":
		return m.kinds[id]
	case m.states[id] != nil:
		return m.states[id].kind
	case hint != "":
		return hint
	}
	return KindNIC
}

func (m *Monitor) ownLocked(id string) bool {
	s := m.states[id]
	return s == nil || s.healthy
}

func (m *Monitor) effectiveLocked(id string) bool {
	ok := m.ownLocked(id)
	// kindLocked, not m.kinds: a GPU restored from the state file before
	// the first SetNode still shares the node's faults.
	switch m.kindLocked(id, "") {
	case KindGPU:
		ok = ok && m.ownLocked(NodeID)
	case KindMIG:
		ok = ok && m.ownLocked(m.parents[id]) && m.ownLocked(NodeID)
	}
	return ok
}

func (m *Monitor) idsLocked() []string {
	ids := slices.Collect(maps.Keys(m.kinds))
	for id := range m.states {
		if m.kinds[id] == "" {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

func (m *Monitor) statusLocked(id string) Status {
	st := Status{Kind: m.kindLocked(id, ""), Healthy: m.effectiveLocked(id), Since: m.effSince[id]}
	if s := m.states[id]; s != nil {
		st.Flaps = s.flaps
		st.Reasons = s.reasons()
		st.Causes = s.causeCodes()
	}
	inherit := func(from string) {
		if s := m.states[from]; s != nil && !s.healthy {
			for _, r := range s.reasons() {
				st.Reasons = append(st.Reasons, from+": "+r)
			}
			st.Causes = append(st.Causes, s.causeCodes()...)
			if from == NodeID {
				st.NodeWide = slices.ContainsFunc(s.checks(), func(c string) bool { return c != CheckState })
			}
		}
	}
	switch st.Kind {
	case KindMIG:
		inherit(m.parents[id])
		inherit(NodeID)
	case KindGPU:
		inherit(NodeID)
	}
	return st
}

// publishLocked recomputes effective health, updates the gauges and
// reports whether anything a consumer sees has changed.
func (m *Monitor) publishLocked(now time.Time) bool {
	changed := false
	ids := m.idsLocked()
	for _, id := range ids {
		eff := m.effectiveLocked(id)
		if old, seen := m.effective[id]; seen && old == eff {
			continue
		}
		m.effective[id] = eff
		m.effSince[id] = now
		m.metrics.healthy.WithLabelValues(id, m.kindLocked(id, "")).Set(boolGauge(eff))
		changed = true
	}
	for id := range m.effective {
		if !slices.Contains(ids, id) {
			delete(m.effective, id)
			delete(m.effSince, id)
			m.metrics.healthy.DeletePartialMatch(prometheus.Labels{"device": id})
			changed = true
		}
	}
	fit := true
	for _, s := range m.states {
		fit = fit && s.healthy
	}
	if fit != m.nodeFit {
		m.nodeFit = fit
		m.metrics.nodeFit.Set(boolGauge(fit))
		changed = true
	}
	m.publishCausesLocked()
	return changed
}

// publishCausesLocked brings gpu_node_agent_device_unhealthy in step with
// the states: one series per cause of each unhealthy device, with the
// check, code and action of the cause.
func (m *Monitor) publishCausesLocked() {
	now := map[unhealthySeries]bool{}
	for id, s := range m.states {
		if s.healthy {
			continue
		}
		kind := m.kindLocked(id, "")
		for k, c := range s.causes {
			check, code := causeCode(k)
			now[unhealthySeries{device: id, kind: kind, check: check, cause: code, action: c.action}] = true
		}
	}
	for u := range m.causeSeries {
		if !now[u] {
			m.metrics.unhealthy.DeleteLabelValues(u.values()...)
		}
	}
	for u := range now {
		if !m.causeSeries[u] {
			m.metrics.unhealthy.WithLabelValues(u.values()...).Set(1)
		}
	}
	m.causeSeries = now
}

// evaluate runs every device's recovery check and returns the next time
// one is due (zero if none).
func (m *Monitor) evaluate() time.Time {
	now := m.clock.Now()
	var next time.Time
	m.mu.Lock()
	for id, s := range m.states {
		recovered, due := s.evaluate(now, m.cfg)
		if recovered {
			m.markDirtyLocked()
			m.metrics.transitions.WithLabelValues(id, "healthy").Inc()
			m.log.Info("device healthy again", "device", id, "kind", s.kind, "flaps", s.flaps)
		}
		if !due.IsZero() && (next.IsZero() || due.Before(next)) {
			next = due
		}
	}
	changed := m.publishLocked(now)
	m.mu.Unlock()
	m.save()
	if changed {
		m.notify()
	}
	return next
}

// timerLoop re-evaluates recovery whenever an observation arrives or the
// earliest recovery falls due.
func (m *Monitor) timerLoop(ctx context.Context) {
	for {
		next := m.evaluate()
		var timer clock.Timer
		var due <-chan time.Time
		if !next.IsZero() {
			timer = m.clock.NewTimer(next.Sub(m.clock.Now()))
			due = timer.C()
		}
		select {
		case <-ctx.Done():
		case <-m.wake:
		case <-due:
		}
		if timer != nil {
			timer.Stop()
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// signal does a coalescing, non-blocking send.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
