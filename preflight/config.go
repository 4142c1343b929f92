package preflight

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner/nvmlapi"
)

// Default values of Config.
const (
	// DefaultDCGMLevel is dcgmi diag -r 1: DCGM's quick deployment and
	// software checks, seconds long.
	DefaultDCGMLevel = 1
	// DefaultDCGMTimeout bounds a diagnostic run (r1 takes seconds, r2
	// about two minutes, r3 half an hour).
	DefaultDCGMTimeout = 10 * time.Minute
	// DefaultCommandTimeout bounds the user command.
	DefaultCommandTimeout = 5 * time.Minute
	// DefaultCommandOutputBytes is how much of the command's output (its
	// end) a result keeps.
	DefaultCommandOutputBytes = 2048
	// DefaultRetryInterval spaces the full runs of a node whose preflight
	// failed: a link that retrains, a driver that finishes loading or an
	// operator's repair passes on the next one.
	DefaultRetryInterval = 5 * time.Minute
)

// DefaultThrottleReasons are the clocks event reasons (nvml.h
// nvmlClocksEventReasons, named as in nvmlapi.ClocksEventReasons) that
// fail the throttle item: the ones that slow an idle, healthy GPU only
// when something is wrong: a power limit set too low (sw-power-cap; an
// idle GPU draws far below any sane limit), and the hardware and thermal
// slowdowns. Not counted: gpu-idle (an idle GPU's clocks drop by design),
// applications-clocks-setting (an administrator's clocks; nvml.h: "no
// longer used"), sync-boost (a group an operator configured) and
// display-clock-setting (display clocks). Canonical's hardware-observer
// alerts leave out the same clocks-setting, display and idle reasons.
var DefaultThrottleReasons = []string{"sw-power-cap", "hw-slowdown", "sw-thermal-slowdown", "hw-thermal-slowdown", "hw-power-brake-slowdown"}

// Config is the preflight's configuration (agent config key `preflight`).
// Every item runs unless listed in DisabledItems; items without what they
// need (no minimum driver version, no DCGM, no command) report skipped.
type Config struct {
	// Enabled gates the node: it starts tainted and is untainted only once
	// a preflight passes (the agent's wiring reads it). The preflight
	// subcommand runs whatever it says.
	Enabled bool `json:"enabled,omitempty"`
	// RecheckInterval is how often a GPU no pod is allocated is checked
	// again with the per-GPU items (0: never).
	RecheckInterval Duration `json:"recheckInterval,omitempty"`
	// RetryInterval is how long after a failed gating preflight the next
	// full run starts (the node stays tainted meanwhile);
	// DefaultRetryInterval when zero.
	RetryInterval Duration `json:"retryInterval,omitempty"`
	// KeepAcrossReboots makes a pass prove the node for good. By default
	// a pass counts for the boot it was made in: a rebooted node (a GPU or
	// NIC replaced, a driver or firmware upgraded, the reset an XID asked
	// for) is tainted pending and checked again, as a new one; an agent
	// restart is not a reboot.
	KeepAcrossReboots bool `json:"keepAcrossReboots,omitempty"`
	// TaintKey and ConditionType are the gate's taint (NoSchedule, value
	// pending or failed) and node condition; empty: the node API
	// package's defaults, gpu-node-agent.io/preflight and GPUPreflight
	// (kubeapi.PreflightGateConfig validates them).
	TaintKey      string `json:"taintKey,omitempty"`
	ConditionType string `json:"conditionType,omitempty"`
	// DisabledItems are items not run (reported skipped, "disabled").
	DisabledItems []string       `json:"disabledItems,omitempty"`
	GPUCount      GPUCountConfig `json:"gpuCount,omitzero"`
	Driver        DriverConfig   `json:"driver,omitzero"`
	PCIe          PCIeConfig     `json:"pcie,omitzero"`
	NVLink        NVLinkConfig   `json:"nvlink,omitzero"`
	Throttle      ThrottleConfig `json:"throttle,omitzero"`
	RDMA          RDMAConfig     `json:"rdma,omitzero"`
	DCGM          DCGMConfig     `json:"dcgm,omitzero"`
	Command       CommandConfig  `json:"command,omitzero"`
}

