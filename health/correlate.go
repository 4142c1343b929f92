package health

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
)

// correlator keeps the rolling windows of the correlation rules
// (health.correlation): per device, the occurrences of each escalation
// rule's XID and the last sighting of every XID (for pair-cancel rules),
// and per GPU and NVLink the error counter rises of the rate window.
//
// The windows live in memory only and start empty at every agent start:
// what a fired rule did is a device cause and is persisted with the rest
// of the state (health-state.json), so a restart forgets no fault; what
// is lost is evidence that has not yet added up to one (occurrences
// before the restart no longer count towards a rule). NVML does not
// replay the XIDs raised while the agent was down either.
//
// Lock order: Monitor.mu before correlator.mu, never the other way.
type correlator struct {
	cfg       CorrelationConfig
	escalates []CorrelationRule
	cancels   []CorrelationRule

	mu sync.Mutex
	// windows[device][rule] are an escalation rule's occurrences.
	windows map[string]map[string]*xidWindow
	// seen[device][xid] is the XID's last sighting on the device.
	seen map[string]map[uint64]sighting
	// links[gpu][link] are the link's error counter rises.
	links map[string]map[int][]linkRise

	fired      *prometheus.CounterVec
	cancelled  *prometheus.CounterVec
	suppressed *prometheus.CounterVec
}

// xidWindow is one rule's window on one device: when each counted
// occurrence (a burst's first) happened, and the last occurrence.
type xidWindow struct {
	starts []time.Time
	last   time.Time
}

// sighting is an XID seen on a device: when, the cause key of its
// observation, whether it was acted on (made the device unfit) and
// whether a partner explained it already.
type sighting struct {
	at        time.Time
	cause     string
	acted     bool
	explained bool
}

type linkRise struct {
	at time.Time
	n  uint64
}

// correlated is what an observation set off, applied once the
// observation itself is.
type correlated struct {
	fire    []Observation
	explain []explanation
}

// explanation: the cause of device's fault that a later partner XID
// explains.
type explanation struct {
	device, cause, why string
}

func newCorrelator(cfg CorrelationConfig, reg prometheus.Registerer) (*correlator, error) {
	c := &correlator{
		cfg:     cfg,
		windows: map[string]map[string]*xidWindow{},
		seen:    map[string]map[uint64]sighting{},
		links:   map[string]map[int][]linkRise{},
		fired: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpu_node_agent_correlation_rule_fired_total",
			Help: "Times an escalation rule of health.correlation fired on a device (its XID seen count times within the rule's window).",
		}, []string{"rule", "device"}),
		cancelled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpu_node_agent_correlation_xid_cancelled_total",
			Help: "XIDs a pair-cancel rule of health.correlation turned informational because their partner XID explained them, by rule and device.",
		}, []string{"rule", "device"}),
		suppressed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpu_node_agent_correlation_rule_suppressed_total",
			Help: "Times an escalation rule of health.correlation would have fired on a device but did not, because its XID was also seen on another GPU of the node within the rule's window (the application's, not the GPU's), by rule and device.",
		}, []string{"rule", "device"}),
	}
	for _, r := range cfg.Rules {
		if r.cancels() {
			c.cancels = append(c.cancels, r)
		} else {
			c.escalates = append(c.escalates, r)
		}
	}
	if reg != nil {
		for _, col := range []prometheus.Collector{c.fired, c.cancelled, c.suppressed} {
			if err := reg.Register(col); err != nil {
				return nil, err
			}
		}
	}
	return c, nil
}

