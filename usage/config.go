package usage

import (
	"errors"
	"fmt"
	"time"
)

// Actions for ZombiesConfig.Action.
const (
	// ActionReport reports findings (health, Events, metrics) only.
	ActionReport = "report"
	// ActionKill also kills zombie processes: SIGTERM, then SIGKILL after
	// KillGrace. It needs the host's PID namespace.
	ActionKill = "kill"
)

// Defaults of ZombiesConfig.
const (
	DefaultGrace     = 2 * time.Minute
	DefaultKillGrace = 30 * time.Second
	// DefaultLeakedThresholdMiB is the memory a device must have
	// allocated, with no process on it, to count as leaked. An idle GPU
	// allocates next to nothing once the driver's own reservation is
	// subtracted (nvml.h nvmlMemory_v2_t: used is "allocated", reserved
	// is "reserved for system use (driver or firmware)"; NVML's v1
	// "used" is their sum, a few hundred MiB to ~1 GiB on an idle GPU as
	// measured on H20/B200/B300 (scitix/sichek pull request 113)), and an
	// idle MIG device tens of MiB; a CUDA context alone holds ~0.3-0.6
	// GiB. 1 GiB is above any idle figure and catches what makes the next
	// pod run out of memory.
	DefaultLeakedThresholdMiB = 1024
)

// ZombiesConfig configures the GPU process check (agent config key
// health.zombies).
type ZombiesConfig struct {
	// Grace is how long a finding must last before it is reported (the
	// device unhealthy, an Event). Default 2m.
	Grace time.Duration `json:"grace,omitempty" yaml:"grace,omitempty"`
	// Action is report (default) or kill.
	Action string `json:"action,omitempty" yaml:"action,omitempty"`
	// KillGrace is how long a zombie process gets after SIGTERM before
	// SIGKILL (action kill). Default 30s.
	KillGrace time.Duration `json:"killGrace,omitempty" yaml:"killGrace,omitempty"`
	// LeakedThresholdMiB is the memory (MiB) a device must have
	// allocated with no process on it to count as leaked. Default 1024.
	LeakedThresholdMiB uint64 `json:"leakedThresholdMiB,omitempty" yaml:"leakedThresholdMiB,omitempty"`
}

// WithDefaults returns c with zero fields set to their defaults.
func (c ZombiesConfig) WithDefaults() ZombiesConfig {
	if c.Grace == 0 {
		c.Grace = DefaultGrace
	}
	if c.Action == "" {
		c.Action = ActionReport
	}
	if c.KillGrace == 0 {
		c.KillGrace = DefaultKillGrace
	}
	if c.LeakedThresholdMiB == 0 {
		c.LeakedThresholdMiB = DefaultLeakedThresholdMiB
	}
	return c
}

// Validate reports every invalid field of c (after defaults), each named
// by its config key.
func (c ZombiesConfig) Validate() error {
	c = c.WithDefaults()
	var errs []error
	if c.Grace < 0 {
		errs = append(errs, fmt.Errorf("health.zombies.grace %s: must not be negative", c.Grace))
	}
	switch c.Action {
	case ActionReport, ActionKill:
	default:
		errs = append(errs, fmt.Errorf("health.zombies.action %q: must be %s or %s", c.Action, ActionReport, ActionKill))
	}
	if c.KillGrace < 0 {
		errs = append(errs, fmt.Errorf("health.zombies.killGrace %s: must not be negative", c.KillGrace))
	}
	return errors.Join(errs...)
}