// GPUCountConfig configures the gpu-count item.
type GPUCountConfig struct {
	// Expected is how many GPUs the node must have, on the PCI bus and in
	// NVML (0: as many as the bus shows).
	Expected int `json:"expected,omitempty"`
	// Label is a node label whose value, when the node carries it, is the
	// expected count instead of Expected (read by the agent's wiring, which
	// passes it as Inputs.ExpectedGPUs).
	Label string `json:"label,omitempty"`
}

// DriverConfig configures the driver-version item.
type DriverConfig struct {
	// MinVersion is the oldest acceptable driver, e.g. "550.54.15"
	// (compared number by number); empty skips the item.
	MinVersion string `json:"minVersion,omitempty"`
}

// PCIeConfig configures the pcie-link item.
type PCIeConfig struct {
	// FailIdleDowngrade fails a link below its maximum generation even
	// while the GPU reports itself idle. By default an idle GPU's
	// generation is not judged: the driver lowers an idle link's speed to
	// save power (nvidia-smi shows Gen 1 on an idle Gen 4 or 5 link), and
	// only its width proves the link.
	FailIdleDowngrade bool `json:"failIdleDowngrade,omitempty"`
}

// NVLinkConfig configures the nvlink item.
type NVLinkConfig struct {
	// Expected is how many NVLinks (0..Expected-1) every GPU must have up;
	// 0: what its model wires on the board (topology.ExpectedNVLinks:
	// 18 on H100/H200/B200 SXM, 12 on A100 SXM4, 6 on V100 SXM2/3, none
	// on PCIe cards).
	Expected int `json:"expected,omitempty"`
}

// ThrottleConfig configures the throttle item.
type ThrottleConfig struct {
	// Reasons are the clocks event reasons that fail it; empty:
	// DefaultThrottleReasons.
	Reasons []string `json:"reasons,omitempty"`
}

// RDMAConfig configures the rdma-ports item.
type RDMAConfig struct {
	// MinRateGbps is the rate every port of a configured RDMA resource
	// must run at, in Gb/s (400 for NDR); 0: the fastest rate among the
	// resource's own ports, so one port trained slower than its peers
	// fails.
	MinRateGbps float64 `json:"minRateGbps,omitempty"`
}

// DCGMConfig configures the dcgm-diag item.
type DCGMConfig struct {
	// Level is dcgmi diag's -r: 1 (quick, default), 2 (medium), 3 (long)
	// or 4 (extended).
	Level int `json:"level,omitempty"`
	// Timeout bounds the run; DefaultDCGMTimeout when zero.
	Timeout Duration `json:"timeout,omitempty"`
}

// CommandConfig configures the command item: a program run on the node
// (in the agent's container) whose exit status decides, e.g. a bandwidth
// test. It gets the GPUs' UUIDs in GNA_PREFLIGHT_GPUS (comma-separated).
type CommandConfig struct {
	// Args are the program and its arguments (no shell); empty skips the
	// item.
	Args []string `json:"args,omitempty"`
	// Timeout bounds the run (the process group is killed after it);
	// DefaultCommandTimeout when zero.
	Timeout Duration `json:"timeout,omitempty"`
	// OutputBytes is how much of the end of its output (stdout and stderr
	// together) a failure's message keeps; DefaultCommandOutputBytes when
	// zero.
	OutputBytes int `json:"outputBytes,omitempty"`
}

