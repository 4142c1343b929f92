package health

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

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
	cfg     Config
	lib     nvml.Interface
	log     *slog.Logger
	clock   clock.WithTicker
	metrics *monitorMetrics
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
	// lastXID is the most recent XID seen per GPU (a MIG device's XID is
	// also its parent's), for DCGM_FI_DEV_XID_ERRORS.
	lastXID map[string]uint64

	// eventsReady is set while the XID watcher has a registered event set.
	eventsReady atomic.Bool

	changes     chan struct{}
	subsMu      sync.Mutex
	subs        []chan struct{} // internal consumers (the tainter)
	wake        chan struct{}
	nodeChanged chan struct{}

	// pollMu serialises polls; the checks below keep per-device state.
	pollMu sync.Mutex
	nvmlc  *nvmlCheck
	lost   *lostCheck
	checks []DeviceCheck
}

// NewMonitor builds a monitor over lib. reg may be nil (no metrics).
// Call SetNode before (or soon after) Run; Run does the NVML work.
func NewMonitor(cfg Config, lib nvml.Interface, log *slog.Logger, reg prometheus.Registerer) (*Monitor, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("health config: %w", err)
	}
	cfg = cfg.WithDefaults()
	met, err := newMonitorMetrics(reg)
	if err != nil {
		return nil, fmt.Errorf("health metrics: %w", err)
	}
	m := &Monitor{
		cfg:         cfg,
		lib:         lib,
		log:         log,
		clock:       clock.RealClock{},
		metrics:     met,
		kinds:       map[string]string{},
		parents:     map[string]string{},
		states:      map[string]*deviceState{},
		effective:   map[string]bool{},
		effSince:    map[string]time.Time{},
		lastXID:     map[string]uint64{},
		nodeFit:     true,
		changes:     make(chan struct{}, 1),
		wake:        make(chan struct{}, 1),
		nodeChanged: make(chan struct{}, 1),
		nvmlc:       &nvmlCheck{lib: lib},
		lost:        &lostCheck{lib: lib},
	}
	m.metrics.nodeFit.Set(1)
	for _, c := range []DeviceCheck{
		newECCCheck(reg, log),
		&retiredCheck{limit: cfg.RetiredPagesLimit},
		&remapCheck{},
		newNVLinkCheck(cfg.NVLinkErrorJump),
	} {
		if cfg.enabled(c.Name()) {
			m.checks = append(m.checks, c)
		}
	}
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
	for _, id := range gone {
		if id != NodeID && m.kinds[id] == "" {
			m.metrics.forget(id)
			for _, c := range m.checks {
				if f, ok := c.(interface{ forget(string) }); ok {
					f.forget(id)
				}
			}
		}
	}
	// publishLocked drops the gone devices' device_healthy series.
	changed := m.publishLocked(m.clock.Now())
	m.mu.Unlock()
	signal(m.nodeChanged)
	if changed {
		m.notify()
	}
}

// Run runs the checks until ctx ends: the NVML event watcher, the polled
// checks every PollInterval, DCGM if present, and the recovery timers.
// NVML failing is a health finding, not an error: Run returns nil when ctx
// ends. Call it once.
func (m *Monitor) Run(ctx context.Context) error {
	m.pollMu.Lock()
	if ret := m.lib.Init(); ret == nvml.SUCCESS {
		m.nvmlc.initialized = true
	} else if m.cfg.enabled(CheckNVML) {
		o, _ := m.nvmlc.probe(len(m.gpuList()))
		m.Observe(o)
	}
	m.pollMu.Unlock()
	var wg sync.WaitGroup
	if m.cfg.enabled(CheckXID) {
		w := newXIDWatcher(m)
		wg.Go(func() { w.run(ctx) })
	}
	wg.Go(func() { m.pollLoop(ctx) })
	if m.cfg.enabled(CheckDCGM) {
		wg.Go(func() { m.runDCGM(ctx) })
	}
	m.timerLoop(ctx)
	wg.Wait()
	if m.nvmlc.initialized {
		// Init may have succeeded only on a later poll; NVML counts
		// references, so this balances exactly one Init.
		m.lib.Shutdown()
	}
	return nil
}