// correlate runs o through the correlation rules before the state machine
// sees it. It returns o, made informational if a pair-cancel rule's
// partner already explains it, and what o sets off: escalations that
// fired, and earlier faults o explains as their partner. Reset evidence
// empties the windows of the reset GPU and its MIG devices: the reset is
// the answer to what they held.
func (m *Monitor) correlate(o Observation) (Observation, correlated) {
	if o.Reset {
		m.corr.forget(m.relatives(o.DeviceID)...)
		return o, correlated{}
	}
	if o.XID == 0 || o.Cleared {
		return o, correlated{}
	}
	now := cmp.Or(o.At, m.clock.Now())
	related := m.relatives(o.DeviceID)
	c := m.corr
	c.mu.Lock()
	defer c.mu.Unlock()
	var out correlated

	// Explained by a partner seen before it: informational.
	for _, r := range c.cancels {
		if r.XID != o.XID {
			continue
		}
		if d, ok := c.sightedLocked(related, r.CancelledBy, now, r.Within); ok {
			o.Fatal, o.Event, o.HoldUntilReset = false, false, false
			o.Reason += fmt.Sprintf(" (explained by xid %d on %s: rule %s)", r.CancelledBy, d, r.Name)
			c.cancelled.WithLabelValues(r.Name, o.DeviceID).Inc()
			c.seeLocked(o.DeviceID, o.XID, sighting{at: now, cause: o.causeKey(), explained: true})
			return o, out
		}
	}
	// A partner of earlier XIDs: those that were acted on are explained.
	for _, r := range c.cancels {
		if r.CancelledBy != o.XID {
			continue
		}
		for _, d := range related {
			s, ok := c.seen[d][r.XID]
			if !ok || s.explained || now.Sub(s.at) > r.Within || s.at.Sub(now) > r.Within {
				continue
			}
			s.explained = true
			c.seen[d][r.XID] = s
			c.unwindLocked(d, r.XID, s.at)
			c.cancelled.WithLabelValues(r.Name, d).Inc()
			if s.acted {
				out.explain = append(out.explain, explanation{device: d, cause: s.cause,
					why: fmt.Sprintf("explained by xid %d on %s: rule %s", o.XID, o.DeviceID, r.Name)})
			}
		}
	}
	c.seeLocked(o.DeviceID, o.XID, sighting{at: now, cause: o.causeKey(), acted: o.Fatal})

	for _, r := range c.escalates {
		if r.XID != o.XID {
			continue
		}
		n, fire := c.countLocked(o.DeviceID, r, now)
		if !fire {
			continue
		}
		if d, ok := c.sightedElsewhereLocked(related, r.XID, now, r.Window); ok {
			// The same XID on another GPU of the node within the window
			// is the application's, not this GPU's: NVSentinel's
			// RepeatedXID31OnDifferentGPU and
			// RepeatedXID13OnDifferentGPCAndTPC ("App passing bad data",
			// action NONE) beside its same-GPU rules.
			c.suppressed.WithLabelValues(r.Name, o.DeviceID).Inc()
			m.log.Info("correlation rule not fired: the xid was also seen on another gpu of the node, which points at the application",
				"rule", r.Name, "device", o.DeviceID, "also", d, "xid", r.XID)
			continue
		}
		class, _ := r.escalation()
		c.fired.WithLabelValues(r.Name, o.DeviceID).Inc()
		out.fire = append(out.fire, Observation{DeviceID: o.DeviceID, Kind: o.Kind, Check: CheckCorrelation, Key: r.Name,
			Fatal: true, Event: true, HoldUntilReset: class != EscalateFatal, Action: escalationAction(class), At: o.At,
			Reason: fmt.Sprintf("%s: xid %d seen %d times within %s (escalate-to %s)", r.Name, r.XID, n, r.Window, class)})
	}
	return o, out
}

// afterCorrelation applies what an observation set off (see correlate).
func (m *Monitor) afterCorrelation(c correlated) {
	for _, e := range c.explain {
		m.explain(e)
	}
	for _, f := range c.fire {
		m.Observe(f)
	}
}

// explain turns cause e.cause of device e.device, which a partner XID
// explains, into one that no longer blocks recovery: a held cause is
// released and an active one cleared, their recovery period counting from
// now, as after any fault that clears; an event already waiting out its
// period keeps its clock. A cause that no longer exists (recovered,
// cleared by an operator) is left alone.
func (m *Monitor) explain(e explanation) {
	now := m.clock.Now()
	m.mu.Lock()
	s := m.states[e.device]
	if s == nil || s.healthy || s.causes[e.cause] == nil {
		m.mu.Unlock()
		return
	}
	c := s.causes[e.cause]
	if c.blocking() {
		c.held, c.active, c.clearedAt = false, false, now
	}
	c.reason += " (" + e.why + ")"
	m.log.Info("a partner xid explains a fault; recovery starts", "device", e.device, "cause", e.cause, "why", e.why)
	m.commitLocked(now)
}

// relatives is id, its parent GPU and its MIG devices: the devices one
// fault of id may have been charged to.
func (m *Monitor) relatives(id string) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	ids := m.familyLocked(id)
	if p, ok := m.parents[id]; ok {
		ids = append(ids, p)
	}
	return ids
}

func escalationAction(class string) string {
	switch class {
	case EscalateReset:
		return ActionResetGPU
	case EscalateReboot:
		return ActionReboot
	}
	return ActionInvestigate
}

// sightedElsewhereLocked reports a device not in related (another GPU, or
// a MIG device of another GPU) on which xid was seen within d before now.
func (c *correlator) sightedElsewhereLocked(related []string, xid uint64, now time.Time, d time.Duration) (string, bool) {
	for id, byXID := range c.seen {
		if slices.Contains(related, id) {
			continue
		}
		if s, ok := byXID[xid]; ok && now.Sub(s.at) < d && !s.explained {
			return id, true
		}
	}
	return "", false
}

// sightedLocked reports a device of ids on which xid was seen within d of
// now (either side), and whether there is one.
func (c *correlator) sightedLocked(ids []string, xid uint64, now time.Time, d time.Duration) (string, bool) {
	for _, id := range ids {
		if s, ok := c.seen[id][xid]; ok && now.Sub(s.at) <= d && s.at.Sub(now) <= d {
			return id, true
		}
	}
	return "", false
}