// WithDefaults fills what is left zero.
func (c Config) WithDefaults() Config {
	if len(c.Throttle.Reasons) == 0 {
		c.Throttle.Reasons = slices.Clone(DefaultThrottleReasons)
	}
	if c.DCGM.Level == 0 {
		c.DCGM.Level = DefaultDCGMLevel
	}
	if c.DCGM.Timeout == 0 {
		c.DCGM.Timeout = Duration(DefaultDCGMTimeout)
	}
	if c.Command.Timeout == 0 {
		c.Command.Timeout = Duration(DefaultCommandTimeout)
	}
	if c.Command.OutputBytes == 0 {
		c.Command.OutputBytes = DefaultCommandOutputBytes
	}
	if c.RetryInterval == 0 {
		c.RetryInterval = Duration(DefaultRetryInterval)
	}
	return c
}

// Validate checks the section, naming each bad key by its path (e.g.
// preflight.dcgm.level).
func (c Config) Validate() error {
	c = c.WithDefaults()
	var errs []error
	add := func(key, format string, a ...any) {
		errs = append(errs, fmt.Errorf("preflight.%s: "+format, append([]any{key}, a...)...))
	}
	if c.RecheckInterval < 0 {
		add("recheckInterval", "%s is negative", time.Duration(c.RecheckInterval))
	}
	if c.RetryInterval < 0 {
		add("retryInterval", "%s is negative", time.Duration(c.RetryInterval))
	}
	for _, d := range c.DisabledItems {
		if !slices.Contains(Items, d) {
			add("disabledItems", "unknown item %q (items: %s)", d, strings.Join(Items, ", "))
		}
	}
	if c.GPUCount.Expected < 0 {
		add("gpuCount.expected", "%d is negative", c.GPUCount.Expected)
	}
	if l := c.GPUCount.Label; l != "" {
		if msgs := validation.IsQualifiedName(l); len(msgs) > 0 {
			add("gpuCount.label", "%q is not a label key: %s", l, strings.Join(msgs, "; "))
		}
	}
	if v := c.Driver.MinVersion; v != "" {
		if _, err := parseVersion(v); err != nil {
			add("driver.minVersion", "%v", err)
		}
	}
	if c.NVLink.Expected < 0 || c.NVLink.Expected > nvml.NVLINK_MAX_LINKS {
		add("nvlink.expected", "%d is not a number of NVLinks (0 to NVML's NVLINK_MAX_LINKS, %d)", c.NVLink.Expected, nvml.NVLINK_MAX_LINKS)
	}
	for _, r := range c.Throttle.Reasons {
		if _, err := nvmlapi.ClocksEventReasonBit(r); err != nil {
			add("throttle.reasons", "%v", err)
		}
	}
	if c.RDMA.MinRateGbps < 0 {
		add("rdma.minRateGbps", "%g is negative", c.RDMA.MinRateGbps)
	}
	if c.DCGM.Level < 1 || c.DCGM.Level > 4 {
		add("dcgm.level", "%d is not a DCGM diagnostic level (1 quick, 2 medium, 3 long, 4 extended)", c.DCGM.Level)
	}
	if c.DCGM.Timeout < 0 {
		add("dcgm.timeout", "%s is negative", time.Duration(c.DCGM.Timeout))
	}
	if len(c.Command.Args) > 0 && strings.TrimSpace(c.Command.Args[0]) == "" {
		add("command.args", "the program (the first element) is empty")
	}
	if c.Command.Timeout < 0 {
		add("command.timeout", "%s is negative", time.Duration(c.Command.Timeout))
	}
	if c.Command.OutputBytes < 0 {
		add("command.outputBytes", "%d is negative", c.Command.OutputBytes)
	}
	return errors.Join(errs...)
}

// disabled reports whether item is switched off.
func (c Config) disabled(item string) bool { return slices.Contains(c.DisabledItems, item) }

// Duration is a time.Duration that reads and writes "30s" in YAML/JSON.
type Duration time.Duration

// UnmarshalText implements encoding.TextUnmarshaler.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("duration %q: want a string such as \"5m\"", b)
	}
	*d = Duration(v)
	return nil
}

// MarshalText implements encoding.TextMarshaler.
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }
