package health

import (
	"cmp"
	"maps"
	"slices"
	"strings"
	"time"
)

// cause is one reason a device is (or was) unfit.
type cause struct {
	reason string
	// active is set while the check still reports the cause (never for
	// an event).
	active bool
	// held is set for a reset-class cause until reset evidence or an
	// operator clear releases it; a held cause blocks recovery even when
	// no longer active.
	held bool
	// clearedAt is when the cause last stopped blocking recovery (went
	// inactive while not held, was released, or the event happened);
	// recovery counts from the latest clearedAt of all causes.
	clearedAt time.Time
	// action is what the cause asks of an operator (an Action* constant).
	action string
	// seen is when a check last reported the cause (not persisted): a
	// remedy tells a fault seen again after a GPU reset from one the
	// checks have not looked at since.
	seen time.Time
}

func (c *cause) blocking() bool { return c.active || c.held }

// deviceState is the health state machine of one device:
//
//	Healthy --fatal observation--> Unhealthy (at once)
//	Unhealthy --all causes clear and stay clear for the recovery period--> Healthy
//
// A held cause does not clear until it is released (reset evidence, a new
// boot ID, an operator clear). A device that goes unhealthy again within
// FlapWindow of recovering has flapped; each recent flap doubles its
// recovery period up to the cap.
type deviceState struct {
	kind    string
	healthy bool
	since   time.Time
	causes  map[string]*cause
	flaps   int
	// recentFlaps are the times of flaps still within FlapWindow.
	recentFlaps   []time.Time
	lastRecovered time.Time
}

func newDeviceState(kind string, now time.Time) *deviceState {
	return &deviceState{kind: kind, healthy: true, since: now, causes: map[string]*cause{}}
}

// apply records o and reports whether the device went unhealthy and
// whether anything in the state changed (for persistence).
func (s *deviceState) apply(o Observation, now time.Time, cfg Config) (wentUnhealthy, changed bool) {
	key := o.causeKey()
	switch {
	case o.Fatal:
		c := s.causes[key]
		if c == nil {
			c = &cause{}
			s.causes[key] = c
			changed = true
		}
		before := *c
		c.reason = o.Reason
		c.held = c.held || o.HoldUntilReset
		c.action = actionOf(o)
		if o.Event {
			// Recovery restarts with every repeat of an event.
			c.active = false
			c.clearedAt = now
		} else {
			c.active = true
		}
		before.seen = c.seen // not persisted: no reason to save
		changed = changed || *c != before
		if at := cmp.Or(o.At, now); at.After(c.seen) {
			c.seen = at
		}
		if s.healthy {
			s.healthy = false
			s.since = now
			if !s.lastRecovered.IsZero() && now.Sub(s.lastRecovered) < cfg.FlapWindow {
				s.flaps++
				s.recentFlaps = append(s.recentFlaps, now)
			}
			return true, true
		}
	case o.Cleared:
		if c := s.causes[key]; c != nil && c.active {
			c.active = false
			if !c.held {
				c.clearedAt = now
			}
			changed = true
		}
	}
	return false, changed
}

// release releases every held cause: the recovery period of those no
// longer active counts from now. It returns the released causes' reasons.
func (s *deviceState) release(now time.Time) []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(s.causes)) {
		c := s.causes[k]
		if !c.held {
			continue
		}
		c.held = false
		if !c.active {
			c.clearedAt = now
		}
		out = append(out, c.reason)
	}
	return out
}

// dropEvents deletes the causes that no longer block recovery (events and
// cleared causes waiting out the recovery period) and returns their
// reasons.
func (s *deviceState) dropEvents() []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(s.causes)) {
		if c := s.causes[k]; !c.blocking() {
			out = append(out, c.reason)
			delete(s.causes, k)
		}
	}
	return out
}

// recoveryPeriod is the damped recovery period: RecoveryPeriod doubled for
// each flap within FlapWindow, capped at MaxRecoveryPeriod.
func (s *deviceState) recoveryPeriod(now time.Time, cfg Config) time.Duration {
	s.recentFlaps = slices.DeleteFunc(s.recentFlaps, func(t time.Time) bool { return now.Sub(t) >= cfg.FlapWindow })
	d := cfg.RecoveryPeriod
	for range s.recentFlaps {
		d *= 2
		if d >= cfg.MaxRecoveryPeriod {
			return cfg.MaxRecoveryPeriod
		}
	}
	return d
}

// evaluate moves an unhealthy device back to healthy once every cause has
// stayed clear for the recovery period. It reports whether it did and, if
// the device is still waiting, when to evaluate again (zero if never).
func (s *deviceState) evaluate(now time.Time, cfg Config) (recovered bool, next time.Time) {
	if s.healthy {
		return false, time.Time{}
	}
	var last time.Time
	for _, c := range s.causes {
		if c.blocking() {
			return false, time.Time{}
		}
		if c.clearedAt.After(last) {
			last = c.clearedAt
		}
	}
	due := last.Add(s.recoveryPeriod(now, cfg))
	if now.Before(due) {
		return false, due
	}
	s.healthy = true
	s.since = now
	s.lastRecovered = now
	clear(s.causes)
	return true, time.Time{}
}

// reasons lists the causes, sorted, held and cleared ones marked.
func (s *deviceState) reasons() []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(s.causes)) {
		c := s.causes[k]
		switch {
		case c.held:
			out = append(out, c.reason+" (held until reset)")
		case c.active:
			out = append(out, c.reason)
		default:
			out = append(out, c.reason+" (cleared, recovering)")
		}
	}
	return out
}

// causeCodes lists the active-or-recovering causes as short codes,
// sorted by cause: the check and its key, spaces made "-", the check not
// repeated when the key starts with it ("xid 79" of check xid is
// "xid-79", "poll" of nvml "nvml-poll").
func (s *deviceState) causeCodes() []string {
	out := make([]string, 0, len(s.causes))
	for _, k := range slices.Sorted(maps.Keys(s.causes)) {
		_, code := causeCode(k)
		out = append(out, code)
	}
	return out
}

// causeCode splits cause key k ("check" or "check/key") into its check and
// its short code (see causeCodes).
func causeCode(k string) (check, code string) {
	check, key, ok := strings.Cut(k, "/")
	code = check
	if ok {
		code = strings.ReplaceAll(key, " ", "-")
		if !strings.HasPrefix(code, check) {
			code = check + "-" + code
		}
	}
	return check, code
}

// checks lists the checks of the active-or-recovering causes, sorted.
func (s *deviceState) checks() []string {
	var out []string
	for k := range s.causes {
		k, _, _ = strings.Cut(k, "/")
		if !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}
