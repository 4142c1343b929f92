package health

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"
)

// CheckCorrelation is the check of the causes a correlation rule raises
// (the observation's Key is the rule's name).
const CheckCorrelation = "correlation"

// Escalation classes of a correlation rule's action ("escalate-to CLASS").
const (
	// EscalateReset holds the device unfit until reset evidence or an
	// operator clear (action reset-gpu), as a reset-class XID does.
	EscalateReset = "reset"
	// EscalateReboot holds it like EscalateReset, asking for a reboot
	// (action reboot).
	EscalateReboot = "reboot"
	// EscalateFatal makes it unfit as an event: it recovers the recovery
	// period after the firing, and every further firing restarts that
	// (action investigate).
	EscalateFatal = "fatal"
)

// CorrelationConfig is health.correlation: rules over rolling windows of
// XIDs per device, and the NVLink error-rate window.
type CorrelationConfig struct {
	// Rules are the escalation and pair-cancel rules. Nil (the key
	// absent) means DefaultCorrelationRules; an empty list means none.
	Rules []CorrelationRule `json:"rules,omitempty"`
	// NVLinkErrorRate judges each NVLink's error counters over a rolling
	// window, besides the single-poll health.nvlinkErrorJump.
	NVLinkErrorRate NVLinkErrorRate `json:"nvlinkErrorRate"`
}

// CorrelationRule is one rule. An escalation rule (Count, Window, Action)
// makes a device unfit when XID has been seen Count times on it within
// Window; a pair-cancel rule (CancelledBy, Within) turns XID into an
// informational one when XID CancelledBy is seen on the same device (or
// its GPU, or one of its MIG devices) within Within of it.
type CorrelationRule struct {
	// Name names the rule in causes, logs and metrics (letters, digits,
	// '-' and '_').
	Name string `json:"name"`
	// XID is the XID the rule counts or cancels.
	XID uint64 `json:"xid"`

	// Count is how many occurrences within Window fire the rule (at
	// least 2).
	Count int `json:"count,omitempty"`
	// Window is how far back occurrences count.
	Window time.Duration `json:"window,omitempty"`
	// Burst, when set, folds occurrences less than Burst after the
	// previous one into one (NVSentinel's burst window): a storm of one
	// fault counts once.
	Burst time.Duration `json:"burst,omitempty"`
	// Action is "escalate-to reset", "escalate-to reboot" or
	// "escalate-to fatal" (see the Escalate* constants).
	Action string `json:"action,omitempty"`

	// CancelledBy is the partner XID that explains XID.
	CancelledBy uint64 `json:"cancelledBy,omitempty"`
	// Within is how far apart, either way, XID and its partner count as
	// one fault.
	Within time.Duration `json:"within,omitempty"`

	// Source says where the rule comes from (documentation only).
	Source string `json:"source,omitempty"`
}

// NVLinkErrorRate is health.correlation.nvlinkErrorRate: a link whose
// replay, recovery and CRC error counters (and on Blackwell the NVLink5
// recovery event count) rose by PerMinute per minute or more on average
// over the last Window makes its GPU unfit while the rate lasts.
type NVLinkErrorRate struct {
	// Window is the rolling window. Default 5m.
	Window time.Duration `json:"window,omitempty"`
	// PerMinute is the rate, in errors per minute averaged over Window,
	// at or above which the link is a fault. Default 60.
	PerMinute float64 `json:"perMinute,omitempty"`
	// Off switches the rate check off (the single-poll jump stays).
	Off bool `json:"off,omitempty"`
}

// Sources of the default rules.
const (
	// sourceNVSentinel: NVIDIA/NVSentinel, the health-events-analyzer's
	// shipped rules, distros/kubernetes/nvsentinel/charts/health-events-analyzer/values.yaml
	// at commit 09dfc8f9060a99ad1881887154a9440270de8fd3.
	sourceNVSentinel = "NVSentinel health-events-analyzer values.yaml @09dfc8f9060a99ad1881887154a9440270de8fd3"
	// sourceCatalogXID45: NVIDIA's XID catalog
	// (https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html):
	// XID 45 ROBUST_CHANNEL_PREEMPTIVE_REMOVAL, "preemptive cleanup, due
	// to previous errors", bucket WORKFLOW_XID_45, which resolves a 45
	// that is not solo as "IGNORE (follow other Xid)" (quoted so in the
	// same NVSentinel values.yaml, which leaves 45 out of its repeat
	// counts for that reason).
	sourceCatalogXID45 = "NVIDIA XID catalog WORKFLOW_XID_45 (not solo: follow the other XID)"
)

// DefaultCorrelationRules returns the rules used when
// health.correlation.rules is not set, each with its source; a fresh
// slice on every call.
//
//   - RepeatedXID13OnSameGPU: NVSentinel's RepeatedXIDErrorOnSameGPU
//     ("XID errors (any XID except 31) on the same GPU 5 times within 24
//     hours where the burst window is 3 minutes", CONTACT_SUPPORT; its
//     query leaves 45 out too), for
//     XID 13, the application XID it most often catches. NVIDIA's catalog
//     investigates a repeated 13 (WORKFLOW_XID_13) as a possible hardware
//     fault.
//   - RepeatedXID31OnSameGPU: NVSentinel's RepeatedXID31OnSameGPU ("XID
//     31 occurred 2 or more times on the same GPU within 24 hours", burst
//     window 3 minutes, RUN_DCGMEUD).
//
// NVSentinel leaves the node condition of a fired rule for an operator to
// remove; here both escalate to fatal (action investigate): the GPU is
// out of service for the recovery period after each firing and the
// GPUCorrelatedFault alert asks for the diagnostic. An operator who wants
// NVSentinel's hold sets "escalate-to reset".
//
//   - XID45AfterXID48, XID45AfterXID94, XID45AfterXID95: NVIDIA's catalog
//     says a 45 that follows another XID is that XID's cleanup (the
//     catalog's description names a DBE as its usual cause; 94 and 95 are
//     the contained and uncontained ECC errors a DBE ends in on Ampere and
//     newer). Within 3m: NVSentinel's burst window, in which it counts
//     errors as one.
func DefaultCorrelationRules() []CorrelationRule {
	const day, burst = 24 * time.Hour, 3 * time.Minute
	return []CorrelationRule{
		{Name: "RepeatedXID13OnSameGPU", XID: 13, Count: 5, Window: day, Burst: burst, Action: "escalate-to " + EscalateFatal, Source: sourceNVSentinel},
		{Name: "RepeatedXID31OnSameGPU", XID: 31, Count: 2, Window: day, Burst: burst, Action: "escalate-to " + EscalateFatal, Source: sourceNVSentinel},
		{Name: "XID45AfterXID48", XID: 45, CancelledBy: 48, Within: burst, Source: sourceCatalogXID45},
		{Name: "XID45AfterXID94", XID: 45, CancelledBy: 94, Within: burst, Source: sourceCatalogXID45},
		{Name: "XID45AfterXID95", XID: 45, CancelledBy: 95, Within: burst, Source: sourceCatalogXID45},
	}
}

// Defaults of health.correlation.nvlinkErrorRate; see NVLinkErrorRate and
// docs/health.md for why these numbers.
const (
	defaultNVLinkRateWindow    = 5 * time.Minute
	defaultNVLinkRatePerMinute = 60
)

func (c CorrelationConfig) withDefaults() CorrelationConfig {
	if c.Rules == nil {
		c.Rules = DefaultCorrelationRules()
	}
	if c.NVLinkErrorRate.Window == 0 {
		c.NVLinkErrorRate.Window = defaultNVLinkRateWindow
	}
	if c.NVLinkErrorRate.PerMinute == 0 {
		c.NVLinkErrorRate.PerMinute = defaultNVLinkRatePerMinute
	}
	return c
}

var ruleName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]*$`)

// escalation is the class of an escalation rule's action and whether it
// parsed.
func (r CorrelationRule) escalation() (string, bool) {
	verb, class, ok := strings.Cut(strings.TrimSpace(r.Action), " ")
	class = strings.TrimSpace(class)
	if !ok || verb != "escalate-to" {
		return "", false
	}
	switch class {
	case EscalateReset, EscalateReboot, EscalateFatal:
		return class, true
	}
	return "", false
}

func (r CorrelationRule) cancels() bool { return r.CancelledBy != 0 || r.Within != 0 }

// validate reports every invalid field of c (after defaults), each error
// naming the rule and the field.
func (c CorrelationConfig) validate() []error {
	var errs []error
	seen := map[string]bool{}
	for i, r := range c.Rules {
		at := fmt.Sprintf("health.correlation.rules[%d] %q", i, r.Name)
		bad := func(field, format string, args ...any) {
			errs = append(errs, fmt.Errorf("%s: %s: %s", at, field, fmt.Sprintf(format, args...)))
		}
		switch {
		case r.Name == "":
			bad("name", "required")
		case !ruleName.MatchString(r.Name):
			bad("name", "only letters, digits, '-' and '_', starting with a letter or digit")
		case seen[r.Name]:
			bad("name", "used by another rule")
		}
		seen[r.Name] = true
		if r.XID == 0 {
			bad("xid", "required (XID 0 is not an XID)")
		}
		escalates := r.Count != 0 || r.Window != 0 || r.Burst != 0 || r.Action != ""
		switch {
		case escalates && r.cancels():
			bad("cancelledBy", "a rule either escalates (count, window, action) or cancels (cancelledBy, within), not both")
			continue
		case !escalates && !r.cancels():
			bad("action", "required: an escalation rule needs count, window and action, a pair-cancel rule cancelledBy and within")
			continue
		}
		if r.cancels() {
			if r.CancelledBy == 0 {
				bad("cancelledBy", "required")
			} else if r.CancelledBy == r.XID {
				bad("cancelledBy", "%d: must differ from xid", r.CancelledBy)
			}
			if r.Within <= 0 {
				bad("within", "%s: must be positive", r.Within)
			}
			continue
		}
		if r.Count < 2 {
			bad("count", "%d: must be at least 2 (a single XID is judged by health.fatalXIDs)", r.Count)
		}
		if r.Window <= 0 {
			bad("window", "%s: must be positive", r.Window)
		}
		if r.Burst < 0 || (r.Window > 0 && r.Burst >= r.Window) {
			bad("burst", "%s: must be at least 0 and shorter than window %s", r.Burst, r.Window)
		}
		if _, ok := r.escalation(); !ok {
			bad("action", "%q: must be \"escalate-to reset\", \"escalate-to reboot\" or \"escalate-to fatal\"", r.Action)
		}
	}
	n := c.NVLinkErrorRate
	if n.Window < time.Minute {
		errs = append(errs, fmt.Errorf("health.correlation.nvlinkErrorRate.window %s: must be at least 1m", n.Window))
	}
	if n.PerMinute < 0 {
		errs = append(errs, fmt.Errorf("health.correlation.nvlinkErrorRate.perMinute %g: must not be negative", n.PerMinute))
	}
	return errs
}

// ruleJSON is CorrelationRule as written in the config file: durations as
// strings such as "1h".
type ruleJSON struct {
	Name        string `json:"name"`
	XID         uint64 `json:"xid"`
	Count       int    `json:"count,omitempty"`
	Window      string `json:"window,omitempty"`
	Burst       string `json:"burst,omitempty"`
	Action      string `json:"action,omitempty"`
	CancelledBy uint64 `json:"cancelledBy,omitempty"`
	Within      string `json:"within,omitempty"`
	Source      string `json:"source,omitempty"`
}

// UnmarshalJSON reads a rule strictly (unknown keys are errors), its
// durations as strings such as "1h".
func (r *CorrelationRule) UnmarshalJSON(b []byte) error {
	var j ruleJSON
	if err := strictJSON(b, &j); err != nil {
		return fmt.Errorf("correlation rule: %w", err)
	}
	out := CorrelationRule{Name: j.Name, XID: j.XID, Count: j.Count, Action: j.Action, CancelledBy: j.CancelledBy, Source: j.Source}
	var errs []error
	for _, d := range []struct {
		field string
		s     string
		to    *time.Duration
	}{{"window", j.Window, &out.Window}, {"burst", j.Burst, &out.Burst}, {"within", j.Within, &out.Within}} {
		if d.s == "" {
			continue
		}
		v, err := time.ParseDuration(d.s)
		if err != nil {
			errs = append(errs, fmt.Errorf("correlation rule %q: %s %q: %w", j.Name, d.field, d.s, err))
		}
		*d.to = v
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	*r = out
	return nil
}

// MarshalJSON writes a rule as UnmarshalJSON reads it.
func (r CorrelationRule) MarshalJSON() ([]byte, error) {
	j := ruleJSON{Name: r.Name, XID: r.XID, Count: r.Count, Action: r.Action, CancelledBy: r.CancelledBy, Source: r.Source}
	for _, d := range []struct {
		v  time.Duration
		to *string
	}{{r.Window, &j.Window}, {r.Burst, &j.Burst}, {r.Within, &j.Within}} {
		if d.v != 0 {
			*d.to = d.v.String()
		}
	}
	return json.Marshal(j)
}

type nvlinkRateJSON struct {
	Window    string  `json:"window,omitempty"`
	PerMinute float64 `json:"perMinute,omitempty"`
	Off       bool    `json:"off,omitempty"`
}

// UnmarshalJSON reads the block strictly, its window as a string such as
// "5m".
func (n *NVLinkErrorRate) UnmarshalJSON(b []byte) error {
	var j nvlinkRateJSON
	if err := strictJSON(b, &j); err != nil {
		return fmt.Errorf("nvlinkErrorRate: %w", err)
	}
	out := NVLinkErrorRate{PerMinute: j.PerMinute, Off: j.Off}
	if j.Window != "" {
		v, err := time.ParseDuration(j.Window)
		if err != nil {
			return fmt.Errorf("nvlinkErrorRate: window %q: %w", j.Window, err)
		}
		out.Window = v
	}
	*n = out
	return nil
}

// MarshalJSON writes the block as UnmarshalJSON reads it.
func (n NVLinkErrorRate) MarshalJSON() ([]byte, error) {
	j := nvlinkRateJSON{PerMinute: n.PerMinute, Off: n.Off}
	if n.Window != 0 {
		j.Window = n.Window.String()
	}
	return json.Marshal(j)
}

// UnmarshalJSON reads health.correlation strictly.
func (c *CorrelationConfig) UnmarshalJSON(b []byte) error {
	type plain CorrelationConfig
	var p plain
	if err := strictJSON(b, &p); err != nil {
		return fmt.Errorf("health.correlation: %w", err)
	}
	*c = CorrelationConfig(p)
	return nil
}

func strictJSON(b []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	return d.Decode(v)
}
