package rdma

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// Defaults of the port counter check (rdma.portCounters).
const (
	DefaultCounterInterval       = 10 * time.Second
	DefaultCounterRateWindow     = 5 * time.Minute
	DefaultCounterFlapWindow     = 10 * time.Minute
	DefaultCounterFlapThreshold  = 3
	DefaultCounterRecoveryPeriod = 10 * time.Minute
)

// DefaultErrorRateThresholds are the error rates, per minute averaged over
// the rate window, above which a port is unhealthy. A healthy HDR/NDR link
// runs at a post-FEC bit error rate far below one error a minute, so a
// sustained ten a minute is a bad cable, transceiver or port, not noise;
// link_error_recovery (a retrain that kept the link up) counts at a lower
// rate, being already a near link-down. port_xmit_discards is off (0):
// it counts congestion as well as a dead link.
//
// excessive_buffer_overrun_errors and local_link_integrity_errors are
// 4-bit fields of the IBTA PortCounters attribute the kernel reads them
// from (they stop at 15): a rate of ten a minute over five minutes could
// never be seen, so their default is 0.5 a minute, three in the default
// five-minute window.
func DefaultErrorRateThresholds() map[string]float64 {
	return map[string]float64{
		"symbol_error":                    10,
		"link_error_recovery":             3,
		"port_rcv_errors":                 10,
		"excessive_buffer_overrun_errors": 0.5,
		"local_link_integrity_errors":     0.5,
		"port_xmit_discards":              0,
	}
}

// PortCountersConfig is the "rdma.portCounters" section: how the ports'
// error counters (ports/N/counters) are read and judged.
type PortCountersConfig struct {
	// Disabled turns the check and its metrics off.
	Disabled bool `json:"disabled,omitempty" yaml:"disabled,omitempty"`
	// Interval is how often the counters are read; 0 means
	// DefaultCounterInterval.
	Interval Duration `json:"interval,omitempty" yaml:"interval,omitempty"`
	// RateWindow is the window an error rate is averaged over: a counter is
	// over its threshold when it rose by more than threshold × RateWindow
	// (in minutes) within the last RateWindow. 0 means
	// DefaultCounterRateWindow.
	RateWindow Duration `json:"rateWindow,omitempty" yaml:"rateWindow,omitempty"`
	// FlapWindow and FlapThreshold: the port is flapping when it went down
	// FlapThreshold times within FlapWindow, counted as link_downed
	// increments or down transitions the port watcher saw, whichever is
	// more (one link down shows in both). 0 means the default.
	FlapWindow    Duration `json:"flapWindow,omitempty" yaml:"flapWindow,omitempty"`
	FlapThreshold int      `json:"flapThreshold,omitempty" yaml:"flapThreshold,omitempty"`
	// ErrorRateThresholds are errors per minute by counter file name (e.g.
	// "symbol_error"); a counter left out keeps its default
	// (DefaultErrorRateThresholds), 0 turns its check off.
	ErrorRateThresholds map[string]float64 `json:"errorRateThresholds,omitempty" yaml:"errorRateThresholds,omitempty"`
	// RecoveryPeriod is how long a cause must stay quiet (no link down for
	// a flap, the rate at or under its threshold for an error counter)
	// before it clears. The health monitor's own recovery period
	// (health.recoveryPeriod) follows. 0 means DefaultCounterRecoveryPeriod.
	RecoveryPeriod Duration `json:"recoveryPeriod,omitempty" yaml:"recoveryPeriod,omitempty"`
}

// WithDefaults fills every unset field.
func (c PortCountersConfig) WithDefaults() PortCountersConfig {
	def := func(d *Duration, v time.Duration) {
		if *d == 0 {
			*d = Duration(v)
		}
	}
	def(&c.Interval, DefaultCounterInterval)
	def(&c.RateWindow, DefaultCounterRateWindow)
	def(&c.FlapWindow, DefaultCounterFlapWindow)
	def(&c.RecoveryPeriod, DefaultCounterRecoveryPeriod)
	if c.FlapThreshold == 0 {
		c.FlapThreshold = DefaultCounterFlapThreshold
	}
	t := DefaultErrorRateThresholds()
	for k, v := range c.ErrorRateThresholds {
		t[k] = v
	}
	c.ErrorRateThresholds = t
	return c
}

// Validate checks the section; errors name the field relative to it
// (Config.Validate puts "rdma.portCounters." in front).
func (c PortCountersConfig) Validate() error {
	var errs []error
	for _, d := range []struct {
		name string
		v    Duration
	}{{"interval", c.Interval}, {"rateWindow", c.RateWindow}, {"flapWindow", c.FlapWindow}, {"recoveryPeriod", c.RecoveryPeriod}} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("%s: %s is negative", d.name, time.Duration(d.v)))
		}
	}
	if c.FlapThreshold < 0 {
		errs = append(errs, fmt.Errorf("flapThreshold: %d is negative", c.FlapThreshold))
	}
	eff := c.WithDefaults()
	if c.Interval >= 0 && c.RateWindow >= 0 && eff.RateWindow < eff.Interval {
		errs = append(errs, fmt.Errorf("rateWindow: %s is shorter than interval %s", time.Duration(eff.RateWindow), time.Duration(eff.Interval)))
	}
	if c.Interval >= 0 && c.FlapWindow >= 0 && eff.FlapWindow < eff.Interval {
		errs = append(errs, fmt.Errorf("flapWindow: %s is shorter than interval %s", time.Duration(eff.FlapWindow), time.Duration(eff.Interval)))
	}
	for _, name := range sortedKeys(c.ErrorRateThresholds) {
		v := c.ErrorRateThresholds[name]
		switch {
		case name == "link_downed":
			errs = append(errs, fmt.Errorf("errorRateThresholds.link_downed: link downs are judged by flapThreshold, not a rate"))
		case !slices.ContainsFunc(portCounterSpecs, func(s counterSpec) bool { return s.file == name }):
			errs = append(errs, fmt.Errorf("errorRateThresholds.%s: not a port error counter (one of %s)", name, strings.Join(rateCounterNames(), ", ")))
		case math.IsNaN(v) || math.IsInf(v, 0) || v < 0:
			errs = append(errs, fmt.Errorf("errorRateThresholds.%s: %v is not a rate of errors per minute (0 or more)", name, v))
		}
	}
	return errors.Join(errs...)
}

// rateCounterNames are the counters ErrorRateThresholds may name.
func rateCounterNames() []string {
	var out []string
	for _, s := range portCounterSpecs {
		if s.cause != "" {
			out = append(out, s.file)
		}
	}
	return out
}

func sortedKeys(m map[string]float64) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