func (c *correlator) seeLocked(id string, xid uint64, s sighting) {
	if c.seen[id] == nil {
		c.seen[id] = map[uint64]sighting{}
	}
	c.seen[id][xid] = s
}

// countLocked adds an occurrence of r's XID at now to its window on
// device id and reports how many the window holds and whether r fires: a
// new occurrence (not folded into a burst) that brings the count to
// r.Count or more.
func (c *correlator) countLocked(id string, r CorrelationRule, now time.Time) (int, bool) {
	if c.windows[id] == nil {
		c.windows[id] = map[string]*xidWindow{}
	}
	w := c.windows[id][r.Name]
	if w == nil {
		w = &xidWindow{}
		c.windows[id][r.Name] = w
	}
	w.starts = slices.DeleteFunc(w.starts, func(t time.Time) bool { return now.Sub(t) >= r.Window })
	folded := r.Burst > 0 && !w.last.IsZero() && now.Sub(w.last) <= r.Burst
	if now.After(w.last) {
		w.last = now
	}
	if folded {
		return len(w.starts), false
	}
	w.starts = append(w.starts, now)
	return len(w.starts), len(w.starts) >= r.Count
}

// unwindLocked takes the occurrence of xid at at, which a partner
// explained, out of device id's windows.
func (c *correlator) unwindLocked(id string, xid uint64, at time.Time) {
	for _, r := range c.escalates {
		if w := c.windows[id][r.Name]; r.XID == xid && w != nil {
			w.starts = slices.DeleteFunc(w.starts, func(t time.Time) bool { return t.Equal(at) })
		}
	}
}

// forget drops the windows, sightings, link windows and series of ids
// (devices reset, cleared by an operator, or gone).
func (c *correlator) forget(ids ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, id := range ids {
		delete(c.windows, id)
		delete(c.seen, id)
		delete(c.links, id)
	}
}

// forgetSeries deletes the metric series of a device that has left.
func (c *correlator) forgetSeries(id string) {
	c.fired.DeletePartialMatch(prometheus.Labels{"device": id})
	c.cancelled.DeletePartialMatch(prometheus.Labels{"device": id})
	c.suppressed.DeletePartialMatch(prometheus.Labels{"device": id})
}

// nvlinkRate judges every up NVLink of one GPU's sample by its error rate
// over the rolling window (health.correlation.nvlinkErrorRate): a fault
// while the counters (replay, recovery, CRC flit and data; the NVLink5
// recovery event count on Blackwell, as nvlink.go counts them) rose by
// PerMinute per minute or more on average over the window, cleared when
// the rate falls below. A link with no previous sample adds nothing.
func (m *Monitor) nvlinkRate(in *checkInput) []Observation {
	rc := m.corr.cfg.NVLinkErrorRate
	if rc.Off || !in.Cfg.enabled(CheckNVLink) || in.Cur == nil || in.Cur.Err != nil {
		return nil
	}
	prev := map[int]int{}
	if in.Prev != nil {
		for i, l := range in.Prev.Links {
			prev[l.Link] = i
		}
	}
	at := cmp.Or(in.Cur.Time, m.clock.Now())
	c := m.corr
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.links[in.UUID] == nil {
		c.links[in.UUID] = map[int][]linkRise{}
	}
	var out []Observation
	for _, l := range in.Cur.Links {
		pi, had := prev[l.Link]
		key := "link " + strconv.Itoa(l.Link) + " error-rate"
		if l.Up.Status != nvmlowner.OK || l.Up.V != 1 || !had {
			// Not judged: its window starts again, and a rate cause it
			// had clears (a link that is down is the nvlink check's).
			if _, judged := c.links[in.UUID][l.Link]; judged {
				delete(c.links[in.UUID], l.Link)
				out = append(out, flag(in.UUID, CheckNVLink, key, false, fmt.Sprintf("nvlink %d not judged by rate (down or unread)", l.Link)))
			}
			continue
		}
		rises := append(c.links[in.UUID][l.Link], linkRise{at: at, n: linkErrorRise(l, in.Prev.Links[pi])})
		rises = slices.DeleteFunc(rises, func(r linkRise) bool { return at.Sub(r.at) >= rc.Window })
		c.links[in.UUID][l.Link] = rises
		var sum uint64
		for _, r := range rises {
			sum += r.n
		}
		rate := float64(sum) / rc.Window.Minutes()
		out = append(out, flag(in.UUID, CheckNVLink, key, rate >= rc.PerMinute,
			fmt.Sprintf("nvlink %d errors at %.0f/min over %s (limit %g/min)", l.Link, rate, rc.Window, rc.PerMinute)))
	}
	return out
}