// Changes signals (coalesced, never blocking the monitor) whenever a
// device's effective health or the node's fitness changes. It always
// returns the same channel, meant for one consumer (the agent's reconcile
// loop); the tainter has its own subscription.
func (m *Monitor) Changes() <-chan struct{} { return m.changes }

// subscribe returns a further coalesced change channel for an internal
// consumer, so it never steals Changes' signals.
func (m *Monitor) subscribe() <-chan struct{} {
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

// Observe feeds one observation into the state machine. Checks call it,
// and so can external sources (RDMA port health) with their own Check
// name and Kind.
func (m *Monitor) Observe(o Observation) {
	if o.DeviceID == "" {
		o.DeviceID = NodeID
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
	if s.apply(o, now, m.cfg) {
		m.metrics.transitions.WithLabelValues(o.DeviceID, "unhealthy").Inc()
		m.log.Warn("device unhealthy", "device", o.DeviceID, "kind", kind, "check", o.Check, "reason", o.Reason, "flaps", s.flaps)
	} else if o.Fatal && !wasActive {
		m.log.Info("device fault", "device", o.DeviceID, "check", o.Check, "reason", o.Reason)
	} else if o.Cleared && wasActive {
		m.log.Info("device fault cleared", "device", o.DeviceID, "check", o.Check, "key", o.Key)
	}
	changed := m.publishLocked(now)
	m.mu.Unlock()
	if o.Fatal || o.Cleared {
		signal(m.wake)
	}
	if changed {
		m.notify()
	}
}

// Listening reports whether the XID watcher has an NVML event set
// registered. An XID raised before that is not seen (NVML queues events
// only for registered sets), which callers that inject faults, such as
// tests and the simulator demo, need to know.
func (m *Monitor) Listening() bool { return m.eventsReady.Load() }

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
			f.NodeWide = true
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
	switch m.kinds[id] {
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
	}
	inherit := func(from string) {
		if s := m.states[from]; s != nil && !s.healthy {
			for _, r := range s.reasons() {
				st.Reasons = append(st.Reasons, from+": "+r)
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
	return changed
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
			m.metrics.transitions.WithLabelValues(id, "healthy").Inc()
			m.log.Info("device healthy again", "device", id, "kind", s.kind, "flaps", s.flaps)
		}
		if !due.IsZero() && (next.IsZero() || due.Before(next)) {
			next = due
		}
	}
	changed := m.publishLocked(now)
	m.mu.Unlock()
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

// pollLoop runs the polled checks every PollInterval, off every gRPC and
// scrape path.
func (m *Monitor) pollLoop(ctx context.Context) {
	t := m.clock.NewTicker(m.cfg.PollInterval)
	defer t.Stop()
	for {
		m.pollOnce()
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
	}
}

// pollOnce runs every polled check once.
func (m *Monitor) pollOnce() {
	m.pollMu.Lock()
	defer m.pollMu.Unlock()
	gpus := m.gpuList()
	o, ok := m.nvmlc.probe(len(gpus))
	if m.cfg.enabled(CheckNVML) {
		m.Observe(o)
	}
	if !ok {
		return
	}
	for _, g := range gpus {
		dev, o := m.lost.resolve(g.UUID)
		if m.cfg.enabled(CheckLost) {
			m.Observe(o)
		}
		if dev == nil {
			continue
		}
		t := Target{UUID: g.UUID, Index: g.Index, Device: dev}
		for _, c := range m.checks {
			for _, o := range m.runCheck(c, t) {
				m.Observe(o)
			}
		}
	}
}

// runCheck keeps a bug in one check (or a simulated device missing a
// reading) from taking down the agent: it is logged and the check skipped.
func (m *Monitor) runCheck(c DeviceCheck, t Target) (obs []Observation) {
	defer func() {
		if r := recover(); r != nil {
			m.log.Error("health check panicked", "check", c.Name(), "device", t.UUID, "panic", fmt.Sprint(r))
			obs = nil
		}
	}()
	return c.CheckDevice(t)
}

// signal does a coalescing, non-blocking send.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
